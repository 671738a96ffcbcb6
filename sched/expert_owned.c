/* expert_owned.c - expert parallelism's memory side (model.expert_parallel
 * = P > 1): each replica keeps optimizer state only for the experts it
 * owns (comm/experts.h: member q of a group owns experts
 * [q*E/P, (q+1)*E/P) of every layer) and updates only those.
 *
 * That is safe because a replica never reads the weights of an expert it
 * does not own during a training segment: the owner runs it on every
 * member's rows with its own copy. So its weight arenas hold only its own
 * experts too (worker_init, model.h: stage_hold_weights), and what reads
 * weights outside training runs each expert with its owner's weights of
 * the same version: in threads in place (evaluation and sampling through
 * trainer_ep_view's hook, checkpoints through trainer_save_version);
 * between processes evaluation through the experts' hook as training
 * (executor.c), checkpoints through trainer_piece_weights, the owners'
 * ranks sending their experts' weights to replica 0's ranks
 * (trainer_send_owned_weights) before their state
 * (trainer_send_owned_state; trainer_ckpt.c: worker_state_tensors). A
 * load gives each replica only its own experts' weights and state
 * (stage_gather, trainer_load): the file is P = 1's.
 *
 * Between processes the owners' parts travel on the control channel
 * (dist_send) to the rank of replica 0 of the same stage, staged through
 * host memory, in the order that rank asks for them.
 */
#include <stdlib.h>
#include <string.h>

#include "../io/util.h"
#include "comm/dist.h"
#include "trainer.h"

/* The control channel's tags (executor.c has 1 and 2; 3 was a refresh of
 * the experts' copies, which replicas no longer hold): the experts' state
 * and weights a checkpoint gathers. */
enum { TAG_EXPERT_STATE = 4, TAG_EXPERT_WEIGHTS = 5 };

/* The replica owning tensor k of piece s (laid out as in w) in replica r's
 * group: an expert's owner under ep_split, else r. */
static int owner_of(const struct trainer *tr, int r, const struct stage_worker *w, int k)
{
	if (tr->ep_split <= 1)
		return r;
	const struct model *m = tr->m;
	int e = model_param_expert(m, &m->params[w->st.params[k].global]);
	if (e < 0)
		return r;
	int P = tr->ep_split;
	return r - r % P + e / (m->cfg.E / P);
}

int trainer_expert_owner(const struct trainer *tr, int r, int s, int k)
{
	return owner_of(tr, r, &tr->w[r * tr->S + s], k);
}

/* The weight arenas of a worker: every version, then every predicted copy. */
static int ring(const struct stage_worker *w, float **arena)
{
	int n = 0;
	for (int v = 0; v < w->n_versions; v++)
		arena[n++] = w->ver[v];
	for (int v = 0; v < w->n_versions && w->predict; v++)
		arena[n++] = w->pred[v];
	return n;
}

/* Outside training, in threads: the hook of piece s of replica r */
struct ep_view {
	struct moe_ep ep; /* first: the hook is the view */
	const struct trainer *tr;
	int r, s;
};

/* The arena of w's ring (a version or a predicted copy) holding fcw, and
 * the offset of fcw in it. Every member's weight arena has the same
 * layout (each holds E/P experts of every layer, the rest alike), so the
 * same arena of the owner (the same version: the replicas move on
 * together) has the owner's experts at that offset. */
static int arena_of(const struct stage_worker *w, const float *fcw, size_t *off)
{
	float *arena[2 * WORKER_MAX_VERSIONS];
	int n = ring(w, arena);
	for (int a = 0; a < n; a++)
		if (fcw >= arena[a] && fcw < arena[a] + w->st.wnumel) {
			*off = (size_t)(fcw - arena[a]);
			return a;
		}
	bug("stage %d's experts' weights are in none of its weight arenas", w->s);
}

static void view_run(const struct moe_ep *ep, int pass, const struct moe_rows *rows,
		     const float *fcw, const float *fcprojw)
{
	const struct ep_view *vw = (const struct ep_view *)ep;
	const struct trainer *tr = vw->tr;
	const struct moe_dims *d = rows->d;
	int P = tr->ep_split, base = vw->r - vw->r % P, G = d->E / P;
	const struct stage_worker *me = &tr->w[vw->r * tr->S + vw->s];
	size_t o1 = 0, o2 = 0;
	int a = fcw ? arena_of(me, fcw, &o1) : 0; /* the weight part reads none */
	if (fcprojw)
		a = arena_of(me, fcprojw, &o2);
	for (int o = base; o < base + P; o++) {
		const struct stage_worker *ow = &tr->w[o * tr->S + vw->s];
		float *arena[2 * WORKER_MAX_VERSIONS];
		ring(ow, arena);
		if (ow->st.wnumel != me->st.wnumel || ow->newest != me->newest)
			bug("piece %d: replica %d's weights (%zu floats, version %ld) and its "
			    "owner %d's (%zu, %ld) differ in layout", vw->s, vw->r,
			    me->st.wnumel, me->newest, o, ow->st.wnumel, ow->newest);
		/* o's experts [(o - base) G, + G) begin its layer's blocks */
		moe_experts(tr->be, pass, rows, fcw ? arena[a] + o1 : NULL,
			    fcprojw ? arena[a] + o2 : NULL, (o - base) * G, (o - base + 1) * G);
	}
}

