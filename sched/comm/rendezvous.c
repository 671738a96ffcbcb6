/* rendezvous.c - the TCP rendezvous of rendezvous.h: rank 0 in the middle
 * of a star, every collective through it.
 *
 * Every socket is non-blocking; every read and write goes through io_full,
 * which polls with the operation's deadline. Rank 0 waits on all of its
 * peers at once (root_collect), so a peer that dies is seen while rank 0
 * waits for another; rank 0 then sends every peer an abort naming the dead
 * rank. The other ranks wait a little longer than rank 0 (GRACE) so that
 * rank 0's diagnosis, which names the culprit, arrives before their own
 * timeout, which can only name rank 0.
 */
#include "rendezvous.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "../../io/config/config.h"
#include "../../io/util.h"

enum {
	OP_HELLO = 1, /* rank q -> 0: payload = host name */
	OP_WELCOME,   /* 0 -> q: everybody is here */
	OP_REJECT,    /* 0 -> a joining process: payload = why */
	OP_ABORT,     /* 0 -> q: the rendezvous failed; payload = why */
	OP_BARRIER,
	OP_BCAST,
	OP_GATHER,
	OP_TEXT,      /* the odd rank's configuration text -> 0 */
	OP_END
};

static const char *op_name(unsigned op)
{
	static const char *names[OP_END] = {"?", "hello", "welcome", "reject", "abort",
					    "barrier", "broadcast", "allgather",
					    "configuration check"};
	return op < OP_END ? names[op] : "unknown message";
}

#define HDR 32
#define MAX_TEXT ((uint64_t)64 << 20) /* a hello, reason or configuration text */
#define HELLO_WAIT 10.0               /* seconds a new connection has to say hello */

struct hdr {
	uint32_t magic, rank, world, seq;
	uint16_t version, op;
	uint64_t len;
};

struct peer {
	int fd;          /* -1: not connected (or gone) */
	char addr[80];   /* "A.B.C.D:port" or "[v6]:port" */
	char host[64];   /* its host name (from its hello) */
};

struct rdv {
	int rank, world;
	double timeout, grace; /* per operation; the extra wait of ranks > 0 */
	uint32_t seq;          /* the last collective's number */
	int broken;
	char master[192];      /* "MASTER_ADDR:MASTER_PORT" as given */
	int port;
	struct peer *peer;     /* rank 0: [world], [q] = rank q; others: [0] = rank 0 */
};

int rdv_rank(const struct rdv *r) { return r->rank; }
int rdv_world(const struct rdv *r) { return r->world; }

/* ---- bytes on a socket, with a deadline ---- */

enum { IO_OK = 0, IO_TIMEOUT = -1, IO_CLOSED = -2, IO_ERRNO = -3 };

/* 0 means no deadline. */
static double deadline_in(double seconds)
{
	return seconds > 0 ? now_sec() + seconds : 0;
}

/* poll's timeout for a deadline: -1 for none. */
static int poll_ms(double deadline)
{
	if (deadline <= 0)
		return -1;
	double left = deadline - now_sec();
	if (left <= 0)
		return 0;
	return left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
}

/* All of buf[0..n) read (writing = 0) or written. IO_ERRNO leaves errno. */
static int io_full(int fd, void *buf, size_t n, int writing, double deadline)
{
	char *p = buf;
	while (n) {
		ssize_t k = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
		if (k > 0) {
			p += k;
			n -= (size_t)k;
			continue;
		}
		if (k == 0 && !writing)
			return IO_CLOSED;
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
			return errno == ECONNRESET || errno == EPIPE || errno == ENOTCONN ? IO_CLOSED
											   : IO_ERRNO;
		struct pollfd pf = {fd, writing ? POLLOUT : POLLIN, 0};
		int ms = poll_ms(deadline);
		if (ms == 0)
			return IO_TIMEOUT;
		int got = poll(&pf, 1, ms);
		if (got < 0 && errno != EINTR)
			return IO_ERRNO;
		if (got == 0)
			return IO_TIMEOUT;
	}
	return IO_OK;
}

static void put_hdr(unsigned char *b, unsigned op, int rank, int world, uint32_t seq,
		    uint64_t len)
{
	memset(b, 0, HDR);
	put_le32(b, RDV_MAGIC);
	put_le16(b + 4, RDV_VERSION);
	put_le16(b + 6, (uint16_t)op);
	put_le32(b + 8, (uint32_t)rank);
	put_le32(b + 12, (uint32_t)world);
	put_le32(b + 16, seq);
	put_le64(b + 24, len);
}

