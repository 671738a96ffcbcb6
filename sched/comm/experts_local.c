/* experts_local.c - expert parallelism between the threads of one process
 * (experts.h).
 *
 * Per group and model piece, a call is two barriers: each member publishes
 * its rows, weights and work (experts.h: struct ep_work) and waits for the
 * others; each checks that every member names its own work (a bug()
 * naming both when not: the owner would compute a member's rows with
 * another version's weights); then owner q runs its
 * experts on every member's rows in member order, reading their inputs and
 * writing their outputs and weight gradients in place (the rows of
 * different experts are disjoint, and so are their gradient slices: no two
 * threads write the same bytes); the second barrier ends the call, after
 * which every member's rows hold all their experts' results. On a device
 * backend the replicas of a stage share its lane (one stream: replica.h's
 * sum relies on the same), so the order the barriers give the host calls
 * is the order of their kernels.
 */
#include <stdlib.h>

#include "../../io/util.h"
#include "barrier.h"
#include "experts.h"
#include "experts_plan.h"

struct local_experts;

struct member {
	struct moe_ep ep; /* first: the hook is the member */
	struct local_experts *l;
	int r, s;
	double waited;    /* ep.waited: seconds at the barriers */
	struct ep_work work; /* what its calls compute (x.work) */
};

struct call {
	int pass;
	struct ep_work work;
	const struct moe_rows *rows;
	const float *fcw, *fcprojw;
};

struct group {
	struct barrier in, out;
	struct call *calls; /* [P] the members' calls in progress */
};

struct local_experts {
	struct experts x;
	const struct backend *be;
	int E;
	struct group *g;   /* [N/P * S]: group r / P, piece s at (r / P) * S + s */
	struct member *m;  /* [N * S] */
	atomic_int aborted;
};

static void local_run(const struct moe_ep *ep, int pass, const struct moe_rows *rows,
		      const float *fcw, const float *fcprojw)
{
	const struct member *m = (const struct member *)ep;
	struct local_experts *l = m->l;
	int P = l->x.P, q = m->r % P, E = l->E;
	struct group *g = &l->g[(m->r / P) * l->x.S + m->s];

	g->calls[q] = (struct call){pass, m->work, rows, fcw, fcprojw};
	double w = barrier_wait(&g->in);
	if (atomic_load(&l->aborted))
		return; /* the others may never come */
	/* before anything runs: the owner computes every member's rows with
	 * its own weights, right only on the same version of the same work */
	for (int k = 0; k < P; k++) {
		char mine[160], theirs[160];
		const struct call *c = &g->calls[k];
		if (c->rows->d->E != E)
			bug("piece %d: replica %d runs its experts' pass over %d experts, replica "
			    "%d over %d", m->s, m->r, E, m->r - q + k, c->rows->d->E);
		if (!ep_work_agrees(pass, &m->work, c->pass, &c->work, mine, theirs,
				    sizeof(mine)))
			bug("piece %d: the expert-parallel members disagree on the work: replica "
			    "%d runs %s, replica %d %s", m->s, m->r, mine, m->r - q + k, theirs);
	}
	int e0 = q * E / P, e1 = (q + 1) * E / P;
	/* this member's weights of its experts (where its arena holds them) */
	const float *w1 = moe_expert_weights(rows->d, fcw, 0, e0);
	const float *w2 = moe_expert_weights(rows->d, fcprojw, 1, e0);
	for (int k = 0; k < P; k++)
		moe_experts(l->be, pass, g->calls[k].rows, w1, w2, e0, e1);
	w += barrier_wait(&g->out);
	*ep->waited += w;
}

static const struct moe_ep *local_member(struct experts *x, int r, int s)
{
	struct local_experts *l = (struct local_experts *)x;
	if (r < 0 || r >= x->N || s < 0 || s >= x->S)
		bug("no expert-parallel member for replica %d, piece %d", r, s);
	return &l->m[r * x->S + s].ep;
}

static void local_work(struct experts *x, int r, int s, const struct ep_work *w)
{
	struct local_experts *l = (struct local_experts *)x;
	local_member(x, r, s); /* checks r and s */
	l->m[r * x->S + s].work = *w;
}

static void local_abort(struct experts *x)
{
	struct local_experts *l = (struct local_experts *)x;
	atomic_store(&l->aborted, 1);
	for (int i = 0; i < x->N / x->P * x->S; i++) {
		barrier_wake(&l->g[i].in);
		barrier_wake(&l->g[i].out);
	}
}

static void local_destroy(struct experts *x)
{
	struct local_experts *l = (struct local_experts *)x;
	if (!l)
		return;
	for (int i = 0; i < x->N / x->P * x->S; i++) {
		barrier_destroy(&l->g[i].in);
		barrier_destroy(&l->g[i].out);
		free(l->g[i].calls);
	}
	free(l->g);
	free(l->m);
	free(l);
}

struct experts *experts_local(const struct backend *be, int N, int P, int S, int E)
{
	if (P < 1 || N % P || E % P)
		bug("expert parallelism over %d of %d replicas with %d experts", P, N, E);
	struct local_experts *l = xcalloc(1, sizeof(*l));
	l->x = (struct experts){.name = "local", .N = N, .P = P, .S = S, .member = local_member,
				.work = local_work, .abort = local_abort, .destroy = local_destroy};
	l->be = be;
	l->E = E;
	int ng = N / P * S;
	l->g = xcalloc((size_t)ng, sizeof(*l->g));
	for (int i = 0; i < ng; i++) {
		barrier_init(&l->g[i].in, P, &l->aborted);
		barrier_init(&l->g[i].out, P, &l->aborted);
		l->g[i].calls = xcalloc((size_t)P, sizeof(struct call));
	}
	l->m = xcalloc((size_t)N * S, sizeof(*l->m));
	for (int i = 0; i < N * S; i++) {
		l->m[i] = (struct member){.ep = {.experts = local_run}, .l = l, .r = i / S,
					  .s = i % S};
		l->m[i].ep.waited = &l->m[i].waited;
	}
	return &l->x;
}
