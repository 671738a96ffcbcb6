/* test_sched_split.c - the chunked and split-backward schedules (interleaved,
 * zb-h1, zb-v, 2bw-zb): both checks pass for every valid (S, V, M) up to 8, 4, 16
 * and the invalid ones are refused naming the constraint; the lists hold
 * each property again, asserted directly here (not through sched_check);
 * interleaved follows Megatron's order, computed here another way; the
 * simulated bubbles equal the published formulas; the checks reject
 * mutated lists; the timeline draws B, W and chunks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/util.h"
#include "../../sched/schedule.h"
#include "../test.h"

static const int new_kinds[] = {SCHED_INTERLEAVED, SCHED_ZBH1, SCHED_ZBV, SCHED_2BW_ZB};

/* Why (kind, S, M, V) is invalid, as a part of the builder's message, or
 * NULL when it is valid. */
static const char *invalid(int kind, int S, int M, int V)
{
	if (kind == SCHED_INTERLEAVED)
		return V > 1 && M % S ? "a multiple of stages" : NULL;
	if (kind == SCHED_ZBV)
		return V != 2 ? "it takes 2" : M < 2 * S ? ">= 2 x stages" : NULL;
	if (kind == SCHED_2BW_ZB && M < S) /* checked before the chunks */
		return "micro-batches >= stages";
	return V != 1 ? "it takes 1" : NULL;
}

/* Every valid combination passes sched_check (every invariant, no deadlock
 * under buffered sends) and sched_check_channel_order (NCCL's FIFO per
 * channel); every invalid one is refused with the constraint named. */
TEST(test_new_kinds_pass_both_checks_or_are_refused)
{
	char err[256], why[512];
	int built[SCHED_NKINDS] = {0}, refused = 0;
	for (size_t k = 0; k < ARRAY_SIZE(new_kinds); k++)
		for (int S = 1; S <= 8; S++)
			for (int V = 1; V <= 4; V++)
				for (int M = 1; M <= 16; M++)
					for (int n = 1; n <= 2; n++) {
						int kind = new_kinds[k];
						const char *bad = invalid(kind, S, M, V);
						/* the two-step segments start at global
						 * step 3: synchronous, the same lists */
						struct schedule *sc = sched_build_virtual(
							kind, S, M, V, n, n == 2 ? 3 : 0, err,
							sizeof(err));
						if (bad) {
							CHECK_MSG(!sc && strstr(err, bad),
								  "%s S=%d M=%d V=%d: '%s'",
								  sched_kind_name(kind), S, M, V, err);
							sched_free(sc);
							refused++;
							continue;
						}
						CHECK_MSG(sc != NULL, "%s S=%d M=%d V=%d: %s",
							  sched_kind_name(kind), S, M, V, err);
						if (!sc)
							continue;
						CHECK_MSG(sched_check(sc, why, sizeof(why)) == 0,
							  "%s S=%d M=%d V=%d n=%d: %s",
							  sched_kind_name(kind), S, M, V, n, why);
						CHECK_MSG(sched_check_channel_order(sc, why,
										    sizeof(why)) == 0,
							  "%s S=%d M=%d V=%d n=%d: %s",
							  sched_kind_name(kind), S, M, V, n, why);
						built[kind]++;
						sched_free(sc);
					}
	CHECK(built[SCHED_INTERLEAVED] > 300 && built[SCHED_ZBH1] > 200 && built[SCHED_ZBV] > 50 &&
	      built[SCHED_2BW_ZB] > 100);
	CHECK(refused > 500);
	/* the default chunk counts */
	struct schedule *sc = sched_build(SCHED_ZBV, 2, 4, 1, err, sizeof(err));
	CHECK(sc && sc->V == 2);
	sched_free(sc);
	sc = sched_build(SCHED_INTERLEAVED, 2, 3, 1, err, sizeof(err));
	CHECK(sc && sc->V == 1);
	sched_free(sc);
}

/* The piece (model order) of chunk c on stage s, written out here. */
static int piece_of(int kind, int S, int s, int c)
{
	return kind == SCHED_ZBV ? (c ? 2 * S - 1 - s : s) : c * S + s;
}

