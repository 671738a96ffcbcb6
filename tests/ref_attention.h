/* ref_attention.h - causal grouped-query attention in double, the textbook
 * formula, for tests: test_cuda_ops compares both CUDA attentions with it,
 * and kernels/cuda/dev/flash_emulate.cpp the emulated flash kernels. Static
 * functions, valid C and C++; the loops run in parallel under OpenMP.
 * Layouts of kernels/backend.h: qkv[B*T, QKV], out and dout[B*T, NH*HD],
 * lse[B, NH, T]. */
#ifndef ASYNCPP_TESTS_REF_ATTENTION_H
#define ASYNCPP_TESTS_REF_ATTENTION_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Row t of sequence b of a [B*T, width] tensor, from column off. */
static const float *row_at(const float *x, int b, int t, int T, int width, int off)
{
	return x + ((size_t)b * T + t) * width + off;
}

static double ddot(const float *a, const float *b, int n)
{
	double s = 0;
	for (int i = 0; i < n; i++)
		s += (double)a[i] * b[i];
	return s;
}

/* p[0..i] = softmax of query i's scaled scores against keys 0..i of kv head
 * kvh; returns the log-sum-exp. q[HD]; qkv[B*T, QKV]. */
static double ref_probs(double *p, const float *q, const float *qkv, int b, int i, int T,
			int QKV, int koff, int HD)
{
	double scale = 1.0 / sqrt((double)HD), m = -INFINITY, z = 0;
	for (int j = 0; j <= i; j++) {
		p[j] = scale * ddot(q, row_at(qkv, b, j, T, QKV, koff), HD);
		m = fmax(m, p[j]);
	}
	for (int j = 0; j <= i; j++)
		z += exp(p[j] - m);
	for (int j = 0; j <= i; j++)
		p[j] = exp(p[j] - m) / z;
	return m + log(z);
}

/* Causal attention in double, the textbook formula: out[N, NH*HD],
 * lse[B, NH, T] from qkv[N, QKV] (layout of backend.h). */
static void ref_attention_forward(double *out, double *lse, const float *qkv, int B, int T,
				  int NH, int NKV, int HD)
{
	int QKV = (NH + 2 * NKV) * HD, C = NH * HD, G = NH / NKV;

#pragma omp parallel for collapse(2) schedule(dynamic)
	for (int b = 0; b < B; b++)
		for (int h = 0; h < NH; h++) {
			int koff = (NH + h / G) * HD, voff = (NH + NKV + h / G) * HD;
			double *p = (double *)calloc((size_t)T + 1, sizeof(double));
			for (int i = 0; i < T; i++) {
				const float *q = row_at(qkv, b, i, T, QKV, h * HD);
				double *o = out + ((size_t)b * T + i) * C + (size_t)h * HD;
				lse[((size_t)b * NH + h) * T + i] =
					ref_probs(p, q, qkv, b, i, T, QKV, koff, HD);
				for (int e = 0; e < HD; e++)
					o[e] = 0;
				for (int j = 0; j <= i; j++) {
					const float *v = row_at(qkv, b, j, T, QKV, voff);
					for (int e = 0; e < HD; e++)
						o[e] += p[j] * v[e];
				}
			}
			free(p);
		}
}

/* dqkv[N, QKV] (zeroed first) of L = sum(out * dout), dout[N, NH*HD]:
 *   dv_j = sum_i p_ij dout_i,  ds_ij = p_ij (dout_i.v_j - sum_k p_ik dout_i.v_k),
 *   dq_i = scale sum_j ds_ij k_j,  dk_j = scale sum_i ds_ij q_i.
 * One (b, kv head) per iteration owns its dk, dv columns and the dq columns
 * of its query heads, so the parallel loop has no shared writes. */
static void ref_attention_backward(double *dqkv, const float *dout, const float *qkv, int B,
				   int T, int NH, int NKV, int HD)
{
	int QKV = (NH + 2 * NKV) * HD, C = NH * HD, G = NH / NKV;
	double scale = 1.0 / sqrt((double)HD);

	memset(dqkv, 0, (size_t)B * T * QKV * sizeof(double));
#pragma omp parallel for collapse(2) schedule(dynamic)
	for (int b = 0; b < B; b++)
		for (int kvh = 0; kvh < NKV; kvh++) {
			int koff = (NH + kvh) * HD, voff = (NH + NKV + kvh) * HD;
			double *p = (double *)calloc((size_t)T + 1, sizeof(double));
			double *dp = (double *)calloc((size_t)T + 1, sizeof(double));
			for (int h = kvh * G; h < (kvh + 1) * G; h++)
				for (int i = 0; i < T; i++) {
					const float *q = row_at(qkv, b, i, T, QKV, h * HD);
					const float *go = row_at(dout, b, i, T, C, h * HD);
					double *dq = dqkv + ((size_t)b * T + i) * QKV + (size_t)h * HD;
					double D = 0;
					ref_probs(p, q, qkv, b, i, T, QKV, koff, HD);
					for (int j = 0; j <= i; j++) {
						dp[j] = ddot(go, row_at(qkv, b, j, T, QKV, voff), HD);
						D += p[j] * dp[j];
					}
					for (int j = 0; j <= i; j++) {
						const float *k = row_at(qkv, b, j, T, QKV, koff);
						double ds = p[j] * (dp[j] - D) * scale;
						double *row = dqkv + ((size_t)b * T + j) * QKV;
						for (int e = 0; e < HD; e++) {
							dq[e] += ds * k[e];
							row[koff + e] += ds * q[e];
							row[voff + e] += p[j] * go[e];
						}
					}
				}
			free(p), free(dp);
		}
}

#endif
