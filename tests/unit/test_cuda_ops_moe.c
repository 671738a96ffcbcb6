/* test_cuda_ops_moe.c - the CUDA backend's mixture-of-experts ops (moe_*,
 * kernels/cuda/cuda_moe.cu) against the CPU's (kernels/cpu/cpu_moe.c, the
 * reference) on the same inputs, for the f32 and bf16 tables, at odd shapes:
 * E not dividing N, an expert with no token, top-k = E, tied logits, both
 * routers, a slot count over one dispatch chunk. SKIPs without a CUDA
 * backend or device (as test_cuda_ops.c); cuda_moe_ops_harness_on_cpu runs
 * the same harness CPU against CPU in every run.
 *
 * Tolerances: the choice (sel), counts, positions and the gathered rows
 * exact; scores and gates 1e-6 relative (expf on two devices); the combine,
 * its backward and the router's backward 1e-5 of the tensor's max (float
 * sums; the gates' dot products in double, in another order); the
 * auxiliary losses 1e-6 relative (double sums in another order). In bf16 a
 * stored element may differ by one bf16 ulp where the f32 values straddle
 * a rounding boundary: 1e-2 of the max there. Every CUDA output also
 * repeats bit for bit on a second run (no order-dependent atomics). The
 * experts' products (moe_expert_*) and the experts in Muon and NorMuon
 * have their own sections below.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/config/config.h"
#include "../../io/util.h"
#include "../../kernels/backend.h"
#include "../../model/model.h"
#include "../../optim/optim.h"
#include "../test.h"

struct shape {
	int N, E, K, C, router, empty, ties;
};

static const struct shape shapes[] = {
	{7, 3, 2, 5, 0, 0, 1},     {9, 5, 1, 3, 0, 1, 0}, {5, 4, 4, 6, 1, 0, 1},
	{11, 6, 2, 7, 1, 1, 0},    {301, 8, 2, 33, 0, 0, 0}, /* NK = 602 > one chunk */
	{3000, 70, 4, 9, 0, 1, 0}, /* 47 chunks; E above 64, not a power of two */
};

/* Everything the chain of ops writes, on the host. */
struct outs {
	float *score, *gate, *dgate, *aux, *xd, *out, *out_ungated, *dy, *dz;
	int32_t *sel, *pos, *count;
};

static void frand(float *x, size_t n, uint64_t seed, float scale)
{
	uint64_t s = seed;
	for (size_t i = 0; i < n; i++)
		x[i] = scale * rng_normal(&s);
}

/* An f32 host array as be's activations (device memory). */
static void *up_act(const struct backend *be, const float *h, size_t n)
{
	float *f = be->alloc(4 * n);
	void *a = be->alloc(act_size(be) * n);
	be->to_device(f, h, 4 * n);
	be->act_from_f32(a, f, n);
	be->synchronize();
	be->free(f);
	return a;
}

static float *down_act(const struct backend *be, const void *a, size_t n)
{
	float *f = be->alloc(4 * n), *h = xmalloc(4 * n);
	be->act_to_f32(f, a, n);
	be->synchronize();
	be->to_host(h, f, 4 * n);
	be->free(f);
	return h;
}

static void *down(const struct backend *be, const void *d, size_t bytes)
{
	void *h = xmalloc(bytes);
	be->synchronize();
	be->to_host(h, d, bytes);
	return h;
}

