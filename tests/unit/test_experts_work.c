/* test_experts_work.c - the members of an expert-parallel call agree on
 * the work before an owner computes (sched/comm/experts.h: struct
 * ep_work). In threads (experts_local.c), two replicas of one group whose
 * hook calls name the same work get their rows' expert outputs with the
 * bits of every expert run here (moe_experts over all E), and two whose
 * calls name different weight versions (or passes, or micro-batches) end
 * the process with a bug() naming both sides before any expert runs.
 * Between processes the same check reads the header every member sends
 * (experts_plan.h: ep_head_*): packed and compared here; the check of a
 * real run over TCP and MPI is tests/scripts/expert_parallel_p2p.sh's
 * (ASYNCPP_FAULT=ep_version).
 *
 * A group that disagrees aborts, so each case runs in a child process
 * whose stderr the parent reads.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../io/util.h"
#include "../../sched/comm/experts.h"
#include "../../sched/comm/experts_plan.h"
#include "../test.h"

enum { C = 4, DE = 3, E = 2, NK = 5 };

/* One replica's rows of a forward: expert 0 takes rows [0, 3), expert 1
 * rows [3, 5) (its inputs differ per replica) */
struct side {
	struct moe_dims d;
	int32_t count[E + 1];
	float xd[NK * C], h[NK * 2 * DE], act[NK * DE], y[NK * C];
	struct moe_rows rows;
};

static float fcw[E * 2 * DE * C], fcprojw[E * C * DE];

static void side_init(struct side *sd, int r)
{
	memset(sd, 0, sizeof(*sd));
	sd->d = (struct moe_dims){.N = NK, .C = C, .E = E, .K = 1, .De = DE};
	sd->count[0] = 0;
	sd->count[1] = 3;
	sd->count[2] = NK;
	for (int i = 0; i < NK * C; i++)
		sd->xd[i] = (float)((i * 7 + r * 13) % 11) / 11.0f - 0.5f;
	sd->rows = (struct moe_rows){.d = &sd->d, .count = sd->count, .xd = sd->xd, .h = sd->h,
				     .act = sd->act, .y = sd->y};
}

struct caller {
	struct experts *x;
	int r;
	struct ep_work w;
	int pass;
	struct side sd;
};

static void *call(void *arg)
{
	struct caller *c = arg;
	c->x->work(c->x, c->r, 0, &c->w);
	const struct moe_ep *ep = c->x->member(c->x, c->r, 0);
	ep->experts(ep, c->pass, &c->sd.rows, fcw, fcprojw);
	return NULL;
}

/* Replicas 0 and 1 (one group, P = 2) call their hooks with works w0 and
 * w1 and passes p0, p1; in a child: its exit status (128 + signal when
 * killed) and stderr in err. The child exits 0 when every row's outputs
 * are those of moe_experts over all E experts, 3 when not. */
static int run_pair(struct ep_work w0, int p0, struct ep_work w1, int p1, char *err, size_t n)
{
	char path[64];
	snprintf(path, sizeof(path), "%s/err.txt", test_tmpdir());
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid == 0) {
		if (!freopen(path, "w", stderr))
			_exit(99);
		setvbuf(stderr, NULL, _IONBF, 0); /* bug() aborts without a flush */
		const struct backend *be = &backend_cpu; /* host arrays */
		for (size_t i = 0; i < sizeof(fcw) / sizeof(float); i++)
			fcw[i] = (float)((i * 5) % 9) / 9.0f - 0.4f;
		for (size_t i = 0; i < sizeof(fcprojw) / sizeof(float); i++)
			fcprojw[i] = (float)((i * 3) % 7) / 7.0f - 0.3f;
		struct experts *x = experts_local(be, 2, 2, 1, E);
		struct caller c[2] = {{.x = x, .r = 0, .w = w0, .pass = p0},
				      {.x = x, .r = 1, .w = w1, .pass = p1}};
		pthread_t t[2];
		for (int r = 0; r < 2; r++) {
			side_init(&c[r].sd, r);
			pthread_create(&t[r], NULL, call, &c[r]);
		}
		for (int r = 0; r < 2; r++)
			pthread_join(t[r], NULL);
		for (int r = 0; r < 2; r++) {
			struct side ref;
			side_init(&ref, r);
			moe_experts(be, MOE_PASS_FORWARD, &ref.rows, fcw, fcprojw, 0, E);
			if (memcmp(ref.y, c[r].sd.y, sizeof(ref.y)) ||
			    memcmp(ref.h, c[r].sd.h, sizeof(ref.h)))
				_exit(3);
		}
		x->destroy(x);
		fflush(stderr);
		_exit(0);
	}
	int st = 0;
	waitpid(pid, &st, 0);
	FILE *f = fopen(path, "r");
	size_t got = f ? fread(err, 1, n - 1, f) : 0;
	err[got] = 0;
	if (f)
		fclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

