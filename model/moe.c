/* moe.c - the mixture-of-experts feed-forward of moe.h: routing, dispatch,
 * experts, combine, auxiliary losses, and their backward. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "../io/util.h"

/* ---- buffer layout ---- */

/* n elements of esz bytes, padded to 64 bytes, from *pos (bytes) */
static void *take(void *base, size_t *pos, size_t n, size_t esz)
{
	void *p = base ? (char *)base + *pos : NULL;
	*pos += (n * esz + 63) & ~(size_t)63;
	return p;
}

#define TAKE_ACT(n) take(base, &pos, n, act_dtype_size(d->act_dtype))
#define TAKE_F32(n) ((float *)take(base, &pos, n, sizeof(float)))
#define TAKE_I32(n) ((int32_t *)take(base, &pos, n, sizeof(int32_t)))

size_t moe_acts_view(const struct moe_dims *d, void *base, struct moe_acts *a)
{
	size_t N = (size_t)d->N, NK = N * d->K, C = d->C, De = d->De, E = d->E, pos = 0;

	a->z = TAKE_ACT(N * E);
	a->score = TAKE_F32(N * E);
	a->sel = TAKE_I32(N * d->K);
	a->gate = TAKE_F32(N * d->K);
	a->pos = TAKE_I32(N * d->K);
	a->count = TAKE_I32(E + 1);
	a->xd = TAKE_ACT(NK * C);
	a->h = TAKE_ACT(NK * 2 * De);
	a->act = TAKE_ACT(NK * De);
	a->y = TAKE_ACT(NK * C);
	a->sh_h = d->shared ? TAKE_ACT(N * 2 * De) : NULL;
	a->sh_act = d->shared ? TAKE_ACT(N * De) : NULL;
	a->aux = TAKE_F32(2);
	return pos;
}

size_t moe_scratch_view(const struct moe_dims *d, void *base, struct moe_scratch *s)
{
	size_t N = (size_t)d->N, NK = N * d->K, C = d->C, De = d->De, pos = 0;

	/* dy doubles as an [N,C] temporary once the experts' backward is done */
	s->dy = TAKE_ACT(NK * C);
	s->dact = TAKE_ACT(NK * De);
	s->dh = TAKE_ACT(NK * 2 * De);
	s->dxd = TAKE_ACT(NK * C);
	s->dz = TAKE_ACT(N * d->E);
	s->dgate = TAKE_F32(N * d->K);
	s->dsh_act = d->shared ? TAKE_ACT(N * De) : NULL;
	s->dsh_h = d->shared ? TAKE_ACT(N * 2 * De) : NULL;
	s->tmp = s->dy;
	return pos;
}

size_t moe_dsave_view(const struct moe_dims *d, void *base, struct moe_dsave *s)
{
	size_t N = (size_t)d->N, NK = N * d->K, C = d->C, De = d->De, pos = 0;

	s->dy = TAKE_ACT(NK * C);
	s->dh = TAKE_ACT(NK * 2 * De);
	s->dz = TAKE_ACT(N * d->E);
	s->dsh_h = d->shared ? TAKE_ACT(N * 2 * De) : NULL;
	return pos;
}

/* ---- routing ---- */

/* Scores, top-k and gates of token n; returns its logsumexp(z). */
static float route_token(const struct moe_dims *d, const float *z, float *score, int32_t *sel,
			 float *gate)
{
	int E = d->E, K = d->K;
	float mx = z[0], lse;
	double sum = 0, gsum = 0;

	for (int e = 1; e < E; e++)
		mx = fmaxf(mx, z[e]);
	for (int e = 0; e < E; e++)
		sum += exp((double)(z[e] - mx));
	lse = mx + (float)log(sum);
	for (int e = 0; e < E; e++)
		score[e] = d->router == ROUTER_SOFTMAX ? expf(z[e] - lse) : 1.0f / (1.0f + expf(-z[e]));
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
	return lse;
}

/* P_i's per-token term: q[n,i] (softmax: the score; sigmoid: the score
 * over the token's sum of scores). Returns that sum (1 for softmax). */