static void run_chain(const struct backend *be, const struct shape *s, struct outs *o)
{
	int N = s->N, E = s->E, K = s->K, C = s->C, NK = N * K;
	float *z = xmalloc(4 * N * E), *x = xmalloc(4 * N * C), *y = xmalloc(4 * NK * C);
	float *dout = xmalloc(4 * N * C), *out0 = xmalloc(4 * N * C), *dgin = xmalloc(4 * NK);

	frand(z, N * E, 21 + N, 1.5f), frand(x, N * C, 22 + N, 1.0f);
	frand(y, NK * C, 23 + N, 1.0f), frand(dout, N * C, 24 + N, 1.0f);
	frand(out0, N * C, 25 + N, 1.0f), frand(dgin, NK, 26 + N, 1.0f);
	if (s->empty)
		for (int n = 0; n < N; n++)
			z[n * E + E - 1] = -9.0f;
	if (s->ties) {
		for (int e = 0; e < E; e++)
			z[e] = 0.25f;
		z[E + 1] = z[E + 2] = 2.0f;
	}
	void *d_z = up_act(be, z, N * E), *d_x = up_act(be, x, N * C);
	void *d_y = up_act(be, y, NK * C), *d_dout = up_act(be, dout, N * C);
	void *d_out = up_act(be, out0, N * C), *d_xd = be->alloc(act_size(be) * NK * C);
	void *d_out2 = up_act(be, out0, N * C);
	void *d_dy = be->alloc(act_size(be) * NK * C), *d_dz = be->alloc(act_size(be) * N * E);
	float *d_score = be->alloc(4 * N * E), *d_gate = be->alloc(4 * NK);
	float *d_dgate = be->alloc(4 * NK), *d_aux = be->alloc(8), *d_dgin = be->alloc(4 * NK);
	int32_t *d_sel = be->alloc(4 * NK), *d_pos = be->alloc(4 * NK);
	int32_t *d_count = be->alloc(4 * (E + 1));

	be->to_device(d_dgin, dgin, 4 * NK);
	be->moe_route(d_score, d_sel, d_gate, d_z, N, E, K, s->router);
	be->moe_dispatch(d_count, d_pos, d_sel, N, K, E);
	be->moe_gather(d_xd, d_x, d_pos, N, K, C);
	be->moe_combine(d_out, d_y, d_gate, d_pos, N, K, C);
	be->moe_combine(d_out2, d_y, NULL, d_pos, N, K, C); /* the gather's backward */
	be->moe_combine_backward(d_dy, d_dgate, d_dout, d_y, d_gate, d_pos, N, K, C);
	be->moe_aux(d_aux, d_z, d_score, d_count, N, E, K, s->router);
	be->moe_router_backward(d_dz, d_z, d_score, d_sel, d_gate, d_dgin, d_count, N, E, K,
				s->router, 0.7f, 0.3f, 0.2f);
	o->score = down(be, d_score, 4 * N * E), o->gate = down(be, d_gate, 4 * NK);
	o->dgate = down(be, d_dgate, 4 * NK), o->aux = down(be, d_aux, 8);
	o->sel = down(be, d_sel, 4 * NK), o->pos = down(be, d_pos, 4 * NK);
	o->count = down(be, d_count, 4 * (E + 1));
	o->xd = down_act(be, d_xd, NK * C), o->out = down_act(be, d_out, N * C);
	o->out_ungated = down_act(be, d_out2, N * C);
	o->dy = down_act(be, d_dy, NK * C), o->dz = down_act(be, d_dz, N * E);
	void *devs[] = {d_z, d_x, d_y, d_dout, d_out, d_out2, d_xd, d_dy, d_dz, d_score, d_gate,
			d_dgate, d_aux, d_dgin, d_sel, d_pos, d_count};
	for (size_t i = 0; i < sizeof(devs) / sizeof(devs[0]); i++)
		be->free(devs[i]);
	free(z), free(x), free(y), free(dout), free(out0), free(dgin);
}

static void outs_free(struct outs *o)
{
	free(o->score), free(o->gate), free(o->dgate), free(o->aux), free(o->sel);
	free(o->pos), free(o->count), free(o->xd), free(o->out), free(o->out_ungated);
	free(o->dy), free(o->dz);
}

/* max |a - b| <= tol * max(max |b|, 1e-30) */
static int near(const float *a, const float *b, size_t n, double tol)
{
	double mx = 0, err = 0;
	for (size_t i = 0; i < n; i++) {
		mx = fmax(mx, fabs(b[i]));
		err = fmax(err, fabs((double)a[i] - b[i]));
	}
	return err <= tol * fmax(mx, 1e-30);
}

static const struct backend *cuda_or_skip(int dtype, char *why, size_t len)
{
	const struct backend *cu = backend_cuda();
	if (!cu) {
		snprintf(why, len, "this binary has no CUDA backend");
		return NULL;
	}
	if (!cuda_available(why, len))
		return NULL;
	cu = backend_with_act_dtype(cu, dtype);
	if (cu && !cu->moe_route) {
		snprintf(why, len, "cuda backend lacks moe_route");
		return NULL;
	}
	return cu;
}