static int stage_of(int kind, int S, int V, int p)
{
	for (int s = 0; s < S; s++)
		for (int c = 0; c < V; c++)
			if (piece_of(kind, S, s, c) == p)
				return s;
	return -1;
}

/* Directly on the lists: every (mb, chunk) forwarded once, its input
 * gradient once, its weight gradient once after it (split kinds: B then W;
 * never the fused BACKWARD), W's of a chunk in ascending mb; a slot taken by
 * F is free and stays held until W (or BACKWARD); a message exactly where a
 * neighbouring piece sits on another stage, to that stage; one OPTIM_STEP
 * per step after all of the step's weight gradients. */
TEST(test_new_kinds_lists_hold_their_properties)
{
	char err[256];
	int seen = 0;
	for (size_t k = 0; k < ARRAY_SIZE(new_kinds); k++)
		for (int S = 1; S <= 6; S++)
			for (int M = 1; M <= 12; M++)
				for (int V = 1; V <= 3; V++) {
					int kind = new_kinds[k];
					if (invalid(kind, S, M, V))
						continue;
					struct schedule *sc =
						sched_build_virtual(kind, S, M, V, 2, 0, err, sizeof(err));
					CHECK(sc);
					if (!sc)
						continue;
					int N = sc->n_mb, split = kind != SCHED_INTERLEAVED, P = S * V;
					for (int s = 0; s < S; s++) {
						int n;
						const struct sched_action *a = sched_actions(sc, s, &n);
						int *f = xcalloc((size_t)N * V, sizeof(int));
						int *b = xcalloc((size_t)N * V, sizeof(int));
						int *w = xcalloc((size_t)N * V, sizeof(int));
						/* slots are per chunk: [V][N*V + 1] */
						size_t hw = (size_t)N * V + 1;
						int *held = xcalloc(hw * V, sizeof(int));
						int *live = xcalloc((size_t)V, sizeof(int));
						int *peak = xcalloc((size_t)V, sizeof(int));
						int *lastw = xmalloc(sizeof(int) * V);
						int steps = 0, grads = 0;
						for (int c = 0; c < V; c++)
							lastw[c] = -1;
						for (int i = 0; i < n; i++) {
							const struct sched_action *x = &a[i];
							size_t u = (size_t)x->mb * V + x->chunk;
							int p = piece_of(kind, S, s, x->chunk);
							switch (x->op) {
							case SCHED_FORWARD:
								CHECK(!f[u]++);
								CHECK(x->slot >= 0 && x->slot < sc->stage[s].nslots);
								CHECK(!held[x->chunk * hw + x->slot]);
								held[x->chunk * hw + x->slot] = 1;
								live[x->chunk]++;
								if (live[x->chunk] > peak[x->chunk])
									peak[x->chunk] = live[x->chunk];
								break;
							case SCHED_BACKWARD:
								CHECK(!split);
								/* fallthrough */
							case SCHED_BACKWARD_INPUT:
								CHECK(split || x->op == SCHED_BACKWARD);
								CHECK(f[u] == 1 && !b[u]++);
								if (x->op == SCHED_BACKWARD_INPUT)
									break;
								/* fallthrough */
							case SCHED_BACKWARD_WEIGHT:
								CHECK(b[u] == 1 && !w[u]++);
								CHECK_MSG(x->mb > lastw[x->chunk],
									  "%s S=%d M=%d V=%d stage %d",
									  sched_kind_name(kind), S, M, V, s);
								lastw[x->chunk] = x->mb;
								CHECK(held[x->chunk * hw + x->slot]);
								held[x->chunk * hw + x->slot] = 0;
								live[x->chunk]--;
								grads++;
								break;
							case SCHED_SEND_ACT:
							case SCHED_RECV_GRAD:
								CHECK(p + 1 < P &&
								      x->peer == stage_of(kind, S, V, p + 1) &&
								      x->peer != s);
								break;
							case SCHED_RECV_ACT:
							case SCHED_SEND_GRAD:
								CHECK(p > 0 &&
								      x->peer == stage_of(kind, S, V, p - 1) &&
								      x->peer != s);
								break;
							case SCHED_OPTIM_STEP:
								CHECK(x->step == steps);
								CHECK(grads == (steps + 1) * M * V);
								steps++;
								break;
							default:
								CHECK(0);
							}
						}
						CHECK(steps == 2);
						for (size_t u = 0; u < (size_t)N * V; u++)
							CHECK(f[u] == 1 && b[u] == 1 && w[u] == 1);
						/* a piece's worker gets exactly its chunk's
						 * peak, never more than the stage's */
						int sum = 0;
						for (int c = 0; c < V; c++) {
							int q = sched_piece(sc, s, c);
							CHECK(sched_piece_slots(sc, q) == peak[c]);
							CHECK(peak[c] <= sc->stage[s].nslots);
							sum += peak[c];
						}
						CHECK(sum >= sc->stage[s].nslots);
						free(f);
						free(b);
						free(w);
						free(held);
						free(live);
						free(peak);
						free(lastw);
					}
					seen++;
					sched_free(sc);
				}
	CHECK(seen > 150);
}

