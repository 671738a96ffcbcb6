#!/usr/bin/env bash
# mpi_sigterm.sh - SIGTERM to mpirun at a random moment of a 2-rank
# pipeline leaves a checkpoint of the step every rank stopped at, written
# before mpirun's SIGKILL (it passes SIGTERM on after odls_base_sigkill_timeout,
# 1 s, and kills the ranks 1 s later), and resuming from it under mpirun
# ends on the uninterrupted run's losses and tensors, bit for bit.
# MPI_SIGTERM_TRIALS trials (default 1, in make test; `make test-faults` runs 10), cycling
# through 2bw, pipedream, 1f1b and 2bw with 2 data-parallel replicas (4
# ranks, whose stop requests must agree too); each PASS line says how long
# after the SIGTERM the checkpoint was in place. Rank 0 warns when the
# steps a stop may still run exceed mpirun's grace.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
TRIALS=${MPI_SIGTERM_TRIALS:-1}
if ! command -v mpirun > /dev/null 2>&1; then
	skip mpi_sigterm "mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)"
	exit 0
fi
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1)
# steps of about 10 ms: a segment (up to 1000 steps or 10 s) outlasts
# mpirun's grace, as it does with real models
TINY=(--set model.n_layer=2 --set model.d_model=64 --set model.n_head=2 --set model.seq_len=64
      --set train.batch_size=8 --set train.threads=1)
if ! $A train -q "${TINY[@]}" --set train.out_dir=base --set train.steps=1 --set eval.every=0 \
	2> err.txt; then
	fail mpi_sigterm "preparing the data: $(cat err.txt)"
	exit 0
fi
DATA=(--set data.train=base/data/builtin_train.shard --set data.val=base/data/builtin_val.shard
      --set data.tokenizer=base/data/builtin.tok)
# no checkpoint but the one the signal writes
RUN=("${TINY[@]}" "${DATA[@]}" --set pipeline.stages=2 --set pipeline.micro_batches=4
     --set eval.every=0 --set log.every=1 --set checkpoint.every=0)
# schedule:replicas:steps (pipedream's steps are single micro-batches)
kinds=(2bw:1:600 pipedream:1:2000 1f1b:1:600 2bw:2:600)

# the uninterrupted run of a schedule, in threads, once: ref_KIND/
reference() {
	[ -d ref_$1 ] && return 0
	$A train -q "${RUN[@]}" "${SET[@]}" --set train.out_dir=ref_$1 2> err.txt
}

for ((i = 0; i < TRIALS; i++)); do
	IFS=: read -r sched n steps <<< "${kinds[i % ${#kinds[@]}]}"
	kind=${sched}x$n
	SET=(--set train.schedule=$sched --set pipeline.data_parallel=$n --set train.steps=$steps)
	name="mpi_sigterm_${kind}_trial_$((i + 1))"
	if ! reference $kind; then
		fail "$name" "the threaded run failed: $(head -c 300 err.txt)"
		continue
	fi
	rm -rf run
	"${MPIRUN[@]}" -np $((2 * n)) $A train -q "${RUN[@]}" "${SET[@]}" --set train.out_dir=run \
		> /dev/null 2> err.txt &
	launcher=$!
	for _ in $(seq 1 300); do
		[ -f run/metrics.csv ] && [ "$(wc -l < run/metrics.csv)" -gt 2 ] && break
		sleep 0.02
	done
	# a random moment of the next 1.5 s, mid-segment most of the time
	sleep "0.$(printf '%03d' $((RANDOM % 1000)))"
	sleep "0.$((RANDOM % 5))"
	t0=$(date +%s.%N)
	kill -TERM $launcher
	wait $launcher
	rc=$?
	if grep -q "built without MPI" err.txt; then
		skip mpi_sigterm "this asyncpp was built without MPI"
		exit 0
	fi
	ck=$(ls run/ckpt-*.ckpt 2> /dev/null | tail -n 1)
	took=$([ -n "$ck" ] && printf '%.2f' "$(echo "$(stat -c %.3Y "$ck") - $t0" | bc)")
	step=$(basename "${ck:-none}" .ckpt | sed 's/^ckpt-0*//')
	if [ "$step" = "$steps" ]; then
		skip "$name" "the run ended before the signal (a busy machine)"
		continue
	fi
	if [ -z "$ck" ] || ! grep -q "terminated: wrote $ck at step $step" err.txt; then
		fail "$name" "mpirun exited $rc after SIGTERM and left no checkpoint: $(ls run 2> /dev/null | tr '\n' ' ') $(head -c 400 err.txt)"
		continue
	fi
	if ls run/*.tmp.* > /dev/null 2>&1; then
		fail "$name" "temporaries left: $(ls run/*.tmp.*)"
		continue
	fi
	if ! "${MPIRUN[@]}" -np $((2 * n)) $A train -q --resume run > /dev/null 2> err2.txt; then
		fail "$name" "resuming from $ck (step $step) failed: $(head -c 400 err2.txt)"
		continue
	fi
	if diff <(cut -d, -f1,2,4,5,6,7 ref_$kind/metrics.csv) <(cut -d, -f1,2,4,5,6,7 run/metrics.csv) \
		> d.txt && $A inspect --diff ref_$kind/ckpt-$(printf %08d $steps).ckpt \
		run/ckpt-$(printf %08d $steps).ckpt \
		> diff.txt 2>&1 &&
	   grep -Eq '^([0-9]+) tensors compared, \1 identical, 0 not comparable' diff.txt; then
		pass "$name (stopped at step $step, checkpoint in place ${took} s after the SIGTERM)"
	else
		fail "$name" "stopped at step $step; the resumed run differs: $(head -n 4 d.txt | tr '\n' ' ') $(head -n 6 diff.txt | tr '\n' ' ')"
	fi
done

# rank 0 warns, after the second segment, when the steps a stop may still
# run (2bw: 4) exceed mpirun's grace (here made 1 ms; the ranks read it from the
# environment mpirun passes on), and not with the default second
WARN=("${RUN[@]}" --set train.schedule=2bw --set train.steps=60)
rm -rf warned quiet
OMPI_MCA_odls_base_sigkill_timeout=0.001 "${MPIRUN[@]}" -np 2 $A train -q "${WARN[@]}" \
	--set train.out_dir=warned > /dev/null 2> err.txt
rc=$?
"${MPIRUN[@]}" -np 2 $A train -q "${WARN[@]}" --set train.out_dir=quiet > /dev/null 2> err2.txt
rc2=$?
if [ $rc = 0 ] && [ $rc2 = 0 ] && [ "$(grep -c 'warning: a step takes .* s: SIGTERM stops this 2bw run up to 4 steps later (.* s), then it writes the checkpoint, but mpirun kills the ranks 0.001 s after it passes SIGTERM on .*mpirun --mca odls_base_sigkill_timeout 30 (see asyncpp-distributed(7))' err.txt)" = 1 ] &&
   ! grep -q warning err2.txt; then
	pass mpi_sigterm_grace_warning
else
	fail mpi_sigterm_grace_warning "exit $rc, $rc2: $(head -c 300 err.txt) / $(head -c 300 err2.txt)"
fi
