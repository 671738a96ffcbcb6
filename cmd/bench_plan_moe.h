/* bench_plan_moe.h - what `asyncpp bench plan` charges a mixture-of-experts
 * layer (cmd/bench_plan.c has the dense model and the simulation).
 *
 * A layer of width C over a micro-batch of N tokens of context T, with E
 * routed experts of width De (SwiGLU: 3 C De parameters each), top-K routing,
 * an optional shared expert (every token) and expert parallelism EP (the E
 * experts split over EP ranks of a data-parallel group):
 *   parameters      4C^2 attention (q, k, v, o) + E C router
 *                   + (E + shared) x 3 C De experts
 *   active FLOPs    N x (2 x (4C^2 + E C + (K + shared) x 3 C De) + 4 T C)
 *                   forward (a token runs K experts), backward twice that
 *   on one GPU      the attention, router and shared expert, and E/EP of
 *                   the routed experts (weights, gradients, optimizer state)
 *   all-to-all      dispatch (tokens to their experts' ranks) and combine
 *                   (the outputs back), per layer and micro-batch:
 *                   N x K x C x act_bytes x 2 directions x (EP-1)/EP bytes a
 *                   rank sends (and receives), the share of its slots that
 *                   leave it under balanced routing; the backward sends the
 *                   same bytes again (the gradients of both)
 * The ranks of an expert-parallel group are replicas of one stage, which sit
 * on different nodes: the all-to-all goes over InfiniBand, at its bandwidth
 * plus one latency per message (EP-1 each way, both directions).
 */
#ifndef ASYNCPP_BENCH_PLAN_MOE_H
#define ASYNCPP_BENCH_PLAN_MOE_H

struct plan_moe {
	long E, K, De, shared; /* E = 0: a dense model */
};

struct moe_layer_cost {
	double fwd_flops;     /* active forward FLOPs of the micro-batch */
	double dense_params;  /* on every rank: attention, router, shared expert */
	double expert_params; /* the E routed experts together (split over EP) */
	double a2a_bytes;     /* a rank's dispatch + combine bytes, forward */
};

/* One layer of width C, context T, over `tokens` tokens, at degree ep. */
void moe_layer_cost(const struct plan_moe *m, double C, double T, double tokens, long ep,
		    double act_bytes, struct moe_layer_cost *out);

/* Seconds of one forward (or backward) all-to-all pair of `bytes` over a
 * link of bw bytes/s with `latency` seconds a message; 0 when ep = 1. */
double moe_a2a_seconds(double bytes, long ep, double bw, double latency);

/* Parameters of the model (L layers, embedding and untied head of V x C),
 * all of them (active = 0) or those a token passes through (active = 1). */
double moe_model_params(const struct plan_moe *m, long L, double C, double V, int active);

#endif
