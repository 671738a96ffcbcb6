/* test_nccl_plan.c - the NCCL channels a pipeline opens (nccl_plan_make,
 * sched/comm/nccl.h), checked on the CPU for every kind's piece layout:
 * every message a schedule sends between two stages has a channel of its
 * kind in its direction and no channel is left unused (the schedule's
 * SEND actions counted here from the lists, independently of the plan's
 * walk over the pieces); each sender's ids are numbered 0.. without a gap;
 * no stage opens channels with two peers in one round (the rounds cannot
 * wait on a chain of ranks), both ends of a channel open it in the same
 * round; one piece per stage gives the two rounds of pairs at an even
 * stage, then an odd one. And nccl's environment (eager module loading)
 * and the deadline of a channel's opening. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../io/config/config.h"
#include "../../io/util.h"
#include "../../sched/comm/dist.h"
#include "../../sched/comm/nccl.h"
#include "../../sched/comm/pieces.h"
#include "../../sched/schedule.h"
#include "../test.h"

/* Each stage's order of opening (and closing) its channels
 * (nccl_plan_sequence): every channel in the orders of its two ends only,
 * once; and with each opening and closing blocking until the other end is
 * at the same channel (ncclCommInitRank, ncclCommDestroy), the stages
 * walking their orders get through them all, none left waiting. */
static void check_sequences(const struct nccl_plan *plan, int S, const char *what)
{
	int *seq = xmalloc(sizeof(int) * (size_t)S * (size_t)(plan->n + 1));
	int *len = xcalloc((size_t)S, sizeof(int)), *pos = xcalloc((size_t)S, sizeof(int));
	int *seen = xcalloc((size_t)plan->n + 1, sizeof(int));
	for (int s = 0; s < S; s++) {
		len[s] = nccl_plan_sequence(plan, s, seq + (size_t)s * (plan->n + 1));
		for (int k = 0; k < len[s]; k++) {
			int i = seq[(size_t)s * (plan->n + 1) + k];
			CHECK_MSG(i >= 0 && i < plan->n && (plan->from[i] == s || plan->to[i] == s),
				  "%s: stage %d opens channel %d, not one of its own", what, s, i);
			if (i >= 0 && i < plan->n)
				seen[i]++;
		}
	}
	for (int i = 0; i < plan->n; i++)
		CHECK_MSG(seen[i] == 2, "%s: channel %d is in %d stages' orders", what, i, seen[i]);
	for (int moved = 1; moved;) {
		moved = 0;
		for (int a = 0; a < S; a++) {
			if (pos[a] == len[a])
				continue;
			int i = seq[(size_t)a * (plan->n + 1) + pos[a]];
			int b = plan->from[i] == a ? plan->to[i] : plan->from[i];
			if (pos[b] < len[b] && seq[(size_t)b * (plan->n + 1) + pos[b]] == i) {
				pos[a]++, pos[b]++;
				moved = 1;
			}
		}
	}
	for (int s = 0; s < S; s++)
		CHECK_MSG(pos[s] == len[s], "%s: stage %d waits at its channel %d of %d", what, s,
			  pos[s], len[s]);
	free(seen);
	free(pos);
	free(len);
	free(seq);
}