static void get_hdr(const unsigned char *b, struct hdr *h)
{
	h->magic = get_le32(b);
	h->version = get_le16(b + 4);
	h->op = get_le16(b + 6);
	h->rank = get_le32(b + 8);
	h->world = get_le32(b + 12);
	h->seq = get_le32(b + 16);
	h->len = get_le64(b + 24);
}

/* One message: header and payload. */
static int send_msg(int fd, unsigned op, int rank, int world, uint32_t seq, const void *p,
		    size_t n, double deadline)
{
	unsigned char h[HDR];
	put_hdr(h, op, rank, world, seq, n);
	int rc = io_full(fd, h, HDR, 1, deadline);
	if (rc == IO_OK && n)
		rc = io_full(fd, (void *)p, n, 1, deadline);
	return rc;
}

/* A text payload of len bytes as a malloc'ed string; NULL when too long or
 * unreadable (*rc says why). */
static char *read_text(int fd, uint64_t len, double deadline, int *rc)
{
	if (len > MAX_TEXT) {
		*rc = IO_ERRNO;
		errno = EMSGSIZE;
		return NULL;
	}
	char *s = xmalloc((size_t)len + 1);
	*rc = io_full(fd, s, (size_t)len, 0, deadline);
	if (*rc) {
		free(s);
		return NULL;
	}
	s[len] = 0;
	return s;
}

static const char *io_what(int rc)
{
	return rc == IO_CLOSED ? "closed its connection" : rc == IO_TIMEOUT ? "did not answer in time"
									     : strerror(errno);
}

static void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

static int set_nonblocking(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void addr_text(const struct sockaddr *sa, char *out, size_t len)
{
	char ip[INET6_ADDRSTRLEN] = "?";
	int port = 0;
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *a = (const void *)sa;
		inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
		port = ntohs(a->sin_port);
		snprintf(out, len, "%s:%d", ip, port);
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const void *)sa;
		inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof(ip));
		port = ntohs(a->sin6_port);
		/* an IPv4 peer on a dual-stack socket: print it as IPv4 */
		if (!strncmp(ip, "::ffff:", 7) && strchr(ip + 7, '.'))
			snprintf(out, len, "%s:%d", ip + 7, port);
		else
			snprintf(out, len, "[%s]:%d", ip, port);
	} else {
		snprintf(out, len, "?");
	}
}

static void my_host(char *out, size_t len)
{
	if (gethostname(out, len - 1))
		snprintf(out, len, "?");
	out[len - 1] = 0;
}

/* ---- failing ---- */

/* "rank q (host H, A:P)" from rank 0, "rank 0 (MASTER_ADDR:PORT)" otherwise. */
static const char *who(const struct rdv *r, int q, char *out, size_t len)
{
	if (r->rank == 0) {
		const struct peer *p = &r->peer[q];
		if (p->host[0])
			snprintf(out, len, "rank %d (host %s, %s)", q, p->host, p->addr);
		else
			snprintf(out, len, "rank %d (%s)", q, p->addr);
	} else {
		snprintf(out, len, "rank 0 (MASTER_ADDR:MASTER_PORT = %s)", r->master);
	}
	return out;
}

static void close_all(struct rdv *r)
{
	int n = r->rank == 0 ? r->world : 1;
	for (int q = 0; q < n; q++)
		close_fd(&r->peer[q].fd);
}

/* Say why on stderr and close everything; rank 0 first tells every
 * connected rank (best effort, a bounded wait), while the others' closing is
 * what rank 0 sees and stops the rest on. Returns -1. */
PRINTF_LIKE(2, 3) static int fail(struct rdv *r, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	error("%s", msg);
	double deadline = deadline_in(2.0);
	for (int q = 1; r->rank == 0 && q < r->world; q++)
		if (r->peer[q].fd >= 0)
			send_msg(r->peer[q].fd, OP_ABORT, 0, r->world, r->seq, msg, strlen(msg),
				 deadline);
	close_all(r);
	r->broken = 1;
	return -1;
}

/* ---- messages within a collective ---- */

/* Read one message header from peer q (rank 0's peer[q], or rank 0 for the
 * others) and check it against the collective (op, seq). An abort from
 * rank 0 is reported as such. 0, or -1 after the failure was handled. */
