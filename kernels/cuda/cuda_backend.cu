/* cuda_backend.cu - the CUDA backend's two tables, backend_cuda() (f32
 * activations) and backend_cuda_bf16() (bf16 activations, the same
 * kernels): each part of the backend fills its own slots (cuda_common.h),
 * the products' and attention's are here.
 *
 * The parts: cuda_device.cu (devices, lanes, memory, copies),
 * cuda_embed.cu, cuda_norm.cu (norms, column sums), cuda_elementwise.cu
 * (RoPE, GELU, SwiGLU, add, conversions), cuda_xent.cu (softmax +
 * cross-entropy), cuda_optim.cu (optimizers, gradient norm), cuda_matmul.cu
 * (cuBLASLt products, weight copies), cuda_attention.cu and cuda_flash.cu
 * (attention), cuda_newton_schulz.cu.
 *
 * Legend: see kernels/backend.h (B, T, N = B*T, C, NH, NKV, HD, F, V, Vp).
 *
 * Every reduction runs in a fixed order that depends only on the shape
 * (fixed chunk sizes, fixed block counts, tree reductions in index order),
 * never on atomics or on the device's SM count, so results repeat bit for
 * bit from run to run on the same GPU.
 */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <mutex>
#include <stdint.h>

#include "cuda_common.h"

extern "C" {
#include "../backend.h"
}

/* ------------------------------------------------------------------ */
/* the table's slots: activations travel as void * in the table's       */
/* act_dtype (float or __nv_bfloat16: A)                                 */

template <typename A>
static void act_matmul_forward(void *out, const void *inp, const float *w, const float *bias,
			       int N, int C, int OC)
{
	cuda_matmul_forward((A *)out, (const A *)inp, w, bias, N, C, OC);
}

template <typename A>
static void act_matmul_backward(void *dinp, float *dw, float *dbias, const void *dout,
				const void *inp, const float *w, int N, int C, int OC)
{
	cuda_matmul_backward((A *)dinp, dw, dbias, (const A *)dout, (const A *)inp, w, N, C, OC);
}

template <typename A>
static void act_attention_forward(void *out, float *lse, const void *qkv, int B, int T, int NH,
				  int NKV, int HD)
{
	cuda_attention_forward((A *)out, lse, (const A *)qkv, B, T, NH, NKV, HD);
}

template <typename A>
static void act_attention_backward(void *dqkv, const void *dout, const void *qkv,
				   const void *out, const float *lse, int B, int T, int NH,
				   int NKV, int HD)
{
	cuda_attention_backward((A *)dqkv, (const A *)dout, (const A *)qkv, (const A *)out, lse, B,
				T, NH, NKV, HD);
}

template <typename A>
static void act_matmul_gelu_forward(void *out, void *pre, const void *inp, const float *w,
				    const float *bias, int N, int C, int OC)
{
	if (!cuda_matmul_gelu_forward((A *)out, (A *)pre, (const A *)inp, w, bias, N, C, OC))
		return;
	cuda_matmul_forward((A *)pre, (const A *)inp, w, bias, N, C, OC);
	cuda_gelu_forward((A *)out, (const A *)pre, (size_t)N * OC);
}

template <typename A>
static void act_matmul_backward_dgelu(void *dpre, float *dw, float *dbias, const void *dout,
				      const void *inp, const float *w, const void *pre, int N,
				      int C, int OC)
{
	if (!cuda_matmul_backward_dgelu((A *)dpre, dw, dbias, (const A *)dout, (const A *)inp, w,
					(const A *)pre, N, C, OC))
		return;
	cuda_matmul_backward((A *)dpre, dw, dbias, (const A *)dout, (const A *)inp, w, N, C, OC);
	cuda_gelu_backward((A *)dpre, (const A *)pre, (const A *)dpre, (size_t)N * C);
}

/* ------------------------------------------------------------------ */
/* the tables                                                           */

static struct backend cuda_table, cuda_bf16_table;

/* The slots of the products and attention for storage type A. */
template <typename A> static void fill_act_slots(struct backend &t)
{
	t.matmul_forward = act_matmul_forward<A>;
	t.matmul_backward = act_matmul_backward<A>;
	t.matmul_gelu_forward = act_matmul_gelu_forward<A>;
	t.matmul_backward_dgelu = act_matmul_backward_dgelu<A>;
	t.attention_forward = act_attention_forward<A>;
	t.attention_backward = act_attention_backward<A>;
}

/* Every part's slots, for storage type A (bf16: __nv_bfloat16). */
static void fill_table(struct backend &t, bool bf16)
{
	t.name = "cuda";
	t.act_dtype = bf16 ? ACT_BF16 : ACT_F32;
	t.weights_bf16 = cuda_weights_bf16;
	cuda_device_slots(t);
	cuda_embed_slots(t, bf16);
	cuda_norm_slots(t, bf16);
	cuda_elementwise_slots(t, bf16);
	cuda_xent_slots(t, bf16);
	cuda_optim_slots(t);
	cuda_moe_slots(t, bf16);
	cuda_moe_gemm_slots(t, bf16);
	if (bf16)
		fill_act_slots<__nv_bfloat16>(t);
	else
		fill_act_slots<float>(t);
}

/* Filled by assignment (not positional initialisers) so that a reordered or
 * extended backend.h cannot silently shift the slots. backend_with_act_dtype
 * goes from one table to the other (train.act_dtype). */
static void fill_tables(void)
{
	fill_table(cuda_table, false);
	fill_table(cuda_bf16_table, true);
}

static std::once_flag table_once;

extern "C" const struct backend *backend_cuda(void)
{
	std::call_once(table_once, fill_tables);
	return &cuda_table;
}

extern "C" const struct backend *backend_cuda_bf16(void)
{
	std::call_once(table_once, fill_tables);
	return &cuda_bf16_table;
}

