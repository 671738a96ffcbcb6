/* linalg.h - small dense linear algebra on the host, for SOAP's eigenbases
 * (LAPACK from OpenBLAS underneath, on one thread: the same bits for any
 * thread count). Matrices are row-major [n, n]. */
#ifndef ASYNCPP_LINALG_H
#define ASYNCPP_LINALG_H

/* a[n,n] symmetric in; out: its eigenvectors as the columns of a, ordered by
 * descending eigenvalue (w[n], descending). 0, or -1 when LAPACK fails. */
int linalg_eigh_desc(double *a, double *w, int n);

/* In single precision (SOAP's refresh, as its reference implementation
 * computes it: float32): */
/* c[n,n] = a[n,n] b[n,n] (c distinct from a and b) */
void linalg_matmul_f(float *c, const float *a, const float *b, int n);
/* a[n,n] in; out: Q of its QR factorisation (Householder, columns of Q
 * orthonormal; a column's sign is LAPACK's). 0, or -1 when LAPACK fails. */
int linalg_qr_q_f(float *a, int n);

#endif
