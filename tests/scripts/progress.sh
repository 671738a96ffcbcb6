#!/usr/bin/env bash
# progress.sh - long phases show a progress line on a terminal, and only
# there (cmd/progress.h); steps are logged at least every ASYNCPP_LOG_SECONDS
# (10 s) whatever log.every is. `script` (util-linux) gives the command a
# terminal; ASYNCPP_PROGRESS_AFTER=0 draws every phase's line at once, so
# that a tiny model's fast phases show it too.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
TINY=(--set model.n_layer=1 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32
      --set train.batch_size=4 --set eval.every=0 --set train.threads=1 --set train.steps=4)
ESC=$(printf '\033')
CR=$(printf '\r')

# on_tty OUT CMD...: run CMD with a terminal as its standard error, its output in OUT
on_tty() {
	local out=$1; shift
	script -q -e -c "$(printf '%q ' "$@")" /dev/null > "$out" 2>&1 < /dev/null
}
# phases FILE: the progress lines drawn, one a line ("asyncpp: WHAT... N s")
phases() { tr '\r' '\n' < "$1" | sed -n "s/^\(asyncpp: .*\.\.\. [0-9]* s\)$ESC\[K\$/\1/p"; }

if ! command -v script > /dev/null; then
	skip progress_on_a_terminal "no script program (util-linux)"
else
	$A train -q "${TINY[@]}" --set train.out_dir=base 2> err.txt || fail base_run "$(cat err.txt)"
	DATA=(--set data.train=base/data/builtin_train.shard --set data.val=base/data/builtin_val.shard
	      --set data.tokenizer=base/data/builtin.tok)

	# 1. each long phase of train shows its line, and the line is erased
	export ASYNCPP_PROGRESS_AFTER=0
	on_tty tty.txt "$A" train "${TINY[@]}" "${DATA[@]}" --set train.out_dir=t1 --set log.every=1000
	rc=$?
	phases tty.txt > phases.txt
	want="asyncpp: reading $(pwd -P)/base/data/builtin_train.shard... 0 s
asyncpp: allocating and initialising 32864 parameters... 0 s
asyncpp: running step 1 of 4... 0 s
asyncpp: running steps 2 to 4 of 4... 0 s
asyncpp: writing the checkpoint of step 4... 0 s"
	drawn=$(grep -o "\.\.\. [0-9]* s$ESC\[K" tty.txt | wc -l)
	erased=$(grep -o "$ESC\[K$CR$ESC\[K" tty.txt | wc -l)
	if [ "$rc" -eq 0 ] && [ "$(cat phases.txt)" = "$want" ] && [ "$drawn" -eq 5 ] &&
	   [ "$erased" -eq 5 ]; then
		pass progress_lines_on_a_terminal
	else
		fail progress_lines_on_a_terminal \
			"exit $rc, $drawn drawn, $erased erased: $(tr '\n' '|' < phases.txt)"
	fi

	# 2. a resumed run shows the checkpoint's opening and loading
	on_tty tty2.txt "$A" train "${TINY[@]}" --set train.steps=6 --resume t1
	if grep -q "asyncpp: opening t1\.\.\. 0 s" tty2.txt &&
	   grep -q "asyncpp: loading t1/ckpt-00000004.ckpt\.\.\. 0 s" tty2.txt; then
		pass progress_on_resume
	else
		fail progress_on_resume "$(phases tty2.txt | tr '\n' '|')"
	fi

	# 3. -q: nothing at all
	on_tty tty3.txt "$A" train -q "${TINY[@]}" "${DATA[@]}" --set train.out_dir=t3
	if [ $? -eq 0 ] && [ ! -s tty3.txt ]; then pass progress_none_when_quiet; else
		fail progress_none_when_quiet "$(head -c 200 tty3.txt | cat -v)"; fi

	# 4. not a terminal (a log, the tests): no progress line, no escape
	"$A" train "${TINY[@]}" "${DATA[@]}" --set train.out_dir=t4 2> log.txt
	if [ $? -eq 0 ] && ! grep -q "$ESC\|$CR\|\.\.\. [0-9]* s" log.txt; then
		pass progress_none_off_a_terminal
	else
		fail progress_none_off_a_terminal "$(head -c 300 log.txt | cat -v)"
	fi

	# 5. inspect: the line, erased, then the same report as off a terminal
	on_tty tty5.txt "$A" inspect t1/ckpt-00000004.ckpt
	"$A" inspect t1/ckpt-00000004.ckpt > plain5.txt
	if [ "$(phases tty5.txt)" = "asyncpp: reading and verifying t1/ckpt-00000004.ckpt... 0 s" ] &&
	   sed "s/^.*$ESC\[K$CR$ESC\[K//" tty5.txt | tr -d '\r' | cmp -s - plain5.txt; then
		pass progress_inspect
	else
		fail progress_inspect "$(head -c 300 tty5.txt | cat -v)"
	fi

	# 6. import-hf: reading the weights, writing the checkpoint
	cp -r "$TESTDATA/hf/llama" m
	on_tty tty6.txt "$A" import-hf -o m.ckpt m
	want="asyncpp: reading the weights in m... 0 s|asyncpp: writing m.ckpt... 0 s|"
	if [ "$(phases tty6.txt | tr '\n' '|')" = "$want" ]; then
		pass progress_import_hf
	else
		fail progress_import_hf "$(phases tty6.txt | tr '\n' '|')"
	fi

	# 6b. an error during a phase starts a row of its own: the line is
	# erased first (not "asyncpp: reading ... 0 sasyncpp: 'bad.ckpt': ...")
	cp t1/ckpt-00000004.ckpt bad.ckpt
	printf 'XXXX' | dd of=bad.ckpt bs=1 seek=2000 conv=notrunc 2> /dev/null
	on_tty tty6b.txt "$A" inspect bad.ckpt
	if [ -n "$(phases tty6b.txt)" ] &&
	   sed "s/$ESC\[K//g" tty6b.txt | tr '\r' '\n' | grep -q "^asyncpp: 'bad.ckpt': .*corrupt"
	then
		pass progress_erased_before_an_error
	else
		fail progress_erased_before_an_error "$(head -c 300 tty6b.txt | cat -v)"
	fi
	unset ASYNCPP_PROGRESS_AFTER
fi

# 7. a step line at least every ASYNCPP_LOG_SECONDS (10 s by default) however
# large log.every is: at 0 s, every step of a run without a pipeline
ASYNCPP_LOG_SECONDS=0 "$A" train "${TINY[@]}" --set train.out_dir=t7 --set log.every=1000 2> err.txt
steps=$(grep -o '^step [0-9]*/4' err.txt | tr '\n' ' ')
if [ "$steps" = "step 1/4 step 2/4 step 3/4 step 4/4 " ]; then
	pass steps_logged_every_few_seconds
else
	fail steps_logged_every_few_seconds "logged: $steps"
fi
