/* trainer_ckpt.c - save and restore a trainer through io/formats/checkpoint.h.
 *
 * Everything is stored in the model's global layout, tensor by tensor, so a
 * checkpoint does not depend on how the model was cut into stages: a run
 * can resume with another pipeline.stages (and a one-device delay = 1 run
 * is a valid starting point for a 2bw pipeline and back). Stored sets:
 *   weights.vK/NAME   the weights K steps before the newest (K < versions)
 *   STATE/NAME        each optimizer state buffer (adam_m, muon_momentum,
 *                     ef_prev_update, ...) for the tensors that use it
 * The last stage's tied copy of wte is not stored: it equals wte.
 *
 * Data-parallel replicas hold the same bits: a save writes replica 0 (the
 * first S workers), a load sets every replica this process holds. So the
 * file does not depend on pipeline.data_parallel either. Under expert
 * parallelism (trainer.h: ep_split) a replica keeps only its own experts'
 * optimizer state: a save takes an expert's from its owner (its worker,
 * or its rank: expert_owned.c), and a load gives each replica the state
 * its optimizer holds.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../io/formats/checkpoint.h"
#include "../io/util.h"
#include "comm/dist.h"
#include "trainer.h"

static void tensor_name(char *out, size_t len, const char *set, const struct param_info *pi)
{
	snprintf(out, len, "%s/%s", set, pi->name);
}

/* Buffer i of worker w in host memory (NULL when it holds no floats). */
static float *state_to_host(const struct trainer *tr, const struct stage_worker *w, int i)
{
	struct optim_state_buf sb = optim_state(&w->opt, i);
	if (!sb.numel)
		return NULL;
	float *host = xmalloc(st_mult(sb.numel, sizeof(float)));
	int before = backend_lane_enter(tr->be, w->lane);
	tr->be->to_host(host, sb.data, sb.numel * sizeof(float));
	backend_lane_bind(tr->be, before);
	return host;
}

int worker_state_tensors(const struct trainer *tr, const struct stage_worker *wk,
			 tensor_sink sink, void *ctx)
{
	const struct model *m = tr->m;
	/* an expert's state comes from its owner's worker (expert_owned.c):
	 * replicas r - r % P .. of wk's group, whose buffers are listed alike */
	int r = (int)(wk - tr->w) / tr->S, s = (int)(wk - tr->w) % tr->S;
	int P = MAX(tr->ep_split, 1), base = r - r % P;
	float **host = xcalloc((size_t)P, sizeof(float *));
	char name[128];
	int rc = 0;
	for (int i = 0; i < optim_state_count(&wk->opt) && !rc; i++) {
		const char *buf_name = optim_state(&wk->opt, i).name;
		for (int k = 0; k < wk->opt.n && !rc; k++) {
			int owner = trainer_expert_owner(tr, r, s, k);
			const struct stage_worker *src = &tr->w[owner * tr->S + s];
			const struct param_info *pi = &m->params[wk->st.params[k].global];
			struct optim_part part;
			if (wk->st.params[k].tied_copy)
				continue;
			tensor_name(name, sizeof(name), buf_name, pi);
			if (!worker_alive(src)) { /* the owner's rank sends it */
				rc = trainer_recv_owned_state(tr, s, owner, name, sink, ctx);
				continue;
			}
			if (!optim_state_tensor(&src->opt, i, k, &part))
				continue;
			if (!host[owner - base])
				host[owner - base] = state_to_host(tr, src, i);
			rc = sink(ctx, name, host[owner - base] + part.off, part.numel, part.rows,
				  part.cols);
		}
		for (int q = 0; q < P; q++) {
			free(host[q]);
			host[q] = NULL;
		}
	}
	free(host);
	return rc;
}

/* The sink of a save: adds to the file until an add fails, then only
 * drains, since under MPI the other ranks are still sending. */
struct save_sink {
	struct ckpt_writer *w; /* NULL when the file could not be created */
	const char *path;
	int rc;
};

/* Nothing non-finite is ever written: a checkpoint is what a run falls back
 * to, and one holding NaN would replace the last good one. The values pass
 * through host memory on their way to the file anyway. */
