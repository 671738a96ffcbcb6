/* cuda_bench.h - time every CUDA backend operation on model-sized shapes and
 * report it against the device's peak (C linkage; defined only in CUDA
 * builds, so callers guard with #ifdef ASYNCPP_CUDA).
 *
 *   #ifdef ASYNCPP_CUDA
 *   #include "../kernels/cuda/cuda_bench.h"
 *   ...  return cuda_bench_kernels(stdout, iters) ? EXIT_FAIL : EXIT_OK;
 *   #endif
 */
#ifndef ASYNCPP_CUDA_BENCH_H
#define ASYNCPP_CUDA_BENCH_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Dense bf16 tensor-core peak (TFLOP/s) and HBM bandwidth (GB/s) of the
 * current device, from a table keyed by its name; 0 when unknown. label gets
 * the table's name for the device ("H100 SXM", ...). Returns 0, or -1 when
 * no device can be used. */
int cuda_device_peak(double *tflops_bf16, double *hbm_gbs, char *label, size_t label_len);

/* Time each operation (iters repetitions after a warm-up; 0 means 20) for a
 * GPT-2 124M layer (B 8, T 1024, C 768, 12 heads) and a SmolLM-360M layer
 * (C 960, 15/5 heads, FFN 2560), plus optimizer steps over 124M parameters.
 * Prints one row per op: time, TFLOP/s or GB/s, % of peak; GEMM rows are
 * followed by cuBLASLt's own bf16-in/bf16-out rate on the same shape.
 * Returns 0, or -1 after error() when no device can be used. */
int cuda_bench_kernels(FILE *out, int iters);

#ifdef __cplusplus
}
#endif

#endif
