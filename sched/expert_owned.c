/* expert_owned.c - expert parallelism's memory side (model.expert_parallel
 * = P > 1, in one process: threads): each replica keeps optimizer state
 * only for the experts it owns (comm/experts.h: member q of a group owns
 * experts [q*E/P, (q+1)*E/P) of every layer) and updates only those.
 *
 * That is safe because a replica never reads the weights of an expert it
 * does not own during a training segment: the owner runs it on every
 * member's rows with its own copy. Those stale copies are refreshed from
 * the owner once a segment ends (trainer_refresh_experts), before anything
 * that reads weights outside training (evaluation, checkpoints, sampling,
 * the next segment), every weight version and predicted copy of it, so
 * every replica again holds P = 1's bits. Checkpoints take an expert's
 * state from its owner (worker_state_tensors) and a load gives each replica
 * only its own experts' (trainer_load): the file is P = 1's.
 *
 * Between processes every replica still keeps every expert's state (the
 * refresh and the checkpoint gather would have to travel; not done yet).
 */
#include <stdlib.h>

#include "../io/util.h"
#include "comm/dist.h"
#include "trainer.h"

int trainer_expert_owner(const struct trainer *tr, int r, int s, int k)
{
	if (tr->ep_split <= 1)
		return r;
	const struct stage_worker *w = &tr->w[r * tr->S + s];
	const struct model *m = tr->m;
	int e = model_param_expert(m, &m->params[w->st.params[k].global]);
	if (e < 0)
		return r;
	int P = tr->ep_split;
	return r - r % P + e / (m->cfg.E / P);
}

int trainer_own_experts(struct trainer *tr)
{
	int P = (int)tr->cfg->model_expert_parallel;
	if (P <= 1 || dist_active(tr->dist) || tr->m->cfg.E % P || tr->N % P)
		return 0;
	tr->ep_split = P;
	for (int i = 0; i < tr->N * tr->S; i++) {
		struct stage_worker *w = &tr->w[i];
		int r = i / tr->S, s = i % tr->S, n = w->st.n_params, any = 0;
		unsigned char *mine = xcalloc((size_t)(n ? n : 1), 1);
		for (int k = 0; k < n; k++) {
			mine[k] = trainer_expert_owner(tr, r, s, k) == r;
			any |= !mine[k];
		}
		int rc = any ? worker_own(w, tr->m, tr->cfg, mine) : 0;
		free(mine);
		if (rc)
			return -1;
	}
	return 0;
}

/* dst's tensor k in every arena of the ring from src's (same piece, so the
 * same layout), on the piece's lane. */
static void copy_tensor(const struct trainer *tr, struct stage_worker *dst,
			const struct stage_worker *src, int k)
{
	const struct backend *be = tr->be;
	size_t off = dst->st.params[k].offset;
	size_t bytes = tr->m->params[dst->st.params[k].global].numel * sizeof(float);
	for (int v = 0; v < dst->n_versions; v++) {
		be->copy(dst->ver[v] + off, src->ver[v] + off, bytes);
		if (dst->pred[v])
			be->copy(dst->pred[v] + off, src->pred[v] + off, bytes);
	}
}

void trainer_refresh_experts(struct trainer *tr)
{
	if (tr->ep_split <= 1)
		return;
	for (int i = 0; i < tr->N * tr->S; i++) {
		struct stage_worker *w = &tr->w[i];
		int r = i / tr->S, s = i % tr->S;
		if (w->newest != tr->w[s].newest)
			bug("replica %d piece %d holds version %ld, replica 0 %ld", r, s, w->newest,
			    tr->w[s].newest);
		int before = backend_lane_enter(tr->be, w->lane);
		for (int k = 0; k < w->st.n_params; k++) {
			int owner = trainer_expert_owner(tr, r, s, k);
			if (owner != r)
				copy_tensor(tr, w, &tr->w[owner * tr->S + s], k);
		}
		backend_lane_bind(tr->be, before);
	}
}
