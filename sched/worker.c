/* worker.c - a stage's weight versions, gradients and optimizer. */
#include "worker.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../io/util.h"

/* Which of w's tensors it keeps weights and optimizer state of, when it
 * keeps only the experts [e0, e1) of every layer: every tensor but the
 * other experts. NULL when that is every tensor. */
static unsigned char *held_mask(const struct stage_worker *w, const struct model *m, int e0,
				int e1)
{
	int n = w->st.n_params, all = 1;
	unsigned char *mine = xmalloc((size_t)(n ? n : 1));
	for (int k = 0; k < n; k++) {
		int e = model_param_expert(m, &m->params[w->st.params[k].global]);
		mine[k] = e < 0 || (e >= e0 && e < e1);
		all &= mine[k];
	}
	if (all) {
		free(mine);
		return NULL;
	}
	return mine;
}

/* worker_init's work, on the stage's lane */
static int init_on_lane(struct stage_worker *w, const struct model *m, const struct backend *be,
			const struct config *cfg, const struct stage_cut *cut, int s, int B, int T,
			int n_slots, int delay, int overlapped, const float *params, int e0,
			int e1)
{
	memset(w, 0, sizeof(*w));
	if (delay < 0 || delay + 1 > WORKER_MAX_VERSIONS)
		return error("delay %d out of range (0..%d)", delay, WORKER_MAX_VERSIONS - 1);
	w->be = be;
	w->s = s;
	w->S = cut ? cut->S : 1;
	w->delay = delay;
	w->predict = delay > 0 && cfg->optim_correction &&
		     !strcmp(cfg->optim_correction, "predict");
	w->n_versions = delay + 1 + w->predict;
	if (w->n_versions > WORKER_MAX_VERSIONS)
		return error("delay %d with weight prediction needs %d versions (at most %d)", delay,
			     w->n_versions, WORKER_MAX_VERSIONS);
	if (stage_init(&w->st, m, be, cut, s, B, T, n_slots))
		return -1;
	/* the weight arenas hold only the tensors of mine from the start (a
	 * full arena, even for a moment, may not fit where expert
	 * parallelism is what makes the model fit) */
	unsigned char *mine = held_mask(w, m, e0, e1);
	if (mine && stage_hold_weights(&w->st, mine)) {
		free(mine);
		return -1;
	}
	size_t bytes = st_mult(w->st.wnumel, sizeof(float));
	size_t gbytes = st_mult(w->st.numel, sizeof(float));
	float *host = xmalloc(bytes);
	stage_gather(&w->st, host, params);
	for (int v = 0; v < w->n_versions; v++) {
		w->ver[v] = be->alloc(bytes);
		be->to_device(w->ver[v], host, bytes);
		if (w->predict) { /* p[0] = w[0]: no update made it */
			w->pred[v] = be->alloc(bytes);
			be->to_device(w->pred[v], host, bytes);
		}
	}
	free(host);
	w->grads[0] = be->alloc(gbytes);
	w->grads[1] = overlapped ? be->alloc(gbytes) : w->grads[0];
	int rc = optim_init_owned(&w->opt, be, cfg, m, w->st.params, w->st.n_params, w->st.numel,
				  mine);
	free(mine);
	if (rc)
		return -1;
	optim_weights_at(&w->opt, w->st.params);
	w->sumsq = xcalloc((size_t)w->opt.n + 1, sizeof(double));
	w->wte_param = -1;
	for (int k = 0; k < w->st.n_params; k++) {
		const struct param_info *pi = &m->params[w->st.params[k].global];
		if (!strcmp(pi->name, "wte"))
			w->wte_param = k;
	}
	return 0;
}

int worker_init(struct stage_worker *w, const struct model *m, const struct backend *be,
		const struct config *cfg, const struct stage_cut *cut, int s, int lane, int B,
		int T, int n_slots, int delay, int overlapped, const float *params, int e0, int e1)
{
	/* stage s's memory on its lane's device (backend.h: lanes) */
	int before = backend_lane_enter(be, lane);
	int rc = init_on_lane(w, m, be, cfg, cut, s, B, T, n_slots, delay, overlapped, params, e0,
			      e1);
	w->lane = lane;
	backend_lane_bind(be, before);
	return rc;
}

void worker_free(struct stage_worker *w)
{
	if (!w->be)
		return;
	int before = backend_lane_enter(w->be, w->lane);
	for (int v = 0; v < w->n_versions; v++) {
		w->be->free(w->ver[v]);
		if (w->pred[v])
			w->be->free(w->pred[v]);
	}
	if (w->grads[1] != w->grads[0])
		w->be->free(w->grads[1]);
	w->be->free(w->grads[0]);
	optim_free(&w->opt);
	stage_free(&w->st);
	free(w->sumsq);
	backend_lane_bind(w->be, before);
	memset(w, 0, sizeof(*w));
}