static int read_hdr(struct rdv *r, int q, unsigned op, struct hdr *h, double deadline)
{
	int fd = r->peer[q].fd;
	unsigned char b[HDR];
	char w[320];
	int rc = io_full(fd, b, HDR, 0, deadline);
	if (rc && r->rank == 0)
		return fail(r, "%s %s during the %s (#%u)%s", who(r, q, w, sizeof(w)),
				 io_what(rc), op_name(op), r->seq,
				 rc == IO_CLOSED ? ": that process exited or was killed (see its "
						   "own messages)" :
				 rc == IO_TIMEOUT ? ": it is stuck, stopped or gone (the rendezvous "
						    "timeout, pipeline.timeout, ran out)" : "");
	if (rc)
		return fail(r, "rank %d: %s %s during the %s (#%u)%s", r->rank,
				 who(r, q, w, sizeof(w)), io_what(rc), op_name(op), r->seq,
				 rc == IO_CLOSED ? ": rank 0 exited or was killed (see its messages)" :
				 rc == IO_TIMEOUT ? ": rank 0 is stuck or waits for another rank "
						    "(pipeline.timeout ran out)" : "");
	get_hdr(b, h);
	if (h->magic != RDV_MAGIC || h->version != RDV_VERSION)
		return r->rank == 0 ? fail(r, "%s sent a message that is not asyncpp's "
						"rendezvous protocol version %d", who(r, q, w, sizeof(w)),
						RDV_VERSION)
				    : fail(r, "rank %d: %s sent a message that is not asyncpp's "
						"rendezvous protocol version %d", r->rank,
						who(r, q, w, sizeof(w)), RDV_VERSION);
	if (r->rank != 0 && h->op == OP_ABORT) {
		int trc;
		char *why = read_text(fd, h->len, deadline_in(2.0), &trc);
		fail(r, "rank %d stops: rank 0 reports: %s", r->rank,
			  why ? why : "(its message was lost)");
		free(why);
		return -1;
	}
	if (h->op != op || h->seq != r->seq || (int)h->rank != (r->rank == 0 ? q : 0))
		return r->rank == 0
			       ? fail(r, "%s sent a %s (#%u) while rank 0 is in a %s (#%u): the "
					   "ranks run the collectives in different orders (internal "
					   "error)", who(r, q, w, sizeof(w)), op_name(h->op), h->seq,
					   op_name(op), r->seq)
			       : fail(r, "rank %d: %s sent a %s (#%u) while rank %d is in a %s "
					   "(#%u): the ranks run the collectives in different orders "
					   "(internal error)", r->rank, who(r, q, w, sizeof(w)),
					   op_name(h->op), h->seq, r->rank, op_name(op), r->seq);
	return 0;
}

/* Read a message of op with exactly n payload bytes into buf. */
static int recv_exact(struct rdv *r, int q, unsigned op, void *buf, size_t n, double deadline)
{
	struct hdr h;
	char w[320];
	if (read_hdr(r, q, op, &h, deadline))
		return -1;
	if (h.len != n)
		return r->rank == 0
			       ? fail(r, "%s sent %llu bytes in the %s (#%u), rank 0 expects %zu: "
					   "the ranks disagree on the size (internal error)",
					   who(r, q, w, sizeof(w)), (unsigned long long)h.len,
					   op_name(op), r->seq, n)
			       : fail(r, "rank %d: %s sent %llu bytes in the %s (#%u), this rank "
					   "expects %zu (internal error)", r->rank,
					   who(r, q, w, sizeof(w)), (unsigned long long)h.len,
					   op_name(op), r->seq, n);
	int rc = n ? io_full(r->peer[q].fd, buf, n, 0, deadline) : IO_OK;
	if (rc && r->rank == 0)
		return fail(r, "%s %s in the middle of the %s (#%u)", who(r, q, w, sizeof(w)),
				 io_what(rc), op_name(op), r->seq);
	if (rc)
		return fail(r, "rank %d: %s %s in the middle of the %s (#%u)", r->rank,
				 who(r, q, w, sizeof(w)), io_what(rc), op_name(op), r->seq);
	return 0;
}

static int send_to(struct rdv *r, int q, unsigned op, const void *p, size_t n, double deadline)
{
	int rc = send_msg(r->peer[q].fd, op, r->rank, r->world, r->seq, p, n, deadline);
	if (!rc)
		return 0;
	char w[320];
	if (r->rank == 0)
		return fail(r, "cannot send the %s (#%u) to %s: it %s", op_name(op), r->seq,
				 who(r, q, w, sizeof(w)), io_what(rc));
	return fail(r, "rank %d: cannot send the %s (#%u) to %s: it %s", r->rank, op_name(op),
			 r->seq, who(r, q, w, sizeof(w)), io_what(rc));
}

