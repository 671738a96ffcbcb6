/* soap.h - SOAP (Vyas et al. 2024): Adam run in the eigenbasis of
 * Shampoo's preconditioner, for one hidden matrix G[rows, cols].
 *
 * With L = b2 L + (1-b2) G G^T [rows, rows], R = b2 R + (1-b2) G^T G
 * [cols, cols] and their eigenbases QL, QR (columns, descending eigenvalue):
 *   step 1      L, R from G; QL, QR by a symmetric eigendecomposition;
 *               no update (u = 0), as the reference skips it;
 *   step t > 1  with s = t - 1 (the reference's count):
 *               G' = QL^T G QR; m' = b1 m' + (1-b1) G'; v = b2 v + (1-b2) G'^2
 *               (both in the rotated space, as the reference keeps them);
 *               u = -lr sqrt(1-b2^s)/(1-b1^s) * QL (m' / (sqrt(v) + eps)) QR^T;
 *               then L, R from G, and every `every` steps (s % every == 0)
 *               each basis is refreshed by one power step: order its columns
 *               by the estimated eigenvalues diag(Q^T P Q) (descending; v's
 *               rows or columns follow), then Q = qr(P Q); m' is carried
 *               over: back to the original space with the old bases, into
 *               the new ones. (Equal to keeping m in the original space and
 *               rotating it every step, as the paper writes it, with two
 *               products fewer a step.)
 * A side longer than SOAP_MAX_DIM has no factor or basis (NULL): it stays
 * in the original coordinates. The eigendecomposition and QR run on the
 * host in double (linalg.c); the products on the backend (gemm). */
#ifndef ASYNCPP_SOAP_H
#define ASYNCPP_SOAP_H

#include <stddef.h>

#include "../kernels/backend.h"

#define SOAP_MAX_DIM 10000

struct soap_state {
	float *m;      /* [rows, cols] first moment, rotated space */
	float *v;      /* [rows, cols] second moment, rotated space */
	float *l, *r;  /* [rows, rows], [cols, cols] Shampoo factors (or NULL) */
	float *ql, *qr; /* their eigenbases, same shapes (or NULL) */
};

/* Backend floats soap_direction needs in work. */
size_t soap_work_floats(int rows, int cols);
/* u[rows, cols] = SOAP's direction (times -lr) from g, advancing st. */
void soap_direction(const struct backend *be, const struct soap_state *st, float *u,
		    const float *g, float *work, int rows, int cols, float lr, long step,
		    float beta1, float beta2, float eps, long every);

#endif
