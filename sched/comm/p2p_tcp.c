/* p2p_tcp.c - the point-to-point carrier over TCP, for runs started
 * without MPI (torchrun style: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
 *
 * The mesh. At start every rank listens on a port of its own, at the
 * address its rendezvous connection uses (one the other hosts can reach),
 * and the ranks exchange these addresses over the rendezvous. A rank
 * connects to a peer on its first send there, and uses that connection
 * only to send: messages from q to r always travel on q's connection to r,
 * in the order q sent them, so no message overtakes another. A rank holds
 * sockets only for the peers it talks to (its neighbours, its pipeline's
 * stages, its stage's replicas, rank 0).
 *
 * Wire format: every frame is a 24-byte header, little-endian,
 *   0 u32 magic "AP2P"    4 u16 version (1)   6 u16 type
 *   8 u32 channel        12 u32 tag          16 u64 payload bytes
 * then the payload. Types:
 *   HELLO  first frame of a connection, from the connecting rank: tag is
 *          its rank, channel its WORLD_SIZE;
 *   DATA   a message of channel/tag;
 *   BYE    the sender has finished: the end of the connection that follows
 *          is the end of the run, not a crash. Both ends send it.
 * Hosts are assumed to share a byte order only in the exchanged socket
 * addresses (the rendezvous carries them as raw bytes).
 *
 * Progress. Nothing runs in the background: every test or wait polls all
 * sockets, accepts new connections, writes what the send queues hold and
 * reads everything that arrived. A message whose receive is posted is read
 * straight into the receive's buffer; one that comes first is kept (an
 * "unexpected" message) until its receive is posted. Because every rank
 * always reads, two ranks sending each other large messages never block
 * on full socket buffers.
 */
#include "p2p.h"
#include "p2p_carrier.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dist.h"
#include "rendezvous.h"

#define HDR 24
#define MAGIC 0x50325041u /* "AP2P" read as little-endian u32 */
#define VERSION 1

enum { F_HELLO = 1, F_DATA = 2, F_BYE = 3 };

/* A message that came before its receive was posted. */
struct umsg {
	struct umsg *next;
	int from;
	uint32_t chan, tag;
	size_t n;
	char *data;           /* grows as the bytes come (a header cannot make
			       * this rank allocate more than was sent) */
	size_t cap;
	int complete;
	struct p2p_op *bound; /* the receive posted while it was still arriving */
};

struct p2p_op {
	struct p2p_op *next;  /* in a connection's send queue or the posted receives */
	int recv, done, peer;
	uint32_t chan, tag;
	char *buf;
	size_t n;
	unsigned char hdr[HDR];
	size_t off;           /* send: bytes of hdr and buf written */
};

struct conn {
	int fd;               /* -1: not connected, or closed */
	int peer;             /* -1 until its HELLO (accepted connections) */
	int incoming;         /* accepted: the peer sends on it; else this rank does */
	int bye;              /* the peer said goodbye on it */
	unsigned char hdr[HDR];
	size_t hgot;          /* header bytes read; HDR while a payload is read */
	char *dst;            /* where the payload goes */
	size_t want, got;
	struct p2p_op *rop;   /* the receive it fills, or */
	struct umsg *rmsg;    /* the unexpected message */
	struct p2p_op *sq, *sq_tail;  /* sends queued on it, oldest first */
};

/* The mesh: one per process, owned by its runtime (dist.c). */
struct p2p_mesh {
	int on, stopping, broken, rank, world;
	double timeout, connect_timeout;
	int lfd;
	struct sockaddr_storage *addr;  /* [world] where rank q listens */
	socklen_t *alen;
	struct conn *out;               /* [world] this rank's connection to q */
	struct conn **in;               /* accepted connections */
	int n_in, cap_in;
	struct p2p_op *posted, *posted_tail;
	struct umsg *unexp, *unexp_tail;
	uint32_t last_chan;
	struct pollfd *pfd;
	struct conn **pconn;
	int cap_pfd;
};

/* The mesh is broken: say why (once); p2p.c ends the job when it sees it.
 * Nothing reads or writes after it. */
