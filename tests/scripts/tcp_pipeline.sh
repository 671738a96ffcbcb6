#!/usr/bin/env bash
# tcp_pipeline.sh - processes started torchrun-style (RANK, WORLD_SIZE,
# MASTER_ADDR, MASTER_PORT; no MPI anywhere) with pipeline.transport = tcp
# compute exactly what the same pipeline computes in threads: for 2bw and
# 1f1b with 2 stages, 1f1b with 3 (a middle rank that reads no data) and
# 2bw with 2 stages x 2 data-parallel replicas (4 processes), the zero-bubble
# zb-h1 and 2bw-zb with 2 stages (B and W apart), the chunked zb-v (2 stages,
# and 2 stages x 2 replicas) and interleaved (2 pieces per rank), 20 steps of a
# tiny model on the built-in corpus give the same metrics (loss, val_loss,
# lr, grad_norm at %.9g) and checkpoints whose tensors are identical (the
# stored configuration differs only in pipeline.transport); a run resumed
# under TCP from its step-10 checkpoint ends on the same tensors. A rank
# that is killed makes the others exit at once, naming it (and rank 0,
# when it was writing a checkpoint, removes the temporary); a rank that is
# stopped is named after pipeline.timeout. Both carriers (MPI, TCP) are one
# code path above sched/comm/p2p.h, so this also covers that layer end to end.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
TINY=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32
      --set train.batch_size=4 --set log.every=5 --set train.threads=1)
export ASYNCPP_CONNECT_TIMEOUT=30

# launch N ARGS...: N ranks on 127.0.0.1 (lib.sh tcp_launch)
launch() { tcp_launch "$1" 300 "${@:2}"; }

zeros() { [ "$rcs" = "$(printf '0 %.0s' $(seq "$1") | sed 's/ $//')" ]; }

if ! $A train -q "${TINY[@]}" --set train.out_dir=base --set train.steps=1 --set eval.every=0 \
	2> err.txt; then
	fail tcp_pipeline "preparing the data: $(cat err.txt)"
	exit 0
fi
DATA=(--set data.train=base/data/builtin_train.shard --set data.val=base/data/builtin_val.shard
      --set data.tokenizer=base/data/builtin.tok)

# columns that must agree: everything but the clock and the rates
cols() { cut -d, -f1,2,4,5,6,7 "$1"; }
same_tensors() {
	$A inspect --diff "$1" "$2" > diff.txt 2>&1 &&
		grep -Eq '^([0-9]+) tensors compared, \1 identical, 0 not comparable' diff.txt
}

# name kind stages replicas micro-batches [chunks per stage]
for spec in "2bw 2 1 2" "1f1b 2 1 2" "1f1b 3 1 3" "2bw 2 2 4" "zb-h1 2 1 2" "2bw-zb 2 1 2" \
	"zb-v 2 1 4 2" "zb-v 2 2 8 2" "interleaved 2 1 4 2"; do
	set -- $spec
	kind=$1 S=$2 N=$3 M=$4 V=${5:-1}
	name="tcp_${kind}_s${S}_dp${N}"
	RUN=("${TINY[@]}" "${DATA[@]}" --set model.n_layer=$((S * V > 2 ? S * V : 2))
	     --set pipeline.virtual_stages=$([ $kind = interleaved ] && echo $V || echo 1)
	     --set train.schedule=$kind --set pipeline.stages=$S
	     --set pipeline.data_parallel=$N --set pipeline.micro_batches=$M --set train.steps=20
	     --set eval.every=10 --set eval.batches=3 --set checkpoint.every=10)
	rm -rf threads_$name tcp_$name
	if ! $A train -q "${RUN[@]}" --set train.out_dir=threads_$name 2> err.txt; then
		fail "${name}_threads" "threaded run failed: $(head -c 400 err.txt)"
		continue
	fi
	launch $((S * N)) "${RUN[@]}" --set pipeline.transport=tcp --set train.out_dir=tcp_$name
	if ! zeros $((S * N)); then
		fail "${name}_runs" "exit statuses $rcs: $(head -c 600 err0.txt) $(head -c 300 err1.txt)"
		continue
	fi
	if [ "$(wc -l < tcp_$name/metrics.csv)" -ge 21 ] &&
	   diff <(cols threads_$name/metrics.csv) <(cols tcp_$name/metrics.csv) > d.txt; then
		pass "${name}_metrics_equal_threads"
	else
		fail "${name}_metrics_equal_threads" "$(head -n 6 d.txt | tr '\n' ' ')"
	fi
	if same_tensors threads_$name/ckpt-00000020.ckpt tcp_$name/ckpt-00000020.ckpt &&
	   same_tensors threads_$name/ckpt-00000010.ckpt tcp_$name/ckpt-00000010.ckpt; then
		pass "${name}_checkpoint_tensors_identical"
	else
		fail "${name}_checkpoint_tensors_identical" "$(head -n 8 diff.txt | tr '\n' ' ')"
	fi
done

