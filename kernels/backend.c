/* backend.c - choosing a backend by name. */
#include <stdio.h>
#include <string.h>

#include "../io/util.h"
#include "backend.h"

#ifndef ASYNCPP_CUDA
const struct backend *backend_cuda(void) { return NULL; }
int cuda_available(char *why, size_t why_len)
{
	snprintf(why, why_len, "this asyncpp was built without CUDA (rebuild with nvcc on PATH)");
	return 0;
}
#endif

const struct backend *backend_by_name(const char *name)
{
	if (!strcmp(name, "cpu"))
		return &backend_cpu;
	if (!strcmp(name, "cuda")) {
		char why[256];
		if (!backend_cuda() || !cuda_available(why, sizeof(why))) {
			if (!backend_cuda())
				cuda_available(why, sizeof(why));
			error("device 'cuda' cannot be served: %s; use --device cpu", why);
			return NULL;
		}
		return backend_cuda();
	}
	error("unknown device '%s' (expected cpu or cuda)", name);
	return NULL;
}

size_t newton_schulz_scratch(int rows, int cols)
{
	/* X (m x n), A = X X^T (m x m), B = b*A + c*A*A (m x m), B*X (m x n),
	 * with m = min(rows, cols), n = max(rows, cols) */
	size_t m = (size_t)MIN(rows, cols), n = (size_t)MAX(rows, cols);
	return 2 * m * n + 3 * m * m;
}
