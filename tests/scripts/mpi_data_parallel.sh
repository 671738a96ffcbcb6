#!/usr/bin/env bash
# mpi_data_parallel.sh - data-parallel replicas of a pipeline over MPI:
# mpirun -np 4 with pipeline.stages = 2 and pipeline.data_parallel = 2
# (replica r's stage s on rank 2r + s) computes exactly what the same run
# computes in threads (2 x 2 stage threads): for 2bw and 1f1b, 20 steps of a
# tiny model on the built-in corpus give the same metrics (loss, val_loss,
# lr, grad_norm at %.9g) and identical checkpoints (lib.sh same_ckpt); an MPI run resumed
# from its step-10 checkpoint, under MPI or in threads, ends on the same
# bytes. Two replicas of 2 micro-batches match one pipeline of 4 within a
# relative 1e-5 on every step's loss (the gradient sum is (g0+g1)+(g2+g3)
# instead of ((g0+g1)+g2)+g3; step 1, before any update, exactly). Wrong
# process counts and micro-batches not divisible by the replicas are
# refused by rank 0 with a message naming the fix.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
if ! command -v mpirun > /dev/null 2>&1; then
	skip mpi_data_parallel "mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)"
	exit 0
fi
# yield when idle: the ranks share the cores with the rest of the suite
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -np 4)
TINY=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32
      --set train.batch_size=4 --set log.every=5 --set train.threads=1)

if ! $A train -q "${TINY[@]}" --set train.out_dir=base --set train.steps=1 --set eval.every=0 \
	2> err.txt; then
	fail mpi_data_parallel "preparing the data: $(cat err.txt)"
	exit 0
fi
DATA=(--set data.train=base/data/builtin_train.shard --set data.val=base/data/builtin_val.shard
      --set data.tokenizer=base/data/builtin.tok)

# columns that must agree: everything but the clock and the rates
cols() { cut -d, -f1,2,4,5,6,7 "$1"; }

for kind in 2bw 1f1b; do
	# eval.batches = 3: the replicas split the validation batches unevenly
	RUN=("${TINY[@]}" "${DATA[@]}" --set train.schedule=$kind --set pipeline.stages=2
	     --set pipeline.micro_batches=4 --set pipeline.data_parallel=2 --set train.steps=20
	     --set eval.every=10 --set eval.batches=3 --set checkpoint.every=10)
	rm -rf run
	if ! $A train -q "${RUN[@]}" --set train.out_dir=run 2> err.txt; then
		fail "mpi_dp_${kind}_threads" "threaded run failed: $(cat err.txt)"
		continue
	fi
	mv run threads_$kind
	"${MPIRUN[@]}" $A train -q "${RUN[@]}" --set train.out_dir=run > mpi.out 2> err.txt
	rc=$?
	if grep -q "built without MPI" err.txt; then
		skip mpi_data_parallel "this asyncpp was built without MPI"
		exit 0
	fi
	if [ $rc -ne 0 ]; then
		fail "mpi_dp_${kind}_runs" "mpirun exited $rc: $(head -c 600 err.txt)"
		continue
	fi
	mv run mpi_$kind
	if [ "$(wc -l < mpi_$kind/metrics.csv)" -ge 21 ] &&
	   diff <(cols threads_$kind/metrics.csv) <(cols mpi_$kind/metrics.csv) > d.txt; then
		pass "mpi_dp_${kind}_metrics_equal_threads ($(grep -c . mpi_$kind/metrics.csv) rows)"
	else
		fail "mpi_dp_${kind}_metrics_equal_threads" "$(head -n 6 d.txt | tr '\n' ' ')"
	fi
	if same_ckpt threads_$kind/ckpt-00000020.ckpt mpi_$kind/ckpt-00000020.ckpt &&
	   same_ckpt threads_$kind/ckpt-00000010.ckpt mpi_$kind/ckpt-00000010.ckpt; then
		pass "mpi_dp_${kind}_checkpoints_identical"
	else
		$A inspect --diff threads_$kind/ckpt-00000020.ckpt mpi_$kind/ckpt-00000020.ckpt \
			> diff.txt 2>&1
		fail "mpi_dp_${kind}_checkpoints_identical" "$(head -n 8 diff.txt | tr '\n' ' ')"
	fi
