#!/usr/bin/env bash
# diverge.sh - a run that diverges (issue 32 items 4 and 5):
#   - a run whose last steps were skipped exits 1, writes no checkpoint for
#     them and keeps (and names) the newest one from before them; steps
#     with a NaN loss (weights of 3e38) count as skipped;
#   - a loss spike (train.spike_factor) stops the run, naming the newest
#     checkpoint from before it, which checkpoint.keep = 1 did not delete
#     and which evaluates to a finite loss no worse than the first logged;
#   - train.on_divergence = rollback goes back to it, passes over the data
#     since, lowers the learning rate, finishes with a finite loss, and does
#     the same again from the same checkpoint, under MPI as with threads;
#   - a 2BW pipeline keeps the checkpoint still waiting for its measure.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
TINY=(--set model.n_layer=1 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32
      --set train.batch_size=4 --set eval.every=0 --set train.threads=1 --set log.every=1)
losses() { awk -F, 'NR > 1 { print $1, $4 }' "$1"; } # step and loss of every row

# 1. lr 1e8 without clipping: step 1 updates, steps 2-4 are skipped (NaN
# norm); the run ends in them: exit 1, no ckpt-00000004, step 1's kept
$A train -q "${TINY[@]}" --set train.out_dir=ended --set train.steps=4 --set optim.lr=1e8 \
	--set train.grad_clip=0 --set optim.warmup=0 --set checkpoint.every=1 \
	--set checkpoint.keep=1 2> err.txt
rc=$?
if [ $rc -eq 1 ] && [ ! -e ended/ckpt-00000004.ckpt ] && [ -e ended/ckpt-00000001.ckpt ] &&
   grep -q "training diverged: .* for 3 steps in a row (steps 2 to 4, the run's last)" err.txt &&
   grep -q "ended/ckpt-00000001.ckpt" err.txt && ! grep -q "asyncpp: done" err.txt; then
	pass run_ending_in_skipped_steps_fails
else
	fail run_ending_in_skipped_steps_fails "exit $rc, $(ls ended): $(cat err.txt)"
fi

# a good start: 6 steps at a sane learning rate, checkpoint at step 6 (each
# copy of the folder below is resumed with its own train.out_dir)
if ! $A train -q "${TINY[@]}" --set train.out_dir=good --set train.steps=6 --set optim.lr=1e-2 \
	--set optim.warmup=0 --set checkpoint.every=2 --set checkpoint.keep=1 2> err.txt; then
	fail diverge_setup "$(cat err.txt)"
	exit 0
fi
first=$(losses good/metrics.csv | awk 'NR == 1 { print $2 }')

# 2. resumed at lr 30, a checkpoint every step, keep 1: update 7 makes step
# 8's loss a spike; the run stops naming step 6's checkpoint, still there
cp -r good spike
$A train -q --resume spike --set train.out_dir=spike --set train.steps=12 --set optim.lr=30 --set checkpoint.every=1 \
	--set train.spike_window=1 2> err.txt
rc=$?
if [ $rc -eq 1 ] && grep -q "training diverged: the loss at step 8, .* times the mean" err.txt &&
   grep -q "the newest checkpoint from before it, spike/ckpt-00000006.ckpt (step 6)" err.txt &&
   [ -e spike/ckpt-00000006.ckpt ] && [ ! -e spike/ckpt-00000008.ckpt ]; then
	pass spike_stops_naming_checkpoint_before_it
else
	fail spike_stops_naming_checkpoint_before_it "exit $rc, $(ls spike): $(cat err.txt)"
fi
# the named checkpoint evaluates finite and no worse than the first logged loss
named=$(sed -n 's/.*the newest checkpoint from before it, \([^ ]*\) (step.*/\1/p' err.txt)
if [ -n "$named" ] && $A eval "$named" > ev.txt 2> err.txt &&
   val=$(sed -n 's/^loss *\([0-9.]*\).*/\1/p' ev.txt) && [ -n "$val" ] &&
   awk -v v="$val" -v f="$first" 'BEGIN { exit !(v <= f) }'; then
	pass named_checkpoint_evaluates_finite "($val <= $first)"
else
	fail named_checkpoint_evaluates_finite "'$named', first loss $first: $(cat ev.txt err.txt)"
fi

# 2b. SIGTERM amid skipped steps (lr 1e8 without clipping: step 7 updates,
# the steps after it are skipped): no checkpoint is written for them, and
# checkpoint.keep = 1 does not rotate out step 6's, which is named. Before,
# the stop wrote the diverged weights as ckpt-N and deleted every other one
cp -r good sigbad
$A train -q --resume sigbad --set train.out_dir=sigbad --set train.steps=100000000 \
	--set optim.lr=1e8 --set train.grad_clip=0 --set checkpoint.every=1 \
	--set train.max_skipped=1000000 2> err.txt &