static double balance_norm(const struct moe_dims *d, const float *score)
{
	double s = 0;
	if (d->router == ROUTER_SOFTMAX)
		return 1.0;
	for (int e = 0; e < d->E; e++)
		s += score[e];
	return s;
}

void moe_forward(const struct backend *be, const struct moe_dims *d, const struct moe_params *w,
		 const void *x, void *out, struct moe_acts *a)
{
	int N = d->N, C = d->C, E = d->E, K = d->K, De = d->De, dt = d->act_dtype;
	size_t A = act_dtype_size(dt);
	int32_t fill[E > 0 ? E : 1];
	double zsum = 0, P[E > 0 ? E : 1], bal = 0;
	float *row = xmalloc(st_mult((size_t)(C > E ? C : E), sizeof(float)));

	be->matmul_forward(a->z, x, w->router, NULL, N, C, E);
	memset(P, 0, sizeof(P));
	for (int n = 0; n < N; n++) {
		const float *sc = a->score + (size_t)n * E;
		float lse;
		for (int e = 0; e < E; e++)
			row[e] = act_load(a->z, (size_t)n * E + e, dt);
		lse = route_token(d, row, a->score + (size_t)n * E, a->sel + (size_t)n * K,
				  a->gate + (size_t)n * K);
		double norm = balance_norm(d, sc);
		zsum += (double)lse * lse;
		for (int e = 0; e < E; e++)
			P[e] += sc[e] / norm;
	}

	/* dispatch: expert e's rows in ascending token order */
	memset(a->count, 0, sizeof(int32_t) * (size_t)(E + 1));
	for (int i = 0; i < N * K; i++)
		a->count[a->sel[i] + 1]++;
	for (int e = 0; e < E; e++)
		a->count[e + 1] += a->count[e];
	memset(fill, 0, sizeof(fill));
	for (int n = 0; n < N; n++)
		for (int j = 0; j < K; j++) {
			int e = a->sel[n * K + j];
			int r = a->count[e] + fill[e]++;
			a->pos[n * K + j] = r;
			memcpy(act_at(a->xd, (size_t)r * C, A), act_at(x, (size_t)n * C, A), A * C);
		}
	for (int e = 0; e < E; e++) {
		size_t r0 = (size_t)a->count[e];
		int cnt = a->count[e + 1] - a->count[e];
		if (!cnt)
			continue;
		be->matmul_forward(act_at(a->h, r0 * 2 * De, A), act_at(a->xd, r0 * C, A),
				   w->fcw + (size_t)e * 2 * De * C, NULL, cnt, C, 2 * De);
		be->swiglu_forward(act_at(a->act, r0 * De, A), act_at(a->h, r0 * 2 * De, A), cnt,
				   De);
		be->matmul_forward(act_at(a->y, r0 * C, A), act_at(a->act, r0 * De, A),
				   w->fcprojw + (size_t)e * C * De, NULL, cnt, De, C);
	}

	/* combine: out = shared(x) + sum_j gate_j y_j, j in order */
	if (d->shared) {
		be->matmul_forward(a->sh_h, x, w->sh_fcw, NULL, N, C, 2 * De);
		be->swiglu_forward(a->sh_act, a->sh_h, N, De);
		be->matmul_forward(out, a->sh_act, w->sh_fcprojw, NULL, N, De, C);
	} else {
		memset(out, 0, A * (size_t)N * C);
	}
	for (int n = 0; n < N; n++) {
		size_t o = (size_t)n * C;
		for (int c = 0; c < C; c++)
			row[c] = act_load(out, o + c, dt);
		for (int j = 0; j < K; j++) {
			size_t y = (size_t)a->pos[n * K + j] * C;
			float g = a->gate[n * K + j];
			for (int c = 0; c < C; c++)
				row[c] += g * act_load(a->y, y + c, dt);
		}
		for (int c = 0; c < C; c++)
			act_store(out, o + c, dt, row[c]);
	}
	free(row);

	for (int e = 0; e < E; e++)
		bal += (double)(a->count[e + 1] - a->count[e]) / ((double)N * K) * (P[e] / N);
	a->aux[0] = (float)(E * bal);
	a->aux[1] = (float)(zsum / N);
}

