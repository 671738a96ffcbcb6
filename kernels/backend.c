/* backend.c - choosing a backend by name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/util.h"
#include "backend.h"

#ifndef ASYNCPP_CUDA
const struct backend *backend_cuda(void) { return NULL; }
const struct backend *backend_cuda_bf16(void) { return NULL; }
int cuda_available(char *why, size_t why_len)
{
	snprintf(why, why_len, "this asyncpp was built without CUDA (rebuild with nvcc on PATH)");
	return 0;
}
int cuda_select_device(int index, char *why, size_t why_len)
{
	(void)index;
	return cuda_available(why, why_len);
}
#endif

int device_index_from_name(const char *name)
{
	if (!strcmp(name, "cuda"))
		return -1;
	if (strncmp(name, "cuda:", 5))
		return -2;
	size_t digits = strspn(name + 5, "0123456789");
	if (digits < 1 || digits > 4 || name[5 + digits])
		return -2;
	return atoi(name + 5);
}

const struct backend *backend_by_name(const char *name)
{
	if (!strcmp(name, "cpu"))
		return &backend_cpu;
	int index = device_index_from_name(name);
	if (index == -2) {
		error("unknown device '%s' (expected cpu, cuda or cuda:N)", name);
		return NULL;
	}
	char why[256] = "";
	if (!backend_cuda())
		cuda_available(why, sizeof(why)); /* says why: built without CUDA */
	else if (cuda_select_device(index, why, sizeof(why)) && cuda_available(why, sizeof(why)))
		return backend_cuda();
	error("device '%s' cannot be served: %s; use --device cpu", name, why);
	return NULL;
}

size_t scratch_floats_aligned(size_t n)
{
	return st_add(n, 63) & ~(size_t)63;
}

size_t newton_schulz_scratch(int rows, int cols)
{
	/* X (m x n), A = X X^T (m x m), B = b*A + c*A*A (m x m), B*X (m x n),
	 * with m = min(rows, cols), n = max(rows, cols) */
	size_t m = (size_t)MIN(rows, cols), n = (size_t)MAX(rows, cols);
	return 2 * m * n + 3 * m * m;
}

size_t newton_schulz_many_scratch(int count, int rows, int cols)
{
	/* each matrix's slices padded to 256 bytes (the CUDA batch strides) */
	return st_mult((size_t)(count > 0 ? count : 0),
		       st_add(newton_schulz_scratch(rows, cols), 256));
}

const struct backend *backend_with_act_dtype(const struct backend *be, int dtype)
{
	if (be->act_dtype == dtype)
		return be;
	if (be == &backend_cpu || be == &backend_cpu_bf16)
		return dtype == ACT_BF16 ? &backend_cpu_bf16 : &backend_cpu;
	if (backend_cuda() && (be == backend_cuda() || be == backend_cuda_bf16()))
		return dtype == ACT_BF16 ? backend_cuda_bf16() : backend_cuda();
	error("train.act_dtype = %s: the %s backend stores activations as %s only",
	      act_dtype_name(dtype), be->name, act_dtype_name(be->act_dtype));
	return NULL;
}

int backend_lane_count(const struct backend *be)
{
	return be->lanes ? be->lanes() : 1;
}

/* the lane this thread bound last through these helpers */
static _Thread_local int bound_lane;

void backend_lane_bind(const struct backend *be, int lane)
{
	if (backend_lane_count(be) > 1) {
		be->lane_bind(lane);
		bound_lane = lane;
	}
}

int backend_lane_current(const struct backend *be)
{
	(void)be;
	return bound_lane;
}

int backend_lane_enter(const struct backend *be, int lane)
{
	int before = bound_lane;
	backend_lane_bind(be, lane);
	return before;
}

int backend_same_device(const struct backend *be, int a, int b)
{
	return backend_lane_count(be) <= 1 || be->lane_device(a) == be->lane_device(b);
}

void *backend_fence(const struct backend *be)
{
	return backend_lane_count(be) > 1 ? be->fence_new() : NULL;
}

void backend_fence_take(const struct backend *be, void *fence)
{
	if (!fence)
		return;
	be->fence_wait(fence);
	be->fence_free(fence);
}
