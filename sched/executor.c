/* executor.c - run a pipeline schedule: one thread per stage worker.
 *
 * Each stage thread executes its action list (sched/schedule.h) in order,
 * exchanging activations and gradients through a transport. An OPTIM_STEP
 * only *posts* the stage's part of the step-finish sequence (trainer.h) to
 * a board shared by the stages; the update itself is completed lazily, when
 * a later action needs it: a forward that uses the new version, a backward
 * that needs the gradient buffer, or the end of the segment. Completion
 * waits until every stage has posted, then applies the same global norm,
 * clip and learning rate everywhere. Deferring it is what keeps 2BW free of
 * bubbles: the last stage does not wait for stage 0 to finish a step's
 * backward before it goes on with the next step's micro-batches.
 *
 * The arithmetic is exactly the single-device trainer's: the same
 * stage_forward/stage_backward on the same weight versions, gradients
 * accumulated in ascending micro-batch order, the same tied-weight sum and
 * the same norm summed tensor by tensor in global order.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../io/util.h"
#include "../optim/optim.h"
#include "schedule.h"
#include "trainer.h"
#include "transport.h"

/* The step-finish data of one optimizer step, posted by every stage. */
struct board_entry {
	int posted, consumed;
	double **sumsq;           /* [S][stage's tensors] */
	float *emb_part, *head_part; /* tied weights with S > 1: raw gradient parts */
	double norm, lr;
};

struct board {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct board_entry *e;    /* [n_steps] of this segment */
	int n_steps;
};

struct pipeline {
	struct trainer *tr;
	struct schedule *sc;
	struct transport *tp;
	struct board board;
	long first_step;          /* optimizer steps done before the segment */
	int mb_per_step;          /* M, or 1 for pipedream */
	float *losses;            /* [n_mb] */
	size_t act_n, tied_n;
};

struct stage_ctx {
	struct pipeline *p;
	int s;
	long completed;           /* global steps whose update this stage applied */
	long posted;
	double busy, idle;
};

static long global_step(const struct pipeline *p, int seg_step) { return p->first_step + seg_step + 1; }

static struct board_entry *entry(struct pipeline *p, long gstep)
{
	long i = gstep - p->first_step - 1;
	if (i < 0 || i >= p->board.n_steps)
		die("internal error: step %ld outside the segment", gstep);
	return &p->board.e[i];
}

static void wait_board(struct stage_ctx *c, int (*ready)(struct board_entry *, int), struct board_entry *e)
{
	struct board *b = &c->p->board;
	double t0 = now_sec();
	pthread_mutex_lock(&b->mu);
	while (!ready(e, c->p->tr->S))
		pthread_cond_wait(&b->cv, &b->mu);
	pthread_mutex_unlock(&b->mu);
	c->idle += now_sec() - t0;
}

static int head_ready(struct board_entry *e, int S) { return e->head_part != NULL; }
static int emb_ready(struct board_entry *e, int S) { return e->emb_part != NULL; }
static int all_posted(struct board_entry *e, int S) { return e->posted == S; }

static float *copy_part(struct pipeline *p, const float *src)
{
	const struct backend *be = p->tr->be;
	float *dst = be->alloc(p->tied_n * sizeof(float));
	be->copy(dst, src, p->tied_n * sizeof(float));
	return dst;
}

/* OPTIM_STEP: post this stage's gradient sums (and tied parts). */
static void post_step(struct stage_ctx *c, long gstep)
{
	struct pipeline *p = c->p;
	struct trainer *tr = p->tr;
	struct stage_worker *w = &tr->w[c->s];
	struct board *b = &p->board;
	struct board_entry *e = entry(p, gstep);
	float *g = worker_grads(w, gstep);
	int tied = tr->m->cfg.tied && tr->S > 1 && w->wte_param >= 0;
	float *g_wte = tied ? g + w->st.params[w->wte_param].offset : NULL;
	double t0 = now_sec();
	if (tr->S == 1) {
		stage_finish_grads(&w->st, g);
	} else if (tied) {
		float *part = copy_part(p, g_wte);
		pthread_mutex_lock(&b->mu);
		if (c->s == 0)
			e->emb_part = part;
		else
			e->head_part = part;
		pthread_cond_broadcast(&b->cv);
		pthread_mutex_unlock(&b->mu);
		if (c->s == 0) {
			/* stage 0's norm needs the summed gradient now */
			c->busy += now_sec() - t0;
			wait_board(c, head_ready, e);
			t0 = now_sec();
			tr->be->add(g_wte, g_wte, e->head_part, p->tied_n);
		}
	}
	optim_grad_sumsq(&w->opt, g, e->sumsq[c->s]);
	pthread_mutex_lock(&b->mu);
	e->posted++;
	pthread_cond_broadcast(&b->cv);
	pthread_mutex_unlock(&b->mu);
	c->posted = gstep;
	c->busy += now_sec() - t0;
}

