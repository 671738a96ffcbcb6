#!/usr/bin/env bash
# mpi_pipeline.sh - a 2-process pipeline over MPI computes exactly what the
# same pipeline computes in threads: for 2bw, 1f1b and the zero-bubble zb-h1
# and 2bw-zb (B and W apart; their metrics are 1f1b's and 2bw's), and the
# chunked zb-v and interleaved (two pieces per rank: zb-v's turn handed over
# inside a rank, its tied embedding's two ends on rank 0), 20 steps of a tiny
# model on the built-in corpus give the same metrics (step, loss, val_loss,
# lr, grad_norm at %.9g) and identical checkpoints (lib.sh same_ckpt); an MPI run resumed
# from its step-10 checkpoint ends on the same bytes (2bw, and zb-v); a wrong process count
# is rejected with a message naming the fix; a non-finite loss stops every
# rank with one message; three stages (a middle rank that reads no data)
# match threads too; man/asyncpp-distributed.7 renders. Both runs of a pair use the same train.out_dir (moved away
# afterwards), so the configuration stored in the checkpoints is the same.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
if ! command -v mpirun > /dev/null 2>&1; then
	skip mpi_pipeline "mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)"
	exit 0
fi
# yield when idle: the ranks share two busy cores with the rest of the suite
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -np 2)
TINY=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32
      --set train.batch_size=4 --set log.every=5 --set train.threads=1)

# the built-in data, prepared once
if ! $A train -q "${TINY[@]}" --set train.out_dir=base --set train.steps=1 --set eval.every=0 \
	2> err.txt; then
	fail mpi_pipeline "preparing the data: $(cat err.txt)"
	exit 0
fi
DATA=(--set data.train=base/data/builtin_train.shard --set data.val=base/data/builtin_val.shard
      --set data.tokenizer=base/data/builtin.tok)

# columns that must agree: everything but the clock and the rates
cols() { cut -d, -f1,2,4,5,6,7 "$1"; }

for kind in 2bw 1f1b zb-h1 2bw-zb zb-v interleaved; do
	RUN=("${TINY[@]}" "${DATA[@]}" --set train.schedule=$kind --set pipeline.stages=2
	     --set pipeline.micro_batches=2 --set train.steps=20 --set eval.every=10
	     --set eval.batches=2 --set checkpoint.every=10)
	# the chunked kinds: 4 pieces of a layer each, 4 micro-batches (zb-v: M >= 2S)
	case $kind in
	zb-v) RUN+=(--set model.n_layer=4 --set pipeline.micro_batches=4) ;;
	interleaved) RUN+=(--set model.n_layer=4 --set pipeline.micro_batches=4
			   --set pipeline.virtual_stages=2) ;;
	esac
	rm -rf run
	if ! $A train -q "${RUN[@]}" --set train.out_dir=run 2> err.txt; then
		fail "mpi_${kind}_threads" "threaded run failed: $(cat err.txt)"
		continue
	fi
	mv run threads_$kind
	"${MPIRUN[@]}" $A train -q "${RUN[@]}" --set train.out_dir=run > mpi.out 2> err.txt
	rc=$?
	if grep -q "built without MPI" err.txt; then
		skip mpi_pipeline "this asyncpp was built without MPI"
		exit 0
	fi
	if [ $rc -ne 0 ]; then
		fail "mpi_${kind}_runs" "mpirun exited $rc: $(head -c 600 err.txt)"
		continue
	fi
	mv run mpi_$kind
	if [ "$(wc -l < mpi_$kind/metrics.csv)" -ge 21 ] &&
	   diff <(cols threads_$kind/metrics.csv) <(cols mpi_$kind/metrics.csv) > d.txt; then
		pass "mpi_${kind}_metrics_equal_threads ($(grep -c . mpi_$kind/metrics.csv) rows)"
	else
		fail "mpi_${kind}_metrics_equal_threads" "$(head -n 6 d.txt | tr '\n' ' ')"
	fi
	ck=ckpt-00000020.ckpt
	if same_ckpt threads_$kind/$ck mpi_$kind/$ck && same_ckpt threads_$kind/ckpt-00000010.ckpt \
		mpi_$kind/ckpt-00000010.ckpt; then
		pass "mpi_${kind}_checkpoints_identical"
	else
		$A inspect --diff threads_$kind/$ck mpi_$kind/$ck > diff.txt 2>&1
		fail "mpi_${kind}_checkpoints_identical" "$(head -n 8 diff.txt | tr '\n' ' ')"
	fi
	if $A inspect --diff threads_$kind/$ck mpi_$kind/$ck > diff.txt 2>&1 &&
	   grep -Eq '^([0-9]+) tensors compared, \1 identical, 0 not comparable' diff.txt; then
		pass "mpi_${kind}_inspect_diff_all_identical"
	else
		fail "mpi_${kind}_inspect_diff_all_identical" "$(head -n 8 diff.txt | tr '\n' ' ')"
	fi
	# the split backward changes no bit: the fused twin's metrics
	twin=$(case $kind in zb-h1) echo 1f1b ;; 2bw-zb) echo 2bw ;; esac)
	[ -n "$twin" ] || continue
	if diff <(cols threads_$twin/metrics.csv) <(cols mpi_$kind/metrics.csv) > d.txt; then
		pass "mpi_${kind}_metrics_equal_${twin}"
	else
		fail "mpi_${kind}_metrics_equal_${twin}" "$(head -n 6 d.txt | tr '\n' ' ')"
	fi
