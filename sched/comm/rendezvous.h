/* rendezvous.h - a small TCP rendezvous for processes started without MPI.
 *
 * torchrun (and a Slurm script that sets MASTER_ADDR and MASTER_PORT) starts
 * WORLD_SIZE processes with RANK and LOCAL_RANK, and tells them where rank
 * 0 is: MASTER_ADDR:MASTER_PORT. Before NCCL can connect GPUs, the ranks
 * must agree on a few bytes (NCCL's unique ids, the configuration); this
 * is the channel for that, and nothing else (no tensors).
 *
 * A star over TCP: rank 0 listens on the port (all interfaces, IPv6 and
 * IPv4), every other rank connects to MASTER_ADDR:MASTER_PORT, retrying
 * until the connect timeout (rank 0 may start last). Each says hello; rank
 * 0 answers only when all WORLD_SIZE - 1 have joined, so rdv_open returns
 * on every rank at about the same time (a barrier).
 *
 * Wire format: every message is a 32-byte header, all fields little-endian,
 *
 *   0  u32 magic "ARDV"       16 u32 seq    the collective's number, from 1
 *   4  u16 version (1)        20 u32 reserved (0)
 *   6  u16 op (enum below)    24 u64 payload bytes
 *   8  u32 sender's rank
 *  12  u32 sender's WORLD_SIZE
 *
 * then the payload. The hello carries the sender's host name; a reject or
 * abort carries the reason, which the receiver prints. Both ends check the
 * magic, the version, the world size, the rank (a RANK out of range or
 * claimed twice), the operation and its sequence number (ranks that call
 * the collectives in different orders) and the payload size. A collective
 * ends on a rank when it has what it needs: a barrier, an allgather and the
 * configuration check end with rank 0's message to each rank; a broadcast's
 * root (other than 0) leaves once it has sent.
 *
 * Failures are named, never hangs: every read and write has a deadline
 * (the connect timeout while connecting, the operation timeout after; 0:
 * forever), and messages say which rank, at which address, and what to do.
 * A rank that exits closes its socket: rank 0 sees it, tells every other
 * rank (an abort message naming the rank) and fails; the others fail with
 * rank 0's message. When rank 0 dies, every rank sees its socket close.
 * Sockets never raise SIGPIPE (MSG_NOSIGNAL). No threads.
 */
#ifndef ASYNCPP_RENDEZVOUS_H
#define ASYNCPP_RENDEZVOUS_H

#include <stddef.h>
#include <sys/socket.h>

#define RDV_MAGIC 0x56445241u /* "ARDV" read as little-endian u32 */
#define RDV_VERSION 1
#define RDV_DEFAULT_CONNECT_TIMEOUT 300.0 /* seconds */

struct rdv_opts {
	const char *addr;       /* MASTER_ADDR: rank 0's host (name or address) */
	int port;               /* MASTER_PORT, 1..65535 */
	int rank, world;        /* RANK, WORLD_SIZE */
	double connect_timeout; /* seconds for all ranks to join; 0: forever */
	double timeout;         /* seconds each later operation may wait; 0: forever */
};

struct rdv;

/* Join the rendezvous: rank 0 binds and waits for the others, the others
 * connect. Returns the connected rendezvous, or NULL after error(). */
struct rdv *rdv_open(const struct rdv_opts *o);
/* Close the sockets (the other ranks see this rank leave). NULL is fine. */
void rdv_close(struct rdv *r);

int rdv_rank(const struct rdv *r);
int rdv_world(const struct rdv *r);

/* Collectives: every rank calls them in the same order, with the same
 * sizes. Each returns 0, or -1 after error() (a peer gone, a deadline
 * passed, a protocol mismatch); after a failure the rendezvous is broken
 * and every later call fails at once. */
int rdv_barrier(struct rdv *r);
/* buf[0..n) of rank root to every rank (through rank 0 when root != 0). */
int rdv_bcast(struct rdv *r, void *buf, size_t n, int root);
/* all[q*n .. (q+1)*n) gets rank q's mine[0..n), on every rank. */
int rdv_allgather(struct rdv *r, const void *mine, void *all, size_t n);
/* Is the configuration text (config_to_string's) the same on every rank?
 * Compares hashes; the first rank whose text differs from rank 0's sends
 * it to rank 0. Returns 0 when all agree, else that rank (> 0) on every
 * rank, with rank 0's diff holding config_first_difference's "KEY = A on
 * rank R, but KEY = B on rank 0" (the other ranks' diff is ""); -1 after
 * error() when the exchange itself failed. */
int rdv_agree(struct rdv *r, const char *text, char *diff, size_t len);

/* This host's address on the rendezvous connection (to rank 0; on rank 0,
 * to another rank): an address the other ranks can reach this host at, for
 * the point-to-point mesh (p2p.h). 0, or -1 after error(). */
int rdv_local_addr(const struct rdv *r, struct sockaddr_storage *sa, socklen_t *len);

/* A free TCP port on host (bound to port 0 and released), for tests and
 * single-host launches; -1 after error(). */
int rdv_free_port(const char *host);

#endif