/* Rank 0: one message of op with n payload bytes from every other rank
 * (only = 0; rank q's into dst + q * n) or from rank only alone (into dst),
 * in whatever order they come; dst may be NULL when n is 0. Watches the
 * ranks not expected too: one that closes its socket (or sends anything)
 * fails the collective at once. */
static int root_collect(struct rdv *r, unsigned op, int only, char *dst, size_t n,
			double deadline)
{
	int W = r->world, left = only ? 1 : W - 1;
	struct pollfd *pf = xcalloc((size_t)W, sizeof(*pf));
	unsigned char *done = xcalloc((size_t)W, 1);
	int rc = 0;
	while (left && !rc) {
		for (int q = 1; q < W; q++)
			pf[q] = (struct pollfd){done[q] ? -1 : r->peer[q].fd, POLLIN, 0};
		int ms = poll_ms(deadline);
		int got = ms == 0 ? 0 : poll(pf + 1, (nfds_t)(W - 1), ms);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			rc = fail(r, "rank 0: poll failed during the %s: %s", op_name(op),
				       strerror(errno));
			break;
		}
		if (got == 0) {
			char names[400] = "", w[320];
			size_t k = 0;
			int count = 0, first = 0;
			for (int q = 1; q < W && k < sizeof(names) - 32; q++)
				if ((!only || q == only) && !done[q]) {
					k += (size_t)snprintf(names + k, sizeof(names) - k, "%s%d",
							      count++ ? ", " : "", q);
					first = first ? first : q;
				}
			if (count == 1)
				rc = fail(r, "rank 0 waited %g s in the %s (#%u) for %s: it is "
					       "stuck, stopped or gone (pipeline.timeout = %g s)",
					       r->timeout, op_name(op), r->seq,
					       who(r, first, w, sizeof(w)), r->timeout);
			else
				rc = fail(r, "rank 0 waited %g s in the %s (#%u) for ranks %s "
					       "(the first: %s): they are stuck, stopped or gone "
					       "(pipeline.timeout = %g s)", r->timeout, op_name(op),
					       r->seq, names, who(r, first, w, sizeof(w)), r->timeout);
			break;
		}
		for (int q = 1; q < W && !rc; q++) {
			if (done[q] || !pf[q].revents)
				continue;
			if (only && q != only) {
				/* nothing is due from q: this is its end, or a stray message */
				struct hdr h;
				rc = read_hdr(r, q, op, &h, deadline) ? -1
					: fail(r, "internal error: rank %d sent a %s out of turn",
						    q, op_name(op));
				break;
			}
			char *to = !dst ? NULL : only ? dst : dst + (size_t)q * n;
			if (recv_exact(r, q, op, to, n, deadline)) {
				rc = -1;
				break;
			}
			done[q] = 1;
			left--;
		}
	}
	free(pf);
	free(done);
	return rc;
}

static int begin(struct rdv *r, double *deadline)
{
	*deadline = 0;
	if (r->broken)
		return error("rank %d: the rendezvous failed earlier", r->rank);
	r->seq++;
	*deadline = deadline_in(r->timeout > 0 ? r->timeout + (r->rank ? r->grace : 0) : 0);
	return 0;
}

/* ---- collectives ---- */

int rdv_barrier(struct rdv *r)
{
	double dl;
	if (begin(r, &dl))
		return -1;
	if (r->rank) {
		if (send_to(r, 0, OP_BARRIER, NULL, 0, dl))
			return -1;
		return recv_exact(r, 0, OP_BARRIER, NULL, 0, dl);
	}
	int rc = root_collect(r, OP_BARRIER, 0, NULL, 0, dl);
	for (int q = 1; q < r->world && !rc; q++)
		rc = send_to(r, q, OP_BARRIER, NULL, 0, dl);
	return rc;
}

int rdv_bcast(struct rdv *r, void *buf, size_t n, int root)
{
	double dl;
	if (root < 0 || root >= r->world)
		return error("internal error: broadcast from rank %d of %d", root, r->world);
	if (begin(r, &dl))
		return -1;
	if (r->rank) {
		if (r->rank == root)
			return send_to(r, 0, OP_BCAST, buf, n, dl);
		return recv_exact(r, 0, OP_BCAST, buf, n, dl);
	}
	int rc = 0;
	if (root != 0)
		rc = root_collect(r, OP_BCAST, root, buf, n, dl);
	for (int q = 1; q < r->world && !rc; q++)
		if (q != root)
			rc = send_to(r, q, OP_BCAST, buf, n, dl);
	return rc;
}

