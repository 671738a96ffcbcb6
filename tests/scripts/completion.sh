#!/usr/bin/env bash
# completion.sh - the bash completion (tools/asyncpp-completion.bash) offers
# the program's own commands, options and configuration keys.
. "$ROOT/tests/lib.sh"
. "$ROOT/tools/asyncpp-completion.bash"
comp() { COMP_WORDS=("$@"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); COMPREPLY=(); _asyncpp; echo "${COMPREPLY[*]}"; }
check() {
	local name=$1 want=$2
	shift 2
	local got
	got=$(comp "$ASYNCPP" "$@")
	if [ "$got" = "$want" ]; then pass "$name"; else fail "$name" "'$*' gave '$got', expected '$want'"; fi
}
check completes_commands "train" tr
check completes_options "--resume" train --re
check completes_config_keys "optim.lr=" train --set optim.l
check completes_bench_kinds "schedule" bench sch
check completes_bench_plan "plan" bench pl
check completes_tokenize_subcommands "decode encode import-gpt2 import-hf import-tiktoken train" tokenize ""
check completes_bench_options "--stages --steps" bench schedule --st
check completes_help_topics "import-llmc import-hf" help im
# every command's long options are offered, as -h lists them
n=$(comp "$ASYNCPP" eval -- | wc -w)
[ "$n" -ge 5 ] && pass "eval_options_listed ($n)" || fail eval_options_listed "only $n: $(comp "$ASYNCPP" eval --)"