done

# one pipeline of 4 micro-batches, in threads: the same losses within 1e-5
RUN1=("${TINY[@]}" "${DATA[@]}" --set train.schedule=2bw --set pipeline.stages=2
      --set pipeline.micro_batches=4 --set train.steps=20 --set eval.every=10
      --set eval.batches=3 --set checkpoint.every=10)
rm -rf run
if [ -d mpi_2bw ] && $A train -q "${RUN1[@]}" --set train.out_dir=run 2> err.txt; then
	mv run single
	# the training rows' step and loss, side by side: step 1 exactly, every
	# step within 1e-5
	losses() { awk -F, 'NR > 1 && $4 != "" {print $1 "," $4}' "$1"; }
	if out=$(paste -d, <(losses single/metrics.csv) <(losses mpi_2bw/metrics.csv) |
		 awk -F, 'function abs(x) { return x < 0 ? -x : x }
			  { n++; r = abs($2 - $4) / abs($2); if (r > worst) worst = r
			    if ($1 != $3 || r > 1e-5 || ($1 == 1 && $2 != $4))
				    bad = bad " step " $1 ": " $2 " vs " $4 }
			  END { if (n != 20 || bad != "") { print "rows " n bad; exit 1 }
				printf "largest relative difference %.2g", worst }'); then
		pass "mpi_dp_two_replicas_match_one_pipeline_within_1e-5 ($out)"
	else
		fail mpi_dp_two_replicas_match_one_pipeline_within_1e-5 "$out"
	fi
else
	fail mpi_dp_two_replicas_match_one_pipeline_within_1e-5 "single pipeline: $(head -c 300 err.txt)"
fi

# resume the MPI run's step-10 checkpoint under MPI and in threads: the
# same final bytes as the uninterrupted run
if [ -d mpi_2bw ]; then
	for how in mpi threads; do
		rm -rf run
		mkdir run
		cp mpi_2bw/ckpt-00000010.ckpt run/
		head -n 12 mpi_2bw/metrics.csv > run/metrics.csv # through step 10 and its val_loss
		if [ $how = mpi ]; then
			"${MPIRUN[@]}" $A train -q --resume run > /dev/null 2> err.txt
		else
			$A train -q --resume run > /dev/null 2> err.txt
		fi
		if [ $? -eq 0 ] && same_ckpt run/ckpt-00000020.ckpt threads_2bw/ckpt-00000020.ckpt &&
		   diff <(cols threads_2bw/metrics.csv) <(cols run/metrics.csv) > d.txt; then
			pass "mpi_dp_resume_under_${how}_is_exact"
		else
			fail "mpi_dp_resume_under_${how}_is_exact" \
			     "$(head -c 400 err.txt) $(head -n 4 d.txt 2> /dev/null | tr '\n' ' ')"
		fi
	done
fi

# 4 processes for 2 stages x 3 replicas: refused once, naming the layout
"${MPIRUN[@]}" $A train -q "${TINY[@]}" "${DATA[@]}" --set train.schedule=1f1b \
	--set pipeline.stages=2 --set pipeline.micro_batches=6 --set pipeline.data_parallel=3 \
	--set train.out_dir=bad > /dev/null 2> err.txt
rc=$?
if [ $rc -ne 0 ] && [ "$(grep -c 'pipeline.data_parallel = 3 need 6 processes' err.txt)" -eq 1 ]; then
	pass mpi_dp_wrong_process_count_rejected
else
	fail mpi_dp_wrong_process_count_rejected "exit $rc: $(head -c 300 err.txt)"
fi
"${MPIRUN[@]}" $A train -q "${TINY[@]}" "${DATA[@]}" --set train.schedule=1f1b \
	--set pipeline.stages=2 --set pipeline.micro_batches=3 --set pipeline.data_parallel=2 \
	--set train.out_dir=bad > /dev/null 2> err.txt
rc=$?
if [ $rc -ne 0 ] && [ "$(grep -c 'micro_batches = 3 is not divisible by' err.txt)" -eq 1 ]; then
	pass mpi_dp_indivisible_micro_batches_rejected
else
	fail mpi_dp_indivisible_micro_batches_rejected "exit $rc: $(head -c 300 err.txt)"
fi
