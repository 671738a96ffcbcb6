/* cpu_moe.c - the mixture-of-experts routing and dispatch ops of
 * kernels/backend.h on the CPU: the reference the CUDA ops are checked
 * against. The maths is model/moe.h's; these are the loops moe.c ran
 * before they became ops, with the same operations in the same order, so
 * the bits are those of before. Per-token work runs in parallel over
 * tokens (each token's sums are its own, in index order); the sums over
 * tokens (aux) run serially in token order. Activations go through
 * act_load/act_store with the table's dtype: each op is one function with
 * the dtype as an argument and a thin wrapper per table (MOE_TABLE).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../act.h"
#include "cpu.h"

/* Tokens per thread below which a region stays on one thread. */
#define MOE_PAR(n) if ((size_t)(n) >= CPU_PAR_MIN)

/* logsumexp of z[E] as the forward computes it (float result) */
static float lse_f(const float *z, int E, double *sum_out)
{
	float mx = z[0];
	double sum = 0;

	for (int e = 1; e < E; e++)
		mx = fmaxf(mx, z[e]);
	for (int e = 0; e < E; e++)
		sum += exp((double)(z[e] - mx));
	if (sum_out)
		*sum_out = sum;
	return mx + (float)log(sum);
}

static void load_row(float *row, const void *p, size_t off, int n, int dt)
{
	for (int i = 0; i < n; i++)
		row[i] = act_load(p, off + i, dt);
}

/* Scores, top-k and gates of one token. */
static void route_token(const float *z, int E, int K, int router, float *score, int32_t *sel,
			float *gate)
{
	float lse = lse_f(z, E, NULL);
	double gsum = 0;

	for (int e = 0; e < E; e++)
		score[e] = router == 0 ? expf(z[e] - lse) : 1.0f / (1.0f + expf(-z[e]));
	/* K passes of argmax; strict > keeps the lower index on ties */
	for (int j = 0; j < K; j++) {
		int best = -1;
		for (int e = 0; e < E; e++) {
			int taken = 0;
			for (int i = 0; i < j; i++)
				taken |= sel[i] == e;
			if (!taken && (best < 0 || score[e] > score[best]))
				best = e;
		}
		sel[j] = best;
		gsum += score[best];
	}
	for (int j = 0; j < K; j++)
		gate[j] = K > 1 ? (float)(score[sel[j]] / gsum) : score[sel[j]];
}

static void moe_route(float *score, int32_t *sel, float *gate, const void *z, int N, int E,
		      int K, int router, int dt)
{
#pragma omp parallel num_threads(cpu_threads()) MOE_PAR((size_t)N * E * K)
	{
		float *row = malloc(sizeof(float) * (size_t)E);
#pragma omp for
		for (int n = 0; n < N; n++) {
			load_row(row, z, (size_t)n * E, E, dt);
			route_token(row, E, K, router, score + (size_t)n * E, sel + (size_t)n * K,
				    gate + (size_t)n * K);
		}
		free(row);
	}
}

static void moe_dispatch(int32_t *count, int32_t *pos, const int32_t *sel, int N, int K, int E)
{
	int32_t *fill = calloc((size_t)E, sizeof(int32_t));

	memset(count, 0, sizeof(int32_t) * (size_t)(E + 1));
	for (int i = 0; i < N * K; i++)
		count[sel[i] + 1]++;
	for (int e = 0; e < E; e++)
		count[e + 1] += count[e];
	for (int i = 0; i < N * K; i++)
		pos[i] = count[sel[i]] + fill[sel[i]]++;
	free(fill);
}

static void moe_gather(void *xd, const void *x, const int32_t *pos, int N, int K, int C,
		       size_t A)
{
#pragma omp parallel for num_threads(cpu_threads()) MOE_PAR((size_t)N * K * C)
	for (int i = 0; i < N * K; i++)
		memcpy(act_at(xd, (size_t)pos[i] * C, A), act_at(x, (size_t)(i / K) * C, A),
		       A * C);
}

