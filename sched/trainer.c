/* trainer.c - optimizer steps over stage workers; the single-thread path. */
#include "trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../io/util.h"
#include "../optim/optim.h"
#include "comm/dist.h"
#include "comm/replica.h"
#include "schedule.h"

int trainer_stage_delay(const struct config *cfg, int s, int S)
{
	const char *kind = cfg->train_schedule;
	if (!strcmp(kind, "2bw") || !strcmp(kind, "2bw-zb"))
		return 1;
	if (!strcmp(kind, "pipedream"))
		return S - 1 - s;
	if (!strcmp(kind, "none")) {
		if (!strcmp(cfg->train_delay_mode, "per-stage"))
			return S - 1 - s;
		return (int)cfg->train_delay;
	}
	return 0; /* gpipe, 1f1b, zb-h1: synchronous */
}

static size_t act_elems(const struct trainer *tr)
{
	return st_mult(st_mult((size_t)tr->B, (size_t)tr->T), (size_t)tr->m->cfg.C);
}

int trainer_check_config(const struct config *cfg, const struct dist *d)
{
	int S = (int)cfg->pipeline_stages, M = (int)cfg->pipeline_micro_batches;
	int N = (int)cfg->pipeline_data_parallel;
	int kind = strcmp(cfg->train_schedule, "none") ? sched_kind_from_name(cfg->train_schedule)
						       : -1;
	if (M < 1)
		return error("pipeline.micro_batches = %d: must be at least 1", M);
	/* zb-v leaves a send waiting inside NCCL for its peer's receive while
	 * the sending GPU runs work of its own for the first time: any wait of
	 * that GPU for all its queued work then (a memory allocation, a
	 * kernel's first load, NCCL connecting) hangs both ranks. The causes
	 * known are removed (kernels/cuda/NOTES.md, 2026-11-27), but until a
	 * run on two GPUs shows it, zb-v over nccl takes the opt-in that run
	 * uses. */
	const char *zbv = getenv("ASYNCPP_NCCL_ZBV");
	if (kind == SCHED_ZBV && !strcmp(cfg->pipeline_transport, "nccl") &&
	    !(zbv && !strcmp(zbv, "1")))
		return error("train.schedule = zb-v over pipeline.transport = nccl has not "
			     "run on two GPUs yet: in its first step a stage's GPU runs work it "
			     "has not run before while a send of its waits for the peer's "
			     "receive, and anything that makes the GPU wait for all its queued "
			     "work then (a kernel's first load, an allocation) hangs both ranks. "
			     "Use pipeline.transport = tcp or mpi (messages through host memory) "
			     "or another schedule; ASYNCPP_NCCL_ZBV=1 tries it anyway "
			     "(asyncpp-distributed(7))");
	int between_processes = !strcmp(cfg->pipeline_transport, "nccl") ||
				!strcmp(cfg->pipeline_transport, "tcp");
	if (between_processes && !dist_active(d))
		return error("pipeline.transport = %s connects stage processes (one GPU each for "
			     "nccl): start pipeline.stages x pipeline.data_parallel = %ld of them "
			     "with mpirun, srun or 'torchrun --nproc-per-node %ld --no-python "
			     "asyncpp train ...' (asyncpp-distributed(7)); within one process use "
			     "pipeline.transport = local", cfg->pipeline_transport,
			     cfg->pipeline_stages * MAX(cfg->pipeline_data_parallel, 1),
			     cfg->pipeline_stages * MAX(cfg->pipeline_data_parallel, 1));
	if (!strcmp(cfg->pipeline_transport, "nccl") && strncmp(cfg->train_device, "cuda", 4))
		return error("pipeline.transport = nccl moves tensors between GPUs: set "
			     "train.device = cuda (or use pipeline.transport = mpi for CPU stages)");
	if (strcmp(cfg->train_schedule, "none") && kind < 0)
		return error("unknown schedule '%s'", cfg->train_schedule);
	if (cfg->pipeline_data_parallel < 1 || cfg->pipeline_data_parallel > 4096)
		return error("pipeline.data_parallel = %ld: must be between 1 and 4096",
			     cfg->pipeline_data_parallel);
	if (kind != SCHED_PIPEDREAM && M % N)
		return error("pipeline.micro_batches = %d is not divisible by pipeline.data_parallel = "
			     "%d: each replica takes an equal share of every step's micro-batches",
			     M, N);
	int per_replica = (kind == SCHED_PIPEDREAM ? N : M) / N;
	int twobw = kind == SCHED_2BW || kind == SCHED_2BW_ZB;
	if (twobw && N > 1 && per_replica < S)
		return error("%s needs at least pipeline.stages = %d micro-batches per replica and "
			     "step; pipeline.micro_batches = %d over pipeline.data_parallel = %d "
			     "replicas gives %d", sched_kind_name(kind), S, M, N, per_replica);
	if (twobw && M < S)
		return error("train.schedule = %s needs pipeline.micro_batches >= pipeline.stages "
			     "(got %d < %d): set pipeline.micro_batches = %d or more",
			     sched_kind_name(kind), M, S, S);
	if (kind >= 0 && cfg->train_delay)
		return error("train.delay emulates a pipeline on one worker; it cannot be combined "
			     "with train.schedule = %s (whose delay is built in)", cfg->train_schedule);
	if (kind == SCHED_INTERLEAVED && cfg->pipeline_virtual_stages > 64)
		return error("pipeline.virtual_stages = %ld: at most 64",
			     cfg->pipeline_virtual_stages);
	return 0;
}