/* Apply the update of step gstep on this stage once every stage posted. */
static void complete_step(struct stage_ctx *c, long gstep)
{
	struct pipeline *p = c->p;
	struct trainer *tr = p->tr;
	struct stage_worker *w = &tr->w[c->s];
	struct board *b = &p->board;
	struct board_entry *e = entry(p, gstep);
	wait_board(c, all_posted, e);
	double t0 = now_sec();
	int tied = tr->m->cfg.tied && tr->S > 1 && w->wte_param >= 0;
	if (tied && c->s == tr->S - 1) {
		float *g_wte = worker_grads(w, gstep) + w->st.params[w->wte_param].offset;
		tr->be->add(g_wte, e->emb_part, g_wte, p->tied_n);
	}
	double total = 0.0;
	for (int s = 0; s < tr->S; s++)
		for (int k = 0; k < tr->w[s].opt.n; k++)
			total += e->sumsq[s][k];
	double norm = sqrt(total);
	float clip = 1.0f;
	double max_norm = tr->cfg->train_grad_clip;
	if (max_norm > 0 && norm > max_norm)
		clip = (float)(max_norm / (norm + 1e-6));
	double lr = lr_at(tr->cfg, gstep);
	worker_update(w, gstep, (float)lr, clip);
	c->completed = gstep;
	c->busy += now_sec() - t0;
	pthread_mutex_lock(&b->mu);
	e->norm = norm;
	e->lr = lr;
	if (++e->consumed == tr->S) {
		if (e->emb_part)
			tr->be->free(e->emb_part);
		if (e->head_part)
			tr->be->free(e->head_part);
		e->emb_part = e->head_part = NULL;
	}
	pthread_mutex_unlock(&b->mu);
}

/* Complete pending updates until this stage's newest version is >= v. */
static void need_version(struct stage_ctx *c, long v)
{
	while (c->completed < v && c->completed < c->posted)
		complete_step(c, c->completed + 1);
	if (c->p->tr->w[c->s].newest < v && v > 0)
		die("internal error: stage %d needs version %ld but only %ld steps were posted",
		    c->s, v, c->posted);
}

static void *stage_main(void *arg)
{
	struct stage_ctx *c = arg;
	struct pipeline *p = c->p;
	struct trainer *tr = p->tr;
	const struct backend *be = tr->be;
	struct stage_worker *w = &tr->w[c->s];
	int s = c->s, S = tr->S, last = s == S - 1;
	size_t bt = (size_t)tr->B * (size_t)tr->T;
	int32_t *host_in = xmalloc(bt * sizeof(int32_t)), *host_tg = xmalloc(bt * sizeof(int32_t));
	int32_t *dev_in = be->alloc(bt * sizeof(int32_t)), *dev_tg = be->alloc(bt * sizeof(int32_t));
	float *x_in = NULL, *x_out = NULL, *dx_out = NULL, *dx_in = NULL;
	float dloss = 1.0f / (float)p->mb_per_step;
	c->completed = c->posted = p->first_step;
	int n;
	const struct sched_action *a = sched_actions(p->sc, s, &n);
	for (int i = 0; i < n; i++) {
		double waited = 0.0, t0;
		long gv = p->first_step + a[i].version;
		long data_index = p->first_step * p->mb_per_step + a[i].mb;
		switch (a[i].op) {
		case SCHED_RECV_ACT:
			x_in = p->tp->recv(p->tp, s, s - 1, MSG_ACT, a[i].mb, &waited);
			c->idle += waited;
			break;
		case SCHED_RECV_GRAD:
			dx_out = p->tp->recv(p->tp, s, s + 1, MSG_GRAD, a[i].mb, &waited);
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
			x_out = last ? NULL : p->tp->buffer(p->tp, s, p->act_n);
			float loss = 0.0f;
			long gstep = global_step(p, a[i].step);
			stage_forward(&w->st, a[i].slot, worker_weights(w, gv), s == 0 ? dev_in : NULL,
				      s == 0 ? NULL : x_in, last ? dev_tg : NULL, x_out,
				      last ? &loss : NULL, last ? worker_grads(w, gstep) : NULL, dloss);
			if (x_in)
				p->tp->release(p->tp, s, x_in);
			x_in = NULL;
			if (last)
				p->losses[a[i].mb] = loss;
			c->busy += now_sec() - t0;
			break;
		}
		case SCHED_SEND_ACT:
			p->tp->send(p->tp, s, s + 1, MSG_ACT, a[i].mb, x_out);
			x_out = NULL;
			break;
		case SCHED_BACKWARD: {
			long gstep = global_step(p, a[i].step);
			/* the gradient buffer of gstep held step gstep-2 */
			while (c->completed < gstep - 2)
				complete_step(c, c->completed + 1);
			t0 = now_sec();
			dx_in = s == 0 ? NULL : p->tp->buffer(p->tp, s, p->act_n);
			stage_backward(&w->st, a[i].slot, worker_weights(w, gv), worker_grads(w, gstep),
				       dx_out, dx_in);
			if (dx_out)
				p->tp->release(p->tp, s, dx_out);
			dx_out = NULL;
			c->busy += now_sec() - t0;
			break;
		}
		case SCHED_SEND_GRAD:
			p->tp->send(p->tp, s, s - 1, MSG_GRAD, a[i].mb, dx_in);
			dx_in = NULL;
			break;
		case SCHED_OPTIM_STEP: {
			long gstep = global_step(p, a[i].step);
			/* updates are applied in order: finish older ones first */
			while (c->completed < gstep - 1 && c->completed < c->posted)
				complete_step(c, c->completed + 1);
			post_step(c, gstep);
			break;
		}
		default:
			break;
		}
	}
	while (c->completed < c->posted)
		complete_step(c, c->completed + 1);
	be->free(dev_in);
	be->free(dev_tg);
	free(host_in);
	free(host_tg);
	return NULL;
}

