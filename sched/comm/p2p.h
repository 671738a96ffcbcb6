/* p2p.h - tagged point-to-point messages between the ranks of a
 * multi-process run, over MPI or over TCP.
 *
 * The transports, boards and replica sums between processes (transport_p2p,
 * board_p2p, replica_p2p) and the control messages of dist.h are written
 * once against this interface; what carries the bytes is decided at start
 * (dist.h): MPI when dist_init started MPI, else the TCP mesh that
 * p2p_tcp_start opened from the rendezvous (rendezvous.h). The process's
 * runtime (struct dist) holds the carrier; a channel is opened on it and
 * keeps it, so nothing here is global.
 *
 * The semantics are MPI's nonblocking point-to-point, reduced to what the
 * callers use:
 *   - a channel (p2p_open, collective: every rank opens its channels in
 *     the same order) is a tag space of its own, like a duplicated
 *     communicator: messages of different channels never match;
 *   - a receive names its source rank, channel and tag and the exact size;
 *     between two ranks, messages with the same channel and tag are
 *     received in the order they were sent (no overtaking);
 *   - a send's or receive's buffer belongs to the operation until it
 *     completes (p2p_test or p2p_wait says so and frees the operation);
 *   - a message whose size is not the receive's, a peer that closes its
 *     connection without saying goodbye (it crashed or was killed), or a
 *     wait past its deadline ends the job with a message naming the ranks
 *     (dist_abort): the peers of a dead rank exit instead of hanging.
 * One thread per process calls it (the stage runs on the main thread).
 */
#ifndef ASYNCPP_P2P_H
#define ASYNCPP_P2P_H

#include <stddef.h>

#include "../../io/util.h"

struct p2p;     /* a channel */
struct p2p_op;  /* one pending send or receive */
struct p2p_carrier;

/* A new channel on carrier k (dist_carrier); NULL after error() when no
 * carrier runs (k NULL). Collective. */
struct p2p *p2p_open(const struct p2p_carrier *k);
void p2p_close(struct p2p *c);
/* "mpi" or "tcp": the channel's carrier */
const char *p2p_name(const struct p2p *c);
/* Tags are 0 .. p2p_tag_limit(c) (MPI_TAG_UB under MPI: at least 32767). */
int p2p_tag_limit(const struct p2p *c);

/* Start sending buf[0..n) to rank `to`, or receiving exactly n bytes from
 * rank `from` (either may be this rank). Never blocks. */
struct p2p_op *p2p_isend(struct p2p *c, const void *buf, size_t n, int to, int tag);
struct p2p_op *p2p_irecv(struct p2p *c, void *buf, size_t n, int from, int tag);

/* Makes progress on c's carrier; 1 when every ops[i] (operations of
 * channels on that carrier) is complete (completed operations are freed
 * and set to NULL; NULL counts as complete), else 0. */
int p2p_test(const struct p2p *c, struct p2p_op **ops, int n);
/* Waits until every ops[i] is complete (and freed, NULL). Past timeout
 * seconds (0: forever) it prints "rank R (stage s) waited T s for WHAT,
 * which never came: ..." with WHAT from fmt and ends the job. */
void p2p_wait(const struct p2p *c, struct p2p_op **ops, int n, double timeout, int stage,
	      const char *fmt, ...) PRINTF_LIKE(6, 7);

/* ---- the TCP mesh (p2p_tcp.c), started and stopped by dist.c ---- */
struct rdv;
struct p2p_mesh;
/* Every rank listens on a port of its own at the address it reaches rank
 * 0 from, and the addresses are exchanged over the rendezvous; connections
 * are made on a rank's first send to a peer (one per direction), so a rank
 * holds sockets only for the peers it talks to. Collective. The mesh, or
 * NULL after error(). */
struct p2p_mesh *p2p_tcp_start(struct rdv *rdv, double timeout, double connect_timeout);
/* Finish the sends still queued, say goodbye to every peer and wait (up to
 * the timeout) until each has said it too, so that no rank mistakes the
 * end of the run for a crash; then free the mesh (NULL: nothing). */
void p2p_tcp_stop(struct p2p_mesh *mesh);

/* For the fuzzer (tests/fuzz/fuzz_p2p.c): the bytes as what rank 1 sent on
 * its connection to rank 0 of a mesh of 3 with three receives posted, read
 * to the end or refused. 1 when they were refused (a protocol error, named
 * by error()), 0 when read, -1 when no socket pair could be made. */
int p2p_tcp_fuzz(const unsigned char *data, size_t n);

#endif