int trainer_init(struct trainer *tr, const struct config *cfg, const struct model *m,
		 const struct backend *be, const float *params, struct dataloader *data)
{
	return trainer_init_on(tr, NULL, cfg, m, be, params, data);
}

int trainer_init_on(struct trainer *tr, struct dist *d, const struct config *cfg,
		    const struct model *m, const struct backend *be, const float *params,
		    struct dataloader *data)
{
	int before = backend_lane_current(be); /* bound again when done */
	memset(tr, 0, sizeof(*tr));
	tr->dist = d;
	tr->cfg = cfg;
	tr->m = m;
	tr->be = be;
	tr->V = 1;
	tr->S = (int)cfg->pipeline_stages;
	tr->M = (int)cfg->pipeline_micro_batches;
	tr->B = (int)cfg->train_batch_size;
	tr->T = (int)cfg->model_seq_len;
	tr->N = (int)cfg->pipeline_data_parallel;
	tr->data = data;
	tr->lr_scale = 1.0;
	tr->kind = strcmp(cfg->train_schedule, "none") ? sched_kind_from_name(cfg->train_schedule)
						       : -1;
	if (trainer_check_config(cfg, d))
		return -1;
	/* pipedream's step is one micro-batch per pipeline: N per step */
	tr->mb_per_step = tr->kind == SCHED_PIPEDREAM ? tr->N : tr->M;
	tr->mb_per_replica = tr->mb_per_step / tr->N;
	if (backend_lane_count(be) > 1 && backend_lane_count(be) != tr->S)
		return error("the backend has %d lanes (pipeline.devices) and this run %d stages: "
			     "list one device per stage", backend_lane_count(be), tr->S);
	int V = tr->kind == SCHED_ZBV ? 2
		: tr->kind == SCHED_INTERLEAVED ? (int)cfg->pipeline_virtual_stages : 1;
	if (V > 1) {
		/* V chunks per stage: S pieces for everything but the threads */
		tr->V = V;
		tr->S *= tr->V;
	}
	/* activation slots per stage: 1 when micro-batches run one at a time,
	 * else what the schedule keeps in flight */
	struct schedule *probe = NULL;
	if (tr->kind >= 0) {
		char err[256];
		int sched_m = tr->kind == SCHED_PIPEDREAM ? tr->M : tr->mb_per_replica;
		int stages = tr->S / tr->V;
		probe = sched_build_virtual(tr->kind, stages, sched_m, tr->V, 4 * stages + 4, 0,
					    err, sizeof(err));
		if (!probe)
			return error("%s", err);
		/* NCCL pairs a channel's messages by their order (nccl.h) */
		char why[512];
		if (!strcmp(cfg->pipeline_transport, "nccl") &&
		    sched_check_channel_order(probe, why, sizeof(why))) {
			sched_free(probe);
			return error("internal error: the %s schedule's sends and receives do not "
				     "pair up in order, as pipeline.transport = nccl needs: %s",
				     cfg->train_schedule, why);
		}
	}
	/* where each piece lives: stage s holds piece s (V = 1) or the
	 * schedule's V pieces */
	tr->stages = tr->S / tr->V;
	tr->piece_stage = xmalloc((size_t)tr->S * sizeof(int));
	tr->piece_chunk = xmalloc((size_t)tr->S * sizeof(int));
	for (int q = 0; q < tr->S; q++) {
		tr->piece_stage[q] = probe ? sched_piece_stage(probe, q) : q;
		tr->piece_chunk[q] = probe ? sched_piece_chunk(probe, q) : 0;
	}
	/* the one place a run's cut is made (a process of a multi-process run
	 * initialises its pieces' weights from it, below) */
	int cut_rc;
	if (tr->V > 1) {
		/* the existing cut code over S pieces: pipeline.layers lists
		 * one count per piece */
		int counts[4096];
		char why[256];
		int listed = !strcmp(cfg->pipeline_split, "layers")
				     ? cut_parse_list(cfg->pipeline_layers, counts, 4096, why,
						      sizeof(why))
				     : tr->S;
		if (listed >= 0 && listed != tr->S) {
			sched_free(probe);
			return error("pipeline.layers = %s lists %d counts; train.schedule = %s "
				     "cuts the model into pipeline.stages x %d = %d pieces: give "
				     "one layer count per piece", cfg->pipeline_layers, listed,
				     cfg->train_schedule, tr->V, tr->S);
		}
		struct config pieces;
		char n[16];
		config_copy(&pieces, cfg);
		snprintf(n, sizeof(n), "%d", tr->S);
		cut_rc = config_set_key(&pieces, "pipeline", "stages", n, "interleaved") ||
			 cut_from_config(&tr->cut, &pieces, m);
		config_free(&pieces);
	} else {
		cut_rc = cut_from_config(&tr->cut, cfg, m);
	}
	if (cut_rc) {
		sched_free(probe);
		return -1;
	}
	/* stage 0's delay is the largest: name the keys that set it when its
	 * weight versions would not fit (worker_init would only say "delay") */
	int d0 = trainer_stage_delay(cfg, 0, tr->S);
	int versions = d0 + 1 + (d0 > 0 && cfg->optim_correction &&
				 !strcmp(cfg->optim_correction, "predict"));
	if (versions > WORKER_MAX_VERSIONS) {
		sched_free(probe);
		if (tr->kind < 0 && strcmp(cfg->train_delay_mode, "per-stage"))
			return error("train.delay = %d%s needs %d weight versions; at most %d fit: "
				     "lower train.delay", d0, versions > d0 + 1 ?
				     " with optim.correction = predict" : "", versions,
				     WORKER_MAX_VERSIONS);
		return error("pipeline.stages = %d delays stage 0 by %d steps (%s), which needs %d "
			     "weight versions; at most %d fit: use fewer stages", tr->S, d0,
			     tr->kind < 0 ? "train.delay_mode = per-stage" : "train.schedule = "
			     "pipedream", versions, WORKER_MAX_VERSIONS);
	}
	/* under MPI a process runs one stage of one replica and builds only
	 * the workers of its pieces (rank 0 writes checkpoints from what the
	 * other ranks send: pipeline_save) */
	tr->w = xcalloc(st_mult((size_t)tr->N, (size_t)tr->S), sizeof(*tr->w));
	float *mine = NULL; /* params NULL: this process's pieces initialised here */
	if (!params) {
		mine = xmalloc(st_mult(m->numel, sizeof(float))); /* the rest stays untouched */
		for (int q = 0; q < tr->S; q++)
			if (trainer_holds(tr, (dist_active(d) ? dist_rank(d) / tr->stages : 0) *
						      tr->S + q))
				model_init_weights_stage(m, mine, (uint64_t)cfg->train_seed, &tr->cut,
							 q);
		params = mine;
	}
	trainer_own_experts(tr);
	for (int i = 0; i < tr->N * tr->S; i++) {
		int s = i % tr->S, e0, e1;
		if (!trainer_holds(tr, i))
			continue;
		int delay = trainer_stage_delay(cfg, s, tr->S);
		int slots = probe ? sched_piece_slots(probe, s) : 1;
		trainer_held_experts(tr, i / tr->S, &e0, &e1);
		if (worker_init(&tr->w[i], m, be, cfg, &tr->cut, s, trainer_lane(tr, s), tr->B,
				tr->T, slots, delay, tr->kind >= 0, params, e0, e1)) {
			sched_free(probe);
			free(mine);
			return -1;
		}
		/* zero-bubble kinds run the backward as B and W (model.h); the
		 * head's gradient stays in the last stage's forward, as the
		 * fused kinds have it (no SPLIT_HEAD) */
		if (tr->kind >= 0 && sched_kind_split(tr->kind)) {
			int lane = backend_lane_enter(be, trainer_lane(tr, s));
			int rc = stage_split_init(&tr->w[i].st, 0);
			backend_lane_bind(be, lane);
			if (rc) {
				sched_free(probe);
				free(mine);
				return -1;
			}
		}
	}
	sched_free(probe);
	free(mine);
	trainer_expert_views(tr);
	/* the one-worker buffers; with lanes (backend.h) only evaluation uses
	 * them, x[s] written by piece s-1 on its lane, the inputs read on
	 * piece 0's, the targets on the last piece's */
	size_t n = act_elems(tr), bytes = st_mult(n, act_size(be));
	tr->x = xcalloc((size_t)tr->S + 1, sizeof(void *));
	tr->dx = xcalloc((size_t)tr->S + 1, sizeof(void *));
	tr->x_peer = xcalloc((size_t)tr->S + 1, sizeof(void *));
	for (int s = 0; s <= tr->S; s++) {
		int writer = trainer_lane(tr, MAX(0, MIN(s - 1, tr->S - 1)));
		backend_lane_bind(be, writer);
		tr->x[s] = be->alloc(bytes);
		backend_lane_bind(be, before);
		tr->dx[s] = be->alloc(bytes);
		if (s > 0 && s < tr->S && !backend_same_device(be, writer, trainer_lane(tr, s))) {
			backend_lane_bind(be, trainer_lane(tr, s));
			tr->x_peer[s] = be->alloc(bytes);
			backend_lane_bind(be, before);
		}
	}
	size_t bt = (size_t)tr->B * (size_t)tr->T;
	backend_lane_bind(be, trainer_lane(tr, 0)); /* piece 0's */
	tr->inputs = be->alloc(bt * sizeof(int32_t));
	backend_lane_bind(be, trainer_lane(tr, tr->S - 1));
	tr->targets = be->alloc(bt * sizeof(int32_t));
	backend_lane_bind(be, before);
	return 0;
}

