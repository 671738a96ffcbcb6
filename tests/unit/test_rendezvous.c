/* test_rendezvous.c - the TCP rendezvous (sched/comm/rendezvous.h) between
 * forked processes on 127.0.0.1: the collectives' contents for worlds of
 * 1, 2 and 4, and every failure named, in time, without a hang: a wrong
 * WORLD_SIZE, a RANK claimed twice, a configuration that differs in one
 * key, a rank that exits or stops, a port in use, a rank 0 that never
 * comes, a stranger on the port, another protocol version.
 *
 * Each process of a world runs a body and leaves its return code, its last
 * error message and its elapsed time in shared memory; the parent kills
 * whatever has not finished after a few seconds and reports it as a hang.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../io/config/config.h"
#include "../../io/util.h"
#include "../../sched/comm/rendezvous.h"
#include "../test.h"

#define MAXW 8

struct result {
	int rc, finished;
	double seconds;
	char err[1024];  /* its last error message when rc != 0 */
	char out[1024];  /* what the body reports */
};

struct world {
	int n;                        /* processes */
	int port;
	int rank[MAXW], size[MAXW];   /* what each process says */
	double connect_timeout, timeout;
	/* the body of process i, after its rdv_open succeeded (r is NULL when
	 * it failed); returns its rc and may error() */
	int (*body)(int i, struct rdv *r, struct result *res);
	void (*before)(int i);        /* before rdv_open; may be NULL */
};

static int free_port(void)
{
	set_error_quiet(1);
	int p = rdv_free_port("127.0.0.1");
	set_error_quiet(0);
	return p;
}

/* The default world: n processes, ranks 0..n-1 of n. */
static struct world world_of(int n, int (*body)(int, struct rdv *, struct result *))
{
	struct world w = {.n = n, .port = free_port(), .connect_timeout = 2, .timeout = 1,
			  .body = body};
	for (int i = 0; i < n; i++)
		w.rank[i] = i, w.size[i] = n;
	return w;
}

/* Run w; res[i] gets process i's outcome. Returns the number of processes
 * that did not finish within limit seconds (killed). */
