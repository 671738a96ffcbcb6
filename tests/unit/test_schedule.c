/* test_schedule.c - pipeline schedules: each kind's invariants, asserted here
 * directly on the action lists (not only through sched_check), the bubble
 * of the simulator against (S-1)/(M+S-1), and the checker rejecting broken
 * lists. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/util.h"
#include "../../sched/schedule.h"
#include "../test.h"

static const int Ss[] = {1, 2, 3, 4, 7};
static const int Ms[] = {1, 2, 3, 4, 8};
static const int Ns[] = {1, 3};

/* Call body(sc) for every kind and (S, M, n_steps) above, at first_step g. */
#define FOR_EACH_SCHEDULE(g, sc)                                                  \
	for (int k_ = 0; k_ < SCHED_NKINDS_FUSED; k_++)                                 \
		for (size_t is_ = 0; is_ < ARRAY_SIZE(Ss); is_++)                 \
			for (size_t im_ = 0; im_ < ARRAY_SIZE(Ms); im_++)         \
				for (size_t in_ = 0; in_ < ARRAY_SIZE(Ns); in_++) \
					for (struct schedule *sc = build(k_, Ss[is_], Ms[im_], Ns[in_], g); \
					     sc; sched_free(sc), sc = NULL)

static struct schedule *build(int kind, int S, int M, int n, long g)
{
	char err[256];
	if (kind == SCHED_2BW && M < S)
		return NULL;
	if (kind == SCHED_PIPEDREAM)
		n *= 2 * S; /* long enough to reach the steady state */
	struct schedule *sc = sched_build_at(kind, S, M, n, g, err, sizeof(err));
	if (!sc)
		fprintf(stderr, "build %s S=%d M=%d n=%d: %s\n", sched_kind_name(kind), S, M, n, err);
	return sc;
}

#define WHERE(sc, s)                                                             \
	"%s S=%d M=%d n=%d first=%ld stage %d", sched_kind_name((sc)->kind), (sc)->S, \
		(sc)->M, (sc)->n_steps, (sc)->first_step, (s)

TEST(test_all_pass_check)
{
	char why[512];
	int count = 0;
	for (long g = 0; g <= 5; g += 5) {
		FOR_EACH_SCHEDULE(g, sc)
		{
			CHECK_MSG(sched_check(sc, why, sizeof(why)) == 0, "%s S=%d M=%d n=%d: %s",
				  sched_kind_name(sc->kind), sc->S, sc->M, sc->n_steps, why);
			count++;
		}
	}
	CHECK(count > 300);
}

/* Every schedule the transports may be asked to run, S <= 16 and M <= 32
 * (two steps; pipedream long enough for its steady state), passes every
 * invariant of sched_check, among them: each receive is matched by exactly
 * one send of its peer, and the stages' lists run to completion when sends
 * never block (what the local and mpi transports do: Isend into a pool),
 * so no pair of ranks can deadlock whatever the timing. A check over the
 * tables, not a timing. */
TEST(test_every_schedule_up_to_16_stages_is_deadlock_free)
{
	char why[512];
	int count = 0;
	for (int kind = 0; kind < SCHED_NKINDS_FUSED; kind++)
		for (int S = 1; S <= 16; S++)
			for (int M = 1; M <= 32; M++) {
				if (kind == SCHED_2BW && M < S)
					continue;
				if (kind == SCHED_PIPEDREAM && M > 1)
					continue; /* M only sets its report window */
				char err[256];
				int n = kind == SCHED_PIPEDREAM ? 4 * S : 2;
				struct schedule *sc = sched_build(kind, S, M, n, err, sizeof(err));
				CHECK_MSG(sc != NULL, "%s S=%d M=%d: %s", sched_kind_name(kind), S, M, err);
				if (!sc)
					continue;
				CHECK_MSG(sched_check(sc, why, sizeof(why)) == 0, "%s S=%d M=%d: %s",
					  sched_kind_name(kind), S, M, why);
				sched_free(sc);
				count++;
			}
	CHECK(count > 1000);
}

