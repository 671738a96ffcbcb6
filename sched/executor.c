/* executor.c - run a pipeline schedule: one stage worker per thread, or
 * one per process under MPI.
 *
 * Each stage executes its action list (sched/schedule.h) in order,
 * exchanging activations and gradients through a transport (local queues
 * between threads, or MPI between processes). An OPTIM_STEP only *posts*
 * the stage's part of the step-finish sequence (trainer.h) to a board
 * (sched/comm/board.h); the update itself is completed lazily, when a later
 * action needs it: a forward that uses the new version, a backward that
 * needs the gradient buffer, or the end of the segment. Completion waits
 * until every stage has posted, then applies the same global norm, clip and
 * learning rate everywhere. Deferring it is what keeps 2BW free of bubbles:
 * the last stage does not wait for stage 0 to finish a step's backward
 * before it goes on with the next step's micro-batches.
 *
 * The arithmetic is exactly the single-device trainer's: the same
 * stage_forward/stage_backward on the same weight versions, gradients
 * accumulated in ascending micro-batch order, the same tied-weight sum and
 * the same norm summed tensor by tensor in global order. It lives here
 * once, for both boards and both transports, so a run over MPI computes
 * the same bits as the same run in threads.
 *
 * Data-parallel replicas (trainer.h, replica.h): N copies of the pipeline,
 * each with its own transport and board, run the same action lists on
 * their own share of every step's micro-batches. An OPTIM_STEP first sums
 * the stage's gradients across the replicas (in replica order; it waits
 * only for the same stage of the other replicas, which reach the same
 * action at the same point of the same list), then posts as above; the
 * completion stays lazy, so 2bw keeps its pipeline full.
 *
 * Under MPI (dist_active(), see dist.h) process rank = r*S + s runs stage s
 * of replica r on its main thread. Every process builds the trainer (same
 * seed, same initial weights: replica 0's stages and its own); on its first
 * use the executor frees the workers of the other stages on every rank but
 * 0. Rank 0 keeps replica 0's as the place a checkpoint gathers into
 * (pipeline_save) and for the per-stage statistics, which are replica 0's.
 * After a segment the last rank of each replica broadcasts its losses, so
 * every rank returns the same statistics and the same result.
 *
 * Stopping within a segment (tr->stop: SIGTERM from a launcher that kills
 * the ranks a second later, see stop_lag): each stage posts, after its sums
 * of squares, whether its process was asked to stop; every stage completes
 * every step with the same sums, so all of them (every rank, every replica)
 * see the first step whose posts carry a request, and each runs only the
 * actions of the steps up to stop_lag steps past it. That is the segment of
 * fewer steps a drain then ends: the same bits as a shorter segment.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../io/util.h"
#include "../optim/optim.h"
#include "comm/board.h"
#include "comm/dist.h"
#include "comm/nccl.h"
#include "comm/replica.h"
#include "schedule.h"
#include "trainer.h"
#include "comm/transport.h"

struct pipeline {
	struct trainer *tr;
	struct schedule *sc;      /* every replica runs the same lists */
	struct transport **tp;    /* [N] each replica's (under MPI only [r]) */
	struct board **board;     /* [N] likewise */
	struct replicas *rx;      /* the gradient sum across replicas; NULL for N = 1 */
	long first_step;          /* optimizer steps done before the segment */
	int mb_per_step;          /* all replicas: M, or N for pipedream */
	int mb_r;                 /* one replica's: mb_per_step / N */
	int rep_r, rep_s;         /* the stage that records norm and lr */
	float *losses;            /* [n_steps * mb_per_step], by the last stages */
	float *loss_dev;          /* the same, backend memory: the last stages'
				   * forwards leave them there (no wait per
				   * micro-batch), read back once at the end */
	double *moe;              /* [n_steps * mb_per_step][S][2 + E]: each stage's
				   * stage_moe_stats (NULL for a dense model) */
	size_t moe_w;             /* S * (2 + E) */
	double *norm, *lr;        /* [n_steps] */
	size_t act_bytes, tied_n; /* a message (act_dtype), the tied wte (floats) */
	size_t bucket_floats;     /* per bucket of the replicas' sum; 0: no buckets */
	int stop_lag;             /* see stop_lag() */
};

struct stage_ctx {
	struct pipeline *p;
	int r, s;                 /* replica, stage */
	long completed;           /* global steps whose update this stage applied */
	long posted;
	double busy, idle;
	double *posted_at;        /* [n_steps] now_sec() when this stage posted each step */
	/* the replicas' sum in buckets (replica.h), gathered from the ranges
	 * the step's last backward reports (stage.grads_done) */
	long bucketed;            /* the step whose sum went out in buckets; 0: none */
	float *bk_g;              /* that step's gradient arena */
	size_t bk_lo, bk_n;       /* the bucket being gathered: bk_g[bk_lo, +bk_n) */
	double bk_waited;         /* seconds the buckets blocked (threads) */
	/* a stop agreed within the segment: the stage runs the actions of
	 * segment steps <= stop_at (n - 1 when none was asked for) */
	int stop_at;
	int begun;                /* the newest segment step of an action begun */
	float *asked_dev;         /* [N] backend memory: the replicas' requests */
};

static long global_step(const struct pipeline *p, int seg_step) { return p->first_step + seg_step + 1; }