static int run_world(const struct world *w, struct result *res, double limit)
{
	struct result *shared = mmap(NULL, sizeof(*shared) * MAXW, PROT_READ | PROT_WRITE,
				     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (shared == MAP_FAILED)
		return w->n;
	memset(shared, 0, sizeof(*shared) * MAXW);
	pid_t pid[MAXW];
	fflush(stdout);
	fflush(stderr);
	for (int i = 0; i < w->n; i++) {
		pid[i] = fork();
		if (pid[i] == 0) {
			set_error_quiet(1);
			double t0 = now_sec();
			if (w->before)
				w->before(i);
			struct rdv_opts o = {"127.0.0.1", w->port, w->rank[i], w->size[i],
					     w->connect_timeout, w->timeout};
			struct rdv *r = rdv_open(&o);
			int rc = w->body ? w->body(i, r, &shared[i]) : (r ? 0 : -1);
			shared[i].rc = rc;
			shared[i].seconds = now_sec() - t0;
			snprintf(shared[i].err, sizeof(shared[i].err), "%s",
				 rc ? last_error() : "");
			shared[i].finished = 1;
			rdv_close(r);
			_exit(0);
		}
	}
	double t0 = now_sec();
	int left = w->n;
	while (left && now_sec() - t0 < limit) {
		left = 0;
		for (int i = 0; i < w->n; i++)
			if (pid[i] > 0) {
				if (waitpid(pid[i], NULL, WNOHANG) == pid[i])
					pid[i] = 0;
				else
					left++;
			}
		struct timespec pause = {0, 10 * 1000 * 1000};
		nanosleep(&pause, NULL);
	}
	int hung = 0;
	for (int i = 0; i < w->n; i++)
		if (pid[i] > 0) {
			kill(pid[i], SIGKILL);
			waitpid(pid[i], NULL, 0);
			hung++;
		}
	memcpy(res, shared, sizeof(*shared) * MAXW);
	munmap(shared, sizeof(*shared) * MAXW);
	return hung;
}

/* ---- the collectives ---- */

static unsigned char pattern(int seed, size_t i)
{
	return (unsigned char)(seed * 131 + i * 7 + (i >> 9));
}

static int all_collectives(int i, struct rdv *r, struct result *res)
{
	if (!r)
		return -1;
	int W = rdv_world(r), me = rdv_rank(r);
	if (rdv_barrier(r))
		return -1;
	/* a broadcast from rank 0, one from the last rank, and a large one
	 * (partial writes on non-blocking sockets) */
	size_t sizes[3] = {1000, 37, (size_t)3 << 20};
	int roots[3] = {0, W - 1, W / 2};
	for (int k = 0; k < 3; k++) {
		unsigned char *b = xcalloc(sizes[k], 1);
		if (me == roots[k])
			for (size_t j = 0; j < sizes[k]; j++)
				b[j] = pattern(k + 1, j);
		if (rdv_bcast(r, b, sizes[k], roots[k]))
			return -1;
		for (size_t j = 0; j < sizes[k]; j++)
			if (b[j] != pattern(k + 1, j))
				return error("broadcast %d from rank %d: byte %zu is %d, expected %d",
					     k, roots[k], j, b[j], pattern(k + 1, j));
		free(b);
	}
	/* allgather: each rank's 16 bytes at its place */
	unsigned char mine[16], all[16 * MAXW];
	for (int j = 0; j < 16; j++)
		mine[j] = pattern(100 + me, (size_t)j);
	memset(all, 0xee, sizeof(all));
	if (rdv_allgather(r, mine, all, 16))
		return -1;
	for (int q = 0; q < W; q++)
		for (int j = 0; j < 16; j++)
			if (all[16 * q + j] != pattern(100 + q, (size_t)j))
				return error("allgather: rank %d's byte %d is wrong", q, j);
	char diff[256];
	int odd = rdv_agree(r, "[train]\nsteps = 3\n", diff, sizeof(diff));
	if (odd)
		return error("identical texts: rdv_agree says %d (%s)", odd, diff);
	return rdv_barrier(r);
}

TEST(test_rendezvous_collectives_worlds_1_2_4)
{
	static const int Ws[] = {1, 2, 4};
	for (size_t k = 0; k < ARRAY_SIZE(Ws); k++) {
		struct world w = world_of(Ws[k], all_collectives);
		CHECK(w.port > 0);
		struct result res[MAXW];
		CHECK_MSG(run_world(&w, res, 5) == 0, "world of %d hangs", Ws[k]);
		for (int i = 0; i < w.n; i++)
			CHECK_MSG(res[i].finished && res[i].rc == 0, "world of %d, rank %d: %s",
				  Ws[k], i, res[i].err);
	}
}

/* ---- joining ---- */

static int just_open(int i, struct rdv *r, struct result *res)
{
	return r ? rdv_barrier(r) : -1;
}

TEST(test_rendezvous_world_size_mismatch_named)
{
	struct world w = world_of(2, just_open);
	w.size[1] = 3; /* rank 1 was told WORLD_SIZE = 3 */
	struct result res[MAXW];
	CHECK(run_world(&w, res, 5) == 0);
	CHECK(res[0].rc == -1 && res[1].rc == -1);
	CHECK_MSG(strstr(res[0].err, "WORLD_SIZE = 3") && strstr(res[0].err, "WORLD_SIZE = 2") &&
			  strstr(res[0].err, "RANK 1"), "%s", res[0].err);
	/* the rejected process hears why */
	CHECK_MSG(strstr(res[1].err, "refused") && strstr(res[1].err, "WORLD_SIZE = 3"), "%s",
		  res[1].err);
	CHECK(res[0].seconds < 1.5 && res[1].seconds < 1.5);
}

TEST(test_rendezvous_duplicate_rank_named)
{
	/* a world of 3 where two processes say RANK 1 (and RANK 2 never comes) */
	struct world w = world_of(3, just_open);
	w.rank[2] = 1;
	struct result res[MAXW];
	CHECK(run_world(&w, res, 5) == 0);
	CHECK(res[0].rc == -1 && res[1].rc == -1 && res[2].rc == -1);
	CHECK_MSG(strstr(res[0].err, "two processes say RANK 1"), "%s", res[0].err);
	/* one of the two was refused, the other stopped by rank 0 */
	int refused = !!strstr(res[1].err, "refused") + !!strstr(res[2].err, "refused");
	int told = !!strstr(res[1].err, "two processes say RANK 1") +
		   !!strstr(res[2].err, "two processes say RANK 1");
	CHECK_MSG(refused == 1 && told == 2, "%s | %s", res[1].err, res[2].err);
	CHECK(res[0].seconds < 1.5);
}

static void rank1_sleeps(int i)
{
	if (i == 0) { /* rank 0 comes late: the others retry */
		struct timespec pause = {0, 300 * 1000 * 1000};
		nanosleep(&pause, NULL);
	}
}

TEST(test_rendezvous_waits_for_a_late_rank_0)
{
	struct world w = world_of(3, all_collectives);
	w.before = rank1_sleeps;
	struct result res[MAXW];
	CHECK(run_world(&w, res, 5) == 0);
	for (int i = 0; i < w.n; i++)
		CHECK_MSG(res[i].rc == 0, "rank %d: %s", i, res[i].err);
}

TEST(test_rendezvous_connect_timeout_when_rank_0_never_comes)
{
	struct world w = world_of(1, just_open);
	w.rank[0] = 1; /* rank 1 of 2 alone */
	w.size[0] = 2;
	w.connect_timeout = 0.5;
	struct result res[MAXW];
	CHECK(run_world(&w, res, 5) == 0);
	CHECK(res[0].rc == -1);
	CHECK_MSG(strstr(res[0].err, "could not connect to rank 0") &&
			  strstr(res[0].err, "MASTER_ADDR:MASTER_PORT = 127.0.0.1:") &&
			  strstr(res[0].err, "refused"), "%s", res[0].err);
	CHECK(res[0].seconds >= 0.5 && res[0].seconds < 1.5);
}

TEST(test_rendezvous_rank_0_names_the_ranks_that_never_come)
{
	struct world w = world_of(2, just_open);
	w.size[0] = w.size[1] = 4; /* ranks 2 and 3 are never started */
	w.connect_timeout = 0.5;
	struct result res[MAXW];
	CHECK(run_world(&w, res, 5) == 0);
	CHECK(res[0].rc == -1 && res[1].rc == -1);
	CHECK_MSG(strstr(res[0].err, "for ranks 2, 3 (of WORLD_SIZE = 4)"), "%s", res[0].err);
	/* rank 1, which had joined, hears it from rank 0 */
	CHECK_MSG(strstr(res[1].err, "for ranks 2, 3"), "%s", res[1].err);
	CHECK(res[0].seconds < 1.5 && res[1].seconds < 1.5);
}

TEST(test_rendezvous_port_in_use_named)
{
	int port = free_port();
	CHECK(port > 0);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {0};
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_ANY);
	a.sin_port = htons((uint16_t)port);
	CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(fd, 4) == 0);
	struct rdv_opts o = {"127.0.0.1", port, 0, 2, 1, 1};
	set_error_quiet(1);
	struct rdv *r = rdv_open(&o);
	set_error_quiet(0);
	close(fd);
	CHECK(r == NULL);
	char want[64];
	snprintf(want, sizeof(want), "MASTER_PORT %d is in use", port);
	CHECK_MSG(strstr(last_error(), want) && strstr(last_error(), "choose another port"), "%s",
		  last_error());
}