done

# activations stored as bf16: the messages are half the bytes, and the
# two ranks compute what the threads do
BF=("${TINY[@]}" "${DATA[@]}" --set train.schedule=2bw --set pipeline.stages=2
    --set pipeline.micro_batches=2 --set train.steps=10 --set eval.every=0
    --set train.act_dtype=bf16)
if $A train -q "${BF[@]}" --set train.out_dir=threads_bf16 2> err.txt &&
   "${MPIRUN[@]}" $A train -q "${BF[@]}" --set train.out_dir=mpi_bf16 > mpi.out 2>> err.txt &&
   [ "$(wc -l < mpi_bf16/metrics.csv)" -ge 11 ] &&
   diff <(cols threads_bf16/metrics.csv) <(cols mpi_bf16/metrics.csv) > d.txt; then
	pass mpi_bf16_2bw_metrics_equal_threads
else
	fail mpi_bf16_2bw_metrics_equal_threads "$(head -c 400 err.txt) $(head -n 4 d.txt 2> /dev/null | tr '\n' ' ')"
fi

# resume under MPI from the step-10 checkpoint: the same final bytes
if [ -d mpi_2bw ]; then
	rm -rf run
	mkdir run
	cp mpi_2bw/ckpt-00000010.ckpt run/
	head -n 12 mpi_2bw/metrics.csv > run/metrics.csv # through step 10 and its val_loss
	if "${MPIRUN[@]}" $A train -q --resume run > /dev/null 2> err.txt &&
	   same_ckpt run/ckpt-00000020.ckpt threads_2bw/ckpt-00000020.ckpt &&
	   diff <(cols threads_2bw/metrics.csv) <(cols run/metrics.csv) > d.txt; then
		pass mpi_resume_is_exact
	else
		fail mpi_resume_is_exact "$(head -c 400 err.txt) $(head -n 4 d.txt 2> /dev/null | tr '\n' ' ')"
	fi
fi

# resume zb-v (two pieces per rank) under MPI: the same final bytes
if [ -d mpi_zb-v ]; then
	rm -rf run
	mkdir run
	cp mpi_zb-v/ckpt-00000010.ckpt run/
	head -n 12 mpi_zb-v/metrics.csv > run/metrics.csv
	if "${MPIRUN[@]}" $A train -q --resume run > /dev/null 2> err.txt &&
	   same_ckpt run/ckpt-00000020.ckpt threads_zb-v/ckpt-00000020.ckpt &&
	   diff <(cols threads_zb-v/metrics.csv) <(cols run/metrics.csv) > d.txt; then
		pass mpi_zbv_resume_is_exact
	else
		fail mpi_zbv_resume_is_exact "$(head -c 400 err.txt) $(head -n 4 d.txt 2> /dev/null | tr '\n' ' ')"
	fi
fi

