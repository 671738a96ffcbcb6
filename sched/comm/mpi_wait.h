/* mpi_wait.h - waiting on MPI requests with a deadline (pipeline.timeout).
 * Past it the wait says what never came, naming this rank and stage, and
 * aborts the job: a rank that is stuck, stopped or gone ends the run with
 * a message instead of a hang. For the MPI files (they include <mpi.h>). */
#ifndef ASYNCPP_MPI_WAIT_H
#define ASYNCPP_MPI_WAIT_H

#include <mpi.h>

#include "../../io/util.h"

/* MPI_Waitall(n, req, st) on rank `rank` (st may be MPI_STATUSES_IGNORE) that gives up
 * after timeout seconds (0: waits forever): it then prints "rank R (stage
 * s) waited T s for WHAT, which never came: ..." with WHAT from fmt, and
 * ends the job (dist_never_came: MPI_Abort under MPI). */
void mpi_wait_all(int rank, int n, MPI_Request *req, MPI_Status *st, double timeout, int stage,
		  const char *fmt, ...) PRINTF_LIKE(7, 8);

#endif