static PRINTF_LIKE(2, 3) void fail(struct p2p_mesh *M, const char *fmt, ...)
{
	if (M->broken)
		return;
	char msg[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	error("rank %d: %s", M->rank, msg);
	M->broken = 1;
}

static void put_frame(unsigned char *h, unsigned type, uint32_t chan, uint32_t tag, uint64_t n)
{
	put_le32(h, MAGIC);
	h[4] = VERSION;
	h[5] = 0;
	h[6] = (unsigned char)type;
	h[7] = 0;
	put_le32(h + 8, chan);
	put_le32(h + 12, tag);
	put_le64(h + 16, n);
}

static int size_differs(struct p2p_mesh *M, const struct p2p_op *op, int from, uint64_t n)
{
	if (n == op->n)
		return 0;
	fail(M, "a message from rank %d (channel %u, tag %u) has %llu bytes where %zu were "
	     "expected: the ranks run different code or configurations", from, op->chan, op->tag,
	     (unsigned long long)n, op->n);
	return 1;
}

/* ---- matching ---- */

/* The oldest posted receive for (from, chan, tag), taken off the list. */
static struct p2p_op *take_posted(struct p2p_mesh *M, int from, uint32_t chan, uint32_t tag)
{
	struct p2p_op *prev = NULL;
	for (struct p2p_op *op = M->posted; op; prev = op, op = op->next) {
		if (op->peer != from || op->chan != chan || op->tag != tag)
			continue;
		if (prev)
			prev->next = op->next;
		else
			M->posted = op->next;
		if (M->posted_tail == op)
			M->posted_tail = prev;
		op->next = NULL;
		return op;
	}
	return NULL;
}

static struct umsg *add_unexpected(struct p2p_mesh *M, int from, uint32_t chan, uint32_t tag,
				    size_t n)
{
	struct umsg *u = xcalloc(1, sizeof(*u));
	size_t cap = MIN(n, (size_t)1 << 20);
	*u = (struct umsg){NULL, from, chan, tag, n, xmalloc(cap ? cap : 1), cap, 0, NULL};
	if (M->unexp_tail)
		M->unexp_tail->next = u;
	else
		M->unexp = u;
	M->unexp_tail = u;
	return u;
}

static void drop_unexpected(struct p2p_mesh *M, struct umsg *u)
{
	struct umsg *prev = NULL;
	for (struct umsg *x = M->unexp; x && x != u; x = x->next)
		prev = x;
	if (prev)
		prev->next = u->next;
	else
		M->unexp = u->next;
	if (M->unexp_tail == u)
		M->unexp_tail = prev;
	free(u->data);
	free(u);
}

/* An unexpected message is whole: hand it to its receive if one waits. */
static void unexpected_complete(struct p2p_mesh *M, struct umsg *u)
{
	u->complete = 1;
	if (!u->bound)
		return;
	memcpy(u->bound->buf, u->data, u->n);
	u->bound->done = 1;
	drop_unexpected(M, u);
}

/* ---- connections ---- */

static void set_fast(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0)
		fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* All of buf[0..n) written on a nonblocking socket, before deadline (0:
 * none). 0, or -1 with errno (ETIMEDOUT at the deadline). */
static int write_all(int fd, const void *buf, size_t n, double deadline)
{
	const char *p = buf;
	while (n) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
		if (k > 0) {
			p += k;
			n -= (size_t)k;
			continue;
		}
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
			return -1;
		double left = deadline > 0 ? deadline - now_sec() : 1.0;
		if (left <= 0) {
			errno = ETIMEDOUT;
			return -1;
		}
		struct pollfd pf = {fd, POLLOUT, 0};
		poll(&pf, 1, (int)(MIN(left, 1.0) * 1000) + 1);
	}
	return 0;
}

/* 0, or -1 after fail(M). */
static int connect_to(struct p2p_mesh *M, int q)
{
	struct conn *c = &M->out[q];
	int fd = socket(M->addr[q].ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		fail(M, "cannot make a socket to reach rank %d: %s", q, strerror(errno));
		return -1;
	}
	int rc = connect(fd, (struct sockaddr *)&M->addr[q], M->alen[q]);
	if (rc && errno == EINPROGRESS) {
		struct pollfd pf = {fd, POLLOUT, 0};
		double t = M->connect_timeout;
		int got = poll(&pf, 1, t > 0 ? (int)(t * 1000) + 1 : -1);
		int err = 0;
		socklen_t len = sizeof(err);
		if (got <= 0)
			err = got == 0 ? ETIMEDOUT : errno;
		else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len))
			err = errno;
		rc = err ? -1 : 0;
		errno = err;
	}
	if (!rc) {
		set_fast(fd);
		unsigned char h[HDR];
		put_frame(h, F_HELLO, (uint32_t)M->world, (uint32_t)M->rank, 0);
		if (write_all(fd, h, HDR, 0)) {
			fail(M, "cannot greet rank %d: %s", q, strerror(errno));
			close(fd);
			return -1;
		}
		c->fd = fd;
		return 0;
	}
	fail(M, "cannot connect to rank %d at the address it announced: %s (is a firewall between "
	     "the hosts? every rank listens on a port of its own)", q, strerror(errno));
	close(fd);
	return -1;
}