# resume under TCP from the step-10 checkpoint: the same final tensors
name=tcp_2bw_s2_dp1
if [ -f tcp_$name/ckpt-00000010.ckpt ]; then
	rm -rf resumed
	mkdir resumed
	cp tcp_$name/ckpt-00000010.ckpt resumed/
	head -n 12 tcp_$name/metrics.csv > resumed/metrics.csv
	launch 2 --resume resumed --set train.out_dir=resumed
	if zeros 2 && same_tensors resumed/ckpt-00000020.ckpt threads_$name/ckpt-00000020.ckpt &&
	   diff <(cols threads_$name/metrics.csv) <(cols resumed/metrics.csv) > d.txt; then
		pass tcp_resume_is_exact
	else
		fail tcp_resume_is_exact "exit $rcs: $(head -c 300 err0.txt) $(head -n 4 d.txt | tr '\n' ' ')"
	fi
fi

# wait_for PID SECONDS: its exit status, or 124 after killing it when it
# outlives the seconds
wait_for() {
	local i
	for ((i = 0; i < $2 * 10; i++)); do
		kill -0 $1 2> /dev/null || break
		sleep 0.1
	done
	kill -0 $1 2> /dev/null && { kill -9 $1; wait $1 2> /dev/null; return 124; }
	wait $1
}

# two ranks of a long run in the background: pid0, pid1 (no wrapper, so
# that a signal reaches asyncpp itself)
long_pair() {
	local p
	p=$(free_port)
	MASTER_ADDR=127.0.0.1 MASTER_PORT=$p RANK=1 WORLD_SIZE=2 $A train -q "${LONG[@]}" "$@" \
		> /dev/null 2> err1.txt &
	pid1=$!
	MASTER_ADDR=127.0.0.1 MASTER_PORT=$p RANK=0 WORLD_SIZE=2 $A train -q "${LONG[@]}" "$@" \
		> /dev/null 2> err0.txt &
	pid0=$!
}

# a rank killed mid-run: the other exits at once and names it (seen by a
# receive, or by a send when the kill lands between messages: a hand-off's
# or a collective's, such as the step's allgather)
LONG=("${TINY[@]}" "${DATA[@]}" --set train.schedule=2bw --set pipeline.stages=2
      --set pipeline.micro_batches=2 --set train.steps=100000 --set eval.every=0
      --set checkpoint.every=0 --set pipeline.transport=tcp)
long_pair --set pipeline.timeout=120 --set train.out_dir=killed
sleep 3
kill -9 $pid1
t0=$(date +%s)
wait_for $pid0 60
rc0=$?
wait $pid1 2> /dev/null
if [ $rc0 -eq 1 ] && [ $(($(date +%s) - t0)) -lt 20 ] &&
   grep -qE "rank 1 closed its connection without saying goodbye|cannot send to rank 1: .*that rank is gone|cannot send .* to rank 1 \(.*\): it closed its connection" err0.txt; then
	pass tcp_killed_rank_named_at_once
else
	fail tcp_killed_rank_named_at_once "exit $rc0 after $(($(date +%s) - t0)) s: $(head -c 300 err0.txt)"
fi

# a rank killed while rank 0 writes a checkpoint (rank 1 stopped as soon as
# the temporary appears, so that its part of the file, larger than the
# sockets' buffers, is still to come): rank 0 exits naming it, and removes
# the ckpt-*.tmp.PID it was writing
long_pair --set model.n_layer=4 --set model.d_model=256 --set model.n_head=4 \
	--set checkpoint.every=5 --set pipeline.timeout=120 --set train.out_dir=killed_saving
caught=0
for _ in $(seq 1 3000); do
	kill -0 $pid0 2> /dev/null || break
	if ls killed_saving/ckpt-*.tmp.* > /dev/null 2>&1; then
		kill -STOP $pid1
		ls killed_saving/ckpt-*.tmp.* > /dev/null 2>&1 && { caught=1; break; }
		kill -CONT $pid1
	fi
	sleep 0.005
done
kill -9 $pid1
wait_for $pid0 60
rc0=$?
wait $pid1 2> /dev/null
if [ $caught = 1 ] && [ $rc0 -eq 1 ] && ! ls killed_saving/*.tmp.* > /dev/null 2>&1 &&
   grep -q "rank 1 closed its connection without saying goodbye" err0.txt; then
	pass tcp_killed_rank_while_saving_leaves_no_temporary
else
	fail tcp_killed_rank_while_saving_leaves_no_temporary "caught mid-write: $caught, exit $rc0, left: $(ls killed_saving | tr '\n' ' '): $(head -c 300 err0.txt)"
fi

# a rank stopped mid-run: the other names what it waits for after the timeout
# (a hand-off, or the step's broadcast when the stop lands between steps)
long_pair --set pipeline.timeout=3 --set train.out_dir=stopped
sleep 3
kill -STOP $pid1
wait_for $pid0 60
rc0=$?
kill -9 $pid1
wait $pid1 2> /dev/null
if [ $rc0 -eq 1 ] && grep -Eq "rank 0 \(stage 0\) waited [0-9]+ s for .*rank 1.*which never came|rank 0 waited [0-9]+ s in the [a-z]+ \(#[0-9]+\) for rank 1 .*pipeline.timeout = 3 s" err0.txt; then
	pass tcp_stopped_rank_named_after_the_timeout
else
	fail tcp_stopped_rank_named_after_the_timeout "exit $rc0: $(head -c 300 err0.txt)"
fi
