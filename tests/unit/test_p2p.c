/* test_p2p.c - the point-to-point messages of sched/comm/p2p.h over the TCP
 * mesh (p2p_tcp.c), between forked processes on 127.0.0.1: every message
 * arrives whole, in order per (source, channel, tag), whether its receive
 * was posted before or after it came, to itself too, empty or 48 MB (two
 * ranks sending each other 48 MB at once do not deadlock); and every
 * failure ends the run with a message instead of a hang: a size that does
 * not match, a peer that dies after talking, a peer that never sends
 * (after pipeline.timeout), while ranks that finish at different times
 * end cleanly.
 *
 * Each process runs a body after the rendezvous and the mesh are up; its
 * stderr goes to a file the parent reads, so a process that ends the job
 * (exit 1 through dist_abort) still leaves its message.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../io/util.h"
#include "../../sched/comm/p2p.h"
#include "../../sched/comm/p2p_carrier.h"
#include "../../sched/comm/rendezvous.h"
#include "../test.h"

#define MAXW 4

struct outcome {
	int status;     /* exit status; -1: killed as a hang */
	double seconds; /* from fork to exit */
	char err[2048]; /* what it printed on stderr */
};

static void pause_ms(int ms)
{
	struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&t, NULL);
}

/* n processes; process r runs body(r) with the mesh up (timeout: each
 * wait's limit) and exits with its return value after p2p_tcp_stop. */
static void run_world(int n, int (*body)(const struct p2p_carrier *k, int r), double timeout,
		      double limit,
		      struct outcome *out)
{
	set_error_quiet(1);
	int port = rdv_free_port("127.0.0.1");
	set_error_quiet(0);
	double *t_end = mmap(NULL, sizeof(double) * MAXW, PROT_READ | PROT_WRITE,
			     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	char path[MAXW][64];
	pid_t pid[MAXW];
	double t0 = now_sec();
	fflush(stdout);
	fflush(stderr);
	for (int r = 0; r < n; r++) {
		snprintf(path[r], sizeof(path[r]), "/tmp/test_p2p.%d.%d", (int)getpid(), r);
		pid[r] = fork();
		if (pid[r] == 0) {
			if (!freopen(path[r], "w", stderr))
				_exit(99);
			struct rdv_opts o = {"127.0.0.1", port, r, n, 5, timeout};
			struct rdv *rdv = rdv_open(&o);
			struct p2p_mesh *mesh = rdv ? p2p_tcp_start(rdv, timeout, 5) : NULL;
			if (!mesh)
				_exit(98);
			struct p2p_carrier k = p2p_tcp_carrier(mesh);
			int rc = body(&k, r);
			p2p_tcp_stop(mesh);
			rdv_close(rdv);
			t_end[r] = now_sec();
			fflush(stderr);
			_exit(rc);
		}
	}
	int left = n;
	while (left && now_sec() - t0 < limit) {
		left = 0;
		for (int r = 0; r < n; r++) {
			if (pid[r] <= 0)
				continue;
			int st;
			if (waitpid(pid[r], &st, WNOHANG) == pid[r]) {
				out[r].status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
				out[r].seconds = now_sec() - t0;
				pid[r] = 0;
			} else {
				left++;
			}
		}
		pause_ms(5);
	}
	for (int r = 0; r < n; r++) {
		if (pid[r] > 0) {
			kill(pid[r], SIGKILL);
			waitpid(pid[r], NULL, 0);
			out[r].status = -1;
		}
		FILE *f = fopen(path[r], "r");
		size_t got = f ? fread(out[r].err, 1, sizeof(out[r].err) - 1, f) : 0;
		out[r].err[got] = 0;
		if (f)
			fclose(f);
		unlink(path[r]);
	}
	munmap(t_end, sizeof(double) * MAXW);
}

static unsigned char byte_of(int from, int to, int tag, size_t i)
{
	return (unsigned char)(from * 37 + to * 11 + tag * 5 + i * 7 + (i >> 11));
}

static void fill(unsigned char *p, size_t n, int from, int to, int tag)
{
	for (size_t i = 0; i < n; i++)
		p[i] = byte_of(from, to, tag, i);
}

static int check(const unsigned char *p, size_t n, int from, int to, int tag)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != byte_of(from, to, tag, i)) {
			fprintf(stderr, "rank %d: byte %zu of tag %d from rank %d is wrong\n", to, i,
				tag, from);
			return 1;
		}
	return 0;
}