TEST(test_each_microbatch_once_per_stage)
{
	FOR_EACH_SCHEDULE(0, sc)
	{
		int N = sc->n_mb;
		CHECK(N == (sc->kind == SCHED_PIPEDREAM ? sc->n_steps : sc->n_steps * sc->M));
		int *nf = xcalloc((size_t)N, sizeof(int)), *nb = xcalloc((size_t)N, sizeof(int));
		for (int s = 0; s < sc->S; s++) {
			int n;
			const struct sched_action *a = sched_actions(sc, s, &n);
			memset(nf, 0, (size_t)N * sizeof(int));
			memset(nb, 0, (size_t)N * sizeof(int));
			for (int i = 0; i < n; i++) {
				if (a[i].op == SCHED_FORWARD) {
					CHECK(nb[a[i].mb] == 0);
					nf[a[i].mb]++;
				}
				if (a[i].op == SCHED_BACKWARD) {
					CHECK(nf[a[i].mb] == 1);
					nb[a[i].mb]++;
				}
			}
			for (int mb = 0; mb < N; mb++)
				CHECK_MSG(nf[mb] == 1 && nb[mb] == 1, WHERE(sc, s));
		}
		free(nf);
		free(nb);
	}
}

/* Simulated start/end times: forward of mb on s starts after it ended on
 * s-1 plus the message latency, backward after it ended on s+1; every list
 * completes (no deadlock). Uneven per-stage times. */
TEST(test_cross_stage_order_and_no_deadlock)
{
	FOR_EACH_SCHEDULE(0, sc)
	{
		int S = sc->S, N = sc->n_mb;
		struct sim_times *t = xmalloc(sizeof(*t) * S);
		for (int s = 0; s < S; s++)
			t[s] = (struct sim_times){.fwd = 1 + 0.25 * (s % 3), .bwd = 2 + 0.5 * (s % 2),
						  .comm = 0.125, .optim = 0.5};
		struct sim_result r;
		CHECK(sched_simulate_stages(sc, t, &r) == 0);
		double *fend = xmalloc(sizeof(double) * S * N), *bend = xmalloc(sizeof(double) * S * N);
		double *fst = xmalloc(sizeof(double) * S * N), *bst = xmalloc(sizeof(double) * S * N);
		for (int s = 0; s < S; s++) {
			int n;
			const struct sched_action *a = sched_actions(sc, s, &n);
			for (int i = 0; i < n; i++) {
				CHECK(r.end[s][i] >= r.start[s][i]);
				CHECK(i == 0 || r.start[s][i] >= r.end[s][i - 1]);
				if (a[i].op == SCHED_FORWARD)
					fst[s * N + a[i].mb] = r.start[s][i], fend[s * N + a[i].mb] = r.end[s][i];
				if (a[i].op == SCHED_BACKWARD)
					bst[s * N + a[i].mb] = r.start[s][i], bend[s * N + a[i].mb] = r.end[s][i];
			}
		}
		for (int s = 0; s < S; s++)
			for (int mb = 0; mb < N; mb++) {
				if (s > 0)
					CHECK_MSG(fst[s * N + mb] >= fend[(s - 1) * N + mb] + 0.125,
						  WHERE(sc, s));
				if (s < S - 1)
					CHECK_MSG(bst[s * N + mb] >= bend[(s + 1) * N + mb] + 0.125,
						  WHERE(sc, s));
				CHECK(bst[s * N + mb] >= fend[s * N + mb]);
			}
		free(fend);
		free(bend);
		free(fst);
		free(bst);
		free(t);
		sim_result_free(&r);
	}
}

TEST(test_backwards_ascending)
{
	FOR_EACH_SCHEDULE(0, sc)
	{
		for (int s = 0; s < sc->S; s++) {
			int n, last = -1;
			const struct sched_action *a = sched_actions(sc, s, &n);
			for (int i = 0; i < n; i++)
				if (a[i].op == SCHED_BACKWARD) {
					CHECK_MSG(a[i].mb == last + 1, WHERE(sc, s));
					last = a[i].mb;
				}
		}
	}
}

/* In flight = forwarded and not yet backwarded; slots of in-flight
 * micro-batches are distinct and below nslots. */
TEST(test_inflight_and_slots)
{
	FOR_EACH_SCHEDULE(0, sc)
	{
		int S = sc->S, M = sc->M;
		for (int s = 0; s < S; s++) {
			int n, inflight = 0, peak = 0;
			const struct sched_action *a = sched_actions(sc, s, &n);
			const struct sched_stage *st = sched_stage(sc, s);
			int *held = xcalloc((size_t)st->nslots + 1, sizeof(int));
			for (int i = 0; i < n; i++) {
				if (a[i].op == SCHED_FORWARD) {
					CHECK(a[i].slot >= 0 && a[i].slot < st->nslots);
					CHECK(!held[a[i].slot]);
					held[a[i].slot] = 1;
					inflight++;
					peak = MAX(peak, inflight);
				} else if (a[i].op == SCHED_BACKWARD) {
					CHECK(held[a[i].slot]);
					held[a[i].slot] = 0;
					inflight--;
				}
			}
			free(held);
			CHECK(inflight == 0);
			CHECK(st->nslots == peak);
			switch (sc->kind) {
			case SCHED_GPIPE:
				CHECK_MSG(peak == M, WHERE(sc, s));
				break;
			case SCHED_1F1B:
				CHECK_MSG(peak == MIN(S - s, M), WHERE(sc, s));
				break;
			default:
				CHECK_MSG(peak <= S - s, WHERE(sc, s));
				if (sc->n_mb >= S)
					CHECK_MSG(peak == S - s, WHERE(sc, s));
				break;
			}
		}
	}
}