/* cu's ops against ref's (both of activation type dtype) */
static void compare(const struct backend *cu, const struct backend *ref, int dtype)
{
	double ta = dtype == ACT_BF16 ? 1e-2 : 1e-5;

	for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
		const struct shape *s = &shapes[k];
		int N = s->N, E = s->E, NK = N * s->K, C = s->C;
		struct outs a, b, a2;
		run_chain(cu, s, &a);
		run_chain(ref, s, &b);
		run_chain(cu, s, &a2);
		CHECK_MSG(!memcmp(a.sel, b.sel, 4 * NK), "shape %zu: sel", k);
		CHECK_MSG(!memcmp(a.count, b.count, 4 * (E + 1)), "shape %zu: count", k);
		CHECK_MSG(!memcmp(a.pos, b.pos, 4 * NK), "shape %zu: pos", k);
		CHECK_MSG(!memcmp(a.xd, b.xd, 4 * (size_t)NK * C), "shape %zu: gather", k);
		CHECK_MSG(near(a.score, b.score, N * E, 1e-6), "shape %zu: score", k);
		CHECK_MSG(near(a.gate, b.gate, NK, 1e-6), "shape %zu: gate", k);
		CHECK_MSG(near(a.out, b.out, (size_t)N * C, ta), "shape %zu: combine", k);
		CHECK_MSG(near(a.out_ungated, b.out_ungated, (size_t)N * C, ta),
			  "shape %zu: combine without gates", k);
		CHECK_MSG(near(a.dy, b.dy, (size_t)NK * C, ta), "shape %zu: dy", k);
		CHECK_MSG(near(a.dgate, b.dgate, NK, 1e-5), "shape %zu: dgate", k);
		CHECK_MSG(near(a.aux, b.aux, 2, 1e-6), "shape %zu: aux %g %g vs %g %g", k,
			  a.aux[0], a.aux[1], b.aux[0], b.aux[1]);
		CHECK_MSG(near(a.dz, b.dz, N * E, ta), "shape %zu: router backward", k);
		/* a second run repeats every output bit for bit */
		CHECK_MSG(!memcmp(a.out, a2.out, 4 * (size_t)N * C) &&
				  !memcmp(a.out_ungated, a2.out_ungated, 4 * (size_t)N * C) &&
				  !memcmp(a.dgate, a2.dgate, 4 * NK) &&
				  !memcmp(a.aux, a2.aux, 8) && !memcmp(a.dz, a2.dz, 4 * N * E) &&
				  !memcmp(a.pos, a2.pos, 4 * NK) && !memcmp(a.sel, a2.sel, 4 * NK) &&
				  !memcmp(a.count, a2.count, 4 * (E + 1)) &&
				  !memcmp(a.score, a2.score, 4 * N * E) &&
				  !memcmp(a.gate, a2.gate, 4 * NK) &&
				  !memcmp(a.xd, a2.xd, 4 * (size_t)NK * C) &&
				  !memcmp(a.dy, a2.dy, 4 * (size_t)NK * C),
			  "shape %zu: a second run differs", k);
		outs_free(&a), outs_free(&b), outs_free(&a2);
	}
}

static void compare_cuda(int dtype)
{
	char why[256];
	const struct backend *cu = cuda_or_skip(dtype, why, sizeof(why));

	if (!cu) {
		test_skip(why);
		return;
	}
	compare(cu, backend_with_act_dtype(&backend_cpu, dtype), dtype);
}

TEST(cuda_moe_ops_f32)
{
	compare_cuda(ACT_F32);
}

TEST(cuda_moe_ops_bf16)
{
	compare_cuda(ACT_BF16);
}

