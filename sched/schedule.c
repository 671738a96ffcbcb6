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
	st->a[st->n++] = (struct sched_action){op, mb, step, version, peer, slot, -1};
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

/* Lifetimes of the weight versions on one stage. Version v (vmin <= v <=
 * nupd) lives from its creation (the OPTIM_STEP making it; position 0 for
 * v <= 0) to its last use by a FORWARD or BACKWARD, and for v >= 0 at least
 * until the update that makes v+1. When nothing else needs v then, that
 * update happens in place: v ends just before it. born[k], dies[k] for
 * v = vmin + k; dies < born when the version is never alive. */
struct lifetimes {
	int vmin, nv;
	int *born, *dies;
};

static void lifetimes(const struct sched_stage *st, struct lifetimes *lt)
{
	int n = st->n, nupd = 0, vmin = 0;
	for (int i = 0; i < n; i++) {
		const struct sched_action *a = &st->a[i];
		if (a->op == SCHED_FORWARD || a->op == SCHED_BACKWARD)
			vmin = MIN(vmin, a->version);
		else if (a->op == SCHED_OPTIM_STEP)
			nupd = MAX(nupd, a->version);
	}
	int nv = nupd - vmin + 1;
	int *born = xmalloc(st_mult((size_t)nv, sizeof(int)));
	int *last = xmalloc(st_mult((size_t)nv, sizeof(int)));
	int *made = xmalloc(st_mult((size_t)nv, sizeof(int)));
	for (int k = 0; k < nv; k++)
		born[k] = 0, last[k] = -1, made[k] = k + vmin <= 0 ? 0 : n;
	for (int i = 0; i < n; i++) {
		const struct sched_action *a = &st->a[i];
		int k = a->version - vmin;
		if (k < 0 || k >= nv)
			continue;
		if (a->op == SCHED_OPTIM_STEP && made[k] == n)
			made[k] = born[k] = i;
		else if (a->op == SCHED_FORWARD || a->op == SCHED_BACKWARD)
			last[k] = i;
	}
	for (int k = 0; k < nv; k++) {
		int v = k + vmin, end = last[k];
		if (v >= 0)
			end = MAX(end, v < nupd ? made[k + 1] - 1 : n - 1);
		last[k] = end;
	}
	free(made);
	lt->vmin = vmin;
	lt->nv = nv;
	lt->born = born;
	lt->dies = last;
}

/* Peak in-flight micro-batches, versions alive, updates and their delays,
 * all read back from the actions. */
