/* cpu_mem.c - memory, "streams" and thread count of the CPU backend. */
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/util.h"
#include "cpu.h"

/* OpenMP threads waiting at the end of a parallel region spin (libgomp:
 * GOMP_SPINCOUNT, a few milliseconds) before they sleep. Where cores are
 * shared, with other processes or with our own pipeline stages, the spinning
 * thread holds the core its team mate needs to finish, and a training step
 * runs a few hundred regions: on the 2-core machine of bench/NOTES.md, under
 * load, libgomp's spin loops took 19% of a 2-thread step's samples and the
 * step ran 1.6x slower than with OMP_WAIT_POLICY=passive. So passive is the
 * default unless the user chose a policy or a spin count. libgomp reads its
 * environment in its own initialiser, before any constructor of ours runs;
 * a .preinit_array entry runs earlier still (ELF: before the initialisers of
 * shared objects). glibc sets up the environment of main() again after
 * that, so getenv() in the program does not see the variable and child
 * processes do not inherit it. Left out under AddressSanitizer, whose own
 * preinit entry must run first. */
#if defined(__linux__) && !defined(__SANITIZE_ADDRESS__)
static void omp_wait_default(int argc, char **argv, char **envp)
{
	(void)argc;
	(void)argv;
	(void)envp;
	if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT"))
		setenv("OMP_WAIT_POLICY", "passive", 0);
}
__attribute__((section(".preinit_array"), used)) static void (*const omp_wait_preinit)(
	int, char **, char **) = omp_wait_default;
#endif

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