/* The plan of sc's layout, checked against sc's lists. */
static void check_plan(const struct schedule *sc, const char *what)
{
	int S = sc->S, P = S * sc->V;
	int *stage = xmalloc(sizeof(int) * (size_t)P), *chunk = xmalloc(sizeof(int) * (size_t)P);
	for (int q = 0; q < P; q++) {
		stage[q] = sched_piece_stage(sc, q);
		chunk[q] = sched_piece_chunk(sc, q);
	}
	struct pieces pc = {.P = P, .S = S, .V = sc->V, .stage = stage, .chunk = chunk};
	struct nccl_plan plan;
	nccl_plan_make(&plan, &pc);
	/* [kind][from][to]: messages the lists send, channels the plan has */
	int *sends = xcalloc((size_t)2 * S * S, sizeof(int));
	int *chans = xcalloc((size_t)2 * S * S, sizeof(int));
	for (int s = 0; s < S; s++) {
		int n;
		const struct sched_action *a = sched_actions(sc, s, &n);
		for (int i = 0; i < n; i++)
			if (a[i].op == SCHED_SEND_ACT || a[i].op == SCHED_SEND_GRAD)
				sends[((a[i].op == SCHED_SEND_GRAD) * S + s) * S + a[i].peer]++;
	}
	int *slots = xcalloc((size_t)S * (size_t)(plan.n + 1), sizeof(int));
	for (int i = 0; i < plan.n; i++) {
		CHECK_MSG(plan.from[i] != plan.to[i] && plan.kind[i] >= 0 && plan.kind[i] <= 1,
			  "%s: channel %d", what, i);
		chans[(plan.kind[i] * S + plan.from[i]) * S + plan.to[i]]++;
		CHECK_MSG(plan.slot[i] >= 0 && plan.slot[i] < plan.ids, "%s: slot %d of %d", what,
			  plan.slot[i], plan.ids);
		slots[plan.from[i] * (plan.n + 1) + plan.slot[i]]++;
		CHECK(plan.round[i] >= 0 && plan.round[i] < plan.rounds);
	}
	for (int k = 0; k < 2 * S * S; k++)
		CHECK_MSG(chans[k] == (sends[k] > 0), "%s: %s from stage %d to %d: %d messages, %d "
			  "channels", what, k / (S * S) ? "gradients" : "activations", k / S % S,
			  k % S, sends[k], chans[k]);
	/* each sender's ids 0..m-1, each once */
	for (int s = 0; s < S; s++) {
		int m = 0;
		while (m <= plan.n && slots[s * (plan.n + 1) + m] == 1)
			m++;
		for (int k = m; k <= plan.n; k++)
			CHECK_MSG(!slots[s * (plan.n + 1) + k], "%s: stage %d's ids have a gap", what,
				  s);
	}
	/* per round, one peer per stage */
	for (int r = 0; r < plan.rounds; r++) {
		int *peer = xmalloc(sizeof(int) * (size_t)S);
		for (int s = 0; s < S; s++)
			peer[s] = -1;
		for (int i = 0; i < plan.n; i++) {
			if (plan.round[i] != r)
				continue;
			int a = plan.from[i], b = plan.to[i];
			CHECK_MSG((peer[a] < 0 || peer[a] == b) && (peer[b] < 0 || peer[b] == a),
				  "%s: round %d: stage %d or %d has two peers", what, r, a, b);
			peer[a] = b;
			peer[b] = a;
		}
		free(peer);
	}
	check_sequences(&plan, S, what);
	free(slots);
	free(sends);
	free(chans);
	nccl_plan_free(&plan);
	free(stage);
	free(chunk);
}

TEST(every_layout_gets_exactly_the_channels_its_messages_need)
{
	char err[256], what[96];
	static const int kinds[] = {SCHED_1F1B, SCHED_2BW, SCHED_INTERLEAVED, SCHED_ZBV};
	for (size_t k = 0; k < ARRAY_SIZE(kinds); k++)
		for (int S = 1; S <= 8; S++)
			for (int V = 1; V <= 3; V++) {
				int kind = kinds[k];
				if (kind != SCHED_INTERLEAVED && V != (kind == SCHED_ZBV ? 2 : 1))
					continue;
				int M = kind == SCHED_ZBV ? 2 * S : S;
				struct schedule *sc = sched_build_virtual(kind, S, M, V, 2, 0, err,
									  sizeof(err));
				if (!sc)
					continue; /* test_sched_split checks the refusals */
				snprintf(what, sizeof(what), "%s S=%d V=%d", sched_kind_name(kind), S,
					 V);
				check_plan(sc, what);
				sched_free(sc);
			}
}

TEST(one_piece_per_stage_opens_in_two_rounds_of_neighbours)
{
	char err[256];
	for (int S = 2; S <= 8; S++) {
		struct schedule *sc = sched_build_virtual(SCHED_1F1B, S, S, 1, 2, 0, err, sizeof(err));
		CHECK(sc);
		if (!sc)
			continue;
		int stage[8], chunk[8] = {0};
		for (int q = 0; q < S; q++)
			stage[q] = q;
		struct pieces pc = {.P = S, .S = S, .V = 1, .stage = stage, .chunk = chunk};
		struct nccl_plan plan;
		nccl_plan_make(&plan, &pc);
		CHECK(plan.n == 2 * (S - 1) && plan.ids == (S == 2 ? 1 : 2));
		CHECK(plan.rounds == (S == 2 ? 1 : 2));
		for (int i = 0; i < plan.n; i++) {
			int lo = MIN(plan.from[i], plan.to[i]);
			CHECK(abs(plan.from[i] - plan.to[i]) == 1 && plan.round[i] == lo % 2);
		}
		nccl_plan_free(&plan);
		sched_free(sc);
	}
}

