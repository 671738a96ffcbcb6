/* test_cuda_build.c - what a CUDA build promises on any machine, GPU or not:
 * the backend table exists and is complete, and asking for a device never
 * crashes but answers with a reason. */
#include <stdlib.h>
#include <string.h>

#include "../../io/util.h"
#include "../../io/config/config.h"
#include "../../kernels/backend.h"
#include "../test.h"

TEST(cuda_backend_present)
{
#ifdef ASYNCPP_CUDA
	const struct backend *b = backend_cuda();
	CHECK(b != NULL);
	CHECK(!strcmp(b->name, "cuda"));
#else
	CHECK(backend_cuda() == NULL);
#endif
}

TEST(cuda_table_complete)
{
	const struct backend *b = backend_cuda();
	if (!b)
		SKIP("built without CUDA");
	/* every operation of backend.h has a CUDA implementation */
#define SLOT(s) CHECK_MSG(b->s != NULL, "cuda backend lacks " #s)
	SLOT(alloc); SLOT(free); SLOT(to_device); SLOT(to_host); SLOT(copy); SLOT(zero);
	SLOT(synchronize); SLOT(set_threads); SLOT(embed_forward); SLOT(embed_backward);
	SLOT(layernorm_forward); SLOT(layernorm_backward); SLOT(rmsnorm_forward);
	SLOT(rmsnorm_backward); SLOT(matmul_forward); SLOT(matmul_backward);
	SLOT(rope_forward); SLOT(rope_backward); SLOT(attention_forward);
	SLOT(attention_backward); SLOT(gelu_forward); SLOT(gelu_backward);
	SLOT(swiglu_forward); SLOT(swiglu_backward); SLOT(add); SLOT(softmax_xent); SLOT(loss_mean); SLOT(elementwise_step);
	SLOT(adamw_dir); SLOT(adan_dir); SLOT(ademamix_dir); SLOT(mars_correct); SLOT(ema);
	SLOT(soap_adam); SLOT(row_normalize); SLOT(gemm); SLOT(lion_dir); SLOT(momentum); SLOT(newton_schulz);
	SLOT(apply_update); SLOT(sumsq); SLOT(sumsq_many); SLOT(scale); SLOT(memory_peak);
	SLOT(add_act); SLOT(act_from_f32); SLOT(act_to_f32);
	SLOT(moe_route); SLOT(moe_dispatch); SLOT(moe_gather); SLOT(moe_combine);
	SLOT(moe_combine_backward); SLOT(moe_aux); SLOT(moe_router_backward);
	SLOT(moe_expert_forward); SLOT(moe_expert_backward);
#undef SLOT
	CHECK(b->act_dtype == ACT_F32);
}

/* The twin table that stores activations as bf16: the same name, ACT_BF16,
 * its own activation slots, the f32 table's slots for everything else. */
TEST(cuda_bf16_table)
{
	const struct backend *f = backend_cuda(), *h = backend_cuda_bf16();
	if (!f) {
		CHECK(h == NULL);
		SKIP("built without CUDA");
	}
	CHECK(h != NULL && h != f);
	CHECK(h->act_dtype == ACT_BF16 && !strcmp(h->name, "cuda"));
#define ACT_SLOT(s) CHECK_MSG(h->s != NULL && h->s != f->s, "cuda bf16 table: " #s)
	ACT_SLOT(act_from_f32); ACT_SLOT(act_to_f32); ACT_SLOT(embed_forward);
	ACT_SLOT(embed_backward); ACT_SLOT(layernorm_forward); ACT_SLOT(layernorm_backward);
	ACT_SLOT(rmsnorm_forward); ACT_SLOT(rmsnorm_backward); ACT_SLOT(rope_forward);
	ACT_SLOT(rope_backward); ACT_SLOT(gelu_forward); ACT_SLOT(gelu_backward);
	ACT_SLOT(swiglu_forward); ACT_SLOT(swiglu_backward); ACT_SLOT(add_act);
	ACT_SLOT(softmax_xent); ACT_SLOT(matmul_forward); ACT_SLOT(matmul_backward);
	ACT_SLOT(attention_forward); ACT_SLOT(attention_backward);
	ACT_SLOT(moe_route); ACT_SLOT(moe_gather); ACT_SLOT(moe_combine);
	ACT_SLOT(moe_combine_backward); ACT_SLOT(moe_aux); ACT_SLOT(moe_router_backward);
	ACT_SLOT(moe_expert_forward); ACT_SLOT(moe_expert_backward);
#undef ACT_SLOT
#define SAME(s) CHECK_MSG(h->s == f->s, "cuda bf16 table: " #s " is not the f32 table's")
	SAME(alloc); SAME(free); SAME(to_device); SAME(to_host); SAME(copy); SAME(zero);
	SAME(synchronize); SAME(set_threads); SAME(memory_peak); SAME(add); SAME(loss_mean);
	SAME(moe_dispatch);
	SAME(adamw_dir); SAME(adan_dir); SAME(ademamix_dir); SAME(mars_correct); SAME(ema);
	SAME(soap_adam); SAME(row_normalize); SAME(gemm); SAME(lion_dir); SAME(momentum);
	SAME(newton_schulz); SAME(apply_update); SAME(elementwise_step); SAME(sumsq);
	SAME(sumsq_many); SAME(scale);
#undef SAME
	/* train.act_dtype picks one or the other */
	CHECK(backend_with_act_dtype(f, ACT_BF16) == h && backend_with_act_dtype(h, ACT_F32) == f);
}