/* interleaved with one chunk is 1f1b, action for action. */
TEST(test_interleaved_one_chunk_is_1f1b)
{
	char err[256];
	for (int S = 1; S <= 8; S++)
		for (int M = 1; M <= 16; M++) {
			struct schedule *a = sched_build(SCHED_1F1B, S, M, 2, err, sizeof(err));
			struct schedule *b = sched_build_virtual(SCHED_INTERLEAVED, S, M, 1, 2, 0, err,
								 sizeof(err));
			CHECK(a && b);
			for (int s = 0; a && b && s < S; s++) {
				CHECK(a->stage[s].n == b->stage[s].n);
				CHECK(!memcmp(a->stage[s].a, b->stage[s].a,
					      sizeof(*a->stage[s].a) * a->stage[s].n));
				CHECK(a->stage[s].nslots == b->stage[s].nslots);
			}
			sched_free(a);
			sched_free(b);
		}
}

/* Megatron-LM's interleaved order, enumerated here as its groups: the
 * forwards go through groups of S micro-batches, each group over chunks
 * 0..V-1 in turn (S units per chunk); the backwards the same with the
 * chunks reversed; stage s warms up with (S-s-1)*2 + (V-1)*S forwards (all
 * of them when M = S), then one forward one backward, then the rest. */
TEST(test_interleaved_follows_megatron)
{
	char err[256];
	for (int S = 1; S <= 8; S++)
		for (int V = 2; V <= 4; V++)
			for (int M = S; M <= 16; M += S) {
				struct schedule *sc = sched_build_virtual(SCHED_INTERLEAVED, S, M, V, 1, 0,
									  err, sizeof(err));
				CHECK(sc);
				int total = M * V, *fm = xmalloc(sizeof(int) * total);
				int *fc = xmalloc(sizeof(int) * total), *bc = xmalloc(sizeof(int) * total);
				int k = 0;
				for (int g = 0; g < M / S; g++)
					for (int c = 0; c < V; c++)
						for (int i = 0; i < S; i++, k++)
							fm[k] = g * S + i, fc[k] = c, bc[k] = V - 1 - c;
				for (int s = 0; sc && s < S; s++) {
					int warm = M == S ? total : (S - s - 1) * 2 + (V - 1) * S;
					warm = warm < total ? warm : total;
					/* the compute actions expected, in order */
					int ne = 0, *eop = xmalloc(sizeof(int) * 2 * total);
					int *emb = xmalloc(sizeof(int) * 2 * total);
					int *ech = xmalloc(sizeof(int) * 2 * total);
#define PUT(o, j, ch) (eop[ne] = (o), emb[ne] = fm[j], ech[ne] = (ch), ne++)
					for (int j = 0; j < warm; j++)
						PUT(SCHED_FORWARD, j, fc[j]);
					for (int j = 0; j < total - warm; j++) {
						PUT(SCHED_FORWARD, j + warm, fc[j + warm]);
						PUT(SCHED_BACKWARD, j, bc[j]);
					}
					for (int j = total - warm; j < total; j++)
						PUT(SCHED_BACKWARD, j, bc[j]);
#undef PUT
					int n, got = 0;
					const struct sched_action *a = sched_actions(sc, s, &n);
					for (int i = 0; i < n; i++) {
						if (a[i].op != SCHED_FORWARD && a[i].op != SCHED_BACKWARD)
							continue;
						CHECK_MSG(got < ne && a[i].op == eop[got] &&
								  a[i].mb == emb[got] && a[i].chunk == ech[got],
							  "S=%d V=%d M=%d stage %d compute %d", S, V, M, s,
							  got);
						got++;
					}
					CHECK(got == ne);
					free(eop);
					free(emb);
					free(ech);
				}
				free(fm);
				free(fc);
				free(bc);
				sched_free(sc);
			}
}

