/* schedule.c - build the four pipeline schedules as per-stage action lists,
 * compute what executing them needs, and check their invariants.
 */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/util.h"
#include "schedule.h"

static const char *const kind_names[SCHED_NKINDS] = {
	[SCHED_GPIPE] = "gpipe",
	[SCHED_1F1B] = "1f1b",
	[SCHED_2BW] = "2bw",
	[SCHED_PIPEDREAM] = "pipedream",
};

static const char *const op_names[SCHED_NOPS] = {
	[SCHED_FORWARD] = "FORWARD",
	[SCHED_BACKWARD] = "BACKWARD",
	[SCHED_SEND_ACT] = "SEND_ACT",
	[SCHED_RECV_ACT] = "RECV_ACT",
	[SCHED_SEND_GRAD] = "SEND_GRAD",
	[SCHED_RECV_GRAD] = "RECV_GRAD",
	[SCHED_OPTIM_STEP] = "OPTIM_STEP",
};

int sched_kind_from_name(const char *name)
{
	if (!name)
		return -1;
	for (int k = 0; k < SCHED_NKINDS; k++)
		if (!strcmp(name, kind_names[k]))
			return k;
	if (!strcmp(name, "pipedream-flush"))
		return SCHED_1F1B;
	if (!strcmp(name, "pipedream-2bw"))
		return SCHED_2BW;
	return -1;
}

const char *sched_kind_name(enum sched_kind kind)
{
	return (unsigned)kind < SCHED_NKINDS ? kind_names[kind] : "?";
}

const char *sched_op_name(enum sched_op op)
{
	return (unsigned)op < SCHED_NOPS ? op_names[op] : "?";
}

int sched_kind_async(enum sched_kind kind)
{
	return kind == SCHED_2BW || kind == SCHED_PIPEDREAM;
}

double sched_bubble_formula(int S, int M)
{
	return (double)(S - 1) / (double)(M + S - 1);
}

int sched_mb_step(const struct schedule *sc, int mb)
{
	return sc->kind == SCHED_PIPEDREAM ? mb : mb / sc->M;
}

/* Versions are counted from the segment's start; the formulas hold for
 * global steps, hence the first_step shifts. */
int sched_mb_version(const struct schedule *sc, int s, int mb)
{
	long g0 = sc->first_step;
	switch (sc->kind) {
	case SCHED_2BW: {
		long t = g0 + mb / sc->M;
		return (int)((t > 0 ? t - 1 : 0) - g0);
	}
	case SCHED_PIPEDREAM: {
		long j = g0 + mb - (sc->S - 1 - s);
		return (int)((j > 0 ? j : 0) - g0);
	}
	default:
		return mb / sc->M;
	}
}

const struct sched_action *sched_actions(const struct schedule *sc, int s, int *n)
{
	if (!sc || s < 0 || s >= sc->S) {
		if (n)
			*n = 0;
		return NULL;
	}
	if (n)
		*n = sc->stage[s].n;
	return sc->stage[s].a;
}

const struct sched_stage *sched_stage(const struct schedule *sc, int s)
{
	return sc && s >= 0 && s < sc->S ? &sc->stage[s] : NULL;
}

/* ---- building ---- */

struct builder {
	const struct schedule *sc;
	struct sched_stage *st;
	int s, cap;
	int *slot_of;   /* [n_mb] slot held by each micro-batch */
	char *used;     /* [n_mb] slot in use */
	int next_step;  /* next OPTIM_STEP to emit (async kinds) */
};

static void push(struct builder *b, enum sched_op op, int mb, int step, int version,
		 int peer, int slot)
{
	struct sched_stage *st = b->st;
	if (st->n == b->cap) {
		b->cap = b->cap ? 2 * b->cap : 64;
		st->a = xrealloc(st->a, st_mult((size_t)b->cap, sizeof(*st->a)));
	}
	st->a[st->n++] = (struct sched_action){op, mb, step, version, peer, slot};
}

static void emit_optim(struct builder *b, int step)
{
	push(b, SCHED_OPTIM_STEP, -1, step, step + 1, -1, -1);
}