TEST(cuda_available_answers)
{
	char why[256] = "";
	int ok = cuda_available(why, sizeof(why));
	CHECK(ok == 0 || ok == 1);
	CHECK_MSG(why[0] != '\0', "cuda_available gave no reason");
	/* a second call gives the same answer (no state broken by the first) */
	char why2[256] = "";
	CHECK(cuda_available(why2, sizeof(why2)) == ok);
	/* asking by name fails cleanly exactly when no device can be used */
	set_error_quiet(1);
	const struct backend *b = backend_by_name("cuda");
	set_error_quiet(0);
	if (ok) {
		CHECK(b == backend_cuda());
	} else {
		CHECK(b == NULL);
		CHECK(strstr(last_error(), "cannot be served") != NULL);
		CHECK(strstr(last_error(), why) != NULL);
	}
}

#ifdef ASYNCPP_CUDA
#include "../../kernels/cuda/cuda_nccl.h"

TEST(cuda_nccl_loads_or_says_why)
{
	char why[512] = "";
	if (cuda_nccl_load(why, sizeof(why)) < 0) {
		CHECK_MSG(strstr(why, "NCCL") != NULL, "unclear reason: %s", why);
		SKIP(why);
	}
	/* loading needs no GPU; the version call needs none either */
	int v = cuda_nccl_version();
	CHECK_MSG(v >= 20000, "NCCL version %d", v);
}
#endif

/* Device names: "cuda" is the local rank's GPU, "cuda:N" GPU N; the
 * configuration takes the same forms and nothing else. */
TEST(cuda_device_names)
{
	CHECK(device_index_from_name("cuda") == -1);
	CHECK(device_index_from_name("cuda:0") == 0);
	CHECK(device_index_from_name("cuda:12") == 12);
	const char *bad[] = {"cuda:", "cuda:x", "cuda:1x", "cuda:-1", "cuda:12345", "gpu", "cuda0"};
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
		CHECK_MSG(device_index_from_name(bad[i]) == -2, "%s accepted", bad[i]);
	struct config cfg;
	config_defaults(&cfg);
	set_error_quiet(1);
	CHECK(config_set_key(&cfg, "train", "device", "cuda:3", "test") == 0);
	CHECK(!strcmp(cfg.train_device, "cuda:3"));
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
		CHECK_MSG(config_set_key(&cfg, "train", "device", bad[i], "test") != 0,
			  "config took train.device = %s", bad[i]);
	CHECK(backend_by_name("cuda:x") == NULL);
	CHECK(strstr(last_error(), "unknown device 'cuda:x'") != NULL);
	set_error_quiet(0);
	config_free(&cfg);
}

/* With a GPU: a device that does not exist is refused naming the count, the
 * local rank picks the device, and the process keeps the one it uses. */
TEST(cuda_device_selection)
{
	char why[256] = "";
	if (!backend_cuda())
		SKIP("built without CUDA");
	if (!cuda_available(why, sizeof(why)))
		SKIP(why);
	CHECK(cuda_select_device(9999, why, sizeof(why)) == 0);
	CHECK_MSG(strstr(why, "no CUDA device 9999") && strstr(why, "visible"), "%s", why);
	set_error_quiet(1);
	CHECK(backend_by_name("cuda:9999") == NULL);
	set_error_quiet(0);
	CHECK(strstr(last_error(), "cuda:9999") != NULL);
	setenv("LOCAL_RANK", "0", 1);
	CHECK_MSG(cuda_select_device(-1, why, sizeof(why)) == 1, "%s", why);
	unsetenv("LOCAL_RANK");
	/* once in use, the device stays: device 0 again is fine */
	const struct backend *b = backend_by_name("cuda:0");
	CHECK(b != NULL);
	void *p = b->alloc(1024);
	CHECK(p != NULL);
	CHECK(b->memory_peak() >= 1024);
	b->free(p);
	CHECK_MSG(cuda_select_device(0, why, sizeof(why)) == 1, "%s", why);
}