int trainer_lane(const struct trainer *tr, int q)
{
	return tr->piece_stage ? tr->piece_stage[q] : q;
}

int trainer_holds(const struct trainer *tr, int i)
{
	if (!dist_active(tr->dist))
		return 1;
	int rank = dist_rank(tr->dist);
	return i / tr->S == rank / tr->stages && tr->piece_stage[i % tr->S] == rank % tr->stages;
}

void trainer_free(struct trainer *tr)
{
	int before = backend_lane_current(tr->be); /* bound again when done */
	cut_free(&tr->cut);
	if (!tr->w) {
		free(tr->piece_stage);
		free(tr->piece_chunk);
		tr->piece_stage = tr->piece_chunk = NULL;
		return;
	}
	tr->be->synchronize(); /* nothing still uses what is freed below */
	for (int i = 0; i < tr->N * tr->S; i++)
		worker_free(&tr->w[i]);
	for (int s = 0; tr->x && s <= tr->S; s++) { /* NULL: trainer_init failed before them */
		backend_lane_bind(tr->be, trainer_lane(tr, MAX(0, MIN(s - 1, tr->S - 1))));
		tr->be->free(tr->x[s]);
		backend_lane_bind(tr->be, trainer_lane(tr, MIN(s, tr->S - 1)));
		tr->be->free(tr->x_peer[s]);
		backend_lane_bind(tr->be, before);
		tr->be->free(tr->dx[s]);
	}
	free(tr->x);
	free(tr->dx);
	free(tr->x_peer);
	free(tr->w);
	free(tr->moe_tokens);
	free(tr->ep_view);
	backend_lane_bind(tr->be, trainer_lane(tr, 0));
	tr->be->free(tr->inputs);
	backend_lane_bind(tr->be, trainer_lane(tr, tr->S - 1));
	tr->be->free(tr->targets);
	backend_lane_bind(tr->be, before);
	free(tr->piece_stage);
	free(tr->piece_chunk);
	memset(tr, 0, sizeof(*tr));
}

