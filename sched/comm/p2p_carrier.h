/* p2p_carrier.h - what p2p.c asks of a carrier (p2p_mpi.c, p2p_tcp.c);
 * private to those files and to dist.c, which holds the running one. */
#ifndef ASYNCPP_P2P_CARRIER_H
#define ASYNCPP_P2P_CARRIER_H

#include <stddef.h>

struct p2p_op;
struct p2p_mesh;

struct p2p_carrier {
	const char *name;
	int rank, world;      /* this process's place */
	void *k;              /* the carrier's state (the TCP mesh; NULL for MPI) */
	void *(*open)(void *k); /* a channel's handle; NULL after error() */
	void (*close)(void *k, void *ch);
	int (*tag_limit)(void *k, void *ch);
	struct p2p_op *(*isend)(void *k, void *ch, const void *buf, size_t n, int to, int tag);
	struct p2p_op *(*irecv)(void *k, void *ch, void *buf, size_t n, int from, int tag);
	/* 1 when op is complete (it is then freed), else 0; after progress */
	int (*done)(struct p2p_op *op);
	/* move bytes; wait up to `wait` seconds for something to happen */
	void (*progress)(void *k, double wait);
	/* 1 when the carrier failed (after error() said why): the job ends;
	 * NULL for a carrier that ends the job itself */
	int (*broken)(void *k);
};

/* The MPI carrier for rank `rank` of `world` (MPI must run), or the TCP
 * mesh's (p2p_tcp_start). */
struct p2p_carrier p2p_mpi_carrier(int rank, int world);
struct p2p_carrier p2p_tcp_carrier(struct p2p_mesh *mesh);

#endif