/* ---- the experts' products (moe_expert_forward/backward) ----
 *
 * Against a double reference written here (each expert's rows through its
 * own matrix; untouched gradient slices keep their bits), at odd shapes: E
 * not dividing the rows, an expert with no row, every expert with the
 * same rows (top-k = E), widths off a multiple of 8 (CUDA runs the loop
 * there). Tolerance: 1e-5 of the max on the CPU's f32 table, 1e-2 where
 * operands are bf16 (the CPU's bf16 table, every CUDA product), as
 * matmul. On CUDA also: the split backward's parts are the bits of the
 * call with both, a second run repeats every bit, buffers 1 element off
 * 16 bytes and buffers 16 bytes further on give the aligned buffers' bits
 * (a pipeline stage's tensors sit at other offsets than one device's),
 * the grouped call agrees with the loop (ASYNCPP_MOE_GEMM=loop) within
 * the tolerance, and a call over a range of the experts (an expert
 * parallel owner's, model/moe.h) gives their rows and gradients the bits
 * of the call over all. The first run of a shape whose widths are
 * multiples of 8 is under ASYNCPP_MOE_GEMM=strict: a grouped call cuBLAS
 * declines fails the test instead of passing as the loop against itself. */

struct gshape {
	int E, C, OC;
	int rows[9]; /* per expert */
};

static const struct gshape gshapes[] = {
	{5, 16, 24, {3, 0, 7, 1, 4}},         /* an expert with no row */
	{3, 40, 16, {7, 12, 0}},               /* the last one empty */
	{4, 32, 64, {6, 6, 6, 6}},             /* top-k = E: every expert every token */
	{3, 12, 20, {5, 0, 9}},                /* widths not multiples of 8 */
	{8, 64, 96, {80, 75, 0, 90, 61, 77, 70, 49}}, /* 502 rows */
};

struct gres {
	float *out, *dinp, *dw;
};

/* inp[R,C], w[E,OC,C], dout[R,OC], dw0[E,OC,C] of shape s (seeded) */
struct gin {
	int32_t count[10];
	int R;
	float *inp, *w, *dout, *dw0;
};

static void gin_make(const struct gshape *s, struct gin *g)
{
	g->count[0] = 0;
	for (int e = 0; e < s->E; e++)
		g->count[e + 1] = g->count[e] + s->rows[e];
	g->R = g->count[s->E];
	size_t nw = (size_t)s->E * s->OC * s->C;
	g->inp = xmalloc(4 * (size_t)g->R * s->C), g->w = xmalloc(4 * nw);
	g->dout = xmalloc(4 * (size_t)g->R * s->OC), g->dw0 = xmalloc(4 * nw);
	frand(g->inp, (size_t)g->R * s->C, 31 + s->C, 1.0f);
	frand(g->w, nw, 32 + s->C, 0.2f);
	frand(g->dout, (size_t)g->R * s->OC, 33 + s->C, 1.0f);
	frand(g->dw0, nw, 34 + s->C, 0.5f);
}

static void gin_free(struct gin *g)
{
	free(g->inp), free(g->w), free(g->dout), free(g->dw0);
}

/* The reference in double: out = inp_e w_e^T, dinp = dout_e w_e, dw =
 * dw0 + dout_e^T inp_e, expert by expert over its rows. */
static void gemm_reference(const struct gshape *s, const struct gin *g, struct gres *r)
{
	int C = s->C, OC = s->OC;
	r->out = xmalloc(4 * (size_t)g->R * OC), r->dinp = xmalloc(4 * (size_t)g->R * C);
	r->dw = xmalloc(4 * (size_t)s->E * OC * C);
	for (int e = 0; e < s->E; e++) {
		const float *w = g->w + (size_t)e * OC * C;
		for (int n = g->count[e]; n < g->count[e + 1]; n++) {
			const float *x = g->inp + (size_t)n * C, *d = g->dout + (size_t)n * OC;
			for (int o = 0; o < OC; o++) {
				double acc = 0;
				for (int c = 0; c < C; c++)
					acc += (double)x[c] * w[(size_t)o * C + c];
				r->out[(size_t)n * OC + o] = (float)acc;
			}
			for (int c = 0; c < C; c++) {
				double acc = 0;
				for (int o = 0; o < OC; o++)
					acc += (double)d[o] * w[(size_t)o * C + c];
				r->dinp[(size_t)n * C + c] = (float)acc;
			}
		}
		for (int o = 0; o < OC; o++)
			for (int c = 0; c < C; c++) {
				size_t i = ((size_t)e * OC + o) * C + c;
				double acc = g->dw0[i];
				for (int n = g->count[e]; n < g->count[e + 1]; n++)
					acc += (double)g->dout[(size_t)n * OC + o] *
					       g->inp[(size_t)n * C + c];
				r->dw[i] = (float)acc;
			}
	}
}

