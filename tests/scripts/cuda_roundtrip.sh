#!/usr/bin/env bash
# cuda_roundtrip.sh - a checkpoint moves between the CPU and the GPU: a run
# started on the CPU resumes on the GPU and follows the CPU's own
# continuation (bf16 GEMMs: within 2% per step), the GPU's checkpoint
# resumes on the CPU, and eval of it agrees on both devices. SKIPs where no
# GPU can be used (tools/gpu-check runs it with one).
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
TINY=(--set model.n_layer=2 --set model.d_model=64 --set model.n_head=4 --set model.seq_len=64
      --set train.batch_size=4 --set log.every=1 --set eval.every=0 --set checkpoint.every=10)
losses() { grep -v ',,,,' "$1/metrics.csv" | awk -F, -v a="$2" -v b="$3" 'NR > 1 && $1 >= a && $1 <= b {print $1, $4}'; }

if ! $A train -q "${TINY[@]}" --set train.out_dir=cpu --set train.steps=20 2> err.txt; then
	fail cpu_start "$(cat err.txt)"
	exit 0
fi
cp -R cpu gpu && cp -R cpu cpu_more
if ! $A train -q --resume gpu --set train.out_dir=gpu --set train.steps=40 --set train.device=cuda 2> err.txt; then
	if grep -q "cannot be served" err.txt; then
		skip cpu_checkpoint_resumes_on_gpu "$(cat err.txt)"
		exit 0
	fi
	fail cpu_checkpoint_resumes_on_gpu "$(cat err.txt)"
	exit 0
fi
if ! $A train -q --resume cpu_more --set train.out_dir=cpu_more --set train.steps=40 2> err.txt; then
	fail cpu_checkpoint_resumes_on_gpu "cpu continuation: $(cat err.txt)"
	exit 0
fi
bad=$(join <(losses cpu_more 21 40) <(losses gpu 21 40) |
	awk '{ d = $2 - $3; if (d < 0) d = -d; if (!(d <= 0.02 * $2)) print "step " $1 ": cpu " $2 ", gpu " $3 }' | head -n 3)
n=$(join <(losses cpu_more 21 40) <(losses gpu 21 40) | wc -l)
if [ "$n" -eq 20 ] && [ -z "$bad" ]; then
	pass cpu_checkpoint_resumes_on_gpu
else
	fail cpu_checkpoint_resumes_on_gpu "$n of 20 steps compared; $bad"
fi

cp -R gpu back
if $A train -q --resume back --set train.out_dir=back --set train.steps=50 --set train.device=cpu 2> err.txt &&
	[ "$(losses back 41 50 | wc -l)" -eq 10 ]; then
	pass gpu_checkpoint_resumes_on_cpu
else
	fail gpu_checkpoint_resumes_on_cpu "$(cat err.txt)"
fi

ck=$(ls gpu/ckpt-*.ckpt | tail -n 1)
if $A eval "$ck" --device cpu > e_cpu.txt 2> err.txt && $A eval "$ck" --device cuda > e_gpu.txt 2>> err.txt; then
	a=$(awk '/^loss/ {print $2}' e_cpu.txt) b=$(awk '/^loss/ {print $2}' e_gpu.txt)
	if [ -n "$a" ] && awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 2e-3 * a) }'; then
		pass "eval_agrees_on_cpu_and_gpu ($a, $b)"
	else
		fail eval_agrees_on_cpu_and_gpu "cpu '$a', gpu '$b'"
	fi
else
	fail eval_agrees_on_cpu_and_gpu "$(cat err.txt)"
fi