pid=$!
for _ in $(seq 1 1000); do
	grep -q "update skipped (3 of" err.txt && break
	sleep 0.01
done
kill -TERM $pid
wait $pid
rc=$?
left=$(ls sigbad/ckpt-* 2> /dev/null | tr '\n' ' ')
if [ $rc -eq 1 ] && [ "$left" = "sigbad/ckpt-00000006.ckpt sigbad/ckpt-00000007.ckpt " ] &&
   grep -q "stopped by a signal at step .*, after .* step(s) in a row whose gradient norm or \
loss was not finite: no checkpoint is written for them; the newest checkpoint from before it, \
sigbad/ckpt-00000006.ckpt (step 6)" err.txt; then
	pass signal_amid_skipped_steps_writes_nothing
else
	fail signal_amid_skipped_steps_writes_nothing "exit $rc, left $left: $(tail -c 400 err.txt)"
fi

# 3. the same with train.on_divergence = rollback (lr 300: steps skipped,
# then a spike): it rolls back, finishes with a finite loss, and a second
# run from the same checkpoint does exactly the same
rollback_run() { # DIR
	cp -r good "$1"
	$A train -q --resume "$1" --set train.out_dir="$1" --set train.steps=16 --set optim.lr=300 --set checkpoint.every=1 \
		--set train.spike_window=1 --set train.on_divergence=rollback \
		--set train.rollback_lr_factor=0.001 2> "$1.err"
}
rollback_run back1
rc=$?
last=$(losses back1/metrics.csv | tail -n 1)
if [ $rc -eq 0 ] && grep -q "rolled back to back1/ckpt-00000006.ckpt (step 6): the data of steps 7 to" back1.err &&
   [ "${last%% *}" = 16 ] && awk -v l="${last#* }" -v f="$first" 'BEGIN { exit !(l <= f) }' &&
   [ -e back1/ckpt-00000016.ckpt ] && $A eval back1 > ev.txt 2> err.txt; then
	pass rollback_recovers "(last $last)"
else
	fail rollback_recovers "exit $rc, last row '$last': $(cat back1.err err.txt)"
fi
rollback_run back2
if cmp -s <(losses back1/metrics.csv) <(losses back2/metrics.csv) &&
   $A inspect --diff back1/ckpt-00000016.ckpt back2/ckpt-00000016.ckpt > diff.txt 2>&1 &&
   grep -Eq "^([0-9]+) tensors compared, \1 identical" diff.txt; then
	pass rollback_is_deterministic
else
	fail rollback_is_deterministic "$(head -c 400 diff.txt)"
fi
# what the checkpoint keeps of it: resuming it goes on at the lowered rate
if $A inspect back1/ckpt-00000016.ckpt 2> /dev/null | grep -q "^rollbacks = [1-9]" &&
   $A train -q --resume back1 --set train.steps=17 2> err.txt &&
   awk -F, 'END { exit !($6 < 1) }' back1/metrics.csv; then
	pass rollback_kept_in_checkpoint
else
	fail rollback_kept_in_checkpoint "$(cat err.txt)"
fi

# 3b. the checkpoints of the abandoned steps go at a rollback: with
# train.delay = 6 the six before the divergence were never measured good
# (and step 8's is the good one); a SIGTERM just after the rollback must
# leave the checkpoint it names the newest, the one --resume of the folder
# takes (before, the abandoned ckpt-00000021 stayed newest)
DELAYED=(--set model.n_layer=1 --set model.d_model=128 --set model.n_head=2 --set model.seq_len=64
	 --set train.batch_size=8 --set eval.every=0 --set train.threads=1 --set train.delay=6)
if $A train -q "${DELAYED[@]}" --set train.out_dir=dgood --set train.steps=8 --set optim.lr=1e-2 \
	--set optim.warmup=0 --set checkpoint.every=8 --set checkpoint.keep=1 2> err.txt; then
	$A train -q --resume dgood --set train.steps=60 --set optim.lr=300 --set checkpoint.every=1 \
		--set train.spike_window=1 --set train.on_divergence=rollback \
		--set train.rollback_lr_factor=0.001 2> err.txt &
	pid=$!
	for _ in $(seq 1 1000); do
		grep -q "rolled back" err.txt && break
		sleep 0.01
	done
	kill -TERM $pid
	wait $pid
	rc=$?
	wrote=$(sed -n 's/.*terminated: wrote \([^ ]*\) at step.*/\1/p' err.txt)
	newest=$(ls dgood/ckpt-*.ckpt | tail -n 1)
	if [ $rc -eq 143 ] && [ -n "$wrote" ] && [ "$newest" = "$wrote" ] &&
	   grep -q "rolled back to dgood/ckpt-00000008.ckpt (step 8): .*; the [0-9]* checkpoints of \
the abandoned steps (the newest dgood/ckpt-000000[0-9]*.ckpt) were removed" err.txt; then
		pass rollback_removes_abandoned_checkpoints
	else
		fail rollback_removes_abandoned_checkpoints "exit $rc, wrote '$wrote', newest \
'$newest': $(grep -E 'rolled|terminated' err.txt | head -c 600)"
	fi