size_t trainer_moe_width(const struct trainer *tr)
{
	int E = tr->m->cfg.E;
	return E ? (size_t)tr->S * (size_t)(2 + E) : 0;
}

void trainer_moe_begin(struct trainer *tr, int n)
{
	int E = tr->m->cfg.E;
	if (!E)
		return;
	free(tr->moe_tokens);
	tr->moe_tokens = xcalloc(st_mult((size_t)MAX(n, 1), (size_t)E), sizeof(double));
}

void trainer_moe_step(struct trainer *tr, const double *per_mb, int i, struct step_stats *st)
{
	int E = tr->m->cfg.E, w = 2 + E;
	if (!E)
		return;
	double *tokens = tr->moe_tokens + (size_t)i * E, bal = 0, z = 0;
	for (int mb = 0; mb < tr->mb_per_step; mb++)
		for (int s = 0; s < tr->S; s++) {
			const double *v = per_mb + ((size_t)mb * tr->S + s) * w;
			bal += v[0];
			z += v[1];
			for (int e = 0; e < E; e++)
				tokens[e] += v[2 + e];
		}
	double layers = (double)tr->mb_per_step * tr->m->cfg.L;
	st->moe_balance = bal / layers;
	st->moe_z = z / layers;
	st->expert_tokens = tokens;
}