/* Replica r's micro-batch j of the segment (its schedule's numbering: j /
 * mb_r is the step) as an index of the segment's micro-batches of all
 * replicas: step t's are [t*mb_per_step, (t+1)*mb_per_step), replica r's
 * share the r-th block of mb_r. N = 1: j itself. */
static long global_mb(const struct pipeline *p, int r, int j)
{
	long t = j / p->mb_r, k = j % p->mb_r;
	return t * p->mb_per_step + (long)r * p->mb_r + k;
}

/* Does stage w hold a half of the tied embedding that the board joins? */
static int tied_stage(const struct trainer *tr, const struct stage_worker *w)
{
	return tr->m->cfg.tied && tr->S > 1 && w->wte_param >= 0;
}

/* Was this stage's process asked to stop (1) or not (0)? With replicas,
 * whether any replica's process was: stage s of every replica posts the
 * same request, so that the replicas stop at the same step. The sum over
 * the replicas of N floats (a chunk each) costs one small exchange per
 * step. */
static double stop_asked(struct stage_ctx *c)
{
	struct pipeline *p = c->p;
	const volatile int *stop = p->tr->stop;
	float asked = stop && *stop ? 1.0f : 0.0f;
	if (!p->rx)
		return asked;
	const struct backend *be = p->tr->be;
	int N = p->tr->N;
	float *host = xmalloc((size_t)N * sizeof(float));
	for (int q = 0; q < N; q++)
		host[q] = asked;
	if (!c->asked_dev && !(c->asked_dev = be->alloc((size_t)N * sizeof(float))))
		die("cannot allocate %d floats on backend '%s'", N, be->name);
	be->to_device(c->asked_dev, host, (size_t)N * sizeof(float));
	double waited;
	p->rx->allreduce(p->rx, c->r, c->s, c->asked_dev, (size_t)N, &waited);
	c->idle += waited;
	be->to_host(host, c->asked_dev, sizeof(float));
	asked = host[0];
	free(host);
	return asked > 0;
}

/* OPTIM_STEP: post this stage's gradient sums (and tied part). */
static void post_step(struct stage_ctx *c, long gstep)
{
	struct pipeline *p = c->p;
	struct trainer *tr = p->tr;
	struct stage_worker *w = trainer_worker(tr, c->r, c->s);
	struct board *b = p->board[c->r];
	float *g = worker_grads(w, gstep);
	double t0 = now_sec();
	if (p->rx) {
		/* the replicas' sum first: everything below sees the step's
		 * whole gradient (S = 1 keeps the tied head part apart); its
		 * buckets, if the last backward sent it in buckets */
		double waited, head_waited = 0.0;
		if (c->bucketed == gstep)
			p->rx->finish(p->rx, c->r, c->s, &waited);
		else
			p->rx->allreduce(p->rx, c->r, c->s, g, w->st.numel, &waited);
		if (w->st.tied_head_grad)
			p->rx->allreduce(p->rx, c->r, c->s, w->st.tied_head_grad, p->tied_n,
					 &head_waited);
		waited += head_waited;
		c->idle += waited;
		c->busy += now_sec() - t0 - waited;
		t0 = now_sec();
	}
	if (tr->S == 1) {
		stage_finish_grads(&w->st, g);
	} else if (tied_stage(tr, w)) {
		float *g_wte = g + w->st.params[w->wte_param].offset;
		b->tied_post(b, c->s, gstep, g_wte);
		if (c->s == 0) {
			/* stage 0's norm needs the summed gradient now */
			double waited;
			c->busy += now_sec() - t0;
			const float *head = b->tied_wait(b, c->s, gstep, &waited);
			c->idle += waited;
			t0 = now_sec();
			tr->be->add(g_wte, g_wte, head, p->tied_n);
		}
	}
	optim_grad_sumsq(&w->opt, g, w->sumsq);
	w->sumsq[w->opt.n] = stop_asked(c);
	b->post(b, c->s, gstep, w->sumsq);
	c->posted = gstep;
	c->busy += now_sec() - t0;
}

/* Start the sum of the bucket gathered so far. */
static void bucket_send(struct stage_ctx *c)
{
	struct replicas *rx = c->p->rx;
	if (!c->bk_n)
		return;
	double waited = 0.0;
	rx->bucket(rx, c->r, c->s, c->bk_g + c->bk_lo, c->bk_n, &waited);
	c->bk_waited += waited;
	trainer_worker(c->p->tr, c->r, c->s)->buckets++;
	c->bk_n = 0;
}

/* stage.grads_done of a step's last backward: ranges come from the end of
 * the arena towards its start, each one just below the last, and join the
 * bucket until it holds bucket_floats. */
static void on_grads_done(void *arg, size_t lo, size_t n)
{
	struct stage_ctx *c = arg;
	if (c->bk_n && lo + n != c->bk_lo)
		bucket_send(c); /* not adjacent: never with the model's order */
	c->bk_lo = lo;
	c->bk_n += n;
	if (c->bk_n >= c->p->bucket_floats)
		bucket_send(c);
}

