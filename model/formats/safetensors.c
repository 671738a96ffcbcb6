/* safetensors.c - safetensors reading and writing (see safetensors.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "../../io/formats/half.h"
#include "../../io/text/json.h"
#include "safetensors.h"
#include "../../io/util.h"

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

const char *st_dtype_name(enum st_dtype d)
{
	return d == ST_F16 ? "F16" : d == ST_BF16 ? "BF16" : "F32";
}

int st_dtype_parse(const char *s)
{
	if (!strcmp(s, "f32"))
		return ST_F32;
	if (!strcmp(s, "f16"))
		return ST_F16;
	if (!strcmp(s, "bf16"))
		return ST_BF16;
	return -1;
}

static size_t dtype_size(enum st_dtype d)
{
	return d == ST_F32 ? 4 : 2;
}

static size_t shape_numel(const int64_t *shape, int ndim)
{
	size_t n = 1;
	for (int d = 0; d < ndim; d++)
		n = st_mult(n, (size_t)shape[d]);
	return n;
}

int st_write(const char *path, const struct st_tensor *t, int n, enum st_dtype dtype,
	     const char *metadata_json_pairs)
{
	struct buf h = {0};
	struct atomic_file af;
	unsigned char len8[8], *chunk;
	size_t off = 0, esz = dtype_size(dtype);

	if (metadata_json_pairs && *skip_ws(metadata_json_pairs) &&
	    !valid_pairs(metadata_json_pairs))
		return error("%s: metadata is not a list of JSON string pairs: %.80s", path,
			     metadata_json_pairs);
	put_str(&h, "{\"__metadata__\":{\"format\":\"pt\"");
	if (metadata_json_pairs && *skip_ws(metadata_json_pairs)) {
		put_str(&h, ",");
		put_str(&h, metadata_json_pairs);
	}
	put_str(&h, "}");
	for (int i = 0; i < n; i++) {
		size_t bytes = st_mult(shape_numel(t[i].shape, t[i].ndim), esz);
		put_str(&h, ",");
		json_put_string(&h, t[i].name, strlen(t[i].name));
		put_fmt(&h, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_name(dtype));
		for (int d = 0; d < t[i].ndim; d++)
			put_fmt(&h, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
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
	for (int i = 0; i < n && !af.failed; i++) {
		size_t numel = shape_numel(t[i].shape, t[i].ndim);
		for (size_t j = 0; j < numel; j += 65536) {
			size_t k = MIN(numel - j, (size_t)65536);
			const float *src = t[i].data + j;
			for (size_t e = 0; e < k; e++) {
				if (dtype == ST_F32)
					put_le32(chunk + 4 * e, f32_bits(src[e]));
				else
					put_le16(chunk + 2 * e, dtype == ST_F16 ? f32_to_f16(src[e])
										: f32_to_bf16(src[e]));
			}
			if (atomic_write(&af, chunk, k * esz))
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

int safetensors_write(const char *path, const struct model *m, const float *params,
		      const char *metadata_json_pairs)
{
	const struct model_config *c = &m->cfg;
	struct buf h = {0};
	struct st_tensor *t = xcalloc(m->n_params ? m->n_params : 1, sizeof(*t));

	put_fmt(&h, "\"arch\":\"%s\"", c->arch == ARCH_GPT2 ? "gpt2" : "llama");
	put_fmt(&h, ",\"vocab_size\":\"%d\",\"padded_vocab_size\":\"%d\"", c->V, c->Vp);
	put_fmt(&h, ",\"n_layer\":\"%d\",\"d_model\":\"%d\"", c->L, c->C);
	put_fmt(&h, ",\"n_head\":\"%d\",\"n_kv_head\":\"%d\",\"head_dim\":\"%d\"", c->NH, c->NKV,
		c->HD);
	put_fmt(&h, ",\"d_ff\":\"%d\",\"seq_len\":\"%d\",\"tied\":\"%d\"", c->F, c->T, c->tied);
	put_fmt(&h, ",\"norm_eps\":\"%.9g\",\"rope_theta\":\"%.9g\"", c->eps, c->rope_theta);
	if (c->E)
		put_fmt(&h, ",\"n_expert\":\"%d\",\"top_k\":\"%d\",\"d_expert\":\"%d\","
			"\"shared_expert\":\"%d\",\"router\":\"%s\"", c->E, c->K, c->De, c->shared,
			c->router == ROUTER_SIGMOID ? "sigmoid" : "softmax");
	if (metadata_json_pairs && *skip_ws(metadata_json_pairs)) {
		if (!valid_pairs(metadata_json_pairs)) {
			buf_free(&h);
			free(t);
			return error("%s: metadata is not a list of JSON string pairs: %.80s",
				     path, metadata_json_pairs);
		}
		put_str(&h, ",");
		put_str(&h, metadata_json_pairs);
	}
	buf_append(&h, "", 1);
	for (int i = 0; i < m->n_params; i++) {
		const struct param_info *p = &m->params[i];
		t[i].name = p->name;
		t[i].ndim = p->cols > 0 ? 2 : 1;
		t[i].shape[0] = p->rows;
		t[i].shape[1] = p->cols;
		t[i].data = params + p->offset;
	}
	int rc = st_write(path, t, m->n_params, ST_F32, (const char *)h.data);
	buf_free(&h);
	free(t);
	return rc;
}

/* ---- reading ---- */