/* Versions: the one a forward uses exists (enough updates done before it
 * in the list), its backward uses the same, the kind's formula holds, and
 * the peak alive is 1 / 2 / S-s. */
TEST(test_versions)
{
	for (long g = 0; g <= 5; g += 5) {
		FOR_EACH_SCHEDULE(g, sc)
		{
			int S = sc->S, N = sc->n_mb;
			int *fv = xmalloc(sizeof(int) * N);
			for (int s = 0; s < S; s++) {
				int n, done = 0, d = S - 1 - s;
				const struct sched_action *a = sched_actions(sc, s, &n);
				for (int i = 0; i < n; i++) {
					const struct sched_action *x = &a[i];
					if (x->op == SCHED_OPTIM_STEP) {
						CHECK(x->version == ++done);
						continue;
					}
					if (x->op != SCHED_FORWARD && x->op != SCHED_BACKWARD)
						continue;
					long gt = g + (sc->kind == SCHED_PIPEDREAM ? x->mb : x->mb / sc->M);
					long want = sc->kind == SCHED_2BW ? MAX(gt - 1, 0) - g :
						    sc->kind == SCHED_PIPEDREAM ? MAX(gt - d, 0) - g :
										  gt - g;
					CHECK_MSG(x->version == want, WHERE(sc, s));
					CHECK_MSG(x->version <= done, WHERE(sc, s));
					if (x->op == SCHED_FORWARD)
						fv[x->mb] = x->version;
					else
						CHECK(x->version == fv[x->mb]);
				}
				int nv = sched_stage(sc, s)->nversions;
				if (!sched_kind_async(sc->kind))
					CHECK_MSG(nv == 1, WHERE(sc, s));
				else if (sc->kind == SCHED_2BW)
					CHECK_MSG(nv == (sc->n_steps >= 2 || g ? 2 : 1), WHERE(sc, s));
				else
					CHECK_MSG(nv == S - s, WHERE(sc, s));
			}
			free(fv);
		}
	}
}

/* 2BW: when step t's first forward runs on a stage, the updates done there
 * already include t-1 (so version t-1 exists), and the step's version is
 * the newest or the one before it: only two are ever needed. */
TEST(test_2bw_version_ready_before_step)
{
	int cases = 0;
	for (int S = 1; S <= 8; S++)
		for (int M = S; M <= S + 5; M += 2)
			for (long g = 0; g <= 3; g += 3) {
				char err[128];
				struct schedule *sc = sched_build_at(SCHED_2BW, S, M, 6, g, err, sizeof(err));
				CHECK(sc);
				for (int s = 0; s < S; s++) {
					int n, done = 0, seen = -1;
					const struct sched_action *a = sched_actions(sc, s, &n);
					for (int i = 0; i < n; i++) {
						if (a[i].op == SCHED_OPTIM_STEP)
							done++;
						if (a[i].op != SCHED_FORWARD || a[i].step == seen)
							continue;
						int t = seen = a[i].step;
						long v = MAX(g + t - 1, 0) - g;
						CHECK_MSG(done >= v, "S=%d M=%d stage %d step %d: %d updates "
							  "done", S, M, s, t, done);
						CHECK_MSG(done - v <= 1, "S=%d M=%d stage %d step %d", S, M,
							  s, t);
						cases++;
					}
				}
				sched_free(sc);
			}
	CHECK(cases > 100);
}

/* The delay of each update: step t minus the version its gradients were
 * computed on. 0 for sync, 1 for 2bw (0 for the very first step),
 * S-1-s for pipedream (less while the stash is still filling). */