static void compute_stats(struct sched_stage *st)
{
	int n = st->n, nupd = 0, inflight = 0, peak = 0;
	for (int i = 0; i < n; i++) {
		const struct sched_action *a = &st->a[i];
		if (a->op == SCHED_FORWARD) {
			inflight++;
			peak = MAX(peak, inflight);
		} else if (a->op == SCHED_BACKWARD) {
			inflight--;
		} else if (a->op == SCHED_OPTIM_STEP) {
			nupd++;
		}
	}
	st->nslots = peak;
	st->nupdates = nupd;

	struct lifetimes lt;
	lifetimes(st, &lt);
	int *diff = xcalloc((size_t)n + 2, sizeof(int));
	for (int k = 0; k < lt.nv; k++) {
		if (lt.dies[k] < lt.born[k])
			continue;
		diff[lt.born[k]]++;
		diff[lt.dies[k] + 1]--;
	}
	int alive = 0, peakv = 0;
	for (int i = 0; i <= n; i++) {
		alive += diff[i];
		peakv = MAX(peakv, alive);
	}
	st->nversions = MAX(peakv, 1);
	free(diff);
	free(lt.born);
	free(lt.dies);

	/* Delay: an update making version u applies the gradients of the
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

/* Give each version a weight buffer: versions in order of birth take the
 * lowest buffer whose version has died (greedy colouring of intervals, which
 * uses exactly the peak number alive). Fills vmin, vmax, vbuf and wbuf. */
static void assign_buffers(struct sched_stage *st)
{
	struct lifetimes lt;
	lifetimes(st, &lt);
	int nb = MAX(st->nversions, 1);
	int *holder = xmalloc(st_mult((size_t)nb, sizeof(int))); /* version index k */
	for (int b = 0; b < nb; b++)
		holder[b] = -1;
	st->vmin = lt.vmin;
	st->vmax = lt.vmin + lt.nv - 1;
	st->vbuf = xmalloc(st_mult((size_t)lt.nv, sizeof(int)));
	for (int k = 0; k < lt.nv; k++) {
		st->vbuf[k] = -1;
		if (lt.dies[k] < lt.born[k])
			continue;
		int b;
		for (b = 0; b < nb; b++)
			if (holder[b] < 0 || lt.dies[holder[b]] < lt.born[k])
				break;
		if (b == nb) /* cannot happen: nversions is the peak */
			bug("schedule: no weight buffer free for version %d", k + lt.vmin);
		holder[b] = k;
		st->vbuf[k] = b;
	}
	for (int i = 0; i < st->n; i++) {
		struct sched_action *a = &st->a[i];
		if (a->op == SCHED_FORWARD || a->op == SCHED_BACKWARD || a->op == SCHED_OPTIM_STEP)
			a->wbuf = st->vbuf[a->version - st->vmin];
	}
	free(holder);
	free(lt.born);
	free(lt.dies);
}

int sched_version_buffer(const struct schedule *sc, int s, int v)
{
	if (!sc || s < 0 || s >= sc->S)
		return -1;
	const struct sched_stage *st = &sc->stage[s];
	if (v < st->vmin || v > st->vmax)
		return -1;
	return st->vbuf[v - st->vmin];
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
		compute_stats(b.st);
		assign_buffers(b.st);
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
	for (int s = 0; s < sc->S; s++) {
		free(sc->stage[s].a);
		free(sc->stage[s].vbuf);
	}
	free(sc->stage);
	free(sc);
}

/* ---- invariants ---- */

/* The delay the kind promises for segment step t's update on stage s. */
static int expected_delay(const struct schedule *sc, int s, int t)
{
	long g = sc->first_step + t;
	switch (sc->kind) {
	case SCHED_2BW:
		return g > 0 ? 1 : 0;
	case SCHED_PIPEDREAM:
		return (int)MIN(g, (long)(sc->S - 1 - s));
	default:
		return 0;
	}
}

#define BAD(...)                                                \
	do {                                                    \
		snprintf(why, len, __VA_ARGS__);                \
		goto out;                                       \
	} while (0)

static int is_comm(enum sched_op op)
{
	return op == SCHED_SEND_ACT || op == SCHED_RECV_ACT || op == SCHED_SEND_GRAD ||
	       op == SCHED_RECV_GRAD;
}

static int check_stage(const struct schedule *sc, int s, int *pos, char *why, size_t len)
{
	const struct sched_stage *st = &sc->stage[s];
	int S = sc->S, N = sc->n_mb, ret = -1;
	int per_step = sc->kind == SCHED_PIPEDREAM ? 1 : sc->M;
	int n_updates = sc->kind == SCHED_PIPEDREAM ? sc->n_mb : sc->n_steps;
	int max_slots = sc->kind == SCHED_GPIPE ? sc->M : MIN(S - s, N);
	int max_versions = sc->kind == SCHED_2BW ? 2 : sc->kind == SCHED_PIPEDREAM ? S - s : 1;
	/* positions of each micro-batch's F, B, RECV_ACT, SEND_ACT, RECV_GRAD,
	 * SEND_GRAD on this stage; -1 when absent */
	int *fpos = pos, *bpos = pos + N, *ra = pos + 2 * N, *sa = pos + 3 * N;
	int *rg = pos + 4 * N, *sg = pos + 5 * N, *fslot = pos + 6 * N;
	int *occ = xmalloc(st_mult((size_t)N + 1, sizeof(int)));
	struct lifetimes lt = {0};
	for (int i = 0; i < 7 * N; i++)
		pos[i] = -1;
	for (int i = 0; i <= N; i++)
		occ[i] = -1;
	int nupd = 0, last_b = -1, grad_n = 0, grad_v = 0, grad_step = -1;
	char at[64];
	for (int i = 0; i < st->n; i++) {
		const struct sched_action *a = &st->a[i];
		int mb = a->mb;
		snprintf(at, sizeof(at), "stage %d action %d (%s)", s, i, sched_op_name(a->op));
		if ((unsigned)a->op >= SCHED_NOPS)
			BAD("stage %d action %d: unknown op %d", s, i, (int)a->op);
		if (a->op == SCHED_OPTIM_STEP) {
			if (mb != -1 || a->peer != -1 || a->slot != -1)
				BAD("%s: micro-batch, peer or slot set", at);
			if (a->step != nupd)
				BAD("%s: step %d out of order (expected %d)", at, a->step, nupd);
			if (a->version != a->step + 1)
				BAD("%s: makes version %d, expected %d", at, a->version, a->step + 1);
			if (grad_n != per_step)
				BAD("%s: step %d applies %d backwards, expected %d", at, a->step,
				    grad_n, per_step);
			if (grad_step != a->step)
				BAD("%s: step %d applies gradients of step %d", at, a->step,
				    grad_step);
			int d = a->step - grad_v, want = expected_delay(sc, s, a->step);
			if (d != want)
				BAD("%s: step %d sees delay %d, expected %d", at, a->step, d, want);
			if (sched_kind_async(sc->kind) && i > 0 &&
			    st->a[i - 1].op != SCHED_BACKWARD &&
			    !(st->a[i - 1].op == SCHED_SEND_GRAD && i > 1 &&
			      st->a[i - 2].op == SCHED_BACKWARD))
				BAD("%s: not right after the step's last backward", at);
			nupd++;
			grad_n = 0;
			grad_step = -1;
			continue;
		}
		if (mb < 0 || mb >= N)
			BAD("%s: micro-batch %d out of range [0, %d)", at, mb, N);
		if (a->step != sched_mb_step(sc, mb))
			BAD("%s: micro-batch %d has step %d, expected %d", at, mb, a->step,
			    sched_mb_step(sc, mb));
		if (a->version != sched_mb_version(sc, s, mb))
			BAD("%s: micro-batch %d uses version %d, the %s schedule says %d", at,
			    mb, a->version, sched_kind_name(sc->kind), sched_mb_version(sc, s, mb));
		if (is_comm(a->op)) {
			int to = a->op == SCHED_SEND_ACT || a->op == SCHED_RECV_GRAD ? s + 1 : s - 1;
			if (to < 0 || to >= S)
				BAD("%s: micro-batch %d: stage %d has no such peer", at, mb, s);
			if (a->peer != to)
				BAD("%s: micro-batch %d: peer %d, expected %d", at, mb, a->peer, to);
			if (a->slot != -1)
				BAD("%s: slot set", at);
		} else if (a->peer != -1) {
			BAD("%s: peer set", at);
		}
		switch (a->op) {
		case SCHED_RECV_ACT:
			if (ra[mb] >= 0 || fpos[mb] >= 0)
				BAD("%s: micro-batch %d received twice or after its forward", at, mb);
			ra[mb] = i;
			break;
		case SCHED_SEND_ACT:
			if (sa[mb] >= 0 || fpos[mb] < 0)
				BAD("%s: micro-batch %d sent twice or before its forward", at, mb);
			sa[mb] = i;
			break;
		case SCHED_RECV_GRAD:
			if (rg[mb] >= 0 || bpos[mb] >= 0)
				BAD("%s: micro-batch %d received twice or after its backward", at, mb);
			rg[mb] = i;
			break;
		case SCHED_SEND_GRAD:
			if (sg[mb] >= 0 || bpos[mb] < 0)
				BAD("%s: micro-batch %d sent twice or before its backward", at, mb);
			sg[mb] = i;
			break;
		case SCHED_FORWARD:
			if (fpos[mb] >= 0)
				BAD("%s: micro-batch %d forwarded twice", at, mb);
			if (s > 0 && ra[mb] < 0)
				BAD("%s: micro-batch %d forwarded before it is received", at, mb);
			if (a->version > nupd)
				BAD("%s: micro-batch %d uses version %d with only %d updates done",
				    at, mb, a->version, nupd);
			if (a->slot < 0 || a->slot >= st->nslots || occ[a->slot] >= 0)
				BAD("%s: micro-batch %d: slot %d is out of range [0, %d) or "
				    "held", at, mb, a->slot, st->nslots);
			occ[a->slot] = mb;
			fslot[mb] = a->slot;
			fpos[mb] = i;
			break;
		case SCHED_BACKWARD:
			if (fpos[mb] < 0 || bpos[mb] >= 0)
				BAD("%s: micro-batch %d backwarded before its forward or twice",
				    at, mb);
			if (s < S - 1 && rg[mb] < 0)
				BAD("%s: micro-batch %d backwarded before its gradient arrives",
				    at, mb);
			if (mb <= last_b)
				BAD("%s: micro-batch %d after %d: backwards not in ascending order",
				    at, mb, last_b);
			if (a->slot != fslot[mb])
				BAD("%s: micro-batch %d: slot %d, its forward used %d", at, mb,
				    a->slot, fslot[mb]);
			if (a->version != st->a[fpos[mb]].version)
				BAD("%s: micro-batch %d: version %d, its forward used %d", at, mb,
				    a->version, st->a[fpos[mb]].version);
			if (grad_n && (a->step != grad_step || a->version != grad_v))
				BAD("%s: micro-batch %d (step %d, version %d) mixes gradients with "
				    "step %d, version %d", at, mb, a->step, a->version, grad_step,
				    grad_v);
			occ[a->slot] = -1;
			bpos[mb] = i;
			last_b = mb;
			grad_n++;
			grad_v = a->version;
			grad_step = a->step;
			break;
		default:
			break;
		}
	}
	for (int mb = 0; mb < N; mb++) {
		if (fpos[mb] < 0 || bpos[mb] < 0)
			BAD("stage %d: micro-batch %d is never %s", s, mb,
			    fpos[mb] < 0 ? "forwarded" : "backwarded");
		if ((s > 0) != (ra[mb] >= 0) || (s > 0) != (sg[mb] >= 0))
			BAD("stage %d: micro-batch %d: %s from stage %d", s, mb,
			    s > 0 ? "activation or gradient missing" : "exchange", s - 1);
		if ((s < S - 1) != (sa[mb] >= 0) || (s < S - 1) != (rg[mb] >= 0))
			BAD("stage %d: micro-batch %d: %s with stage %d", s, mb,
			    s < S - 1 ? "activation or gradient missing" : "exchange", s + 1);
	}
	if (nupd != n_updates || grad_n)
		BAD("stage %d: %d optimizer steps, expected %d%s", s, nupd, n_updates,
		    grad_n ? ", gradients left unapplied" : "");

	struct sched_stage copy = *st;
	compute_stats(&copy);
	if (copy.nslots != st->nslots || copy.nversions != st->nversions ||
	    copy.nupdates != st->nupdates || copy.delay_min != st->delay_min ||
	    copy.delay_max != st->delay_max)
		BAD("stage %d: stored stats differ from the actions'", s);
	if (st->nslots > max_slots)
		BAD("stage %d: %d micro-batches in flight, the %s schedule allows %d", s,
		    st->nslots, sched_kind_name(sc->kind), max_slots);
	if (st->nversions > max_versions)
		BAD("stage %d: %d versions alive, the %s schedule allows %d", s,
		    st->nversions, sched_kind_name(sc->kind), max_versions);

	/* Weight buffers: each action names its version's buffer, and two
	 * versions share a buffer only when one dies before the other is born. */
	lifetimes(st, &lt);
	if (st->vmin != lt.vmin || st->vmax != lt.vmin + lt.nv - 1 || !st->vbuf)
		BAD("stage %d: version range [%d, %d] differs from the actions' [%d, %d]", s,
		    st->vmin, st->vmax, lt.vmin, lt.vmin + lt.nv - 1);
	for (int i = 0; i < st->n; i++) {
		const struct sched_action *a = &st->a[i];
		int want = -1;
		if (a->op == SCHED_FORWARD || a->op == SCHED_BACKWARD || a->op == SCHED_OPTIM_STEP)
			want = st->vbuf[a->version - st->vmin];
		if (a->wbuf != want)
			BAD("stage %d action %d (%s): weight buffer %d, version %d is in %d", s, i,
			    sched_op_name(a->op), a->wbuf, a->version, want);
	}
	for (int k = 0; k < lt.nv; k++) {
		int b = st->vbuf[k];
		if (lt.dies[k] < lt.born[k])
			continue;
		if (b < 0 || b >= st->nversions)
			BAD("stage %d: version %d in buffer %d of %d", s, k + lt.vmin, b,
			    st->nversions);
		/* births ascend with the version, so stop at the first born after */
		for (int j = k + 1; j < lt.nv && lt.born[j] <= lt.dies[k]; j++)
			if (st->vbuf[j] == b && lt.dies[j] >= lt.born[j] &&
			    lt.born[j] <= lt.dies[k])
				BAD("stage %d: version %d is made at action %d into buffer %d "
				    "while version %d there is alive until action %d", s,
				    j + lt.vmin, lt.born[j], b, k + lt.vmin, lt.dies[k]);
	}
	ret = 0;
out:
	free(occ);
	free(lt.born);
	free(lt.dies);
	return ret;
}

int sched_check(const struct schedule *sc, char *why, size_t len)
{
	char dummy[1];
	if (!why || !len)
		why = dummy, len = sizeof(dummy);
	if (!sc || sc->S < 1 || sc->M < 1 || sc->n_mb < 1 || !sc->stage) {
		snprintf(why, len, "empty schedule");
		return -1;
	}
	int *pos = xmalloc(st_mult(st_mult((size_t)sc->n_mb, 7), sizeof(int)));
	int ret = 0;
	for (int s = 0; s < sc->S && !ret; s++)
		ret = check_stage(sc, s, pos, why, len);
	free(pos);
	if (ret)
		return -1;
	/* Matching: every receive has its send (checked per stage above, by
	 * the peer's rules); now every list must complete. */
	return sched_run(sc, NULL, NULL, NULL, why, len);
}

/* ---- NCCL's matching: by order, per channel ---- */

/* The channel of a send or receive of stage s: 2p carries activations
 * p -> p+1, 2p+1 gradients p+1 -> p; -1 for compute. */
static int channel_of(enum sched_op op, int s)
{
	switch (op) {
	case SCHED_SEND_ACT:
		return 2 * s;
	case SCHED_RECV_ACT:
		return 2 * (s - 1);
	case SCHED_SEND_GRAD:
		return 2 * (s - 1) + 1;
	case SCHED_RECV_GRAD:
		return 2 * s + 1;
	default:
		return -1;
	}
}

static const char *channel_name(int c, char *out, size_t len)
{
	int p = c / 2;
	if (c % 2 == 0)
		snprintf(out, len, "activations %d -> %d", p, p + 1);
	else
		snprintf(out, len, "gradients %d -> %d", p + 1, p);
	return out;
}

int sched_check_channel_order(const struct schedule *sc, char *why, size_t len)
{
	char dummy[1];
	if (!why || !len)
		why = dummy, len = sizeof(dummy);
	if (!sc || sc->S < 1 || !sc->stage) {
		snprintf(why, len, "empty schedule");
		return -1;
	}
	int S = sc->S, nch = 2 * (S - 1), ret = -1;
	if (!nch)
		return 0;
	/* per channel, the micro-batches in the sender's order and in the
	 * receiver's; a channel holds at most its sender's action count */
	int **snd = xcalloc((size_t)nch, sizeof(int *)), **rcv = xcalloc((size_t)nch, sizeof(int *));
	int *ns = xcalloc((size_t)nch, sizeof(int)), *nr = xcalloc((size_t)nch, sizeof(int));
	int *pos = xcalloc((size_t)S, sizeof(int));
	char cn[64];
	for (int c = 0; c < nch; c++) {
		int from = c % 2 ? c / 2 + 1 : c / 2, to = c % 2 ? c / 2 : c / 2 + 1;
		snd[c] = xmalloc(st_mult((size_t)sc->stage[from].n + 1, sizeof(int)));
		rcv[c] = xmalloc(st_mult((size_t)sc->stage[to].n + 1, sizeof(int)));
	}
	for (int s = 0; s < S; s++)
		for (int i = 0; i < sc->stage[s].n; i++) {
			const struct sched_action *a = &sc->stage[s].a[i];
			int c = channel_of(a->op, s);
			if (c < 0 && (a->op == SCHED_SEND_ACT || a->op == SCHED_RECV_ACT ||
				      a->op == SCHED_SEND_GRAD || a->op == SCHED_RECV_GRAD))
				BAD("stage %d action %d (%s): stage %d has no such peer", s, i,
				    sched_op_name(a->op), s);
			if (c < 0)
				continue;
			if (c >= nch)
				BAD("stage %d action %d (%s): stage %d has no such peer", s, i,
				    sched_op_name(a->op), s);
			int peer = a->op == SCHED_SEND_ACT || a->op == SCHED_RECV_GRAD ? s + 1 : s - 1;
			if (a->peer != peer)
				BAD("stage %d action %d (%s): peer %d, but the channel goes to stage %d",
				    s, i, sched_op_name(a->op), a->peer, peer);
			if (a->op == SCHED_SEND_ACT || a->op == SCHED_SEND_GRAD)
				snd[c][ns[c]++] = a->mb;
			else
				rcv[c][nr[c]++] = a->mb;
		}
	for (int c = 0; c < nch; c++) {
		int from = c % 2 ? c / 2 + 1 : c / 2, to = c % 2 ? c / 2 : c / 2 + 1;
		for (int k = 0; k < MIN(ns[c], nr[c]); k++)
			if (snd[c][k] != rcv[c][k])
				BAD("channel %s: message %d is micro-batch %d in stage %d's sends but "
				    "micro-batch %d in stage %d's receives (NCCL matches a channel's "
				    "sends and receives by their order)", channel_name(c, cn, sizeof(cn)),
				    k, snd[c][k], from, rcv[c][k], to);
		if (ns[c] != nr[c])
			BAD("channel %s: stage %d sends %d messages, stage %d receives %d",
			    channel_name(c, cn, sizeof(cn)), from, ns[c], to, nr[c]);
	}
	/* Run the lists with a FIFO per channel: a send never stops its stage
	 * (it waits on its channel's stream, behind the channel's earlier
	 * sends); a receive stops the stage until its channel's next message
	 * has been sent. The k-th receive takes the k-th send, the same
	 * micro-batch (checked above). */
	int *sent = ns, *got = nr; /* reused as counters */
	memset(sent, 0, sizeof(int) * (size_t)nch);
	memset(got, 0, sizeof(int) * (size_t)nch);
	for (int progress = 1; progress;) {
		progress = 0;
		for (int s = 0; s < S; s++)
			while (pos[s] < sc->stage[s].n) {
				const struct sched_action *a = &sc->stage[s].a[pos[s]];
				int c = channel_of(a->op, s);
				if (a->op == SCHED_RECV_ACT || a->op == SCHED_RECV_GRAD) {
					if (got[c] == sent[c])
						break;
					got[c]++;
				} else if (c >= 0) {
					sent[c]++;
				}
				pos[s]++;
				progress = 1;
			}
	}
	for (int s = 0; s < S; s++)
		if (pos[s] < sc->stage[s].n) {
			const struct sched_action *a = &sc->stage[s].a[pos[s]];
			BAD("deadlock with a FIFO per channel: stage %d stops at action %d (%s of "
			    "micro-batch %d on channel %s), which its peer never sends", s, pos[s],
			    sched_op_name(a->op), a->mb,
			    channel_name(channel_of(a->op, s), cn, sizeof(cn)));
		}
	ret = 0;
out:
	for (int c = 0; c < nch; c++) {
		free(snd[c]);
		free(rcv[c]);
	}
	free(snd);
	free(rcv);
	free(ns);
	free(nr);
	free(pos);
	return ret;
}