/* Apply the update of step gstep on this stage once every stage posted. */
static void complete_step(struct stage_ctx *c, long gstep)
{
	struct pipeline *p = c->p;
	struct trainer *tr = p->tr;
	struct stage_worker *w = trainer_worker(tr, c->r, c->s);
	struct board *b = p->board[c->r];
	double waited;
	const double *sums = b->wait(b, c->s, gstep, &waited);
	c->idle += waited;
	if (tied_stage(tr, w) && c->s == tr->S - 1) {
		const float *emb = b->tied_wait(b, c->s, gstep, &waited);
		c->idle += waited;
		float *g_wte = worker_grads(w, gstep) + w->st.params[w->wte_param].offset;
		double t1 = now_sec();
		tr->be->add(g_wte, emb, g_wte, p->tied_n);
		c->busy += now_sec() - t1;
	}
	double t0 = now_sec();
	/* each stage's sums of squares, then its stop request (post_step) */
	double total = 0.0;
	int asked = 0;
	for (int s = 0, k = 0; s < tr->S; s++) {
		for (int j = 0; j < b->n_tensors[s] - 1; j++)
			total += sums[k++];
		asked |= sums[k++] != 0.0;
	}
	int seg_step = (int)(gstep - p->first_step - 1);
	if (asked && seg_step + p->stop_lag < c->stop_at) {
		c->stop_at = seg_step + p->stop_lag;
		if (c->begun > c->stop_at)
			die("internal error: stage %d began step %d of the segment, past the stop "
			    "agreed at step %d", c->s, c->begun, c->stop_at);
	}
	double norm = sqrt(total);
	double lr = lr_at(tr->cfg, gstep) * tr->lr_scale;
	worker_finish(w, gstep, norm, tr->cfg->train_grad_clip, (float)lr);
	c->completed = gstep;
	if (c->r == p->rep_r && c->s == p->rep_s) {
		p->norm[gstep - p->first_step - 1] = norm;
		p->lr[gstep - p->first_step - 1] = lr;
	}
	b->done(b, c->s, gstep);
	c->busy += now_sec() - t0;
}

/* Complete pending updates until this stage's newest version is >= v. */
static void need_version(struct stage_ctx *c, long v)
{
	while (c->completed < v && c->completed < c->posted)
		complete_step(c, c->completed + 1);
	if (trainer_worker(c->p->tr, c->r, c->s)->newest < v && v > 0)
		die("internal error: stage %d needs version %ld but only %ld steps were posted",
		    c->s, v, c->posted);
}

static void *stage_main(void *arg)
{
	struct stage_ctx *c = arg;
	struct pipeline *p = c->p;
	struct trainer *tr = p->tr;
	const struct backend *be = tr->be;
	struct stage_worker *w = trainer_worker(tr, c->r, c->s);
	struct transport *tp = p->tp[c->r];
	struct board *board = p->board[c->r];
	int s = c->s, S = tr->S, last = s == S - 1;
	size_t bt = (size_t)tr->B * (size_t)tr->T;
	backend_lane_bind(be, s); /* this thread's ops, of every replica's stage s */
	int32_t *host_in = xmalloc(bt * sizeof(int32_t)), *host_tg = xmalloc(bt * sizeof(int32_t));
	int32_t *dev_in = be->alloc(bt * sizeof(int32_t)), *dev_tg = be->alloc(bt * sizeof(int32_t));
	void *x_in = NULL, *x_out = NULL, *dx_out = NULL, *dx_in = NULL; /* act_dtype */
	float dloss = 1.0f / (float)p->mb_per_step;
	c->completed = c->posted = p->first_step;
	int n;
	const struct sched_action *a = sched_actions(p->sc, s, &n);
	for (int i = 0; i < n; i++) {
		if (a[i].step > c->stop_at)
			continue; /* a stop was agreed: this step is not run */
		c->begun = MAX(c->begun, a[i].step);
		double waited = 0.0, t0;
		long gv = p->first_step + a[i].version;
		long gmb = a[i].mb >= 0 ? global_mb(p, c->r, a[i].mb) : -1;
		long data_index = (p->first_step + tr->data_skip) * p->mb_per_step + gmb;
		switch (a[i].op) {
		case SCHED_RECV_ACT:
			x_in = tp->recv(tp, s, s - 1, MSG_ACT, a[i].mb, &waited);
			c->idle += waited;
			break;
		case SCHED_RECV_GRAD:
			dx_out = tp->recv(tp, s, s + 1, MSG_GRAD, a[i].mb, &waited);
			c->idle += waited;
			break;
		case SCHED_FORWARD: {
			need_version(c, gv);
			t0 = now_sec();
			if (s == 0 || last) {
				dataloader_batch(tr->data, data_index, host_in, host_tg);
				be->to_device(dev_in, host_in, bt * sizeof(int32_t));
				be->to_device(dev_tg, host_tg, bt * sizeof(int32_t));
			}
			x_out = last ? NULL : tp->buffer(tp, s, p->act_bytes);
			long gstep = global_step(p, a[i].step);
			stage_forward(&w->st, a[i].slot, worker_grad_weights(w, gv), s == 0 ? dev_in : NULL,
				      s == 0 ? NULL : x_in, last ? dev_tg : NULL, x_out,
				      NULL, last ? p->loss_dev + gmb : NULL,
				      last ? worker_grads(w, gstep) : NULL, dloss);
			if (x_in)
				tp->release(tp, s, x_in);
			x_in = NULL;
			if (p->moe)
				stage_moe_stats(&w->st, a[i].slot,
						p->moe + (size_t)gmb * p->moe_w +
							(size_t)s * (p->moe_w / S));
			c->busy += now_sec() - t0;
			break;
		}
		case SCHED_SEND_ACT:
			tp->send(tp, s, s + 1, MSG_ACT, a[i].mb, x_out);
			x_out = NULL;
			break;
		case SCHED_BACKWARD: {
			long gstep = global_step(p, a[i].step);
			/* the gradient buffer of gstep held step gstep-2 */
			while (c->completed < gstep - 2)
				complete_step(c, c->completed + 1);
			t0 = now_sec();
			dx_in = s == 0 ? NULL : tp->buffer(tp, s, p->act_bytes);
			/* the step's last backward sends the replicas' sum out in
			 * buckets as it finishes layers (the micro-batches of a
			 * step run in ascending order) */
			int buckets = p->rx && p->rx->bucket && p->bucket_floats &&
				      a[i].mb % p->mb_r == p->mb_r - 1;
			if (buckets) {
				c->bucketed = gstep;
				c->bk_g = worker_grads(w, gstep);
				c->bk_n = 0;
				c->bk_waited = 0.0;
				w->st.grads_done = on_grads_done;
				w->st.grads_done_ctx = c;
			}
			stage_backward(&w->st, a[i].slot, worker_grad_weights(w, gv), worker_grads(w, gstep),
				       dx_out, dx_in);
			if (buckets) {
				bucket_send(c);
				w->st.grads_done = NULL;
				c->idle += c->bk_waited;
				t0 += c->bk_waited; /* not busy */
			}
			if (dx_out)
				tp->release(tp, s, dx_out);
			dx_out = NULL;
			c->busy += now_sec() - t0;
			break;
		}
		case SCHED_SEND_GRAD:
			tp->send(tp, s, s - 1, MSG_GRAD, a[i].mb, dx_in);
			dx_in = NULL;
			break;
		case SCHED_OPTIM_STEP: {
			long gstep = global_step(p, a[i].step);
			/* updates are applied in order: finish older ones first */
			while (c->completed < gstep - 1 && c->completed < c->posted)
				complete_step(c, c->completed + 1);
			post_step(c, gstep);
			c->posted_at[gstep - p->first_step - 1] = now_sec();
			break;
		}
		default:
			break;
		}
		if (board->poll)
			board->poll(board);
	}
	while (c->completed < c->posted)
		complete_step(c, c->completed + 1);
	be->free(dev_in);
	be->free(dev_tg);
	if (c->asked_dev)
		be->free(c->asked_dev);
	free(host_in);
	free(host_tg);
	return NULL;
}

