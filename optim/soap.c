/* soap.c - SOAP's direction for one matrix; see soap.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../io/util.h"
#include "../kernels/cpu/cpu.h"
#include "linalg.h"
#include "soap.h"

size_t soap_work_floats(int rows, int cols)
{
	return st_mult(3, scratch_floats_aligned(st_mult((size_t)rows, (size_t)cols)));
}

/* out[m,n] = QL^T x QR (rotate) or QL x QR^T (back), either basis may be
 * absent (identity); tmp[m,n] scratch. */
static void change_basis(const struct backend *be, float *out, const float *x, float *tmp,
			 const float *ql, const float *qr, int m, int n, int back)
{
	size_t bytes = (size_t)m * n * sizeof(float);
	const float *left = x;
	if (ql) {
		be->gemm(tmp, ql, x, m, n, m, !back, 0, 1.0f, 0.0f);
		left = tmp;
	}
	if (qr)
		be->gemm(out, left, qr, m, n, n, 0, back, 1.0f, 0.0f);
	else if (left != out)
		be->copy(out, left, bytes);
}

/* L = b L + (1-b) G G^T and R = b R + (1-b) G^T G */
static void update_factors(const struct backend *be, const struct soap_state *st,
			   const float *g, int m, int n, float b)
{
	if (st->l)
		be->gemm(st->l, g, g, m, m, n, 0, 1, 1.0f - b, b);
	if (st->r)
		be->gemm(st->r, g, g, n, n, m, 1, 0, 1.0f - b, b);
}

