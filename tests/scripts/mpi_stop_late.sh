#!/usr/bin/env bash
# mpi_stop_late.sh - a signal that reaches one rank after the training
# loop's last agreement on stopping (here SIGTERM to rank 0 alone while it
# writes the final checkpoint, the other rank done) still ends the job at
# once: every rank agrees on it once more and exits 143, the checkpoint in
# place. Before, rank 0 waited in that agreement for a rank already in
# MPI_Finalize until pipeline.timeout (600 s by default), then aborted the
# job with exit 1, blaming a stuck rank.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
if ! command -v mpirun > /dev/null 2>&1; then
	skip mpi_stop_late "mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)"
	exit 0
fi
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -np 2)
# a model whose checkpoint (about 70 MB) takes rank 0 a while to write
BIG=(--set model.n_layer=2 --set model.d_model=512 --set model.n_head=4 --set model.seq_len=32
     --set train.batch_size=2 --set eval.every=0 --set train.threads=1 --set pipeline.stages=2
     --set train.schedule=1f1b --set pipeline.micro_batches=2 --set checkpoint.every=0)
if ! $A train -q "${BIG[@]}" --set train.out_dir=big --set train.steps=1 2> err.txt; then
	fail mpi_stop_late "setup: $(head -c 300 err.txt)"
	exit 0
fi
# resumed at its last step: no step runs, the final checkpoint is written
timeout 120 "${MPIRUN[@]}" $A train -q --resume big --set pipeline.transport=mpi \
	--set pipeline.timeout=10 > /dev/null 2> err.txt &
launcher=$!
tmp=
for _ in $(seq 1 5000); do
	tmp=$(ls big/ckpt-*.ckpt.tmp.* 2> /dev/null | head -n 1)
	[ -n "$tmp" ] && break
	sleep 0.002
done
[ -n "$tmp" ] && kill -TERM "${tmp##*.}" 2> /dev/null # rank 0: the writer
wait $launcher
rc=$?
if grep -q "built without MPI" err.txt; then
	skip mpi_stop_late "this asyncpp was built without MPI"
elif [ -z "$tmp" ] || { [ $rc = 0 ] && ! grep -q terminated err.txt; }; then
	skip mpi_stop_late "the checkpoint was written before the signal (a busy machine)"
elif [ $rc = 143 ] && grep -q "terminated: wrote big/ckpt-00000001.ckpt at step 1" err.txt &&
     ! grep -q "waited .* for the other ranks" err.txt &&
     $A inspect big/ckpt-00000001.ckpt > /dev/null 2>&1 &&
     ! ls big/*.tmp.* > /dev/null 2>&1; then
	pass mpi_stop_late_signal_ends_every_rank
else
	fail mpi_stop_late_signal_ends_every_rank "mpirun exited $rc: $(head -c 600 err.txt)"
fi