int rdv_allgather(struct rdv *r, const void *mine, void *all, size_t n)
{
	double dl;
	if (begin(r, &dl))
		return -1;
	size_t total = st_mult((size_t)r->world, n);
	if (r->rank) {
		if (send_to(r, 0, OP_GATHER, mine, n, dl))
			return -1;
		return recv_exact(r, 0, OP_GATHER, all, total, dl);
	}
	memmove(all, mine, n);
	int rc = root_collect(r, OP_GATHER, 0, all, n, dl);
	for (int q = 1; q < r->world && !rc; q++)
		rc = send_to(r, q, OP_GATHER, all, total, dl);
	return rc;
}

int rdv_agree(struct rdv *r, const char *text, char *diff, size_t len)
{
	if (len)
		diff[0] = 0;
	unsigned char mine[8];
	put_le64(mine, fnv1a64(FNV1A64_INIT, text, strlen(text)));
	unsigned char *all = xmalloc(st_mult((size_t)r->world, 8));
	if (rdv_allgather(r, mine, all, 8)) {
		free(all);
		return -1;
	}
	int odd = 0;
	for (int q = 1; q < r->world && !odd; q++)
		if (memcmp(all + 8 * q, all, 8))
			odd = q;
	free(all);
	if (!odd)
		return 0;
	/* the odd rank's text to rank 0, its length first: a collective of two */
	double dl;
	if (begin(r, &dl))
		return -1;
	size_t n = strlen(text);
	unsigned char len8[8];
	put_le64(len8, n);
	if (r->rank == odd && (send_to(r, 0, OP_TEXT, len8, 8, dl) ||
			       send_to(r, 0, OP_TEXT, text, n, dl)))
		return -1;
	if (r->rank) /* every rank waits until rank 0 has the text */
		return recv_exact(r, 0, OP_TEXT, NULL, 0, dl) ? -1 : odd;
	if (root_collect(r, OP_TEXT, odd, (char *)len8, 8, dl))
		return -1;
	uint64_t theirs_n = get_le64(len8);
	if (theirs_n > MAX_TEXT)
		return fail(r, "rank %d sends a configuration of %llu bytes (internal error)",
				 odd, (unsigned long long)theirs_n);
	char *theirs = xmalloc((size_t)theirs_n + 1);
	if (recv_exact(r, odd, OP_TEXT, theirs, (size_t)theirs_n, dl)) {
		free(theirs);
		return -1;
	}
	theirs[theirs_n] = 0;
	config_first_difference(theirs, text, odd, diff, len);
	free(theirs);
	for (int q = 1; q < r->world; q++)
		if (send_to(r, q, OP_TEXT, NULL, 0, dl))
			return -1;
	return odd;
}

/* ---- joining ---- */

static int listen_socket(struct rdv *r)
{
	int one = 1, zero = 0;
	int fd = socket(AF_INET6, SOCK_STREAM, 0);
	int v6 = fd >= 0;
	if (!v6)
		fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return error("rank 0: cannot create a TCP socket: %s", strerror(errno));
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	int rc;
	if (v6) {
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
		struct sockaddr_in6 a = {0};
		a.sin6_family = AF_INET6;
		a.sin6_addr = in6addr_any;
		a.sin6_port = htons((uint16_t)r->port);
		rc = bind(fd, (struct sockaddr *)&a, sizeof(a));
		if (rc && (errno == EADDRNOTAVAIL || errno == EAFNOSUPPORT)) {
			/* IPv6 switched off on this host: IPv4 alone */
			close(fd);
			fd = socket(AF_INET, SOCK_STREAM, 0);
			if (fd < 0)
				return error("rank 0: cannot create a TCP socket: %s", strerror(errno));
			setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
			v6 = 0;
		}
	}
	if (!v6) {
		struct sockaddr_in a = {0};
		a.sin_family = AF_INET;
		a.sin_addr.s_addr = htonl(INADDR_ANY);
		a.sin_port = htons((uint16_t)r->port);
		rc = bind(fd, (struct sockaddr *)&a, sizeof(a));
	}
	if (rc) {
		int e = errno;
		char host[64];
		my_host(host, sizeof(host));
		close(fd);
		if (e == EADDRINUSE)
			return error("MASTER_PORT %d is in use on host %s (rank 0's): another job, an "
				     "earlier run that is still exiting, or a second process with "
				     "RANK 0 holds it; choose another port (MASTER_PORT)", r->port, host);
		if (e == EACCES)
			return error("rank 0 may not listen on MASTER_PORT %d of host %s (ports below "
				     "1024 need privileges): choose a port above 1024", r->port, host);
		return error("rank 0 cannot listen on MASTER_PORT %d of host %s: %s", r->port, host,
			     strerror(e));
	}
	if (listen(fd, r->world + 16) || set_nonblocking(fd)) {
		int e = errno;
		close(fd);
		return error("rank 0 cannot listen on MASTER_PORT %d: %s", r->port, strerror(e));
	}
	return fd;
}

