/* test_llmc.c - llm.c checkpoint import: the layout remapping, bf16, rejected
 * corruption, and the loss of an imported model against an independent
 * pure-Python GPT-2 (tests/scripts/gpt2_reference.py). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../model/formats/llmc.h"
#include "../../io/util.h"
#include "../../model/model.h"
#include "../test.h"

/* llm.c's order: name, per layer, numel per layer as a function of C */
static const struct {
	const char *name;
	int per_layer;
} order[] = {
	{"wte", 0},     {"wpe", 0},     {"ln1w", 1},     {"ln1b", 1},
	{"qkvw", 1},    {"qkvb", 1},    {"attprojw", 1}, {"attprojb", 1},
	{"ln2w", 1},    {"ln2b", 1},    {"fcw", 1},      {"fcb", 1},
	{"fcprojw", 1}, {"fcprojb", 1}, {"lnfw", 0},     {"lnfb", 0},
};

static size_t kind_numel(int k, int C, int Vp, int maxT)
{
	static const int mult[] = {0, 0, 1, 1, 3 * 1, 3, 1, 1, 1, 1, 4, 4, 4, 1, 1, 1};
	if (k == 0)
		return (size_t)Vp * C;
	if (k == 1)
		return (size_t)maxT * C;
	if (k == 4 || k == 6 || k == 10 || k == 12)
		return (size_t)mult[k] * C * C;
	return (size_t)mult[k] * C;
}

/* A value that names where it came from: kind k, layer l, index i. */
static float tag(int k, int l, size_t i)
{
	return (float)(k * 1000000 + l * 100000 + (int)i);
}

/* Write an llm.c checkpoint whose every value is its tag; version 3 or 5;
 * extra bytes appended (or removed when negative). */
static void write_tagged(const char *path, int version, int maxT, int V, int L, int NH, int C,
			 int Vp, long extra)
{
	FILE *fp = fopen(path, "wb");
	unsigned char hdr[1024] = {0};
	int h[8] = {LLMC_MAGIC, version, maxT, V, L, NH, C, Vp};
	for (int i = 0; i < 8; i++)
		put_le32(hdr + 4 * i, (uint32_t)h[i]);
	fwrite(hdr, 1, sizeof(hdr), fp);
	for (int k = 0; k < 16; k++) {
		int nl = order[k].per_layer ? L : 1;
		size_t n = kind_numel(k, C, Vp, maxT);
		for (int l = 0; l < nl; l++)
			for (size_t i = 0; i < n; i++) {
				float v = tag(k, l, i);
				uint32_t bits;
				unsigned char b[4];
				memcpy(&bits, &v, 4);
				if (version == 5) {
					put_le16(b, (uint16_t)(bits >> 16));
					fwrite(b, 1, 2, fp);
				} else {
					put_le32(b, bits);
					fwrite(b, 1, 4, fp);
				}
			}
	}
	for (long i = 0; i < extra; i++)
		fputc(0, fp);
	fclose(fp);
	if (extra < 0) {
		FILE *f = fopen(path, "rb+");
		fseek(f, 0, SEEK_END);
		long n = ftell(f);
		fclose(f);
		CHECK(truncate(path, n + extra) == 0);
	}
}

/* A tag (a non-negative integer below 2^24) truncated to bf16: only its 8
 * most significant bits survive. Integer arithmetic, independent of the
 * loader's bit manipulation. */
static float bf16_truncated_tag(int k, int l, size_t i)
{
	uint32_t n = (uint32_t)(k * 1000000 + l * 100000 + (int)i);
	int msb = 31;
	if (!n)
		return 0.0f;
	while (!(n >> msb))
		msb--;
	if (msb >= 8)
		n &= ~((1u << (msb - 7)) - 1);
	return (float)n;
}

static void check_layout(int version)
{
	char path[512];
	struct model_config c;
	struct model m;
	float *w;
	const int maxT = 8, V = 50, L = 3, NH = 2, C = 16, Vp = 64;

	snprintf(path, sizeof(path), "%s/tag%d.bin", test_tmpdir(), version);
	write_tagged(path, version, maxT, V, L, NH, C, Vp, 0);
	CHECK(llmc_load(path, &c, &w) == 0);
	CHECK(c.arch == ARCH_GPT2 && c.V == V && c.Vp == Vp && c.L == L && c.C == C &&
	      c.NH == NH && c.T == maxT && c.tied && c.F == 4 * C);
	CHECK(model_init(&m, &c) == 0);
	for (int k = 0; k < 16; k++) {
		int nl = order[k].per_layer ? L : 1;
		for (int l = 0; l < nl; l++) {
			char name[48];
			int i;
			if (order[k].per_layer)
				snprintf(name, sizeof(name), "h.%d.%s", l, order[k].name);
			else
				snprintf(name, sizeof(name), "%s", order[k].name);
			i = model_find_param(&m, name);
			CHECK_MSG(i >= 0, "no %s", name);
			CHECK(m.params[i].numel == kind_numel(k, C, Vp, maxT));
			for (size_t j = 0; j < m.params[i].numel; j++) {
				float want = version == 5 ? bf16_truncated_tag(k, l, j)
							  : tag(k, l, j);
				CHECK_MSG(w[m.params[i].offset + j] == want, "%s[%zu] = %g, want %g",
					  name, j, w[m.params[i].offset + j], want);
			}
		}
	}
	free(w);
	model_free(&m);
}