/* Load micro-batch `index` into the backend's input and target buffers. */
static void load_batch(struct trainer *tr, struct dataloader *dl, long index)
{
	int before = backend_lane_current(tr->be); /* bound again when done */
	size_t bt = (size_t)tr->B * (size_t)tr->T;
	int32_t *in = xmalloc(bt * sizeof(int32_t)), *tg = xmalloc(bt * sizeof(int32_t));
	dataloader_batch(dl, index, in, tg);
	backend_lane_bind(tr->be, 0); /* the inputs on stage 0's lane, the targets on the last's */
	tr->be->to_device(tr->inputs, in, bt * sizeof(int32_t));
	backend_lane_bind(tr->be, trainer_lane(tr, tr->S - 1));
	tr->be->to_device(tr->targets, tg, bt * sizeof(int32_t));
	backend_lane_bind(tr->be, before);
	free(in);
	free(tg);
}

/* Forward one micro-batch through every stage of replica r in order (slot
 * 0). With grads, the last stage also back-propagates through its head.
 * With lanes (evaluation only) stage s runs on lane s and waits for every
 * lane before the next stage reads its output: evaluation need not be
 * fast, and a full wait is plainly enough. */
static float forward_all(struct trainer *tr, int r, long version_step, int with_grads, long step)
{
	int before = backend_lane_current(tr->be); /* bound again when done */
	float loss = 0.0f;
	int lanes = backend_lane_count(tr->be) > 1;
	for (int s = 0; s < tr->S; s++) {
		struct stage_worker *w = trainer_worker(tr, r, s);
		long v = with_grads ? version_step - w->delay : w->newest;
		int last = s == tr->S - 1;
		backend_lane_bind(tr->be, trainer_lane(tr, s));
		void *x_in = s == 0 ? NULL : tr->x[s];
		if (tr->x_peer[s]) { /* stage s-1 wrote it on another device */
			tr->be->copy(tr->x_peer[s], x_in,
				     st_mult(act_elems(tr), act_size(tr->be)));
			x_in = tr->x_peer[s];
		}
		stage_forward(&w->st, 0, with_grads ? worker_grad_weights(w, v) : worker_weights(w, v),
			      s == 0 ? tr->inputs : NULL, x_in, last ? tr->targets : NULL,
			      last ? NULL : tr->x[s + 1], last ? &loss : NULL, NULL,
			      last && with_grads ? worker_grads(w, step) : NULL,
			      1.0f / (float)tr->mb_per_step);
		if (lanes)
			tr->be->synchronize();
	}
	backend_lane_bind(tr->be, before);
	return loss;
}