static double bubble_of(int kind, int S, int M, int V, double wfrac)
{
	char err[256];
	struct schedule *sc = sched_build_virtual(kind, S, M, V, 1, 0, err, sizeof(err));
	if (!sc)
		return -1;
	struct sim_times t = {.fwd = 1, .bwd = 2, .wfrac = wfrac};
	struct sim_result r;
	double b = sched_simulate(sc, &t, &r) ? -1 : r.bubble;
	if (b >= 0)
		sim_result_free(&r);
	sched_free(sc);
	return b;
}

/* The simulated bubbles with F = B = W (fwd 1, bwd 2 split in halves, no
 * messages) against the papers' formulas: 1f1b (S-1)/(M+S-1); interleaved
 * (S-1)/(V*M+S-1) (Narayanan et al. 2021: the bubble shrinks by V); zb-h1
 * (S-1)/(3M+S-1) (Qi et al. 2024: (S-1)(F+B-W) idle per stage); zb-v about
 * half of zb-h1's (its chunks are half stages) for M >= 2S, exactly the
 * warm-up's (S-1) half forwards per stage: (S-1)/(6M+S-1); and
 * sched_bubble_published agrees. */
TEST(test_bubbles_match_the_published_formulas)
{
	char err[256], text[64];
	for (int S = 2; S <= 8; S++)
		for (int M = S; M <= 16; M += S) {
			double f1 = bubble_of(SCHED_1F1B, S, M, 1, 0);
			CHECK_NEAR(f1, (double)(S - 1) / (M + S - 1), 1e-9);
			for (int V = 2; V <= 4; V++) {
				double want = (double)(S - 1) / (V * M + S - 1);
				CHECK_NEAR(bubble_of(SCHED_INTERLEAVED, S, M, V, 0), want, 1e-9);
				struct schedule *sc = sched_build_virtual(SCHED_INTERLEAVED, S, M, V, 1, 0,
									  err, sizeof(err));
				CHECK_NEAR(sched_bubble_published(sc, text, sizeof(text)), want, 1e-12);
				sched_free(sc);
			}
			double h1 = bubble_of(SCHED_ZBH1, S, M, 1, 0);
			CHECK_NEAR(h1, (double)(S - 1) / (3 * M + S - 1), 1e-9);
			CHECK(h1 < f1);
			if (M >= 2 * S) {
				double v = bubble_of(SCHED_ZBV, S, M, 2, 0);
				CHECK_MSG(v >= 0 && v < 0.55 * h1, "zb-v S=%d M=%d: %g, zb-h1 %g", S, M,
					  v, h1);
				/* the warm-up's (S-1) half forwards per stage, nothing else */
				CHECK_NEAR(v, (double)(S - 1) / (6 * M + S - 1), 1e-9);
			}
		}
	/* 2bw-zb: 2bw's stream with zb-h1's W's; a segment of n steps idles
	 * (S-1)(F+B-W) per stage where 2bw idles (S-1)(F+B+W), none in the
	 * steady state */
	for (int S = 2; S <= 8; S++)
		for (int M = S; M <= 2 * S; M += S) {
			char e[256];
			struct sim_times t = {.fwd = 1, .bwd = 2};
			struct schedule *a = sched_build(SCHED_2BW, S, M, 6, e, sizeof(e));
			struct schedule *b = sched_build(SCHED_2BW_ZB, S, M, 6, e, sizeof(e));
			struct sim_result ra, rb;
			CHECK(a && b && sched_simulate(a, &t, &ra) == 0 && sched_simulate(b, &t, &rb) == 0);
			CHECK_NEAR(ra.bubble, (double)(S - 1) / (6 * M + S - 1), 1e-9);
			CHECK_NEAR(rb.bubble, (double)(S - 1) / (3 * 6 * M + S - 1), 1e-9);
			CHECK_NEAR(rb.steady_bubble, 0, 1e-12);
			CHECK(b->stage[0].nversions == 2);
			sim_result_free(&ra);
			sim_result_free(&rb);
			sched_free(a);
			sched_free(b);
		}
	/* a W heavier than B: zb-h1 still ahead of 1f1b */
	CHECK(bubble_of(SCHED_ZBH1, 4, 8, 1, 0.7) < bubble_of(SCHED_1F1B, 4, 8, 1, 0));
}