/* ---- failures after joining ---- */

/* Process 2 leaves right after joining (as a crash would); the others
 * meet in a barrier. */
static int rank2_exits(int i, struct rdv *r, struct result *res)
{
	if (!r)
		return -1;
	if (i == 2)
		_exit(3); /* no rdv_close: the kernel closes the socket */
	return rdv_barrier(r);
}

TEST(test_rendezvous_rank_that_exits_is_named)
{
	struct world w = world_of(4, rank2_exits);
	w.timeout = 5; /* the failure must come from the closed socket, not the timeout */
	struct result res[MAXW];
	CHECK(run_world(&w, res, 5) == 0);
	CHECK(!res[2].finished);
	for (int i = 0; i < w.n; i++) {
		if (i == 2)
			continue;
		CHECK_MSG(res[i].rc == -1 && strstr(res[i].err, "rank 2 (host") &&
				  strstr(res[i].err, "closed its connection during the barrier"),
			  "rank %d: %s", i, res[i].err);
		CHECK_MSG(res[i].seconds < 1.5, "rank %d took %.2f s", i, res[i].seconds);
	}
	CHECK(strstr(res[1].err, "rank 0 reports"));
}

static int rank0_exits(int i, struct rdv *r, struct result *res)
{
	if (!r)
		return -1;
	if (i == 0)
		_exit(3);
	return rdv_bcast(r, res->err, 8, 0);
}