static void backward_all(struct trainer *tr, int r, long version_step, long step)
{
	for (int s = tr->S - 1; s >= 0; s--) {
		struct stage_worker *w = trainer_worker(tr, r, s);
		stage_backward(&w->st, 0, worker_grad_weights(w, version_step - w->delay),
			       worker_grads(w, step), s == tr->S - 1 ? NULL : tr->dx[s + 1],
			       s == 0 ? NULL : tr->dx[s]);
	}
}

/* Steps 1-4 of trainer.h on replica r. */
static double finish_replica(struct trainer *tr, int r, long step, double *lr_out)
{
	const struct model *m = tr->m;
	struct stage_worker *first = trainer_worker(tr, r, 0);
	struct stage_worker *last = trainer_worker(tr, r, tr->S - 1);
	/* 1. tied embeddings: embedding part + head part */
	if (m->cfg.tied) {
		if (tr->S == 1) {
			stage_finish_grads(&first->st, worker_grads(first, step));
		} else if (first->wte_param >= 0 && last->wte_param >= 0) {
			size_t n = (size_t)m->cfg.Vp * (size_t)m->cfg.C;
			float *a = worker_grads(first, step) + first->st.params[first->wte_param].offset;
			float *b = worker_grads(last, step) + last->st.params[last->wte_param].offset;
			tr->be->add(a, a, b, n);
			tr->be->copy(b, a, n * sizeof(float));
		}
	}
	/* 2. global norm, tensor by tensor in global order */
	double total = 0.0;
	for (int s = 0; s < tr->S; s++) {
		struct stage_worker *w = trainer_worker(tr, r, s);
		optim_grad_sumsq(&w->opt, worker_grads(w, step), w->sumsq);
		for (int k = 0; k < w->opt.n; k++)
			total += w->sumsq[k];
	}
	double norm = sqrt(total);
	/* 3-4. clip and update, or skip when the norm is not finite */
	double lr = lr_at(tr->cfg, step) * tr->lr_scale;
	for (int s = 0; s < tr->S; s++)
		worker_finish(trainer_worker(tr, r, s), step, norm, tr->cfg->train_grad_clip,
			      (float)lr);
	if (lr_out)
		*lr_out = lr;
	return norm;
}

double trainer_finish_step(struct trainer *tr, long step, double *lr_out)
{
	if (tr->N > 1) {
		/* the replicas' gradients summed in replica order, every buffer
		 * the tied head part lives in included (S = 1 keeps it apart) */
		float **g = xcalloc((size_t)tr->N, sizeof(float *));
		for (int s = 0; s < tr->S; s++) {
			for (int r = 0; r < tr->N; r++)
				g[r] = worker_grads(trainer_worker(tr, r, s), step);
			replicas_sum_serial(tr->be, g, tr->N, tr->w[s].st.numel);
			if (tr->w[s].st.tied_head_grad) {
				for (int r = 0; r < tr->N; r++)
					g[r] = trainer_worker(tr, r, s)->st.tied_head_grad;
				replicas_sum_serial(tr->be, g, tr->N,
						    (size_t)tr->m->cfg.Vp * (size_t)tr->m->cfg.C);
			}
		}
		free(g);
	}
	double norm = 0.0;
	for (int r = 0; r < tr->N; r++)
		norm = finish_replica(tr, r, step, r ? NULL : lr_out);
	return norm;
}

static void phase(struct trainer *tr, int p)
{
	if (tr->on_phase)
		tr->on_phase(tr->on_phase_ctx, p);
}