/* Splitting and chunking moves work, it never adds any: each stage is busy
 * M*(fwd+bwd) per step whatever V and the W share. zb-h1 holds 1F1B's
 * activation memory (stage 0's peak S on every stage); zb-v holds 2S half
 * stages, also S micro-batches of the whole stage; the V handoff is local. */
TEST(test_busy_time_and_memory)
{
	char err[256];
	for (size_t k = 0; k < ARRAY_SIZE(new_kinds); k++)
		for (int S = 1; S <= 6; S++)
			for (int M = 2 * S; M <= 12; M += S) {
				int kind = new_kinds[k];
				int V = kind == SCHED_INTERLEAVED || kind == SCHED_ZBV ? 2 : 1;
				struct schedule *sc = sched_build_virtual(kind, S, M, V, 1, 0, err,
									  sizeof(err));
				struct sim_times t = {.fwd = 1.5, .bwd = 2.5, .comm = 0.25, .wfrac = 0.3};
				struct sim_result r;
				CHECK(sc && sched_simulate(sc, &t, &r) == 0);
				for (int s = 0; s < S; s++)
					CHECK_NEAR(r.busy[s], M * 4.0, 1e-9);
				sim_result_free(&r);
				struct schedule *ref = sched_build(SCHED_1F1B, S, M, 1, err, sizeof(err));
				for (int s = 0; s < S; s++) {
					if (kind == SCHED_ZBH1 || kind == SCHED_2BW_ZB)
						CHECK(sc->stage[s].nslots <= ref->stage[0].nslots);
					if (kind == SCHED_ZBV)
						CHECK(sc->stage[s].nslots <= 2 * ref->stage[0].nslots);
					if (kind != SCHED_INTERLEAVED)
						CHECK(sc->stage[s].npending >= 1);
				}
				if (kind == SCHED_ZBV) { /* no message from stage S-1 to itself */
					int n;
					const struct sched_action *a = sched_actions(sc, S - 1, &n);
					for (int i = 0; i < n; i++)
						CHECK(a[i].peer != S - 1);
				}
				sched_free(ref);
				sched_free(sc);
			}
}

/* A copy of stage s's actions that the test may break. */
static void own_stage(struct schedule *sc, int s)
{
	struct sched_stage *st = &sc->stage[s];
	struct sched_action *a = xmalloc(sizeof(*a) * st->n);
	memcpy(a, st->a, sizeof(*a) * st->n);
	free(st->a);
	st->a = a;
}

static int find(const struct schedule *sc, int s, enum sched_op op, int mb, int c)
{
	for (int i = 0; i < sc->stage[s].n; i++) {
		const struct sched_action *a = &sc->stage[s].a[i];
		if (a->op == op && a->mb == mb && a->chunk == c)
			return i;
	}
	return -1;
}

/* Move action i of stage s to position j (the others shift). */
static void move(struct schedule *sc, int s, int i, int j)
{
	struct sched_action *a = sc->stage[s].a, tmp = a[i];
	if (i < j)
		memmove(a + i, a + i + 1, sizeof(tmp) * (j - i));
	else
		memmove(a + j + 1, a + j, sizeof(tmp) * (i - j));
	a[j] = tmp;
}

static struct schedule *fresh(int kind, int S, int M, int V)
{
	char err[256];
	struct schedule *sc = sched_build_virtual(kind, S, M, V, 1, 0, err, sizeof(err));
	for (int s = 0; sc && s < S; s++)
		own_stage(sc, s);
	return sc;
}

