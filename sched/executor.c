/* executor.c - run a pipeline schedule: one stage worker per thread, or
 * one per process under MPI.
 *
 * Each stage executes its action list (sched/schedule.h) in order,
 * exchanging activations and gradients through a transport (local queues
 * between threads, or MPI between processes). With V chunks per stage
 * (interleaved, zb-v) the trainer holds S*V model pieces, a worker each
 * (trainer.h), and everything below but the threads is per piece: the
 * transport, the board and the replicas' sums address pieces, and the
 * thread of stage s runs each action on its chunk's piece (stage_main),
 * a handoff between two pieces of the same stage going through the
 * transport too. An OPTIM_STEP only *posts*
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
 * stage_forward/stage_backward on the same weight versions (zero-bubble
 * kinds: stage_backward in its two parts, B and W, which model.h makes
 * the same bits), gradients accumulated in ascending micro-batch order, the same tied-weight sum and
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
 * Under MPI or TCP (tr->dist, the process's runtime: dist.h) process
 * rank = r*stages + s runs stage s of replica r (its V pieces: stages =
 * S / V) on its main thread; the transport, board and replica group it
 * keeps between segments belong to that runtime (mpi_attach,
 * dist_set_pipeline). Every process builds only its stage's pieces'
 * workers (trainer_init_on: same seed, same initial weights). Rank 0
 * writes checkpoints from what the other ranks of replica 0 send
 * (pipeline_save) and collects the per-piece statistics, which are replica
 * 0's. After a segment the rank holding each replica's last piece (zb-v:
 * the replica's stage 0) broadcasts its losses, so every rank returns the
 * same statistics and the same result. Evaluation runs forward-only action lists (sched_build_forward)
 * through the same stage code (eval_stage) on a thread per stage or on
 * each rank, and a save the same gather, whatever the processes.
 *
 * Failures return -1 after error(), never exit. What can fail on one
 * process and not another (setting up, a segment's start, sharing its
 * results, an evaluation, a checkpoint) is agreed on by every process
 * (dist_agree) before any goes on, so all return -1 together and none
 * waits for one that gave up; in threads a stage thread that cannot
 * start calls the segment off before any stage runs (the gate). A peer
 * that dies or hangs mid-segment is the carriers' to report (p2p.h: the
 * job ends). Broken invariants are bug().
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
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../io/util.h"
#include "../optim/optim.h"
#include "comm/board.h"
#include "comm/dist.h"
#include "comm/experts.h"
#include "comm/nccl.h"
#include "comm/pieces.h"
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
	struct experts *ex;       /* expert parallelism (experts.h); NULL for P = 1 */
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
	/* the stage threads wait here until every one has started, so that
	 * a thread that cannot start cancels the segment before any stage
	 * waits on it (start_gate) */
	pthread_mutex_t gate_mu;
	pthread_cond_t gate_cv;
	int gate;                 /* 0: wait, 1: run, -1: the segment is off */
	atomic_int failed;        /* a stage failed mid-segment (stage_fail) */
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
	float *asked_dev;         /* [N] backend memory: the replicas' requests
				   * (with replicas; allocated before the segment) */
	int32_t *dev_in, *dev_tg; /* [B*T] the stage's tokens on its lane */
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

/* Stage c cannot go on (error() said why). In threads the segment is
 * called off: every transport, board and replica sum of the process wakes
 * its waiters, which return at once, so that every stage leaves its list
 * and pipeline_run returns -1. Between processes the peers wait inside MPI
 * or NCCL, which nothing interrupts: the job ends (p2p.h), every rank
 * exiting non-zero. */
static void stage_fail(struct stage_ctx *c)
{
	struct pipeline *p = c->p;
	if (dist_active(p->tr->dist)) {
		error("rank %d (stage %d): the segment cannot go on; aborting the job",
		      dist_rank(p->tr->dist), c->s);
		dist_abort();
	}
	if (atomic_exchange(&p->failed, 1))
		return; /* another stage called it off */
	for (int r = 0; r < p->tr->N; r++) {
		p->tp[r]->abort(p->tp[r]);
		p->board[r]->abort(p->board[r]);
	}
	if (p->rx)
		p->rx->abort(p->rx);
	if (p->ex)
		p->ex->abort(p->ex);
}

/* Was the segment called off (stage_fail)? */
static int called_off(const struct stage_ctx *c) { return atomic_load(&c->p->failed); }

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
	be->to_device(c->asked_dev, host, (size_t)N * sizeof(float));
	double waited = 0;
	p->rx->allreduce(p->rx, c->r, c->s, c->asked_dev, (size_t)N, &waited);
	c->idle += waited;
	be->to_host(host, c->asked_dev, sizeof(float));
	asked = host[0];
	free(host);
	return asked > 0;
}

/* The seconds w's expert exchange (model.expert_parallel) blocked since
 * they were last taken, counted as stage c's idle time; returned, for the
 * caller to leave out of its busy time. */
static double ep_idle(struct stage_ctx *c, const struct stage_worker *w)
{
	double waited = ep_take_waited(w->st.moe_ep);
	c->idle += waited;
	return waited;
}

/* Expert parallelism: the work of piece c's next pass (experts.h), which
 * the members of its group check they share; gv: the weight version it
 * computes on. ASYNCPP_FAULT=ep_version:STEP:RANK (dist.h) has that rank
 * claim a version one off in step STEP: the tests of that check. */
static void ep_work(struct stage_ctx *c, const struct sched_action *a, long gv)
{
	struct pipeline *p = c->p;
	if (!p->ex)
		return;
	struct ep_work w = {.step = global_step(p, a->step), .version = gv, .piece = c->s,
			    .mb = a->mb % p->mb_r};
	if (dist_active(p->tr->dist) &&
	    dist_fault(p->tr->dist, "ep_version", w.step, w.step,
		       "compute on its expert-parallel group's weight version"))
		w.version++;
	p->ex->work(p->ex, c->r, c->s, &w);
}

/* OPTIM_STEP: post this stage's gradient sums (and tied part). 0, or -1
 * when the segment was called off or a part cannot be allocated. */