/* An activation buffer of n elements holding h, at element offset off
 * from an allocation (off 1: 2 or 4 bytes off 16); *base is what to free. */
static void *up_act_at(const struct backend *be, const float *h, size_t n, int off, void **base)
{
	void *a = be->alloc(act_size(be) * (n + (size_t)off));
	void *p = act_at(a, (size_t)off, act_size(be));
	float *f = be->alloc(4 * n);
	be->to_device(f, h, 4 * n);
	be->act_from_f32(p, f, n);
	be->synchronize();
	be->free(f);
	*base = a;
	return p;
}

/* place 0: every buffer where alloc puts it; 1: one element past it (2 or
 * 4 bytes off 16: staged); 2: 16 bytes past it for activations and 8
 * floats for the weights inside a larger prepared range (aligned, but
 * another address modulo 256, as a pipeline stage's tensors sit). split:
 * the backward's input and weight parts as two calls. */
static void gemm_run_range(const struct backend *be, const struct gshape *s, const struct gin *g,
			   int place, int split, int e0, int e1, struct gres *r)
{
	int E = s->E, C = s->C, OC = s->OC, R = g->R;
	int off = place == 2 ? 16 / (int)act_size(be) : place, woff = place == 2 ? 8 : place;
	size_t nw = (size_t)E * OC * C;
	void *b_inp, *b_dout, *b_out, *b_dinp;
	void *inp = up_act_at(be, g->inp, (size_t)R * C, off, &b_inp);
	void *dout = up_act_at(be, g->dout, (size_t)R * OC, off, &b_dout);
	void *out = up_act_at(be, g->dout, (size_t)R * OC, off, &b_out);  /* overwritten */
	void *dinp = up_act_at(be, g->inp, (size_t)R * C, off, &b_dinp); /* overwritten */
	float *warena = be->alloc(4 * (nw + 16)), *w = warena + woff;
	float *dwarena = be->alloc(4 * (nw + 16)), *dw = dwarena + woff;

	be->to_device(w, g->w, 4 * nw);
	be->to_device(dw, g->dw0, 4 * nw);
	if (be->weights_bf16)
		be->weights_bf16(warena, nw + 16);
	/* experts [e0, e1) from their first row, as moe_experts calls a range:
	 * counts rebased, buffers from the range's first row and expert */
	int32_t count[10];
	size_t r0 = (size_t)g->count[e0], A = act_size(be), w0 = (size_t)e0 * OC * C;
	for (int e = e0; e <= e1; e++)
		count[e - e0] = g->count[e] - g->count[e0];
	void *ri = act_at(inp, r0 * C, A), *rd = act_at(dout, r0 * OC, A);
	void *ro = act_at(out, r0 * OC, A), *rdi = act_at(dinp, r0 * C, A);
	be->moe_expert_forward(ro, ri, w + w0, count, e1 - e0, C, OC);
	if (split) {
		be->moe_expert_backward(rdi, NULL, rd, ri, w + w0, count, e1 - e0, C, OC);
		be->moe_expert_backward(NULL, dw + w0, rd, ri, NULL, count, e1 - e0, C, OC);
	} else {
		be->moe_expert_backward(rdi, dw + w0, rd, ri, w + w0, count, e1 - e0, C, OC);
	}
	r->out = down_act(be, out, (size_t)R * OC), r->dinp = down_act(be, dinp, (size_t)R * C);
	r->dw = down(be, dw, 4 * nw);
	be->free(b_inp), be->free(b_dout), be->free(b_out), be->free(b_dinp);
	be->free(warena), be->free(dwarena);
}

static void gemm_run(const struct backend *be, const struct gshape *s, const struct gin *g,
		     int place, int split, struct gres *r)
{
	gemm_run_range(be, s, g, place, split, 0, s->E, r);
}