TEST(test_check_rejects_mutated_lists)
{
	char why[512];
	struct schedule *sc;
	int i, j;

	/* a W before its B */
	sc = fresh(SCHED_ZBH1, 3, 6, 1);
	i = find(sc, 1, SCHED_BACKWARD_WEIGHT, 2, 0);
	j = find(sc, 1, SCHED_BACKWARD_INPUT, 2, 0);
	CHECK(i > j && j > 0);
	move(sc, 1, i, j);
	CHECK(sched_check(sc, why, sizeof(why)) == -1);
	CHECK_MSG(strstr(why, "before its BACKWARD_INPUT"), "%s", why);
	sched_free(sc);

	/* W's of a chunk out of micro-batch order (both after their B's) */
	sc = fresh(SCHED_ZBH1, 3, 4, 1); /* stage 2 puts off W2 and W3 past B3 */
	i = find(sc, 2, SCHED_BACKWARD_WEIGHT, 2, 0);
	j = find(sc, 2, SCHED_BACKWARD_WEIGHT, 3, 0);
	CHECK(i >= 0 && j > i && find(sc, 2, SCHED_BACKWARD_INPUT, 3, 0) < i);
	struct sched_action tmp = sc->stage[2].a[i];
	sc->stage[2].a[i] = sc->stage[2].a[j];
	sc->stage[2].a[j] = tmp;
	CHECK(sched_check(sc, why, sizeof(why)) == -1);
	CHECK_MSG(strstr(why, "not in ascending micro-batch order"), "%s", why);
	sched_free(sc);

	/* a missing send: stage 1 would wait for ever */
	sc = fresh(SCHED_INTERLEAVED, 2, 4, 2);
	i = find(sc, 1, SCHED_SEND_ACT, 1, 0); /* stage 1 chunk 0 -> stage 0 chunk 1 */
	CHECK(i >= 0 && sc->stage[1].a[i].peer == 0);
	move(sc, 1, i, sc->stage[1].n - 1);
	sc->stage[1].n--;
	CHECK(sched_check(sc, why, sizeof(why)) == -1);
	CHECK_MSG(strstr(why, "activation or gradient missing"), "%s", why);
	sc->stage[1].n++;
	sched_free(sc);

	/* the V's turn on stage S-1: chunk 1's forward before chunk 0 hands it over */
	sc = fresh(SCHED_ZBV, 2, 4, 2);
	i = find(sc, 1, SCHED_FORWARD, 0, 1);
	j = find(sc, 1, SCHED_FORWARD, 0, 0);
	CHECK(i > j && j >= 0);
	move(sc, 1, i, j);
	CHECK(sched_check(sc, why, sizeof(why)) == -1);
	CHECK_MSG(strstr(why, "before chunk 0 hands it over"), "%s", why);
	sched_free(sc);

	/* and chunk 0's input gradient before chunk 1's */
	sc = fresh(SCHED_ZBV, 2, 4, 2);
	i = find(sc, 1, SCHED_BACKWARD_INPUT, 1, 0);
	j = find(sc, 1, SCHED_BACKWARD_INPUT, 1, 1);
	CHECK(i > j && j >= 0);
	move(sc, 1, i, j);
	CHECK(sched_check(sc, why, sizeof(why)) == -1);
	CHECK_MSG(strstr(why, "hands its gradient over"), "%s", why);
	sched_free(sc);

	/* a fused BACKWARD inside a split schedule */
	sc = fresh(SCHED_ZBH1, 2, 2, 1);
	i = find(sc, 0, SCHED_BACKWARD_INPUT, 0, 0);
	sc->stage[0].a[i].op = SCHED_BACKWARD;
	CHECK(sched_check(sc, why, sizeof(why)) == -1);
	CHECK_MSG(strstr(why, "splits the backward"), "%s", why);
	sched_free(sc);

	/* a receive naming the wrong chunk */
	sc = fresh(SCHED_INTERLEAVED, 2, 2, 2);
	i = find(sc, 0, SCHED_RECV_ACT, 0, 1);
	CHECK(i >= 0);
	sc->stage[0].a[i].chunk = 0;
	CHECK(sched_check(sc, why, sizeof(why)) == -1);
	sched_free(sc);

	/* a slot that W does not free: the next forward finds it held */
	sc = fresh(SCHED_ZBH1, 1, 3, 1);
	i = find(sc, 0, SCHED_BACKWARD_WEIGHT, 0, 0);
	sc->stage[0].a[i].slot = 1;
	CHECK(sched_check(sc, why, sizeof(why)) == -1);
	CHECK_MSG(strstr(why, "slot"), "%s", why);
	sched_free(sc);
}