# a process count that is not pipeline.stages is refused, by rank 0 only
"${MPIRUN[@]}" $A train -q "${TINY[@]}" "${DATA[@]}" --set train.schedule=1f1b \
	--set pipeline.stages=3 --set pipeline.micro_batches=3 --set train.out_dir=bad > /dev/null 2> err.txt
rc=$?
if [ $rc -ne 0 ] && [ "$(grep -c 'pipeline.stages = 3, but 2 processes were launched' err.txt)" -eq 1 ]; then
	pass mpi_wrong_process_count_rejected
else
	fail mpi_wrong_process_count_rejected "exit $rc: $(head -c 300 err.txt)"
fi
"${MPIRUN[@]}" $A train -q "${TINY[@]}" "${DATA[@]}" --set train.out_dir=bad > /dev/null 2> err.txt
rc=$?
if [ $rc -ne 0 ] && grep -q 'train.schedule = none trains on one process' err.txt; then
	pass mpi_schedule_none_rejected
else
	fail mpi_schedule_none_rejected "exit $rc: $(head -c 300 err.txt)"
fi
# without a launcher, the mpi transport says how to start the processes
$A train -q "${TINY[@]}" "${DATA[@]}" --set train.schedule=2bw --set pipeline.stages=2 \
	--set pipeline.micro_batches=2 --set pipeline.transport=mpi --set train.out_dir=bad \
	> /dev/null 2> err.txt
rc=$?
if [ $rc -eq 1 ] && grep -q "mpirun -np 2" err.txt; then
	pass mpi_transport_without_launcher_rejected
else
	fail mpi_transport_without_launcher_rejected "exit $rc: $(head -c 300 err.txt)"
fi
# a malformed rank variable is named
RANK=2 WORLD_SIZE=2 $A train -q "${TINY[@]}" "${DATA[@]}" --set train.out_dir=bad > /dev/null 2> err.txt
rc=$?
if [ $rc -eq 1 ] && grep -q "RANK/WORLD_SIZE says rank 2 of 2" err.txt; then
	pass mpi_bad_rank_environment_rejected
else
	fail mpi_bad_rank_environment_rejected "exit $rc: $(head -c 300 err.txt)"
fi

# the launch documentation renders without warnings
page=$ROOT/man/asyncpp-distributed.7
if ! command -v groff > /dev/null 2>&1; then
	skip mpi_man_page_renders "groff is not installed"
elif [ -f "$page" ] && out=$(groff -man -ww -z "$page" 2>&1) && [ -z "$out" ]; then
	pass mpi_man_page_renders
else
	fail mpi_man_page_renders "${out:-missing $page}"
fi

# three stages: the middle rank opens the data without reading it, and the
# run is still the threaded one (the metrics and the final checkpoint)
RUN3=(--set model.n_layer=3 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32
      --set train.batch_size=4 --set log.every=5 --set train.threads=1 "${DATA[@]}"
      --set train.schedule=2bw --set pipeline.stages=3 --set pipeline.micro_batches=3
      --set train.steps=10 --set eval.every=5 --set eval.batches=2)
rm -rf run
if $A train -q "${RUN3[@]}" --set train.out_dir=run 2> err.txt; then
	mv run threads_s3
	MPIRUN3=(mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -np 3)
	if "${MPIRUN3[@]}" $A train -q "${RUN3[@]}" --set train.out_dir=run > /dev/null 2> err.txt &&
	   diff <(cols threads_s3/metrics.csv) <(cols run/metrics.csv) > d.txt &&
	   same_ckpt threads_s3/ckpt-00000010.ckpt run/ckpt-00000010.ckpt; then
		pass mpi_three_stages_equal_threads
	else
		fail mpi_three_stages_equal_threads "$(head -c 400 err.txt) $(head -n 4 d.txt | tr '\n' ' ')"
	fi
else
	fail mpi_three_stages_equal_threads "threaded run: $(cat err.txt)"
fi

