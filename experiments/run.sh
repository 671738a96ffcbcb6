#!/usr/bin/env bash
# experiments/run.sh - reproduce the paper's findings at small scale.
#
#   experiments/run.sh            run every missing cell of the grid, then
#                                 write results.csv, the plots and README.md
#   experiments/run.sh report     only rebuild results.csv, plots and README.md
#                                 from the runs finished so far
#   experiments/run.sh status     how many runs are finished, running, missing
#   experiments/run.sh phase X    only phase X (A to G) of the grid
#
# What it does, from nothing:
#   1. builds ./asyncpp if it is missing;
#   2. writes the King James Bible from Debian's bible-kjv (one document per
#      chapter, verse references stripped) to work/data/kjv.txt, trains
#      asyncpp's byte-level BPE (4096 tokens) on it and encodes it into a
#      train shard and a held-out val shard (5% of the chapters);
#   3. trains the grid (below), JOBS runs at a time, each in
#      work/runs/NAME with its effective configuration (config.ini), its
#      metrics (metrics.csv), its log and its time; a finished run has a
#      'done' file and is never run again, so the script resumes where it
#      stopped (a run cut off half-way continues from its last checkpoint
#      when its configuration is unchanged, the long runs of phase F write
#      one every 500 steps; otherwise it starts over);
#   4. runs experiments/report.py, which writes results.csv (one row per
#      finished run), the SVG plots in plots/ (with asyncpp plot) and the
#      report README.md.
# work/ is not committed, and the grid takes longer than a machine may
# live: each finished run's small files (its configurations, done, and
# metrics.csv compressed) are also copied to experiments/archive/NAME,
# which is committed, and a fresh checkout restores them into work/runs
# first, so the grid goes on where any earlier machine stopped.
#
# The grid (the same learning rates for every arm of an optimizer); each phase
# is planned by report.py when it starts, from the results before it:
#   A  adamw, muon  x  sync / async (train.delay=1) / async+EF  x  3 lrs
#   B  adamw, muon: one more lr past an end of the grid where an arm's best
#      lr sits (for all three arms)
#   C  seed 2 of those 6 headline cells at each arm's best lr; momentum:
#      adamw beta1 and muon momentum in {0.9, 0.95, 0.98}, sync and async, at
#      the best sync lr; constant against variable delay with 8 layers: sync,
#      delay 1 (2BW) and per-stage delay S-1-s (original PipeDream) for
#      S = 2, 4, 8; lion, sgd  x  3 arms  x  3 lrs
#   D  the equivalence check, a real 2bw pipeline (4 stages, 4 micro-batches)
#      against train.delay=1 on one worker with the same micro-batching; the
#      lion and sgd grid extensions
#   E  the paper's grouping: adan, mars, ademamix, soap, normuon x sync /
#      async / async+EF / async+predict (optim.correction=predict) x 3 lrs;
#      async+predict for adamw, muon, lion and sgd over their grids; then the
#      same extension rule over the four arms; then seed 2 of every
#      optimizer's best cell per arm (lion's and sgd's seed 2 among them)
#   F  the long horizon: adamw and muon, sync and async (muon also
#      async+EF), at the best sync lr for 20 tokens per parameter (13,452
#      steps of the 1.38 M-parameter model), val loss every 2% of the run
#   G  a mixture of experts (4 experts, top-2, half-width experts): adamw
#      and muon x sync / async / async+EF at the best dense sync lr; planned
#      only when the binary knows model.n_expert (empty otherwise)
# A phase is planned again after its runs until it plans nothing new (E's
# extension and seeds follow from its own base grid). Every grid run trains
# on the same number of tokens (STEPS x 16 x 128). report.py holds the plan
# and the decision rules of phases E-G, fixed before their runs.
#
# Environment: ASYNCPP (binary, default ./asyncpp), JOBS (parallel runs,
# default 2 on the CPU), STEPS (default 300), DEVICE (cpu, cuda or auto:
# cuda when asyncpp is built with CUDA and nvidia-smi sees a GPU), WORK
# (default experiments/work); ONLY_OPT (optimizers, comma-separated: plan
# only their runs) and LONG_STEPS (phase F's steps instead of 20 tokens per
# parameter), for checks.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
EXP=$ROOT/experiments
WORK=${WORK:-$EXP/work}
ASYNCPP=${ASYNCPP:-$ROOT/asyncpp}
STEPS=${STEPS:-300}
DEVICE=${DEVICE:-auto}
MODE=${1:-run}
case "$ASYNCPP" in /*) ;; *) ASYNCPP=$ROOT/$ASYNCPP ;; esac
export ASYNCPP WORK STEPS

log() { echo "run.sh: $*" >&2; }
die() { echo "run.sh: $*" >&2; exit 1; }

# ---- finished runs outlive the machine (experiments/archive) ------------
ARCHIVE=$EXP/archive
# archive_run NAME: work/runs/NAME's small files into archive/NAME
archive_run() {
	local d=$WORK/runs/$1 a=$ARCHIVE/$1
	[ -f "$d/done" ] && [ -f "$d/metrics.csv" ] || return 0
	# done last, so a folder without it was never finished
	rm -rf "$a.tmp" && mkdir -p "$a.tmp" &&
		cp "$d/planned.ini" "$d/config.ini" "$a.tmp/" &&
		gzip -9nc "$d/metrics.csv" > "$a.tmp/metrics.csv.gz" &&
		cp "$d/done" "$a.tmp/" &&
		rm -rf "$a" && mv "$a.tmp" "$a" || log "cannot archive $1"
}
# every archived run missing from work/runs comes back; finished runs not
# archived yet (a grid run before the archive existed) go in
sync_archive() {
	local a d name
	mkdir -p "$WORK/runs" "$ARCHIVE"
	rm -rf "$ARCHIVE"/*.tmp # an archive_run cut off half-way
	for a in "$ARCHIVE"/*/; do
		[ -f "$a/done" ] || continue
		name=$(basename "$a")
		d=$WORK/runs/$name
		# finished here, or being run (or cut off) here: left alone
		[ -f "$d/done" ] || [ -f "$d/log.txt" ] && continue
		rm -rf "$d" && mkdir -p "$d" &&
			cp "$a/planned.ini" "$a/config.ini" "$d/" &&
			gzip -dc "$a/metrics.csv.gz" > "$d/metrics.csv" &&
			cp "$a/done" "$d/done" || log "cannot restore $name"
	done
	for d in "$WORK"/runs/*/; do
		name=$(basename "$d")
		case "$name" in *.tmp) continue ;; esac
		[ -f "$d/done" ] && [ ! -f "$ARCHIVE/$name/done" ] && archive_run "$name"
	done
	return 0
}

report() {
	python3 "$EXP/report.py" --work "$WORK" --exp "$EXP" --asyncpp "$ASYNCPP" all ||
		log "report.py failed"
}

if [ "$MODE" = report ]; then
	sync_archive
	report
	exit 0
fi
if [ "$MODE" = status ]; then
	sync_archive
	python3 "$EXP/report.py" --work "$WORK" --exp "$EXP" --asyncpp "$ASYNCPP" status
	exit 0
fi
ONLY=
if [ "$MODE" = phase ]; then
	ONLY=${2:-}
	case "$ONLY" in A|B|C|D|E|F|G) ;; *) die "phase needs one of A, B, C, D, E, F, G" ;; esac
elif [ "$MODE" != run ]; then
	die "unknown mode '$MODE' (run, report, status or phase X)"
fi

# ---- 1. the binary -------------------------------------------------------
if [ ! -x "$ASYNCPP" ]; then
	log "building $ASYNCPP"
	make -C "$ROOT" -j2 > "$WORK.build.log" 2>&1 || die "make failed (see $WORK.build.log)"
fi

# The GPU is used when one is there: asyncpp --version names the cuda
# backend when it was built with it, and nvidia-smi sees the device. One run
# at a time then owns it; on the CPU each run takes one core.
if [ "$DEVICE" = auto ]; then
	DEVICE=cpu
	if "$ASYNCPP" --version | grep -q '^backends:.*cuda' &&
	   command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
		DEVICE=cuda
	fi
fi
if [ "$DEVICE" = cuda ]; then JOBS=${JOBS:-1}; else JOBS=${JOBS:-2}; fi
log "device $DEVICE, $JOBS runs at a time, $STEPS steps per run"

# ---- 2. the data ---------------------------------------------------------
DATA=$WORK/data
mkdir -p "$DATA" "$WORK/runs"
if [ ! -s "$DATA/kjv_val.shard" ]; then
	if ! command -v bible > /dev/null; then
		log "installing bible-kjv (apt-get)"
		apt-get install -y bible-kjv bible-kjv-text > /dev/null ||
			die "cannot install bible-kjv; as root: apt-get install bible-kjv bible-kjv-text"
	fi
	# "Ge1:1 In the beginning ..." -> the verse text; a blank line between chapters
	bible -f 'Gen1:1-Rev22:21' | awk '{
		ref = $1; sub(/:[0-9]+$/, "", ref)
		if (NR > 1 && ref != prev) print ""
		prev = ref; $1 = ""; sub(/^ /, ""); print
	}' > "$DATA/kjv.txt.tmp" && mv "$DATA/kjv.txt.tmp" "$DATA/kjv.txt" || die "bible failed"
	"$ASYNCPP" tokenize train -q --vocab 4096 -o "$DATA/kjv.tok" "$DATA/kjv.txt" ||
		die "tokenize train failed"
	"$ASYNCPP" tokenize encode -q -t "$DATA/kjv.tok" -o "$DATA/kjv" --val-fraction 0.05 \
		--seed 1 --docs blank-line "$DATA/kjv.txt" || die "tokenize encode failed"
fi

sync_archive

# ---- 3. the grid ---------------------------------------------------------
COMMON=(
	--set data.train="$DATA/kjv_train.shard" --set data.val="$DATA/kjv_val.shard"
	--set data.tokenizer="$DATA/kjv.tok"
	--set model.arch=llama --set model.n_layer=4 --set model.d_model=128
	--set model.n_head=4 --set model.seq_len=128
	--set train.batch_size=16 --set train.steps="$STEPS" --set train.seed=1
	--set train.device="$DEVICE" --set train.threads=1
	--set optim.warmup=20 --set optim.decay=cosine --set optim.min_lr_ratio=0.1
	--set log.every=1 --set eval.every=50 --set eval.batches=12
	--set checkpoint.every=0 --set checkpoint.keep=1
	# the cut every archived run had (the default before balanced): per-stage
	# delays (PipeDream S) depend on which layers each stage holds
	--set pipeline.split=even
)

# run_one NAME KEY=VALUE...: one training run in work/runs/NAME; a run cut
# off half-way continues from its newest checkpoint if its configuration is
# the same (asyncpp's resume is exact), else it starts over
run_one() {
	local name=$1; shift
	local dir=$WORK/runs/$name sets=() kv start=(--overwrite)
	for kv in "$@"; do sets+=(--set "$kv"); done
	mkdir -p "$dir"
	"$ASYNCPP" train --print-config "${COMMON[@]}" "${sets[@]}" \
		--set train.out_dir="$dir" > "$dir/config.new" 2> "$dir/config.err" || {
		log "bad configuration for $name: $(head -c 300 "$dir/config.err")"; return 1; }
	# planned.ini: the configuration as planned (the trainer writes config.ini,
	# with a header of its own; it refuses to replace a config.ini it did not
	# write, so none is put there)
	if [ -f "$dir/planned.ini" ] && cmp -s "$dir/planned.ini" "$dir/config.new" &&
	   compgen -G "$dir/ckpt-*.ckpt" > /dev/null; then
		start=(--resume "$dir")
		local ck=("$dir"/ckpt-*.ckpt) # by name: the newest last
		log "$name: continuing from ${ck[-1]##*/}"
		cat "$dir/log.txt" >> "$dir/log.before-resume.txt" 2> /dev/null
	else
		find "$dir" -mindepth 1 -maxdepth 1 ! -name config.new -exec rm -rf {} +
	fi
	mv "$dir/config.new" "$dir/planned.ini"
	rm -f "$dir/config.err"
	local t0 t1 rc status
	t0=$(date +%s.%N)
	/usr/bin/time -f '%U %S' -o "$dir/cpu.txt" \
		"$ASYNCPP" train -q "${start[@]}" "${COMMON[@]}" "${sets[@]}" \
		--set train.out_dir="$dir" > "$dir/log.txt" 2>&1
	rc=$?
	t1=$(date +%s.%N)
	status=ok
	if [ $rc -ne 0 ]; then
		if grep -Eq 'loss is (NaN|infinite)' "$dir/log.txt"; then
			status=diverged # a result too: the run blew up at this lr
		else
			log "$name failed (exit $rc): $(tail -n 2 "$dir/log.txt" | tr '\n' ' ')"
			return 1
		fi
	fi
	rm -f "$dir"/ckpt-*.ckpt # only the metrics are needed; ~15 MB each
	# wall_s and cpu_s are the last part's when the run was continued
	printf 'status=%s\nwall_s=%s\ncpu_s=%s\ncode=%s\ncontinued=%s\n' "$status" \
		"$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')" \
		"$(awk '{ s = $1 + $2 } END { printf "%.1f", s }' "$dir/cpu.txt")" \
		"$CODE" "$([ "${start[0]}" = --resume ] && echo yes || echo no)" > "$dir/done.tmp"
	mv "$dir/done.tmp" "$dir/done"
	archive_run "$name"
	log "$name $status ($(sed -n 's/^wall_s=//p' "$dir/done") s)"
}

