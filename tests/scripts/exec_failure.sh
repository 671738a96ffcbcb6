#!/usr/bin/env bash
# exec_failure.sh - a failure on one process of a run ends every process of
# it, at once and with the cause named, and loses no checkpoint. A pipeline
# segment is made to fail to start on one rank mid-run (ASYNCPP_FAULT =
# segment:STEP:RANK, as a failed allocation would), or to run out of
# memory in its middle (buffer:STEP:RANK), in threads, over MPI
# (mpirun -np 2) and over TCP (each rank's own exit status); one rank
# cannot set up its stage (ASYNCPP_FAULT = setup:0:RANK: cmd_train's setup
# agreement); one rank cannot set up its part of the pipeline between
# processes (ASYNCPP_FAULT = attach:0:RANK: its board; every part is agreed
# on before the next, whose set-up is collective); and a checkpoint that
# cannot be written (a folder in its place) fails every rank. Each asserts: every process exits 1 within the timeout (no hang, no
# silent 0), the failing rank's message names the cause and the others say
# that another rank failed, and the checkpoints written before the failure
# are whole (inspect reads them) with no temporary left. Before, the
# segment's failures ended the process from inside sched/ (die) or were
# never reported (pipeline_run's status was always 0).
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
TINY=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32
      --set train.batch_size=4 --set log.every=4 --set train.threads=1 --set eval.every=0)
if ! $A train -q "${TINY[@]}" --set train.out_dir=base --set train.steps=1 2> err.txt; then
	fail exec_failure "preparing the data: $(cat err.txt)"
	exit 0
fi
DATA=(--set data.train=base/data/builtin_train.shard --set data.tokenizer=base/data/builtin.tok)
# 12 steps of a 2-stage 1f1b pipeline; checkpoints at steps 4 and 8, so the
# segment with step 9 starts after the second one
RUN=("${TINY[@]}" "${DATA[@]}" --set train.schedule=1f1b --set pipeline.stages=2
     --set pipeline.micro_batches=2 --set train.steps=12 --set checkpoint.every=4
     --set checkpoint.keep=5 --set pipeline.timeout=60)

