/* expert_mem.c - the expert exchange's memory for a trainer (expert_mem.h). */
#include "expert_mem.h"

#include <stdlib.h>
#include <string.h>

#include "../io/util.h"
#include "../model/model.h"
#include "comm/dist.h"
#include "schedule.h"

/* The most micro-batches piece q of sc has between a forward and the
 * backward pass that ends it (fused, or the weight part) at once: an
 * owner keeps a member's rows that long (comm/experts_plan.h:
 * ep_releases), under as many keys as that (its activation slots may be
 * more: a slot number is not a micro-batch in flight). */
static int in_flight(const struct schedule *sc, int q)
{
	int s = sched_piece_stage(sc, q), c = sched_piece_chunk(sc, q), n, now = 0, most = 0;
	const struct sched_action *a = sched_actions(sc, s, &n);
	for (int i = 0; i < n; i++) {
		if (a[i].chunk != c)
			continue;
		if (a[i].op == SCHED_FORWARD) {
			now++;
			most = MAX(most, now);
		} else if (a[i].op == SCHED_BACKWARD || a[i].op == SCHED_BACKWARD_WEIGHT) {
			now--;
		}
	}
	return most;
}

void trainer_ep_mem(const struct trainer *tr, struct ep_mem *m)
{
	int P = tr->ep_split;
	*m = (struct ep_mem){0};
	if (P < 2 || tr->kind < 0) /* expert parallelism runs in a pipeline */
		return;
	/* a device backend's rows go through host copies over MPI or TCP */
	int staged = !dist_backend_is_host(tr->be) && strcmp(tr->cfg->pipeline_transport, "nccl");
	int r = -1; /* the first replica this process holds a piece of (0 in threads) */
	for (int i = 0; i < tr->N * tr->S && r < 0; i++)
		if (worker_alive(&tr->w[i]))
			r = i / tr->S;
	if (r < 0)
		return;
	/* the lists the trainer's slots came from (trainer.c), a few steps */
	char err[256];
	int stages = tr->S / tr->V;
	int m_sched = tr->kind == SCHED_PIPEDREAM ? tr->M : tr->mb_per_replica;
	struct schedule *sc = sched_build_virtual(tr->kind, stages, m_sched, tr->V, 4 * stages + 4,
						  0, err, sizeof(err));
	if (!sc)
		bug("the schedule the trainer was made with: %s", err);
	struct ep_piece_mem *pc = xcalloc((size_t)tr->S, sizeof(*pc));
	for (int st = 0; st < tr->stages; st++) {
		int n = 0;
		for (int q = 0; q < tr->S; q++) {
			const struct stage_worker *w = &tr->w[r * tr->S + q];
			if (tr->piece_stage[q] != st || !worker_alive(w))
				continue;
			stage_moe_dims(&w->st, &pc[n].d);
			pc[n].layers = w->st.layer_end - w->st.layer_begin;
			pc[n].slots = in_flight(sc, q);
			pc[n].arenas = w->grads[1] != w->grads[0] ? 2 : 1;
			n++;
		}
		struct ep_mem one;
		ep_owner_mem(P, staged, pc, n, &one);
		m->kept += one.kept;
		m->scratch += one.scratch;
		m->acc += one.acc;
		m->staging += one.staging;
	}
	free(pc);
	sched_free(sc);
}