TEST(test_update_delays)
{
	for (long g = 0; g <= 5; g += 5) {
		FOR_EACH_SCHEDULE(g, sc)
		{
			for (int s = 0; s < sc->S; s++) {
				int n, gv = -1000, steps = 0;
				const struct sched_action *a = sched_actions(sc, s, &n);
				for (int i = 0; i < n; i++) {
					if (a[i].op == SCHED_BACKWARD)
						gv = a[i].version;
					if (a[i].op != SCHED_OPTIM_STEP)
						continue;
					long gt = g + a[i].step, want;
					if (sc->kind == SCHED_2BW)
						want = gt > 0;
					else if (sc->kind == SCHED_PIPEDREAM)
						want = MIN(gt, sc->S - 1 - s);
					else
						want = 0;
					CHECK_MSG(a[i].step - gv == want, WHERE(sc, s));
					steps++;
				}
				CHECK(steps == sched_stage(sc, s)->nupdates);
				if (sc->kind == SCHED_PIPEDREAM)
					CHECK(sched_stage(sc, s)->delay_max == sc->S - 1 - s);
			}
		}
	}
}

/* Replay the weight buffers: every version a forward, backward or update
 * reads is still in its buffer (never overwritten by a newer one). */
TEST(test_weight_buffers_never_clobbered)
{
	for (long g = 0; g <= 5; g += 5) {
		FOR_EACH_SCHEDULE(g, sc)
		{
			for (int s = 0; s < sc->S; s++) {
				const struct sched_stage *st = sched_stage(sc, s);
				int *holds = xmalloc(sizeof(int) * st->nversions);
				for (int b = 0; b < st->nversions; b++)
					holds[b] = -1000;
				for (int v = st->vmin; v <= 0; v++) {
					int b = sched_version_buffer(sc, s, v);
					if (b >= 0)
						holds[b] = v;
				}
				int n;
				const struct sched_action *a = sched_actions(sc, s, &n);
				for (int i = 0; i < n; i++) {
					if (a[i].op == SCHED_FORWARD || a[i].op == SCHED_BACKWARD) {
						CHECK_MSG(holds[a[i].wbuf] == a[i].version, WHERE(sc, s));
					} else if (a[i].op == SCHED_OPTIM_STEP) {
						int from = sched_version_buffer(sc, s, a[i].version - 1);
						CHECK(from >= 0 && holds[from] == a[i].version - 1);
						holds[a[i].wbuf] = a[i].version;
					}
				}
				free(holds);
			}
		}
	}
}

TEST(test_sync_bubble_matches_formula)
{
	static const int S_[] = {1, 2, 3, 4, 8, 16}, M_[] = {1, 2, 3, 4, 8, 16, 32};
	for (int kind = SCHED_GPIPE; kind <= SCHED_1F1B; kind++)
		for (size_t i = 0; i < ARRAY_SIZE(S_); i++)
			for (size_t j = 0; j < ARRAY_SIZE(M_); j++)
				for (int n = 1; n <= 2; n++) {
					char err[128];
					struct schedule *sc = sched_build(kind, S_[i], M_[j], n, err,
									  sizeof(err));
					CHECK(sc);
					struct sim_times t = {.fwd = 1, .bwd = 2};
					struct sim_result r;
					CHECK(sched_simulate(sc, &t, &r) == 0);
					double want = sched_bubble_formula(S_[i], M_[j]);
					CHECK_NEAR(r.bubble, want, 1e-12);
					CHECK_NEAR(r.makespan, 3.0 * n * (M_[j] + S_[i] - 1), 1e-9);
					for (int s = 0; s < S_[i]; s++)
						CHECK_NEAR(r.stage_bubble[s], want, 1e-12);
					sim_result_free(&r);
					sched_free(sc);
				}
}

TEST(test_async_steady_state_bubble_zero)
{
	static const int S_[] = {2, 4, 8};
	for (size_t i = 0; i < ARRAY_SIZE(S_); i++) {
		int S = S_[i];
		char err[128];
		struct sim_times t = {.fwd = 1, .bwd = 2};
		struct sim_result r;
		struct schedule *sc = sched_build(SCHED_2BW, S, 2 * S, 12, err, sizeof(err));
		CHECK(sc && sched_simulate(sc, &t, &r) == 0);
		CHECK(r.steady_hi > r.steady_lo && r.steady_t1 > r.steady_t0);
		CHECK_NEAR(r.steady_bubble, 0, 1e-12);
		/* the whole segment only pays one fill and drain */
		CHECK(r.bubble < sched_bubble_formula(S, 2 * S));
		sim_result_free(&r);
		sched_free(sc);

		sc = sched_build(SCHED_PIPEDREAM, S, S, 12 * S, err, sizeof(err));
		CHECK(sc && sched_simulate(sc, &t, &r) == 0);
		CHECK(r.steady_hi > r.steady_lo);
		CHECK_NEAR(r.steady_bubble, 0, 1e-12);
		sim_result_free(&r);
		sched_free(sc);

		/* communication latency shows up as bubble */
		t.comm = 0.5;
		sc = sched_build(SCHED_2BW, S, 2 * S, 12, err, sizeof(err));
		CHECK(sc && sched_simulate(sc, &t, &r) == 0);
		CHECK(r.steady_bubble > 0.01);
		sim_result_free(&r);
		sched_free(sc);
	}
}