int pipeline_run(struct trainer *tr, int n, struct step_stats *stats)
{
	struct pipeline p = {.tr = tr, .first_step = tr->step};
	char err[256];
	int is_pd = tr->kind == SCHED_PIPEDREAM;
	p.mb_per_step = is_pd ? 1 : tr->M;
	p.sc = sched_build_at(tr->kind, tr->S, tr->M, n, tr->step, err, sizeof(err));
	if (!p.sc)
		return error("%s", err);
	for (int s = 0; s < tr->S; s++) {
		const struct sched_stage *ss = sched_stage(p.sc, s);
		if (ss->nslots > tr->w[s].st.n_slots || ss->nversions > tr->w[s].n_versions)
			die("internal error: stage %d needs %d slots and %d versions, has %d and %d",
			    s, ss->nslots, ss->nversions, tr->w[s].st.n_slots, tr->w[s].n_versions);
	}
	p.act_n = (size_t)tr->B * (size_t)tr->T * (size_t)tr->m->cfg.C;
	p.tied_n = (size_t)tr->m->cfg.Vp * (size_t)tr->m->cfg.C;
	p.tp = transport_local(tr->be, tr->S, p.act_n);
	p.losses = xcalloc((size_t)p.sc->n_mb, sizeof(float));
	pthread_mutex_init(&p.board.mu, NULL);
	pthread_cond_init(&p.board.cv, NULL);
	p.board.n_steps = n;
	p.board.e = xcalloc((size_t)n, sizeof(*p.board.e));
	for (int i = 0; i < n; i++) {
		p.board.e[i].sumsq = xcalloc((size_t)tr->S, sizeof(double *));
		for (int s = 0; s < tr->S; s++)
			p.board.e[i].sumsq[s] = xcalloc((size_t)tr->w[s].opt.n + 1, sizeof(double));
	}
	struct stage_ctx *ctx = xcalloc((size_t)tr->S, sizeof(*ctx));
	pthread_t *th = xcalloc((size_t)tr->S, sizeof(*th));
	for (int s = 0; s < tr->S; s++) {
		ctx[s] = (struct stage_ctx){.p = &p, .s = s};
		if (pthread_create(&th[s], NULL, stage_main, &ctx[s]))
			die("cannot start stage thread %d", s);
	}
	for (int s = 0; s < tr->S; s++) {
		pthread_join(th[s], NULL);
		tr->w[s].busy_s += ctx[s].busy;
		tr->w[s].idle_s += ctx[s].idle;
	}
	int rc = 0;
	for (int i = 0; i < n; i++) {
		struct step_stats st = {0};
		double sum = 0.0;
		for (int mb = 0; mb < p.mb_per_step; mb++)
			sum += p.losses[i * p.mb_per_step + mb];
		st.loss = sum / p.mb_per_step;
		st.grad_norm = p.board.e[i].norm;
		st.lr = p.board.e[i].lr;
		st.nonfinite = !isfinite(st.loss);
		if (stats)
			stats[i] = st;
		tr->last = st;
		if (st.nonfinite && !rc) {
			rc = -1;
			tr->step = p.first_step + i; /* the step that failed */
		}
	}
	if (!rc)
		tr->step = p.first_step + n;
	for (int i = 0; i < n; i++) {
		for (int s = 0; s < tr->S; s++)
			free(p.board.e[i].sumsq[s]);
		free(p.board.e[i].sumsq);
	}
	free(p.board.e);
	free(ctx);
	free(th);
	free(p.losses);
	p.tp->destroy(p.tp);
	sched_free(p.sc);
	pthread_mutex_destroy(&p.board.mu);
	pthread_cond_destroy(&p.board.cv);
	return rc;
}