/* ---- one stage per process ---- */

/* Tags of the control channel (dist_send/dist_recv) between segments. */
enum { TAG_STATS = 1, TAG_STATE = 2 };

/* The process's MPI side: one trainer, its transport, board and replica
 * group, kept from segment to segment (creating them is collective and
 * costs a round trip) until dist_finalize. */
static struct {
	const struct trainer *tr; /* the trainer attached, NULL before */
	int r, s;                 /* this process's replica and stage */
	struct transport *tp;
	struct board *board;
	struct replicas *rx;      /* NULL for N = 1 */
	struct nccl_world nccl;   /* the channels (pipeline.transport = nccl) */
} mp;

static void mpi_detach(void)
{
	if (mp.rx)
		mp.rx->destroy(mp.rx);
	if (mp.board)
		mp.board->destroy(mp.board);
	if (mp.tp)
		mp.tp->destroy(mp.tp);
	nccl_world_close(&mp.nccl); /* after the transport and replicas on it */
	memset(&mp, 0, sizeof(mp));
}

/* First use of tr under MPI (every rank reaches it at the same call): set
 * up the transport, the board and the replica group. The process holds
 * only its own stage's worker (trainer_init). */
static void mpi_attach(struct trainer *tr)
{
	if (mp.tr == tr)
		return;
	if (mp.tr)
		die("internal error: a second trainer in one MPI process");
	int S = tr->S, N = tr->N, rank = dist_rank();
	if (S * N != dist_world())
		die("internal error: %d stages x %d replicas on %d processes", S, N, dist_world());
	mp.r = rank / S;
	mp.s = rank % S;
	/* the board needs every stage's tensor count; this rank holds one stage */
	int *n_tensors = xcalloc((size_t)S, sizeof(int));
	for (int s = 0; s < S; s++)
		n_tensors[s] = stage_param_count(tr->m, &tr->cut, s);
	if (n_tensors[mp.s] != tr->w[rank].opt.n)
		die("internal error: stage %d holds %d tensors, stage_param_count says %d", mp.s,
		    tr->w[rank].opt.n, n_tensors[mp.s]);
	for (int s = 0; s < S; s++)
		n_tensors[s]++; /* and the stop request: post_step */
	size_t act_bytes = (size_t)tr->B * (size_t)tr->T * (size_t)tr->m->cfg.C * act_size(tr->be);
	size_t tied_n = (size_t)tr->m->cfg.Vp * (size_t)tr->m->cfg.C;
	/* replica r's stage s is rank r*S + s: its messages go to the ranks
	 * of its own replica */
	double timeout = tr->cfg->pipeline_timeout;
	int nccl = !strcmp(tr->cfg->pipeline_transport, "nccl");
	if (nccl && nccl_world_open(&mp.nccl, S, N, rank))
		die("cannot set up the NCCL channels between processes");
	mp.tp = transport_shift(nccl ? transport_nccl(tr->be, &mp.nccl, act_bytes, timeout)
				     : transport_p2p(tr->be, S * N, rank, act_bytes, S, timeout),
				mp.r * S);
	mp.board = mp.tp ? board_p2p(tr->be, S, mp.s, mp.r * S, n_tensors, tied_n, timeout)
			 : NULL;
	free(n_tensors);
	if (!mp.tp || !mp.board)
		die("cannot set up the pipeline between processes");
	if (N > 1 && !(mp.rx = nccl ? replicas_nccl(tr->be, &mp.nccl, timeout)
				    : replicas_p2p(tr->be, N, S, rank, timeout)))
		die("cannot set up the data-parallel replicas between processes");
	dist_at_finalize(mpi_detach);
	mp.tr = tr;
}