/* interleaved's turn back to stage 0 and zb-v's way back up */
TEST(the_chunked_layouts_add_their_turns)
{
	char err[256];
	struct schedule *sc = sched_build_virtual(SCHED_INTERLEAVED, 4, 4, 2, 2, 0, err,
						  sizeof(err));
	CHECK(sc);
	int stage[8], chunk[8];
	for (int q = 0; sc && q < 8; q++) {
		stage[q] = sched_piece_stage(sc, q);
		chunk[q] = sched_piece_chunk(sc, q);
	}
	struct pieces pc = {.P = 8, .S = 4, .V = 2, .stage = stage, .chunk = chunk};
	struct nccl_plan plan;
	nccl_plan_make(&plan, &pc);
	int turn = 0, back = 0;
	for (int i = 0; i < plan.n; i++) {
		turn += plan.kind[i] == 0 && plan.from[i] == 3 && plan.to[i] == 0;
		back += plan.kind[i] == 1 && plan.from[i] == 0 && plan.to[i] == 3;
	}
	CHECK(turn == 1 && back == 1 && plan.n == 8);
	nccl_plan_free(&plan);
	sched_free(sc);
	sc = sched_build_virtual(SCHED_ZBV, 4, 8, 2, 2, 0, err, sizeof(err));
	CHECK(sc);
	for (int q = 0; sc && q < 8; q++) {
		stage[q] = sched_piece_stage(sc, q);
		chunk[q] = sched_piece_chunk(sc, q);
	}
	nccl_plan_make(&plan, &pc);
	int up = 0;
	for (int i = 0; i < plan.n; i++)
		up += plan.kind[i] == 0 && plan.from[i] == plan.to[i] + 1;
	CHECK(up == 3 && plan.n == 12 && plan.ids == 4);
	nccl_plan_free(&plan);
	sched_free(sc);
}

/* A one-process start (no launcher's variables) with the given transport */
static void init_with(const char *transport)
{
	static const char *launcher[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
					 "PMI_RANK", "PMI_SIZE", "SLURM_STEP_ID", "RANK",
					 "WORLD_SIZE"};
	for (size_t i = 0; i < ARRAY_SIZE(launcher); i++)
		unsetenv(launcher[i]);
	struct config cfg;
	char set[64];
	snprintf(set, sizeof(set), "pipeline.transport=%s", transport);
	const char *sets[] = {set};
	struct dist *d = NULL;
	CHECK(config_from_args(&cfg, NULL, sets, 1) == 0);
	CHECK(dist_init(&cfg, &d) == 0 && !d);
	config_free(&cfg);
}

/* dist_init turns CUDA's lazy kernel loading off for nccl before anything
 * can start CUDA (nccl.h: nccl_env_prepare), keeps a user's own value, and
 * leaves the other transports alone */
TEST(nccl_asks_for_eager_module_loading_unless_the_user_chose)
{
	unsetenv("CUDA_MODULE_LOADING");
	init_with("mpi");
	CHECK(!getenv("CUDA_MODULE_LOADING"));
	init_with("nccl");
	const char *v = getenv("CUDA_MODULE_LOADING");
	CHECK(v && !strcmp(v, "EAGER"));
	setenv("CUDA_MODULE_LOADING", "LAZY", 1);
	init_with("nccl");
	v = getenv("CUDA_MODULE_LOADING");
	CHECK(v && !strcmp(v, "LAZY"));
	unsetenv("CUDA_MODULE_LOADING");
}

/* A child running body with its stderr into a pipe: its exit status, its
 * stderr in err */
static int in_child(void (*body)(void), char *err, size_t len)
{
	int fd[2];
	if (pipe(fd))
		return -1;
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		close(fd[0]);
		dup2(fd[1], 2);
		alarm(60); /* a deadline that never fires ends here, not in a hang */
		body();
		_exit(0);
	}
	close(fd[1]);
	size_t n = 0;
	ssize_t k;
	while (n + 1 < len && (k = read(fd[0], err + n, len - 1 - n)) > 0)
		n += (size_t)k;
	err[n] = 0;
	close(fd[0]);
	int status = 0;
	waitpid(pid, &status, 0);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* a peer that never joins: the call NCCL waits in, forever */
static void never_joined(void)
{
	nccl_deadline_start(0.2, 3, 1, "rank %d (stage %d) to open %s", 2, 0, "a channel");
	for (;;)
		pause();
}

static void joined(void)
{
	nccl_deadline_stop(nccl_deadline_start(600, 3, 1, "rank 2 to open %s", "a channel"));
	nccl_deadline_stop(nccl_deadline_start(0, 3, 1, "nothing: no deadline"));
}

/* nccl_deadline: past it, the job ends naming the rank and what it waited
 * for (ncclCommInitRank has no deadline of its own); stopped in time, it
 * leaves the process alone */