static void emit_fwd(struct builder *b, int mb)
{
	const struct schedule *sc = b->sc;
	int s = b->s, step = sched_mb_step(sc, mb), v = sched_mb_version(sc, s, mb);
	int slot = 0;
	while (b->used[slot])
		slot++;
	b->used[slot] = 1;
	b->slot_of[mb] = slot;
	if (s > 0)
		push(b, SCHED_RECV_ACT, mb, step, v, s - 1, -1);
	push(b, SCHED_FORWARD, mb, step, v, -1, slot);
	if (s < sc->S - 1)
		push(b, SCHED_SEND_ACT, mb, step, v, s + 1, -1);
}

static void emit_bwd(struct builder *b, int mb)
{
	const struct schedule *sc = b->sc;
	int s = b->s, step = sched_mb_step(sc, mb), v = sched_mb_version(sc, s, mb);
	int slot = b->slot_of[mb];
	b->used[slot] = 0;
	if (s < sc->S - 1)
		push(b, SCHED_RECV_GRAD, mb, step, v, s + 1, -1);
	push(b, SCHED_BACKWARD, mb, step, v, -1, slot);
	if (s > 0)
		push(b, SCHED_SEND_GRAD, mb, step, v, s - 1, -1);
	/* Asynchronous kinds step right after a step's last backward. */
	if (sc->kind == SCHED_PIPEDREAM ||
	    (sc->kind == SCHED_2BW && (mb + 1) % sc->M == 0))
		emit_optim(b, b->next_step++);
}

/* Micro-batches [lo, hi) in 1F1B order on stage s: min(S-1-s, hi-lo)
 * warm-up forwards, then forward/backward pairs, then the rest backwards. */
static void emit_1f1b(struct builder *b, int lo, int hi)
{
	int n = hi - lo, w = MIN(b->sc->S - 1 - b->s, n);
	for (int i = 0; i < w; i++)
		emit_fwd(b, lo + i);
	for (int i = 0; i < n - w; i++) {
		emit_fwd(b, lo + w + i);
		emit_bwd(b, lo + i);
	}
	for (int i = n - w; i < n; i++)
		emit_bwd(b, lo + i);
}

static void build_stage(struct builder *b)
{
	const struct schedule *sc = b->sc;
	int M = sc->M;
	switch (sc->kind) {
	case SCHED_GPIPE:
		for (int t = 0; t < sc->n_steps; t++) {
			for (int i = 0; i < M; i++)
				emit_fwd(b, t * M + i);
			for (int i = 0; i < M; i++)
				emit_bwd(b, t * M + i);
			emit_optim(b, t);
		}
		break;
	case SCHED_1F1B:
		for (int t = 0; t < sc->n_steps; t++) {
			emit_1f1b(b, t * M, (t + 1) * M);
			emit_optim(b, t);
		}
		break;
	case SCHED_2BW:
	case SCHED_PIPEDREAM:
		emit_1f1b(b, 0, sc->n_mb);
		break;
	default:
		break;
	}
}

/* Peak in-flight micro-batches, versions alive, updates and their delays,
 * all read back from the actions. */