# an uneven cut (pipeline.layers = 0,2,1: rank 0 holds only the
# embeddings): each rank builds its stage from the same cut, and 2bw
# computes what it computes on the even cut in threads (the metrics; every
# tensor of the checkpoint, whose stored config differs)
if [ -d threads_s3 ]; then
	rm -rf run
	if "${MPIRUN3[@]}" $A train -q "${RUN3[@]}" --set pipeline.split=layers \
		--set pipeline.layers=0,2,1 --set train.out_dir=run > /dev/null 2> err.txt &&
	   diff <(cols threads_s3/metrics.csv) <(cols run/metrics.csv) > d.txt &&
	   $A inspect --diff threads_s3/ckpt-00000010.ckpt run/ckpt-00000010.ckpt > diff.txt 2>&1 &&
	   grep -Eq '^([0-9]+) tensors compared, \1 identical, 0 not comparable' diff.txt; then
		pass mpi_uneven_cut_equals_even_threads
	else
		fail mpi_uneven_cut_equals_even_threads "$(head -c 400 err.txt) $(head -n 4 d.txt diff.txt 2> /dev/null | tr '\n' ' ')"
	fi
fi

# eval.batches beyond what the val shard holds: both transports evaluate
# the same windows (each at most once), so the val losses agree bit for bit
EVAL=("${TINY[@]}" "${DATA[@]}" --set train.schedule=1f1b --set pipeline.stages=2
      --set pipeline.micro_batches=2 --set train.steps=4 --set eval.every=2 --set eval.batches=100000)
rm -rf ev_threads ev_mpi
if $A train -q "${EVAL[@]}" --set train.out_dir=ev_threads 2> err.txt &&
   "${MPIRUN[@]}" $A train -q "${EVAL[@]}" --set train.out_dir=ev_mpi > /dev/null 2>> err.txt &&
   [ -n "$(cut -d, -f5 ev_mpi/metrics.csv | grep -v '^$' | sed 1d)" ] &&
   diff <(cut -d, -f1,5 ev_threads/metrics.csv) <(cut -d, -f1,5 ev_mpi/metrics.csv) > d.txt; then
	pass mpi_eval_beyond_val_shard_equals_threads
else
	fail mpi_eval_beyond_val_shard_equals_threads "$(head -c 300 err.txt) $(head -n 4 d.txt | tr '\n' ' ')"
fi

# a rank killed with -9 mid-run: the job ends within 30 s naming the dead
# rank, the newest checkpoint is complete, and resuming from it under
# mpirun ends with the uninterrupted run's losses; SIGTERM to the launcher
# (what Slurm sends before the time limit) writes one checkpoint of one
# step for every stage, and the resumed run is exact as well
FAULT=("${TINY[@]}" "${DATA[@]}" --set train.schedule=2bw --set pipeline.stages=2
       --set pipeline.micro_batches=2 --set train.steps=1500 --set eval.every=0 --set log.every=1
       --set checkpoint.every=50)
rm -rf f_threads
$A train -q "${FAULT[@]}" --set train.out_dir=f_threads 2> err.txt
for sig in KILL TERM; do
	rm -rf f_$sig
	"${MPIRUN[@]}" $A train -q "${FAULT[@]}" --set train.out_dir=f_$sig > /dev/null 2> err.txt &
	launcher=$!
	for _ in $(seq 1 200); do
		[ -f f_$sig/metrics.csv ] && [ "$(wc -l < f_$sig/metrics.csv)" -gt 120 ] && break
		sleep 0.05
	done
	t0=$(date +%s)
	if [ $sig = KILL ]; then
		kill -9 "$(pgrep -f "asyncpp train.*f_$sig" | grep -v "^$launcher$" | sort -n | tail -n 1)"
	else
		kill -TERM $launcher
	fi
	wait $launcher
	rc=$? took=$(( $(date +%s) - t0 ))
	said=1
	[ $sig = KILL ] && ! grep -q "rank 1 .*exited on signal 9" err.txt && said=0
	[ $sig = TERM ] && ! grep -q "terminated: wrote f_TERM/ckpt-" err.txt && said=0
	newest=$(ls f_$sig/ckpt-*.ckpt 2> /dev/null | tail -n 1)
	if [ $rc -ne 0 ] && [ $took -le 30 ] && [ $said = 1 ] && [ -n "$newest" ] &&
	   $A inspect "$newest" > /dev/null 2>&1 &&
	   "${MPIRUN[@]}" $A train -q --resume f_$sig > /dev/null 2> err2.txt &&
	   diff <(cut -d, -f1,4 f_threads/metrics.csv) <(cut -d, -f1,4 f_$sig/metrics.csv) > d.txt; then
		pass "mpi_${sig,,}_mid_run_resumes_exactly (ended in ${took} s)"
	else
		fail "mpi_${sig,,}_mid_run_resumes_exactly" "exit $rc after ${took} s, newest '$newest': $(head -c 300 err.txt) $(head -c 300 err2.txt 2> /dev/null) $(head -n 3 d.txt 2> /dev/null | tr '\n' ' ')"
	fi