static void moe_combine(void *out, const void *y, const float *gate, const int32_t *pos, int N,
			int K, int C, int dt)
{
#pragma omp parallel num_threads(cpu_threads()) MOE_PAR((size_t)N * K * C)
	{
		float *row = malloc(sizeof(float) * (size_t)C);
#pragma omp for
		for (int n = 0; n < N; n++) {
			size_t o = (size_t)n * C;
			load_row(row, out, o, C, dt);
			for (int j = 0; j < K; j++) {
				size_t r = (size_t)pos[n * K + j] * C;
				if (gate) {
					float g = gate[n * K + j];
					for (int c = 0; c < C; c++)
						row[c] += g * act_load(y, r + c, dt);
				} else {
					for (int c = 0; c < C; c++)
						row[c] += act_load(y, r + c, dt);
				}
			}
			for (int c = 0; c < C; c++)
				act_store(out, o + c, dt, row[c]);
		}
		free(row);
	}
}

static void moe_combine_backward(void *dy, float *dgate, const void *dout, const void *y,
				 const float *gate, const int32_t *pos, int N, int K, int C,
				 int dt)
{
#pragma omp parallel for num_threads(cpu_threads()) MOE_PAR((size_t)N * K * C)
	for (int n = 0; n < N; n++) {
		size_t dof = (size_t)n * C;
		for (int j = 0; j < K; j++) {
			size_t r = (size_t)pos[n * K + j];
			float gt = gate[n * K + j];
			double dot = 0;
			for (int c = 0; c < C; c++) {
				float dv = act_load(dout, dof + c, dt);
				dot += (double)dv * act_load(y, r * C + c, dt);
				act_store(dy, r * C + c, dt, gt * dv);
			}
			dgate[n * K + j] = (float)dot;
		}
	}
}

/* P_i's per-token term is q[n,i] = score / norm: norm 1 (softmax) or the
 * token's sum of scores (sigmoid). */
static double balance_norm(const float *score, int E, int router)
{
	double s = 0;
	if (router == 0)
		return 1.0;
	for (int e = 0; e < E; e++)
		s += score[e];
	return s;
}

static void moe_aux(float *aux, const void *z, const float *score, const int32_t *count, int N,
		    int E, int K, int router, int dt)
{
	double zsum = 0, bal = 0, *P = calloc((size_t)E, sizeof(double));
	float *row = malloc(sizeof(float) * (size_t)E);

	for (int n = 0; n < N; n++) {
		const float *sc = score + (size_t)n * E;
		double norm = balance_norm(sc, E, router);
		load_row(row, z, (size_t)n * E, E, dt);
		float lse = lse_f(row, E, NULL);
		zsum += (double)lse * lse;
		for (int e = 0; e < E; e++)
			P[e] += sc[e] / norm;
	}
	for (int e = 0; e < E; e++)
		bal += (double)(count[e + 1] - count[e]) / ((double)N * K) * (P[e] / N);
	aux[0] = (float)(E * bal);
	aux[1] = (float)(zsum / N);
	free(P);
	free(row);
}

/* dz[E] of one token from dg[K] and the auxiliary losses (f[e] = routed
 * share of expert e, ca = dloss*alpha*E/N, cz = dloss*beta*2/N). */
static void router_token_backward(const float *z, const float *score, const int32_t *sel,
				  const float *gate, const float *dg, const double *f, double ca,
				  double cz, int E, int K, int router, double *db, float *dz)
{
	double gd = 0, gsum = 0, sum = 0, lse, norm = balance_norm(score, E, router), fq = 0;
	float mx = z[0];

	/* gates -> selected scores */
	for (int j = 0; j < K; j++) {
		gd += (double)gate[j] * dg[j];
		gsum += score[sel[j]];
	}
	for (int j = 0; j < K; j++)
		db[j] = K > 1 ? (dg[j] - gd) / gsum : dg[j];
	/* scores -> logits */
	if (router == 0) {
		double dot = 0;
		for (int j = 0; j < K; j++)
			dot += db[j] * score[sel[j]];
		for (int e = 0; e < E; e++)
			dz[e] = (float)(-score[e] * dot);
		for (int j = 0; j < K; j++)
			dz[sel[j]] += (float)(score[sel[j]] * db[j]);
	} else {
		for (int e = 0; e < E; e++)
			dz[e] = 0.0f;
		for (int j = 0; j < K; j++) {
			double s = score[sel[j]];
			dz[sel[j]] = (float)(db[j] * s * (1 - s));
		}
	}
	/* balance: P_i gets q[n,i]/N; d/dq_c of sum_i f_i q_i */
	for (int e = 0; e < E; e++)
		fq += f[e] * score[e] / norm;
	for (int e = 0; e < E; e++) {
		double s = score[e], t = f[e] - fq;
		if (router == 0)
			dz[e] += (float)(ca * s * t);
		else
			dz[e] += (float)(ca * t * s * (1 - s) / norm);
	}
	/* z-loss: d lse^2 / dz = 2 lse softmax(z) (lse in double here) */
	for (int e = 1; e < E; e++)
		mx = fmaxf(mx, z[e]);
	for (int e = 0; e < E; e++)
		sum += exp((double)(z[e] - mx));
	lse = mx + log(sum);
	for (int e = 0; e < E; e++)
		dz[e] += (float)(cz * lse * exp(z[e] - lse));
}