TEST(test_local_members_on_the_same_work_compute_every_expert)
{
	char err[2048];
	struct ep_work w = {.step = 5, .version = 4, .piece = 0, .mb = 3};
	int rc = run_pair(w, MOE_PASS_FORWARD, w, MOE_PASS_FORWARD, err, sizeof(err));
	CHECK_MSG(rc == 0, "exit %d: %s", rc, err);
}

TEST(test_local_members_on_different_versions_are_a_bug)
{
	char err[2048];
	struct ep_work w0 = {.step = 5, .version = 4, .piece = 0, .mb = 3}, w1 = w0;
	w1.version = 3;
	int rc = run_pair(w0, MOE_PASS_FORWARD, w1, MOE_PASS_FORWARD, err, sizeof(err));
	CHECK_MSG(rc == 128 + SIGABRT, "exit %d: %s", rc, err);
	const char *w = "the forward of micro-batch 3 of step 5 on weight version";
	char v4[128], v3[128];
	snprintf(v4, sizeof(v4), "%s 4", w);
	snprintf(v3, sizeof(v3), "%s 3", w);
	CHECK_MSG(strstr(err, "internal error: piece 0: the expert-parallel members disagree on "
			      "the work: replica ") &&
			  strstr(err, v4) && strstr(err, v3),
		  "%s", err);
}

TEST(test_local_members_on_different_passes_or_micro_batches_are_a_bug)
{
	char err[2048];
	struct ep_work w0 = {.step = 5, .version = 4, .piece = 0, .mb = 3}, w1 = w0;
	int rc = run_pair(w0, MOE_PASS_FORWARD, w1, MOE_PASS_BACKWARD, err, sizeof(err));
	CHECK_MSG(rc == 128 + SIGABRT && strstr(err, "the backward of micro-batch 3"),
		  "exit %d: %s", rc, err);
	w1.mb = 2;
	rc = run_pair(w0, MOE_PASS_FORWARD, w1, MOE_PASS_FORWARD, err, sizeof(err));
	CHECK_MSG(rc == 128 + SIGABRT && strstr(err, "the forward of micro-batch 2 of step 5"),
		  "exit %d: %s", rc, err);
}

TEST(test_p2p_header_carries_the_work)
{
	int32_t count[E + 1] = {0, 3, 5}, h[E + 10];
	CHECK(ep_head_ints(E) == sizeof(h) / sizeof(h[0]));
	struct ep_work w = {.step = 6000000000L, .version = 5999999999L, .piece = 1, .mb = 7};
	ep_head_pack(h, E, count, 0x123456789abcdefULL, MOE_PASS_WEIGHT, &w);
	CHECK(!memcmp(h, count, sizeof(count)));
	CHECK(ep_head_key(h, E) == 0x123456789abcdefULL);
	char a[160], b[160];
	CHECK(ep_head_agrees(h, E, MOE_PASS_WEIGHT, &w, a, b, sizeof(a)));
	struct ep_work v = w;
	v.version++;
	CHECK(!ep_head_agrees(h, E, MOE_PASS_WEIGHT, &v, a, b, sizeof(a)));
	CHECK_MSG(!strcmp(a, "the weight part of micro-batch 7 of step 6000000000 on weight "
			     "version 6000000000") &&
			  !strcmp(b, "the weight part of micro-batch 7 of step 6000000000 on "
				     "weight version 5999999999"),
		  "%s | %s", a, b);
	v = w;
	v.piece = 0;
	CHECK(!ep_head_agrees(h, E, MOE_PASS_WEIGHT, &v, a, b, sizeof(a)));
	CHECK_MSG(strstr(a, "of piece 0 on") && strstr(b, "of piece 1 on"), "%s | %s", a, b);
	CHECK(!ep_head_agrees(h, E, MOE_PASS_FORWARD, &w, a, b, sizeof(a)));
}