/* ---- messages ---- */

#define BIG ((size_t)48 << 20)

/* World of 3. Two channels; on each, every rank sends every rank (itself
 * too) one message with tag 9 and then three with tag 5 (1000, 0 and 70000
 * bytes: received out of order, a size would not match and end the run);
 * ranks 1 and 2 post their receives late (the messages come first), rank 0
 * posts early. Then ranks 0 and 1 send each other 48 MB before either
 * posts its receive. */
static int messages(const struct p2p_carrier *k, int r)
{
	const int n = 3;
	static const size_t size5[3] = {1000, 0, 70000};
	struct p2p *ch[2] = {p2p_open(k), p2p_open(k)};
	if (!ch[0] || !ch[1])
		return 10;
	/* [channel][peer][k] buffers: k 0..2 tag 5, k 3 tag 9 */
	unsigned char *out[2][3][4], *in[2][3][4];
	struct p2p_op *ops[2 * 2 * 3 * 4 * 2];
	int nops = 0;
	size_t sz[4] = {size5[0], size5[1], size5[2], 333};
	for (int c = 0; c < 2; c++)
		for (int q = 0; q < n; q++)
			for (int k = 0; k < 4; k++) {
				int tag = k < 3 ? 5 : 9;
				out[c][q][k] = xmalloc(sz[k] + 1);
				in[c][q][k] = xcalloc(sz[k] + 1, 1);
				fill(out[c][q][k], sz[k], r, q, tag * 10 + k + c * 100);
			}
	if (r == 0) /* receives first */
		for (int c = 0; c < 2; c++)
			for (int q = 0; q < n; q++)
				for (int k = 0; k < 4; k++)
					ops[nops++] = p2p_irecv(ch[c], in[c][q][k], sz[k], q,
								k < 3 ? 5 : 9);
	for (int c = 1; c >= 0; c--) /* channel 1 first: channels never mix */
		for (int q = 0; q < n; q++) {
			ops[nops++] = p2p_isend(ch[c], out[c][q][3], sz[3], q, 9); /* overtakes nothing */
			for (int k = 0; k < 3; k++) /* tag 5: received in this order (sizes differ) */
				ops[nops++] = p2p_isend(ch[c], out[c][q][k], sz[k], q, 5);
		}
	if (r != 0) {
		pause_ms(100); /* let them come first */
		p2p_test(ch[0], ops, nops);
		for (int c = 0; c < 2; c++)
			for (int q = 0; q < n; q++)
				for (int k = 0; k < 4; k++)
					ops[nops++] = p2p_irecv(ch[c], in[c][q][k], sz[k], q,
								k < 3 ? 5 : 9);
	}
	p2p_wait(ch[0], ops, nops, 20, 0, "the messages");
	for (int c = 0; c < 2; c++)
		for (int q = 0; q < n; q++)
			for (int k = 0; k < 4; k++)
				if (check(in[c][q][k], sz[k], q, r, (k < 3 ? 5 : 9) * 10 + k + c * 100))
					return 11;
	if (r < 2) {
		unsigned char *bo = xmalloc(BIG), *bi = xcalloc(BIG, 1);
		int peer = 1 - r;
		fill(bo, BIG, r, peer, 77);
		struct p2p_op *big[2];
		big[0] = p2p_isend(ch[0], bo, BIG, peer, 77);
		pause_ms(50);
		big[1] = p2p_irecv(ch[0], bi, BIG, peer, 77);
		p2p_wait(ch[0], big, 2, 20, 0, "48 MB from rank %d", peer);
		if (check(bi, BIG, peer, r, 77))
			return 12;
		free(bo);
		free(bi);
	}
	for (int c = 0; c < 2; c++) {
		for (int q = 0; q < n; q++)
			for (int k = 0; k < 4; k++) {
				free(out[c][q][k]);
				free(in[c][q][k]);
			}
		p2p_close(ch[c]);
	}
	return 0;
}