# which code makes the runs (recorded in each run's done file): results are
# comparable bit for bit only within one binary. -dirty: changes outside
# experiments/ (whose files this script rewrites) were not committed.
CODE=$(git -C "$ROOT" rev-parse --short HEAD 2> /dev/null || echo unknown)
if [ "$CODE" != unknown ] &&
   ! git -C "$ROOT" diff --quiet HEAD -- . ':(exclude)experiments' 2> /dev/null; then
	CODE=$CODE-dirty
fi

running=0
# launch NAME KEY=VALUE...: run in the background unless finished; at most JOBS at once
launch() {
	[ -f "$WORK/runs/$1/done" ] && return 0
	run_one "$@" < /dev/null &
	running=$((running + 1))
	if [ $running -ge "$JOBS" ]; then
		wait -n
		running=$((running - 1))
	fi
}
drain() { wait; running=0; }

# The plan lives in report.py (one place for the grid, the results and the
# report): 'report.py plan PHASE' prints NAME KEY=VALUE... per run. A phase
# is planned again once its runs have finished, until it plans no run it has
# not tried (a run that fails is not tried twice in one invocation).
phase() {
	local line name plan=() tried=' ' new
	[ -n "$ONLY" ] && [ "$ONLY" != "$1" ] && return 0
	while :; do
		mapfile -t plan < <(python3 "$EXP/report.py" --work "$WORK" --exp "$EXP" \
			--asyncpp "$ASYNCPP" plan "$1")
		new=0
		for line in "${plan[@]}"; do
			name=${line%% *}
			case "$tried" in *" $name "*) continue ;; esac
			tried="$tried$name "
			new=1
			# shellcheck disable=SC2086
			launch $line
		done
		drain
		[ $new = 1 ] || break
	done
	report
}

phase A # adamw, muon: sync / async / async+EF x 3 lrs
phase B # adamw, muon: the lr grid's extension
phase C # seeds, momentum, constant against variable delay; lion, sgd x 3 lrs
phase D # a real 2bw pipeline against train.delay=1; lion, sgd: the extension
phase E # the paper's grouping: 9 optimizers x 4 arms (with async+predict), seed 2
phase F # the long horizon: adamw, muon at 20 tokens per parameter
phase G # MoE: adamw, muon x sync / async / async+EF (if the binary has MoE)
log "done: $(python3 "$EXP/report.py" --work "$WORK" --exp "$EXP" --asyncpp "$ASYNCPP" \
	status | tail -n 1)"
