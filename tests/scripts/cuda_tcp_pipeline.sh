#!/usr/bin/env bash
# cuda_tcp_pipeline.sh - two processes on one GPU, started torchrun-style
# with pipeline.transport = tcp (activations staged through host memory,
# the board and checkpoint parts over the TCP mesh), compute exactly what
# the same 2-stage 2bw pipeline computes as two threads of one process on
# that GPU: the same metrics (loss, val_loss, lr, grad_norm at %.9g) and
# the same checkpoint tensors. This is the multi-process path a GPU backend
# takes (non-host memory), the one CPU runs cannot reach. SKIPs where no GPU
# can be used (tools/gpu-check runs it with one).
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
RUN=(--set model.n_layer=2 --set model.d_model=64 --set model.n_head=4 --set model.seq_len=64
     --set train.batch_size=4 --set log.every=5 --set train.device=cuda
     --set train.schedule=2bw --set pipeline.stages=2 --set pipeline.micro_batches=2
     --set train.steps=20 --set eval.every=10 --set eval.batches=2 --set checkpoint.every=10)
cols() { cut -d, -f1,2,4,5,6,7 "$1"; }

if ! $A train -q "${RUN[@]}" --set train.out_dir=threads 2> err.txt; then
	if grep -q "cannot be served" err.txt; then
		skip cuda_tcp_pipeline "$(head -c 300 err.txt)"
		exit 0
	fi
	fail cuda_tcp_threads "$(head -c 400 err.txt)"
	exit 0
fi
DATA=(--set data.train=threads/data/builtin_train.shard --set data.val=threads/data/builtin_val.shard
      --set data.tokenizer=threads/data/builtin.tok)
p=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' \
	2> /dev/null || echo $((20000 + RANDOM % 40000)))
for r in 1 0; do
	MASTER_ADDR=127.0.0.1 MASTER_PORT=$p RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 timeout 300 \
		$A train -q "${RUN[@]}" "${DATA[@]}" --set pipeline.transport=tcp \
		--set train.out_dir=tcp > out$r.txt 2> err$r.txt &
	pid[r]=$!
done
wait ${pid[0]}; rc0=$?
wait ${pid[1]}; rc1=$?
if [ $rc0 -ne 0 ] || [ $rc1 -ne 0 ]; then
	fail cuda_tcp_two_processes_run "exit $rc0/$rc1: $(head -c 400 err0.txt) | $(head -c 300 err1.txt)"
	exit 0
fi
if [ "$(wc -l < tcp/metrics.csv)" -ge 21 ] &&
   diff <(cols threads/metrics.csv) <(cols tcp/metrics.csv) > d.txt; then
	pass cuda_tcp_metrics_equal_threads
else
	fail cuda_tcp_metrics_equal_threads "$(head -n 6 d.txt | tr '\n' ' ')"
fi
if $A inspect --diff threads/ckpt-00000020.ckpt tcp/ckpt-00000020.ckpt > diff.txt 2>&1 &&
   grep -Eq '^([0-9]+) tensors compared, \1 identical, 0 not comparable' diff.txt; then
	pass cuda_tcp_checkpoint_tensors_identical
else
	fail cuda_tcp_checkpoint_tensors_identical "$(head -n 8 diff.txt | tr '\n' ' ')"
fi
