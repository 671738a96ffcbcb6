/* test_bench_plan_moe.c - bench plan's mixture-of-experts costs
 * (cmd/bench_plan_moe.h) against a computation by hand, on a shape whose
 * every figure is an exact double: C = 8, T = 16, 32 tokens, E = 4 experts
 * of width De = 3, top-2, a shared expert, EP = 2, 2-byte activations.
 *   a SwiGLU expert: 3 C De = 72 parameters; attention 4 C^2 = 256; router
 *   E C = 32
 *   active: 256 + 32 + (2 + 1) x 72 = 504, forward FLOPs 32 x (2 x 504 +
 *   4 x 16 x 8) = 48640
 *   on every rank: 256 + 32 + 72 (shared) = 360; the routed experts 4 x 72
 *   = 288 (split over EP)
 *   all-to-all: 32 x 2 x 8 x 2 bytes x 2 directions x (2-1)/2 = 1024 bytes
 *   over 1000 B/s with 1 ms a message: 1.024 s + 2 x (2-1) x 1 ms = 1.026 s
 *   a model of 3 layers with V = 10: 3 x (360 + 288) + 2 x 10 x 8 = 2104
 *   parameters, 3 x 504 + 160 = 1672 active */
#include "../../cmd/bench_plan_moe.h"
#include "../test.h"

TEST(moe_layer_cost_by_hand)
{
	struct plan_moe m = {.E = 4, .K = 2, .De = 3, .shared = 1};
	struct moe_layer_cost c;
	moe_layer_cost(&m, 8, 16, 32, 2, 2, &c);
	CHECK(c.fwd_flops == 48640);
	CHECK(c.dense_params == 360);
	CHECK(c.expert_params == 288);
	CHECK(c.a2a_bytes == 1024);
	CHECK(moe_a2a_seconds(c.a2a_bytes, 2, 1000, 1e-3) == 1.024 + 2e-3);
	CHECK(moe_model_params(&m, 3, 8, 10, 0) == 2104);
	CHECK(moe_model_params(&m, 3, 8, 10, 1) == 1672);
}

TEST(no_all_to_all_within_one_rank)
{
	struct plan_moe m = {.E = 8, .K = 2, .De = 16};
	struct moe_layer_cost c;
	moe_layer_cost(&m, 32, 64, 128, 1, 2, &c);
	CHECK(c.a2a_bytes == 0);
	CHECK(moe_a2a_seconds(c.a2a_bytes, 1, 1e9, 1e-5) == 0);
	/* EP = E: every slot but 1/E of them leaves its rank */
	moe_layer_cost(&m, 32, 64, 128, 8, 2, &c);
	CHECK(c.a2a_bytes == 128.0 * 2 * 32 * 2 * 2 * 7 / 8);
}

/* top-k = E with no shared expert: every expert active, as many FLOPs as
 * the whole layer's parameters */
TEST(top_k_equal_to_e_is_all_parameters_active)
{
	struct plan_moe m = {.E = 4, .K = 4, .De = 5};
	CHECK(moe_model_params(&m, 2, 16, 7, 0) == moe_model_params(&m, 2, 16, 7, 1));
}