int trainer_run(struct trainer *tr, int n, struct step_stats *stats)
{
	if (tr->kind >= 0)
		return pipeline_run(tr, n, stats);
	size_t mw = trainer_moe_width(tr);
	double *moe = mw ? xcalloc(st_mult(mw, (size_t)tr->mb_per_step), sizeof(double)) : NULL;
	trainer_moe_begin(tr, n);
	for (int i = 0; i < n; i++) {
		long t = tr->step; /* 0-based index of this step */
		double sum = 0.0;
		/* replica after replica: the micro-batches in ascending order */
		for (int r = 0; r < tr->N; r++)
			for (int k = 0; k < tr->mb_per_replica; k++) {
				int mb = r * tr->mb_per_replica + k;
				phase(tr, TRAINER_PHASE_DATA);
				load_batch(tr, tr->data, (t + tr->data_skip) * tr->mb_per_step + mb);
				phase(tr, TRAINER_PHASE_FORWARD);
				sum += forward_all(tr, r, t, 1, t + 1);
				for (int s = 0; mw && s < tr->S; s++)
					stage_moe_stats(&trainer_worker(tr, r, s)->st, 0,
							moe + (size_t)mb * mw + (size_t)s * (mw / tr->S));
				phase(tr, TRAINER_PHASE_BACKWARD);
				backward_all(tr, r, t, t + 1);
			}
		struct step_stats st = {.loss = sum / tr->mb_per_step};
		trainer_moe_step(tr, moe, i, &st);
		st.nonfinite = !isfinite(st.loss);
		phase(tr, TRAINER_PHASE_OPTIMIZER);
		st.grad_norm = trainer_finish_step(tr, t + 1, &st.lr);
		phase(tr, TRAINER_PHASE_END);
		st.skipped = !isfinite(st.grad_norm);
		st.done_s = now_sec();
		tr->step = t + 1;
		tr->last = st;
		if (stats)
			stats[i] = st;
		if (tr->stop && *tr->stop)
			break;
	}
	free(moe);
	return 0;
}

int trainer_eval_batches(const struct trainer *tr, const struct dataloader *data, int batches)
{
	/* never average the same windows twice */
	long available = (long)(data->n_windows / (size_t)tr->B);
	return batches > available ? (int)MAX(available, 1) : batches;
}

double trainer_eval(struct trainer *tr, struct dataloader *data, int batches)
{
	batches = trainer_eval_batches(tr, data, batches);
	trainer_ep_view_prepare(tr);
	double sum = 0.0;
	for (int i = 0; i < batches; i++) {
		load_batch(tr, data, i);
		sum += forward_all(tr, 0, 0, 0, 0);
	}
	return batches ? sum / batches : 0.0;
}

void trainer_gather_weights(struct trainer *tr, int back, float *global)
{
	for (int s = 0; s < tr->S; s++) {
		struct stage_worker *w = &tr->w[s];
		long v = w->newest - MIN(back, w->n_versions - 1);
		trainer_save_version(tr, 0, s, v, global);
	}
}

void trainer_set_rollbacks(struct trainer *tr, long rollbacks, long data_skip)
{
	tr->rollbacks = rollbacks;
	tr->data_skip = data_skip;
	tr->lr_scale = rollbacks ? pow(tr->cfg->train_rollback_lr_factor, (double)rollbacks) : 1.0;
}

int trainer_n_versions(const struct trainer *tr)
{
	/* from the configuration: under MPI this process holds one stage */
	int n = 1, predict = !strcmp(tr->cfg->optim_correction, "predict");
	for (int s = 0; s < tr->S; s++) {
		int d = trainer_stage_delay(tr->cfg, s, tr->S);
		n = MAX(n, d + 1 + (predict && d > 0)); /* worker.h: one more to predict */
	}
	return n;
}

void trainer_restore(struct trainer *tr, long step, float *const *versions, int n)
{
	tr->step = step;
	for (int i = 0; i < tr->N * tr->S; i++) {
		struct stage_worker *w = &tr->w[i];
		if (!worker_alive(w))
			continue;
		w->newest = step;
		for (int back = w->n_versions - 1; back >= 0; back--) {
			long v = step - back;
			if (v < 0)
				continue;
			w->newest = step; /* worker_load_version writes ver[v % n] */
			worker_load_version(w, v, versions[MIN(back, n - 1)]);
		}
		worker_predict_held(w);
		w->opt.last_step = step;
	}
}