static int post_step(struct stage_ctx *c, long gstep)
{
	struct pipeline *p = c->p;
	struct trainer *tr = p->tr;
	struct stage_worker *w = trainer_worker(tr, c->r, c->s);
	struct board *b = p->board[c->r];
	float *g = worker_grads(w, gstep);
	double t0 = now_sec();
	if (p->ex && p->ex->deliver) { /* the owners' accumulators for this replica's rows */
		p->ex->deliver(p->ex, c->r, c->s, g, w->st.numel);
		t0 += ep_idle(c, w);
	}
	if (p->rx) {
		/* the replicas' sum first: everything below sees the step's
		 * whole gradient (S = 1 keeps the tied head part apart); its
		 * buckets, if the last backward sent it in buckets */
		double waited = 0.0, head_waited = 0.0;
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
		if (called_off(c))
			return -1;
	}
	if (tr->S == 1) {
		stage_finish_grads(&w->st, g);
	} else if (tied_stage(tr, w)) {
		float *g_wte = g + w->st.params[w->wte_param].offset;
		if (b->tied_post(b, c->s, gstep, g_wte))
			return -1;
		if (c->s == 0) {
			/* stage 0's norm needs the summed gradient now */
			double waited = 0;
			c->busy += now_sec() - t0;
			const float *head = b->tied_wait(b, c->s, gstep, &waited);
			c->idle += waited;
			if (!head)
				return -1;
			t0 = now_sec();
			tr->be->add(g_wte, g_wte, head, p->tied_n);
		}
	}
	optim_grad_sumsq(&w->opt, g, w->sumsq);
	w->sumsq[w->opt.n] = stop_asked(c);
	if (called_off(c))
		return -1;
	b->post(b, c->s, gstep, w->sumsq);
	c->posted = gstep;
	c->busy += now_sec() - t0;
	return 0;
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

/* Before the backward (fused, or W) of micro-batch mb of step gstep: the
 * step's last one sends the replicas' sum out in buckets as it finishes
 * layers (the weight gradients of a step run in ascending micro-batch
 * order, so its last is the step's last contribution). Returns whether it
 * does (then buckets_end follows the backward). */
static int buckets_begin(struct stage_ctx *c, struct stage_worker *w, int mb, long gstep)
{
	struct pipeline *p = c->p;
	if (!(p->rx && p->rx->bucket && p->bucket_floats && mb % p->mb_r == p->mb_r - 1))
		return 0;
	if (p->ex && p->ex->deliver)
		return 0; /* expert gradients arrive at the step's end (experts.h) */
	c->bucketed = gstep;
	c->bk_g = worker_grads(w, gstep);
	c->bk_n = 0;
	c->bk_waited = 0.0;
	w->st.grads_done = on_grads_done;
	w->st.grads_done_ctx = c;
	return 1;
}

/* After it: the last bucket goes out; returns the seconds the buckets
 * waited (idle, not busy). */
static double buckets_end(struct stage_ctx *c, struct stage_worker *w)
{
	bucket_send(c);
	w->st.grads_done = NULL;
	c->idle += c->bk_waited;
	return c->bk_waited;
}

/* Apply the update of step gstep on this stage once every stage posted.
 * 0, or -1 when the segment was called off. */
static int complete_step(struct stage_ctx *c, long gstep)
{
	struct pipeline *p = c->p;
	struct trainer *tr = p->tr;
	struct stage_worker *w = trainer_worker(tr, c->r, c->s);
	struct board *b = p->board[c->r];
	double waited = 0;
	const double *sums = b->wait(b, c->s, gstep, &waited);
	c->idle += waited;
	if (!sums)
		return -1;
	if (tied_stage(tr, w) && c->s == tr->S - 1) {
		const float *emb = b->tied_wait(b, c->s, gstep, &waited);
		c->idle += waited;
		if (!emb)
			return -1;
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
			bug("stage %d began step %d of the segment, past the stop "
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
	return 0;
}

/* Complete pending updates until this stage's newest version is >= v
 * (0), or until the segment is called off (-1). */
static int need_version(struct stage_ctx *c, long v)
{
	while (c->completed < v && c->completed < c->posted)
		if (complete_step(c, c->completed + 1))
			return -1;
	if (trainer_worker(c->p->tr, c->r, c->s)->newest < v && v > 0)
		bug("stage %d needs version %ld but only %ld steps were posted",
		    c->s, v, c->posted);
	return 0;
}

/* The buffer for stage c's activation of micro-batch mb of step gstep;
 * NULL after error(): none could be allocated, or ASYNCPP_FAULT (dist.h)
 * says that stage 0 of replica 0 runs out of memory there (the first
 * micro-batch of the step). */
static void *buffer_of(struct stage_ctx *c, struct transport *tp, long gstep, int mb)
{
	struct pipeline *p = c->p;
	char what[96];
	snprintf(what, sizeof(what), "allocate the activation of step %ld for stage 0", gstep);
	if (c->s == 0 && c->r == 0 && mb % p->mb_r == 0 &&
	    dist_fault(p->tr->dist, "buffer", gstep, gstep, what))
		return NULL;
	return tp->buffer(tp, c->s, p->act_bytes);
}

/* Is model piece q held by stage s0 (the same thread: a local handoff,
 * which the lists leave out)? */
static int local_piece(const struct pipeline *p, int q, int s0)
{
	return p->tr->V > 1 && q >= 0 && q < p->tr->S && sched_piece_stage(p->sc, q) == s0;
}

/* Stage s0 of replica c0->r: its list. c0 is the context of its chunk 0
 * (piece s0); with V chunks (interleaved) the context of chunk k, piece
 * q = sched_piece(s0, k), is c0 + q - s0, and each action runs on its
 * chunk's piece: its worker, its messages (addressed by piece), its
 * board posts. */
static void *stage_main(void *arg)
{
	struct stage_ctx *c0 = arg, *c = c0;
	struct pipeline *p = c0->p;
	struct trainer *tr = p->tr;
	const struct backend *be = tr->be;
	struct transport *tp = p->tp[c0->r];
	struct board *board = p->board[c0->r];
	int s0 = c0->s, S = tr->S, V = tr->V;
	size_t bt = (size_t)tr->B * (size_t)tr->T;
	backend_lane_bind(be, s0); /* this thread's ops, of every replica's stage s */
	int32_t *host_in = xmalloc(bt * sizeof(int32_t)), *host_tg = xmalloc(bt * sizeof(int32_t));
	void *x_in = NULL, *x_out = NULL, *dx_out = NULL, *dx_in = NULL; /* act_dtype */
	float dloss = 1.0f / (float)p->mb_per_step;
	struct stage_ctx *chunk[64];
	for (int k = 0; k < V; k++) {
		chunk[k] = c0 + (sched_piece(p->sc, s0, k) - s0);
		chunk[k]->completed = chunk[k]->posted = p->first_step;
	}
	int n;
	const struct sched_action *a = sched_actions(p->sc, s0, &n);
	int bad = 0; /* this stage failed, or another called the segment off */
	for (int i = 0; i < n && !bad; i++) {
		if (called_off(c0))
			break;
		int stop_at = c0->stop_at;
		for (int k = 1; k < V; k++)
			stop_at = MIN(stop_at, chunk[k]->stop_at);
		if (a[i].step > stop_at)
			continue; /* a stop was agreed: this step is not run */
		c = chunk[a[i].chunk];
		struct stage_worker *w = trainer_worker(tr, c->r, c->s);
		int s = c->s, last = s == S - 1;
		int32_t *dev_in = c->dev_in, *dev_tg = c->dev_tg;
		c->begun = MAX(c->begun, a[i].step);
		double waited = 0.0, t0;
		long gv = p->first_step + a[i].version;
		long gmb = a[i].mb >= 0 ? global_mb(p, c->r, a[i].mb) : -1;
		long data_index = (p->first_step + tr->data_skip) * p->mb_per_step + gmb;
		switch (a[i].op) {
		case SCHED_RECV_ACT:
			x_in = tp->recv(tp, s, s - 1, MSG_ACT, a[i].mb, &waited);
			c->idle += waited;
			bad = !x_in;
			break;
		case SCHED_RECV_GRAD:
			dx_out = tp->recv(tp, s, s + 1, MSG_GRAD, a[i].mb, &waited);
			c->idle += waited;
			bad = !dx_out;
			break;
		case SCHED_FORWARD: {
			if ((bad = need_version(c, gv) != 0))
				break;
			if (local_piece(p, s - 1, s0)) {
				x_in = tp->recv(tp, s, s - 1, MSG_ACT, a[i].mb, &waited);
				if ((bad = !x_in))
					break;
			}
			t0 = now_sec();
			if (s == 0 || last) {
				/* the first piece reads the inputs, the last the
				 * targets (zb-v: both on stage 0, a piece each) */
				dataloader_batch(tr->data, data_index, host_in, host_tg);
				if (s == 0)
					be->to_device(dev_in, host_in, bt * sizeof(int32_t));
				if (last)
					be->to_device(dev_tg, host_tg, bt * sizeof(int32_t));
			}
			long gstep = global_step(p, a[i].step);
			if (!last && !(x_out = buffer_of(c, tp, gstep, a[i].mb))) {
				bad = 1;
				break;
			}
			ep_work(c, &a[i], gv);
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
			t0 += ep_idle(c, w);
			c->busy += now_sec() - t0;
			if (local_piece(p, s + 1, s0)) {
				tp->send(tp, s, s + 1, MSG_ACT, a[i].mb, x_out);
				x_out = NULL;
			}
			break;
		}
		case SCHED_SEND_ACT:
			tp->send(tp, s, s + 1, MSG_ACT, a[i].mb, x_out);
			x_out = NULL;
			break;
		case SCHED_BACKWARD:
		case SCHED_BACKWARD_INPUT: {
			int fused = a[i].op == SCHED_BACKWARD;
			long gstep = global_step(p, a[i].step);
			/* the gradient buffer of gstep held step gstep-2 (B
			 * leaves the gradients to W) */
			while (fused && c->completed < gstep - 2 && !bad)
				bad = complete_step(c, c->completed + 1) != 0;
			if (bad || (s > 0 && !(dx_in = tp->buffer(tp, s, p->act_bytes)))) {
				bad = 1;
				break;
			}
			if (local_piece(p, s + 1, s0)) {
				dx_out = tp->recv(tp, s, s + 1, MSG_GRAD, a[i].mb, &waited);
				c->idle += waited;
				if ((bad = !dx_out))
					break;
			}
			t0 = now_sec();
			int buckets = fused && buckets_begin(c, w, a[i].mb, gstep);
			ep_work(c, &a[i], gv);
			if (fused)
				stage_backward(&w->st, a[i].slot, worker_grad_weights(w, gv),
					       worker_grads(w, gstep), dx_out, dx_in);
			else
				stage_backward_input(&w->st, a[i].slot, worker_grad_weights(w, gv),
						     dx_out, dx_in);
			if (buckets)
				t0 += buckets_end(c, w);
			if (dx_out)
				tp->release(tp, s, dx_out);
			dx_out = NULL;
			t0 += ep_idle(c, w);
			c->busy += now_sec() - t0;
			if (local_piece(p, s - 1, s0)) {
				tp->send(tp, s, s - 1, MSG_GRAD, a[i].mb, dx_in);
				dx_in = NULL;
			}
			break;
		}
		case SCHED_BACKWARD_WEIGHT: {
			/* the parameter gradients of the micro-batch B left in
			 * its slot, which is free again after this */
			long gstep = global_step(p, a[i].step);
			while (c->completed < gstep - 2 && !bad)
				bad = complete_step(c, c->completed + 1) != 0;
			if (bad)
				break;
			t0 = now_sec();
			int buckets = buckets_begin(c, w, a[i].mb, gstep);
			ep_work(c, &a[i], gv);
			stage_backward_weight(&w->st, a[i].slot, worker_grad_weights(w, gv),
					      worker_grads(w, gstep));
			if (buckets)
				t0 += buckets_end(c, w);
			t0 += ep_idle(c, w);
			c->busy += now_sec() - t0;
			break;
		}
		case SCHED_SEND_GRAD:
			tp->send(tp, s, s - 1, MSG_GRAD, a[i].mb, dx_in);
			dx_in = NULL;
			break;
		case SCHED_OPTIM_STEP: {
			long gstep = global_step(p, a[i].step);
			/* every chunk's piece, the last first: with one stage
			 * (S = V pieces) piece 0 waits in post_step for the
			 * last piece's half of the tied embedding */
			for (int k = V - 1; k >= 0 && !bad; k--) {
				c = chunk[k];
				c->begun = MAX(c->begun, a[i].step);
				/* updates are applied in order: finish older ones first */
				while (c->completed < gstep - 1 && c->completed < c->posted && !bad)
					bad = complete_step(c, c->completed + 1) != 0;
				if (bad || (bad = post_step(c, gstep) != 0))
					break;
				c->posted_at[gstep - p->first_step - 1] = now_sec();
			}
			break;
		}
		default: /* sched_check admits no other op */
			bug("stage %d: action %d is op %s, which the worker does not run", c->s, i,
			    sched_op_name(a[i].op));
		}
		if (board->poll)
			board->poll(board);
	}
	for (int k = 0; k < V; k++)
		while (!bad && !called_off(chunk[k]) && chunk[k]->completed < chunk[k]->posted)
			bad = complete_step(chunk[k], chunk[k]->completed + 1) != 0;
	if (bad)
		stage_fail(c0);
	free(host_in);
	free(host_tg);
	return NULL;
}

/* A stage thread: runs its stage once every thread of the segment has
 * started (pipeline.gate), or nothing when one could not start. */
static void *stage_thread(void *arg)
{
	struct stage_ctx *c = arg;
	struct pipeline *p = c->p;
	pthread_mutex_lock(&p->gate_mu);
	while (!p->gate)
		pthread_cond_wait(&p->gate_cv, &p->gate_mu);
	int go = p->gate > 0;
	pthread_mutex_unlock(&p->gate_mu);
	return go ? stage_main(c) : NULL;
}

static void open_gate(struct pipeline *p, int state)
{
	pthread_mutex_lock(&p->gate_mu);
	p->gate = state;
	pthread_cond_broadcast(&p->gate_cv);
	pthread_mutex_unlock(&p->gate_mu);
}

/* ---- one stage per process ---- */

/* Tags of the control channel (dist_send/dist_recv) between segments
 * (expert_owned.c has 4 and 5). */
enum { TAG_STATS = 1, TAG_STATE = 2 };

/* The pipeline's side of the process's runtime (dist.h: the runtime holds
 * it): one trainer, its transport, board and replica group, kept from
 * segment to segment (creating them is collective and costs a round trip)
 * until dist_finalize. */
struct mpi_side {
	const struct trainer *tr; /* the trainer attached */
	int r, s;                 /* this process's replica and stage */
	struct transport *tp;
	struct board *board;
	struct replicas *rx;      /* NULL for N = 1 */
	struct experts *ex;       /* model.expert_parallel > 1; else NULL */
	struct nccl_world nccl;   /* the channels (pipeline.transport = nccl) */
};

static void mpi_detach(void *arg)
{
	struct mpi_side *mp = arg;
	if (mp->ex)
		mp->ex->destroy(mp->ex);
	if (mp->rx)
		mp->rx->destroy(mp->rx);
	if (mp->board)
		mp->board->destroy(mp->board);
	if (mp->tp)
		mp->tp->destroy(mp->tp);
	nccl_world_close(&mp->nccl); /* after the transport and replicas on it */
	free(mp);
}

/* Did every rank set up its part `what` of the pipeline (failed 0 on
 * every rank)? 0 when so; else -1 after error(), on each rank: its own
 * failure (already said) or another's. */
static int attach_agreed(const struct dist *d, int failed, const char *what)
{
	if (!dist_max_int(d, failed != 0))
		return 0;
	if (failed)
		return error("rank %d: cannot set up %s between processes", dist_rank(d), what);
	return error("rank %d: stopping: another rank could not set up %s (its message says "
		     "why)", dist_rank(d), what);
}

/* First use of tr under MPI (every rank reaches it at the same call): set
 * up the transport, the board and the replica group. The process holds
 * only its own stage's pieces' workers (trainer_init). 0, or -1 after error()
 * (what was made is undone); the caller agrees on it with the other ranks
 * (dist_agree). */
static int mpi_attach(struct trainer *tr)
{
	struct dist *d = tr->dist;
	const struct mpi_side *was = dist_pipeline(d);
	if (was && was->tr == tr)
		return 0;
	if (was)
		bug("a second trainer in one MPI process");
	int S = tr->S, stages = tr->stages, N = tr->N, rank = dist_rank(d);
	if (stages * N != dist_world(d))
		bug("%d stages x %d replicas on %d processes", stages, N, dist_world(d));
	struct mpi_side *mp = xcalloc(1, sizeof(*mp));
	mp->r = rank / stages;
	mp->s = rank % stages;
	struct pieces pc = {.P = S, .S = stages, .V = tr->V, .stage = tr->piece_stage,
			    .chunk = tr->piece_chunk};
	/* the board needs every piece's tensor count; this rank holds its own */
	int *n_tensors = xcalloc((size_t)S, sizeof(int));
	for (int q = 0; q < S; q++) {
		n_tensors[q] = stage_param_count(tr->m, &tr->cut, q);
		if (trainer_holds(tr, mp->r * S + q) && n_tensors[q] != tr->w[mp->r * S + q].opt.n)
			bug("piece %d holds %d tensors, stage_param_count says %d", q,
			    tr->w[mp->r * S + q].opt.n, n_tensors[q]);
		n_tensors[q]++; /* and the stop request: post_step */
	}
	size_t act_bytes = (size_t)tr->B * (size_t)tr->T * (size_t)tr->m->cfg.C * act_size(tr->be);
	size_t tied_n = (size_t)tr->m->cfg.Vp * (size_t)tr->m->cfg.C;
	/* replica r's stage s is rank r*stages + s: its messages go to the
	 * ranks of its own replica. Each part is set up collectively (an MPI
	 * communicator, a TCP channel number, NCCL communicators), so every
	 * rank agrees that it has its part before any goes on to the next:
	 * a rank that failed one leaves no other waiting in the next one. */
	double timeout = tr->cfg->pipeline_timeout;
	int nccl = !strcmp(tr->cfg->pipeline_transport, "nccl");
	int failed = nccl && nccl_world_open(&mp->nccl, d, &pc, N, rank);
	if (attach_agreed(d, failed, "the NCCL channels")) {
		free(n_tensors);
		mpi_detach(mp); /* the channels of the ranks that opened theirs */
		return -1;
	}
	mp->tp = transport_shift(nccl ? transport_nccl(tr->be, &mp->nccl, act_bytes, timeout)
				     : transport_p2p(d, tr->be, &pc, N, rank, act_bytes, timeout),
				mp->r * S);
	if (attach_agreed(d, !mp->tp, "the transport of activations and gradients")) {
		free(n_tensors);
		mpi_detach(mp);
		return -1;
	}
	mp->board = board_p2p(d, tr->be, &pc, mp->s, mp->r * stages, n_tensors, tied_n, timeout);
	free(n_tensors);
	if (mp->board && dist_fault(d, "attach", 0, 0, "set up the step-finish board")) {
		mp->board->destroy(mp->board); /* as if what follows its channel failed */
		mp->board = NULL;
	}
	if (attach_agreed(d, !mp->board, "the step-finish board")) {
		mpi_detach(mp);
		return -1;
	}
	if (N > 1) {
		mp->rx = nccl ? replicas_nccl(tr->be, &mp->nccl, timeout)
			      : replicas_p2p(d, tr->be, N, &pc, rank, timeout);
		if (attach_agreed(d, !mp->rx, "the data-parallel replicas' sum")) {
			mpi_detach(mp);
			return -1;
		}
	}
	int P = tr->ep_split, E = tr->m->cfg.E; /* the trainer's (0: none) */
	if (P > 1 && !(mp->ex = nccl ? experts_nccl(tr->be, &mp->nccl, P, &pc, E, timeout)
				     : experts_p2p(d, tr->be, N, P, &pc, E, rank, timeout))) {
		mpi_detach(mp);
		return error("rank %d: cannot set up expert parallelism between processes", rank);
	}
	mp->tr = tr;
	dist_set_pipeline(d, mp, mpi_detach);
	return 0;
}

/* Every replica's losses to every rank (the rank of each replica's last
 * piece holds its own micro-batches'); rank 0 collects the busy and idle
 * seconds of replica 0's pieces. ctx: this rank's pieces (trainer_holds).
 * 0, or -1 after error(). */
static int mpi_segment_end(struct pipeline *p, const struct stage_ctx *ctx, int n_steps)
{
	struct trainer *tr = p->tr;
	const struct dist *d = tr->dist;
	int S = tr->S, stages = tr->stages, me = dist_rank(d);
	size_t n_mb = (size_t)n_steps * (size_t)p->mb_per_step;
	float *got = tr->N > 1 ? xcalloc(n_mb, sizeof(float)) : p->losses;
	for (int r = 0; r < tr->N; r++) {
		int root = r * stages + tr->piece_stage[S - 1];
		if (got != p->losses && me == root)
			memcpy(got, p->losses, n_mb * sizeof(float));
		if (dist_bcast(d, got, n_mb * sizeof(float), root)) {
			if (got != p->losses)
				free(got);
			return error("rank %d: cannot share the losses of the segment", me);
		}
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
		/* every rank's MoE statistics (its pieces, its replica's
		 * micro-batches) to every rank */
		size_t w = p->moe_w / S, n = n_mb * p->moe_w;
		double *all = xmalloc(n * sizeof(double));
		for (int q = 0; q < tr->N * stages; q++) {
			int r = q / stages;
			if (me == q)
				memcpy(all, p->moe, n * sizeof(double));
			if (dist_bcast(d, all, n * sizeof(double), q)) {
				free(all);
				return error("rank %d: cannot share the mixture-of-experts statistics "
					     "of the segment", me);
			}
			for (int s = 0; s < S; s++) {
				if (tr->piece_stage[s] != q % stages)
					continue;
				for (int t = 0; t < n_steps; t++)
					for (int k = 0; k < p->mb_r; k++) {
						size_t i = (size_t)t * p->mb_per_step +
							   (size_t)r * p->mb_r + k;
						memcpy(p->moe + i * p->moe_w + s * w,
						       all + i * p->moe_w + s * w, w * sizeof(double));
					}
			}
		}
		free(all);
	}
	if (me >= stages)
		return 0; /* replica r > 0: replica 0's seconds are the ones reported */
	/* each piece's seconds, in piece order from each rank */
	for (int q = 0; q < S; q++) {
		if (tr->piece_stage[q] == me && me > 0) {
			double t[2] = {ctx[q].busy, ctx[q].idle};
			if (dist_send(d, t, sizeof(t), 0, TAG_STATS))
				return -1;
		} else if (me == 0 && tr->piece_stage[q] != 0) {
			double t[2];
			if (dist_recv(d, t, sizeof(t), tr->piece_stage[q], TAG_STATS))
				return -1;
			tr->w[q].busy_s += t[0];
			tr->w[q].idle_s += t[1];
		}
	}
	return 0;
}

/* How many steps past step t a stage may have begun when it learns that
 * step t's posts ask to stop: it learns when it completes step t, and it
 * completes steps lazily, when an action needs them (a forward the version
 * t + 1, a backward or W of step t + 2 the gradient buffer of step t, the
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
				    : a[i].op == SCHED_BACKWARD ||
				      a[i].op == SCHED_BACKWARD_WEIGHT ? a[i].step - 2
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
	struct schedule *sc = sched_build_virtual(tr->kind, tr->S / tr->V,
						  is_pd ? tr->M : tr->mb_per_replica, tr->V, n, 0, err,
						  sizeof(err));
	if (!sc)
		bug("%s", err);
	int steps = 1 + stop_lag(sc) + 1; /* the next post, the lag, the drain (< 1 step) */
	sched_free(sc);
	return steps;
}

/* The backend memory stage c uses in a segment, on its lane: its tokens,
 * and with replicas the sum of the stop requests. Allocated before any
 * stage starts, so that a failure is agreed on before anyone waits. 0, or
 * -1 after error(). */
static int stage_alloc(struct stage_ctx *c, const struct backend *be, size_t bt, int N)
{
	int before = backend_lane_enter(be, trainer_lane(c->p->tr, c->s));
	c->dev_in = be->alloc(bt * sizeof(int32_t));
	c->dev_tg = be->alloc(bt * sizeof(int32_t));
	if (N > 1)
		c->asked_dev = be->alloc((size_t)N * sizeof(float));
	backend_lane_bind(be, before);
	if (!c->dev_in || !c->dev_tg || (N > 1 && !c->asked_dev))
		return error("cannot allocate the tokens of stage %d of replica %d on backend '%s'",
			     c->s, c->r, be->name);
	return 0;
}

static void stage_release(struct stage_ctx *c, const struct backend *be)
{
	int before = backend_lane_enter(be, trainer_lane(c->p->tr, c->s));
	be->free(c->dev_in); /* NULL is fine, as for free() */
	be->free(c->dev_tg);
	be->free(c->asked_dev);
	backend_lane_bind(be, before);
	free(c->posted_at);
}

/* Expert parallelism (model.expert_parallel = P > 1; experts.h): the
 * hooks of the pieces this process holds, set for a segment (ex) and
 * after it (NULL) those of evaluation and sampling: in threads the
 * owners' weights read in place (trainer_ep_view), between processes
 * none (pipeline_eval sets ex's again for its passes); without expert
 * parallelism none. */
static void experts_hooks(struct trainer *tr, struct experts *ex)
{
	for (int i = 0; i < tr->N * tr->S; i++)
		if (worker_alive(&tr->w[i]))
			tr->w[i].st.moe_ep = ex ? ex->member(ex, i / tr->S, i % tr->S)
						: trainer_ep_view(tr, i);
}

int pipeline_run(struct trainer *tr, int n, struct step_stats *stats)
{
	int before = backend_lane_current(tr->be); /* bound again when done */
	struct pipeline p = {.tr = tr, .first_step = tr->step};
	char err[256];
	struct dist *d = tr->dist;
	int mpi = dist_active(d);
	if (mpi && dist_agree(d, mpi_attach(tr), "to set up the pipeline between processes"))
		return -1;
	const struct mpi_side *mp = dist_pipeline(d);
	int N = tr->N, S = tr->S;
	/* the pieces this process runs: replica r, piece q, i = r*S + q in
	 * [lo, hi) where trainer_holds (every one in threads; under MPI the
	 * pieces of its stage, of its replica) */
	int lo = mpi ? dist_rank(d) / tr->stages * S : 0, hi = mpi ? lo + S : N * S;
	int first = mpi ? lo + dist_rank(d) % tr->stages : 0; /* its stage's chunk 0 */
	int is_pd = tr->kind == SCHED_PIPEDREAM;
	p.mb_per_step = tr->mb_per_step;
	p.mb_r = tr->mb_per_replica;
	p.rep_r = first / S;
	p.rep_s = first % S;
	/* the same lists on every rank: it fails everywhere or nowhere */
	p.sc = sched_build_virtual(tr->kind, S / tr->V, is_pd ? tr->M : p.mb_r, tr->V, n, tr->step,
				   err, sizeof(err));
	if (!p.sc)
		return error("%s", err);
	if (p.sc->V != tr->V)
		bug("the %s schedule has %d chunks per stage, the trainer %d",
		    sched_kind_name(tr->kind), p.sc->V, tr->V);
	p.stop_lag = stop_lag(p.sc);
	for (int i = lo; i < hi; i++) {
		if (!trainer_holds(tr, i))
			continue;
		if (sched_piece_stage(p.sc, i % S) != tr->piece_stage[i % S])
			bug("piece %d is on stage %d of the schedule, stage %d of the trainer", i % S,
			    sched_piece_stage(p.sc, i % S), tr->piece_stage[i % S]);
		const struct sched_stage *ss = sched_stage(p.sc, sched_piece_stage(p.sc, i % S));
		int slots = sched_piece_slots(p.sc, i % S);
		if (slots > tr->w[i].st.n_slots || ss->nversions > tr->w[i].n_versions)
			bug("piece %d needs %d slots and %d versions, has %d and %d", i % S, slots,
			    ss->nversions, tr->w[i].st.n_slots, tr->w[i].n_versions);
	}
	p.act_bytes = (size_t)tr->B * (size_t)tr->T * (size_t)tr->m->cfg.C * act_size(tr->be);
	double bucket = tr->cfg->pipeline_bucket_mb * 1048576.0 / 4.0; /* floats */
	p.bucket_floats = bucket <= 0 ? 0 : bucket >= 0x1p62 ? (size_t)1 << 62
					: (size_t)MAX(1.0, bucket);
	p.tied_n = (size_t)tr->m->cfg.Vp * (size_t)tr->m->cfg.C;
	size_t n_mb = st_mult((size_t)n, (size_t)p.mb_per_step);
	p.losses = xcalloc(n_mb, sizeof(float));
	p.moe_w = trainer_moe_width(tr);
	if (p.moe_w)
		p.moe = xcalloc(st_mult(n_mb, p.moe_w), sizeof(double));
	p.norm = xcalloc((size_t)n, sizeof(double));
	p.lr = xcalloc((size_t)n, sizeof(double));
	pthread_mutex_init(&p.gate_mu, NULL);
	pthread_cond_init(&p.gate_cv, NULL);
	/* what can fail on one process and not another, before any stage
	 * starts: then every process agrees and none waits on a peer */
	int failed = 0;
	/* on the last stages' lane, which writes it (one lane with MPI) */
	backend_lane_bind(tr->be, trainer_lane(tr, S - 1));
	p.loss_dev = tr->be->alloc(st_mult(n_mb, sizeof(float)));
	backend_lane_bind(tr->be, before);
	if (!p.loss_dev)
		failed = error("cannot allocate the segment's %zu losses on backend '%s'", n_mb,
			       tr->be->name);
	size_t bt = (size_t)tr->B * (size_t)tr->T;
	struct stage_ctx *ctx = xcalloc((size_t)(N * S), sizeof(*ctx));
	for (int i = lo; i < hi; i++) {
		if (!trainer_holds(tr, i))
			continue;
		ctx[i] = (struct stage_ctx){.p = &p, .r = i / S, .s = i % S, .stop_at = n - 1,
					    .begun = -1,
					    .posted_at = xcalloc((size_t)n, sizeof(double))};
		if (!failed && stage_alloc(&ctx[i], tr->be, bt, N))
			failed = -1;
	}
	char what[96];
	snprintf(what, sizeof(what), "start the segment of steps %ld to %ld", p.first_step + 1,
		 p.first_step + n);
	if (!failed && dist_fault(d, "segment", p.first_step + 1, p.first_step + n, what))
		failed = -1;
	int rc = dist_agree(d, failed, "to start the segment");
	if (rc)
		goto out;
	p.tp = xcalloc((size_t)N, sizeof(*p.tp));
	p.board = xcalloc((size_t)N, sizeof(*p.board));
	if (mpi) {
		p.tp[mp->r] = mp->tp;
		p.board[mp->r] = mp->board;
		p.rx = mp->rx;
		p.ex = mp->ex;
	} else {
		int *nt = xcalloc((size_t)S, sizeof(int));
		for (int s = 0; s < S; s++)
			nt[s] = tr->w[s].opt.n + 1; /* the sums, then the stop request */
		for (int r = 0; r < N; r++) {
			p.tp[r] = transport_local(tr->be, S, tr->piece_stage, p.act_bytes);
			p.board[r] = board_local(tr->be, S, tr->piece_stage, nt, p.tied_n);
		}
		free(nt);
		p.rx = N > 1 ? replicas_local(tr->be, N, S) : NULL;
		int P = tr->ep_split;
		p.ex = P > 1 ? experts_local(tr->be, N, P, S, tr->m->cfg.E) : NULL;
	}
	experts_hooks(tr, p.ex);
	for (int r = 0; r < N; r++)
		if (p.board[r])
			p.board[r]->begin(p.board[r], p.first_step, n);
	trainer_moe_begin(tr, n);
	if (mpi) {
		stage_main(&ctx[first]);
	} else {
		/* every thread waits at the gate until all have started: one
		 * that cannot start calls the segment off before any stage
		 * waits on it */
		/* a thread per stage (S / V of them): stage s of replica r
		 * starts from its chunk 0's piece s */
		int stages = S / tr->V, nth = N * stages;
		pthread_t *th = xcalloc((size_t)nth, sizeof(*th));
		int started = 0;
		while (started < nth &&
		       !pthread_create(&th[started], NULL, stage_thread,
				       &ctx[started / stages * S + started % stages]))
			started++;
		if (started < nth)
			rc = error("cannot start the thread of stage %d of replica %d (%d threads "
				   "run; lower pipeline.stages or pipeline.data_parallel, or raise "
				   "the process limit: ulimit -u)", started % stages,
				   started / stages, started);
		open_gate(&p, rc ? -1 : 1);
		for (int i = 0; i < started; i++)
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
	if (atomic_load(&p.failed))
		rc = -1; /* the failing stage said why */
	if (rc)
		goto out;
	/* the steps run: every stage saw the same requests (post_step) */
	int done = ctx[first].stop_at + 1;
	for (int i = lo; i < hi; i++) {
		if (!trainer_holds(tr, i))
			continue;
		if (ctx[i].stop_at + 1 != done)
			bug("piece %d of replica %d stopped after %d steps of the segment, piece %d "
			    "of replica %d after %d", i % S, i / S, ctx[i].stop_at + 1, first % S,
			    first / S, done);
		tr->w[i].busy_s += ctx[i].busy;
		tr->w[i].idle_s += ctx[i].idle;
	}
	tr->step = p.first_step + done; /* the weights moved on, whatever follows */
	/* one wait for every loss of the segment (zeros where no local last
	 * stage wrote: under MPI the other ranks' come in mpi_segment_end) */
	backend_lane_bind(tr->be, trainer_lane(tr, S - 1));
	tr->be->to_host(p.losses, p.loss_dev, st_mult(n_mb, sizeof(float)));
	backend_lane_bind(tr->be, before);
	if (mpi && dist_agree(d, mpi_segment_end(&p, ctx, done),
			      "to share the segment's results")) {
		rc = -1;
		goto out;
	}
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
			if (trainer_holds(tr, k))
				st.done_s = MAX(st.done_s, ctx[k].posted_at[i]);
		if (stats)
			stats[i] = st;
		tr->last = st;
	}
out:
	for (int k = lo; k < hi; k++)
		if (trainer_holds(tr, k))
			stage_release(&ctx[k], tr->be);
	free(ctx);
	backend_lane_bind(tr->be, trainer_lane(tr, S - 1));
	tr->be->free(p.loss_dev);
	backend_lane_bind(tr->be, before);
	free(p.losses);
	free(p.moe);
	free(p.norm);
	free(p.lr);
	if (!mpi && p.board) {
		for (int r = 0; r < N; r++) {
			p.board[r]->destroy(p.board[r]);
			p.tp[r]->destroy(p.tp[r]);
		}
		if (p.rx)
			p.rx->destroy(p.rx);
	}
	experts_hooks(tr, NULL);
	if (!mpi && p.ex)
		p.ex->destroy(p.ex);
	free(p.board);
	free(p.tp);
	pthread_cond_destroy(&p.gate_cv);
	pthread_mutex_destroy(&p.gate_mu);
	sched_free(p.sc);
	return rc;
}

/* ---- evaluation: one path for threads and processes ---- */

/* One stage's part of an evaluation: its forward-only action lists
 * (sched_build_forward), on the newest weights and slot 0 as
 * trainer_eval's forward_all does, activations passed on tp; the last
 * piece writes each batch's loss. Replica r's j-th batch is r + j*N (the
 * replicas hold the same weights); a batch past the evaluation's end is
 * left out by every stage alike. The lists come in windows of batches
 * (batches do not wait on one another), so that a long evaluation never
 * holds more than a window's actions. */
struct eval_ctx {
	struct trainer *tr;
	struct dataloader *data;
	struct transport *tp;     /* the replica's */
	int r, s, batches;        /* replica, stage */
	int32_t *dev_in, *dev_tg; /* [B*T] the stage's tokens, on its lane */
	float *losses;            /* [batches] */
	int failed;               /* a message buffer or a list could not be had */
	int32_t *host_in, *host_tg;
	struct experts *ex;       /* between processes with expert parallelism: the
				   * hook's carrier (each call's work is set); then
				   * every replica runs every micro-batch of the
				   * lists (a batch past the end on the last one's
				   * tokens, its loss dropped), as every member of a
				   * group must be at every call */
};

/* The stage's actions of one window of sc's lists, whose micro-batch j is
 * replica batch `first` + j. */
static void eval_window(struct eval_ctx *e, const struct schedule *sc, int first)
{
	struct trainer *tr = e->tr;
	const struct backend *be = tr->be;
	int S = tr->S;
	struct transport *tp = e->tp;
	size_t bt = (size_t)tr->B * (size_t)tr->T;
	size_t act_bytes = bt * (size_t)tr->m->cfg.C * act_size(be);
	int32_t *host_in = e->host_in, *host_tg = e->host_tg;
	void *x_in = NULL, *x_out = NULL;
	int n;
	const struct sched_action *a = sched_actions(sc, e->s, &n);
	for (int i = 0; i < n && !e->failed; i++) {
		int batch = e->r + (first + a[i].mb) * tr->N;
		if (batch >= e->batches && !e->ex)
			continue;
		int q = sched_piece(sc, e->s, a[i].chunk), last = q == S - 1;
		switch (a[i].op) {
		case SCHED_RECV_ACT:
			e->failed = !(x_in = tp->recv(tp, q, q - 1, MSG_ACT, batch, NULL));
			break;
		case SCHED_FORWARD: {
			if (q > 0 && tr->piece_stage[q - 1] == e->s &&
			    !(x_in = tp->recv(tp, q, q - 1, MSG_ACT, batch, NULL))) {
				e->failed = 1;
				break;
			}
			if (!last && !(x_out = tp->buffer(tp, q, act_bytes))) {
				e->failed = 1; /* error() said why */
				break;
			}
			if (q == 0 || last) { /* inputs to the first piece, targets to the last */
				dataloader_batch(e->data, MIN(batch, e->batches - 1), host_in,
						 host_tg);
				if (q == 0)
					be->to_device(e->dev_in, host_in, bt * sizeof(int32_t));
				if (last)
					be->to_device(e->dev_tg, host_tg, bt * sizeof(int32_t));
			}
			struct stage_worker *w = trainer_worker(tr, e->r, q);
			float loss = 0.0f;
			if (e->ex) { /* what the members' agreement check compares */
				struct ep_work work = {.step = tr->step, .version = w->newest,
						       .piece = q, .mb = first + a[i].mb};
				e->ex->work(e->ex, e->r, q, &work);
			}
			stage_forward(&w->st, 0, worker_weights(w, w->newest),
				      q == 0 ? e->dev_in : NULL, x_in, last ? e->dev_tg : NULL, x_out,
				      last ? &loss : NULL, NULL, NULL, 1.0f / (float)tr->M);
			if (x_in)
				tp->release(tp, q, x_in);
			x_in = NULL;
			if (last) {
				if (batch < e->batches) /* else a padded one's */
					e->losses[batch] = loss;
			} else if (tr->piece_stage[q + 1] == e->s) {
				tp->send(tp, q, q + 1, MSG_ACT, batch, x_out);
				x_out = NULL;
			}
			break;
		}
		case SCHED_SEND_ACT:
			tp->send(tp, q, q + 1, MSG_ACT, batch, x_out);
			x_out = NULL;
			break;
		default:
			bug("stage %d: action %d of an evaluation is op %s", e->s, i,
			    sched_op_name(a[i].op));
		}
	}
}

static void *eval_stage(void *arg)
{
	struct eval_ctx *e = arg;
	struct trainer *tr = e->tr;
	size_t bt = (size_t)tr->B * (size_t)tr->T;
	backend_lane_bind(tr->be, e->s); /* this thread's ops (one lane between processes) */
	e->host_in = xmalloc(bt * sizeof(int32_t));
	e->host_tg = xmalloc(bt * sizeof(int32_t));
	/* every stage the same windows: the same lists on every rank */
	int per_replica = (e->batches + tr->N - 1) / tr->N;
	int window = (int)MAX(1, MIN(1024L, SCHED_MAX_CELLS / 4 / tr->S));
	for (int first = 0; first < per_replica && !e->failed; first += window) {
		char err[256];
		struct schedule *sc = sched_build_forward(tr->kind, tr->stages, tr->V,
							  MIN(window, per_replica - first), err,
							  sizeof(err));
		if (!sc) {
			e->failed = error("cannot plan the evaluation: %s", err) != 0;
			break;
		}
		eval_window(e, sc, first);
		sched_free(sc);
	}
	free(e->host_in);
	free(e->host_tg);
	if (e->failed && e->tp->abort)
		e->tp->abort(e->tp); /* the other stages of the replica stop waiting */
	return NULL;
}

/* The tokens of ctx[lo, hi)'s stages on their lanes. 0, or -1 after error(). */
static int eval_alloc(struct eval_ctx *ctx, int lo, int hi)
{
	const struct backend *be = ctx[lo].tr->be;
	size_t bytes = (size_t)ctx[lo].tr->B * (size_t)ctx[lo].tr->T * sizeof(int32_t);
	int rc = 0;
	for (int i = lo; i < hi; i++) {
		int before = backend_lane_enter(be, ctx[i].s);
		ctx[i].dev_in = be->alloc(bytes);
		ctx[i].dev_tg = be->alloc(bytes);
		backend_lane_bind(be, before);
		if (!rc && (!ctx[i].dev_in || !ctx[i].dev_tg))
			rc = error("cannot allocate the evaluation's tokens for stage %d on backend "
				   "'%s'", ctx[i].s, be->name);
	}
	return rc;
}

static void eval_release(struct eval_ctx *ctx, int lo, int hi)
{
	const struct backend *be = ctx[lo].tr->be;
	for (int i = lo; i < hi; i++) {
		int before = backend_lane_enter(be, ctx[i].s);
		be->free(ctx[i].dev_in);
		be->free(ctx[i].dev_tg);
		backend_lane_bind(be, before);
	}
}

/* Every stage of every replica on a thread of its own, over local
 * transports (of the replica's S pieces). 0, or -1 after error(). */
static int eval_threads(struct trainer *tr, struct eval_ctx *ctx)
{
	int N = tr->N, S = tr->S, nth = N * tr->stages, rc = 0;
	size_t act_bytes = (size_t)tr->B * (size_t)tr->T * (size_t)tr->m->cfg.C * act_size(tr->be);
	struct transport **tp = xcalloc((size_t)N, sizeof(*tp));
	for (int r = 0; r < N; r++)
		tp[r] = transport_local(tr->be, S, tr->piece_stage, act_bytes);
	for (int i = 0; i < nth; i++)
		ctx[i].tp = tp[ctx[i].r];
	pthread_t *th = xcalloc((size_t)nth, sizeof(*th));
	int started = 0;
	while (started < nth && !pthread_create(&th[started], NULL, eval_stage, &ctx[started]))
		started++;
	if (started < nth) {
		rc = error("cannot start the evaluation thread of stage %d of replica %d",
			   ctx[started].s, ctx[started].r);
		for (int r = 0; r < N; r++)
			tp[r]->abort(tp[r]); /* the threads started stop waiting */
	}
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	if (backend_lane_count(tr->be) > 1)
		tr->be->synchronize(); /* the lanes' last ops, before the buffers go */
	for (int i = 0; i < started; i++)
		if (ctx[i].failed)
			rc = -1;
	for (int r = 0; r < N; r++)
		tp[r]->destroy(tp[r]);
	free(th);
	free(tp);
	return rc;
}

int pipeline_eval(struct trainer *tr, struct dataloader *data, int batches, double *loss)
{
	struct dist *d = tr->dist;
	int mpi = dist_active(d);
	if (tr->kind < 0) { /* one worker: no pipeline to run it through */
		*loss = trainer_eval(tr, data, batches);
		return 0;
	}
	batches = trainer_eval_batches(tr, data, batches); /* as trainer_eval does */
	if (mpi && dist_agree(d, mpi_attach(tr), "to set up the pipeline between processes"))
		return -1;
	int N = tr->N, S = tr->S, stages = tr->stages;
	/* the stages this process runs: replica r, stage s, i = r*stages + s
	 * in [lo, hi) */
	int lo = mpi ? dist_rank(d) : 0, hi = mpi ? lo + 1 : N * stages;
	float *losses = xcalloc((size_t)(batches > 0 ? batches : 1), sizeof(float));
	struct eval_ctx *ctx = xcalloc((size_t)(N * stages), sizeof(*ctx));
	for (int i = lo; i < hi; i++)
		ctx[i] = (struct eval_ctx){.tr = tr, .data = data, .r = i / stages,
					   .s = i % stages, .batches = batches, .losses = losses};
	int before = backend_lane_current(tr->be); /* bound again when done */
	int failed = dist_agree(d, eval_alloc(ctx, lo, hi), "to start the evaluation");
	if (!failed && mpi) {
		const struct mpi_side *mp = dist_pipeline(d);
		ctx[lo].tp = mp->tp;
		/* each replica holds only its own experts' weights (ep_split):
		 * the owners run them, as in training */
		ctx[lo].ex = mp->ex;
		if (ctx[lo].ex)
			experts_hooks(tr, mp->ex);
		eval_stage(&ctx[lo]);
		if (ctx[lo].ex) {
			for (int i = 0; i < N * S; i++)
				if (worker_alive(&tr->w[i]))
					ep_take_waited(tr->w[i].st.moe_ep); /* not a step's */
			experts_hooks(tr, NULL);
		}
		if (ctx[lo].failed) {
			error("rank %d (stage %d): the evaluation cannot go on; aborting the job",
			      dist_rank(d), ctx[lo].s);
			dist_abort(); /* the peers wait inside MPI (p2p.h) */
		}
	} else if (!failed) {
		trainer_ep_view_prepare(tr);
		failed = eval_threads(tr, ctx);
	}
	backend_lane_bind(tr->be, before);
	eval_release(ctx, lo, hi);
	free(ctx);
	/* between processes: every replica's losses from the rank of its last piece */
	float *got = mpi && N > 1 ? xcalloc((size_t)(batches > 0 ? batches : 1), sizeof(float))
				  : losses;
	for (int q = 0; mpi && !failed && q < N; q++) {
		int root = q * stages + tr->piece_stage[S - 1];
		if (got != losses && dist_rank(d) == root)
			memcpy(got, losses, (size_t)batches * sizeof(float));
		if (dist_bcast(d, got, (size_t)batches * sizeof(float), root)) {
			failed = error("rank %d: cannot share the evaluation loss", dist_rank(d));
			break;
		}
		if (got != losses)
			for (int i = q; i < batches; i += N)
				losses[i] = got[i];
	}
	if (got != losses)
		free(got);
	/* added in batch order, as trainer_eval adds them */
	double sum = 0.0;
	for (int i = 0; i < batches; i++)
		sum += losses[i];
	free(losses);
	*loss = batches ? sum / batches : 0.0;
	return failed ? -1 : 0;
}

/* ---- checkpoints: one path for threads and processes ---- */

/* Checkpoints: one path for a process that holds every piece (threads)
 * and for one stage's pieces per process. Rank 0 writes the file from the
 * pieces it holds and from what the other ranks of replica 0 send, in
 * checkpoint order, so no rank ever holds more than its own stage's
 * (gather_weights, gather_states: a piece's part comes from its worker
 * where this process holds it, else from its stage's rank). Rank s > 0
 * sends, for each weight version (back = 0, 1, ...) and each of its pieces
 * in piece order: a weights_head and the piece's own parameters' floats,
 * which are contiguous in the global arena from base_off; then, piece
 * after piece, each optimizer-state tensor as a tensor_head and its
 * floats, and an end header. Rank 0 receives the versions piece after
 * piece and the states piece after piece: MPI and TCP keep each sender's
 * messages in order. Under expert parallelism replica 0 keeps no state of
 * the experts replicas 1..P-1 own: their ranks send it, each to replica
 * 0's rank of its stage, in the order that rank's worker_state_tensors
 * asks (expert_owned.c), which it passes on with its own. */
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
	const struct dist *d = ctx;
	struct tensor_head h = {.numel = numel, .rows = rows, .cols = cols};
	snprintf(h.name, sizeof(h.name), "%s", name);
	if (dist_send(d, &h, sizeof(h), 0, TAG_STATE))
		return -1;
	return dist_send(d, data, numel * sizeof(float), 0, TAG_STATE);
}

/* What a rank of replica 0 other than 0 sends for a checkpoint: for each
 * weight version, its pieces' weights in piece order; then each piece's
 * optimizer state in piece order, each closed by an end header. */
static int send_state(struct trainer *tr)
{
	const struct dist *d = tr->dist;
	int rc = 0, nv = trainer_n_versions(tr);
	for (int back = 0; back < nv && !rc; back++) {
		for (int q = 0; q < tr->S && !rc; q++) {
			if (!trainer_holds(tr, q))
				continue;
			struct stage_worker *w = &tr->w[q];
			struct weights_head h = stage_range(&w->st);
			float *host = xmalloc(st_mult(w->st.numel, sizeof(float)));
			/* what trainer_gather_weights takes from this piece (the
			 * experts its weights leave out from their owners) */
			long v = w->newest - MIN(back, w->n_versions - 1);
			rc = trainer_piece_weights(tr, q, v, host);
			if (!rc)
				rc = dist_send(d, &h, sizeof(h), 0, TAG_STATE);
			if (!rc)
				rc = dist_send(d, host, h.count * sizeof(float), 0, TAG_STATE);
			free(host);
		}
	}
	for (int q = 0; q < tr->S && !rc; q++) {
		if (!trainer_holds(tr, q))
			continue;
		rc = worker_state_tensors(tr, &tr->w[q], send_tensor, tr->dist);
		struct tensor_head end = {.end = 1};
		if (!rc)
			rc = dist_send(d, &end, sizeof(end), 0, TAG_STATE);
	}
	return rc;
}

/* Rank 0's sources for trainer_save_from: the stages it holds (all of them
 * in a one-process run), the rest received. */
static int gather_weights(void *ctx, int back, float *global)
{
	struct trainer *tr = ctx;
	const struct dist *d = tr->dist;
	for (int s = 0; s < tr->S; s++) {
		struct stage_worker *w = &tr->w[s];
		if (worker_alive(w) && !dist_active(d)) {
			/* what trainer_gather_weights takes from this stage */
			trainer_save_version(tr, 0, s, w->newest - MIN(back, w->n_versions - 1),
					     global);
			continue;
		}
		if (worker_alive(w)) { /* rank 0's piece: the owners send their experts */
			float *host = xmalloc(st_mult(w->st.numel, sizeof(float)));
			long v = w->newest - MIN(back, w->n_versions - 1);
			int rc = trainer_piece_weights(tr, s, v, host);
			for (int k = 0; k < w->st.n_params && !rc; k++) {
				const struct stage_param *sp = &w->st.params[k];
				if (!sp->tied_copy)
					memcpy(global + tr->m->params[sp->global].offset,
					       host + sp->offset,
					       tr->m->params[sp->global].numel * sizeof(float));
			}
			free(host);
			if (rc)
				return -1;
			continue;
		}
		struct weights_head h;
		int from = tr->piece_stage[s];
		if (dist_recv(d, &h, sizeof(h), from, TAG_STATE))
			return -1;
		if (h.base_off > tr->m->numel || h.count > tr->m->numel - h.base_off)
			bug("rank %d sent weights [%zu, %zu + %zu) outside the "
			    "model's %zu floats", from, h.base_off, h.base_off, h.count,
			    tr->m->numel);
		if (dist_recv(d, global + h.base_off, h.count * sizeof(float), from, TAG_STATE))
			return -1;
	}
	return 0;
}

static int gather_states(void *ctx, int s, tensor_sink sink, void *sink_ctx)
{
	struct trainer *tr = ctx;
	const struct dist *d = tr->dist;
	if (worker_alive(&tr->w[s]))
		return worker_state_tensors(tr, &tr->w[s], sink, sink_ctx);
	int from = tr->piece_stage[s];
	float *buf = NULL;
	size_t cap = 0;
	int rc = 0;
	for (;;) {
		struct tensor_head h;
		if (dist_recv(d, &h, sizeof(h), from, TAG_STATE)) {
			rc = -1;
			break;
		}
		if (h.end)
			break;
		h.name[sizeof(h.name) - 1] = '\0';
		if (h.numel > MAX(tr->m->numel, optim_part_bound(tr->m)))
			bug("rank %d sent a state tensor '%s' of %zu floats, more "
			    "than any optimizer keeps for this model", from, h.name, h.numel);
		if (h.numel > cap) {
			cap = h.numel;
			buf = xrealloc(buf, st_mult(cap, sizeof(float)));
		}
		if (dist_recv(d, buf, h.numel * sizeof(float), from, TAG_STATE)) {
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
	struct dist *d = tr->dist;
	int rank = dist_rank(d), rc = 0;
	if (rank >= tr->stages) {
		/* replica rank / stages > 0: replica 0 holds the same bits, but
		 * for the weights and state of experts it does not own
		 * (expert_owned.c) */
		rc = trainer_send_owned_weights(tr);
		if (!rc)
			rc = trainer_send_owned_state(tr);
	} else if (rank > 0) {
		rc = send_state(tr);
	} else {
		struct ckpt_source src = {.weights = gather_weights, .states = gather_states,
					  .ctx = tr};
		rc = trainer_save_from(tr, &src, path, config_text, extra_meta);
	}
	/* a failed send or receive ends the job (p2p.h), so every rank gets
	 * here; every rank learns whether rank 0 wrote the file */
	return dist_agree(d, rc, "to write the checkpoint");
}