/* Rank 0: refuse the process on fd (a joining one), say why everywhere. */
PRINTF_LIKE(3, 4) static int root_reject(struct rdv *r, int fd, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	send_msg(fd, OP_REJECT, 0, r->world, 0, msg, strlen(msg), deadline_in(2.0));
	close(fd);
	return fail(r, "%s", msg);
}

/* Rank 0: accept the other W - 1 ranks and check their hellos. */
static int root_join(struct rdv *r, double connect_timeout)
{
	int lfd = listen_socket(r);
	if (lfd < 0)
		return -1;
	double dl = deadline_in(connect_timeout);
	int joined = 1, rc = 0;
	char host[64];
	my_host(host, sizeof(host));
	while (joined < r->world && !rc) {
		struct pollfd pf = {lfd, POLLIN, 0};
		int ms = poll_ms(dl);
		int got = ms == 0 ? 0 : poll(&pf, 1, ms);
		if (got < 0 && errno == EINTR)
			continue;
		if (got == 0) {
			char names[400] = "";
			size_t k = 0;
			int count = 0;
			for (int q = 1; q < r->world && k < sizeof(names) - 32; q++)
				if (r->peer[q].fd < 0)
					k += (size_t)snprintf(names + k, sizeof(names) - k, "%s%d",
							      count++ ? ", " : "", q);
			rc = fail(r, "rank 0 waited %g s for rank%s %s (of WORLD_SIZE = %d) to "
				       "connect to port %d of host %s: start every rank, with "
				       "MASTER_ADDR naming this host and MASTER_PORT = %d (or give them "
				       "longer: ASYNCPP_CONNECT_TIMEOUT)", connect_timeout,
				       count > 1 ? "s" : "", names, r->world, r->port, host, r->port);
			break;
		}
		if (got < 0) {
			rc = fail(r, "rank 0: poll on MASTER_PORT %d failed: %s", r->port,
				       strerror(errno));
			break;
		}
		struct sockaddr_storage sa;
		socklen_t slen = sizeof(sa);
		int fd = accept(lfd, (struct sockaddr *)&sa, &slen);
		if (fd < 0)
			continue; /* EAGAIN, a connection reset before it was taken, ... */
		char addr[80];
		addr_text((struct sockaddr *)&sa, addr, sizeof(addr));
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		set_nonblocking(fd);
		unsigned char b[HDR];
		double hello_dl = deadline_in(HELLO_WAIT);
		if (dl > 0 && hello_dl > dl)
			hello_dl = dl;
		int io = io_full(fd, b, HDR, 0, hello_dl);
		struct hdr h;
		get_hdr(b, &h);
		if (io || h.magic != RDV_MAGIC || h.op != OP_HELLO) {
			/* not one of ours (a port scanner, another program): ignore it */
			warning("ignoring a connection from %s to MASTER_PORT %d: %s", addr, r->port,
				io ? io_what(io) : "not an asyncpp rendezvous hello (does another "
						   "program use this port?)");
			close(fd);
			continue;
		}
		int trc;
		char *their_host = read_text(fd, h.len, hello_dl, &trc);
		if (!their_host) {
			warning("ignoring a connection from %s to MASTER_PORT %d: %s", addr, r->port,
				io_what(trc));
			close(fd);
			continue;
		}
		if (h.version != RDV_VERSION)
			rc = root_reject(r, fd, "the process at %s (host %s) speaks rendezvous protocol "
					 "version %u, rank 0 (host %s) version %d: run the same asyncpp "
					 "build on every node", addr, their_host, h.version, host,
					 RDV_VERSION);
		else if ((int)h.world != r->world)
			rc = root_reject(r, fd, "RANK %u (host %s, %s) was started with WORLD_SIZE = %u, "
					 "rank 0 (host %s) with WORLD_SIZE = %d: start every process "
					 "with the same WORLD_SIZE", h.rank, their_host, addr, h.world,
					 host, r->world);
		else if (h.rank == 0)
			rc = root_reject(r, fd, "a process at %s (host %s) says RANK 0, but rank 0 is the "
					 "process listening on host %s: give the processes RANK 0 to %d, "
					 "each its own", addr, their_host, host, r->world - 1);
		else if ((int)h.rank >= r->world)
			rc = root_reject(r, fd, "a process at %s (host %s) says RANK %u, out of range for "
					 "WORLD_SIZE = %d: give the processes RANK 0 to %d, each its own",
					 addr, their_host, h.rank, r->world, r->world - 1);
		else if (r->peer[h.rank].fd >= 0)
			rc = root_reject(r, fd, "two processes say RANK %u: one on host %s (%s), one on "
					 "host %s (%s): give each process its own RANK (0 to %d)",
					 h.rank, r->peer[h.rank].host, r->peer[h.rank].addr, their_host,
					 addr, r->world - 1);
		else {
			struct peer *p = &r->peer[h.rank];
			p->fd = fd;
			snprintf(p->addr, sizeof(p->addr), "%s", addr);
			snprintf(p->host, sizeof(p->host), "%s", their_host);
			joined++;
		}
		free(their_host);
	}
	close(lfd);
	/* everybody is here: the welcome is the first barrier */
	for (int q = 1; q < r->world && !rc; q++)
		rc = send_to(r, q, OP_WELCOME, NULL, 0, dl);
	return rc;
}