/* Every replica's losses to every rank (the last rank of each replica
 * holds its own micro-batches'); rank 0 collects the busy and idle seconds
 * of replica 0's stages. */
static void mpi_segment_end(struct pipeline *p, struct stage_ctx *c, int n_steps)
{
	struct trainer *tr = p->tr;
	size_t n_mb = (size_t)n_steps * (size_t)p->mb_per_step;
	float *got = tr->N > 1 ? xcalloc(n_mb, sizeof(float)) : p->losses;
	for (int r = 0; r < tr->N; r++) {
		int root = r * tr->S + tr->S - 1;
		if (got != p->losses && dist_rank() == root)
			memcpy(got, p->losses, n_mb * sizeof(float));
		if (dist_bcast(got, n_mb * sizeof(float), root))
			die("cannot share the losses of the segment");
		if (got != p->losses)
			for (int t = 0; t < n_steps; t++)
				for (int k = 0; k < p->mb_r; k++) {
					size_t i = (size_t)t * p->mb_per_step + (size_t)r * p->mb_r + k;
					p->losses[i] = got[i];
				}
	}
	if (got != p->losses)
		free(got);
	if (p->moe) {
		/* every rank's MoE statistics (its stage of its replica's
		 * micro-batches) to every rank */
		size_t w = p->moe_w / tr->S, n = n_mb * p->moe_w;
		double *all = xmalloc(n * sizeof(double));
		for (int q = 0; q < tr->N * tr->S; q++) {
			int r = q / tr->S, s = q % tr->S;
			if (dist_rank() == q)
				memcpy(all, p->moe, n * sizeof(double));
			if (dist_bcast(all, n * sizeof(double), q))
				die("cannot share the mixture-of-experts statistics of the segment");
			for (int t = 0; t < n_steps; t++)
				for (int k = 0; k < p->mb_r; k++) {
					size_t i = (size_t)t * p->mb_per_step + (size_t)r * p->mb_r + k;
					memcpy(p->moe + i * p->moe_w + s * w, all + i * p->moe_w + s * w,
					       w * sizeof(double));
				}
		}
		free(all);
	}
	double t[2] = {c->busy, c->idle};
	if (c->r > 0)
		return;
	if (!dist_is_root()) {
		if (dist_send(t, sizeof(t), 0, TAG_STATS))
			die("cannot send stage statistics");
		return;
	}
	for (int s = 1; s < tr->S; s++) {
		if (dist_recv(t, sizeof(t), s, TAG_STATS))
			die("cannot receive stage statistics");
		tr->w[s].busy_s += t[0];
		tr->w[s].idle_s += t[1];
	}
}

/* How many steps past step t a stage may have begun when it learns that
 * step t's posts ask to stop: it learns when it completes step t, and it
 * completes steps lazily, when an action needs them (a forward the version
 * t + 1, a backward of step t + 2 the gradient buffer of step t, the
 * optimizer step t + 1 its predecessor). Stopping stop_lag steps after
 * step t then never cuts a step that a stage has begun. Over the lists of
 * every stage, so every rank finds the same number (2bw: 2, pipedream: S,
 * 1f1b and gpipe: 1). */
static int stop_lag(const struct schedule *sc)
{
	int lag = 0;
	for (int s = 0; s < sc->S; s++) {
		int n, forced = -1, begun = -1;
		const struct sched_action *a = sched_actions(sc, s, &n);
		for (int i = 0; i < n; i++) {
			begun = MAX(begun, a[i].step);
			int needs = a[i].op == SCHED_FORWARD	? a[i].version - 1
				    : a[i].op == SCHED_BACKWARD	? a[i].step - 2
				    : a[i].op == SCHED_OPTIM_STEP ? a[i].step - 1
								  : -1;
			for (int t = forced + 1; t <= needs; t++)
				lag = MAX(lag, begun - t);
			forced = MAX(forced, needs);
		}
	}
	return lag;
}

int pipeline_stop_steps(const struct trainer *tr)
{
	/* a segment long enough for stop_lag to see the steady state */
	int is_pd = tr->kind == SCHED_PIPEDREAM, n = 2 * tr->S + 4;
	char err[256];
	struct schedule *sc = sched_build_at(tr->kind, tr->S, is_pd ? tr->M : tr->mb_per_replica,
					     n, 0, err, sizeof(err));
	if (!sc)
		die("internal error: %s", err);
	int steps = 1 + stop_lag(sc) + 1; /* the next post, the lag, the drain (< 1 step) */
	sched_free(sc);
	return steps;
}

