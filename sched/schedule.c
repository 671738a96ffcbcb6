/* schedule.c - build the pipeline schedules as per-stage action lists,
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
	[SCHED_INTERLEAVED] = "interleaved",
	[SCHED_ZBH1] = "zb-h1",
	[SCHED_ZBV] = "zb-v",
	[SCHED_2BW_ZB] = "2bw-zb",
};

static const char *const op_names[SCHED_NOPS] = {
	[SCHED_FORWARD] = "FORWARD",
	[SCHED_BACKWARD] = "BACKWARD",
	[SCHED_SEND_ACT] = "SEND_ACT",
	[SCHED_RECV_ACT] = "RECV_ACT",
	[SCHED_SEND_GRAD] = "SEND_GRAD",
	[SCHED_RECV_GRAD] = "RECV_GRAD",
	[SCHED_OPTIM_STEP] = "OPTIM_STEP",
	[SCHED_BACKWARD_INPUT] = "BACKWARD_INPUT",
	[SCHED_BACKWARD_WEIGHT] = "BACKWARD_WEIGHT",
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
	return kind == SCHED_2BW || kind == SCHED_PIPEDREAM || kind == SCHED_2BW_ZB;
}

int sched_kind_split(enum sched_kind kind)
{
	return kind == SCHED_ZBH1 || kind == SCHED_ZBV || kind == SCHED_2BW_ZB;
}

int sched_kind_trainable(enum sched_kind kind)
{
	return (unsigned)kind < SCHED_NKINDS_FUSED || kind == SCHED_ZBH1 || kind == SCHED_2BW_ZB ||
	       kind == SCHED_INTERLEAVED || kind == SCHED_ZBV;
}

int sched_piece(const struct schedule *sc, int s, int c)
{
	int S = sc->S;
	if (s < 0 || s >= S || c < 0 || c >= sc->V)
		return -1;
	if (sc->kind == SCHED_ZBV)
		return c == 0 ? s : 2 * S - 1 - s;
	return c * S + s;
}

int sched_piece_stage(const struct schedule *sc, int p)
{
	int S = sc->S;
	if (p < 0 || p >= S * sc->V)
		return -1;
	if (sc->kind == SCHED_ZBV)
		return p < S ? p : 2 * S - 1 - p;
	return p % S;
}

int sched_piece_chunk(const struct schedule *sc, int p)
{
	if (p < 0 || p >= sc->S * sc->V)
		return -1;
	return p / sc->S; /* zb-v too: the second half is chunk 1 */
}

int sched_piece_slots(const struct schedule *sc, int p)
{
	int s = sched_piece_stage(sc, p), c = sched_piece_chunk(sc, p), n = 0;
	if (s < 0)
		return 0;
	const struct sched_stage *st = &sc->stage[s];
	for (int i = 0; i < st->n; i++)
		if (st->a[i].op == SCHED_FORWARD && st->a[i].chunk == c)
			n = MAX(n, st->a[i].slot + 1);
	return n;
}

/* Uses a weight version (FORWARD and the backwards). */
static int uses_weights(enum sched_op op)
{
	return op == SCHED_FORWARD || op == SCHED_BACKWARD || op == SCHED_BACKWARD_INPUT ||
	       op == SCHED_BACKWARD_WEIGHT;
}

/* Accumulates a weight gradient and frees the slot (the fused backward or W). */
static int ends_mb(enum sched_op op)
{
	return op == SCHED_BACKWARD || op == SCHED_BACKWARD_WEIGHT;
}

double sched_bubble_formula(int S, int M)
{
	return (double)(S - 1) / (double)(M + S - 1);
}

