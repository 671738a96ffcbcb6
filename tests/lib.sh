# tests/lib.sh - helpers for tests/scripts/*.sh (source it).
#   pass NAME; fail NAME WHY; skip NAME WHY
#   same_ckpt A B   two checkpoints equal but for the run that wrote them
#   kjv_text OUT BYTES   the start of the KJV text (bible-kjv), or status 1
#   expect_exit CODE NAME -- CMD...   run CMD, pass if it exits CODE
#   npm_packages NAME@RANGE:FILE...   sets NPM to a folder holding the npm
#                   packages (FILE: a path inside each), or status 1
# ASYNCPP, ROOT and TESTDATA come from tests/run.
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }
skip() { echo "SKIP $1: $2"; }

# NPM: $ASYNCPP_HF_NPM when its node_modules holds every package's FILE,
# else $ASYNCPP_TEST_NPM (tests/run: one folder the scripts of a run share,
# so a package is fetched once) or $TMPDIR/npm, where npm installs what is
# missing (log: $NPM/npm.log). Status 1 when node or a package is missing.
npm_missing() { # DIR SPEC...: the NAME@RANGE of each package DIR lacks
	local d=$1 s pv
	shift
	for s; do
		pv=${s%%:*}
		[ -f "$d/node_modules/${pv%@*}/${s#*:}" ] || echo "$pv"
	done
}
npm_packages() {
	local d need=
	for d in "${ASYNCPP_HF_NPM:-}" "${ASYNCPP_TEST_NPM:-$TMPDIR/npm}"; do
		[ -n "$d" ] || continue
		NPM=$d
		need=$(npm_missing "$d" "$@")
		[ -z "$need" ] && break
	done
	if [ -n "$need" ] && command -v npm > /dev/null; then
		mkdir -p "$NPM"
		# shellcheck disable=SC2086 # one NAME@RANGE a word
		(cd "$NPM" && timeout 180 npm install --no-audit --no-fund $need) \
			>> "$NPM/npm.log" 2>&1
		need=$(npm_missing "$NPM" "$@")
	fi
	[ -z "$need" ] && command -v node > /dev/null
}
expect_exit() {
	local want=$1 name=$2; shift 3
	"$@" > out.txt 2> err.txt
	local rc=$?
	if [ "$rc" -eq "$want" ]; then pass "$name"; else
		fail "$name" "exit $rc, expected $want: $(head -c 300 err.txt)"; fi
}
# same_ckpt A B: two checkpoints hold the same bits in every tensor (inspect
# --diff) and the same configuration and metadata but for run_id, which
# records the run that wrote each (equivalent runs are different runs)
same_ckpt() {
	"$ASYNCPP" inspect --diff "$1" "$2" 2> /dev/null | head -n 1 | grep -q '^identical: ' &&
		diff <("$ASYNCPP" inspect -v "$1" 2>&1 | sed 1d | grep -v '^run_id = ') \
		     <("$ASYNCPP" inspect -v "$2" 2>&1 | sed 1d | grep -v '^run_id = ') > /dev/null
}
# free_port: a TCP port free on 127.0.0.1 now (else a random high one)
free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' \
		2> /dev/null || echo $((20000 + RANDOM % 40000))
}
# tcp_launch N SECONDS ARGS...: `$ASYNCPP train -q ARGS` as N ranks started
# torchrun-style on 127.0.0.1 (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
# LOCAL_RANK; no MPI), each under `timeout SECONDS`, the last rank first;
# rank r's stdout in out$r.txt, its stderr in err$r.txt; rcs gets every
# rank's exit status ("0 0 ..."). Variables set on the call
# (VAR=... tcp_launch ...) reach every rank.
tcp_launch() {
	local n=$1 secs=$2 p r pids=()
	shift 2
	p=$(free_port)
	for ((r = n - 1; r >= 0; r--)); do
		MASTER_ADDR=127.0.0.1 MASTER_PORT=$p RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r \
			timeout "$secs" "$ASYNCPP" train -q "$@" > out$r.txt 2> err$r.txt &
		pids[r]=$!
	done
	rcs=""
	for ((r = 0; r < n; r++)); do
		wait ${pids[r]}
		rcs="$rcs$? "
	done
	rcs=${rcs% }
}
# ep_setup NAME: the expert-parallel scripts' tiny MoE model in the array
# TINY (2 layers of 4 experts of width 48, top-2, a shared expert; 2
# replicas, 4 micro-batches, 4 steps, a checkpoint every 2, one thread),
# with the built-in data prepared once into data/ and named in TINY; 1
# (after fail NAME) when the data cannot be prepared. Later --set options
# win, so a script adds its own after it.
ep_setup() {
	TINY=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=2
	      --set model.seq_len=32 --set model.n_expert=4 --set model.top_k=2
	      --set model.d_expert=48 --set model.shared_expert=1 --set train.batch_size=4
	      --set pipeline.micro_batches=4 --set pipeline.data_parallel=2 --set log.every=1
	      --set eval.every=0 --set train.threads=1 --set train.steps=4
	      --set checkpoint.every=2)
	if ! "$ASYNCPP" train -q "${TINY[@]}" --set train.schedule=gpipe --set train.out_dir=data \
		--set train.steps=0 2> err.txt; then
		fail "$1" "$(cat err.txt)"
		return 1
	fi
	TINY+=(--set data.train=data/data/builtin_train.shard
	       --set data.val=data/data/builtin_val.shard --set data.tokenizer=data/data/builtin.tok)
}
# ep_mpi OUT P ARGS...: the ep_setup run under mpirun (EP_MPIRUN) on 4 ranks with
# model.expert_parallel = P into OUT (stdout in out.txt, stderr in err.txt)
EP_MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -np 4)
ep_mpi() {
	local out=$1 P=$2
	shift 2
	"${EP_MPIRUN[@]}" "$ASYNCPP" train -q "${TINY[@]}" --set train.out_dir="$out" \
		--set model.expert_parallel="$P" "$@" > out.txt 2> err.txt
}
# ep_same NAME RUN REF: the expert-parallel runs' check: RUN's 4 step rows
# (step, loss, grad_norm and the router's columns; not the times) and its
# final checkpoint (step 4) are REF's, bit for bit
ep_cols() { awk -F, 'NR > 1 && $4 != "" {print $1, $4, $7, $13, $14, $15}' "$1"; }
ep_same() {
	if [ "$(ep_cols "$2/metrics.csv" | wc -l)" -eq 4 ] &&
	   diff <(ep_cols "$2/metrics.csv") <(ep_cols "$3/metrics.csv") > d.txt &&
	   "$ASYNCPP" inspect --diff "$2/ckpt-00000004.ckpt" "$3/ckpt-00000004.ckpt" > d.txt 2>&1 &&
	   head -n 1 d.txt | grep -q '^identical: '; then
		pass "$1"
	else
		fail "$1" "$(cat err*.txt d.txt 2> /dev/null | head -n 6 | tr '\n' ' ')"
	fi
}
# first_case_differing N TEXT: the split-regex scripts' cases c_K.json
# (K < N: a tokenizer.json) each imported and encoding TEXT to exactly
# c_K.want (a Python model's ids); prints the first K that does not, its
# ids (or error) left in got.txt; nothing when all agree ("none" when N is
# not a positive count: no case was made)
first_case_differing() {
	local k
	[ "$1" -ge 1 ] 2> /dev/null || { echo none > got.txt; echo none; return; }
	for ((k = 0; k < $1; k++)); do
		rm -f c.tok
		"$ASYNCPP" tokenize import-hf -o c.tok c_$k.json > got.txt 2>&1 &&
			"$ASYNCPP" tokenize encode -q -t c.tok --ids "$2" > got.txt 2>&1
		cmp -s got.txt c_$k.want || { echo $k; return; }
	done
}
# kjv_text OUT BYTES: the first BYTES of the King James Bible's text (verse
# references cut) into OUT, from Debian's bible-kjv; 1 when it is missing
kjv_text() {
	command -v bible > /dev/null && bible -f "Gen1:1-Rev22:21" 2> /dev/null |
		sed 's/^[^ ]* //' | head -c "$2" > "$1" && [ -s "$1" ]
}