/* Rank > 0: connect to rank 0, retrying until the deadline. */
static int peer_join(struct rdv *r, const char *addr, double connect_timeout)
{
	double dl = deadline_in(connect_timeout);
	char port[16], why[256] = "no attempt";
	snprintf(port, sizeof(port), "%d", r->port);
	int fd = -1;
	for (;;) {
		struct addrinfo hints = {0}, *res = NULL;
		hints.ai_family = AF_UNSPEC;
		hints.ai_socktype = SOCK_STREAM;
		int g = getaddrinfo(addr, port, &hints, &res);
		if (g && g != EAI_AGAIN)
			return fail(r, "rank %d: MASTER_ADDR '%s' cannot be resolved (%s): set it "
					 "to rank 0's host name or address", r->rank, addr,
					 gai_strerror(g));
		if (g)
			snprintf(why, sizeof(why), "%s", gai_strerror(g));
		for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
			fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
			if (fd < 0 || set_nonblocking(fd)) {
				snprintf(why, sizeof(why), "%s", strerror(errno));
				close_fd(&fd);
				continue;
			}
			int c = connect(fd, ai->ai_addr, ai->ai_addrlen);
			if (c && errno == EINPROGRESS) {
				struct pollfd pf = {fd, POLLOUT, 0};
				double step = deadline_in(5.0);
				if (dl > 0 && step > dl)
					step = dl;
				int err = ETIMEDOUT;
				socklen_t el = sizeof(err);
				if (poll(&pf, 1, poll_ms(step)) > 0)
					getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
				c = err ? -1 : 0;
				errno = err;
			}
			if (c) {
				snprintf(why, sizeof(why), "%s", strerror(errno));
				close_fd(&fd);
			}
		}
		if (res)
			freeaddrinfo(res);
		if (fd >= 0)
			break;
		if (dl > 0 && now_sec() >= dl)
			return fail(r, "rank %d could not connect to rank 0 at MASTER_ADDR:"
					 "MASTER_PORT = %s in %g s (last error: %s): is rank 0 running, "
					 "and do MASTER_ADDR and MASTER_PORT name its host and port? "
					 "(ASYNCPP_CONNECT_TIMEOUT sets the wait)", r->rank, r->master,
					 connect_timeout, why);
		struct timespec pause = {0, 50 * 1000 * 1000};
		nanosleep(&pause, NULL);
	}
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	r->peer[0].fd = fd;
	char host[64];
	my_host(host, sizeof(host));
	int rc = send_msg(fd, OP_HELLO, r->rank, r->world, 0, host, strlen(host), dl);
	if (rc)
		return fail(r, "rank %d: cannot say hello to rank 0 at %s: it %s", r->rank,
				 r->master, io_what(rc));
	/* rank 0 answers when every rank has joined; wait a little longer
	 * than it does, so that its word on who is missing comes first */
	unsigned char b[HDR];
	rc = io_full(fd, b, HDR, 0, dl > 0 ? dl + MIN(connect_timeout * 0.5, 5.0) : 0);
	if (rc == IO_TIMEOUT)
		return fail(r, "rank %d reached rank 0 at %s, but not all %d ranks joined in %g s "
				 "(rank 0 names the missing ones)", r->rank, r->master, r->world,
				 connect_timeout);
	if (rc)
		return fail(r, "rank %d: rank 0 at %s %s before every rank had joined (see rank "
				 "0's messages; is something else listening on MASTER_PORT?)", r->rank,
				 r->master, io_what(rc));
	struct hdr h;
	get_hdr(b, &h);
	if (h.magic != RDV_MAGIC)
		return fail(r, "rank %d: what answers at MASTER_ADDR:MASTER_PORT = %s is not "
				 "asyncpp's rendezvous (another program on that port?)", r->rank,
				 r->master);
	if (h.op == OP_REJECT || h.op == OP_ABORT) {
		char *msg = read_text(fd, h.len, deadline_in(2.0), &rc);
		fail(r, "rank %d: rank 0 (%s) %s: %s", r->rank, r->master,
			  h.op == OP_REJECT ? "refused this process" : "stopped the rendezvous",
			  msg ? msg : "(its message was lost)");
		free(msg);
		return -1;
	}
	if (h.op != OP_WELCOME || h.version != RDV_VERSION)
		return fail(r, "rank %d: rank 0 at %s answered with a %s of protocol version %u "
				 "(this rank speaks version %d): run the same asyncpp build everywhere",
				 r->rank, r->master, op_name(h.op), h.version, RDV_VERSION);
	if ((int)h.world != r->world)
		return fail(r, "rank %d: rank 0 has WORLD_SIZE = %u, this rank %d", r->rank,
				 h.world, r->world);
	return 0;
}