double sched_bubble_published(const struct schedule *sc, char *text, size_t len)
{
	int S = sc->S, M = sc->M, V = sc->V;
	double b = -1;
	switch (sc->kind) {
	case SCHED_GPIPE:
	case SCHED_1F1B:
		b = sched_bubble_formula(S, M);
		snprintf(text, len, "(S-1)/(M+S-1)");
		break;
	case SCHED_INTERLEAVED:
		b = (double)(S - 1) / ((double)V * M + S - 1);
		snprintf(text, len, "(S-1)/(V*M+S-1)");
		break;
	case SCHED_ZBH1:
		b = (double)(S - 1) / (3.0 * M + S - 1);
		snprintf(text, len, "(S-1)/(3M+S-1)");
		break;
	default:
		snprintf(text, len, "n/a");
		break;
	}
	return b;
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
	case SCHED_2BW:
	case SCHED_2BW_ZB: {
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
	int *slot_of;   /* [n_mb * V] slot held by each chunk-micro-batch */
	char *used;     /* [V][n_mb] slot in use, per chunk: a piece's slots are its own */
	int next_step;  /* next OPTIM_STEP to emit (async kinds) */
	struct unit **order; /* [S] one step's compute units per stage (new kinds) */
	int *norder;         /* [S] their number */
};

static void push(struct builder *b, enum sched_op op, int mb, int step, int version,
		 int peer, int slot, int chunk)
{
	struct sched_stage *st = b->st;
	if (st->n == b->cap) {
		b->cap = b->cap ? 2 * b->cap : 64;
		st->a = xrealloc(st->a, st_mult((size_t)b->cap, sizeof(*st->a)));
	}
	st->a[st->n++] = (struct sched_action){op, mb, step, version, peer, slot, -1, chunk};
}

static void emit_optim(struct builder *b, int step)
{
	push(b, SCHED_OPTIM_STEP, -1, step, step + 1, -1, -1, 0);
}

/* The stage of piece p when it is another stage's (a message), else -1:
 * out of the model or on this stage (a local handoff). */
static int remote(const struct schedule *sc, int s, int p)
{
	int t = sched_piece_stage(sc, p);
	return t == s ? -1 : t;
}

static void emit_fwd(struct builder *b, int mb, int c)
{
	const struct schedule *sc = b->sc;
	int s = b->s, step = sched_mb_step(sc, mb), v = sched_mb_version(sc, s, mb);
	int p = sched_piece(sc, s, c), from = remote(sc, s, p - 1), to = remote(sc, s, p + 1);
	char *used = b->used + (size_t)c * (size_t)sc->n_mb;
	int slot = 0;
	while (used[slot])
		slot++;
	used[slot] = 1;
	b->slot_of[(size_t)mb * sc->V + c] = slot;
	if (from >= 0)
		push(b, SCHED_RECV_ACT, mb, step, v, from, -1, c);
	push(b, SCHED_FORWARD, mb, step, v, -1, slot, c);
	if (to >= 0)
		push(b, SCHED_SEND_ACT, mb, step, v, to, -1, c);
}

/* The fused BACKWARD (frees the slot) or BACKWARD_INPUT (keeps it for W),
 * with the gradient's receive before and send after. */
static void emit_bwd_op(struct builder *b, enum sched_op op, int mb, int c)
{
	const struct schedule *sc = b->sc;
	int s = b->s, step = sched_mb_step(sc, mb), v = sched_mb_version(sc, s, mb);
	int p = sched_piece(sc, s, c), from = remote(sc, s, p + 1), to = remote(sc, s, p - 1);
	int slot = b->slot_of[(size_t)mb * sc->V + c];
	if (op == SCHED_BACKWARD)
		b->used[(size_t)c * (size_t)sc->n_mb + (size_t)slot] = 0;
	if (from >= 0)
		push(b, SCHED_RECV_GRAD, mb, step, v, from, -1, c);
	push(b, op, mb, step, v, -1, slot, c);
	if (to >= 0)
		push(b, SCHED_SEND_GRAD, mb, step, v, to, -1, c);
	/* Asynchronous kinds step right after a step's last backward. */
	if (sc->kind == SCHED_PIPEDREAM ||
	    (sc->kind == SCHED_2BW && (mb + 1) % sc->M == 0))
		emit_optim(b, b->next_step++);
}

static void emit_bwd(struct builder *b, int mb)
{
	emit_bwd_op(b, SCHED_BACKWARD, mb, 0);
}

static void emit_w(struct builder *b, int mb, int c)
{
	const struct schedule *sc = b->sc;
	int s = b->s, step = sched_mb_step(sc, mb), v = sched_mb_version(sc, s, mb);
	int slot = b->slot_of[(size_t)mb * sc->V + c];
	b->used[(size_t)c * (size_t)sc->n_mb + (size_t)slot] = 0;
	push(b, SCHED_BACKWARD_WEIGHT, mb, step, v, -1, slot, c);
}

/* Micro-batches [lo, hi) in 1F1B order on stage s: min(S-1-s, hi-lo)
 * warm-up forwards, then forward/backward pairs, then the rest backwards. */
static void emit_1f1b(struct builder *b, int lo, int hi)
{
	int n = hi - lo, w = MIN(b->sc->S - 1 - b->s, n);
	for (int i = 0; i < w; i++)
		emit_fwd(b, lo + i, 0);
	for (int i = 0; i < n - w; i++) {
		emit_fwd(b, lo + w + i, 0);
		emit_bwd(b, lo + i);
	}
	for (int i = n - w; i < n; i++)
		emit_bwd(b, lo + i);
}

/* ---- one step's compute order of the chunked and split kinds ---- */

/* A compute unit: op (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)
 * of micro-batch mb (within the step) on chunk c. */
struct unit {
	enum sched_op op;
	int mb, c;
};

struct ulist {
	struct unit *u;
	int n, cap;
};

static void uadd(struct ulist *l, enum sched_op op, int mb, int c)
{
	if (l->n == l->cap) {
		l->cap = l->cap ? 2 * l->cap : 64;
		l->u = xrealloc(l->u, st_mult((size_t)l->cap, sizeof(*l->u)));
	}
	l->u[l->n++] = (struct unit){op, mb, c};
}

/* Megatron's interleaved 1F1B on stage s (see schedule.h): unit k of the
 * M*V is micro-batch (k / (S*V))*S + k%S on chunk (k % (S*V)) / S going
 * forward, on chunk V-1 minus that going backward. */
static void order_interleaved(struct ulist *l, int S, int M, int V, int s)
{
	int total = M * V, warm = M == S ? total : MIN((S - s - 1) * 2 + (V - 1) * S, total);
	if (V == 1) /* plain 1F1B (Megatron runs V = 1 by its other schedule) */
		warm = MIN(S - s - 1, M);
#define MB_OF(k) (((k) / (S * V)) * S + (k) % S)
#define CHUNK_OF(k) (((k) % (S * V)) / S)
	for (int k = 0; k < warm; k++)
		uadd(l, SCHED_FORWARD, MB_OF(k), CHUNK_OF(k));
	for (int k = 0; k < total - warm; k++) {
		uadd(l, SCHED_FORWARD, MB_OF(k + warm), CHUNK_OF(k + warm));
		uadd(l, SCHED_BACKWARD, MB_OF(k), V - 1 - CHUNK_OF(k));
	}
	for (int k = total - warm; k < total; k++)
		uadd(l, SCHED_BACKWARD, MB_OF(k), V - 1 - CHUNK_OF(k));
#undef MB_OF
#undef CHUNK_OF
}

/* torch.distributed.pipelining's ScheduleZBVZeroBubble order on stage s
 * (see schedule.h); M >= 2S. */
static void order_zbv(struct ulist *l, int S, int M, int s)
{
	int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
	for (int i = 0; i < 2 * (S - s) - 1; i++)
		uadd(l, SCHED_FORWARD, f0++, 0);
	for (int i = 0; i < s; i++) {
		uadd(l, SCHED_FORWARD, f1++, 1);
		uadd(l, SCHED_FORWARD, f0++, 0);
	}
	for (int i = 0; i < S - s; i++) {
		uadd(l, SCHED_FORWARD, f1++, 1);
		uadd(l, SCHED_BACKWARD_INPUT, b1, 1);
		uadd(l, SCHED_BACKWARD_WEIGHT, b1++, 1);
	}
	while (f1 < f0 || f0 < M) {
		if (f0 < M)
			uadd(l, SCHED_FORWARD, f0++, 0);
		uadd(l, SCHED_BACKWARD_INPUT, b0, 0);
		uadd(l, SCHED_BACKWARD_WEIGHT, b0++, 0);
		uadd(l, SCHED_FORWARD, f1++, 1);
		uadd(l, SCHED_BACKWARD_INPUT, b1, 1);
		uadd(l, SCHED_BACKWARD_WEIGHT, b1++, 1);
	}
	int w0 = b0, w1 = b1;
	for (int i = 0; i < s; i++) {
		uadd(l, SCHED_BACKWARD_INPUT, b1++, 1);
		uadd(l, SCHED_BACKWARD_INPUT, b0++, 0);
	}
	for (int i = 0; i < S - s; i++) {
		uadd(l, SCHED_BACKWARD_INPUT, b0++, 0);
		uadd(l, SCHED_BACKWARD_WEIGHT, w0++, 0);
	}
	while (w1 < b1)
		uadd(l, SCHED_BACKWARD_WEIGHT, w1++, 1);
	while (w0 < b0)
		uadd(l, SCHED_BACKWARD_WEIGHT, w0++, 0);
}

/* ZB-H1 on stage s (see schedule.h): min(S-s, M) warm-up forwards; then
 * for k = 0..M-1: B of k, W of k-s once k >= s, F of k+S-s while any is
 * left; then the last min(s, M) W's. At most min(S, M) micro-batches hold a
 * slot (S-s after the warm-up, one more per k < s), and the W's put off on
 * stage s are the s that fill its cooldown's waits. */
static void order_zbh1(struct ulist *l, int S, int M, int s)
{
	for (int f = 0; f < MIN(S - s, M); f++)
		uadd(l, SCHED_FORWARD, f, 0);
	for (int k = 0; k < M; k++) {
		uadd(l, SCHED_BACKWARD_INPUT, k, 0);
		if (k >= s)
			uadd(l, SCHED_BACKWARD_WEIGHT, k - s, 0);
		if (k + S - s < M)
			uadd(l, SCHED_FORWARD, k + S - s, 0);
	}
	for (int w = MAX(M - s, 0); w < M; w++)
		uadd(l, SCHED_BACKWARD_WEIGHT, w, 0);
}

/* 2bw-zb on stage s: the n_mb micro-batches as one stream in zb-h1's order
 * (min(S-s, n) warm-up forwards; for k: B of k, W of k-s once k >= s, F of
 * k+S-s), OPTIM_STEP t right after the W of step t's last micro-batch. The
 * forwards of step t+2 (version t+1, made by OPTIM_STEP t) come after it:
 * F of k+S-s follows W of k-s, and M >= S. */
static void emit_2bw_zb(struct builder *b)
{
	const struct schedule *sc = b->sc;
	int N = sc->n_mb, S = sc->S, s = b->s, M = sc->M;
	for (int f = 0; f < MIN(S - s, N); f++)
		emit_fwd(b, f, 0);
	for (int k = 0; k < N + s; k++) {
		if (k < N)
			emit_bwd_op(b, SCHED_BACKWARD_INPUT, k, 0);
		if (k >= s) {
			emit_w(b, k - s, 0);
			if ((k - s + 1) % M == 0)
				emit_optim(b, b->next_step++);
		}
		if (k + S - s < N)
			emit_fwd(b, k + S - s, 0);
	}
}

/* One step's units for every stage (the chunked and split kinds). */
static void unit_orders(struct builder *b)
{
	const struct schedule *sc = b->sc;
	int S = sc->S;
	struct ulist *l = xcalloc((size_t)S, sizeof(*l));
	for (int s = 0; s < S; s++) {
		if (sc->kind == SCHED_ZBH1)
			order_zbh1(&l[s], S, sc->M, s);
		else if (sc->kind == SCHED_INTERLEAVED)
			order_interleaved(&l[s], S, sc->M, sc->V, s);
		else if (sc->kind == SCHED_ZBV)
			order_zbv(&l[s], S, sc->M, s);
	}
	b->order = xcalloc((size_t)S, sizeof(*b->order));
	b->norder = xcalloc((size_t)S, sizeof(int));
	for (int s = 0; s < S; s++) {
		b->order[s] = l[s].u;
		b->norder[s] = l[s].n;
	}
	free(l);
}

static void emit_units(struct builder *b, int t)
{
	int M = b->sc->M;
	const struct unit *u = b->order[b->s];
	for (int i = 0; i < b->norder[b->s]; i++) {
		int mb = t * M + u[i].mb;
		if (u[i].op == SCHED_FORWARD)
			emit_fwd(b, mb, u[i].c);
		else if (u[i].op == SCHED_BACKWARD_WEIGHT)
			emit_w(b, mb, u[i].c);
		else
			emit_bwd_op(b, u[i].op, mb, u[i].c);
	}
}

static void build_stage(struct builder *b)
{
	const struct schedule *sc = b->sc;
	int M = sc->M;
	switch (sc->kind) {
	case SCHED_GPIPE:
		for (int t = 0; t < sc->n_steps; t++) {
			for (int i = 0; i < M; i++)
				emit_fwd(b, t * M + i, 0);
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
	case SCHED_2BW_ZB:
		emit_2bw_zb(b);
		break;
	case SCHED_INTERLEAVED:
	case SCHED_ZBH1:
	case SCHED_ZBV:
		for (int t = 0; t < sc->n_steps; t++) {
			emit_units(b, t);
			emit_optim(b, t);
		}
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
		if (uses_weights(a->op))
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
		else if (uses_weights(a->op))
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
	int n = st->n, nupd = 0, inflight = 0, peak = 0, pending = 0, peakp = 0;
	for (int i = 0; i < n; i++) {
		const struct sched_action *a = &st->a[i];
		if (a->op == SCHED_FORWARD) {
			inflight++;
			peak = MAX(peak, inflight);
		} else if (ends_mb(a->op)) {
			inflight--;
			pending -= a->op == SCHED_BACKWARD_WEIGHT;
		} else if (a->op == SCHED_BACKWARD_INPUT) {
			pending++;
			peakp = MAX(peakp, pending);
		} else if (a->op == SCHED_OPTIM_STEP) {
			nupd++;
		}
	}
	st->nslots = peak;
	st->npending = peakp;
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
		if (ends_mb(a->op)) {
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
		if (uses_weights(a->op) || a->op == SCHED_OPTIM_STEP)
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

struct schedule *sched_build_virtual(enum sched_kind kind, int S, int M, int V, int n_steps,
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
	if ((kind == SCHED_2BW || kind == SCHED_2BW_ZB) && M < S) {
		snprintf(err, errlen, "%s schedule needs micro-batches >= stages (got %d < %d)",
			 name, M, S);
		return NULL;
	}
	if (!V)
		V = kind == SCHED_ZBV ? 2 : 1;
	if (kind == SCHED_INTERLEAVED ? V < 1 || V > 64 : V != (kind == SCHED_ZBV ? 2 : 1)) {
		const char *takes = kind == SCHED_INTERLEAVED ? "1 to 64"
				    : kind == SCHED_ZBV	  ? "2"
							  : "1";
		snprintf(err, errlen, "%s schedule: %d virtual stages (chunks per stage); it "
			 "takes %s", name, V, takes);
		return NULL;
	}
	if (kind == SCHED_INTERLEAVED && V > 1 && M % S) {
		snprintf(err, errlen, "interleaved schedule needs micro-batches a multiple of "
			 "stages with %d virtual stages (got %d micro-batches, %d stages), as "
			 "Megatron-LM does", V, M, S);
		return NULL;
	}
	if (kind == SCHED_ZBV && M < 2 * S) {
		snprintf(err, errlen, "zb-v schedule needs micro-batches >= 2 x stages "
			 "(got %d < %d)", M, 2 * S);
		return NULL;
	}
	long n_mb = kind == SCHED_PIPEDREAM ? n_steps : (long)n_steps * M;
	if (n_mb > INT_MAX / 8 / V || n_mb * S * V > SCHED_MAX_CELLS) {
		snprintf(err, errlen, "%s schedule too large: %ld micro-batches x %d stages x %d "
			 "chunks (at most %ld)", name, n_mb, S, V, (long)SCHED_MAX_CELLS);
		return NULL;
	}
	struct schedule *sc = xcalloc(1, sizeof(*sc));
	sc->kind = kind;
	sc->S = S;
	sc->M = M;
	sc->n_steps = n_steps;
	sc->V = V;
	sc->first_step = first_step;
	sc->n_mb = (int)n_mb;
	sc->stage = xcalloc((size_t)S, sizeof(*sc->stage));
	struct builder b = {.sc = sc};
	size_t cells = st_mult((size_t)n_mb, (size_t)V);
	b.slot_of = xmalloc(st_mult(cells, sizeof(int)));
	b.used = xcalloc(cells, 1);
	if (kind >= SCHED_NKINDS_FUSED && kind != SCHED_2BW_ZB)
		unit_orders(&b);
	for (int s = 0; s < S; s++) {
		b.st = &sc->stage[s];
		b.s = s;
		b.cap = 0;
		b.next_step = 0;
		memset(b.used, 0, cells);
		build_stage(&b);
		compute_stats(b.st);
		assign_buffers(b.st);
	}
	for (int s = 0; b.order && s < S; s++)
		free(b.order[s]);
	free(b.order);
	free(b.norder);
	free(b.slot_of);
	free(b.used);
	return sc;
}

struct schedule *sched_build_forward(enum sched_kind kind, int S, int V, int n_mb, char *err,
				     size_t errlen)
{
	/* the layout's checks: a one-step schedule of that kind must build */
	int M = kind == SCHED_ZBV ? 2 * S : S;
	struct schedule *probe = sched_build_virtual(kind, S, M, V, 1, 0, err, errlen);
	if (!probe)
		return NULL;
	sched_free(probe);
	if (n_mb < 0 || (long)n_mb * S * (V ? V : 1) > SCHED_MAX_CELLS) {
		snprintf(err, errlen, "forward lists of %d micro-batches x %d stages: at most %ld "
			 "cells", n_mb, S, (long)SCHED_MAX_CELLS);
		return NULL;
	}
	struct schedule *sc = xcalloc(1, sizeof(*sc));
	sc->kind = kind;
	sc->S = S;
	sc->M = 1;
	sc->n_steps = 1;
	sc->V = V ? V : kind == SCHED_ZBV ? 2 : 1;
	sc->n_mb = n_mb;
	sc->forward_only = 1;
	sc->stage = xcalloc((size_t)S, sizeof(*sc->stage));
	struct builder b = {.sc = sc};
	for (int s = 0; s < S; s++) {
		b.st = &sc->stage[s];
		b.s = s;
		b.cap = 0;
		for (int mb = 0; mb < n_mb; mb++)
			for (int p = 0; p < S * sc->V; p++) {
				if (sched_piece_stage(sc, p) != s)
					continue;
				int c = sched_piece_chunk(sc, p);
				int from = remote(sc, s, p - 1), to = remote(sc, s, p + 1);
				if (from >= 0)
					push(&b, SCHED_RECV_ACT, mb, 0, 0, from, -1, c);
				push(&b, SCHED_FORWARD, mb, 0, 0, -1, 0, c);
				if (to >= 0)
					push(&b, SCHED_SEND_ACT, mb, 0, 0, to, -1, c);
			}
		b.st->nslots = n_mb > 0;
		b.st->nversions = 1;
	}
	return sc;
}

struct schedule *sched_build_at(enum sched_kind kind, int S, int M, int n_steps,
				long first_step, char *err, size_t errlen)
{
	return sched_build_virtual(kind, S, M, 0, n_steps, first_step, err, errlen);
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
	case SCHED_2BW_ZB:
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

/* The most slots (chunk-micro-batches in flight) the kind allows stage s. */
static int max_slots(const struct schedule *sc, int s)
{
	int S = sc->S, M = sc->M, V = sc->V, N = sc->n_mb;
	switch (sc->kind) {
	case SCHED_GPIPE:
		return M;
	case SCHED_INTERLEAVED:
		if (V == 1)
			return MIN(S - s, N);
		return M == S ? M * V : MIN(2 * (S - s - 1) + (V - 1) * S + 1, M * V);
	case SCHED_ZBH1:
		return MIN(S, M); /* 1F1B's peak, stage 0's */
	case SCHED_2BW_ZB:
		return MIN(S, N);
	case SCHED_ZBV:
		return MIN(2 * S, 2 * M); /* 1F1B's stage 0: S micro-batches of both chunks */
	default:
		return MIN(S - s, N);
	}
}

/* Positions per chunk-micro-batch u = mb*V + c kept by check_stage. */
enum { P_F, P_B, P_W, P_RA, P_SA, P_RG, P_SG, P_SLOT, P_N };

static int check_stage(const struct schedule *sc, int s, int *pos, char *why, size_t len)
{
	const struct sched_stage *st = &sc->stage[s];
	int S = sc->S, N = sc->n_mb, V = sc->V, P = S * V, ret = -1;
	size_t NV = (size_t)N * V;
	int split = sched_kind_split(sc->kind);
	int per_step = sc->kind == SCHED_PIPEDREAM ? 1 : sc->M * V;
	int n_updates = sc->kind == SCHED_PIPEDREAM ? sc->n_mb : sc->n_steps;
	int max_versions = sc->kind == SCHED_2BW || sc->kind == SCHED_2BW_ZB ? 2
			   : sc->kind == SCHED_PIPEDREAM			 ? S - s
									 : 1;
	/* positions of each chunk-micro-batch's F, B (the fused BACKWARD or
	 * BACKWARD_INPUT), W (BACKWARD_WEIGHT, or the fused BACKWARD again),
	 * RECV_ACT, SEND_ACT, RECV_GRAD, SEND_GRAD on this stage and its
	 * forward's slot; -1 when absent */
	int *fpos = pos, *bpos = pos + NV, *wpos = pos + 2 * NV, *ra = pos + 3 * NV;
	int *sa = pos + 4 * NV, *rg = pos + 5 * NV, *sg = pos + 6 * NV, *fslot = pos + 7 * NV;
	int *occ = xmalloc(st_mult(st_mult(NV + 1, (size_t)V), sizeof(int))); /* [V][NV+1] */
	int *last_w = xmalloc(st_mult((size_t)V, sizeof(int)));
	struct lifetimes lt = {0};
	for (size_t i = 0; i < P_N * NV; i++)
		pos[i] = -1;
	for (size_t i = 0; i < (NV + 1) * V; i++)
		occ[i] = -1;
	for (int c = 0; c < V; c++)
		last_w[c] = -1;
	int nupd = 0, grad_n = 0, grad_v = 0, grad_step = -1;
	char at[80];
	for (int i = 0; i < st->n; i++) {
		const struct sched_action *a = &st->a[i];
		int mb = a->mb, c = a->chunk;
		snprintf(at, sizeof(at), "stage %d action %d (%s)", s, i, sched_op_name(a->op));
		if ((unsigned)a->op >= SCHED_NOPS)
			BAD("stage %d action %d: unknown op %d", s, i, (int)a->op);
		if (a->op == SCHED_OPTIM_STEP) {
			if (mb != -1 || a->peer != -1 || a->slot != -1 || c != 0)
				BAD("%s: micro-batch, peer, slot or chunk set", at);
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
			    st->a[i - 1].op != (split ? SCHED_BACKWARD_WEIGHT : SCHED_BACKWARD) &&
			    !(!split && st->a[i - 1].op == SCHED_SEND_GRAD && i > 1 &&
			      st->a[i - 2].op == SCHED_BACKWARD))
				BAD("%s: not right after the step's last backward", at);
			nupd++;
			grad_n = 0;
			grad_step = -1;
			continue;
		}
		if (mb < 0 || mb >= N)
			BAD("%s: micro-batch %d out of range [0, %d)", at, mb, N);
		if (c < 0 || c >= V)
			BAD("%s: micro-batch %d: chunk %d out of range [0, %d)", at, mb, c, V);
		if (a->step != sched_mb_step(sc, mb))
			BAD("%s: micro-batch %d has step %d, expected %d", at, mb, a->step,
			    sched_mb_step(sc, mb));
		if (a->version != sched_mb_version(sc, s, mb))
			BAD("%s: micro-batch %d uses version %d, the %s schedule says %d", at,
			    mb, a->version, sched_kind_name(sc->kind), sched_mb_version(sc, s, mb));
		if (split ? a->op == SCHED_BACKWARD
			  : a->op == SCHED_BACKWARD_INPUT || a->op == SCHED_BACKWARD_WEIGHT)
			BAD("%s: micro-batch %d: the %s schedule %s", at, mb,
			    sched_kind_name(sc->kind), split ? "splits the backward into "
			    "BACKWARD_INPUT and BACKWARD_WEIGHT" : "runs the fused BACKWARD");
		/* the neighbouring pieces' stages when another stage holds them */
		int p = sched_piece(sc, s, c), up = -1, down = -1;
		if (p > 0 && sched_piece_stage(sc, p - 1) != s)
			up = sched_piece_stage(sc, p - 1);
		if (p < P - 1 && sched_piece_stage(sc, p + 1) != s)
			down = sched_piece_stage(sc, p + 1);
		/* the neighbours' chunk-micro-batch indices when on this stage */
		long uprev = p > 0 && up < 0 ? (long)mb * V + sched_piece_chunk(sc, p - 1) : -1;
		long unext = p < P - 1 && down < 0 ? (long)mb * V + sched_piece_chunk(sc, p + 1) : -1;
		size_t u = (size_t)mb * V + c;
		if (is_comm(a->op)) {
			int to = a->op == SCHED_SEND_ACT || a->op == SCHED_RECV_GRAD ? down : up;
			if (to < 0)
				BAD("%s: micro-batch %d chunk %d: stage %d has no such peer", at, mb, c,
				    s);
			if (a->peer != to)
				BAD("%s: micro-batch %d: peer %d, expected %d", at, mb, a->peer, to);
			if (a->slot != -1)
				BAD("%s: slot set", at);
		} else if (a->peer != -1) {
			BAD("%s: peer set", at);
		}
		switch (a->op) {
		case SCHED_RECV_ACT:
			if (ra[u] >= 0 || fpos[u] >= 0)
				BAD("%s: micro-batch %d received twice or after its forward", at, mb);
			ra[u] = i;
			break;
		case SCHED_SEND_ACT:
			if (sa[u] >= 0 || fpos[u] < 0)
				BAD("%s: micro-batch %d sent twice or before its forward", at, mb);
			sa[u] = i;
			break;
		case SCHED_RECV_GRAD:
			if (rg[u] >= 0 || bpos[u] >= 0)
				BAD("%s: micro-batch %d received twice or after its backward", at, mb);
			rg[u] = i;
			break;
		case SCHED_SEND_GRAD:
			if (sg[u] >= 0 || bpos[u] < 0)
				BAD("%s: micro-batch %d sent twice or before its backward", at, mb);
			sg[u] = i;
			break;
		case SCHED_FORWARD:
			if (fpos[u] >= 0)
				BAD("%s: micro-batch %d forwarded twice", at, mb);
			if (up >= 0 && ra[u] < 0)
				BAD("%s: micro-batch %d forwarded before it is received", at, mb);
			if (uprev >= 0 && fpos[uprev] < 0)
				BAD("%s: micro-batch %d chunk %d forwarded before chunk %d hands it over",
				    at, mb, c, (int)(uprev % V));
			if (a->version > nupd)
				BAD("%s: micro-batch %d uses version %d with only %d updates done",
				    at, mb, a->version, nupd);
			if (a->slot < 0 || a->slot >= st->nslots ||
			    occ[(size_t)c * (NV + 1) + (size_t)a->slot] >= 0)
				BAD("%s: micro-batch %d: slot %d is out of range [0, %d) or "
				    "held", at, mb, a->slot, st->nslots);
			occ[(size_t)c * (NV + 1) + (size_t)a->slot] = (int)u;
			fslot[u] = a->slot;
			fpos[u] = i;
			break;
		case SCHED_BACKWARD:
		case SCHED_BACKWARD_INPUT:
		case SCHED_BACKWARD_WEIGHT:
			if (a->op == SCHED_BACKWARD_WEIGHT ? bpos[u] < 0 || wpos[u] >= 0
							   : fpos[u] < 0 || bpos[u] >= 0)
				BAD("%s: micro-batch %d chunk %d %s", at, mb, c,
				    a->op == SCHED_BACKWARD_WEIGHT
					    ? "before its BACKWARD_INPUT or twice"
					    : "backwarded before its forward or twice");
			if (a->op != SCHED_BACKWARD_WEIGHT && down >= 0 && rg[u] < 0)
				BAD("%s: micro-batch %d backwarded before its gradient arrives",
				    at, mb);
			if (a->op != SCHED_BACKWARD_WEIGHT && unext >= 0 && bpos[unext] < 0)
				BAD("%s: micro-batch %d chunk %d backwarded before chunk %d hands its "
				    "gradient over", at, mb, c, (int)(unext % V));
			if (a->slot != fslot[u])
				BAD("%s: micro-batch %d: slot %d, its forward used %d", at, mb,
				    a->slot, fslot[u]);
			if (a->version != st->a[fpos[u]].version)
				BAD("%s: micro-batch %d: version %d, its forward used %d", at, mb,
				    a->version, st->a[fpos[u]].version);
			if (a->op != SCHED_BACKWARD_WEIGHT)
				bpos[u] = i;
			if (a->op == SCHED_BACKWARD_INPUT)
				break;
			/* the weight gradient: accumulated in ascending mb per chunk */
			if (mb <= last_w[c]) {
				if (V == 1 && a->op == SCHED_BACKWARD)
					BAD("%s: micro-batch %d after %d: backwards not in ascending "
					    "order", at, mb, last_w[c]);
				BAD("%s: micro-batch %d after %d: weight gradients of chunk %d not in "
				    "ascending micro-batch order", at, mb, last_w[c], c);
			}
			if (grad_n && (a->step != grad_step || a->version != grad_v))
				BAD("%s: micro-batch %d (step %d, version %d) mixes gradients with "
				    "step %d, version %d", at, mb, a->step, a->version, grad_step,
				    grad_v);
			occ[(size_t)c * (NV + 1) + (size_t)a->slot] = -1;
			wpos[u] = i;
			last_w[c] = mb;
			grad_n++;
			grad_v = a->version;
			grad_step = a->step;
			break;
		default:
			break;
		}
	}
	for (int mb = 0; mb < N; mb++)
		for (int c = 0; c < V; c++) {
			size_t u = (size_t)mb * V + c;
			int p = sched_piece(sc, s, c);
			int up = p > 0 && sched_piece_stage(sc, p - 1) != s;
			int down = p < P - 1 && sched_piece_stage(sc, p + 1) != s;
			if (fpos[u] < 0 || bpos[u] < 0 || wpos[u] < 0)
				BAD("stage %d: micro-batch %d chunk %d is never %s", s, mb, c,
				    fpos[u] < 0 ? "forwarded" : bpos[u] < 0 ? "backwarded"
				    : "given its weight gradient (BACKWARD_WEIGHT)");
			if (up != (ra[u] >= 0) || up != (sg[u] >= 0))
				BAD("stage %d: micro-batch %d chunk %d: %s from stage %d", s, mb, c,
				    up ? "activation or gradient missing" : "exchange",
				    up ? sched_piece_stage(sc, p - 1) : s - 1);
			if (down != (sa[u] >= 0) || down != (rg[u] >= 0))
				BAD("stage %d: micro-batch %d chunk %d: %s with stage %d", s, mb, c,
				    down ? "activation or gradient missing" : "exchange",
				    down ? sched_piece_stage(sc, p + 1) : s + 1);
		}
	if (nupd != n_updates || grad_n)
		BAD("stage %d: %d optimizer steps, expected %d%s", s, nupd, n_updates,
		    grad_n ? ", gradients left unapplied" : "");

	struct sched_stage copy = *st;
	compute_stats(&copy);
	if (copy.nslots != st->nslots || copy.nversions != st->nversions ||
	    copy.nupdates != st->nupdates || copy.delay_min != st->delay_min ||
	    copy.delay_max != st->delay_max || copy.npending != st->npending)
		BAD("stage %d: stored stats differ from the actions'", s);
	if (st->nslots > max_slots(sc, s))
		BAD("stage %d: %d micro-batches in flight, the %s schedule allows %d", s,
		    st->nslots, sched_kind_name(sc->kind), max_slots(sc, s));
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
		if (uses_weights(a->op) || a->op == SCHED_OPTIM_STEP)
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
	free(last_w);
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
	if (sc->V < 1 || sc->kind >= SCHED_NKINDS) {
		snprintf(why, len, "schedule with %d chunks per stage or kind %d", sc->V,
			 (int)sc->kind);
		return -1;
	}
	int *pos = xmalloc(st_mult(st_mult(st_mult((size_t)sc->n_mb, (size_t)sc->V), P_N),
				   sizeof(int)));
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

/* A send's or receive's channel: (type*S + from)*S + to, type 0 for
 * activations and 1 for gradients; *key gets the message's identity, mb*P
 * plus the receiving piece. -1 for compute or a bad action. */
static int channel_of(const struct schedule *sc, int s, const struct sched_action *a, long *key)
{
	int S = sc->S, P = S * sc->V, p = sched_piece(sc, s, a->chunk), n, recv, type;
	switch (a->op) {
	case SCHED_SEND_ACT:
		n = p + 1, recv = n, type = 0;
		break;
	case SCHED_RECV_ACT:
		n = p - 1, recv = p, type = 0;
		break;
	case SCHED_SEND_GRAD:
		n = p - 1, recv = n, type = 1;
		break;
	case SCHED_RECV_GRAD:
		n = p + 1, recv = p, type = 1;
		break;
	default:
		return -1;
	}
	int t = sched_piece_stage(sc, n);
	if (p < 0 || t < 0 || t == s || a->mb < 0 || a->mb >= sc->n_mb)
		return -1;
	int send = a->op == SCHED_SEND_ACT || a->op == SCHED_SEND_GRAD;
	int from = send ? s : t, to = send ? t : s;
	*key = (long)a->mb * P + recv;
	return (type * S + from) * S + to;
}

static const char *channel_name(const struct schedule *sc, int c, char *out, size_t len)
{
	int S = sc->S, to = c % S, from = c / S % S, type = c / (S * S);
	snprintf(out, len, "%s %d -> %d", type ? "gradients" : "activations", from, to);
	return out;
}

/* "micro-batch 3" or, with chunks, "micro-batch 3 for chunk 1 of stage 2". */
static const char *message_name(const struct schedule *sc, long key, char *out, size_t len)
{
	int P = sc->S * sc->V, p = (int)(key % P);
	if (sc->V == 1)
		snprintf(out, len, "micro-batch %ld", key / P);
	else
		snprintf(out, len, "micro-batch %ld for chunk %d of stage %d", key / P,
			 sched_piece_chunk(sc, p), sched_piece_stage(sc, p));
	return out;
}

int sched_check_channel_order(const struct schedule *sc, char *why, size_t len)
{
	char dummy[1];
	if (!why || !len)
		why = dummy, len = sizeof(dummy);
	if (!sc || sc->S < 1 || !sc->stage || sc->V < 1) {
		snprintf(why, len, "empty schedule");
		return -1;
	}
	int S = sc->S, nch = 2 * S * S, ret = -1;
	/* per channel, the messages in the sender's order and in the
	 * receiver's (counted first, then filled) */
	long **snd = xcalloc((size_t)nch, sizeof(long *));
	long **rcv = xcalloc((size_t)nch, sizeof(long *));
	int *ns = xcalloc((size_t)nch, sizeof(int)), *nr = xcalloc((size_t)nch, sizeof(int));
	int *pos = xcalloc((size_t)S, sizeof(int));
	char cn[64], m1[96], m2[96];
	long key;
	for (int s = 0; s < S; s++)
		for (int i = 0; i < sc->stage[s].n; i++) {
			const struct sched_action *a = &sc->stage[s].a[i];
			if (!is_comm(a->op))
				continue;
			int c = channel_of(sc, s, a, &key);
			if (c < 0)
				BAD("stage %d action %d (%s): stage %d has no such peer", s, i,
				    sched_op_name(a->op), s);
			int peer = c / S % S == s ? c % S : c / S % S;
			if (a->peer != peer)
				BAD("stage %d action %d (%s): peer %d, but the channel goes to stage %d",
				    s, i, sched_op_name(a->op), a->peer, peer);
			if (a->op == SCHED_SEND_ACT || a->op == SCHED_SEND_GRAD)
				ns[c]++;
			else
				nr[c]++;
		}
	for (int c = 0; c < nch; c++) {
		snd[c] = xmalloc(st_mult((size_t)ns[c] + 1, sizeof(long)));
		rcv[c] = xmalloc(st_mult((size_t)nr[c] + 1, sizeof(long)));
		ns[c] = nr[c] = 0;
	}
	for (int s = 0; s < S; s++)
		for (int i = 0; i < sc->stage[s].n; i++) {
			const struct sched_action *a = &sc->stage[s].a[i];
			int c = is_comm(a->op) ? channel_of(sc, s, a, &key) : -1;
			if (c < 0)
				continue;
			if (a->op == SCHED_SEND_ACT || a->op == SCHED_SEND_GRAD)
				snd[c][ns[c]++] = key;
			else
				rcv[c][nr[c]++] = key;
		}
	for (int c = 0; c < nch; c++) {
		int from = c / S % S, to = c % S;
		for (int k = 0; k < MIN(ns[c], nr[c]); k++)
			if (snd[c][k] != rcv[c][k])
				BAD("channel %s: message %d is %s in stage %d's sends but %s in stage "
				    "%d's receives (NCCL matches a channel's sends and receives by "
				    "their order)", channel_name(sc, c, cn, sizeof(cn)), k,
				    message_name(sc, snd[c][k], m1, sizeof(m1)), from,
				    message_name(sc, rcv[c][k], m2, sizeof(m2)), to);
		if (ns[c] != nr[c])
			BAD("channel %s: stage %d sends %d messages, stage %d receives %d",
			    channel_name(sc, c, cn, sizeof(cn)), from, ns[c], to, nr[c]);
	}
	/* Run the lists with a FIFO per channel: a send never stops its stage
	 * (it waits on its channel's stream, behind the channel's earlier
	 * sends); a receive stops the stage until its channel's next message
	 * has been sent. The k-th receive takes the k-th send, the same
	 * message (checked above). */
	int *sent = ns, *got = nr; /* reused as counters */
	memset(sent, 0, sizeof(int) * (size_t)nch);
	memset(got, 0, sizeof(int) * (size_t)nch);
	for (int progress = 1; progress;) {
		progress = 0;
		for (int s = 0; s < S; s++)
			while (pos[s] < sc->stage[s].n) {
				const struct sched_action *a = &sc->stage[s].a[pos[s]];
				int c = is_comm(a->op) ? channel_of(sc, s, a, &key) : -1;
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
			int c = channel_of(sc, s, a, &key);
			BAD("deadlock with a FIFO per channel: stage %d stops at action %d (%s of "
			    "%s on channel %s), which its peer never sends", s, pos[s],
			    sched_op_name(a->op), message_name(sc, key, m1, sizeof(m1)),
			    channel_name(sc, c, cn, sizeof(cn)));
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