done

# a stopped rank (SIGSTOP: alive, silent) makes the other name what it
# waits for once pipeline.timeout passes, and the job ends instead of hanging
rm -rf stall
"${MPIRUN[@]}" $A train -q "${FAULT[@]}" --set pipeline.timeout=2 --set train.out_dir=stall \
	> /dev/null 2> err.txt &
launcher=$!
for _ in $(seq 1 200); do
	[ -f stall/metrics.csv ] && [ "$(wc -l < stall/metrics.csv)" -gt 50 ] && break
	sleep 0.05
done
# the victim is rank 1 (its environment says so; pids need not follow ranks)
victim=
for p in $(pgrep -f "asyncpp train.*out_dir=stall"); do
	tr '\0' '\n' < /proc/$p/environ 2> /dev/null | grep -qx OMPI_COMM_WORLD_RANK=1 && victim=$p
done
t0=$(date +%s)
kill -STOP "$victim"
for _ in $(seq 1 300); do kill -0 $launcher 2> /dev/null || break; sleep 0.1; done
kill -0 $launcher 2> /dev/null && { kill -KILL "$victim" $launcher; sleep 1; }
wait $launcher
rc=$? took=$(( $(date +%s) - t0 ))
if [ $rc -ne 0 ] && [ $took -le 20 ] &&
   grep -Eq "rank 0 \(stage 0\) waited [0-9]+ s for .*rank.*, which never came" err.txt; then
	pass "mpi_stopped_rank_named_after_timeout (ended in ${took} s)"
else
	fail mpi_stopped_rank_named_after_timeout "exit $rc after ${took} s: $(head -c 400 err.txt)"
fi
kill -KILL "$victim" 2> /dev/null

# ranks started with different options are refused at the start, naming
# the first key that differs
rm -rf mism
"${MPIRUN[@]}" bash -c "exec $A train -q ${TINY[*]} ${DATA[*]} --set train.schedule=1f1b \
	--set pipeline.stages=2 --set pipeline.micro_batches=2 --set train.steps=5 --set eval.every=0 \
	--set train.out_dir=mism --set optim.lr=\$((OMPI_COMM_WORLD_RANK + 1))e-3" > /dev/null 2> err.txt
rc=$?
if [ $rc -ne 0 ] && [ "$(grep -c 'rank 1 runs another configuration than rank 0 (optim.lr = 0.002 on rank 1, but optim.lr = 0.001 on rank 0)' err.txt)" = 1 ] &&
   ! ls mism/ckpt-* > /dev/null 2>&1; then
	pass mpi_config_mismatch_named
else
	fail mpi_config_mismatch_named "exit $rc: $(head -c 300 err.txt)"
fi

# diverging steps are skipped on every rank alike; after train.max_skipped
# of them every rank stops at the same step, and only the root says so
"${MPIRUN[@]}" $A train -q "${TINY[@]}" "${DATA[@]}" --set train.schedule=2bw \
	--set pipeline.stages=2 --set pipeline.micro_batches=2 --set train.steps=30 --set eval.every=0 \
	--set optim.lr=1e8 --set train.grad_clip=0 --set optim.warmup=0 --set train.out_dir=nan \
	> mpi.out 2> err.txt
rc=$?
said=$(grep -c 'training diverged' err.txt)
if [ $rc -ne 0 ] && [ "$said" = 1 ]; then
	pass mpi_nonfinite_said_once
else
	fail mpi_nonfinite_said_once "exit $rc, said $said times: $(head -c 400 err.txt)"
fi
