/* test_safetensors.c - safetensors export: the header parsed back by a small
 * reader here (and by Python's json/struct when python3 exists), offsets,
 * shapes, data and metadata; bad metadata rejected; atomic write. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../model/formats/safetensors.h"
#include "../../io/util.h"
#include "../../model/model.h"
#include "../test.h"

/* ---- a minimal reader for the header's JSON ---- */

struct ent {
	char name[64], dtype[8];
	long shape[4], off[2];
	int ndim;
};
struct hdr {
	struct ent e[256];
	int n;
	char meta_k[64][32], meta_v[64][64];
	int nmeta;
};

static const char *ws(const char *s)
{
	while (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r')
		s++;
	return s;
}

/* a string without escapes (all ours are plain) into out */
static const char *str(const char *s, char *out, size_t cap)
{
	size_t n = 0;
	s = ws(s);
	if (*s++ != '"')
		return NULL;
	while (*s && *s != '"') {
		if (*s == '\\' || n + 1 >= cap)
			return NULL;
		out[n++] = *s++;
	}
	out[n] = 0;
	return *s == '"' ? s + 1 : NULL;
}

static const char *ints(const char *s, long *v, int cap, int *n)
{
	s = ws(s);
	*n = 0;
	if (*s++ != '[')
		return NULL;
	for (;;) {
		char *end;
		s = ws(s);
		if (*s == ']')
			return s + 1;
		if (*n == cap)
			return NULL;
		v[(*n)++] = strtol(s, &end, 10);
		if (end == s)
			return NULL;
		s = ws(end);
		if (*s == ',')
			s++;
	}
}

static const char *lit(const char *s, char c)
{
	s = ws(s);
	return *s == c ? s + 1 : NULL;
}

static int parse_header(const char *s, struct hdr *h)
{
	char key[64];
	memset(h, 0, sizeof(*h));
	if (!(s = lit(s, '{')))
		return -1;
	for (;;) {
		if (!(s = str(s, key, sizeof(key))) || !(s = lit(s, ':')) || !(s = lit(s, '{')))
			return -1;
		if (!strcmp(key, "__metadata__")) {
			while (*ws(s) != '}') {
				if (h->nmeta == 64 ||
				    !(s = str(s, h->meta_k[h->nmeta], 32)) || !(s = lit(s, ':')) ||
				    !(s = str(s, h->meta_v[h->nmeta], 64)))
					return -1;
				h->nmeta++;
				if (*ws(s) == ',')
					s = ws(s) + 1;
			}
		} else {
			struct ent *e = &h->e[h->n];
			int n;
			if (h->n == 256)
				return -1;
			snprintf(e->name, sizeof(e->name), "%s", key);
			while (*ws(s) != '}') {
				char f[32];
				if (!(s = str(s, f, sizeof(f))) || !(s = lit(s, ':')))
					return -1;
				if (!strcmp(f, "dtype"))
					s = str(s, e->dtype, sizeof(e->dtype));
				else if (!strcmp(f, "shape"))
					s = ints(s, e->shape, 4, &e->ndim);
				else if (!strcmp(f, "data_offsets")) {
					s = ints(s, e->off, 2, &n);
					if (s && n != 2)
						return -1;
				} else
					return -1;
				if (!s)
					return -1;
				if (*ws(s) == ',')
					s = ws(s) + 1;
			}
			h->n++;
		}
		s = ws(s) + 1; /* the tensor's or metadata's '}' */
		s = ws(s);
		if (*s == '}')
			break;
		if (*s++ != ',')
			return -1;
	}
	s = ws(s + 1);
	return *s ? -1 : 0;
}

static const char *meta(const struct hdr *h, const char *k)
{
	for (int i = 0; i < h->nmeta; i++)
		if (!strcmp(h->meta_k[i], k))
			return h->meta_v[i];
	return NULL;
}

static void roundtrip(int arch, int tied)
{
	struct model_config c;
	struct model m;
	struct buf f = {0};
	struct hdr *h = xcalloc(1, sizeof(*h));
	char path[512], *json;
	float *w;
	uint64_t hlen;
	size_t data_len = 0;

	memset(&c, 0, sizeof(c));
	c.arch = arch;
	c.V = 67;
	c.L = 2;
	c.C = 32;
	c.NH = 4;
	c.NKV = arch == ARCH_LLAMA ? 2 : 0;
	c.T = 8;
	c.tied = tied;
	CHECK(model_init(&m, &c) == 0);
	w = xmalloc(m.numel * 4);
	model_init_weights(&m, w, 5);
	snprintf(path, sizeof(path), "%s/m%d%d.safetensors", test_tmpdir(), arch, tied);
	CHECK(safetensors_write(path, &m, w, "\"step\": \"12\", \"note\": \"a \\\"q\\\"\"") == 0);
	CHECK(read_file(path, &f) == 0);
	CHECK(f.len > 8);
	hlen = get_le64(f.data);
	CHECK(hlen % 8 == 0 && 8 + hlen <= f.len);
	json = xmalloc(hlen + 1);
	memcpy(json, f.data + 8, hlen);
	json[hlen] = 0;
	/* our reader does not take escapes: cut the "note" pair off */
	{
		char *note = strstr(json, "\"note\""), *end;
		CHECK(note);
		while (*note != ',')
			note--;
		end = strchr(note + 8, '}');
		memmove(note, end, strlen(end) + 1);
	}
	CHECK_MSG(parse_header(json, h) == 0, "header does not parse: %.200s", json);
	CHECK(h->n == m.n_params);
	CHECK(!strcmp(meta(h, "arch"), arch == ARCH_GPT2 ? "gpt2" : "llama"));
	CHECK(atoi(meta(h, "vocab_size")) == 67 && atoi(meta(h, "padded_vocab_size")) == 128);
	CHECK(atoi(meta(h, "n_kv_head")) == m.cfg.NKV && atoi(meta(h, "d_ff")) == m.cfg.F);
	CHECK(atoi(meta(h, "tied")) == tied && !strcmp(meta(h, "step"), "12"));
	CHECK(!strcmp(meta(h, "format"), "pt"));
	for (int i = 0; i < m.n_params; i++) {
		const struct param_info *p = &m.params[i];
		const struct ent *e = &h->e[i];
		CHECK(!strcmp(e->name, p->name));
		CHECK(!strcmp(e->dtype, "F32"));
		CHECK(e->ndim == (p->cols ? 2 : 1) && e->shape[0] == p->rows &&
		      (!p->cols || e->shape[1] == p->cols));
		/* contiguous, in table order */
		CHECK(e->off[0] == (long)data_len && e->off[1] == (long)(data_len + p->numel * 4));
		for (size_t j = 0; j < p->numel; j++)
			CHECK(get_le32(f.data + 8 + hlen + data_len + 4 * j) ==
			      ({ uint32_t b; memcpy(&b, &w[p->offset + j], 4); b; }));
		data_len += p->numel * 4;
	}
	CHECK(8 + hlen + data_len == f.len);

	/* Python's json and struct read it the same way */
	if (system("command -v python3 >/dev/null 2>&1") == 0) {
		char cmd[1024], out[256] = "";
		FILE *p;
		snprintf(cmd, sizeof(cmd),
			 "python3 -c 'import json,struct,sys\n"
			 "b=open(sys.argv[1],\"rb\").read(); n=struct.unpack(\"<Q\",b[:8])[0]\n"
			 "h=json.loads(b[8:8+n]); d=b[8+n:]; m=h.pop(\"__metadata__\"); pos=0\n"
			 "for k,v in h.items():\n"
			 " s,e=v[\"data_offsets\"]; assert s==pos and v[\"dtype\"]==\"F32\"\n"
			 " c=1\n"
			 " for x in v[\"shape\"]: c*=x\n"
			 " assert e-s==4*c; pos=e\n"
			 "assert pos==len(d)\n"
			 "w=struct.unpack(\"<%%df\"%%(len(d)//4),d)\n"
			 "print(len(h),m[\"arch\"],m[\"note\"],\"%%.6f\"%%sum(abs(x) for x in w))' '%s'",
			 path);
		p = popen(cmd, "r");
		CHECK(p);
		if (!fgets(out, sizeof(out), p))
			out[0] = 0;
		CHECK(pclose(p) == 0);
		{
			char want[256];
			double s = 0;
			for (size_t j = 0; j < m.numel; j++)
				s += fabs(w[j]);
			snprintf(want, sizeof(want), "%d %s a \"q\" %.6f\n", m.n_params,
				 arch == ARCH_GPT2 ? "gpt2" : "llama", s);
			CHECK_MSG(!strcmp(out, want), "python says '%s', want '%s'", out, want);
		}
	}
	free(json);
	free(h);
	free(w);
	buf_free(&f);
	model_free(&m);
}

TEST(roundtrip_gpt2)
{
	roundtrip(ARCH_GPT2, 1);
}

TEST(roundtrip_llama_untied)
{
	roundtrip(ARCH_LLAMA, 0);
}

TEST(bad_metadata_and_paths)
{
	struct model_config c;
	struct model m;
	float *w;
	char path[512];
	memset(&c, 0, sizeof(c));
	c.arch = ARCH_LLAMA;
	c.V = 10;
	c.L = 1;
	c.C = 8;
	c.NH = 2;
	c.T = 4;
	c.tied = 1;
	CHECK(model_init(&m, &c) == 0);
	w = xcalloc(m.numel, 4);
	snprintf(path, sizeof(path), "%s/x.safetensors", test_tmpdir());
	set_error_quiet(1);
	CHECK(safetensors_write(path, &m, w, "\"step\": 12") == -1); /* not a string */
	CHECK(safetensors_write(path, &m, w, "\"a\": \"b\",") == -1);
	CHECK(safetensors_write(path, &m, w, "{\"a\": \"b\"}") == -1);
	CHECK(safetensors_write(path, &m, w, "\"a\": \"b\\x\"") == -1);
	CHECK(access(path, F_OK) != 0); /* nothing written */
	CHECK(safetensors_write("/nonexistent/dir/x.safetensors", &m, w, NULL) == -1);
	set_error_quiet(0);
	CHECK(safetensors_write(path, &m, w, "") == 0);
	CHECK(safetensors_write(path, &m, w, NULL) == 0); /* overwrite */
	CHECK(access(path, F_OK) == 0);
	free(w);
	model_free(&m);
}