/* ---- backward ---- */

/* d(z) of token n from the gates' gradient dg[K] and the auxiliary losses
 * (f[e] = routed share of expert e, ca = dloss*alpha*E/N, cz =
 * dloss*beta*2/N), overwriting dz[E]. */
static void router_token_backward(const struct moe_dims *d, const float *z, const float *score,
				  const int32_t *sel, const float *gate, const float *dg,
				  const double *f, double ca, double cz, float *dz)
{
	int E = d->E, K = d->K;
	double db[K], gd = 0, gsum = 0;
	float mx = z[0];
	double sum = 0, lse, norm = balance_norm(d, score), fq = 0;

	/* gates -> selected scores */
	for (int j = 0; j < K; j++) {
		gd += (double)gate[j] * dg[j];
		gsum += score[sel[j]];
	}
	for (int j = 0; j < K; j++)
		db[j] = K > 1 ? (dg[j] - gd) / gsum : dg[j];
	/* scores -> logits */
	if (d->router == ROUTER_SOFTMAX) {
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
		if (d->router == ROUTER_SOFTMAX)
			dz[e] += (float)(ca * s * t);
		else
			dz[e] += (float)(ca * t * s * (1 - s) / norm);
	}
	/* z-loss: d lse^2 / dz = 2 lse softmax(z) */
	for (int e = 1; e < E; e++)
		mx = fmaxf(mx, z[e]);
	for (int e = 0; e < E; e++)
		sum += exp((double)(z[e] - mx));
	lse = mx + log(sum);
	for (int e = 0; e < E; e++)
		dz[e] += (float)(cz * lse * exp(z[e] - lse));
}

/* Expert e's slice of a gradient tensor of per-expert size n; NULL when g is */
static float *expert_grad(float *g, int e, size_t n)
{
	return g ? g + (size_t)e * n : NULL;
}