static void compute_stats(const struct schedule *sc, struct sched_stage *st)
{
	int n = st->n, nupd = 0, vmin = 0, inflight = 0, peak = 0;
	for (int i = 0; i < n; i++) {
		const struct sched_action *a = &st->a[i];
		if (a->op == SCHED_FORWARD) {
			inflight++;
			peak = MAX(peak, inflight);
			vmin = MIN(vmin, a->version);
		} else if (a->op == SCHED_BACKWARD) {
			inflight--;
		} else if (a->op == SCHED_OPTIM_STEP) {
			nupd++;
		}
	}
	st->nslots = peak;
	st->nupdates = nupd;

	/* Version v (vmin <= v <= nupd) lives from its creation (position of
	 * the OPTIM_STEP making it; 0 for v <= 0) to its last use, and at least
	 * until the update that makes v+1 (which, when nothing else needs v,
	 * happens in place: v ends just before it). */
	int nv = nupd - vmin + 1;
	int *created = xmalloc(st_mult((size_t)nv, sizeof(int)));
	int *last_use = xmalloc(st_mult((size_t)nv, sizeof(int)));
	for (int v = 0; v < nv; v++)
		created[v] = 0, last_use[v] = -1;
	for (int i = 0; i < n; i++) {
		const struct sched_action *a = &st->a[i];
		if (a->op == SCHED_OPTIM_STEP && a->version - vmin < nv && a->version > vmin)
			created[a->version - vmin] = i;
		else if ((a->op == SCHED_FORWARD || a->op == SCHED_BACKWARD) &&
			 a->version - vmin < nv)
			last_use[a->version - vmin] = i;
	}
	int *diff = xcalloc((size_t)n + 2, sizeof(int));
	for (int k = 0; k < nv; k++) {
		int v = k + vmin, end = last_use[k];
		if (v >= 0)
			end = MAX(end, v < nupd ? created[k + 1] - 1 : n - 1);
		if (end < created[k])
			continue;
		diff[created[k]]++;
		diff[end + 1]--;
	}
	int alive = 0, peakv = 0;
	for (int i = 0; i <= n; i++) {
		alive += diff[i];
		peakv = MAX(peakv, alive);
	}
	st->nversions = MAX(peakv, 1);
	free(diff);
	free(created);
	free(last_use);

	/* Delay: an update making version u applies gradients of the
	 * backwards since the previous update; delay = (u - 1) - their version. */
	st->delay_min = -1;
	st->delay_max = -1;
	int gv = INT_MIN;
	for (int i = 0; i < n; i++) {
		const struct sched_action *a = &st->a[i];
		if (a->op == SCHED_BACKWARD) {
			gv = MAX(gv, a->version);
		} else if (a->op == SCHED_OPTIM_STEP && gv != INT_MIN) {
			int d = a->version - 1 - gv;
			if (st->delay_min < 0 || d < st->delay_min)
				st->delay_min = d;
			st->delay_max = MAX(st->delay_max, d);
			gv = INT_MIN;
		}
	}
}

struct schedule *sched_build_at(enum sched_kind kind, int S, int M, int n_steps,
				long first_step, char *err, size_t errlen)
{
	char dummy[1];
	if (!err || !errlen)
		err = dummy, errlen = sizeof(dummy);
	if ((unsigned)kind >= SCHED_NKINDS) {
		snprintf(err, errlen, "unknown schedule kind %d", (int)kind);
		return NULL;
	}
	const char *name = kind_names[kind];
	if (S < 1 || M < 1 || n_steps < 1) {
		snprintf(err, errlen, "%s schedule needs stages, micro-batches and steps >= 1 "
			 "(got %d, %d, %d)", name, S, M, n_steps);
		return NULL;
	}
	if (first_step < 0 || first_step > INT_MAX / 2) {
		snprintf(err, errlen, "%s schedule: first step %ld out of range", name, first_step);
		return NULL;
	}
	if (kind == SCHED_2BW && M < S) {
		snprintf(err, errlen, "2bw schedule needs micro-batches >= stages (got %d < %d)",
			 M, S);
		return NULL;
	}
	long n_mb = kind == SCHED_PIPEDREAM ? n_steps : (long)n_steps * M;
	if (n_mb > INT_MAX / 8 || n_mb * S > SCHED_MAX_CELLS) {
		snprintf(err, errlen, "%s schedule too large: %ld micro-batches x %d stages "
			 "(at most %ld)", name, n_mb, S, (long)SCHED_MAX_CELLS);
		return NULL;
	}
	struct schedule *sc = xcalloc(1, sizeof(*sc));
	sc->kind = kind;
	sc->S = S;
	sc->M = M;
	sc->n_steps = n_steps;
	sc->first_step = first_step;
	sc->n_mb = (int)n_mb;
	sc->stage = xcalloc((size_t)S, sizeof(*sc->stage));
	struct builder b = {.sc = sc};
	b.slot_of = xmalloc(st_mult((size_t)n_mb, sizeof(int)));
	b.used = xcalloc((size_t)n_mb, 1);
	for (int s = 0; s < S; s++) {
		b.st = &sc->stage[s];
		b.s = s;
		b.cap = 0;
		b.next_step = 0;
		memset(b.used, 0, (size_t)n_mb);
		build_stage(&b);
		compute_stats(sc, b.st);
	}
	free(b.slot_of);
	free(b.used);
	return sc;
}

struct schedule *sched_build(enum sched_kind kind, int S, int M, int n_steps,
			     char *err, size_t errlen)
{
	return sched_build_at(kind, S, M, n_steps, 0, err, errlen);
}

void sched_free(struct schedule *sc)
{
	if (!sc)
		return;
	for (int s = 0; s < sc->S; s++)
		free(sc->stage[s].a);
	free(sc->stage);
	free(sc);
}