struct st_entry {
	char *name;
	enum st_dtype dtype;
	int ndim;
	int64_t shape[ST_MAX_DIMS];
	size_t numel;
	uint64_t begin, end;
};

struct st_file {
	char *path;
	FILE *fp;
	uint64_t data_start;
	struct st_entry *e;
	int n;
	char **meta; /* key, value pairs */
	int nmeta;
};

const char *st_path(const struct st_file *f)
{
	return f->path;
}
int st_count(const struct st_file *f)
{
	return f->n;
}
const char *st_name(const struct st_file *f, int i)
{
	return f->e[i].name;
}
enum st_dtype st_dtype(const struct st_file *f, int i)
{
	return f->e[i].dtype;
}
int st_ndim(const struct st_file *f, int i)
{
	return f->e[i].ndim;
}
const int64_t *st_shape(const struct st_file *f, int i)
{
	return f->e[i].shape;
}
size_t st_numel(const struct st_file *f, int i)
{
	return f->e[i].numel;
}

int st_find(const struct st_file *f, const char *name)
{
	for (int i = 0; i < f->n; i++)
		if (!strcmp(f->e[i].name, name))
			return i;
	return -1;
}

const char *st_meta(const struct st_file *f, const char *key)
{
	for (int i = 0; i < f->nmeta; i++)
		if (!strcmp(f->meta[2 * i], key))
			return f->meta[2 * i + 1];
	return NULL;
}

void st_close(struct st_file *f)
{
	if (!f)
		return;
	if (f->fp)
		fclose(f->fp);
	for (int i = 0; i < f->n; i++)
		free(f->e[i].name);
	for (int i = 0; i < 2 * f->nmeta; i++)
		free(f->meta[i]);
	free(f->meta);
	free(f->e);
	free(f->path);
	free(f);
}

