/* p2p.c - the point-to-point interface over whichever carrier runs. See
 * p2p.h. */
#include "p2p.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "dist.h"
#include "p2p_carrier.h"

struct p2p {
	const struct p2p_carrier *k; /* the runtime's (dist.c): outlives its channels */
	void *ch;
};

struct p2p *p2p_open(const struct p2p_carrier *k)
{
	if (!k) {
		error("internal error: messages between processes need MPI or the TCP rendezvous "
		      "running (dist_init)");
		return NULL;
	}
	void *ch = k->open(k->k);
	if (!ch)
		return NULL;
	struct p2p *c = xcalloc(1, sizeof(*c));
	c->k = k;
	c->ch = ch;
	return c;
}

void p2p_close(struct p2p *c)
{
	if (!c)
		return;
	c->k->close(c->k->k, c->ch);
	free(c);
}

const char *p2p_name(const struct p2p *c) { return c->k->name; }

int p2p_tag_limit(const struct p2p *c) { return c->k->tag_limit(c->k->k, c->ch); }

/* A carrier that failed has said why: the job ends (p2p.h). */
static void end_if_broken(const struct p2p_carrier *k)
{
	if (k->broken && k->broken(k->k))
		dist_abort();
}

struct p2p_op *p2p_isend(struct p2p *c, const void *buf, size_t n, int to, int tag)
{
	if (to < 0 || to >= c->k->world || tag < 0 || tag > p2p_tag_limit(c))
		bug("send to rank %d with tag %d (world %d)", to, tag, c->k->world);
	struct p2p_op *op = c->k->isend(c->k->k, c->ch, buf, n, to, tag);
	end_if_broken(c->k);
	return op;
}

struct p2p_op *p2p_irecv(struct p2p *c, void *buf, size_t n, int from, int tag)
{
	if (from < 0 || from >= c->k->world || tag < 0 || tag > p2p_tag_limit(c))
		bug("receive from rank %d with tag %d (world %d)", from, tag, c->k->world);
	struct p2p_op *op = c->k->irecv(c->k->k, c->ch, buf, n, from, tag);
	end_if_broken(c->k);
	return op;
}

/* Frees the completed operations of ops; 1 when none is left. */
static int reap(const struct p2p_carrier *k, struct p2p_op **ops, int n)
{
	int all = 1;
	for (int i = 0; i < n; i++) {
		if (ops[i] && k->done(ops[i]))
			ops[i] = NULL;
		all &= ops[i] == NULL;
	}
	return all;
}

int p2p_test(const struct p2p *c, struct p2p_op **ops, int n)
{
	const struct p2p_carrier *k = c->k;
	k->progress(k->k, 0);
	end_if_broken(k);
	return reap(k, ops, n);
}

void p2p_wait(const struct p2p *c, struct p2p_op **ops, int n, double timeout, int stage,
	      const char *fmt, ...)
{
	const struct p2p_carrier *k = c->k;
	double t0 = now_sec();
	for (long polls = 0;; polls++) {
		/* a short spin first: messages usually come soon */
		double left = timeout > 0 ? timeout - (now_sec() - t0) : 0.05;
		k->progress(k->k, polls < 2000 ? 0 : MAX(0.0, MIN(left, 0.05)));
		end_if_broken(k);
		if (reap(k, ops, n))
			return;
		double waited = now_sec() - t0;
		if (timeout > 0 && waited > timeout) {
			va_list ap;
			va_start(ap, fmt);
			dist_never_came(k->rank, stage, waited, timeout, fmt, ap);
		}
	}
}