const struct moe_ep *trainer_ep_view(const struct trainer *tr, int i)
{
	return tr->ep_view ? &tr->ep_view[i].ep : NULL;
}

void trainer_ep_view_prepare(const struct trainer *tr)
{
	if (!tr->ep_view || !tr->be->weights_bf16)
		return;
	for (int i = 0; i < tr->N * tr->S; i++) {
		struct stage_worker *w = &tr->w[i];
		if (!worker_alive(w))
			continue;
		int lane = backend_lane_enter(tr->be, w->lane);
		tr->be->weights_bf16(worker_weights(w, w->newest), w->st.wnumel);
		backend_lane_bind(tr->be, lane);
	}
}

void trainer_own_experts(struct trainer *tr)
{
	int P = (int)tr->cfg->model_expert_parallel;
	if (P > 1 && tr->m->cfg.E % P == 0 && tr->N % P == 0)
		tr->ep_split = P;
}

void trainer_held_experts(const struct trainer *tr, int r, int *e0, int *e1)
{
	int E = tr->m->cfg.E, P = MAX(tr->ep_split, 1);
	*e0 = r % P * (E / P); /* owner_of's split */
	*e1 = *e0 + E / P;
}

void trainer_expert_views(struct trainer *tr)
{
	if (tr->ep_split <= 1 || dist_active(tr->dist))
		return;
	tr->ep_view = xcalloc((size_t)tr->N * tr->S, sizeof(*tr->ep_view));
	for (int i = 0; i < tr->N * tr->S; i++) {
		tr->ep_view[i] = (struct ep_view){.ep = {.experts = view_run}, .tr = tr,
						  .r = i / tr->S, .s = i % tr->S};
		tr->w[i].st.moe_ep = &tr->ep_view[i].ep;
	}
}

void trainer_save_version(struct trainer *tr, int r, int s, long v, float *global)
{
	worker_save_version(&tr->w[r * tr->S + s], v, global);
	if (tr->ep_split <= 1)
		return;
	/* the experts r does not hold, from their owners (the rest the same
	 * bits as r's) */
	int P = tr->ep_split, base = r - r % P;
	for (int o = base; o < base + P; o++)
		if (o != r)
			worker_save_version(&tr->w[o * tr->S + s], v, global);
}

/* A state tensor between an owner's rank and replica 0's rank of its
 * stage: numel 0 when the owner has no part in that buffer. */
struct state_head {
	char name[128];
	size_t numel;
	int rows, cols;
};

int trainer_recv_owned_state(const struct trainer *tr, int s, int o, const char *name,
			     tensor_sink sink, void *ctx)
{
	struct state_head h;
	int from = o * tr->stages + tr->piece_stage[s];
	if (dist_recv(tr->dist, &h, sizeof(h), from, TAG_EXPERT_STATE))
		return -1;
	h.name[sizeof(h.name) - 1] = '\0';
	if (strcmp(h.name, name))
		bug("rank %d sent the state tensor '%s' where '%s' was due", from, h.name, name);
	if (!h.numel)
		return 0;
	if (h.numel > MAX(tr->m->numel, optim_part_bound(tr->m)))
		bug("rank %d sent a state tensor '%s' of %zu floats, more than any optimizer "
		    "keeps for this model", from, h.name, h.numel);
	float *buf = xmalloc(st_mult(h.numel, sizeof(float)));
	int rc = dist_recv(tr->dist, buf, h.numel * sizeof(float), from, TAG_EXPERT_STATE);
	if (!rc)
		rc = sink(ctx, name, buf, h.numel, h.rows, h.cols);
	free(buf);
	return rc;
}

int trainer_send_owned_state(const struct trainer *tr)
{
	int rank = dist_rank(tr->dist), r = rank / tr->stages;
	if (tr->ep_split <= 1 || r == 0 || r >= tr->ep_split)
		return 0; /* only group 0's owners: replica 0 writes the file */
	int rc = 0, to = rank % tr->stages;
	for (int q = 0; q < tr->S && !rc; q++) {
		const struct stage_worker *w = &tr->w[r * tr->S + q];
		if (!trainer_holds(tr, r * tr->S + q))
			continue;
		for (int i = 0; i < optim_state_count(&w->opt) && !rc; i++) {
			struct optim_state_buf sb = optim_state(&w->opt, i);
			float *host = NULL;
			for (int k = 0; k < w->opt.n && !rc; k++) {
				/* what worker_state_tensors asks of this replica */
				if (w->st.params[k].tied_copy || owner_of(tr, 0, w, k) != r)
					continue;
				struct state_head h = {.numel = 0};
				struct optim_part part;
				int g = w->st.params[k].global;
				snprintf(h.name, sizeof(h.name), "%s/%s", sb.name,
					 tr->m->params[g].name);
				if (optim_state_tensor(&w->opt, i, k, &part)) {
					h.numel = part.numel;
					h.rows = part.rows;
					h.cols = part.cols;
				}
				if (h.numel && !host) {
					host = xmalloc(st_mult(sb.numel, sizeof(float)));
					int lane = backend_lane_enter(tr->be, w->lane);
					tr->be->to_host(host, sb.data, sb.numel * sizeof(float));
					backend_lane_bind(tr->be, lane);
				}
				rc = dist_send(tr->dist, &h, sizeof(h), to, TAG_EXPERT_STATE);
				size_t bytes = h.numel * sizeof(float);
				if (!rc && h.numel)
					rc = dist_send(tr->dist, host + part.off, bytes, to,
						       TAG_EXPERT_STATE);
			}
			free(host);
		}
	}
	return rc;
}