static int by_begin(const void *a, const void *b)
{
	const struct st_entry *x = *(const struct st_entry *const *)a;
	const struct st_entry *y = *(const struct st_entry *const *)b;
	return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int by_name(const void *a, const void *b)
{
	return strcmp((*(const struct st_entry *const *)a)->name,
		      (*(const struct st_entry *const *)b)->name);
}

/* one header entry k into e; the name is the member name */
static int parse_entry(const char *path, const struct json *k, struct st_entry *e)
{
	const struct json *dt = json_get(k, "dtype"), *sh = json_get(k, "shape"),
			  *off = json_get(k, "data_offsets");
	if (k->type != JSON_OBJECT || !dt || dt->type != JSON_STRING || !sh ||
	    sh->type != JSON_ARRAY || !off || off->type != JSON_ARRAY || off->len != 2)
		return error("%s: tensor '%s': header entry needs dtype, shape and two data_offsets",
			     path, k->key);
	if (!strcmp(dt->str, "F32"))
		e->dtype = ST_F32;
	else if (!strcmp(dt->str, "F16"))
		e->dtype = ST_F16;
	else if (!strcmp(dt->str, "BF16"))
		e->dtype = ST_BF16;
	else
		return error("%s: tensor '%s' has dtype %s; only F32, F16 and BF16 are read", path,
			     k->key, dt->str);
	if (sh->len > ST_MAX_DIMS)
		return error("%s: tensor '%s' has %zu dimensions (at most %d)", path, k->key,
			     sh->len, ST_MAX_DIMS);
	e->ndim = (int)sh->len;
	uint64_t numel = 1;
	for (size_t d = 0; d < sh->len; d++) {
		const struct json *v = &sh->kids[d];
		if (v->type != JSON_NUMBER || !v->is_int || v->i < 0 || v->i > ((int64_t)1 << 40))
			return error("%s: tensor '%s': bad shape", path, k->key);
		e->shape[d] = v->i;
		numel *= (uint64_t)v->i;
		if (numel > ((uint64_t)1 << 40))
			return error("%s: tensor '%s': shape too large", path, k->key);
	}
	e->numel = (size_t)numel;
	for (int d = 0; d < 2; d++) {
		const struct json *v = &off->kids[d];
		if (v->type != JSON_NUMBER || !v->is_int || v->i < 0)
			return error("%s: tensor '%s': bad data_offsets", path, k->key);
	}
	e->begin = (uint64_t)off->kids[0].i;
	e->end = (uint64_t)off->kids[1].i;
	if (e->end < e->begin || e->end - e->begin != numel * dtype_size(e->dtype))
		return error("%s: tensor '%s': data_offsets [%llu, %llu] do not hold its %llu "
			     "values of %s", path, k->key, (unsigned long long)e->begin,
			     (unsigned long long)e->end, (unsigned long long)numel, dt->str);
	e->name = xstrdup(k->key);
	return 0;
}

static int check_header(struct st_file *f, const struct json *root, uint64_t data_len)
{
	const char *path = f->path;
	if (root->type != JSON_OBJECT)
		return error("%s: the header is not a JSON object", path);
	f->e = xcalloc(root->len ? root->len : 1, sizeof(*f->e));
	for (size_t i = 0; i < root->len; i++) {
		const struct json *k = &root->kids[i];
		if (strlen(k->key) != k->key_len)
			return error("%s: a tensor name holds a NUL byte", path);
		if (!strcmp(k->key, "__metadata__")) {
			if (k->type != JSON_OBJECT || f->meta)
				return error("%s: __metadata__ is not one object", path);
			f->meta = xcalloc(2 * k->len + 1, sizeof(*f->meta));
			for (size_t j = 0; j < k->len; j++) {
				if (k->kids[j].type != JSON_STRING)
					return error("%s: __metadata__ value '%s' is not a string", path,
						     k->kids[j].key);
				f->meta[2 * j] = xstrdup(k->kids[j].key);
				f->meta[2 * j + 1] = xstrdup(k->kids[j].str);
				f->nmeta++;
			}
			continue;
		}
		if (parse_entry(path, k, &f->e[f->n]))
			return -1;
		f->n++;
	}
	/* unique names; data areas tile [0, data_len) */
	struct st_entry **v = xmalloc(st_mult(f->n ? f->n : 1, sizeof(*v)));
	for (int i = 0; i < f->n; i++)
		v[i] = &f->e[i];
	int rc = 0;
	qsort(v, f->n, sizeof(*v), by_name);
	for (int i = 1; i < f->n && !rc; i++)
		if (!strcmp(v[i]->name, v[i - 1]->name))
			rc = error("%s: tensor '%s' is listed twice", path, v[i]->name);
	qsort(v, f->n, sizeof(*v), by_begin);
	uint64_t at = 0;
	for (int i = 0; i < f->n && !rc; i++) {
		if (v[i]->begin != at)
			rc = error("%s: tensor '%s' starts at byte %llu of the data, expected %llu "
				   "(overlap or gap)", path, v[i]->name,
				   (unsigned long long)v[i]->begin, (unsigned long long)at);
		at = v[i]->end;
	}
	if (!rc && at != data_len)
		rc = error("%s: the tensors hold %llu bytes of data but the file has %llu "
			   "(truncated or padded)", path, (unsigned long long)at,
			   (unsigned long long)data_len);
	free(v);
	return rc;
}

int st_open(struct st_file **out, const char *path)
{
	struct st_file *f = xcalloc(1, sizeof(*f));
	unsigned char len8[8];
	struct json *root = NULL;
	char *hdr = NULL;
	int rc = -1;
	*out = NULL;
	f->path = xstrdup(path);
	f->fp = fopen(path, "rb");
	if (!f->fp) {
		error("cannot open '%s': %s", path, strerror(errno));
		goto out;
	}
	if (fseeko(f->fp, 0, SEEK_END)) {
		error("cannot seek in '%s': %s", path, strerror(errno));
		goto out;
	}
	off_t size = ftello(f->fp);
	rewind(f->fp);
	if (size < 8 || fread(len8, 1, 8, f->fp) != 8) {
		error("%s: too short for a safetensors file (%lld bytes)", path, (long long)size);
		goto out;
	}
	uint64_t n = get_le64(len8);
	if (n > (uint64_t)size - 8 || n > ((uint64_t)100 << 20)) {
		error("%s: header length %llu does not fit the file (%lld bytes): truncated or not "
		      "safetensors", path, (unsigned long long)n, (long long)size);
		goto out;
	}
	hdr = xmalloc((size_t)n + 1);
	if (fread(hdr, 1, (size_t)n, f->fp) != n) {
		error("cannot read '%s': %s", path, ferror(f->fp) ? strerror(errno) : "short read");
		goto out;
	}
	if (json_parse(&root, hdr, (size_t)n, path))
		goto out;
	f->data_start = 8 + n;
	rc = check_header(f, root, (uint64_t)size - 8 - n);
out:
	json_free(root);
	free(hdr);
	if (rc)
		st_close(f);
	else
		*out = f;
	return rc;
}

int st_read(struct st_file *f, int i, float *out)
{
	const struct st_entry *e = &f->e[i];
	size_t esz = dtype_size(e->dtype), done = 0;
	unsigned char *chunk = xmalloc(65536 * 4);
	int rc = 0;
	if (fseeko(f->fp, (off_t)(f->data_start + e->begin), SEEK_SET)) {
		free(chunk);
		return error("cannot seek in '%s': %s", f->path, strerror(errno));
	}
	while (done < e->numel) {
		size_t k = MIN(e->numel - done, (size_t)65536);
		if (fread(chunk, esz, k, f->fp) != k) {
			rc = error("%s: cannot read tensor '%s': %s", f->path, e->name,
				   ferror(f->fp) ? strerror(errno) : "file shorter than its header says");
			break;
		}
		for (size_t j = 0; j < k; j++) {
			if (e->dtype == ST_F32)
				out[done + j] = f32_from_bits(get_le32(chunk + 4 * j));
			else if (e->dtype == ST_F16)
				out[done + j] = f16_to_f32(get_le16(chunk + 2 * j));
			else
				out[done + j] = bf16_to_f32(get_le16(chunk + 2 * j));
		}
		done += k;
	}
	free(chunk);
	return rc;
}
