/* p2p_mpi.c - the point-to-point carrier over MPI: a channel is a duplicate
 * of MPI_COMM_WORLD, a message is MPI_Isend/MPI_Irecv of MPI_BYTE (in
 * pieces of 1 GiB: MPI counts are ints), and MPI's own non-overtaking rule
 * keeps the order p2p.h promises. */
#include "p2p_carrier.h"

#include "../../io/util.h"

#ifndef ASYNCPP_MPI

struct p2p_carrier p2p_mpi_carrier(int rank, int world)
{
	bug("the MPI carrier for rank %d of %d in a build without MPI", rank, world);
}

#else

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <time.h>

#include "../../io/util.h"
#include "dist.h"

#define PIECE ((size_t)1 << 30)

/* This process's rank in MPI_COMM_WORLD, for messages. */
static int my_rank(void)
{
	int r = 0;
	MPI_Comm_rank(MPI_COMM_WORLD, &r);
	return r;
}

struct p2p_op {
	int recv, from, tag, nreq;
	size_t n;
	MPI_Request req[];  /* [nreq] one per piece */
};

static void *m_open(void *k)
{
	MPI_Comm *c = xmalloc(sizeof(*c));
	MPI_Comm_dup(MPI_COMM_WORLD, c);
	return c;
}

static void m_close(void *k, void *ch)
{
	MPI_Comm_free(ch);
	free(ch);
}

static int m_tag_limit(void *k, void *ch)
{
	int *ub, flag;
	MPI_Comm_get_attr(*(MPI_Comm *)ch, MPI_TAG_UB, &ub, &flag);
	return flag ? *ub : 32767;
}

static struct p2p_op *start(void *ch, void *buf, size_t n, int peer, int tag, int recv)
{
	int nreq = n ? (int)((n + PIECE - 1) / PIECE) : 1;
	struct p2p_op *op = xmalloc(sizeof(*op) + sizeof(MPI_Request) * (size_t)nreq);
	*op = (struct p2p_op){recv, peer, tag, nreq, n};
	char *p = buf;
	for (int i = 0; i < nreq; i++) {
		int len = (int)MIN(n - (size_t)i * PIECE, PIECE);
		int rc = recv ? MPI_Irecv(p, len, MPI_BYTE, peer, tag, *(MPI_Comm *)ch, &op->req[i])
			      : MPI_Isend(p, len, MPI_BYTE, peer, tag, *(MPI_Comm *)ch, &op->req[i]);
		if (rc != MPI_SUCCESS) {
			error("rank %d: MPI_I%s %s rank %d failed", my_rank(), recv ? "recv" : "send",
			      recv ? "from" : "to", peer);
			dist_abort();
		}
		p += len;
	}
	return op;
}

static struct p2p_op *m_isend(void *k, void *ch, const void *buf, size_t n, int to, int tag)
{
	return start(ch, (void *)buf, n, to, tag, 0);
}

static struct p2p_op *m_irecv(void *k, void *ch, void *buf, size_t n, int from, int tag)
{
	return start(ch, buf, n, from, tag, 1);
}

static int m_done(struct p2p_op *op)
{
	MPI_Status st[op->nreq];
	int flag;
	MPI_Testall(op->nreq, op->req, &flag, st);
	if (!flag)
		return 0;
	for (int i = 0; op->recv && i < op->nreq; i++) {
		int got;
		size_t want = MIN(op->n - (size_t)i * PIECE, PIECE);
		MPI_Get_count(&st[i], MPI_BYTE, &got);
		if ((size_t)got != want) {
			error("rank %d: a message from rank %d (tag %d) has %d bytes where %zu were "
			      "expected: the ranks run different code or configurations", my_rank(),
			      op->from, op->tag, got, want);
			dist_abort();
		}
	}
	free(op);
	return 1;
}

static void m_progress(void *k, double wait)
{
	if (wait > 0) { /* MPI progresses inside MPI_Test: just do not burn the core */
		struct timespec pause = {0, 50000};
		nanosleep(&pause, NULL);
	}
}

struct p2p_carrier p2p_mpi_carrier(int rank, int world)
{
	return (struct p2p_carrier){"mpi", rank, world, NULL, m_open, m_close, m_tag_limit,
				    m_isend, m_irecv, m_done, m_progress, NULL};
}

#endif
