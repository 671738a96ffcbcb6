/* mpi_wait.c - MPI waits with a deadline. See mpi_wait.h. */
#ifdef ASYNCPP_MPI

#include "mpi_wait.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "dist.h"

void mpi_wait_all(int rank, int n, MPI_Request *req, MPI_Status *st, double timeout, int stage,
		  const char *fmt, ...)
{
	if (timeout <= 0) {
		MPI_Waitall(n, req, st);
		return;
	}
	double t0 = now_sec();
	for (long polls = 0;; polls++) {
		int done = 0;
		MPI_Testall(n, req, &done, st);
		if (done)
			return;
		if (polls > 2000) { /* a short spin first: messages usually come soon */
			struct timespec pause = {0, 50000};
			nanosleep(&pause, NULL);
		}
		double waited = now_sec() - t0;
		if (waited > timeout) {
			va_list ap;
			va_start(ap, fmt);
			dist_never_came(rank, stage, waited, timeout, fmt, ap);
		}
	}
}

#else
typedef int mpi_wait_unused; /* ISO C wants something in a file */
#endif
