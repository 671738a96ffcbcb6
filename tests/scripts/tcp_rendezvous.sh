#!/usr/bin/env bash
# tcp_rendezvous.sh - processes started torchrun-style (RANK, WORLD_SIZE,
# MASTER_ADDR, MASTER_PORT; no MPI launcher) with pipeline.transport = tcp
# meet at asyncpp's TCP rendezvous (sched/comm/rendezvous.h), on 127.0.0.1:
# a rank with another configuration is named with its first differing key;
# ranks that agree train; a missing MASTER_PORT and a rank 0 that never
# comes are named; nccl is refused where CUDA is not built in. No GPU.
# (tcp_pipeline.sh checks what the ranks compute.)
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
TINY=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32
      --set train.batch_size=4 --set train.threads=1 --set eval.every=0 --set train.steps=2)
PIPE=(--set train.schedule=1f1b --set pipeline.stages=2 --set pipeline.micro_batches=2
      --set pipeline.transport=tcp --set pipeline.timeout=20)
export ASYNCPP_CONNECT_TIMEOUT=20

# a port nobody listens on: bind port 0 and let it go
# two ranks; $1 and $2: extra options of rank 0 and rank 1
pair() {
	local p
	p=$(free_port)
	MASTER_ADDR=127.0.0.1 MASTER_PORT=$p RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 \
		$A train -q "${TINY[@]}" "${PIPE[@]}" $2 > out1.txt 2> err1.txt &
	local pid=$!
	MASTER_ADDR=127.0.0.1 MASTER_PORT=$p RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 \
		$A train -q "${TINY[@]}" "${PIPE[@]}" $1 > out0.txt 2> err0.txt
	rc0=$?
	wait $pid
	rc1=$?
}

if ! $A --version | grep -q "cuda"; then
	pair "--set train.out_dir=nc --set pipeline.transport=nccl" \
	     "--set train.out_dir=nc --set pipeline.transport=nccl"
	if [ $rc0 -eq 1 ] && grep -q "built without CUDA" err0.txt; then
		pass tcp_nccl_refused_without_cuda
	else
		fail tcp_nccl_refused_without_cuda "exit $rc0: $(head -c 300 err0.txt)"
	fi
fi

t0=$(date +%s)
pair "--set train.out_dir=diff" "--set train.out_dir=diff --set optim.lr=0.002"
want='rank 1 runs another configuration than rank 0 (optim.lr = 0.002 on rank 1, but optim.lr = 0.003 on rank 0)'
if [ $rc0 -eq 1 ] && [ $rc1 -eq 1 ] && grep -qF "$want" err0.txt && ! grep -q . err1.txt &&
   [ $(($(date +%s) - t0)) -lt 15 ]; then
	pass tcp_config_mismatch_named
else
	fail tcp_config_mismatch_named "exit $rc0/$rc1: $(head -c 300 err0.txt) | $(head -c 300 err1.txt)"
fi

pair "--set train.out_dir=same" "--set train.out_dir=same"
if [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && [ -f same/metrics.csv ] && ! grep -q . err0.txt; then
	pass tcp_same_config_trains
else
	fail tcp_same_config_trains "exit $rc0/$rc1: $(head -c 300 err0.txt) | $(head -c 300 err1.txt)"
fi

MASTER_ADDR=127.0.0.1 RANK=1 WORLD_SIZE=2 $A train -q "${TINY[@]}" "${PIPE[@]}" \
	--set train.out_dir=noport > /dev/null 2> err.txt
rc=$?
if [ $rc -eq 1 ] && grep -q "MASTER_PORT is not set" err.txt; then
	pass tcp_missing_master_port_named
else
	fail tcp_missing_master_port_named "exit $rc: $(head -c 300 err.txt)"
fi

ASYNCPP_CONNECT_TIMEOUT=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$(free_port) RANK=1 WORLD_SIZE=2 \
	$A train -q "${TINY[@]}" "${PIPE[@]}" --set train.out_dir=alone > /dev/null 2> err.txt
rc=$?
if [ $rc -eq 1 ] && grep -q "could not connect to rank 0 at MASTER_ADDR:MASTER_PORT = 127.0.0.1:" err.txt; then
	pass tcp_rank_0_never_comes_named
else
	fail tcp_rank_0_never_comes_named "exit $rc: $(head -c 300 err.txt)"
fi

# without a launcher, the tcp transport says how to start the processes
$A train -q "${TINY[@]}" "${PIPE[@]}" --set train.out_dir=nolaunch > /dev/null 2> err.txt
rc=$?
if [ $rc -eq 1 ] && grep -q "torchrun --nproc-per-node 2 --no-python asyncpp train" err.txt; then
	pass tcp_transport_without_launcher_rejected
else
	fail tcp_transport_without_launcher_rejected "exit $rc: $(head -c 300 err.txt)"
fi
