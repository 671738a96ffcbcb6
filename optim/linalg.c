/* linalg.c - see linalg.h. LAPACK works column-major: a symmetric matrix is
 * its own transpose, but the results (eigenvectors, Q) are transposed back
 * into row-major here. */
#include <stddef.h>
#include <stdlib.h>

#include "../io/util.h"
#include "../kernels/cpu/cpu.h"
#include "linalg.h"

/* LAPACK (Fortran calling convention: every argument by pointer; character
 * arguments followed by their hidden lengths) */
void dsyevd_(const char *jobz, const char *uplo, const int *n, double *a, const int *lda,
	     double *w, double *work, const int *lwork, int *iwork, const int *liwork, int *info,
	     size_t jobz_len, size_t uplo_len);
void sgeqrf_(const int *m, const int *n, float *a, const int *lda, float *tau, float *work,
	     const int *lwork, int *info);
void sorgqr_(const int *m, const int *n, const int *k, float *a, const int *lda,
	     const float *tau, float *work, const int *lwork, int *info);
void sgemm_(const char *ta, const char *tb, const int *m, const int *n, const int *k,
	    const float *alpha, const float *a, const int *lda, const float *b, const int *ldb,
	    const float *beta, float *c, const int *ldc, size_t ta_len, size_t tb_len);

int linalg_eigh_desc(double *a, double *w, int n)
{
	cpu_blas_init(); /* OpenBLAS on one thread: the same bits on any machine */
	/* divide and conquer (dsyevd): several times faster than dsyev at the
	 * sizes of hidden matrices */
	int info = 0, lwork = -1, liwork = -1, iq;
	double q;
	dsyevd_("V", "U", &n, a, &n, w, &q, &lwork, &iq, &liwork, &info, 1, 1); /* sizes */
	if (info)
		return -1;
	lwork = (int)q;
	liwork = iq;
	double *work = xmalloc(st_mult((size_t)(lwork > 1 ? lwork : 1), sizeof(double)));
	int *iwork = xmalloc(st_mult((size_t)(liwork > 1 ? liwork : 1), sizeof(int)));
	dsyevd_("V", "U", &n, a, &n, w, work, &lwork, iwork, &liwork, &info, 1, 1);
	free(work);
	free(iwork);
	if (info)
		return -1;
	/* column-major: a[j*n + i] is element i of eigenvector j (ascending);
	 * row-major with eigenvectors as columns, descending, wants
	 * out[i*n + c] = element i of eigenvector n-1-c */
	double *out = xmalloc(st_mult(st_mult((size_t)n, (size_t)n), sizeof(double)));
	for (int i = 0; i < n; i++)
		for (int c = 0; c < n; c++)
			out[(size_t)i * n + c] = a[(size_t)(n - 1 - c) * n + i];
	for (size_t i = 0; i < (size_t)n * n; i++)
		a[i] = out[i];
	for (int i = 0; i < n / 2; i++) {
		double t = w[i];
		w[i] = w[n - 1 - i];
		w[n - 1 - i] = t;
	}
	free(out);
	return 0;
}

void linalg_matmul_f(float *c, const float *a, const float *b, int n)
{
	cpu_blas_init();
	const float one = 1.0f, zero = 0.0f;
	sgemm_("N", "N", &n, &n, &n, &one, b, &n, a, &n, &zero, c, &n, 1, 1);
}

static void transpose_f(float *a, int n)
{
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++) {
			float t = a[(size_t)i * n + j];
			a[(size_t)i * n + j] = a[(size_t)j * n + i];
			a[(size_t)j * n + i] = t;
		}
}

int linalg_qr_q_f(float *a, int n)
{
	cpu_blas_init();
	int info = 0, lwork = -1;
	float q;
	float *tau = xmalloc(st_mult((size_t)(n > 0 ? n : 1), sizeof(float)));
	transpose_f(a, n); /* to column-major */
	sgeqrf_(&n, &n, a, &n, tau, &q, &lwork, &info);
	lwork = (int)q;
	float *work = NULL;
	if (!info) {
		work = xmalloc(st_mult((size_t)(lwork > n ? lwork : n), sizeof(float)));
		sgeqrf_(&n, &n, a, &n, tau, work, &lwork, &info);
	}
	if (!info) {
		lwork = lwork > n ? lwork : n;
		sorgqr_(&n, &n, &n, a, &n, tau, work, &lwork, &info);
	}
	free(work);
	free(tau);
	transpose_f(a, n);
	return info ? -1 : 0;
}