void moe_backward(const struct backend *be, const struct moe_dims *d,
		  const struct moe_params *w, const struct moe_grads *g, const void *x,
		  const void *dout, void *dx, const struct moe_acts *a,
		  const struct moe_scratch *scr, const struct moe_dsave *keep, float dloss)
{
	int N = d->N, C = d->C, E = d->E, K = d->K, De = d->De, dt = d->act_dtype;
	size_t A = act_dtype_size(dt);
	double f[E > 0 ? E : 1];
	/* the products' output gradients go where the weight part finds them */
	struct moe_scratch sk = *scr;
	const struct moe_scratch *s = &sk;
	static const struct moe_grads none;
	void *tmp = scr->tmp;

	if (keep) {
		sk.dy = keep->dy;
		sk.dh = keep->dh;
		sk.dz = keep->dz;
		sk.dsh_h = keep->dsh_h;
	}
	if (!g)
		g = &none;
	float *row = xmalloc(st_mult(2 * (size_t)(C > E ? C : E), sizeof(float)));
	float *row2 = row + (C > E ? C : E);

	/* combine: d gate and d y per slot */
	for (int n = 0; n < N; n++) {
		size_t dof = (size_t)n * C;
		for (int j = 0; j < K; j++) {
			size_t r = (size_t)a->pos[n * K + j];
			float gt = a->gate[n * K + j];
			double dot = 0;
			for (int c = 0; c < C; c++) {
				float dv = act_load(dout, dof + c, dt);
				dot += (double)dv * act_load(a->y, r * C + c, dt);
				act_store(s->dy, r * C + c, dt, gt * dv);
			}
			s->dgate[n * K + j] = (float)dot;
		}
	}
	for (int e = 0; e < E; e++) {
		size_t r0 = (size_t)a->count[e];
		int cnt = a->count[e + 1] - a->count[e];
		if (!cnt)
			continue;
		be->matmul_backward(act_at(s->dact, r0 * De, A),
				    expert_grad(g->fcprojw, e, (size_t)C * De), NULL,
				    act_at(s->dy, r0 * C, A), act_at(a->act, r0 * De, A),
				    w->fcprojw + (size_t)e * C * De, cnt, De, C);
		be->swiglu_backward(act_at(s->dh, r0 * 2 * De, A), act_at(s->dact, r0 * De, A),
				    act_at(a->h, r0 * 2 * De, A), cnt, De);
		be->matmul_backward(act_at(s->dxd, r0 * C, A),
				    expert_grad(g->fcw, e, (size_t)2 * De * C), NULL,
				    act_at(s->dh, r0 * 2 * De, A), act_at(a->xd, r0 * C, A),
				    w->fcw + (size_t)e * 2 * De * C, cnt, C, 2 * De);
	}

	/* router: z and dz are activations, the token's math is float */
	for (int e = 0; e < E; e++)
		f[e] = (double)(a->count[e + 1] - a->count[e]) / ((double)N * K);
	for (int n = 0; n < N; n++) {
		for (int e = 0; e < E; e++)
			row[e] = act_load(a->z, (size_t)n * E + e, dt);
		router_token_backward(d, row, a->score + (size_t)n * E,
				      a->sel + (size_t)n * K, a->gate + (size_t)n * K,
				      s->dgate + (size_t)n * K, f,
				      (double)dloss * d->alpha * E / N,
				      (double)dloss * d->beta * 2.0 / N, row2);
		for (int e = 0; e < E; e++)
			act_store(s->dz, (size_t)n * E + e, dt, row2[e]);
	}
	be->matmul_backward(dx, g->router, NULL, s->dz, x, w->router, N, C, E);

	/* dx = router part + shared part + sum_j routed parts (j in order) */
	if (d->shared) {
		be->matmul_backward(s->dsh_act, g->sh_fcprojw, NULL, dout, a->sh_act, w->sh_fcprojw,
				    N, De, C);
		be->swiglu_backward(s->dsh_h, s->dsh_act, a->sh_h, N, De);
		be->matmul_backward(tmp, g->sh_fcw, NULL, s->dsh_h, x, w->sh_fcw, N, C, 2 * De);
		be->add_act(dx, dx, tmp, (size_t)N * C);
	}
	for (int n = 0; n < N; n++) {
		size_t o = (size_t)n * C;
		for (int c = 0; c < C; c++)
			row[c] = act_load(dx, o + c, dt);
		for (int j = 0; j < K; j++) {
			size_t r = (size_t)a->pos[n * K + j] * C;
			for (int c = 0; c < C; c++)
				row[c] += act_load(s->dxd, r + c, dt);
		}
		for (int c = 0; c < C; c++)
			act_store(dx, o + c, dt, row[c]);
	}
	free(row);
}

void moe_backward_weight(const struct backend *be, const struct moe_dims *d,
			 const struct moe_grads *g, const void *x, const void *dout,
			 const struct moe_acts *a, const struct moe_dsave *keep)
{
	int N = d->N, C = d->C, E = d->E, De = d->De;
	size_t A = act_dtype_size(d->act_dtype);

	/* each tensor gets the one product moe_backward gives it (no weight is
	 * read: dinp is NULL) */
	for (int e = 0; e < E; e++) {
		size_t r0 = (size_t)a->count[e];
		int cnt = a->count[e + 1] - a->count[e];
		if (!cnt)
			continue;
		be->matmul_backward(NULL, g->fcprojw + (size_t)e * C * De, NULL,
				    act_at(keep->dy, r0 * C, A), act_at(a->act, r0 * De, A), NULL,
				    cnt, De, C);
		be->matmul_backward(NULL, g->fcw + (size_t)e * 2 * De * C, NULL,
				    act_at(keep->dh, r0 * 2 * De, A), act_at(a->xd, r0 * C, A), NULL,
				    cnt, C, 2 * De);
	}
	be->matmul_backward(NULL, g->router, NULL, keep->dz, x, NULL, N, C, E);
	if (d->shared) {
		be->matmul_backward(NULL, g->sh_fcprojw, NULL, dout, a->sh_act, NULL, N, De, C);
		be->matmul_backward(NULL, g->sh_fcw, NULL, keep->dsh_h, x, NULL, N, C, 2 * De);
	}
}