/* The peer ended the connection: the end of the run after a BYE (or while
 * this rank stops), a crash otherwise. */
static void conn_closed(struct p2p_mesh *M, struct conn *c)
{
	if (!c->bye && !M->stopping) {
		if (c->peer < 0)
			fail(M, "a connection closed before saying which rank it came from");
		else
			fail(M, "rank %d closed its connection without saying goodbye: it exited or was "
			     "killed (see its own messages); stopping", c->peer);
	}
	close(c->fd);
	c->fd = -1;
	c->bye = 1;
}

/* Write what the send queue holds until the socket is full. */
static void write_some(struct p2p_mesh *M, struct conn *c)
{
	while (c->sq && c->fd >= 0 && !M->broken) {
		struct p2p_op *op = c->sq;
		size_t total = HDR + op->n;
		const char *p = op->off < HDR ? (const char *)op->hdr + op->off
					      : op->buf + (op->off - HDR);
		size_t len = op->off < HDR ? HDR - op->off : total - op->off;
		ssize_t k = send(c->fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (k > 0) {
			op->off += (size_t)k;
			if (op->off == total) {
				op->done = 1;
				c->sq = op->next;
				if (!c->sq)
					c->sq_tail = NULL;
			}
			continue;
		}
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		fail(M, "cannot send to rank %d: %s: that rank is gone", c->peer, strerror(errno));
		return;
	}
}

static void finish_payload(struct p2p_mesh *M, struct conn *c)
{
	if (c->rop)
		c->rop->done = 1;
	else
		unexpected_complete(M, c->rmsg);
	c->rop = NULL;
	c->rmsg = NULL;
	c->dst = NULL;
	c->hgot = 0;
}

static void on_header(struct p2p_mesh *M, struct conn *c)
{
	const unsigned char *h = c->hdr;
	unsigned type = h[6];
	uint32_t chan = get_le32(h + 8), tag = get_le32(h + 12);
	uint64_t n = get_le64(h + 16);
	if (get_le32(h) != MAGIC || h[4] != VERSION || h[5] || h[7] || type < F_HELLO ||
	    type > F_BYE) {
		char who[48];
		if (c->peer < 0)
			snprintf(who, sizeof(who), "a connection that did not say its rank");
		else
			snprintf(who, sizeof(who), "the connection %s rank %d",
				 c->incoming ? "from" : "to", c->peer);
		fail(M, "%s carries bytes that are not asyncpp messages (another program on this "
		     "port, or another asyncpp version)", who);
		return;
	}
	c->hgot = 0;
	if (type == F_BYE) {
		c->bye = 1;
		return;
	}
	if (type == F_HELLO) {
		if (!c->incoming || c->peer >= 0 || n)
			fail(M, "a second greeting on a connection of rank %d", c->peer);
		else if (chan != (uint32_t)M->world)
			fail(M, "a rank of a world of %u processes connected to this one of %d: two runs "
			     "share MASTER_ADDR:MASTER_PORT, or WORLD_SIZE differs between ranks", chan,
			     M->world);
		else if (tag >= (uint32_t)M->world || (int)tag == M->rank)
			fail(M, "a connection says it comes from rank %u of %d", tag, M->world);
		else
			c->peer = (int)tag;
		return;
	}
	if (!c->incoming || c->peer < 0) {
		fail(M, "a message on a connection that carries none (from rank %d)", c->peer);
		return;
	}
	if (n > SIZE_MAX) {
		fail(M, "a message of %llu bytes from rank %d", (unsigned long long)n, c->peer);
		return;
	}
	/* a message for a receive not posted yet is kept until it is */
	struct p2p_op *op = take_posted(M, c->peer, chan, tag);
	if (op && size_differs(M, op, c->peer, n))
		return;
	if (op) {
		c->rop = op;
		c->dst = op->buf;
	} else {
		c->rmsg = add_unexpected(M, c->peer, chan, tag, (size_t)n);
		c->dst = c->rmsg->data;
	}
	c->want = (size_t)n;
	c->got = 0;
	c->hgot = HDR; /* the payload is next */
	if (!n)
		finish_payload(M, c);
}

/* Read everything that has arrived on c. */
static void read_some(struct p2p_mesh *M, struct conn *c)
{
	while (c->fd >= 0 && !M->broken) {
		int in_hdr = c->hgot < HDR;
		if (!in_hdr && c->rmsg && c->got == c->rmsg->cap) { /* room for more */
			struct umsg *u = c->rmsg;
			u->cap = u->n - u->cap < u->cap ? u->n : 2 * u->cap;
			u->data = xrealloc(u->data, u->cap);
			c->dst = u->data;
		}
		char *p = in_hdr ? (char *)c->hdr + c->hgot : c->dst + c->got;
		size_t len = in_hdr ? HDR - c->hgot
				    : (c->rmsg ? c->rmsg->cap : c->want) - c->got;
		ssize_t k = recv(c->fd, p, len, MSG_DONTWAIT);
		if (k == 0) {
			conn_closed(M, c);
			return;
		}
		if (k < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return;
			if (errno == ECONNRESET || errno == EPIPE || errno == ENOTCONN) {
				conn_closed(M, c);
				return;
			}
			fail(M, "reading from rank %d: %s", c->peer, strerror(errno));
			return;
		}
		if (in_hdr) {
			c->hgot += (size_t)k;
			if (c->hgot == HDR)
				on_header(M, c);
		} else {
			c->got += (size_t)k;
			if (c->got == c->want)
				finish_payload(M, c);
		}
	}
}

static void accept_all(struct p2p_mesh *M)
{
	for (;;) {
		int fd = accept(M->lfd, NULL, NULL);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return;
			fail(M, "accepting a connection: %s", strerror(errno));
			return;
		}
		set_fast(fd);
		fcntl(fd, F_SETFD, FD_CLOEXEC);
		if (M->n_in == M->cap_in) {
			M->cap_in = M->cap_in ? 2 * M->cap_in : 8;
			M->in = xrealloc(M->in, sizeof(*M->in) * (size_t)M->cap_in);
		}
		struct conn *c = xcalloc(1, sizeof(*c));
		c->fd = fd;
		c->peer = -1;
		c->incoming = 1;
		M->in[M->n_in++] = c;
	}
}

