/* cpu_matmul.c - matrix products through OpenBLAS.
 *
 * Legend: N rows (B*T), C input channels, OC output channels.
 * OpenBLAS splits an sgemm over M and N between its threads, never over K,
 * so each output element is summed in the same order on any thread count
 * (test_kernels_cpu checks this bit for bit).
 */
#include <cblas.h>

#include "cpu.h"

/* out[N,OC] = inp[N,C] @ w[OC,C]^T + bias[OC] */
void cpu_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
			int N, int C, int OC)
{
	float beta = 0.0f;

	if (bias) {
#pragma omp parallel for num_threads(cpu_threads()) if ((size_t)N * OC >= CPU_PAR_MIN)
		for (int n = 0; n < N; n++) {
			float *o = out + (size_t)n * OC;
			for (int c = 0; c < OC; c++)
				o[c] = bias[c];
		}
		beta = 1.0f;
	}
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C,
		    beta, out, OC);
}

/* dinp[N,C] = dout[N,OC] @ w[OC,C] (skipped when dinp is NULL);
 * dw[OC,C] += dout^T @ inp[N,C]; dbias[OC] += column sums of dout */
void cpu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
			 const float *inp, const float *w, int N, int C, int OC)
{
	if (dinp)
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout,
			    OC, w, C, 0.0f, dinp, C);
	if (dw)
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC,
			    inp, C, 1.0f, dw, C);
	if (dbias)
		cpu_colsum_acc(dbias, dout, N, OC);
}
