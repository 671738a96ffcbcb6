/* p2p_carrier.h - what p2p.c asks of a carrier (p2p_mpi.c, p2p_tcp.c);
 * private to those files. */
#ifndef ASYNCPP_P2P_CARRIER_H
#define ASYNCPP_P2P_CARRIER_H

#include <stddef.h>

struct p2p_op;

struct p2p_carrier {
	const char *name;
	int rank, world;      /* this process's place */
	void *(*open)(void);  /* a channel's handle; NULL after error() */
	void (*close)(void *ch);
	int (*tag_limit)(void *ch);
	struct p2p_op *(*isend)(void *ch, const void *buf, size_t n, int to, int tag);
	struct p2p_op *(*irecv)(void *ch, void *buf, size_t n, int from, int tag);
	/* 1 when op is complete (it is then freed), else 0; after progress */
	int (*done)(struct p2p_op *op);
	/* move bytes; wait up to `wait` seconds for something to happen */
	void (*progress)(double wait);
	/* 1 when the carrier failed (after error() said why): the job ends;
	 * NULL for a carrier that ends the job itself */
	int (*broken)(void);
};

/* The running carrier of each kind, or NULL. */
const struct p2p_carrier *p2p_mpi_carrier(void);
const struct p2p_carrier *p2p_tcp_carrier(void);

#endif
