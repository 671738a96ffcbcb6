/* cuda_flash.h - which attention (and softmax + cross-entropy) kernels the
 * CUDA backend runs (C linkage; defined only in CUDA builds, so callers
 * guard with #ifdef ASYNCPP_CUDA).
 *
 * The backend's attention_forward/attention_backward slots run either the
 * fp32 SIMT kernels of cuda_attention.cu (the reference) or the bf16
 * tensor-core kernels of cuda_flash.cu. The choice is read once from the
 * environment, ASYNCPP_ATTENTION=cudnn|flash|flash-sync|simt (unset or empty: flash; anything
 * else stops the program with a message), and tests and benchmarks may
 * change it. Flash covers HD 64 and 128; other head sizes run the SIMT
 * kernels whichever is chosen.
 *
 * The default became flash once a GPU run (tools/gpu-check, H100,
 * 2026-11-27) showed it 2.5x faster in training with its tests passing;
 * see kernels/cuda/NOTES.md.
 */
#ifndef ASYNCPP_CUDA_FLASH_H
#define ASYNCPP_CUDA_FLASH_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* FLASH_SYNC: the flash kernels with every tile loaded synchronously, as
 * for fp32 or misaligned activations; FLASH streams the tiles of aligned
 * bf16 activations with cp.async, double-buffered. The two give the same
 * bits (test_cuda_ops); FLASH_SYNC is there to show it and to measure. */
enum { CUDA_ATTENTION_SIMT = 0, CUDA_ATTENTION_FLASH = 1, CUDA_ATTENTION_FLASH_SYNC = 2 };
/* CUDNN: cuDNN's fused attention (cuda_cudnn.h), bf16 activations, HD 64
 * and 128; anything it does not run (f32 activations, other shapes, cuDNN
 * missing or refusing: one notice) runs the FLASH kernels. Not the default
 * until a GPU run measures it (kernels/cuda/NOTES.md). */
enum { CUDA_ATTENTION_CUDNN = 3 };

/* The implementation the attention slots run now. */
int cuda_attention_impl(void);
/* Choose one (CUDA_ATTENTION_SIMT, _FLASH, _FLASH_SYNC or _CUDNN; other values
 * change nothing); returns the previous choice. Not for use while attention
 * ops are queued from other threads. */
int cuda_attention_set_impl(int impl);
/* How many attention calls (forward and backward each count) cuDNN has run
 * so far, or -1 when libcudnn cannot be loaded; why gets the last reason
 * cuDNN was not used ("" if none). For tests and benchmarks. */
long cuda_attention_cudnn_calls(char *why, size_t len);
/* 1 when the flash kernels take this shape (HD 64 or 128, NH % NKV == 0). */
int cuda_attention_flash_supported(int NH, int NKV, int HD);

/* The softmax + cross-entropy kernel (cuda_xent.cu): PLAIN, the
 * reference and the default, or VEC (16-byte loads and stores, one update
 * of the online softmax per vector), where rows are 16-byte aligned. Read
 * from ASYNCPP_XENT=plain|vec once; the same rules as the attention's
 * choice above. */
enum { CUDA_XENT_PLAIN = 0, CUDA_XENT_VEC = 1 };
int cuda_xent_impl(void);
int cuda_xent_set_impl(int impl);

#ifdef __cplusplus
}
#endif

#endif