TEST(test_rendezvous_rank_0_that_exits_is_named)
{
	struct world w = world_of(3, rank0_exits);
	w.timeout = 5;
	struct result res[MAXW];
	CHECK(run_world(&w, res, 5) == 0);
	for (int i = 1; i < w.n; i++) {
		CHECK_MSG(res[i].rc == -1 && strstr(res[i].err, "rank 0 (MASTER_ADDR:MASTER_PORT") &&
				  strstr(res[i].err, "closed its connection during the broadcast"),
			  "rank %d: %s", i, res[i].err);
		CHECK(res[i].seconds < 1.5);
	}
}

/* Process 1 hangs (sleeps past the timeout) instead of joining the barrier. */
static int rank1_hangs(int i, struct rdv *r, struct result *res)
{
	if (!r)
		return -1;
	if (i == 1) {
		struct timespec pause = {1, 0};
		nanosleep(&pause, NULL);
		return 0;
	}
	return rdv_barrier(r);
}

TEST(test_rendezvous_hung_rank_named_after_the_timeout)
{
	struct world w = world_of(3, rank1_hangs);
	w.timeout = 0.4;
	struct result res[MAXW];
	CHECK(run_world(&w, res, 5) == 0);
	CHECK_MSG(res[0].rc == -1 && strstr(res[0].err, "waited 0.4 s in the barrier (#1) for rank 1") &&
			  strstr(res[0].err, "stuck"), "%s", res[0].err);
	/* rank 2 waits a little longer than rank 0, so it hears the culprit */
	CHECK_MSG(res[2].rc == -1 && strstr(res[2].err, "rank 0 reports") &&
			  strstr(res[2].err, "for rank 1"), "%s", res[2].err);
	CHECK(res[0].seconds < 1.5 && res[2].seconds < 1.5);
}

/* ---- the configuration check ---- */

static int config_text(int i, struct rdv *r, struct result *res)
{
	if (!r)
		return -1;
	struct config cfg;
	const char *sets[] = {"optim.lr=0.002"};
	if (config_from_args(&cfg, NULL, sets, i == 2 ? 1 : 0))
		return -1;
	char *text = config_to_string(&cfg);
	char diff[600];
	int odd = rdv_agree(r, text, diff, sizeof(diff));
	free(text);
	config_free(&cfg);
	snprintf(res->out, sizeof(res->out), "%s", diff);
	if (odd < 0)
		return -1;
	return odd == 2 ? 0 : error("rdv_agree says %d", odd);
}