static void add_poll(struct p2p_mesh *M, int *n, int fd, short events, struct conn *c)
{
	if (*n == M->cap_pfd) {
		M->cap_pfd = 2 * M->cap_pfd + 8;
		M->pfd = xrealloc(M->pfd, sizeof(*M->pfd) * (size_t)M->cap_pfd);
		M->pconn = xrealloc(M->pconn, sizeof(*M->pconn) * (size_t)M->cap_pfd);
	}
	M->pfd[*n] = (struct pollfd){fd, events, 0};
	M->pconn[(*n)++] = c;
}

static void t_progress(void *k, double wait)
{
	struct p2p_mesh *M = k;
	int n = 0;
	if (M->lfd >= 0)
		add_poll(M, &n, M->lfd, POLLIN, NULL);
	for (int q = 0; q < M->world; q++)
		if (M->out[q].fd >= 0)
			add_poll(M, &n, M->out[q].fd, POLLIN | (M->out[q].sq ? POLLOUT : 0), &M->out[q]);
	for (int i = 0; i < M->n_in; i++)
		if (M->in[i]->fd >= 0)
			add_poll(M, &n, M->in[i]->fd, POLLIN, M->in[i]);
	int got = poll(M->pfd, (nfds_t)n, wait > 0 ? (int)(wait * 1000) + 1 : 0);
	if (got < 0 && errno != EINTR)
		fail(M, "poll: %s", strerror(errno));
	for (int i = 0; got > 0 && i < n && !M->broken; i++) {
		short ev = M->pfd[i].revents;
		struct conn *c = M->pconn[i];
		if (!ev)
			continue;
		if (!c)
			accept_all(M);
		else {
			if (ev & (POLLIN | POLLHUP | POLLERR))
				read_some(M, c);
			if (ev & POLLOUT)
				write_some(M, c);
		}
	}
}

/* ---- the carrier ---- */

static void *t_open(void *k)
{
	struct p2p_mesh *M = k;
	return (void *)(uintptr_t)++M->last_chan; /* the same number on every rank */
}

static void t_close(void *k, void *ch) {}

static int t_tag_limit(void *k, void *ch) { return INT32_MAX; }