# kept DIR: the checkpoints of steps 4 and 8 are whole, and nothing is half-written
kept() {
	$A inspect "$1/ckpt-00000004.ckpt" > /dev/null 2>&1 &&
		$A inspect "$1/ckpt-00000008.ckpt" > /dev/null 2>&1 &&
		! ls "$1"/*.tmp.* > /dev/null 2>&1
}

# threads: the process fails with the cause
rm -rf thr
ASYNCPP_FAULT=segment:9 timeout 120 $A train -q "${RUN[@]}" --set train.out_dir=thr 2> err.txt
rc=$?
if [ $rc = 1 ] && grep -q "cannot start the segment of steps 9 to .*ASYNCPP_FAULT=segment:9" err.txt &&
   kept thr; then
	pass exec_failure_threads_segment_fails_and_keeps_checkpoints
else
	fail exec_failure_threads_segment_fails_and_keeps_checkpoints \
		"exit $rc: $(head -c 400 err.txt) $(ls thr | tr '\n' ' ')"
fi

# threads, mid-segment: stage 0 runs out of memory for an activation in
# the second step of a segment (ASYNCPP_FAULT = buffer:STEP): every stage
# thread leaves its waits (transport, board, and with two replicas their
# gradient sum) and the process exits 1 with the cause
for dp in 1 2; do
	rm -rf mid
	ASYNCPP_FAULT=buffer:10 timeout 120 $A train -q "${RUN[@]}" --set train.out_dir=mid \
		--set pipeline.data_parallel=$dp 2> err.txt
	rc=$?
	if [ $rc = 1 ] && grep -q "cannot allocate the activation of step 10 for stage 0: a fault" err.txt &&
	   kept mid; then
		pass "exec_failure_threads_mid_segment_fails_and_keeps_checkpoints_dp$dp"
	else
		fail "exec_failure_threads_mid_segment_fails_and_keeps_checkpoints_dp$dp" \
			"exit $rc: $(head -c 400 err.txt)"
	fi
done

# TCP: rank 1 fails; each rank exits 1, rank 0 says another rank failed
export ASYNCPP_CONNECT_TIMEOUT=30
rm -rf tcp
ASYNCPP_FAULT=segment:9:1 tcp_launch 2 120 "${RUN[@]}" --set pipeline.transport=tcp \
	--set train.out_dir=tcp
if [ "$rcs" = "1 1" ] &&
   grep -q "rank 1: cannot start the segment of steps 9 to .*ASYNCPP_FAULT" err1.txt &&
   grep -q "rank 0: stopping: another rank failed to start the segment" err0.txt &&
   ! grep -q "waited .* which never came" err0.txt err1.txt && kept tcp; then
	pass exec_failure_tcp_every_rank_fails_with_the_cause
else
	fail exec_failure_tcp_every_rank_fails_with_the_cause \
		"exits $rcs: $(head -c 300 err0.txt) | $(head -c 300 err1.txt)"
fi

# TCP: rank 1 cannot set up its board; rank 0, with its own, stops too
rm -rf tcpatt
ASYNCPP_FAULT=attach:0:1 tcp_launch 2 120 "${RUN[@]}" --set pipeline.transport=tcp \
	--set train.out_dir=tcpatt
if [ "$rcs" = "1 1" ] &&
   grep -q "rank 1: cannot set up the step-finish board: a fault injected" err1.txt &&
   grep -q "rank 0: stopping: another rank could not set up the step-finish board" err0.txt &&
   ! ls tcpatt/ckpt-* > /dev/null 2>&1; then
	pass exec_failure_tcp_attach_fails_every_rank
else
	fail exec_failure_tcp_attach_fails_every_rank \
		"exits $rcs: $(head -c 300 err0.txt) | $(head -c 300 err1.txt)"
fi

if ! command -v mpirun > /dev/null 2>&1; then
	skip exec_failure_mpi "mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)"
	exit 0
fi
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -np 2)
# MPI: rank 1 fails to start a segment
rm -rf mpi
timeout 120 "${MPIRUN[@]}" -x ASYNCPP_FAULT=segment:9:1 $A train -q "${RUN[@]}" \
	--set pipeline.transport=mpi --set train.out_dir=mpi > /dev/null 2> err.txt
rc=$?
if grep -q "built without MPI" err.txt; then
	skip exec_failure_mpi "this asyncpp was built without MPI"
	exit 0
fi
if [ $rc != 0 ] && [ $rc != 124 ] &&
   grep -q "rank 1: cannot start the segment of steps 9 to .*ASYNCPP_FAULT" err.txt &&
   grep -q "rank 0: stopping: another rank failed to start the segment" err.txt &&
   ! grep -q "waited .* which never came" err.txt && kept mpi; then
	pass exec_failure_mpi_every_rank_fails_with_the_cause
else
	fail exec_failure_mpi_every_rank_fails_with_the_cause "mpirun exited $rc: $(head -c 600 err.txt)"
fi

# MPI, mid-segment: rank 0's stage runs out of memory for an activation;
# its peers wait inside MPI, so the job ends (MPI_Abort) with the cause
rm -rf mpimid
timeout 120 "${MPIRUN[@]}" -x ASYNCPP_FAULT=buffer:10:0 $A train -q "${RUN[@]}" \
	--set pipeline.transport=mpi --set train.out_dir=mpimid > /dev/null 2> err.txt
rc=$?
if [ $rc != 0 ] && [ $rc != 124 ] &&
   grep -q "rank 0: cannot allocate the activation of step 10 for stage 0: a fault" err.txt &&
   grep -q "the segment cannot go on; aborting the job" err.txt && kept mpimid; then
	pass exec_failure_mpi_mid_segment_ends_the_job
else
	fail exec_failure_mpi_mid_segment_ends_the_job "mpirun exited $rc: $(head -c 600 err.txt)"
fi

# MPI: rank 1 cannot set up its stage: every rank fails before the run
# writes anything (before, rank 1 left alone and the launcher ended the job)
rm -rf mpiset
timeout 120 "${MPIRUN[@]}" -x ASYNCPP_FAULT=setup:0:1 $A train -q "${RUN[@]}" \
	--set pipeline.transport=mpi --set train.out_dir=mpiset > /dev/null 2> err.txt
rc=$?
if [ $rc != 0 ] && [ $rc != 124 ] &&
   grep -q "rank 1: cannot set up its part of the run: a fault injected" err.txt &&
   grep -q "rank 0: stopping: another rank failed to set up its part of the run" err.txt &&
   ! ls mpiset/ckpt-* mpiset/metrics.csv > /dev/null 2>&1; then
	pass exec_failure_mpi_setup_fails_every_rank
else
	fail exec_failure_mpi_setup_fails_every_rank "mpirun exited $rc: $(head -c 600 err.txt)"
fi

# MPI, 2 stages x 2 replicas: rank 1 cannot set up its board; every rank
# agrees before the next part (before, the others went on to create the
# replicas' communicator, which rank 1 never joined: a hang)
rm -rf mpiatt
timeout 120 mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -np 4 \
	-x ASYNCPP_FAULT=attach:0:1 $A train -q "${RUN[@]}" --set pipeline.data_parallel=2 \
	--set pipeline.transport=mpi --set train.out_dir=mpiatt > /dev/null 2> err.txt
rc=$?
if [ $rc != 0 ] && [ $rc != 124 ] &&
   grep -q "rank 1: cannot set up the step-finish board: a fault injected" err.txt &&
   grep -q "rank 0: stopping: another rank could not set up the step-finish board" err.txt &&
   ! ls mpiatt/ckpt-* > /dev/null 2>&1; then
	pass exec_failure_mpi_attach_fails_every_rank
else
	fail exec_failure_mpi_attach_fails_every_rank "mpirun exited $rc: $(head -c 600 err.txt)"
fi

# MPI: a checkpoint cannot be written (a folder takes its name once the
# run is under way, 40 steps ahead): rank 0 says why, every rank fails, the
# checkpoints before it stay whole
rm -rf mpick
timeout 120 "${MPIRUN[@]}" $A train -q "${RUN[@]}" --set train.steps=2000 \
	--set pipeline.transport=mpi --set train.out_dir=mpick > /dev/null 2> err.txt &
launcher=$!
for _ in $(seq 1 1000); do
	[ -f mpick/ckpt-00000004.ckpt ] && break
	sleep 0.01
done
newest=$(ls mpick/ckpt-*.ckpt 2> /dev/null | tail -n 1)
at=$(( (10#$(basename "${newest:-ckpt-00000000.ckpt}" .ckpt | cut -c6-) / 4 + 10) * 4 ))
bad=$(printf 'mpick/ckpt-%08d.ckpt' $at)
mkdir -p "$bad"
wait $launcher
rc=$?
n_ok=0 n_files=0
for f in mpick/ckpt-*.ckpt; do
	[ -f "$f" ] || continue
	n_files=$((n_files + 1))
	$A inspect "$f" > /dev/null 2>&1 && n_ok=$((n_ok + 1))
done
# only the race that took the step before the folder was made is a skip (the
# checkpoint is then a file); a run that exits 0 past the folder is a failure
if [ -f "$bad" ] || grep -q "holds no checkpoint" err.txt; then
	skip exec_failure_mpi_checkpoint "the run passed step $at before the folder was made"
elif [ $rc != 0 ] && [ $rc != 124 ] && grep -q "$(basename "$bad")" err.txt &&
   grep -q "rank 1: stopping: another rank failed to write the checkpoint" err.txt &&
   [ $n_ok -ge 1 ] && [ $n_ok = $n_files ] &&
   [ -f "$(printf 'mpick/ckpt-%08d.ckpt' $((at - 4)))" ] &&
   ! ls mpick/*.tmp.* > /dev/null 2>&1; then
	pass exec_failure_mpi_checkpoint_fails_every_rank
else
	fail exec_failure_mpi_checkpoint_fails_every_rank "mpirun exited $rc ($bad): $(head -c 600 err.txt)"
fi