int pipeline_run(struct trainer *tr, int n, struct step_stats *stats)
{
	int before = backend_lane_current(tr->be); /* bound again when done */
	struct pipeline p = {.tr = tr, .first_step = tr->step};
	char err[256];
	int mpi = dist_active();
	if (mpi)
		mpi_attach(tr);
	int N = tr->N, S = tr->S;
	/* the stages this process runs: replica r, stage s, i = r*S + s in [lo, hi) */
	int lo = mpi ? dist_rank() : 0, hi = mpi ? lo + 1 : N * S;
	int is_pd = tr->kind == SCHED_PIPEDREAM;
	p.mb_per_step = tr->mb_per_step;
	p.mb_r = tr->mb_per_replica;
	p.rep_r = lo / S;
	p.rep_s = lo % S;
	p.sc = sched_build_at(tr->kind, S, is_pd ? tr->M : p.mb_r, n, tr->step, err, sizeof(err));
	if (!p.sc)
		return error("%s", err);
	p.stop_lag = stop_lag(p.sc);
	for (int i = lo; i < hi; i++) {
		const struct sched_stage *ss = sched_stage(p.sc, i % S);
		if (ss->nslots > tr->w[i].st.n_slots || ss->nversions > tr->w[i].n_versions)
			die("internal error: stage %d needs %d slots and %d versions, has %d and %d",
			    i % S, ss->nslots, ss->nversions, tr->w[i].st.n_slots, tr->w[i].n_versions);
	}
	p.act_bytes = (size_t)tr->B * (size_t)tr->T * (size_t)tr->m->cfg.C * act_size(tr->be);
	double bucket = tr->cfg->pipeline_bucket_mb * 1048576.0 / 4.0; /* floats */
	p.bucket_floats = bucket <= 0 ? 0 : bucket >= 0x1p62 ? (size_t)1 << 62
					: (size_t)MAX(1.0, bucket);
	p.tied_n = (size_t)tr->m->cfg.Vp * (size_t)tr->m->cfg.C;
	p.tp = xcalloc((size_t)N, sizeof(*p.tp));
	p.board = xcalloc((size_t)N, sizeof(*p.board));
	if (mpi) {
		p.tp[mp.r] = mp.tp;
		p.board[mp.r] = mp.board;
		p.rx = mp.rx;
	} else {
		int *nt = xcalloc((size_t)S, sizeof(int));
		for (int s = 0; s < S; s++)
			nt[s] = tr->w[s].opt.n + 1; /* the sums, then the stop request */
		for (int r = 0; r < N; r++) {
			p.tp[r] = transport_local(tr->be, S, p.act_bytes);
			p.board[r] = board_local(tr->be, S, nt, p.tied_n);
		}
		free(nt);
		p.rx = N > 1 ? replicas_local(tr->be, N, S) : NULL;
	}
	for (int r = 0; r < N; r++)
		if (p.board[r])
			p.board[r]->begin(p.board[r], p.first_step, n);
	p.losses = xcalloc(st_mult((size_t)n, (size_t)p.mb_per_step), sizeof(float));
	/* on the last stages' lane, which writes it (one lane with MPI) */
	backend_lane_bind(tr->be, S - 1);
	p.loss_dev = tr->be->alloc(st_mult(st_mult((size_t)n, (size_t)p.mb_per_step), sizeof(float)));
	backend_lane_bind(tr->be, before);
	if (!p.loss_dev)
		die("cannot allocate the segment's %ld losses on backend '%s'",
		    (long)n * p.mb_per_step, tr->be->name);
	p.moe_w = trainer_moe_width(tr);
	if (p.moe_w)
		p.moe = xcalloc(st_mult(st_mult((size_t)n, (size_t)p.mb_per_step), p.moe_w),
				sizeof(double));
	trainer_moe_begin(tr, n);
	p.norm = xcalloc((size_t)n, sizeof(double));
	p.lr = xcalloc((size_t)n, sizeof(double));
	struct stage_ctx *ctx = xcalloc((size_t)(N * S), sizeof(*ctx));
	for (int i = lo; i < hi; i++)
		ctx[i] = (struct stage_ctx){.p = &p, .r = i / S, .s = i % S, .stop_at = n - 1,
					    .begun = -1,
					    .posted_at = xcalloc((size_t)n, sizeof(double))};
	if (mpi) {
		stage_main(&ctx[lo]);
	} else {
		pthread_t *th = xcalloc((size_t)(N * S), sizeof(*th));
		for (int i = 0; i < N * S; i++)
			if (pthread_create(&th[i], NULL, stage_main, &ctx[i]))
				die("cannot start stage thread %d of replica %d", i % S, i / S);
		for (int i = 0; i < N * S; i++)
			pthread_join(th[i], NULL);
		free(th);
		/* the stages' lanes may still run their last ops; everything
		 * after this (losses, checkpoints, the next segment's first
		 * ops on other lanes) is ordered after them */
		if (backend_lane_count(tr->be) > 1)
			tr->be->synchronize();
	}
	for (int r = 0; r < N; r++)
		if (p.board[r])
			p.board[r]->end(p.board[r]);
	/* the steps run: every stage saw the same requests (post_step) */
	int done = ctx[lo].stop_at + 1;
	for (int i = lo; i < hi; i++) {
		if (ctx[i].stop_at + 1 != done)
			die("internal error: stage %d of replica %d stopped after %d steps of the "
			    "segment, stage %d of replica %d after %d", i % S, i / S,
			    ctx[i].stop_at + 1, lo % S, lo / S, done);
		tr->w[i].busy_s += ctx[i].busy;
		tr->w[i].idle_s += ctx[i].idle;
	}
	/* one wait for every loss of the segment (zeros where no local last
	 * stage wrote: under MPI the other ranks' come in mpi_segment_end) */
	backend_lane_bind(tr->be, S - 1);
	tr->be->to_host(p.losses, p.loss_dev,
			st_mult(st_mult((size_t)n, (size_t)p.mb_per_step), sizeof(float)));
	tr->be->free(p.loss_dev);
	backend_lane_bind(tr->be, before);
	if (mpi)
		mpi_segment_end(&p, &ctx[lo], done);
	int rc = 0;
	for (int i = 0; i < done; i++) {
		struct step_stats st = {0};
		double sum = 0.0;
		for (int mb = 0; mb < p.mb_per_step; mb++)
			sum += p.losses[i * p.mb_per_step + mb];
		st.loss = sum / p.mb_per_step;
		st.grad_norm = p.norm[i];
		st.lr = p.lr[i];
		st.nonfinite = !isfinite(st.loss);
		st.skipped = !isfinite(st.grad_norm);
		if (p.moe)
			trainer_moe_step(tr, p.moe + (size_t)i * p.mb_per_step * p.moe_w, i, &st);
		for (int k = lo; k < hi; k++)
			st.done_s = MAX(st.done_s, ctx[k].posted_at[i]);
		if (stats)
			stats[i] = st;
		tr->last = st;
	}
	tr->step = p.first_step + done;
	for (int k = lo; k < hi; k++)
		free(ctx[k].posted_at);
	free(ctx);
	free(p.losses);
	free(p.moe);
	free(p.norm);
	free(p.lr);
	if (!mpi) {
		for (int r = 0; r < N; r++) {
			p.board[r]->destroy(p.board[r]);
			p.tp[r]->destroy(p.tp[r]);
		}
		if (p.rx)
			p.rx->destroy(p.rx);
	}
	free(p.board);
	free(p.tp);
	sched_free(p.sc);
	return rc;
}