static struct p2p_op *new_op(int recv, void *ch, const void *buf, size_t n, int peer, int tag)
{
	struct p2p_op *op = xcalloc(1, sizeof(*op));
	op->recv = recv;
	op->peer = peer;
	op->chan = (uint32_t)(uintptr_t)ch;
	op->tag = (uint32_t)tag;
	op->buf = (char *)buf;
	op->n = n;
	return op;
}

static struct p2p_op *t_isend(void *k, void *ch, const void *buf, size_t n, int to, int tag)
{
	struct p2p_mesh *M = k;
	struct p2p_op *op = new_op(0, ch, buf, n, to, tag);
	if (to == M->rank) { /* to itself: delivered at once */
		struct p2p_op *r = take_posted(M, to, op->chan, op->tag);
		if (r && !size_differs(M, r, to, n)) {
			memcpy(r->buf, buf, n);
			r->done = 1;
		} else if (!r) {
			struct umsg *u = add_unexpected(M, to, op->chan, op->tag, n);
			u->data = xrealloc(u->data, n ? n : 1);
			u->cap = n;
			memcpy(u->data, buf, n);
			u->complete = 1;
		}
		op->done = 1;
		return op;
	}
	struct conn *c = &M->out[to];
	if (c->bye) {
		fail(M, "a message for rank %d, which has finished", to);
		return op;
	}
	if (c->fd < 0 && connect_to(M, to))
		return op;
	put_frame(op->hdr, F_DATA, op->chan, op->tag, n);
	if (c->sq_tail)
		c->sq_tail->next = op;
	else
		c->sq = op;
	c->sq_tail = op;
	write_some(M, c);
	return op;
}

static struct p2p_op *t_irecv(void *k, void *ch, void *buf, size_t n, int from, int tag)
{
	struct p2p_mesh *M = k;
	struct p2p_op *op = new_op(1, ch, buf, n, from, tag);
	for (struct umsg *u = M->unexp; u; u = u->next) {
		if (u->bound || u->from != from || u->chan != op->chan || u->tag != op->tag)
			continue;
		if (size_differs(M, op, from, u->n))
			return op;
		if (u->complete) {
			memcpy(buf, u->data, n);
			op->done = 1;
			drop_unexpected(M, u);
		} else {
			u->bound = op;
		}
		return op;
	}
	if (M->posted_tail)
		M->posted_tail->next = op;
	else
		M->posted = op;
	M->posted_tail = op;
	return op;
}

static int t_broken(void *k) { return ((struct p2p_mesh *)k)->broken; }

static int t_done(struct p2p_op *op)
{
	if (!op->done)
		return 0;
	free(op);
	return 1;
}

struct p2p_carrier p2p_tcp_carrier(struct p2p_mesh *M)
{
	return (struct p2p_carrier){"tcp", M->rank, M->world, M, t_open, t_close, t_tag_limit,
				    t_isend, t_irecv, t_done, t_progress, t_broken};
}

/* ---- start and stop ---- */

struct announce {
	uint32_t len;
	struct sockaddr_storage sa;
};

struct p2p_mesh *p2p_tcp_start(struct rdv *rdv, double timeout, double connect_timeout)
{
	int world = rdv_world(rdv);
	struct announce me = {0};
	socklen_t len;
	if (rdv_local_addr(rdv, &me.sa, &len))
		return NULL;
	if (me.sa.ss_family == AF_INET)
		((struct sockaddr_in *)&me.sa)->sin_port = 0;
	else if (me.sa.ss_family == AF_INET6)
		((struct sockaddr_in6 *)&me.sa)->sin6_port = 0;
	int fd = socket(me.sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&me.sa, len) ||
	    listen(fd, MIN(world + 16, 4096)) || getsockname(fd, (struct sockaddr *)&me.sa, &len)) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		error("rank %d: cannot listen for the other ranks' messages: %s", rdv_rank(rdv),
		      strerror(e));
		return NULL;
	}
	me.len = (uint32_t)len;
	struct announce *all = xcalloc((size_t)world, sizeof(*all));
	if (rdv_allgather(rdv, &me, all, sizeof(me))) {
		close(fd);
		free(all);
		return NULL;
	}
	struct p2p_mesh *M = xcalloc(1, sizeof(*M));
	M->rank = rdv_rank(rdv);
	M->world = world;
	M->timeout = timeout;
	M->connect_timeout = connect_timeout;
	M->lfd = fd;
	M->addr = xcalloc((size_t)world, sizeof(*M->addr));
	M->alen = xcalloc((size_t)world, sizeof(*M->alen));
	M->out = xcalloc((size_t)world, sizeof(*M->out));
	for (int q = 0; q < world; q++) {
		M->addr[q] = all[q].sa;
		M->alen[q] = (socklen_t)MIN(all[q].len, sizeof(all[q].sa));
		M->out[q].fd = -1;
		M->out[q].peer = q;
	}
	free(all);
	M->on = 1;
	return M;
}

