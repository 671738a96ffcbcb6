/* cpu_act.c - GELU, SwiGLU, residual add and the softmax cross-entropy loss.
 *
 * Legend: n elements, N rows, F feed-forward width, V vocabulary, Vp padded
 * vocabulary (columns of the logits). Everything here is per element or per
 * row, so any split between threads gives the same bits.
 */
#include <math.h>

#include "cpu.h"
#include "cpu_math.h"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* out[n] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
void cpu_gelu_forward(float *out, const float *inp, size_t n)
{
#pragma omp parallel for simd num_threads(cpu_threads()) if (n >= CPU_PAR_MIN)
	for (size_t i = 0; i < n; i++) {
		float x = inp[i];
		float t = cpu_tanhf(GELU_K * (x + GELU_A * x * x * x));
		out[i] = 0.5f * x * (1.0f + t);
	}
}

/* dinp[n] = gelu'(inp) * dout (overwritten; dinp may alias dout) */
void cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
#pragma omp parallel for simd num_threads(cpu_threads()) if (n >= CPU_PAR_MIN)
	for (size_t i = 0; i < n; i++) {
		float x = inp[i];
		float t = cpu_tanhf(GELU_K * (x + GELU_A * x * x * x));
		float sech2 = 1.0f - t * t;
		float g = 0.5f * (1.0f + t) +
			  0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * GELU_A * x * x);
		dinp[i] = g * dout[i];
	}
}

/* inp[N,2F] = [gate | up]; out[N,F] = silu(gate) * up */
void cpu_swiglu_forward(float *out, const float *inp, int N, int F)
{
#pragma omp parallel for num_threads(cpu_threads()) if ((size_t)N * F >= CPU_PAR_MIN)
	for (int n = 0; n < N; n++) {
		const float *g = inp + (size_t)n * 2 * F, *u = g + F;
		float *o = out + (size_t)n * F;
#pragma omp simd
		for (int i = 0; i < F; i++)
			o[i] = g[i] * cpu_sigmoidf(g[i]) * u[i];
	}
}

/* dinp[N,2F] (overwritten) from dout[N,F] and inp[N,2F] */
void cpu_swiglu_backward(float *dinp, const float *dout, const float *inp, int N, int F)
{
#pragma omp parallel for num_threads(cpu_threads()) if ((size_t)N * F >= CPU_PAR_MIN)
	for (int n = 0; n < N; n++) {
		const float *g = inp + (size_t)n * 2 * F, *u = g + F;
		const float *d = dout + (size_t)n * F;
		float *dg = dinp + (size_t)n * 2 * F, *du = dg + F;
#pragma omp simd
		for (int i = 0; i < F; i++) {
			float gi = g[i], ui = u[i], di = d[i];
			float s = cpu_sigmoidf(gi);
			dg[i] = di * ui * s * (1.0f + gi * (1.0f - s));
			du[i] = di * gi * s;
		}
	}
}

/* out[n] = a[n] + b[n]; out may alias a or b */
void cpu_add(float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for simd num_threads(cpu_threads()) if (n >= CPU_PAR_MIN)
	for (size_t i = 0; i < n; i++)
		out[i] = a[i] + b[i];
}

/* sum of e^(x[c] - m) over c < V: blocks of XB columns summed in float (a
 * vectorised reduction), the block sums added in double, in order. (A double
 * accumulator straight over the floats runs ten times slower.) */
#define XB 256
static double exp_sum(const float *x, int V, float m)
{
	double sum = 0.0;
	for (int c0 = 0; c0 < V; c0 += XB) {
		int c1 = c0 + XB < V ? c0 + XB : V;
		float s = 0.0f;
#pragma omp simd reduction(+ : s)
		for (int c = c0; c < c1; c++)
			s += cpu_expf(x[c] - m);
		sum += s;
	}
	return sum;
}

/* the same, keeping each e^(x[c] - m) in d[c] (d may be x) */
static double exp_store_sum(float *d, const float *x, int V, float m)
{
	double sum = 0.0;
	for (int c0 = 0; c0 < V; c0 += XB) {
		int c1 = c0 + XB < V ? c0 + XB : V;
		float s = 0.0f;
#pragma omp simd reduction(+ : s)
		for (int c = c0; c < c1; c++) {
			float e = cpu_expf(x[c] - m);
			d[c] = e;
			s += e;
		}
		sum += s;
	}
	return sum;
}

/* A target outside [0, V) (see backend.h): < 0 is ignored, loss 0; >= V is
 * a bad input, loss NaN so it shows. The gradient row is 0 either way, and
 * no logit is read (t may lie outside the row). */
static void xent_bad_target(float *loss, float *drow, int t, int Vp)
{
	*loss = t < 0 ? 0.0f : NAN;
	if (drow)
		for (int c = 0; c < Vp; c++)
			drow[c] = 0.0f;
}

/* losses[N] = logsumexp(logits[n,:V]) - logits[n,targets[n]];
 * dlogits[N,Vp] (may alias logits, may be NULL) = (softmax - onehot) * dloss
 * over the first V columns, 0 over the padding. The exponentials are summed
 * in a fixed order (exp_sum). Targets outside [0, V): xent_bad_target. */
void cpu_softmax_xent(float *losses, float *dlogits, const float *logits,
		      const int32_t *targets, int N, int V, int Vp, float dloss)
{
#pragma omp parallel for num_threads(cpu_threads()) if ((size_t)N * V >= CPU_PAR_MIN)
	for (int n = 0; n < N; n++) {
		const float *x = logits + (size_t)n * Vp;
		float *d = dlogits ? dlogits + (size_t)n * Vp : NULL;
		int t = targets[n];
		if (t < 0 || t >= V) {
			xent_bad_target(losses + n, d, t, Vp);
			continue;
		}
		float xt = x[t], m = -INFINITY;
		double sum = 0.0;
#pragma omp simd reduction(max : m)
		for (int c = 0; c < V; c++)
			m = x[c] > m ? x[c] : m;
		/* d and x may be the same row: each column is read before it is
		 * written */
		sum = d ? exp_store_sum(d, x, V, m) : exp_sum(x, V, m);
		losses[n] = (float)(log(sum) + (double)m - (double)xt);
		if (d) {
			float k = (float)(1.0 / sum) * dloss;
#pragma omp simd
			for (int c = 0; c < V; c++)
				d[c] *= k;
			d[t] -= dloss;
			for (int c = V; c < Vp; c++)
				d[c] = 0.0f;
		}
	}
}

/* out[0] = the mean of losses[N], summed in double in index order */
void cpu_loss_mean(float *out, const float *losses, int N)
{
	double sum = 0;
	for (int i = 0; i < N; i++)
		sum += losses[i];
	out[0] = (float)(sum / N);
}
