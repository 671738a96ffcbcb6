/* llmc.c - llm.c GPT-2 checkpoint import (see llmc.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "llmc.h"
#include "../../io/util.h"

/* llm.c's tensor order; each kind is stored for all layers at once. */
static const struct {
	const char *name;
	int per_layer;
} llmc_order[] = {
	{"wte", 0},     {"wpe", 0},      {"ln1w", 1},     {"ln1b", 1},
	{"qkvw", 1},    {"qkvb", 1},     {"attprojw", 1}, {"attprojb", 1},
	{"ln2w", 1},    {"ln2b", 1},     {"fcw", 1},      {"fcb", 1},
	{"fcprojw", 1}, {"fcprojb", 1},  {"lnfw", 0},     {"lnfb", 0},
};

#define CHUNK 65536

/* Read n values of elsize bytes (4 fp32, 2 bf16) into dst as floats. */
static int read_floats(FILE *fp, const char *path, float *dst, size_t n, int elsize,
		       unsigned char *buf)
{
	while (n) {
		size_t k = MIN(n, (size_t)CHUNK);
		if (fread(buf, elsize, k, fp) != k)
			return error("%s: %s", path,
				     ferror(fp) ? strerror(errno) : "unexpected end of file");
		for (size_t i = 0; i < k; i++) {
			uint32_t bits = elsize == 4 ? get_le32(buf + 4 * i)
						    : (uint32_t)get_le16(buf + 2 * i) << 16;
			memcpy(&dst[i], &bits, 4);
		}
		dst += k;
		n -= k;
	}
	return 0;
}

int llmc_load(const char *path, struct model_config *cfg, float **params)
{
	unsigned char hdr[1024], *buf = NULL;
	int32_t h[256];
	struct model_config c;
	struct model m = {0};
	struct stat sb;
	FILE *fp;
	int elsize, ret = -1;
	float *w = NULL;
	uint64_t want;

	*params = NULL;
	fp = fopen(path, "rb");
	if (!fp)
		return error("cannot open '%s': %s", path, strerror(errno));
	if (fstat(fileno(fp), &sb)) {
		error("%s: %s", path, strerror(errno));
		goto out;
	}
	if (fread(hdr, 1, sizeof(hdr), fp) != sizeof(hdr)) {
		error("%s: too short for an llm.c checkpoint header (%lld bytes)", path,
		      (long long)sb.st_size);
		goto out;
	}
	for (int i = 0; i < 256; i++)
		h[i] = (int32_t)get_le32(hdr + 4 * i);
	if (h[0] != LLMC_MAGIC) {
		error("%s: not an llm.c GPT-2 checkpoint (magic %d, expected %d)", path, h[0],
		      LLMC_MAGIC);
		goto out;
	}
	if (h[1] == LLMC_VERSION_FP32) {
		elsize = 4;
	} else if (h[1] == LLMC_VERSION_BF16) {
		elsize = 2;
	} else {
		error("%s: llm.c checkpoint version %d not supported (3 = fp32, 5 = bf16)", path,
		      h[1]);
		goto out;
	}
	if (h[2] <= 0 || h[3] <= 0 || h[4] <= 0 || h[5] <= 0 || h[6] <= 0 || h[7] < h[3]) {
		error("%s: bad sizes in header (maxT %d, V %d, L %d, NH %d, C %d, Vp %d)", path,
		      h[2], h[3], h[4], h[5], h[6], h[7]);
		goto out;
	}
	memset(&c, 0, sizeof(c));
	c.arch = ARCH_GPT2;
	c.T = h[2];
	c.V = h[3];
	c.L = h[4];
	c.NH = h[5];
	c.C = h[6];
	c.Vp = h[7];
	c.NKV = c.NH;
	c.tied = 1;
	c.eps = 1e-5f;
	c.rope_theta = 10000.0f;
	c.init_std = 0.02f;
	if (model_init(&m, &c)) {
		error("%s: the header's model is not valid", path);
		goto out;
	}
	want = 1024 + (uint64_t)m.numel * elsize;
	if ((uint64_t)sb.st_size != want) {
		error("%s: %lld bytes, but a %s checkpoint of these sizes (maxT %d, V %d, L %d, "
		      "NH %d, C %d, Vp %d) has %llu", path, (long long)sb.st_size,
		      elsize == 4 ? "fp32" : "bf16", c.T, c.V, c.L, c.NH, c.C, c.Vp,
		      (unsigned long long)want);
		goto out;
	}
	w = malloc(m.numel * sizeof(float));
	if (!w) {
		error("%s: cannot allocate %zu parameters", path, m.numel);
		goto out;
	}
	buf = xmalloc((size_t)CHUNK * 4);
	for (size_t k = 0; k < ARRAY_SIZE(llmc_order); k++) {
		int nl = llmc_order[k].per_layer ? c.L : 1;
		for (int l = 0; l < nl; l++) {
			char name[48];
			int i;
			if (llmc_order[k].per_layer)
				snprintf(name, sizeof(name), "h.%d.%s", l, llmc_order[k].name);
			else
				snprintf(name, sizeof(name), "%s", llmc_order[k].name);
			i = model_find_param(&m, name);
			if (i < 0) {
				error("%s: internal: no tensor '%s'", path, name);
				goto out;
			}
			if (read_floats(fp, path, w + m.params[i].offset, m.params[i].numel, elsize,
					buf))
				goto out;
		}
	}
	*cfg = m.cfg;
	*params = w;
	w = NULL;
	ret = 0;
out:
	free(w);
	free(buf);
	model_free(&m);
	fclose(fp);
	return ret;
}