TEST(test_p2p_tcp_messages_arrive_whole_and_in_order)
{
	struct outcome o[MAXW] = {0};
	run_world(3, messages, 20, 30, o);
	for (int r = 0; r < 3; r++) {
		if (o[r].status)
			fprintf(stderr, "rank %d: status %d: %s\n", r, o[r].status, o[r].err);
		CHECK(o[r].status == 0);
	}
}

/* The size of a message is not the receive's. */
static int wrong_size(const struct p2p_carrier *k, int r)
{
	struct p2p *ch = p2p_open(k);
	char buf[16] = {0};
	struct p2p_op *op = r == 1 ? p2p_isend(ch, buf, 8, 0, 3) : p2p_irecv(ch, buf, 16, 1, 3);
	p2p_wait(ch, &op, 1, 10, 0, "the message");
	return 0;
}

TEST(test_p2p_tcp_size_mismatch_named)
{
	struct outcome o[MAXW] = {0};
	run_world(2, wrong_size, 10, 15, o);
	CHECK(o[0].status == 1);
	CHECK(strstr(o[0].err, "from rank 1 (channel 1, tag 3) has 8 bytes where 16 were "
			       "expected") != NULL);
	CHECK(o[1].status >= 0); /* rank 1 ends too */
}

/* Rank 1 says something, then dies; rank 0 waits for more from it. */
static int dies(const struct p2p_carrier *k, int r)
{
	struct p2p *ch = p2p_open(k);
	int x = 42;
	if (r == 1) {
		struct p2p_op *op = p2p_isend(ch, &x, sizeof(x), 0, 1);
		p2p_wait(ch, &op, 1, 10, 0, "rank 0 to take it");
		pause_ms(200);
		_exit(3); /* no goodbye */
	}
	struct p2p_op *op[2] = {p2p_irecv(ch, &x, sizeof(x), 1, 1),
				p2p_irecv(ch, &x, sizeof(x), 1, 2)};
	p2p_wait(ch, op, 2, 30, 0, "the second message");
	return 0;
}

TEST(test_p2p_tcp_dead_peer_named_at_once)
{
	struct outcome o[MAXW] = {0};
	run_world(2, dies, 30, 15, o);
	CHECK(o[1].status == 3);
	CHECK(o[0].status == 1);
	CHECK(o[0].seconds < 10); /* long before the 30 s timeout */
	CHECK(strstr(o[0].err, "rank 1 closed its connection without saying goodbye") != NULL);
}

/* Rank 1 never sends; rank 0's wait ends at its timeout with the words. */
static int silent(const struct p2p_carrier *k, int r)
{
	struct p2p *ch = p2p_open(k);
	int x;
	if (r == 1) {
		pause_ms(4000);
		return 0;
	}
	struct p2p_op *op = p2p_irecv(ch, &x, sizeof(x), 1, 1);
	p2p_wait(ch, &op, 1, 1, 0, "the activation of micro-batch %d from rank %d", 7, 1);
	return 0;
}

TEST(test_p2p_tcp_silent_peer_named_after_the_timeout)
{
	struct outcome o[MAXW] = {0};
	run_world(2, silent, 1, 15, o);
	CHECK(o[0].status == 1);
	CHECK(strstr(o[0].err, "rank 0 (stage 0) waited 1 s for the activation of "
			       "micro-batch 7 from rank 1, which never came") != NULL);
}