TEST(a_peer_that_never_opens_its_channel_ends_the_job)
{
	char err[1024];
	CHECK_MSG(in_child(never_joined, err, sizeof(err)) == 1, "%s", err);
	CHECK_MSG(strstr(err, "rank 3 (stage 1) waited 0 s for rank 2 (stage 0) to open a channel, "
			 "which never came"), "%s", err);
	CHECK_MSG(in_child(joined, err, sizeof(err)) == 0 && !err[0], "%s", err);
}

/* sc's lists run with NCCL's rule that a send holds its channel until the
 * receiver takes it, and with the sending GPU waiting for all its queued
 * work at a computation (a device-wide wait) while a send of its is still
 * held: at every computation (every = 1), or only at the first of each op
 * and chunk (a kernel's first load, a buffer's first use). 1 when every
 * stage gets to the end of its list; 0 when some wait on each other. */
static int survives_device_waits(const struct schedule *sc, int every)
{
	int S = sc->S, V = sc->V, n_ch = 2 * S * S;
	int *pos = xcalloc((size_t)S, sizeof(int)), *sent = xcalloc((size_t)n_ch, sizeof(int));
	int *got = xcalloc((size_t)n_ch, sizeof(int));
	unsigned char *seen = xcalloc((size_t)S * SCHED_NOPS * (size_t)V, 1);
	for (int moved = 1; moved;) {
		moved = 0;
		for (int s = 0; s < S; s++) {
			int n;
			const struct sched_action *a = sched_actions(sc, s, &n);
			for (; pos[s] < n; pos[s]++, moved = 1) {
				const struct sched_action *x = &a[pos[s]];
				int grad = x->op == SCHED_SEND_GRAD || x->op == SCHED_RECV_GRAD;
				if (x->op == SCHED_SEND_ACT || x->op == SCHED_SEND_GRAD) {
					sent[(grad * S + s) * S + x->peer]++;
					continue;
				}
				if (x->op == SCHED_RECV_ACT || x->op == SCHED_RECV_GRAD) {
					int c = (grad * S + x->peer) * S + s;
					if (got[c] == sent[c])
						break; /* not sent yet */
					got[c]++;
					continue;
				}
				unsigned char *first = &seen[((size_t)s * SCHED_NOPS + x->op) * V +
							     x->chunk];
				int held = 0;
				for (int k = 0; k < 2 && (every || !*first); k++)
					for (int t = 0; t < S; t++)
						held |= got[(k * S + s) * S + t] <
							sent[(k * S + s) * S + t];
				if (held)
					break; /* the device-wide wait */
				*first = 1;
			}
		}
	}
	int done = 1;
	for (int s = 0; s < S; s++) {
		int n;
		sched_actions(sc, s, &n);
		done &= pos[s] == n;
	}
	free(seen);
	free(got);
	free(sent);
	free(pos);
	return done;
}

/* Why zb-v over nccl is refused (trainer_check_config) and the others
 * are not, on every layout: the one-chunk kinds get through even a
 * device-wide wait at every computation while a send is held;
 * interleaved gets through such waits at the first use of each op and
 * chunk (lazy loading, first allocations: the waits the nccl path now
 * avoids, kernels/cuda/NOTES.md); zb-v does not, so any such wait left
 * hangs its first step. When a change to zb-v's lists gets it through,
 * the refusal can go. */
TEST(device_wide_waits_hang_only_zb_v)
{
	char err[256];
	for (int kind = 0; kind < SCHED_NKINDS; kind++)
		for (int S = 2; S <= 6; S++)
			for (int V = 1; V <= (kind == SCHED_INTERLEAVED ? 3 : 1); V++)
				for (int M = S; M <= 4 * S; M += S) {
					int v = kind == SCHED_ZBV ? 2 : V;
					struct schedule *sc = sched_build_virtual(kind, S, M, v, 2, 0,
										  err, sizeof(err));
					if (!sc)
						continue;
					if (kind == SCHED_ZBV)
						CHECK_MSG(!survives_device_waits(sc, 0),
							  "zb-v S=%d M=%d gets through first-use waits: "
							  "its refusal over nccl can go", S, M);
					else if (kind == SCHED_INTERLEAVED)
						CHECK_MSG(survives_device_waits(sc, 0),
							  "interleaved S=%d V=%d M=%d", S, V, M);
					else
						CHECK_MSG(survives_device_waits(sc, 1), "%s S=%d M=%d",
							  sched_kind_name(kind), S, M);
					sched_free(sc);
				}
}