static void moe_router_backward(void *dz, const void *z, const float *score, const int32_t *sel,
				const float *gate, const float *dgate, const int32_t *count,
				int N, int E, int K, int router, float dloss, float alpha,
				float beta, int dt)
{
	double *f = malloc(sizeof(double) * (size_t)E);
	double ca = (double)dloss * alpha * E / N, cz = (double)dloss * beta * 2.0 / N;

	for (int e = 0; e < E; e++)
		f[e] = (double)(count[e + 1] - count[e]) / ((double)N * K);
#pragma omp parallel num_threads(cpu_threads()) MOE_PAR((size_t)N * E * 4)
	{
		float *row = malloc(sizeof(float) * 2 * (size_t)E), *row2 = row + E;
		double *db = malloc(sizeof(double) * (size_t)K);
#pragma omp for
		for (int n = 0; n < N; n++) {
			load_row(row, z, (size_t)n * E, E, dt);
			router_token_backward(row, score + (size_t)n * E, sel + (size_t)n * K,
					      gate + (size_t)n * K, dgate + (size_t)n * K, f, ca,
					      cz, E, K, router, db, row2);
			for (int e = 0; e < E; e++)
				act_store(dz, (size_t)n * E + e, dt, row2[e]);
		}
		free(db);
		free(row);
	}
	free(f);
}

/* ---- one wrapper per table (kernels/cpu/cpu.h) ---- */

#define MOE_TABLE(P, DT)                                                                   \
	void P##_moe_route(float *score, int32_t *sel, float *gate, const void *z, int N,   \
			   int E, int K, int router)                                        \
	{                                                                                  \
		moe_route(score, sel, gate, z, N, E, K, router, DT);                       \
	}                                                                                  \
	void P##_moe_gather(void *xd, const void *x, const int32_t *pos, int N, int K, int C) \
	{                                                                                  \
		moe_gather(xd, x, pos, N, K, C, act_dtype_size(DT));                       \
	}                                                                                  \
	void P##_moe_combine(void *out, const void *y, const float *gate, const int32_t *pos, \
			     int N, int K, int C)                                           \
	{                                                                                  \
		moe_combine(out, y, gate, pos, N, K, C, DT);                               \
	}                                                                                  \
	void P##_moe_combine_backward(void *dy, float *dgate, const void *dout,             \
				      const void *y, const float *gate, const int32_t *pos, \
				      int N, int K, int C)                                  \
	{                                                                                  \
		moe_combine_backward(dy, dgate, dout, y, gate, pos, N, K, C, DT);          \
	}                                                                                  \
	void P##_moe_aux(float *aux, const void *z, const float *score, const int32_t *count, \
			 int N, int E, int K, int router)                                   \
	{                                                                                  \
		moe_aux(aux, z, score, count, N, E, K, router, DT);                        \
	}                                                                                  \
	void P##_moe_router_backward(void *dz, const void *z, const float *score,           \
				     const int32_t *sel, const float *gate,                 \
				     const float *dgate, const int32_t *count, int N, int E, \
				     int K, int router, float dloss, float alpha,           \
				     float beta)                                            \
	{                                                                                  \
		moe_router_backward(dz, z, score, sel, gate, dgate, count, N, E, K, router,  \
				    dloss, alpha, beta, DT);                                \
	}

MOE_TABLE(cpu_f32, ACT_F32)
MOE_TABLE(cpu_bf16, ACT_BF16)

void cpu_moe_dispatch(int32_t *count, int32_t *pos, const int32_t *sel, int N, int K, int E)
{
	moe_dispatch(count, pos, sel, N, K, E);
}