static double *to_host_double(const struct backend *be, const float *x, size_t n)
{
	float *f = xmalloc(st_mult(n, sizeof(float)));
	double *d = xmalloc(st_mult(n, sizeof(double)));
	be->to_host(f, x, n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		d[i] = f[i];
	free(f);
	return d;
}

static void to_device_float(const struct backend *be, float *dst, const double *x, size_t n)
{
	float *f = xmalloc(st_mult(n, sizeof(float)));
	for (size_t i = 0; i < n; i++)
		f[i] = (float)x[i];
	be->to_device(dst, f, n * sizeof(float));
	free(f);
}

/* q[k,k] = the eigenbasis of p[k,k] (descending) */
static void eigenbasis(const struct backend *be, float *q, const float *p, int k)
{
	size_t kk = (size_t)k * k;
	double *a = to_host_double(be, p, kk), *w = xmalloc(st_mult((size_t)k, sizeof(double)));
	if (linalg_eigh_desc(a, w, k))
		die("SOAP: the eigendecomposition of a %dx%d factor failed (LAPACK dsyevd); the "
		    "gradients are probably not finite", k, k);
	to_device_float(be, q, a, kk);
	free(a);
	free(w);
}

static float *to_host_float(const struct backend *be, const float *x, size_t n)
{
	float *f = xmalloc(st_mult(n, sizeof(float)));
	be->to_host(f, x, n * sizeof(float));
	return f;
}

/* One power step of a side's basis Q[k,k] against its factor P[k,k], on
 * the host: Q's columns ordered by descending estimated eigenvalue
 * q_c^T P q_c (order[k] gets the permutation, for v), then Q = qr(P Q). In
 * single precision, as the reference implementation does it (the first
 * eigenbasis, eigenbasis() above, is double). 0, or -1 when LAPACK fails. */
static int power_step(const float *P, float *Q, int k, int *order)
{
	size_t kk = (size_t)k * k;
	float *PQ = xmalloc(st_mult(kk, sizeof(float)));
	double *est = xmalloc(st_mult((size_t)k, sizeof(double)));
	linalg_matmul_f(PQ, P, Q, k);
	for (int c = 0; c < k; c++) { /* est[c] = Q[:,c] . (P Q)[:,c] */
		double s = 0.0;
		for (int i = 0; i < k; i++)
			s += (double)Q[(size_t)i * k + c] * PQ[(size_t)i * k + c];
		est[c] = s;
		order[c] = c;
	}
	/* stable insertion sort, descending: bases mostly stay in order */
	for (int i = 1; i < k; i++) {
		int o = order[i], j = i;
		while (j > 0 && est[order[j - 1]] < est[o]) {
			order[j] = order[j - 1];
			j--;
		}
		order[j] = o;
	}
	/* P Q[:, order] = (P Q)[:, order]; its Q factor is the new basis */
	for (int i = 0; i < k; i++)
		for (int c = 0; c < k; c++)
			Q[(size_t)i * k + c] = PQ[(size_t)i * k + order[c]];
	free(PQ);
	free(est);
	return linalg_qr_q_f(Q, k);
}

/* Refresh both bases (each side that has one) and reorder v[m,n] with
 * them. The two sides' power steps are independent: they run at once on
 * two threads, each LAPACK call on one thread, so the bits are the same
 * for any thread count. */
static void refresh_bases(const struct backend *be, const struct soap_state *st, int m, int n)
{
	struct {
		float *qd;
		const float *pd;
		int k;
		float *P, *Q;
		int *order;
		int failed;
	} side[2] = {{st->ql, st->l, m, NULL, NULL, NULL, 0}, {st->qr, st->r, n, NULL, NULL, NULL, 0}};
	for (int x = 0; x < 2; x++)
		if (side[x].qd) {
			size_t kk = (size_t)side[x].k * side[x].k;
			side[x].P = to_host_float(be, side[x].pd, kk);
			side[x].Q = to_host_float(be, side[x].qd, kk);
			side[x].order = xmalloc(st_mult((size_t)side[x].k, sizeof(int)));
		}
	int both = side[0].qd && side[1].qd;
#pragma omp parallel for num_threads(2) if (both && cpu_threads() > 1)
	for (int x = 0; x < 2; x++)
		if (side[x].qd)
			side[x].failed = power_step(side[x].P, side[x].Q, side[x].k, side[x].order);
	size_t mn = (size_t)m * n;
	float *v = to_host_float(be, st->v, mn), *vs = xmalloc(st_mult(mn, sizeof(float)));
	for (int i = 0; i < m; i++) /* v in the reordered bases: rows, then columns */
		for (int j = 0; j < n; j++)
			vs[(size_t)i * n + j] = v[(size_t)(side[0].qd ? side[0].order[i] : i) * n +
						  (side[1].qd ? side[1].order[j] : j)];
	be->to_device(st->v, vs, mn * sizeof(float));
	for (int x = 0; x < 2; x++)
		if (side[x].qd) {
			if (side[x].failed)
				die("SOAP: the QR factorisation of a %dx%d basis failed (LAPACK "
				    "sgeqrf)", side[x].k, side[x].k);
			be->to_device(side[x].qd, side[x].Q, (size_t)side[x].k * side[x].k * sizeof(float));
			free(side[x].P);
			free(side[x].Q);
			free(side[x].order);
		}
	free(v);
	free(vs);
}

void soap_direction(const struct backend *be, const struct soap_state *st, float *u,
		    const float *g, float *work, int rows, int cols, float lr, long step,
		    float beta1, float beta2, float eps, long every)
{
	int m = rows, n = cols;
	size_t mn = (size_t)m * n;
	if (step <= 1) {
		update_factors(be, st, g, m, n, beta2);
		if (st->ql)
			eigenbasis(be, st->ql, st->l, m);
		if (st->qr)
			eigenbasis(be, st->qr, st->r, n);
		be->zero(u, mn * sizeof(float));
		return;
	}
	long s = step - 1;
	size_t slice = scratch_floats_aligned(mn); /* keeps each slice 256-byte aligned */
	float *gr = work, *out = work + slice, *tmp = work + 2 * slice;
	change_basis(be, gr, g, tmp, st->ql, st->qr, m, n, 0);
	be->ema(st->m, gr, mn, beta1); /* m is kept in the rotated space */
	be->soap_adam(out, st->m, gr, st->v, mn, beta2, eps);
	change_basis(be, u, out, tmp, st->ql, st->qr, m, n, 1);
	double bc1 = 1.0 - pow((double)beta1, (double)s), bc2 = 1.0 - pow((double)beta2, (double)s);
	be->scale(u, (float)(-lr * sqrt(bc2) / bc1), mn);
	update_factors(be, st, g, m, n, beta2);
	if (every > 0 && s % every == 0 && (st->ql || st->qr)) {
		/* m back to the original space, the bases refreshed (v reordered
		 * with them), then m into the new bases */
		change_basis(be, out, st->m, tmp, st->ql, st->qr, m, n, 1);
		refresh_bases(be, st, m, n);
		change_basis(be, st->m, out, tmp, st->ql, st->qr, m, n, 0);
	}
}
