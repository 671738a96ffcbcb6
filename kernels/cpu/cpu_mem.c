/* cpu_mem.c - memory, "streams" and thread count of the CPU backend. */
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/util.h"
#include "cpu.h"

/* 0 = not set: use OpenMP's default (OMP_NUM_THREADS or all cores). Shared by
 * every calling thread: omp_set_num_threads() only affects the thread that
 * calls it, and pipeline stages run kernels from threads of their own. */
static atomic_int nthreads;

int cpu_threads(void)
{
	int n = atomic_load_explicit(&nthreads, memory_order_relaxed);
	return n > 0 ? n : omp_get_max_threads();
}

void cpu_set_threads(int n)
{
	if (n <= 0)
		n = omp_get_num_procs();
	atomic_store(&nthreads, n);
	/* OpenBLAS stays on one thread: cpu_gemm spreads tiles over OpenMP */
	cpu_blas_init();
}

void *cpu_alloc(size_t bytes)
{
	void *p = NULL;
	size_t rounded = bytes ? (bytes + 63) / 64 * 64 : 64;

	if (rounded < bytes || posix_memalign(&p, 64, rounded)) {
		error("cpu backend: cannot allocate %zu bytes", bytes);
		return NULL;
	}
	memset(p, 0, rounded);
	return p;
}

void cpu_free(void *p)
{
	free(p);
}

void cpu_memcpy(void *dst, const void *src, size_t bytes)
{
	if (dst != src && bytes)
		memmove(dst, src, bytes);
}

void cpu_zero(void *p, size_t bytes)
{
	if (bytes)
		memset(p, 0, bytes);
}

void cpu_synchronize(void)
{
}