/* Whether experts [e0, e1)'s rows and gradients are the same in a and b */
static int gres_same_range(const struct gres *a, const struct gres *b, const struct gshape *s,
			   const struct gin *g, int e0, int e1)
{
	size_t r0 = (size_t)g->count[e0], n = (size_t)(g->count[e1] - g->count[e0]);
	size_t w0 = (size_t)e0 * s->OC * s->C, nw = (size_t)(e1 - e0) * s->OC * s->C;
	return !memcmp(a->out + r0 * s->OC, b->out + r0 * s->OC, 4 * n * s->OC) &&
	       !memcmp(a->dinp + r0 * s->C, b->dinp + r0 * s->C, 4 * n * s->C) &&
	       !memcmp(a->dw + w0, b->dw + w0, 4 * nw);
}

static void gres_free(struct gres *r)
{
	free(r->out), free(r->dinp), free(r->dw);
}

static int gres_same(const struct gres *a, const struct gres *b, const struct gshape *s, int R)
{
	size_t nw = (size_t)s->E * s->OC * s->C;
	return !memcmp(a->out, b->out, 4 * (size_t)R * s->OC) &&
	       !memcmp(a->dinp, b->dinp, 4 * (size_t)R * s->C) && !memcmp(a->dw, b->dw, 4 * nw);
}

static int gres_near(const struct gres *a, const struct gres *b, const struct gshape *s, int R,
		     double tol)
{
	size_t nw = (size_t)s->E * s->OC * s->C;
	return near(a->out, b->out, (size_t)R * s->OC, tol) &&
	       near(a->dinp, b->dinp, (size_t)R * s->C, tol) && near(a->dw, b->dw, nw, tol);
}

/* be's experts' products against the reference; with deep, the CUDA
 * properties of the comment above too */
static void compare_gemm(const struct backend *be, double tol, int deep)
{
	for (size_t k = 0; k < sizeof(gshapes) / sizeof(gshapes[0]); k++) {
		const struct gshape *s = &gshapes[k];
		struct gin g;
		struct gres ref, a;
		gin_make(s, &g);
		gemm_reference(s, &g, &ref);
		int strict = deep && s->C % 8 == 0 && s->OC % 8 == 0;
		if (strict)
			setenv("ASYNCPP_MOE_GEMM", "strict", 1);
		gemm_run(be, s, &g, 0, 0, &a);
		if (strict)
			unsetenv("ASYNCPP_MOE_GEMM");
		CHECK_MSG(near(a.out, ref.out, (size_t)g.R * s->OC, tol), "gemm shape %zu: out", k);
		CHECK_MSG(near(a.dinp, ref.dinp, (size_t)g.R * s->C, tol), "gemm shape %zu: dinp",
			  k);
		CHECK_MSG(near(a.dw, ref.dw, (size_t)s->E * s->OC * s->C, tol),
			  "gemm shape %zu: dw", k);
		if (deep) {
			struct gres sp, again, off, off16, loop, part;
			int e0 = 1, e1 = s->E - 1; /* an owner's range */
			gemm_run_range(be, s, &g, 0, 0, e0, e1, &part);
			gemm_run(be, s, &g, 0, 1, &sp);
			gemm_run(be, s, &g, 0, 0, &again);
			gemm_run(be, s, &g, 1, 0, &off);
			gemm_run(be, s, &g, 2, 0, &off16);
			setenv("ASYNCPP_MOE_GEMM", "loop", 1);
			gemm_run(be, s, &g, 0, 0, &loop);
			unsetenv("ASYNCPP_MOE_GEMM");
			CHECK_MSG(gres_same(&a, &sp, s, g.R), "gemm shape %zu: split differs", k);
			CHECK_MSG(gres_same(&a, &again, s, g.R),
				  "gemm shape %zu: a second run differs", k);
			CHECK_MSG(gres_same(&a, &off, s, g.R),
				  "gemm shape %zu: buffers off 16 bytes differ", k);
			CHECK_MSG(gres_same(&a, &off16, s, g.R),
				  "gemm shape %zu: buffers 16 bytes further on differ", k);
			CHECK_MSG(gres_near(&a, &loop, s, g.R, tol),
				  "gemm shape %zu: grouped and loop disagree", k);
			CHECK_MSG(gres_same_range(&a, &part, s, &g, e0, e1),
				  "gemm shape %zu: experts [%d, %d) alone differ", k, e0, e1);
			gres_free(&sp), gres_free(&again), gres_free(&off), gres_free(&off16);
			gres_free(&loop), gres_free(&part);
		}
		gres_free(&ref), gres_free(&a);
		gin_free(&g);
	}
}

