/* tests/split_ops.h - the backend ops the split backward calls in parts
 * (model.h: stage_backward_input / stage_backward_weight; backend.h: a
 * NULL output is skipped), each part against the one call with every
 * output, on any table: the same bits. Shared by test_backward_split
 * (the CPU tables, or ASYNCPP_TEST_DEVICE's) and test_cuda_ops (both CUDA
 * tables). Header-only (each test file is its own program). */
#ifndef ASYNCPP_TESTS_SPLIT_OPS_H
#define ASYNCPP_TESTS_SPLIT_OPS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/util.h"
#include "../kernels/backend.h"

/* n floats of s * N(0,1) in t's memory */
static inline float *split_ops_randn(const struct backend *t, size_t n, float s, uint64_t *r)
{
	float *h = xmalloc(st_mult(n ? n : 1, sizeof(float)));
	float *d = t->alloc(st_mult(n ? n : 1, sizeof(float)));
	for (size_t i = 0; i < n; i++)
		h[i] = s * rng_normal(r);
	t->to_device(d, h, n * sizeof(float));
	free(h);
	return d;
}

/* the same as activations of t's act_dtype */
static inline void *split_ops_acts(const struct backend *t, size_t n, float s, uint64_t *r)
{
	float *f = split_ops_randn(t, n, s, r);
	void *a = t->alloc(st_mult(n ? n : 1, act_size(t)));
	t->act_from_f32(a, f, n);
	t->free(f);
	return a;
}

/* a copy of n bytes of t's memory */
static inline void *split_ops_dup(const struct backend *t, const void *p, size_t bytes)
{
	void *d = t->alloc(bytes);
	t->copy(d, p, bytes);
	return d;
}

/* whether n bytes at a and b (t's memory) are the same */
static inline int split_ops_same(const struct backend *t, const void *a, const void *b,
				 size_t bytes)
{
	char *x = xmalloc(bytes), *y = xmalloc(bytes);
	t->to_host(x, a, bytes);
	t->to_host(y, b, bytes);
	int same = !memcmp(x, y, bytes);
	free(x);
	free(y);
	return same;
}

/* Every split op of t at N rows, C inputs, OC outputs: NULL when each part
 * gave the fused call's bits, else what differed (a static string). */