/* Between processes under ep_split: a checkpoint's weights of an expert
 * come from its owner's rank. Piece w's tensors that owner o (of group
 * 0) holds for the checkpoint, in tensor order: their floats. */
static size_t owned_floats(const struct trainer *tr, const struct stage_worker *w, int o)
{
	size_t n = 0;
	for (int k = 0; k < w->st.n_params; k++)
		if (owner_of(tr, 0, w, k) == o)
			n += tr->m->params[w->st.params[k].global].numel;
	return n;
}

int trainer_piece_weights(const struct trainer *tr, int q, long v, float *host)
{
	struct stage_worker *w = &tr->w[q]; /* replica 0's */
	float *held = xmalloc(st_mult(w->st.wnumel, sizeof(float)));
	int before = backend_lane_enter(tr->be, w->lane);
	tr->be->to_host(held, worker_weights(w, v), w->st.wnumel * sizeof(float));
	backend_lane_bind(tr->be, before);
	for (int k = 0; k < w->st.n_params; k++) {
		const struct stage_param *sp = &w->st.params[k];
		if (sp->woffset != (size_t)-1)
			memcpy(host + sp->offset, held + sp->woffset,
			       tr->m->params[sp->global].numel * sizeof(float));
	}
	free(held);
	if (tr->ep_split <= 1 || !dist_active(tr->dist))
		return 0;
	int rc = 0;
	for (int o = 1; o < tr->ep_split && !rc; o++) {
		size_t n = owned_floats(tr, w, o);
		if (!n)
			continue;
		float *buf = xmalloc(st_mult(n, sizeof(float))), *at = buf;
		int from = o * tr->stages + tr->piece_stage[q];
		rc = dist_recv(tr->dist, buf, n * sizeof(float), from, TAG_EXPERT_WEIGHTS);
		for (int k = 0; k < w->st.n_params && !rc; k++) {
			const struct stage_param *sp = &w->st.params[k];
			size_t cnt = tr->m->params[sp->global].numel;
			if (owner_of(tr, 0, w, k) != o)
				continue;
			memcpy(host + sp->offset, at, cnt * sizeof(float));
			at += cnt;
		}
		free(buf);
	}
	return rc;
}

int trainer_send_owned_weights(const struct trainer *tr)
{
	int rank = dist_rank(tr->dist), r = rank / tr->stages;
	if (tr->ep_split <= 1 || r == 0 || r >= tr->ep_split)
		return 0; /* only group 0's owners: replica 0 writes the file */
	int rc = 0, to = rank % tr->stages, nv = trainer_n_versions(tr);
	for (int back = 0; back < nv && !rc; back++)
		for (int q = 0; q < tr->S && !rc; q++) {
			struct stage_worker *w = &tr->w[r * tr->S + q];
			if (!trainer_holds(tr, r * tr->S + q))
				continue;
			size_t n = owned_floats(tr, w, r);
			if (!n)
				continue;
			/* what trainer_piece_weights asks of this piece */
			long v = w->newest - MIN(back, w->n_versions - 1);
			float *held = xmalloc(st_mult(w->st.wnumel, sizeof(float)));
			float *buf = xmalloc(st_mult(n, sizeof(float))), *at = buf;
			int lane = backend_lane_enter(tr->be, w->lane);
			tr->be->to_host(held, worker_weights(w, v), w->st.wnumel * sizeof(float));
			backend_lane_bind(tr->be, lane);
			for (int k = 0; k < w->st.n_params; k++) {
				const struct stage_param *sp = &w->st.params[k];
				size_t cnt = tr->m->params[sp->global].numel;
				if (owner_of(tr, 0, w, k) != r)
					continue;
				if (sp->woffset == (size_t)-1)
					bug("rank %d owns %s and does not hold its weights", rank,
					    tr->m->params[sp->global].name);
				memcpy(at, held + sp->woffset, cnt * sizeof(float));
				at += cnt;
			}
			rc = dist_send(tr->dist, buf, n * sizeof(float), to, TAG_EXPERT_WEIGHTS);
			free(held);
			free(buf);
		}
	return rc;
}