static int add_to_ckpt(void *ctx, const char *name, const float *data, size_t numel, int rows,
		       int cols)
{
	struct save_sink *ss = ctx;
	size_t i;
	if (!ss->rc && floats_nonfinite(data, numel, &i))
		ss->rc = error("not writing checkpoint '%s': %s[%zu] is %g; the checkpoints "
			       "already written are kept", ss->path, name, i, (double)data[i]);
	if (!ss->rc)
		ss->rc = ckpt_add(ss->w, name, data, numel, rows, cols);
	return 0;
}

int trainer_save_from(struct trainer *tr, const struct ckpt_source *src, const char *path,
		      const char *config_text, const char *extra_meta)
{
	const struct model *m = tr->m;
	int nv = trainer_n_versions(tr);
	char meta[1024], rolled[96] = "";
	if (tr->rollbacks) /* trainer.h: what a resume needs to go on the same way */
		snprintf(rolled, sizeof(rolled), "rollbacks = %ld\ndata_skip = %ld\n", tr->rollbacks,
			 tr->data_skip);
	snprintf(meta, sizeof(meta),
		 "step = %ld\nversions = %d\nseed = %ld\nstages = %d\nmicro_batches = %d\n"
		 "data_position = %ld\nrng_state = %llu\n%s%s",
		 tr->step, nv, tr->cfg->train_seed, tr->S, tr->M,
		 (tr->step + tr->data_skip) * (long)tr->mb_per_step,
		 (unsigned long long)rng_mix((uint64_t)tr->cfg->train_seed, (uint64_t)tr->step),
		 rolled, extra_meta ? extra_meta : "");
	/* every source is consumed even after a failure (see save_sink) */
	struct save_sink ss = {.path = path};
	ss.rc = ckpt_create(&ss.w, path, config_text, meta);
	if (ss.rc)
		ss.w = NULL;
	float *global = xmalloc(st_mult(m->numel, sizeof(float)));
	int src_rc = 0;
	char name[128], set[32];
	for (int back = 0; back < nv; back++) {
		src_rc |= src->weights(src->ctx, back, global);
		snprintf(set, sizeof(set), "weights.v%d", back);
		for (int k = 0; k < m->n_params; k++) {
			const struct param_info *pi = &m->params[k];
			tensor_name(name, sizeof(name), set, pi);
			add_to_ckpt(&ss, name, global + pi->offset, pi->numel, pi->rows, pi->cols);
		}
	}
	free(global);
	for (int s = 0; s < tr->S; s++)
		src_rc |= src->states(src->ctx, s, add_to_ckpt, &ss);
	if (ss.rc || src_rc) {
		if (ss.w)
			ckpt_abort(ss.w);
		return -1;
	}
	return ckpt_commit(ss.w);
}

/* One path for every save: executor.c's gather (the stages this process
 * holds, the others received from their ranks). */
int trainer_save(struct trainer *tr, const char *path, const char *config_text,
		 const char *extra_meta)
{
	return pipeline_save(tr, path, config_text, extra_meta);
}

int ckpt_load_weights(struct ckpt *k, const struct model *m, float *global, int back)
{
	char name[128], set[32];
	snprintf(set, sizeof(set), "weights.v%d", back);
	for (int i = 0; i < m->n_params; i++) {
		const struct param_info *pi = &m->params[i];
		tensor_name(name, sizeof(name), set, pi);
		if (ckpt_read_named(k, name, global + pi->offset, pi->rows, pi->cols))
			return -1;
		size_t at;
		if (floats_nonfinite(global + pi->offset, pi->numel, &at))
			return error("'%s': %s[%zu] is %g: a checkpoint with NaN or infinite weights "
				     "cannot be trained, evaluated, sampled or exported ('asyncpp "
				     "inspect %s' lists them); use an earlier checkpoint", ckpt_path(k),
				     name, at, (double)global[pi->offset + at], ckpt_path(k));
	}
	/* and nothing else: a tensor of another model is no part of this one */
	size_t len = strlen(set);
	for (int i = 0; i < ckpt_count(k); i++) {
		const char *n = ckpt_name(k, i);
		if (!strncmp(n, set, len) && n[len] == '/' && model_find_param(m, n + len + 1) < 0)
			return error("'%s': tensor '%s' is no parameter of the model its "
				     "configuration describes", ckpt_path(k), n);
	}
	return 0;
}