/* The CUDA table of dtype with the experts' products, or NULL after
 * test_skip naming why */
static const struct backend *cuda_gemm_or_skip(int dtype)
{
	char why[256];
	const struct backend *cu = cuda_or_skip(dtype, why, sizeof(why));

	if (cu && !cu->moe_expert_forward) {
		snprintf(why, sizeof(why), "cuda backend lacks moe_expert_forward");
		cu = NULL;
	}
	if (!cu)
		test_skip(why);
	return cu;
}

static void compare_gemm_cuda(int dtype)
{
	const struct backend *cu = cuda_gemm_or_skip(dtype);
	if (cu)
		compare_gemm(cu, 1e-2, 1);
}

TEST(cuda_moe_expert_gemm_f32)
{
	compare_gemm_cuda(ACT_F32);
}

TEST(cuda_moe_expert_gemm_bf16)
{
	compare_gemm_cuda(ACT_BF16);
}

/* The loop's plans (ASYNCPP_MOE_GEMM=loop; cuda_matmul.cu): an expert's
 * row count changes at nearly every call, so its products take the
 * algorithm chosen for the count's bucket (the next power of two) where
 * cuBLASLt accepts it for the real count. That choice must be a function
 * of the shape alone: after enough other shapes to evict every plan (256)
 * and bucket (64) of the first run, and a bucket first filled again by
 * other row counts, the first shape gets its first bits again. rounds: how
 * many powers of two the churn's row counts climb through (small on the
 * CPU, where this checks the harness). */
static void loop_bits_ignore_history(const struct backend *be, int rounds)
{
	const struct gshape *s = &gshapes[4];
	struct gin g, h;
	struct gres first, again, other;
	setenv("ASYNCPP_MOE_GEMM", "loop", 1);
	gin_make(s, &g);
	gemm_run(be, s, &g, 0, 0, &first);
	for (int i = 0; i < 2 * rounds; i++) { /* 2 widths x rounds buckets x 3 products */
		struct gshape c = {8, 64, i % 2 ? 104 : 96, {0}};
		for (int e = 0; e < c.E; e++)
			c.rows[e] = (1 << (i / 2)) + e;
		gin_make(&c, &h);
		gemm_run(be, &c, &h, 0, 0, &other);
		gres_free(&other), gin_free(&h);
	}
	struct gshape near_s = *s; /* the same buckets, other counts */
	for (int e = 0; e < s->E; e++)
		near_s.rows[e] -= near_s.rows[e] > 33;
	gin_make(&near_s, &h);
	gemm_run(be, &near_s, &h, 0, 0, &other);
	gres_free(&other), gin_free(&h);
	gemm_run(be, s, &g, 0, 0, &again);
	unsetenv("ASYNCPP_MOE_GEMM");
	CHECK_MSG(gres_same(&first, &again, s, g.R),
		  "the experts' loop gives other bits after other shapes");
	gres_free(&first), gres_free(&again);
	gin_free(&g);
}

static void loop_bits_cuda(int dtype)
{
	const struct backend *cu = cuda_gemm_or_skip(dtype);
	if (cu)
		loop_bits_ignore_history(cu, 13); /* row counts up to 4103 */
}

TEST(cuda_moe_expert_loop_bits_ignore_history_f32)
{
	loop_bits_cuda(ACT_F32);
}

TEST(cuda_moe_expert_loop_bits_ignore_history_bf16)
{
	loop_bits_cuda(ACT_BF16);
}

TEST(cuda_moe_expert_loop_bits_harness_on_cpu)
{
	loop_bits_ignore_history(&backend_cpu, 3);
}

/* The CPU's ops against the reference, and the CUDA checks' harness (split,
 * repeat, offsets; the CPU has no ASYNCPP_MOE_GEMM, so "loop" is itself),
 * in every run. */
