/* simulate.c - run a schedule's action lists against an event clock: when
 * each action starts and ends, per-stage busy and idle time, the bubble.
 *
 * Model: one worker per stage runs its list in order. FORWARD, BACKWARD,
 * BACKWARD_INPUT, BACKWARD_WEIGHT and OPTIM_STEP take their time (a chunk's
 * a V-th of the stage's; B and W split the backward's by wfrac); a SEND
 * takes none on the sender and its
 * message arrives comm later; a RECV waits for its message; an OPTIM_STEP
 * also waits for the replicas' sum the step's last backward started
 * (sim_reduce_end; what the executor does, for every kind). The lists are
 * swept stage by stage, each running until it blocks on a receive, until no
 * stage moves; a stage left unfinished means deadlock.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/util.h"
#include "schedule.h"

double sim_wfrac(const struct sim_times *t)
{
	return t->wfrac > 0 && t->wfrac < 1 ? t->wfrac : 0.5;
}

/* An op's time on a stage with V chunks (a chunk holds a V-th of the
 * stage's layers, so a V-th of its time). */
static double op_time(const struct sim_times *t, enum sched_op op, int V)
{
	switch (op) {
	case SCHED_FORWARD:
		return t->fwd / V;
	case SCHED_BACKWARD:
		return t->bwd / V;
	case SCHED_BACKWARD_INPUT:
		return t->bwd * (1 - sim_wfrac(t)) / V;
	case SCHED_BACKWARD_WEIGHT:
		return t->bwd * sim_wfrac(t) / V;
	case SCHED_OPTIM_STEP:
		return t->optim;
	default:
		return 0;
	}
}

/* The replicas' sum of a step's last gradient op of duration d started at
 * start (see struct sim_times). */
static double reduce_end(const struct sim_times *t, double start, double d)
{
	if (!(t->reduce > 0))
		return start + d;
	/* bucket i (of n, equal) is ready at (i+1) d/n and the buckets go
	 * one after another: the last ends at the latest of d/n + reduce
	 * (transfers back to back from the first) and d + reduce/n (the
	 * last bucket after the backward) */
	double n = t->buckets > 1 ? t->buckets : 1;
	return start + MAX(d / n + t->reduce, d + t->reduce / n);
}

double sim_reduce_end(const struct sim_times *t, double bwd_start)
{
	return reduce_end(t, bwd_start, t->bwd);
}

static int is_compute(enum sched_op op)
{
	return op == SCHED_FORWARD || op == SCHED_BACKWARD || op == SCHED_OPTIM_STEP ||
	       op == SCHED_BACKWARD_INPUT || op == SCHED_BACKWARD_WEIGHT;
}

/* Makes a weight gradient (the fused backward or W). */
static int is_grad(enum sched_op op)
{
	return op == SCHED_BACKWARD || op == SCHED_BACKWARD_WEIGHT;
}

/* last[s][i]: action i of stage s is its step's last weight gradient op
 * there (the one that starts the replicas' sum). */
static char **last_grad_ops(const struct schedule *sc)
{
	char **last = xcalloc((size_t)sc->S, sizeof(char *));
	for (int s = 0; s < sc->S; s++) {
		const struct sched_stage *st = &sc->stage[s];
		last[s] = xcalloc((size_t)st->n + 1, 1);
		int next_step = -1; /* the step of the next gradient op; -1: none */
		for (int i = st->n - 1; i >= 0; i--) {
			if (!is_grad(st->a[i].op))
				continue;
			last[s][i] = st->a[i].step != next_step;
			next_step = st->a[i].step;
		}
	}
	return last;
}