/* Ranks that finish a second apart end cleanly (the goodbye). */
static int staggered(const struct p2p_carrier *k, int r)
{
	struct p2p *ch = p2p_open(k);
	int x = r, y = -1;
	struct p2p_op *op[2] = {p2p_isend(ch, &x, sizeof(x), (r + 1) % 3, 0),
				p2p_irecv(ch, &y, sizeof(y), (r + 2) % 3, 0)};
	p2p_wait(ch, op, 2, 10, 0, "the ring");
	pause_ms(400 * r);
	p2p_close(ch);
	return y == (r + 2) % 3 ? 0 : 20;
}

TEST(test_p2p_tcp_staggered_ends_are_clean)
{
	struct outcome o[MAXW] = {0};
	run_world(3, staggered, 10, 15, o);
	for (int r = 0; r < 3; r++) {
		if (o[r].status)
			fprintf(stderr, "rank %d: status %d: %s\n", r, o[r].status, o[r].err);
		CHECK(o[r].status == 0);
	}
}


/* ---- the frame reader (what tests/fuzz/fuzz_p2p.c fuzzes) ---- */

static size_t frame(unsigned char *b, unsigned type, uint32_t chan, uint32_t tag, uint64_t n)
{
	put_le32(b, 0x50325041u);
	b[4] = 1, b[5] = 0, b[6] = (unsigned char)type, b[7] = 0;
	put_le32(b + 8, chan);
	put_le32(b + 12, tag);
	put_le64(b + 16, n);
	return 24;
}

/* feed the bytes; 1 when refused, with the message containing want */
static int refused_with(const unsigned char *b, size_t n, const char *want)
{
	set_error_quiet(1);
	int rc = p2p_tcp_fuzz(b, n);
	set_error_quiet(0);
	if (rc == 1 && want && !strstr(last_error(), want)) {
		fprintf(stderr, "refused with '%s', expected '%s'\n", last_error(), want);
		return 0;
	}
	return rc == 1;
}

TEST(test_p2p_tcp_frames_read_or_refused)
{
	static unsigned char b[4096];
	size_t n = frame(b, 1, 3, 1, 0); /* hello from rank 1 of 3 */
	size_t hello = n;
	n += frame(b + n, 2, 1, 0, 0);
	n += frame(b + n, 2, 1, 1, 16);
	n += 16;
	n += frame(b + n, 2, 1, 2, 1000);
	n += 1000;
	n += frame(b + n, 2, 5, 5, 100); /* unexpected: kept */
	n += 100;
	size_t bye = n;
	n += frame(b + n, 3, 0, 0, 0);
	CHECK(!refused_with(b, n, NULL));
	/* the same without the goodbye: the end is a crash */
	CHECK(refused_with(b, bye, "rank 1 closed its connection without saying goodbye"));
	/* a receive of 16 bytes meets 15 */
	n = hello + frame(b + hello, 2, 1, 1, 15) + 15;
	CHECK(refused_with(b, n, "has 15 bytes where 16 were expected"));
	/* data before the hello */
	n = frame(b, 2, 1, 0, 0);
	CHECK(refused_with(b, n, "a message on a connection that carries none"));
	/* another world, another rank, a second hello, not a frame at all */
	CHECK(refused_with(b, frame(b, 1, 4, 1, 0), "world of 4 processes"));
	CHECK(refused_with(b, frame(b, 1, 3, 0, 0), "comes from rank 0 of 3"));
	n = frame(b, 1, 3, 1, 0);
	n += frame(b + n, 1, 3, 1, 0);
	CHECK(refused_with(b, n, "a second greeting"));
	memcpy(b, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27);
	CHECK(refused_with(b, 27, "not asyncpp messages"));
	/* a header that claims 2^60 bytes and sends 64: refused at the end,
	 * having held only what came */
	n = frame(b, 1, 3, 1, 0);
	n += frame(b + n, 2, 9, 9, (uint64_t)1 << 60) + 64;
	memset(b + n - 64, 7, 64);
	CHECK(refused_with(b, n, "closed its connection without saying goodbye"));
}
