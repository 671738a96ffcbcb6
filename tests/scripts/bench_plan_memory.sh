#!/usr/bin/env bash
# bench_plan_memory.sh - `asyncpp bench plan`'s memory of the fullest GPU:
# for a GPT-2 of 4 layers of width 1024 (context 1024, GPT-2's vocabulary,
# tied head) on 4 stages, the printed weights, bf16 copies and gradients of
# 1f1b and 2bw are the hand-computed ones (stage 0: wte 50304 x 1024, wpe
# 1024 x 1024 and a layer of 12 C^2 + 13 C floats; one fp32 version, two
# under 2bw, a bf16 copy of each, two fp32 accumulators); the fits column
# flips between --gpu-mem just above and just below a row's total; and the
# 10B MoE preset at EP 8 fits 80 GB with both schedules at S = 2, not at S = 1.
# The figures' equality with what a run allocates, to the byte, is
# tests/unit/test_plan_memory.c's.
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
plan() {
	$A bench plan --model gpt2-124m --layers 4 --d-model 1024 --seq 1024 --stages 4 --dp 1 "$@"
}
# the memory table's row of a schedule:
#   S schedule GPU weights bf16 grads optim act/mb acts total fits
row() { awk -v k="$1" '/^memory of/ {m = 1} m && $1 == 4 && $2 == k' out.txt; }

if ! plan > out.txt 2> err.txt; then
	fail hand_computed_weights "exit $?: $(head -c 300 err.txt)"
else
	n0=$((50304 * 1024 + 1024 * 1024 + 12 * 1024 * 1024 + 13 * 1024))
	want=$(awk -v n="$n0" 'BEGIN {
		printf "1f1b 0 %.3f %.3f %.3f\n", n * 4 / 1e9, n * 2 / 1e9, n * 8 / 1e9
		printf "2bw 0 %.3f %.3f %.3f\n", n * 8 / 1e9, n * 4 / 1e9, n * 8 / 1e9 }')
	got=$( (row 1f1b; row 2bw) | awk '{print $2, $3, $4, $5, $6}')
	if [ -n "$got" ] && [ "$got" = "$want" ]; then
		pass hand_computed_weights
	else
		fail hand_computed_weights "got '$got', want '$want'"
	fi
fi

total=$(row 1f1b | awk '{print $10}')
if [ -z "$total" ]; then
	fail fits_flips "no 1f1b row in the memory table"
else
	above=$(awk -v t="$total" 'BEGIN {printf "%.3f", t + 0.001}')
	below=$(awk -v t="$total" 'BEGIN {printf "%.3f", t - 0.001}')
	plan --gpu-mem "$above" > out.txt 2> /dev/null
	yes=$(row 1f1b | awk '{print $11}')
	plan --gpu-mem "$below" > out.txt 2> /dev/null
	no=$(row 1f1b | awk '{print $11}')
	if [ "$yes" = yes ] && [ "$no" = no ]; then
		pass fits_flips
	else
		fail fits_flips "total $total: --gpu-mem $above gave '$yes', $below '$no'"
	fi
fi

# the grid's fits column (S EP DP GPUs 1f1b-GB 2bw-GB fits ...)
# (E/EP experts' weights: at EP 8 the 10B model fits from S = 2)
$A bench plan --model moe-10b --stages 1,2 --dp 8 --ep 8 > out.txt 2> err.txt
f1=$(awk '$1 == 1 && $2 == 8 && $3 == 8 {print $7}' out.txt)
f2=$(awk '$1 == 2 && $2 == 8 && $3 == 8 {print $7}' out.txt)
if [ "$f1" = no ] && [ "$f2" = both ]; then
	pass moe_10b_fits_from_s2
else
	fail moe_10b_fits_from_s2 "S = 1: '$f1', S = 2: '$f2' (want no, both):" \
		"$(head -c 300 err.txt)"
fi

expect_exit 2 act_bytes_refused -- $A bench plan --act-bytes 3
expect_exit 2 unknown_optimizer -- $A bench plan --optimizer adamx
