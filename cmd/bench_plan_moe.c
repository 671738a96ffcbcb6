/* bench_plan_moe.c - a mixture-of-experts layer's costs for bench plan (see
 * bench_plan_moe.h). */
#include "bench_plan_moe.h"

static double layer_params(const struct plan_moe *m, double C, double experts)
{
	return 4 * C * C + (double)m->E * C + experts * 3 * C * (double)m->De;
}

void moe_layer_cost(const struct plan_moe *m, double C, double T, double tokens, long ep,
		    double act_bytes, struct moe_layer_cost *out)
{
	double active = layer_params(m, C, (double)(m->K + m->shared));
	out->fwd_flops = tokens * (2 * active + 4 * T * C);
	out->dense_params = layer_params(m, C, (double)m->shared);
	out->expert_params = (double)m->E * 3 * C * (double)m->De;
	out->a2a_bytes = tokens * (double)m->K * C * act_bytes * 2 * (double)(ep - 1) / (double)ep;
}

double moe_a2a_seconds(double bytes, long ep, double bw, double latency)
{
	if (ep <= 1)
		return 0;
	return bytes / bw + 2.0 * (double)(ep - 1) * latency;
}

double moe_model_params(const struct plan_moe *m, long L, double C, double V, int active)
{
	double experts = active ? (double)(m->K + m->shared) : (double)(m->E + m->shared);
	return (double)L * layer_params(m, C, experts) + 2 * V * C;
}