/* ---- evaluation and checkpoints under MPI (dist.h) ---- */

double pipeline_eval(struct trainer *tr, struct dataloader *data, int batches)
{
	if (!dist_active())
		return trainer_eval(tr, data, batches);
	batches = trainer_eval_batches(tr, data, batches); /* as trainer_eval does */
	mpi_attach(tr);
	const struct backend *be = tr->be;
	int S = tr->S, N = tr->N, r = mp.r, s = mp.s, last = s == S - 1;
	struct stage_worker *w = trainer_worker(tr, r, s);
	size_t bt = (size_t)tr->B * (size_t)tr->T;
	size_t act_bytes = bt * (size_t)tr->m->cfg.C * act_size(be);
	struct transport *tp = mp.tp;
	int32_t *host_in = xmalloc(bt * sizeof(int32_t)), *host_tg = xmalloc(bt * sizeof(int32_t));
	int32_t *dev_in = be->alloc(bt * sizeof(int32_t)), *dev_tg = be->alloc(bt * sizeof(int32_t));
	float *losses = xcalloc((size_t)(batches > 0 ? batches : 1), sizeof(float));
	/* trainer_eval's forward_all, one stage per rank: the newest weights,
	 * slot 0, the same loss scale; replica r takes batches r, r+N, ... (the
	 * replicas hold the same weights) */
	for (int i = r; i < batches; i += N) {
		if (s == 0 || last) {
			dataloader_batch(data, i, host_in, host_tg);
			be->to_device(dev_in, host_in, bt * sizeof(int32_t));
			be->to_device(dev_tg, host_tg, bt * sizeof(int32_t));
		}
		void *x_in = s == 0 ? NULL : tp->recv(tp, s, s - 1, MSG_ACT, i, NULL);
		void *x_out = last ? NULL : tp->buffer(tp, s, act_bytes);
		float loss = 0.0f;
		stage_forward(&w->st, 0, worker_weights(w, w->newest), s == 0 ? dev_in : NULL, x_in,
			      last ? dev_tg : NULL, x_out, last ? &loss : NULL, NULL, NULL,
			      1.0f / (float)tr->M);
		if (x_in)
			tp->release(tp, s, x_in);
		if (x_out)
			tp->send(tp, s, s + 1, MSG_ACT, i, x_out);
		losses[i] = loss;
	}
	be->free(dev_in);
	be->free(dev_tg);
	free(host_in);
	free(host_tg);
	/* every replica's losses from its last rank, then added in order */
	float *got = N > 1 ? xcalloc((size_t)(batches > 0 ? batches : 1), sizeof(float)) : losses;
	for (int q = 0; q < N; q++) {
		int root = q * S + S - 1;
		if (got != losses && dist_rank() == root)
			memcpy(got, losses, (size_t)batches * sizeof(float));
		if (dist_bcast(got, (size_t)batches * sizeof(float), root))
			die("cannot share the evaluation loss");
		if (got != losses)
			for (int i = q; i < batches; i += N)
				losses[i] = got[i];
	}
	if (got != losses)
		free(got);
	double sum = 0.0;
	for (int i = 0; i < batches; i++)
		sum += losses[i];
	free(losses);
	return batches ? sum / batches : 0.0;
}