TEST(cuda_moe_expert_gemm_harness_on_cpu)
{
	compare_gemm(&backend_cpu, 1e-5, 1);
	compare_gemm(&backend_cpu_bf16, 1e-2, 1);
}

/* ---- the experts in the matrix optimizers ----
 *
 * Muon and NorMuon over an MoE model's table (2 layers of 4 experts and a
 * shared expert): the experts' matrices, E tensors of one shape, go
 * through newton_schulz_many together (CUDA: one strided-batched GEMM per
 * product), and two steps give every weight the bits of the per-tensor
 * path (optim_ns_batch_limit(1)), which test_optim's
 * matrix_optimizers_take_each_expert_on_its_own shows is each expert's
 * matrix on its own. */
static void experts_ns(const struct backend *be)
{
	static const char *const names[] = {"muon", "normuon"};
	struct model_config mc = {0};
	struct model m;

	mc.arch = ARCH_LLAMA, mc.V = 64, mc.L = 2, mc.C = 16, mc.NH = 2, mc.T = 8;
	mc.E = 4, mc.K = 2, mc.De = 12, mc.shared = 1;
	CHECK(model_init(&m, &mc) == 0);
	struct stage_param *sp = xcalloc((size_t)m.n_params, sizeof(*sp));
	for (int i = 0; i < m.n_params; i++) {
		sp[i].global = i;
		sp[i].offset = m.params[i].offset;
	}
	size_t bytes = m.numel * sizeof(float);
	float *hg = xmalloc(2 * bytes), *u[2] = {xmalloc(bytes), xmalloc(bytes)};
	frand(hg, 2 * m.numel, 41, 1.0f);
	for (size_t k = 0; k < sizeof(names) / sizeof(names[0]) && !test_failed(); k++) {
		for (int batched = 0; batched < 2; batched++) {
			struct config cfg;
			struct optimizer o;
			config_defaults(&cfg);
			CHECK(config_set_key(&cfg, "optim", "name", names[k], "test") == 0);
			size_t limit = batched ? 0 : optim_ns_batch_limit(1);
			CHECK(optim_init(&o, be, &cfg, &m, sp, m.n_params, m.numel) == 0);
			if (!batched)
				optim_ns_batch_limit(limit);
			int experts = 0, in_batch = 0;
			for (int t = 0; t < o.n; t++)
				if (strstr(o.t[t].info.name, "experts.")) {
					experts++;
					in_batch += o.t[t].ns_batch;
				}
			CHECK_MSG(experts == mc.L * mc.E * 2, "%s: %d expert tensors", names[k],
				  experts);
			if (batched && be->newton_schulz_many)
				CHECK_MSG(in_batch == experts, "%s: %d of %d experts batched",
					  names[k], in_batch, experts);
			float *w = be->alloc(bytes), *g = be->alloc(bytes);
			be->to_device(g, hg, bytes);
			optim_step(&o, w, g, 0.02f, 1);
			be->to_device(g, hg + m.numel, bytes);
			optim_step(&o, w, g, 0.02f, 2);
			be->synchronize();
			be->to_host(u[batched], w, bytes);
			be->free(w), be->free(g);
			optim_free(&o);
			config_free(&cfg);
		}
		CHECK_MSG(!memcmp(u[0], u[1], bytes),
			  "%s: the batched Newton-Schulz gives other bits than per tensor",
			  names[k]);
	}
	free(hg), free(u[0]), free(u[1]), free(sp);
	model_free(&m);
}

TEST(cuda_moe_experts_batched_newton_schulz)
{
	char why[256];
	const struct backend *cu = cuda_or_skip(ACT_F32, why, sizeof(why));

	if (!cu) {
		test_skip(why);
		return;
	}
	experts_ns(cu);
}

TEST(cuda_moe_experts_ns_harness_on_cpu)
{
	experts_ns(&backend_cpu);
}

/* The harness on the CPU against itself, in every run: the chain, the
 * transfers and the checks work (and the CPU's ops repeat bit for bit). */
TEST(cuda_moe_ops_harness_on_cpu)
{
	compare(&backend_cpu, &backend_cpu, ACT_F32);
	compare(&backend_cpu_bf16, &backend_cpu_bf16, ACT_BF16);
}