int sched_run(const struct schedule *sc, const struct sim_times *per_stage,
	      double **start, double **end, char *why, size_t len)
{
	static const struct sim_times unit = {.fwd = 1, .bwd = 2};
	char dummy[1];
	if (!why || !len)
		why = dummy, len = sizeof(dummy);
	int S = sc->S, nmb = sc->n_mb, V = sc->V > 0 ? sc->V : 1, P = S * V;
	size_t cells = st_mult((size_t)P, (size_t)nmb);
	/* act[p*nmb + mb]: arrival at piece p of mb's input activation;
	 * grad[...] of its output gradient; negative until sent. */
	double *act = xmalloc(st_mult(cells, sizeof(double)));
	double *grad = xmalloc(st_mult(cells, sizeof(double)));
	for (size_t i = 0; i < cells; i++)
		act[i] = grad[i] = -1;
	int *pc = xcalloc((size_t)S, sizeof(int));
	double *clock = xcalloc((size_t)S, sizeof(double));
	double *reduced = xcalloc((size_t)S, sizeof(double)); /* the replicas' sum ends */
	char **last = last_grad_ops(sc);
	int ret = 0, progress;
	do {
		progress = 0;
		for (int s = 0; s < S && !ret; s++) {
			const struct sched_stage *st = &sc->stage[s];
			const struct sim_times *t = per_stage ? &per_stage[s] : &unit;
			for (; pc[s] < st->n; pc[s]++, progress++) {
				const struct sched_action *a = &st->a[pc[s]];
				double t0 = clock[s];
				int mb = a->mb, p = -1, q = -1; /* q: the message's piece */
				double *box = NULL;
				if (a->op == SCHED_SEND_ACT || a->op == SCHED_RECV_ACT ||
				    a->op == SCHED_SEND_GRAD || a->op == SCHED_RECV_GRAD) {
					if (mb < 0 || mb >= nmb || a->chunk < 0 || a->chunk >= V) {
						snprintf(why, len, "stage %d action %d: %s of "
							 "micro-batch %d chunk %d out of "
							 "range", s, pc[s],
							 sched_op_name(a->op), mb, a->chunk);
						ret = -1;
						break;
					}
					/* the neighbour piece it goes to or comes from */
					p = sched_piece(sc, s, a->chunk);
					int n = a->op == SCHED_SEND_ACT || a->op == SCHED_RECV_GRAD ?
							p + 1 : p - 1;
					int to = sched_piece_stage(sc, n);
					if (a->peer != to || to < 0 || to == s) {
						snprintf(why, len, "stage %d action %d: %s with peer "
							 "%d (expected %d)", s, pc[s],
							 sched_op_name(a->op), a->peer, to);
						ret = -1;
						break;
					}
					q = a->op == SCHED_SEND_ACT || a->op == SCHED_SEND_GRAD ? n : p;
				}
				switch (a->op) {
				case SCHED_SEND_ACT:
				case SCHED_SEND_GRAD:
					box = a->op == SCHED_SEND_ACT ? act : grad;
					box[(size_t)q * nmb + mb] = clock[s] + t->comm;
					break;
				case SCHED_RECV_ACT:
				case SCHED_RECV_GRAD:
					box = a->op == SCHED_RECV_ACT ? act : grad;
					if (box[(size_t)q * nmb + mb] < 0)
						goto blocked;
					t0 = MAX(t0, box[(size_t)q * nmb + mb]);
					break;
				case SCHED_OPTIM_STEP:
					t0 = MAX(t0, reduced[s]);
					break;
				default:
					break;
				}
				/* the step's last weight gradient starts the replicas' sum */
				double d = op_time(t, a->op, V);
				if (last[s][pc[s]])
					reduced[s] = reduce_end(t, t0, d);
				if (start)
					start[s][pc[s]] = t0;
				clock[s] = t0 + d;
				if (end)
					end[s][pc[s]] = clock[s];
			}
blocked:;
		}
	} while (progress && !ret);
	if (!ret) {
		size_t off = 0;
		for (int s = 0; s < S; s++) {
			if (pc[s] >= sc->stage[s].n)
				continue;
			const struct sched_action *a = &sc->stage[s].a[pc[s]];
			if (!ret)
				off += snprintf(why, len, "deadlock:");
			ret = -1;
			if (off < len)
				off += snprintf(why + off, len - off, " stage %d waits at action %d "
						"(%s of micro-batch %d from stage %d);", s, pc[s],
						sched_op_name(a->op), a->mb, a->peer);
		}
	}
	free(act);
	free(grad);
	free(pc);
	free(clock);
	free(reduced);
	for (int s = 0; s < S; s++)
		free(last[s]);
	free(last);
	return ret;
}

void sim_result_free(struct sim_result *r)
{
	if (!r)
		return;
	for (int s = 0; r->start && s < r->S; s++) {
		free(r->start[s]);
		free(r->end[s]);
	}
	free(r->start);
	free(r->end);
	free(r->busy);
	free(r->idle);
	free(r->stage_bubble);
	memset(r, 0, sizeof(*r));
}

/* Steady window for the asynchronous kinds: "steps" of M micro-batches
 * [lo, hi) leaving at least a quarter of the segment, and the pipeline's
 * fill and drain, on either side. The window runs from the last stage's
 * start of step lo's first forward to its start of step hi's first forward:
 * the same event hi-lo steps apart, so it spans whole periods whatever the
 * kind puts between (a split kind's W's wait). */