/* Checkpoints under MPI. Rank 0 writes the file from its own stage and
 * from what the other ranks of replica 0 send, in checkpoint order, so no
 * rank ever holds more than its own stage. Rank s > 0 sends, for each
 * weight version (back = 0, 1, ...): a weights_head and its own parameters'
 * floats, which are contiguous in the global arena from base_off; then each
 * optimizer-state tensor as a tensor_head and its floats, and an end
 * header. Rank 0 receives the versions stage after stage and the states
 * stage after stage: MPI keeps each sender's messages in order. */
struct weights_head {
	size_t base_off, count;
};

struct tensor_head {
	char name[128];
	size_t numel;
	int rows, cols, end;
};

/* Where this stage's own parameters (not the tied copy) sit in the global
 * arena: [base_off, base_off + count), the first count floats of the stage. */
static struct weights_head stage_range(const struct stage *st)
{
	struct weights_head h = {0, 0};
	for (int i = 0; i < st->n_params; i++) {
		if (st->params[i].tied_copy)
			continue;
		const struct param_info *p = &st->m->params[st->params[i].global];
		h.base_off = p->offset - st->params[i].offset;
		h.count = MAX(h.count, st->params[i].offset + p->numel);
	}
	return h;
}

static int send_tensor(void *ctx, const char *name, const float *data, size_t numel, int rows,
		       int cols)
{
	struct tensor_head h = {.numel = numel, .rows = rows, .cols = cols};
	snprintf(h.name, sizeof(h.name), "%s", name);
	if (dist_send(&h, sizeof(h), 0, TAG_STATE))
		return -1;
	return dist_send(data, numel * sizeof(float), 0, TAG_STATE);
}

static int send_state(struct trainer *tr, int s)
{
	struct stage_worker *w = &tr->w[s];
	struct weights_head h = stage_range(&w->st);
	float *host = xmalloc(st_mult(w->st.numel, sizeof(float)));
	int rc = 0, nv = trainer_n_versions(tr);
	for (int back = 0; back < nv && !rc; back++) {
		/* what trainer_gather_weights takes from this stage */
		long v = w->newest - MIN(back, w->n_versions - 1);
		tr->be->to_host(host, worker_weights(w, v), w->st.numel * sizeof(float));
		rc = dist_send(&h, sizeof(h), 0, TAG_STATE);
		if (!rc)
			rc = dist_send(host, h.count * sizeof(float), 0, TAG_STATE);
	}
	free(host);
	if (!rc)
		rc = worker_state_tensors(tr, w, send_tensor, NULL);
	struct tensor_head end = {.end = 1};
	if (!rc)
		rc = dist_send(&end, sizeof(end), 0, TAG_STATE);
	return rc;
}

/* Rank 0's sources for trainer_save_from: its own stage 0, the rest received. */
static int recv_weights(void *ctx, int back, float *global)
{
	struct trainer *tr = ctx;
	struct stage_worker *w0 = &tr->w[0];
	worker_save_version(w0, w0->newest - MIN(back, w0->n_versions - 1), global);
	for (int s = 1; s < tr->S; s++) {
		struct weights_head h;
		if (dist_recv(&h, sizeof(h), s, TAG_STATE))
			return -1;
		if (h.base_off > tr->m->numel || h.count > tr->m->numel - h.base_off)
			die("internal error: rank %d sent weights [%zu, %zu + %zu) outside the "
			    "model's %zu floats", s, h.base_off, h.base_off, h.count, tr->m->numel);
		if (dist_recv(global + h.base_off, h.count * sizeof(float), s, TAG_STATE))
			return -1;
	}
	return 0;
}

static int recv_states(void *ctx, int s, tensor_sink sink, void *sink_ctx)
{
	struct trainer *tr = ctx;
	if (s == 0)
		return worker_state_tensors(tr, &tr->w[0], sink, sink_ctx);
	float *buf = NULL;
	size_t cap = 0;
	int rc = 0;
	for (;;) {
		struct tensor_head h;
		if (dist_recv(&h, sizeof(h), s, TAG_STATE)) {
			rc = -1;
			break;
		}
		if (h.end)
			break;
		h.name[sizeof(h.name) - 1] = '\0';
		if (h.numel > MAX(tr->m->numel, optim_part_bound(tr->m)))
			die("internal error: rank %d sent a state tensor '%s' of %zu floats, more "
			    "than any optimizer keeps for this model", s, h.name, h.numel);
		if (h.numel > cap) {
			cap = h.numel;
			buf = xrealloc(buf, st_mult(cap, sizeof(float)));
		}
		if (dist_recv(buf, h.numel * sizeof(float), s, TAG_STATE)) {
			rc = -1;
			break;
		}
		rc |= sink(sink_ctx, h.name, buf, h.numel, h.rows, h.cols);
	}
	free(buf);
	return rc;
}

int pipeline_save(struct trainer *tr, const char *path, const char *config_text,
		  const char *extra_meta)
{
	if (!dist_active())
		return trainer_save(tr, path, config_text, extra_meta);
	mpi_attach(tr);
	int rc = 0;
	if (mp.r > 0) {
		/* replica 0 holds the same bits */
	} else if (!dist_is_root()) {
		rc = send_state(tr, dist_rank());
	} else {
		struct ckpt_source src = {.weights = recv_weights, .states = recv_states, .ctx = tr};
		rc = trainer_save_from(tr, &src, path, config_text, extra_meta);
	}
	/* a failed send or receive ends the job (MPI's errors are fatal), so
	 * every rank gets here and learns whether rank 0 wrote the file */
	if (dist_bcast(&rc, sizeof(rc), 0))
		return -1;
	return rc;
}