/* Chunks share their stages' channels: on interleaved's stage 0 -> 1
 * activations, chunk 1's micro-batch 0 sent before chunk 0's micro-batch 1
 * when stage 1 expects the other order is what NCCL would pair wrongly. */
TEST(test_channel_order_sees_chunks)
{
	char why[512];
	struct schedule *sc = fresh(SCHED_INTERLEAVED, 2, 4, 2);
	int i = find(sc, 0, SCHED_SEND_ACT, 1, 0), j = find(sc, 0, SCHED_SEND_ACT, 0, 1);
	CHECK(i >= 0 && j > i);
	struct sched_action tmp = sc->stage[0].a[i];
	sc->stage[0].a[i] = sc->stage[0].a[j];
	sc->stage[0].a[j] = tmp;
	CHECK(sched_check_channel_order(sc, why, sizeof(why)) == -1);
	CHECK_MSG(strstr(why, "activations 0 -> 1") && strstr(why, "chunk 1 of stage 1") &&
			  strstr(why, "by their order"), "%s", why);
	sched_free(sc);
}

static void timeline_text(const struct schedule *sc, const struct sim_result *r, char *text,
			  size_t len)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/timeline.txt", test_tmpdir());
	FILE *fp = fopen(path, "w+");
	sched_print_timeline(fp, sc, r, 200, 0);
	rewind(fp);
	size_t n = fread(text, 1, len - 1, fp);
	text[n] = 0;
	fclose(fp);
}

TEST(test_timeline_draws_b_w_and_chunks)
{
	char err[128], text[8192], path[512];
	struct sim_times t = {.fwd = 1, .bwd = 2};
	struct sim_result r;
	struct schedule *sc = sched_build(SCHED_ZBH1, 2, 2, 1, err, sizeof(err));
	CHECK(sc && sched_simulate(sc, &t, &r) == 0);
	timeline_text(sc, &r, text, sizeof(text));
	CHECK_MSG(strstr(text, "stage 0 | F0 F1 .  B0 W0 B1 W1\n"), "%s", text);
	CHECK_MSG(strstr(text, "stage 1 | .  F0 B0 F1 B1 W0 W1\n"), "%s", text);
	CHECK(strstr(text, "W weight gradient"));
	sim_result_free(&r);
	sched_free(sc);

	sc = sched_build(SCHED_ZBV, 1, 2, 1, err, sizeof(err));
	CHECK(sc && sched_simulate(sc, &t, &r) == 0);
	timeline_text(sc, &r, text, sizeof(text));
	/* one column is half a forward: a chunk's F, B and W take one each;
	 * torch's order for one stage: F0a, (F0b B0b W0b), F1a B0a W0a F1b B1b
	 * W1b, B1a W1a */
	CHECK_MSG(strstr(text, "stage 0 | F0a F0b B0b W0b F1a B0a W0a F1b B1b W1b B1a W1a\n"),
		  "%s", text);
	snprintf(path, sizeof(path), "%s/zbv.svg", test_tmpdir());
	CHECK(sched_write_svg(path, sc, &r) == 0);
	struct buf b = {0};
	CHECK(read_file(path, &b) == 0);
	CHECK(strstr((char *)b.data, "weight gradient (W)"));
	CHECK(strstr((char *)b.data, "fill-opacity"));
	CHECK(strstr((char *)b.data, "BACKWARD_WEIGHT mb 1 chunk 1"));
	buf_free(&b);
	sim_result_free(&r);
	sched_free(sc);
}

/* The steady-state window of the asynchronous kinds spans whole periods:
 * one stage's 2bw step takes exactly M*(fwd+bwd) + optim; 2bw-zb, which only
 * moves W's, has 2bw's period without message latency and is never slower
 * with it (its W's fill the waits). The window once ended at a step's last
 * backward, leaving out the last optimizer step. */