TEST(test_rendezvous_config_difference_named)
{
	struct world w = world_of(4, config_text);
	struct result res[MAXW];
	CHECK(run_world(&w, res, 5) == 0);
	for (int i = 0; i < w.n; i++)
		CHECK_MSG(res[i].rc == 0, "rank %d: %s", i, res[i].err);
	CHECK_MSG(!strcmp(res[0].out, "optim.lr = 0.002 on rank 2, but optim.lr = 0.003 on rank 0"),
		  "%s", res[0].out);
	CHECK(!res[1].out[0] && !res[2].out[0]); /* only rank 0 has the text */
}

TEST(test_config_first_difference)
{
	char m[256];
	config_first_difference("[a]\nx = 1\n[b]\ny = 2\n", "[a]\nx = 1\n[b]\ny = 3\n", 5, m,
				sizeof(m));
	CHECK_MSG(!strcmp(m, "b.y = 2 on rank 5, but b.y = 3 on rank 0"), "%s", m);
	config_first_difference("[a]\nx = 1\n", "[a]\nx = 1\nz = 2\n", 1, m, sizeof(m));
	CHECK(!strcmp(m, "their lengths differ"));
}

/* ---- strangers and other versions ---- */

static int connect_raw(int port)
{
	for (int tries = 0; tries < 100; tries++) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in a = {0};
		a.sin_family = AF_INET;
		a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		a.sin_port = htons((uint16_t)port);
		if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
			return fd;
		close(fd);
		struct timespec pause = {0, 20 * 1000 * 1000};
		nanosleep(&pause, NULL);
	}
	return -1;
}

/* Process 2 is not a rank: it talks HTTP to the port (ignored), then
 * says hello in protocol version 2 with RANK 2 (refused). */
static int stranger_or_rank(int i, struct rdv *r, struct result *res)
{
	return r ? rdv_barrier(r) : -1;
}

static int g_port;

static void stranger(int i)
{
	if (i != 2)
		return;
	struct timespec pause = {0, 200 * 1000 * 1000}; /* after rank 1 has joined */
	nanosleep(&pause, NULL);
	int fd = connect_raw(g_port);
	if (fd < 0)
		_exit(4);
	const char *http = "GET / HTTP/1.0\r\nHost: x\r\n\r\n....";
	if (write(fd, http, 32) != 32)
		_exit(5);
	close(fd);
	fd = connect_raw(g_port);
	unsigned char h[32] = {0};
	put_le32(h, RDV_MAGIC);
	put_le16(h + 4, RDV_VERSION + 1);
	put_le16(h + 6, 1); /* hello */
	put_le32(h + 8, 2);
	put_le32(h + 12, 3);
	put_le64(h + 24, 0);
	if (fd < 0 || write(fd, h, 32) != 32)
		_exit(6);
	char back[512];
	ssize_t n = read(fd, back, sizeof(back) - 1);
	back[n > 0 ? n : 0] = 0;
	/* the reject's text follows its 32-byte header */
	set_error_quiet(1);
	error("%s", n > 32 ? back + 32 : "no answer");
	_exit(0);
}

TEST(test_rendezvous_stranger_ignored_other_version_refused)
{
	struct world w = world_of(3, stranger_or_rank);
	g_port = w.port;
	w.before = stranger;
	w.n = 3;
	struct result res[MAXW];
	/* process 2 runs stranger() and exits inside before(): it never opens */
	CHECK(run_world(&w, res, 5) == 0);
	CHECK_MSG(res[0].rc == -1 && strstr(res[0].err, "speaks rendezvous protocol version 2") &&
			  strstr(res[0].err, "same asyncpp build"), "%s", res[0].err);
	CHECK_MSG(res[1].rc == -1 && strstr(res[1].err, "protocol version 2"), "%s", res[1].err);
}