TEST(layout_fp32)
{
	check_layout(3);
}

TEST(layout_bf16)
{
	check_layout(5);
}

TEST(rejects_corruption)
{
	char path[512];
	struct model_config c;
	float *w = (float *)1;
	FILE *fp;

	snprintf(path, sizeof(path), "%s/bad.bin", test_tmpdir());
	set_error_quiet(1);
	/* one byte too many, one too few */
	write_tagged(path, 3, 8, 50, 2, 2, 16, 64, 1);
	CHECK(llmc_load(path, &c, &w) == -1 && w == NULL);
	CHECK(strstr(last_error(), path) && strstr(last_error(), "bytes"));
	write_tagged(path, 3, 8, 50, 2, 2, 16, 64, -1);
	CHECK(llmc_load(path, &c, &w) == -1);
	/* unknown version */
	write_tagged(path, 4, 8, 50, 2, 2, 16, 64, 0);
	CHECK(llmc_load(path, &c, &w) == -1 && strstr(last_error(), "version 4"));
	/* Vp < V, C not a multiple of NH */
	write_tagged(path, 3, 8, 50, 2, 2, 16, 32, 0);
	CHECK(llmc_load(path, &c, &w) == -1);
	write_tagged(path, 3, 8, 50, 2, 3, 16, 64, 0);
	CHECK(llmc_load(path, &c, &w) == -1);
	/* huge sizes in a small file: rejected by the size check, no
	 * allocation */
	write_tagged(path, 3, 8, 50, 2, 2, 16, 64, 0);
	fp = fopen(path, "rb+");
	{
		unsigned char b[4];
		put_le32(b, 1 << 20);
		fseek(fp, 4 * 6, SEEK_SET);
		fwrite(b, 1, 4, fp);
	}
	fclose(fp);
	CHECK(llmc_load(path, &c, &w) == -1);
	/* bad magic, short file, missing file */
	fp = fopen(path, "wb");
	fputs("not a checkpoint", fp);
	fclose(fp);
	CHECK(llmc_load(path, &c, &w) == -1);
	CHECK(llmc_load("/nonexistent/x.bin", &c, &w) == -1 &&
	      strstr(last_error(), "/nonexistent/x.bin"));
	set_error_quiet(0);
}

/* The loss of the imported checkpoint equals the independent reference. */
TEST(loss_matches_python_reference)
{
	char path[512], cmd[1200];
	const char *root = getenv("ROOT");
	struct model_config c;
	struct model m;
	struct stage st;
	float *w, loss = NAN;
	double want;
	int B, T;
	int32_t *tok, *tgt;
	FILE *p;

	if (system("command -v python3 >/dev/null 2>&1") != 0)
		SKIP("python3 not found");
	snprintf(path, sizeof(path), "%s/tests/scripts/gpt2_reference.py", root ? root : ".");
	if (access(path, R_OK) != 0)
		SKIP("tests/scripts/gpt2_reference.py not found (run from tests/run)");
	snprintf(path, sizeof(path), "%s/ref.bin", test_tmpdir());
	snprintf(cmd, sizeof(cmd), "python3 '%s/tests/scripts/gpt2_reference.py' '%s'",
		 root ? root : ".", path);
	p = popen(cmd, "r");
	CHECK(p);
	CHECK(fscanf(p, "%d %d", &B, &T) == 2 && B > 0 && T > 0 && B * T < 4096);
	tok = xmalloc((size_t)B * T * 4);
	tgt = xmalloc((size_t)B * T * 4);
	CHECK(fscanf(p, " tokens:") == 0);
	for (int i = 0; i < B * T; i++)
		CHECK(fscanf(p, "%d", &tok[i]) == 1);
	CHECK(fscanf(p, " targets:") == 0);
	for (int i = 0; i < B * T; i++)
		CHECK(fscanf(p, "%d", &tgt[i]) == 1);
	CHECK(fscanf(p, " loss: %lf", &want) == 1);
	CHECK(pclose(p) == 0);

	CHECK(llmc_load(path, &c, &w) == 0);
	CHECK(model_init(&m, &c) == 0);
	CHECK(stage_init(&st, &m, &backend_cpu, NULL, 0, B, T, 1) == 0);
	stage_forward(&st, 0, w, tok, NULL, tgt, NULL, &loss, NULL, NULL, 1.0f);
	CHECK_MSG(fabs(loss - want) <= 1e-5 * fabs(want), "loss %.9g, reference %.9g", loss,
		  want);
	stage_free(&st);
	model_free(&m);
	free(w);
	free(tok);
	free(tgt);
}
