/* cpu_backend.c - the CPU reference backend's table. The kernels live in the
 * other files of this folder (see cpu.h); every slot is filled. */
#include "../backend.h"
#include "cpu.h"

const struct backend backend_cpu = {
	.name = "cpu",

	.alloc = cpu_alloc,
	.free = cpu_free,
	.to_device = cpu_memcpy,
	.to_host = cpu_memcpy,
	.copy = cpu_memcpy,
	.zero = cpu_zero,
	.synchronize = cpu_synchronize,
	.set_threads = cpu_set_threads,

	.embed_forward = cpu_embed_forward,
	.embed_backward = cpu_embed_backward,

	.layernorm_forward = cpu_layernorm_forward,
	.layernorm_backward = cpu_layernorm_backward,
	.rmsnorm_forward = cpu_rmsnorm_forward,
	.rmsnorm_backward = cpu_rmsnorm_backward,

	.matmul_forward = cpu_matmul_forward,
	.matmul_backward = cpu_matmul_backward,

	.rope_forward = cpu_rope_forward,
	.rope_backward = cpu_rope_backward,
	.attention_forward = cpu_attention_forward,
	.attention_backward = cpu_attention_backward,

	.gelu_forward = cpu_gelu_forward,
	.gelu_backward = cpu_gelu_backward,
	.swiglu_forward = cpu_swiglu_forward,
	.swiglu_backward = cpu_swiglu_backward,
	.add = cpu_add,

	.softmax_xent = cpu_softmax_xent,
	.loss_mean = cpu_loss_mean,

	.adamw_dir = cpu_adamw_dir,
	.adan_dir = cpu_adan_dir,
	.ademamix_dir = cpu_ademamix_dir,
	.mars_correct = cpu_mars_correct,
	.ema = cpu_ema,
	.soap_adam = cpu_soap_adam,
	.row_normalize = cpu_row_normalize,
	.gemm = cpu_gemm_op,
	.lion_dir = cpu_lion_dir,
	.momentum = cpu_momentum,
	.newton_schulz = cpu_newton_schulz,
	.apply_update = cpu_apply_update,
	.elementwise_step = cpu_elementwise_step,
	.sumsq = cpu_sumsq,
	.sumsq_many = cpu_sumsq_many,
	.scale = cpu_scale,
};