static int queues_empty(struct p2p_mesh *M)
{
	for (int q = 0; q < M->world; q++)
		if (M->out[q].sq && M->out[q].fd >= 0)
			return 0;
	return 1;
}

static int all_closed(struct p2p_mesh *M)
{
	for (int q = 0; q < M->world; q++)
		if (M->out[q].fd >= 0)
			return 0;
	for (int i = 0; i < M->n_in; i++)
		if (M->in[i]->fd >= 0)
			return 0;
	return 1;
}

static void teardown(struct p2p_mesh *M);

void p2p_tcp_stop(struct p2p_mesh *M)
{
	if (!M)
		return;
	double deadline = M->timeout > 0 ? now_sec() + M->timeout : 0;
	while (!queues_empty(M) && !M->broken && (!deadline || now_sec() < deadline))
		t_progress(M, 0.05);
	/* goodbye on every connection, then read until each peer has said it
	 * and closed: closing with its goodbye unread would reset the
	 * connection, and the peer could take that for a crash */
	M->stopping = 1;
	unsigned char bye[HDR];
	put_frame(bye, F_BYE, 0, 0, 0);
	for (int q = 0; q < M->world; q++)
		if (M->out[q].fd >= 0 && !write_all(M->out[q].fd, bye, HDR, deadline))
			shutdown(M->out[q].fd, SHUT_WR);
	for (int i = 0; i < M->n_in; i++)
		if (M->in[i]->fd >= 0 && !write_all(M->in[i]->fd, bye, HDR, deadline))
			shutdown(M->in[i]->fd, SHUT_WR);
	while (!all_closed(M) && !M->broken && (!deadline || now_sec() < deadline))
		t_progress(M, 0.05);
	teardown(M);
}

/* Close and free everything, the mesh itself too. */
static void teardown(struct p2p_mesh *M)
{
	for (int q = 0; q < M->world; q++)
		if (M->out[q].fd >= 0)
			close(M->out[q].fd);
	for (int i = 0; i < M->n_in; i++) {
		if (M->in[i]->fd >= 0)
			close(M->in[i]->fd);
		free(M->in[i]);
	}
	while (M->unexp)
		drop_unexpected(M, M->unexp);
	if (M->lfd >= 0)
		close(M->lfd);
	free(M->addr);
	free(M->alen);
	free(M->out);
	free(M->in);
	free(M->pfd);
	free(M->pconn);
	free(M);
}

/* ---- for the fuzzer ---- */

int p2p_tcp_fuzz(const unsigned char *data, size_t n)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		return -1;
	struct p2p_mesh *M = xcalloc(1, sizeof(*M));
	M->on = 1;
	M->rank = 0;
	M->world = 3;
	M->lfd = -1;
	M->out = xcalloc(3, sizeof(*M->out));
	for (int q = 0; q < 3; q++)
		M->out[q] = (struct conn){.fd = -1, .peer = q};
	struct conn *c = xcalloc(1, sizeof(*c));
	*c = (struct conn){.fd = sv[0], .peer = -1, .incoming = 1};
	set_fast(sv[0]);
	set_fast(sv[1]);
	M->in = xcalloc(1, sizeof(*M->in));
	M->in[0] = c;
	M->n_in = M->cap_in = 1;
	/* rank 1, channel 1: tags 0, 1, 2 of 0, 16 and 1000 bytes */
	char buf[1016];
	struct p2p_op *ops[3] = {t_irecv(M, (void *)1, buf, 0, 1, 0),
				 t_irecv(M, (void *)1, buf, 16, 1, 1),
				 t_irecv(M, (void *)1, buf + 16, 1000, 1, 2)};
	size_t off = 0;
	while (off < n && !M->broken && c->fd >= 0) {
		ssize_t k = send(sv[1], data + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (k > 0)
			off += (size_t)k;
		t_progress(M, 0);
	}
	close(sv[1]);
	for (int i = 0; i < 100000 && c->fd >= 0 && !M->broken; i++)
		t_progress(M, 0);
	int broken = M->broken;
	for (int i = 0; i < 3; i++)
		free(ops[i]);
	M->posted = M->posted_tail = NULL;
	teardown(M);
	return broken;
}
