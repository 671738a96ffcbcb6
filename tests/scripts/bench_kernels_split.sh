#!/usr/bin/env bash
# bench_kernels_split.sh - `bench kernels` ends with one layer as a pipeline
# stage: its forward, fused backward and the split backward's B and W rows,
# then the line of their ratios and what B keeps for W, and the head's stage
# with its gradient in the forward and in W (three rows and their ratios),
# for gpt2 and llama;
# a wrong --arch is a usage error. Tiny shapes, one call per row: the
# figures are not judged (test_backward_split checks the bytes kept).
. "$ROOT/tests/lib.sh"
A=$ASYNCPP
TINY=(-B 2 -T 8 -C 32 --heads 4 --vocab 64 -n 1 --max-sec 0.01 -j 1)
for arch in gpt2 llama; do
	$A bench kernels "${TINY[@]}" --only stage --arch $arch > out.txt 2> err.txt
	rc=$?
	rows=$(grep -cE "^(stage_forward|stage_backward \(fused\)|stage_backward_input \(B\)|stage_backward_weight \(W\)) +1 $arch layer, 16x32 " out.txt)
	ratios=$(grep -cE '^  B/fused [0-9.]+, W/fused [0-9.]+, \(B\+W\)/fused [0-9.]+; B keeps [0-9.]+ MB per micro-batch for W$' out.txt)
	if [ $rc -eq 0 ] && [ "$rows" = 4 ] && [ "$ratios" = 1 ]; then
		pass "stage_rows_$arch"
	else
		fail "stage_rows_$arch" "exit $rc, rows $rows, ratio lines $ratios: $(head -c 600 out.txt) $(head -c 300 err.txt)"
	fi
	$A bench kernels "${TINY[@]}" --only head --arch $arch > out.txt 2> err.txt
	rc=$?
	rows=$(grep -cE "^(head_forward \(with dW\)|head_forward \(no dW\)|head_backward_weight) +16x32 @ 128x32\^T " out.txt)
	ratios=$(grep -cE '^  SPLIT_HEAD: forward [0-9.]+, W [0-9.]+, both [0-9.]+ of the forward with dW$' out.txt)
	if [ $rc -eq 0 ] && [ "$rows" = 3 ] && [ "$ratios" = 1 ]; then
		pass "head_rows_$arch"
	else
		fail "head_rows_$arch" "exit $rc, rows $rows, ratio lines $ratios: $(head -c 600 out.txt) $(head -c 300 err.txt)"
	fi
done
expect_exit 2 bad_arch -- $A bench kernels --arch gpt3 --only stage
if grep -q "arch must be gpt2 or llama, not 'gpt3'" err.txt; then pass bad_arch_named; else
	fail bad_arch_named "$(head -c 300 err.txt)"; fi