static inline const char *split_ops_check(const struct backend *t, int N, int C, int OC,
					  uint64_t seed)
{
	uint64_t r = seed;
	size_t A = act_size(t), nc = (size_t)N * C, no = (size_t)N * OC;
	const char *bad = NULL;
	void *inp = split_ops_acts(t, nc, 1.0f, &r), *dout = split_ops_acts(t, no, 0.5f, &r);
	void *dnc = split_ops_acts(t, nc, 0.5f, &r); /* a norm's dout */
	void *pre = split_ops_acts(t, nc, 1.0f, &r); /* gelu's input (dgelu: [N,C]) */
	float *w = split_ops_randn(t, (size_t)OC * C, 0.2f, &r);
	float *nw = split_ops_randn(t, (size_t)C, 1.0f, &r), *nb = split_ops_randn(t, C, 0.1f, &r);
	/* gradients from earlier micro-batches: += must show */
	float *dw0 = split_ops_randn(t, (size_t)OC * C, 0.1f, &r);
	float *db0 = split_ops_randn(t, (size_t)(OC > C ? OC : C), 0.1f, &r);
	float *mean = t->alloc(N * sizeof(float)), *rstd = t->alloc(N * sizeof(float));
	void *lnout = t->alloc(nc * A);
	size_t wb = (size_t)OC * C * sizeof(float), bb = (size_t)(OC > C ? OC : C) * sizeof(float);
	void *dinp1 = t->alloc(nc * A), *dinp2 = t->alloc(nc * A);
	float *dw1 = split_ops_dup(t, dw0, wb), *dw2 = split_ops_dup(t, dw0, wb);
	float *db1 = split_ops_dup(t, db0, bb), *db2 = split_ops_dup(t, db0, bb);

#define SPLIT_OPS_RESET()                                  \
	do {                                               \
		t->copy(dw1, dw0, wb);                     \
		t->copy(dw2, dw0, wb);                     \
		t->copy(db1, db0, bb);                     \
		t->copy(db2, db0, bb);                     \
	} while (0)
#define SPLIT_OPS_SAME(what, nbytes_in, nbytes_w, nbytes_b)                                    \
	do {                                                                                   \
		if (!bad && !split_ops_same(t, dinp1, dinp2, nbytes_in))                       \
			bad = what ": the input gradient";                                    \
		if (!bad && !split_ops_same(t, dw1, dw2, nbytes_w))                            \
			bad = what ": the weight gradient";                                   \
		if (!bad && !split_ops_same(t, db1, db2, nbytes_b))                            \
			bad = what ": the bias gradient";                                     \
	} while (0)

	/* matmul_backward: dinp alone, then dw and dbias alone (w not read) */
	SPLIT_OPS_RESET();
	t->matmul_backward(dinp1, dw1, db1, dout, inp, w, N, C, OC);
	t->matmul_backward(dinp2, NULL, NULL, dout, inp, w, N, C, OC);
	t->matmul_backward(NULL, dw2, db2, dout, inp, NULL, N, C, OC);
	SPLIT_OPS_SAME("matmul_backward", nc * A, wb, (size_t)OC * sizeof(float));

	/* the norms: dinp alone, then dw (db) alone (w not read) */
	t->layernorm_forward(lnout, mean, rstd, inp, nw, nb, N, C, 1e-5f);
	SPLIT_OPS_RESET();
	t->layernorm_backward(dinp1, dw1, db1, dnc, inp, nw, mean, rstd, N, C);
	t->layernorm_backward(dinp2, NULL, NULL, dnc, inp, nw, mean, rstd, N, C);
	t->layernorm_backward(NULL, dw2, db2, dnc, inp, NULL, mean, rstd, N, C);
	SPLIT_OPS_SAME("layernorm_backward", nc * A, C * sizeof(float), C * sizeof(float));

	t->rmsnorm_forward(lnout, rstd, inp, nw, N, C, 1e-5f);
	SPLIT_OPS_RESET();
	t->rmsnorm_backward(dinp1, dw1, dnc, inp, nw, rstd, N, C);
	t->rmsnorm_backward(dinp2, NULL, dnc, inp, nw, rstd, N, C);
	t->rmsnorm_backward(NULL, dw2, dnc, inp, NULL, rstd, N, C);
	SPLIT_OPS_SAME("rmsnorm_backward", nc * A, C * sizeof(float), 0);

	/* the fused residual form (B) with the plain norm's weight part (W):
	 * what the model calls when the backend fuses */
	for (int ln = 0; ln < 2 && t->norm_backward_add && !bad; ln++) {
		if (ln)
			t->layernorm_forward(lnout, mean, rstd, inp, nw, nb, N, C, 1e-5f);
		else
			t->rmsnorm_forward(lnout, rstd, inp, nw, N, C, 1e-5f);
		SPLIT_OPS_RESET();
		t->copy(dinp1, pre, nc * A); /* the accumulator */
		t->copy(dinp2, pre, nc * A);
		t->norm_backward_add(dinp1, dw1, ln ? db1 : NULL, dnc, inp, nw, ln ? mean : NULL,
				     rstd, N, C, ln);
		t->norm_backward_add(dinp2, NULL, NULL, dnc, inp, nw, ln ? mean : NULL, rstd, N, C,
				     ln);
		if (ln)
			t->layernorm_backward(NULL, dw2, db2, dnc, inp, NULL, mean, rstd, N, C);
		else
			t->rmsnorm_backward(NULL, dw2, dnc, inp, NULL, rstd, N, C);
		SPLIT_OPS_SAME(ln ? "norm_backward_add (layernorm)" : "norm_backward_add (rmsnorm)",
			       nc * A, C * sizeof(float), C * sizeof(float));
	}

	/* the GELU product's backward (B) with matmul_backward's weight part */
	if (t->matmul_backward_dgelu && !bad) {
		SPLIT_OPS_RESET();
		t->matmul_backward_dgelu(dinp1, dw1, db1, dout, inp, w, pre, N, C, OC);
		t->matmul_backward_dgelu(dinp2, NULL, NULL, dout, inp, w, pre, N, C, OC);
		t->matmul_backward(NULL, dw2, db2, dout, inp, NULL, N, C, OC);
		SPLIT_OPS_SAME("matmul_backward_dgelu", nc * A, wb, (size_t)OC * sizeof(float));
	}
#undef SPLIT_OPS_RESET
#undef SPLIT_OPS_SAME

	void *bufs[] = {inp, dout, dnc, pre, w, nw, nb, dw0, db0, mean, rstd, lnout,
			dinp1, dinp2, dw1, dw2, db1, db2};
	for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
		t->free(bufs[i]);
	return bad;
}

#endif