TEST(test_2bw_rejects_fewer_microbatches_than_stages)
{
	char err[256] = "";
	CHECK(!sched_build(SCHED_2BW, 4, 3, 2, err, sizeof(err)));
	CHECK(strstr(err, "2bw") && strstr(err, "3 < 4"));
	CHECK(!sched_build(SCHED_1F1B, 0, 3, 2, err, sizeof(err)));
	CHECK(!sched_build(SCHED_GPIPE, 2, 3, 0, err, sizeof(err)));
	CHECK(!sched_build(SCHED_PIPEDREAM, 64, 1, 1 << 20, err, sizeof(err)));
	CHECK(strstr(err, "too large"));
	struct schedule *sc = sched_build(SCHED_2BW, 4, 4, 1, err, sizeof(err));
	CHECK(sc);
	sched_free(sc);
}

TEST(test_kind_names)
{
	for (int k = 0; k < SCHED_NKINDS; k++)
		CHECK(sched_kind_from_name(sched_kind_name(k)) == k);
	CHECK(sched_kind_from_name("pipedream-2bw") == SCHED_2BW);
	CHECK(sched_kind_from_name("pipedream-flush") == SCHED_1F1B);
	CHECK(sched_kind_from_name("1F1B") == -1);
	CHECK(sched_kind_from_name("") == -1);
	CHECK(sched_kind_from_name(NULL) == -1);
	CHECK(sched_kind_async(SCHED_2BW) && !sched_kind_async(SCHED_GPIPE));
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

static int find(const struct schedule *sc, int s, enum sched_op op, int mb)
{
	for (int i = 0; i < sc->stage[s].n; i++)
		if (sc->stage[s].a[i].op == op && sc->stage[s].a[i].mb == mb)
			return i;
	return -1;
}

TEST(test_check_rejects_broken_lists)
{
	char err[128], why[512];
	struct schedule *sc;
	struct sched_action tmp;
	int i, j;

	/* deadlock: stage 0 waits for mb 0's gradient before sending its activation */
	sc = sched_build(SCHED_1F1B, 2, 2, 1, err, sizeof(err));
	own_stage(sc, 0);
	i = find(sc, 0, SCHED_RECV_GRAD, 0);
	CHECK(i > 0);
	tmp = sc->stage[0].a[i];
	memmove(sc->stage[0].a + 1, sc->stage[0].a, sizeof(tmp) * i);
	sc->stage[0].a[0] = tmp;
	CHECK(sched_run(sc, NULL, NULL, NULL, why, sizeof(why)) == -1);
	CHECK(strstr(why, "deadlock"));
	CHECK(sched_check(sc, why, sizeof(why)) == -1);
	set_error_quiet(1);
	struct sim_times t = {.fwd = 1, .bwd = 2};
	struct sim_result r;
	CHECK(sched_simulate(sc, &t, &r) == -1);
	set_error_quiet(0);
	sched_free(sc);

	/* backwards out of order */
	sc = sched_build(SCHED_GPIPE, 1, 3, 1, err, sizeof(err));
	i = find(sc, 0, SCHED_BACKWARD, 0);
	j = find(sc, 0, SCHED_BACKWARD, 1);
	tmp = sc->stage[0].a[i];
	sc->stage[0].a[i] = sc->stage[0].a[j];
	sc->stage[0].a[j] = tmp;
	CHECK(sched_check(sc, why, sizeof(why)) == -1);
	CHECK(strstr(why, "ascending"));
	sched_free(sc);

	/* a backward on another version than its forward */
	sc = sched_build(SCHED_2BW, 2, 2, 3, err, sizeof(err));
	i = find(sc, 1, SCHED_BACKWARD, 3);
	sc->stage[1].a[i].version++;
	CHECK(sched_check(sc, why, sizeof(why)) == -1);
	sched_free(sc);

	/* two in-flight micro-batches in one slot */
	sc = sched_build(SCHED_GPIPE, 2, 3, 1, err, sizeof(err));
	sc->stage[0].a[find(sc, 0, SCHED_FORWARD, 1)].slot = 0;
	CHECK(sched_check(sc, why, sizeof(why)) == -1);
	CHECK(strstr(why, "slot"));
	sched_free(sc);

	/* a missing optimizer step */
	sc = sched_build(SCHED_1F1B, 2, 2, 2, err, sizeof(err));
	i = sc->stage[1].n - 1;
	CHECK(sc->stage[1].a[i].op == SCHED_OPTIM_STEP);
	sc->stage[1].n--;
	CHECK(sched_check(sc, why, sizeof(why)) == -1);
	sc->stage[1].n++;
	/* a receive from the wrong peer */
	sc->stage[1].a[find(sc, 1, SCHED_RECV_ACT, 1)].peer = 1;
	CHECK(sched_check(sc, why, sizeof(why)) == -1);
	CHECK(strstr(why, "peer"));
	sched_free(sc);

	/* pipedream: a forward that reads a version before it exists */
	sc = sched_build(SCHED_PIPEDREAM, 3, 1, 8, err, sizeof(err));
	i = find(sc, 2, SCHED_FORWARD, 4);
	sc->stage[2].a[i].version++;
	CHECK(sched_check(sc, why, sizeof(why)) == -1);
	sched_free(sc);
}

/* The replicas' sum in buckets (sim_reduce_end) against an event-by-event
 * count of the buckets: bucket i of n ready at (i+1) bwd/n, each taking
 * reduce/n after the one before it and after it is ready. */
TEST(test_reduce_end_counts_buckets)
{
	const double bwds[] = {0, 1, 3, 10}, reduces[] = {0, 0.5, 2, 7, 40};
	const int ns[] = {1, 2, 3, 8, 25};
	for (size_t i = 0; i < ARRAY_SIZE(bwds); i++)
		for (size_t j = 0; j < ARRAY_SIZE(reduces); j++)
			for (size_t k = 0; k < ARRAY_SIZE(ns); k++) {
				struct sim_times t = {.bwd = bwds[i], .reduce = reduces[j],
						      .buckets = ns[k]};
				double start = 5, sent = start;
				for (int b = 0; b < ns[k]; b++)
					sent = MAX(sent, start + (b + 1) * bwds[i] / ns[k]) +
					       reduces[j] / ns[k];
				double want = MAX(sent, start + bwds[i]);
				CHECK_NEAR(sim_reduce_end(&t, start), want, 1e-9);
			}
	struct sim_times none = {.bwd = 3, .buckets = 4};
	CHECK_NEAR(sim_reduce_end(&none, 1), 4, 0);
}

/* Every OPTIM_STEP waits for the replicas' sum its step's last backward
 * started, under every kind; with no sum the times are those of the plain
 * model, and a sum never makes a step shorter. gpipe S = 1 by hand: two
 * forwards, two backwards, then the sum not overlapped (one bucket). */
TEST(test_optim_step_waits_for_the_replicas_sum)
{
	FOR_EACH_SCHEDULE(0, sc)
	{
		int S = sc->S;
		struct sim_times *plain = xcalloc((size_t)S, sizeof(*plain));
		struct sim_times *dp = xcalloc((size_t)S, sizeof(*dp));
		for (int s = 0; s < S; s++) {
			plain[s] = (struct sim_times){.fwd = 1 + 0.25 * (s % 3), .bwd = 2,
						      .comm = 0.125, .optim = 0.5, .buckets = 3};
			dp[s] = plain[s];
			dp[s].reduce = 1.5 + s;
		}
		struct sim_result a, b, c;
		CHECK(sched_simulate_stages(sc, plain, &a) == 0);
		plain[0].buckets = 0; /* no sum: the bucket count means nothing */
		CHECK(sched_simulate_stages(sc, plain, &c) == 0);
		CHECK(sched_simulate_stages(sc, dp, &b) == 0);
		CHECK(b.makespan >= a.makespan - 1e-12);
		for (int s = 0; s < S; s++) {
			int n;
			const struct sched_action *act = sched_actions(sc, s, &n);
			double reduced = 0;
			for (int i = 0; i < n; i++) {
				CHECK(a.start[s][i] == c.start[s][i] && a.end[s][i] == c.end[s][i]);
				if (act[i].op == SCHED_BACKWARD &&
				    (act[i].mb + 1 == sc->n_mb ||
				     sched_mb_step(sc, act[i].mb + 1) != act[i].step))
					reduced = b.start[s][i] +
						  MAX(dp[s].bwd / 3 + dp[s].reduce,
						      dp[s].bwd + dp[s].reduce / 3);
				if (act[i].op == SCHED_OPTIM_STEP) {
					CHECK_MSG(reduced > 0 && b.start[s][i] >= reduced - 1e-12,
						  WHERE(sc, s));
					reduced = 0;
				}
			}
		}
		sim_result_free(&a);
		sim_result_free(&b);
		sim_result_free(&c);
		free(plain);
		free(dp);
	}
	char err[128];
	struct schedule *sc = sched_build(SCHED_GPIPE, 1, 2, 2, err, sizeof(err));
	struct sim_times t = {.fwd = 1, .bwd = 2, .optim = 0.5, .reduce = 3, .buckets = 1};
	struct sim_result r;
	CHECK(sc && sched_simulate(sc, &t, &r) == 0);
	CHECK_NEAR(r.makespan, 2 * (2 * 1 + 2 * 2 + 3 + 0.5), 1e-12);
	sim_result_free(&r);
	sched_free(sc);
}

TEST(test_large_schedule)
{
	char err[128], why[256];
	struct schedule *sc = sched_build(SCHED_2BW, 64, 256, 3, err, sizeof(err));
	CHECK(sc);
	CHECK(sched_check(sc, why, sizeof(why)) == 0);
	struct sim_times t = {.fwd = 1, .bwd = 2};
	struct sim_result r;
	CHECK(sched_simulate(sc, &t, &r) == 0);
	CHECK_NEAR(r.steady_bubble, 0, 1e-12);
	CHECK(sched_stage(sc, 0)->nslots == 64 && sched_stage(sc, 63)->nslots == 1);
	sim_result_free(&r);
	sched_free(sc);
}

TEST(test_timeline_and_svg)
{
	char err[128], path[512], text[4096];
	struct schedule *sc = sched_build(SCHED_GPIPE, 2, 2, 1, err, sizeof(err));
	struct sim_times t = {.fwd = 1, .bwd = 2};
	struct sim_result r;
	CHECK(sc && sched_simulate(sc, &t, &r) == 0);
	snprintf(path, sizeof(path), "%s/timeline.txt", test_tmpdir());
	FILE *fp = fopen(path, "w+");
	CHECK(fp);
	sched_print_timeline(fp, sc, &r, 120, 0);
	rewind(fp);
	size_t n = fread(text, 1, sizeof(text) - 1, fp);
	text[n] = 0;
	fclose(fp);
	CHECK(strstr(text, "stage 0 | F0 F1 .  .  .  B0 -  B1 -\n"));
	CHECK(strstr(text, "stage 1 | .  F0 F1 B0 -  B1 -  .  .\n"));

	snprintf(path, sizeof(path), "%s/s.svg", test_tmpdir());
	CHECK(sched_write_svg(path, sc, &r) == 0);
	struct buf b = {0};
	CHECK(read_file(path, &b) == 0);
	CHECK(!strncmp((char *)b.data, "<svg", 4));
	CHECK(strstr((char *)b.data, "</svg>\n"));
	CHECK(strstr((char *)b.data, "forward"));
	buf_free(&b);
	set_error_quiet(1);
	CHECK(sched_write_svg("/nonexistent-dir/x.svg", sc, &r) == -1);
	set_error_quiet(0);
	CHECK(strstr(last_error(), "/nonexistent-dir/x.svg"));
	sim_result_free(&r);
	sched_free(sc);
}

/* NCCL matches by order per channel (one channel per direction of each
 * neighbour pair): for every schedule kind, S <= 16 and M <= 32 (two steps;
 * pipedream long enough for its steady state, and also from a later global
 * step), each channel's sends and receives name the same micro-batches in
 * the same order, and the lists complete with a FIFO per channel whose
 * send never stops its stage. A check over the tables, not a timing. */
TEST(test_every_schedule_up_to_16_stages_keeps_channel_order)
{
	char why[512];
	int count[SCHED_NKINDS_FUSED] = {0};
	for (int kind = 0; kind < SCHED_NKINDS_FUSED; kind++)
		for (int S = 1; S <= 16; S++)
			for (int M = 1; M <= 32; M++)
				for (long g = 0; g <= 3; g += 3) {
					if (kind == SCHED_2BW && M < S)
						continue;
					if (kind == SCHED_PIPEDREAM && M > 2)
						continue; /* M only sets its report window */
					char err[256];
					int n = kind == SCHED_PIPEDREAM ? 4 * S : 2;
					struct schedule *sc = sched_build_at(kind, S, M, n, g, err, sizeof(err));
					CHECK_MSG(sc != NULL, "%s S=%d M=%d: %s", sched_kind_name(kind), S,
						  M, err);
					CHECK_MSG(sched_check_channel_order(sc, why, sizeof(why)) == 0,
						  "%s S=%d M=%d first step %ld: %s", sched_kind_name(kind), S,
						  M, g, why);
					sched_free(sc);
					count[kind]++;
				}
	for (int kind = 0; kind < SCHED_NKINDS_FUSED; kind++)
		CHECK_MSG(count[kind] >= 32, "%s: %d schedules", sched_kind_name(kind), count[kind]);
}

TEST(test_channel_order_rejects_broken_lists)
{
	char err[128], why[512];
	struct schedule *sc;
	struct sched_action tmp;
	int i, j;

	/* stage 1 receives micro-batch 1's activation before micro-batch 0's:
	 * fine when messages are matched by (kind, mb), as sched_check does,
	 * wrong for NCCL */
	sc = sched_build(SCHED_GPIPE, 2, 3, 1, err, sizeof(err));
	CHECK(sched_check_channel_order(sc, why, sizeof(why)) == 0);
	own_stage(sc, 1);
	i = find(sc, 1, SCHED_RECV_ACT, 0);
	j = find(sc, 1, SCHED_RECV_ACT, 1);
	CHECK(i >= 0 && j > i);
	tmp = sc->stage[1].a[j];
	memmove(sc->stage[1].a + i + 1, sc->stage[1].a + i, sizeof(tmp) * (size_t)(j - i));
	sc->stage[1].a[i] = tmp;
	CHECK_MSG(sched_check(sc, why, sizeof(why)) == 0, "%s", why);
	CHECK(sched_check_channel_order(sc, why, sizeof(why)) == -1);
	CHECK_MSG(strstr(why, "channel activations 0 -> 1: message 0 is micro-batch 0 in stage 0's "
			      "sends but micro-batch 1 in stage 1's receives"), "%s", why);
	sched_free(sc);

	/* the gradients of 1f1b, sent out of order by stage 2 of 3 */
	sc = sched_build(SCHED_1F1B, 3, 4, 1, err, sizeof(err));
	own_stage(sc, 2);
	i = find(sc, 2, SCHED_SEND_GRAD, 1);
	j = find(sc, 2, SCHED_SEND_GRAD, 2);
	tmp = sc->stage[2].a[i];
	sc->stage[2].a[i] = sc->stage[2].a[j];
	sc->stage[2].a[j] = tmp;
	CHECK(sched_check_channel_order(sc, why, sizeof(why)) == -1);
	CHECK_MSG(strstr(why, "channel gradients 2 -> 1: message 1 is micro-batch 2"), "%s", why);
	sched_free(sc);

	/* a send missing: the counts differ */
	sc = sched_build(SCHED_2BW, 2, 2, 2, err, sizeof(err));
	own_stage(sc, 0);
	i = find(sc, 0, SCHED_SEND_ACT, 3);
	memmove(sc->stage[0].a + i, sc->stage[0].a + i + 1,
		sizeof(tmp) * (size_t)(sc->stage[0].n - i - 1));
	sc->stage[0].n--;
	CHECK(sched_check_channel_order(sc, why, sizeof(why)) == -1);
	CHECK_MSG(strstr(why, "stage 0 sends 3 messages, stage 1 receives 4"), "%s", why);
	sc->stage[0].n++;
	sched_free(sc);

	/* in order, but stage 0 waits for micro-batch 0's gradient before it
	 * sends its activation: stuck with FIFO channels */
	sc = sched_build(SCHED_1F1B, 2, 2, 1, err, sizeof(err));
	own_stage(sc, 0);
	i = find(sc, 0, SCHED_RECV_GRAD, 0);
	tmp = sc->stage[0].a[i];
	memmove(sc->stage[0].a + 1, sc->stage[0].a, sizeof(tmp) * (size_t)i);
	sc->stage[0].a[0] = tmp;
	CHECK(sched_check_channel_order(sc, why, sizeof(why)) == -1);
	CHECK_MSG(strstr(why, "deadlock") && strstr(why, "stage 0 stops at action 0 (RECV_GRAD") &&
			  strstr(why, "gradients 1 -> 0"), "%s", why);
	sched_free(sc);

	/* a send to the wrong peer */
	sc = sched_build(SCHED_GPIPE, 3, 2, 1, err, sizeof(err));
	sc->stage[1].a[find(sc, 1, SCHED_SEND_ACT, 1)].peer = 0;
	CHECK(sched_check_channel_order(sc, why, sizeof(why)) == -1);
	CHECK_MSG(strstr(why, "peer 0, but the channel goes to stage 2"), "%s", why);
	sched_free(sc);
}
