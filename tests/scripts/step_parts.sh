#!/usr/bin/env bash
# step_parts.sh - tools/step_parts.py, which gpu-check's report uses to set
# asyncpp's GPT-2 step by part (ncu's CSV) beside PyTorch's (torch.profiler
# via torch_gpt2_bench.py --profile-csv), on made-up profiles: each kernel
# lands in its part (attention before the matrix products, though fused
# attention kernels may say gemm; torch.compile's Triton kernels by what
# their names say, else a part of their own), ncu's units and thousands
# separators are read, asyncpp's time is divided by the steps profiled,
# shares are of each side's own total, and bad input is refused.
. "$ROOT/tests/lib.sh"
command -v python3 > /dev/null || { skip step_parts "no python3"; exit 0; }
SP="python3 $ROOT/tools/step_parts.py"
cat > ncu.csv <<'CSV'
==PROF== Connected to process 1
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","asyncpp","h","flash_fwd_gemm_kernel(int)","1","7","(1,1,1)","(1,1,1)","0","9.0","m","gpu__time_duration.sum","msecond","1,000.0"
"1","1","asyncpp","h","nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT","1","7","(1,1,1)","(1,1,1)","0","9.0","m","gpu__time_duration.sum","usecond","2000000"
"2","1","asyncpp","h","layernorm_forward_kernel","1","7","(1,1,1)","(1,1,1)","0","9.0","m","gpu__time_duration.sum","msecond","400"
"3","1","asyncpp","h","adamw_kernel","1","7","(1,1,1)","(1,1,1)","0","9.0","m","gpu__time_duration.sum","msecond","400"
"4","1","asyncpp","h","mystery_kernel","1","7","(1,1,1)","(1,1,1)","0","9.0","m","gpu__time_duration.sum","msecond","200"
"5","1","asyncpp","h","layernorm_forward_kernel","1","7","(1,1,1)","(1,1,1)","0","9.0","m","dram__bytes.sum","byte","99999"
CSV
cat > torch.csv <<'CSV'
kernel,ms_per_step
pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>,1.0
sm90_xmma_gemm_bf16bf16_bf16f32,2.0
triton_per_fused_native_layer_norm_0,0.5
triton_poi_fused_add_mul_3,0.25
void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>,0.25
CSV
if $SP ncu.csv 2 torch.csv > out.txt 2> err.txt; then
	# part asyncpp share pytorch share (asyncpp: 4000 ms over 2 steps)
	want="attention 500.000 25.0% 1.000 25.0%
matmul (cuBLAS, CUTLASS) 1000.000 50.0% 2.000 50.0%
layernorm 200.000 10.0% 0.500 12.5%
optimizer, clip, norm 200.000 10.0% 0.250 6.2%
other 100.000 5.0% 0.000 0.0%
fused (triton) 0.000 0.0% 0.250 6.2%
all kernels (per step) 2000.000 100.0% 4.000 100.0%"
	got=$(sed 1d out.txt | sed -E 's/ +/ /g; s/ $//' | sort)
	if [ "$got" = "$(echo "$want" | sort)" ]; then
		pass step_parts_by_part_side_by_side
	else
		fail step_parts_by_part_side_by_side "$(tr '\n' '|' < out.txt)"
	fi
else
	fail step_parts_by_part_side_by_side "$(cat err.txt)"
fi
# refused: no steps, a profile without kernel times
if ! $SP ncu.csv 0 torch.csv > /dev/null 2> err.txt && grep -q "STEPS must be positive" err.txt &&
   echo "kernel,ms_per_step" > empty.csv && ! $SP ncu.csv 2 empty.csv > /dev/null 2> err.txt &&
   grep -q "no kernel time in empty.csv" err.txt; then
	pass step_parts_refuses_bad_input
else
	fail step_parts_refuses_bad_input "$(cat err.txt)"
fi