static void steady_window(const struct schedule *sc, struct sim_result *r)
{
	int S = sc->S, M = sc->M;
	int groups = sc->n_mb / M;
	int lo = MAX(groups / 4, (S + M - 1) / M), hi = groups - lo;
	r->steady_bubble = -1;
	r->steady_lo = r->steady_hi = 0;
	r->steady_t0 = r->steady_t1 = 0;
	if (hi <= lo)
		return;
	int first = lo * M, next = hi * M; /* next < n_mb: lo >= 1 */
	double t0 = 0, t1 = 0;
	for (int s = 0; s < S; s++) {
		const struct sched_stage *st = &sc->stage[s];
		for (int i = 0; i < st->n; i++) {
			const struct sched_action *a = &st->a[i];
			if (a->op == SCHED_FORWARD && a->mb == first)
				t0 = MAX(t0, r->start[s][i]);
			if (a->op == SCHED_FORWARD && a->mb == next)
				t1 = MAX(t1, r->start[s][i]);
		}
	}
	if (!(t1 > t0))
		return;
	double idle = 0;
	for (int s = 0; s < S; s++) {
		const struct sched_stage *st = &sc->stage[s];
		double busy = 0;
		for (int i = 0; i < st->n; i++) {
			if (!is_compute(st->a[i].op))
				continue;
			double a = MAX(r->start[s][i], t0), b = MIN(r->end[s][i], t1);
			if (b > a)
				busy += b - a;
		}
		idle += (t1 - t0) - busy;
	}
	r->steady_lo = lo;
	r->steady_hi = hi;
	r->steady_t0 = t0;
	r->steady_t1 = t1;
	r->steady_bubble = idle / (S * (t1 - t0));
}

int sched_simulate_stages(const struct schedule *sc, const struct sim_times *per_stage,
			  struct sim_result *r)
{
	int S = sc->S;
	memset(r, 0, sizeof(*r));
	r->S = S;
	r->start = xcalloc((size_t)S, sizeof(double *));
	r->end = xcalloc((size_t)S, sizeof(double *));
	for (int s = 0; s < S; s++) {
		r->start[s] = xmalloc(st_mult((size_t)sc->stage[s].n + 1, sizeof(double)));
		r->end[s] = xmalloc(st_mult((size_t)sc->stage[s].n + 1, sizeof(double)));
	}
	r->busy = xcalloc((size_t)S, sizeof(double));
	r->idle = xcalloc((size_t)S, sizeof(double));
	r->stage_bubble = xcalloc((size_t)S, sizeof(double));
	for (int s = 0; s < S; s++) {
		const struct sim_times *t = &per_stage[s];
		if (!(t->fwd >= 0 && t->bwd >= 0 && t->comm >= 0 && t->optim >= 0 &&
		      t->reduce >= 0 && t->buckets >= 0 && t->wfrac >= 0 && t->wfrac < 1) ||
		    !isfinite(t->fwd + t->bwd + t->comm + t->optim + t->reduce)) {
			sim_result_free(r);
			return error("simulate: stage %d: times must be finite and >= 0", s);
		}
	}
	char why[512];
	if (sched_run(sc, per_stage, r->start, r->end, why, sizeof(why)) < 0) {
		sim_result_free(r);
		return error("simulate: %s schedule, %d stages: %s", sched_kind_name(sc->kind),
			     S, why);
	}
	double makespan = 0;
	for (int s = 0; s < S; s++) {
		const struct sched_stage *st = &sc->stage[s];
		for (int i = 0; i < st->n; i++) {
			if (is_compute(st->a[i].op))
				r->busy[s] += r->end[s][i] - r->start[s][i];
			makespan = MAX(makespan, r->end[s][i]);
		}
	}
	r->makespan = makespan;
	double idle = 0;
	for (int s = 0; s < S; s++) {
		r->idle[s] = makespan - r->busy[s];
		r->stage_bubble[s] = makespan > 0 ? r->idle[s] / makespan : 0;
		idle += r->idle[s];
	}
	r->bubble = makespan > 0 ? idle / (S * makespan) : 0;
	if (sched_kind_async(sc->kind)) {
		steady_window(sc, r);
	} else {
		r->steady_bubble = r->bubble;
		r->steady_lo = 0;
		r->steady_hi = sc->n_steps;
		r->steady_t0 = 0;
		r->steady_t1 = makespan;
	}
	return 0;
}

int sched_simulate(const struct schedule *sc, const struct sim_times *t, struct sim_result *r)
{
	struct sim_times *per = xmalloc(st_mult((size_t)sc->S, sizeof(*per)));
	for (int s = 0; s < sc->S; s++)
		per[s] = *t;
	int ret = sched_simulate_stages(sc, per, r);
	free(per);
	return ret;
}