else
	fail rollback_removes_abandoned_checkpoints "setup: $(cat err.txt)"
fi

# 4. a 2BW pipeline (delay 1: step j + 2 measures checkpoint j): the
# checkpoint still waiting for its measurement is not rotated out by
# checkpoint.keep = 1 either, and is the one named when the run diverges
PIPE=(--set model.n_layer=2 --set train.schedule=2bw --set pipeline.stages=2
      --set pipeline.micro_batches=2)
if $A train -q "${TINY[@]}" "${PIPE[@]}" --set train.out_dir=pipe --set train.steps=6 \
	--set optim.lr=1e-2 --set optim.warmup=0 --set checkpoint.every=2 --set checkpoint.keep=1 \
	2> err.txt; then
	cp -r pipe pipe0
	$A train -q --resume pipe --set train.out_dir=pipe --set train.steps=16 --set optim.lr=300 \
		--set checkpoint.every=1 --set train.spike_window=1 2> err.txt
	rc=$?
	if [ $rc -eq 1 ] && grep -q "the newest checkpoint from before it, pipe/ckpt-00000006.ckpt" err.txt &&
	   [ -e pipe/ckpt-00000006.ckpt ]; then
		pass pipeline_keeps_checkpoint_before_divergence
	else
		fail pipeline_keeps_checkpoint_before_divergence "exit $rc, $(ls pipe): $(cat err.txt)"
	fi
else
	fail pipeline_keeps_checkpoint_before_divergence "$(cat err.txt)"
fi

# 6. finite but absurd weights (testdata/hf/gpt2 with wte all 3e38): every
# loss is NaN; the run counts those steps as skipped and ends failing
if command -v python3 > /dev/null; then
	cp -r "$TESTDATA/hf/gpt2" huge
	python3 - huge/model.safetensors <<'PY'
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
lo, hi = json.loads(b[8:8 + n])["wte.weight"]["data_offsets"]
for off in range(8 + n + lo, 8 + n + hi, 4):
    b[off:off + 4] = struct.pack("<f", 3e38)
open(p, "wb").write(b)
PY
	if $A import-hf -o huge.ckpt huge > out.txt 2> err.txt &&
	   $A tokenize encode -t huge.tok -o huge "$TESTDATA"/corpus/*.txt > out.txt 2> err.txt; then
		$A train --resume huge.ckpt --set data.train=huge_train.shard --set data.val= \
			--set train.out_dir=hugerun --set train.steps=3 --set eval.every=0 \
			--set train.threads=1 2> err.txt
		rc=$?
		if [ $rc -eq 1 ] && grep -q "training diverged: .* (steps 1 to 3, the run's last)" err.txt &&
		   ! grep -q "asyncpp: done" err.txt && ! ls hugerun/ckpt-* > /dev/null 2>&1; then
			pass absurd_weights_fail_the_run
		else
			fail absurd_weights_fail_the_run "exit $rc: $(tail -c 400 err.txt)"
		fi
	else
		fail absurd_weights_fail_the_run "setup: $(cat err.txt)"
	fi
else
	skip absurd_weights_fail_the_run "python3 not found"
fi

# 5. under MPI (one stage per process) the ranks roll back together, at the
# same steps as the threads of one process, to the same losses
if ! command -v mpirun > /dev/null || [ ! -d pipe0 ]; then
	skip mpi_rollback_as_threads "mpirun not found or no pipeline run"
	exit 0
fi
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -np 2)
ROLL=(--set train.steps=12 --set optim.lr=300 --set checkpoint.every=1 --set train.spike_window=1
      --set train.on_divergence=rollback --set train.rollback_lr_factor=0.001)
cp -r pipe0 pthr
cp -r pipe0 pmpi
$A train -q --resume pthr --set train.out_dir=pthr "${ROLL[@]}" 2> thr.err
timeout 300 "${MPIRUN[@]}" $A train -q --resume pmpi --set train.out_dir=pmpi \
	--set pipeline.transport=mpi "${ROLL[@]}" > mpi.out 2> mpi.err
rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c 'rolled back to' mpi.err)" = 1 ] &&
   grep -q 'rolled back to' thr.err && cmp -s <(losses pthr/metrics.csv) <(losses pmpi/metrics.csv); then
	pass mpi_rollback_as_threads
else
	fail mpi_rollback_as_threads "exit $rc: $(head -c 400 mpi.err)"
fi