TEST(test_steady_window_is_whole_periods)
{
	char err[256];
	for (int S = 1; S <= 4; S++)
		for (int M = S; M <= 2 * S; M += S)
			for (int c = 0; c < 2; c++) {
				struct sim_times t = {.fwd = 1, .bwd = 2, .optim = 0.5, .comm = 0.25 * c};
				double period[2];
				for (int k = 0; k < 2; k++) {
					struct schedule *sc = sched_build(k ? SCHED_2BW_ZB : SCHED_2BW, S,
									  M, 12, err, sizeof(err));
					struct sim_result r;
					CHECK(sc && sched_simulate(sc, &t, &r) == 0);
					CHECK(r.steady_hi > r.steady_lo);
					period[k] = (r.steady_t1 - r.steady_t0) /
						    (r.steady_hi - r.steady_lo);
					if (S == 1)
						CHECK_NEAR(period[k], M * 3.0 + 0.5, 1e-9);
					sim_result_free(&r);
					sched_free(sc);
				}
				if (c)
					CHECK(period[1] <= period[0] + 1e-9);
				else
					CHECK_NEAR(period[1], period[0], 1e-9);
			}
}

/* Evaluation's forward-only lists (sched_build_forward): every (mb, piece)
 * forwarded exactly once on its piece's stage, after the piece before it
 * when that is the same stage's, RECV_ACT
 * right before a forward whose previous piece is another stage's and
 * SEND_ACT right after one whose next piece is; the channels pair up in
 * order (the nccl transport's condition); run in lockstep (each stage
 * taking its next action when its receive's message was sent) the lists
 * finish: no stage waits on one that waits on it. */
TEST(test_forward_lists_evaluate_every_piece_once_without_deadlock)
{
	static const int kinds[] = {SCHED_1F1B, SCHED_INTERLEAVED, SCHED_ZBV};
	char err[256], why[256];
	for (size_t k = 0; k < ARRAY_SIZE(kinds); k++)
		for (int S = 1; S <= 6; S++)
			for (int V = 1; V <= 3; V++)
				for (int n = 0; n <= 5; n += 5) {
					int kind = kinds[k];
					if (kind != SCHED_INTERLEAVED &&
					    V != (kind == SCHED_ZBV ? 2 : 1))
						continue;
					struct schedule *sc =
						sched_build_forward(kind, S, V, n, err, sizeof(err));
					CHECK_MSG(sc, "%s", err);
					if (!sc)
						continue;
					int P = S * V;
					CHECK(sched_check_channel_order(sc, why, sizeof(why)) == 0);
					int *done = xcalloc((size_t)(n + 1) * P, sizeof(int));
					int *sent = xcalloc((size_t)(n + 1) * P, sizeof(int));
					int *at = xcalloc((size_t)S, sizeof(int));
					/* lockstep: a receive waits for its send */
					for (int moved = 1; moved;) {
						moved = 0;
						for (int s = 0; s < S; s++) {
							int na;
							const struct sched_action *a =
								sched_actions(sc, s, &na);
							while (at[s] < na) {
								const struct sched_action *x = &a[at[s]];
								int p = piece_of(kind, S, s, x->chunk);
								size_t u = (size_t)x->mb * P + p;
								if (x->op == SCHED_RECV_ACT) {
									if (!sent[u - 1])
										break;
									CHECK(at[s] + 1 < na &&
									      a[at[s] + 1].op ==
										      SCHED_FORWARD);
								} else if (x->op == SCHED_FORWARD) {
									CHECK(!done[u]++);
									CHECK(p == 0 ||
									      stage_of(kind, S, V, p - 1) !=
										      s ||
									      done[u - 1]);
									if (p + 1 < P &&
									    stage_of(kind, S, V, p + 1) == s)
										sent[u] = 1;
								} else {
									CHECK(x->op == SCHED_SEND_ACT &&
									      p + 1 < P);
									sent[u] = 1;
								}
								at[s]++;
								moved = 1;
							}
						}
					}
					for (int s = 0; s < S; s++) {
						int na;
						sched_actions(sc, s, &na);
						CHECK_MSG(at[s] == na, "%s S=%d V=%d n=%d: stage %d stuck",
							  sched_kind_name(kind), S, V, n, s);
					}
					for (int u = 0; u < n * P; u++)
						CHECK(done[u] == 1);
					free(done);
					free(sent);
					free(at);
					sched_free(sc);
				}
}