float *worker_weights(struct stage_worker *w, long v)
{
	if (v < 0)
		v = 0;
	if (v > w->newest || v < w->newest - (w->n_versions - 1))
		bug("stage %d asked for weight version %ld, held are %ld..%ld",
		    w->s, v, MAX(0, w->newest - (w->n_versions - 1)), w->newest);
	return w->ver[v % w->n_versions];
}

float *worker_grad_weights(struct stage_worker *w, long v)
{
	float *real = worker_weights(w, v); /* checks v */
	return w->predict ? w->pred[MAX(v, 0) % w->n_versions] : real;
}

/* p[v] = (1+d) w[v] - d w[v-1], in this order of operations everywhere
 * (update, skip, resume), so that all of them give the same bits; p[0] =
 * w[0]. */
static void predict_version(struct stage_worker *w, long v)
{
	size_t n = w->st.wnumel;
	float *p = w->pred[v % w->n_versions], *cur = w->ver[v % w->n_versions];
	if (v <= 0) {
		w->be->copy(p, cur, n * sizeof(float));
		return;
	}
	float d = (float)w->delay;
	w->be->copy(p, w->ver[(v - 1) % w->n_versions], n * sizeof(float));
	w->be->scale(p, -d / (1 + d), n);
	w->be->add(p, p, cur, n);
	w->be->scale(p, 1 + d, n);
}

void worker_predict_held(struct stage_worker *w)
{
	if (!w->predict)
		return;
	int before = backend_lane_enter(w->be, w->lane);
	/* the oldest version held lacks its predecessor; it is never computed
	 * on again (that is why the ring holds one more) */
	for (long v = MAX(0, w->newest - (w->n_versions - 2)); v <= w->newest; v++)
		predict_version(w, v);
	backend_lane_bind(w->be, before);
}

float *worker_grads(struct stage_worker *w, long step) { return w->grads[step % 2]; }

void worker_update(struct stage_worker *w, long step, float lr, float clip_scale)
{
	if (step != w->newest + 1)
		bug("stage %d applies step %ld on version %ld", w->s, step,
		    w->newest);
	float *src = w->ver[w->newest % w->n_versions];
	float *dst = w->ver[(w->newest + 1) % w->n_versions];
	size_t n = w->st.numel;
	if (dst != src)
		w->be->copy(dst, src, w->st.wnumel * sizeof(float));
	float *g = worker_grads(w, step);
	if (clip_scale != 1.0f)
		w->be->scale(g, clip_scale, n);
	optim_step(&w->opt, dst, g, lr, step);
	w->be->zero(g, n * sizeof(float));
	w->newest++;
	if (w->predict)
		predict_version(w, w->newest);
}

void worker_skip(struct stage_worker *w, long step)
{
	if (step != w->newest + 1)
		bug("stage %d skips step %ld on version %ld", w->s, step,
		    w->newest);
	float *src = w->ver[w->newest % w->n_versions];
	float *dst = w->ver[(w->newest + 1) % w->n_versions];
	if (dst != src)
		w->be->copy(dst, src, w->st.wnumel * sizeof(float));
	w->be->zero(worker_grads(w, step), w->st.numel * sizeof(float));
	w->newest++;
	if (w->predict)
		predict_version(w, w->newest);
}

int worker_finish(struct stage_worker *w, long step, double norm, double max_norm, float lr)
{
	if (!isfinite(norm)) {
		worker_skip(w, step);
		return 1;
	}
	float clip = 1.0f;
	if (max_norm > 0 && norm > max_norm)
		clip = (float)(max_norm / (norm + 1e-6));
	worker_update(w, step, lr, clip);
	return 0;
}

void worker_save_version(struct stage_worker *w, long v, float *global)
{
	size_t bytes = st_mult(w->st.wnumel, sizeof(float));
	float *host = xmalloc(bytes);
	int before = backend_lane_enter(w->be, w->lane);
	w->be->to_host(host, worker_weights(w, v), bytes);
	backend_lane_bind(w->be, before);
	stage_scatter(&w->st, global, host);
	free(host);
}

void worker_load_version(struct stage_worker *w, long v, const float *global)
{
	size_t bytes = st_mult(w->st.wnumel, sizeof(float));
	float *host = xmalloc(bytes);
	stage_gather(&w->st, host, global);
	int before = backend_lane_enter(w->be, w->lane);
	w->be->to_device(w->ver[(v < 0 ? 0 : v) % w->n_versions], host, bytes);
	backend_lane_bind(w->be, before);
	free(host);
}