struct rdv *rdv_open(const struct rdv_opts *o)
{
	if (o->world < 1 || o->rank < 0 || o->rank >= o->world) {
		error("internal error: rendezvous for rank %d of %d", o->rank, o->world);
		return NULL;
	}
	if (o->port < 1 || o->port > 65535) {
		error("MASTER_PORT = %d: expected a TCP port, 1 to 65535", o->port);
		return NULL;
	}
	if (o->rank && (!o->addr || !*o->addr)) {
		error("rank %d needs MASTER_ADDR: the host name or address of rank 0", o->rank);
		return NULL;
	}
	struct rdv *r = xcalloc(1, sizeof(*r));
	r->rank = o->rank;
	r->world = o->world;
	r->port = o->port;
	r->timeout = o->timeout;
	r->grace = MIN(o->timeout * 0.5, 5.0);
	snprintf(r->master, sizeof(r->master), "%s:%d", o->addr && *o->addr ? o->addr : "*",
		 o->port);
	int n = r->rank == 0 ? r->world : 1;
	r->peer = xcalloc((size_t)n, sizeof(*r->peer));
	for (int q = 0; q < n; q++)
		r->peer[q].fd = -1;
	if (r->world == 1)
		return r;
	int rc = r->rank == 0 ? root_join(r, o->connect_timeout)
			      : peer_join(r, o->addr, o->connect_timeout);
	if (rc) {
		rdv_close(r);
		return NULL;
	}
	return r;
}

void rdv_close(struct rdv *r)
{
	if (!r)
		return;
	close_all(r);
	free(r->peer);
	free(r);
}

int rdv_local_addr(const struct rdv *r, struct sockaddr_storage *sa, socklen_t *len)
{
	int n = r->rank == 0 ? r->world : 1;
	for (int q = 0; q < n; q++) {
		*len = sizeof(*sa);
		if (r->peer[q].fd >= 0 && !getsockname(r->peer[q].fd, (struct sockaddr *)sa, len))
			return 0;
	}
	return error("rank %d: the rendezvous has no connection whose address could be shared",
		     r->rank);
}

int rdv_free_port(const char *host)
{
	struct addrinfo hints = {0}, *res = NULL;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE;
	int g = getaddrinfo(host, "0", &hints, &res);
	if (g)
		return error("cannot resolve '%s': %s", host ? host : "*", gai_strerror(g));
	int port = -1;
	int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
	struct sockaddr_storage sa;
	socklen_t len = sizeof(sa);
	if (fd >= 0 && !bind(fd, res->ai_addr, res->ai_addrlen) &&
	    !getsockname(fd, (struct sockaddr *)&sa, &len))
		port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
						      : ((struct sockaddr_in *)&sa)->sin_port);
	else
		error("cannot find a free TCP port on '%s': %s", host ? host : "*", strerror(errno));
	if (fd >= 0)
		close(fd);
	freeaddrinfo(res);
	return port;
}
