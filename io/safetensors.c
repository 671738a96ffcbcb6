/* safetensors.c - safetensors export (see safetensors.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"
#include "util.h"

static void put_str(struct buf *b, const char *s)
{
	buf_append(b, s, strlen(s));
}

static void put_fmt(struct buf *b, const char *fmt, ...) PRINTF_LIKE(2, 3);
static void put_fmt(struct buf *b, const char *fmt, ...)
{
	char tmp[256];
	va_list ap;
	int n;
	va_start(ap, fmt);
	n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	if (n > 0)
		buf_append(b, tmp, MIN((size_t)n, sizeof(tmp) - 1));
}

/* Skip one JSON string at *p (after whitespace); -1 when malformed. */
static int skip_json_string(const char **p)
{
	const char *s = *p;
	while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
		s++;
	if (*s++ != '"')
		return -1;
	for (; *s != '"'; s++) {
		if ((unsigned char)*s < 0x20)
			return -1;
		if (*s == '\\') {
			s++;
			if (*s == 'u') {
				for (int i = 1; i <= 4; i++)
					if (!s[i] || !strchr("0123456789abcdefABCDEF", s[i]))
						return -1;
				s += 4;
			} else if (!*s || !strchr("\"\\/bfnrt", *s)) {
				return -1;
			}
		}
	}
	*p = s + 1;
	return 0;
}

static const char *skip_ws(const char *s)
{
	while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
		s++;
	return s;
}

/* "k": "v" (, "k": "v")* */
static int valid_pairs(const char *s)
{
	for (;;) {
		if (skip_json_string(&s))
			return 0;
		s = skip_ws(s);
		if (*s++ != ':')
			return 0;
		if (skip_json_string(&s))
			return 0;
		s = skip_ws(s);
		if (!*s)
			return 1;
		if (*s++ != ',')
			return 0;
	}
}

int safetensors_write(const char *path, const struct model *m, const float *params,
		      const char *metadata_json_pairs)
{
	const struct model_config *c = &m->cfg;
	struct buf h = {0};
	struct atomic_file af;
	unsigned char len8[8], *chunk;
	size_t off = 0;

	if (metadata_json_pairs && *skip_ws(metadata_json_pairs) &&
	    !valid_pairs(metadata_json_pairs))
		return error("%s: metadata is not a list of JSON string pairs: %.80s", path,
			     metadata_json_pairs);
	put_str(&h, "{\"__metadata__\":{\"format\":\"pt\"");
	put_fmt(&h, ",\"arch\":\"%s\"", c->arch == ARCH_GPT2 ? "gpt2" : "llama");
	put_fmt(&h, ",\"vocab_size\":\"%d\",\"padded_vocab_size\":\"%d\"", c->V, c->Vp);
	put_fmt(&h, ",\"n_layer\":\"%d\",\"d_model\":\"%d\"", c->L, c->C);
	put_fmt(&h, ",\"n_head\":\"%d\",\"n_kv_head\":\"%d\",\"head_dim\":\"%d\"", c->NH, c->NKV,
		c->HD);
	put_fmt(&h, ",\"d_ff\":\"%d\",\"seq_len\":\"%d\",\"tied\":\"%d\"", c->F, c->T, c->tied);
	put_fmt(&h, ",\"norm_eps\":\"%.9g\",\"rope_theta\":\"%.9g\"", c->eps, c->rope_theta);
	if (metadata_json_pairs && *skip_ws(metadata_json_pairs)) {
		put_str(&h, ",");
		put_str(&h, metadata_json_pairs);
	}
	put_str(&h, "}");
	for (int i = 0; i < m->n_params; i++) {
		const struct param_info *p = &m->params[i];
		size_t bytes = p->numel * 4;
		put_fmt(&h, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%d", p->name, p->rows);
		if (p->cols > 0)
			put_fmt(&h, ",%d", p->cols);
		put_fmt(&h, "],\"data_offsets\":[%zu,%zu]}", off, off + bytes);
		off += bytes;
	}
	put_str(&h, "}");
	while (h.len % 8)
		put_str(&h, " ");

	if (atomic_open(&af, path)) {
		buf_free(&h);
		return -1;
	}
	put_le64(len8, h.len);
	atomic_write(&af, len8, 8);
	atomic_write(&af, h.data, h.len);
	buf_free(&h);
	chunk = xmalloc(65536 * 4);
	for (int i = 0; i < m->n_params && !af.failed; i++) {
		const struct param_info *p = &m->params[i];
		for (size_t j = 0; j < p->numel; j += 65536) {
			size_t k = MIN(p->numel - j, (size_t)65536);
			for (size_t e = 0; e < k; e++) {
				uint32_t bits;
				memcpy(&bits, &params[p->offset + j + e], 4);
				put_le32(chunk + 4 * e, bits);
			}
			if (atomic_write(&af, chunk, k * 4))
				break;
		}
	}
	free(chunk);
	if (af.failed) {
		atomic_abort(&af);
		return -1;
	}
	return atomic_commit(&af);
}