int trainer_load(struct trainer *tr, struct ckpt *k)
{
	const struct model *m = tr->m;
	long step, nv;
	if (ckpt_meta_long(k, "step", &step) || ckpt_meta_long(k, "versions", &nv))
		return -1;
	/* ckpt_open checked the metadata's range, CKPT_MAX_VERSIONS */
	_Static_assert(CKPT_MAX_VERSIONS == WORKER_MAX_VERSIONS, "checkpoint and worker versions");
	int need = trainer_n_versions(tr);
	if (nv < need && step > 0)
		return error("'%s' holds %ld weight version(s); this run's delay needs %d: resume "
			     "with the same train.delay / schedule", ckpt_path(k), nv, need);
	float **versions = xcalloc((size_t)nv, sizeof(float *));
	int rc = 0;
	for (int v = 0; v < nv && !rc; v++) {
		versions[v] = xmalloc(st_mult(m->numel, sizeof(float)));
		rc = ckpt_load_weights(k, m, versions[v], v);
	}
	if (!rc)
		trainer_restore(tr, step, versions, (int)nv);
	long rollbacks = 0, data_skip = 0;
	set_error_quiet(1); /* only a run that rolled back has them */
	if (ckpt_meta_long(k, "rollbacks", &rollbacks) || ckpt_meta_long(k, "data_skip", &data_skip))
		rollbacks = data_skip = 0;
	set_error_quiet(0); /* ckpt_open checked both: in range, or neither */
	if (!rc)
		trainer_set_rollbacks(tr, rollbacks, data_skip);
	for (int v = 0; v < nv; v++)
		free(versions[v]);
	free(versions);
	char name[128];
	/* each replica's own layout: under expert parallelism a replica keeps
	 * only its own experts' state (expert_owned.c), the layout of every
	 * replica with its place in a group (r % P) */
	int P = MAX(tr->ep_split, 1);
	for (int i = 0; i < tr->N * tr->S && !rc; i++) {
		struct stage_worker *wk = &tr->w[i];
		if (!worker_alive(wk))
			continue; /* under MPI, one process holds one stage of one replica */
		const struct stage_worker *like = NULL; /* read already, with this layout */
		for (int r = i / tr->S % P; r < i / tr->S && !like; r += P)
			if (worker_alive(trainer_worker(tr, r, i % tr->S)))
				like = trainer_worker(tr, r, i % tr->S);
		for (int b = 0; like && b < optim_state_count(&wk->opt); b++) {
			struct optim_state_buf sb = optim_state(&wk->opt, b);
			if (optim_state(&like->opt, b).numel != sb.numel)
				bug("replica %d piece %d state '%s' has %zu floats, replica %d %zu",
				    i / tr->S, i % tr->S, sb.name, sb.numel,
				    (int)(like - tr->w) / tr->S, optim_state(&like->opt, b).numel);
			if (!sb.numel)
				continue;
			int before = backend_lane_enter(tr->be, wk->lane);
			tr->be->copy(sb.data, optim_state(&like->opt, b).data,
				     sb.numel * sizeof(float));
			backend_lane_bind(tr->be, before);
		}
		for (int b = 0; !like && b < optim_state_count(&wk->opt) && !rc; b++) {
			struct optim_state_buf sb = optim_state(&wk->opt, b);
			if (!sb.numel)
				continue;
			float *host = xcalloc(sb.numel, sizeof(float));
			for (int t = 0; t < wk->opt.n && !rc; t++) {
				struct optim_part part;
				if (!optim_state_tensor(&wk->opt, b, t, &part))
					continue;
				const struct param_info *pi = &m->params[wk->st.params[t].global];
				tensor_name(name, sizeof(name), sb.name, pi);
				if (ckpt_find(k, name) < 0 && step == 0)
					continue; /* a step-0 checkpoint may lack state */
				rc = ckpt_read_named(k, name, host + part.off, part.rows,
						     part.cols);
				size_t at, n = part.numel;
				if (!rc && floats_nonfinite(host + part.off, n, &at))
					rc = error("'%s': %s[%zu] is %g: a checkpoint with NaN or "
						   "infinite optimizer state cannot be resumed; use an "
						   "earlier checkpoint", ckpt_path(k), name, at,
						   (double)host[part.off + at]);
			}
			if (!rc) {
				int before = backend_lane_enter(tr->be, wk->lane);
				tr->be->to_device(sb.data, host, sb.numel * sizeof(float));
				backend_lane_bind(tr->be, before);
			}
			free(host);
		}
	}
	return rc;
}
