/* checkpoint.c - checkpoint files (see checkpoint.h). */
#include "checkpoint.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "container.h"
#include "../util.h"

#define HEADER_TAG "ASPCKPT1"
#define NAME_MAX_LEN 95

struct index_row {
	char name[NAME_MAX_LEN + 1];
	size_t numel;
	int rows, cols;
};

struct ckpt_writer {
	struct container_writer *cw;
	struct index_row *rows;
	int n;
	char *path;
};

struct ckpt {
	struct container *c;
	char *config, *meta;
	struct index_row *rows;
	int n;
};

static void make_header(unsigned char h[16], uint64_t n)
{
	memcpy(h, HEADER_TAG, 8);
	put_le64(h + 8, n);
}

int ckpt_create(struct ckpt_writer **wp, const char *path, const char *config_text,
		const char *meta_text)
{
	struct ckpt_writer *w = xcalloc(1, sizeof(*w));
	unsigned char h[16];
	make_header(h, 0);
	if (container_create(&w->cw, path, CKPT_MAGIC, CKPT_VERSION, h, sizeof(h), 1)) {
		free(w);
		return -1;
	}
	w->path = xstrdup(path);
	if (container_add_chunk(w->cw, config_text, strlen(config_text)) ||
	    container_add_chunk(w->cw, meta_text, strlen(meta_text))) {
		ckpt_abort(w);
		return -1;
	}
	*wp = w;
	return 0;
}

int ckpt_add(struct ckpt_writer *w, const char *name, const float *data, size_t numel,
	     int rows, int cols)
{
	if (strlen(name) > NAME_MAX_LEN || strpbrk(name, " \n\t") || !*name)
		return error("'%s': bad tensor name '%s'", w->path, name);
	w->rows = xrealloc(w->rows, sizeof(*w->rows) * (size_t)(w->n + 1));
	struct index_row *r = &w->rows[w->n++];
	snprintf(r->name, sizeof(r->name), "%s", name);
	r->numel = numel;
	r->rows = rows;
	r->cols = cols;
	/* floats are stored little-endian; this host is little-endian (checked
	 * at build time below), so the bytes go out as they are */
	return container_add_chunk(w->cw, data, st_mult(numel, sizeof(float)));
}

_Static_assert(sizeof(float) == 4, "float must be IEEE single precision");

int ckpt_commit(struct ckpt_writer *w)
{
	struct buf idx = {0};
	for (int i = 0; i < w->n; i++) {
		char line[160];
		int len = snprintf(line, sizeof(line), "%s %zu %d %d\n", w->rows[i].name,
				   w->rows[i].numel, w->rows[i].rows, w->rows[i].cols);
		buf_append(&idx, line, (size_t)len);
	}
	unsigned char h[16];
	make_header(h, (uint64_t)w->n);
	int rc = container_add_chunk(w->cw, idx.data ? idx.data : (unsigned char *)"", idx.len);
	if (!rc)
		rc = container_set_header(w->cw, h, sizeof(h));
	if (!rc) {
		rc = container_commit(w->cw);
		w->cw = NULL;
	}
	buf_free(&idx);
	if (w->cw)
		container_abort(w->cw);
	free(w->rows);
	free(w->path);
	free(w);
	return rc;
}

void ckpt_abort(struct ckpt_writer *w)
{
	if (!w)
		return;
	container_abort(w->cw);
	free(w->rows);
	free(w->path);
	free(w);
}

/* Read a text chunk as a NUL-terminated string. */
static char *read_text(struct container *c, uint64_t i)
{
	uint64_t n = container_chunk_size(c, i);
	if (n > (64u << 20)) {
		error("'%s': chunk %llu is too large for text (%llu bytes)", container_path(c),
		      (unsigned long long)i, (unsigned long long)n);
		return NULL;
	}
	char *s = xmalloc((size_t)n + 1);
	if (container_read_chunk(c, i, s)) {
		free(s);
		return NULL;
	}
	s[n] = 0;
	if (strlen(s) != n) {
		error("'%s': chunk %llu holds a NUL byte (not text)", container_path(c),
		      (unsigned long long)i);
		free(s);
		return NULL;
	}
	return s;
}

static int parse_index(struct ckpt *k, const char *text, uint64_t n_expected)
{
	const char *path = container_path(k->c);
	k->rows = xcalloc(n_expected ? (size_t)n_expected : 1, sizeof(*k->rows));
	const char *p = text;
	int lineno = 0;
	while (*p) {
		lineno++;
		const char *nl = strchr(p, '\n');
		if (!nl)
			return error("'%s': index line %d is not terminated", path, lineno);
		if ((uint64_t)k->n >= n_expected)
			return error("'%s': index lists more tensors than the header's %llu", path,
				     (unsigned long long)n_expected);
		struct index_row *r = &k->rows[k->n];
		char line[256];
		size_t len = (size_t)(nl - p);
		if (len >= sizeof(line))
			return error("'%s': index line %d is too long", path, lineno);
		memcpy(line, p, len);
		line[len] = 0;
		unsigned long long numel, rows, cols;
		char extra;
		/* %llu would take a sign; the digits are checked first */
		if (strchr(line, '-') ||
		    sscanf(line, "%95s %llu %llu %llu %c", r->name, &numel, &rows, &cols, &extra) != 4 ||
		    rows > INT32_MAX || cols > INT32_MAX)
			return error("'%s': index line %d is malformed", path, lineno);
		r->numel = (size_t)numel;
		r->rows = (int)rows;
		r->cols = (int)cols;
		for (int j = 0; j < k->n; j++)
			if (!strcmp(k->rows[j].name, r->name))
				return error("'%s': tensor '%s' is listed twice", path, r->name);
		uint64_t chunk = (uint64_t)k->n + 2;
		if (container_chunk_size(k->c, chunk) != (uint64_t)numel * sizeof(float))
			return error("'%s': tensor '%s' has %llu bytes, the index says %llu floats",
				     path, r->name, (unsigned long long)container_chunk_size(k->c, chunk),
				     numel);
		if (r->rows < 0 || r->cols < 0 ||
		    (uint64_t)r->rows * (uint64_t)(r->cols ? r->cols : 1) != numel)
			return error("'%s': tensor '%s' shape %dx%d does not hold %llu values", path,
				     r->name, r->rows, r->cols, numel);
		k->n++;
		p = nl + 1;
	}
	if ((uint64_t)k->n != n_expected)
		return error("'%s': index lists %d tensors, the header says %llu", path, k->n,
			     (unsigned long long)n_expected);
	return 0;
}

static int check_meta(const struct ckpt *k);

int ckpt_open(struct ckpt **out, const char *path)
{
	struct ckpt *k = xcalloc(1, sizeof(*k));
	*out = NULL;
	if (container_open(&k->c, path, CKPT_MAGIC, "checkpoint")) {
		free(k);
		return -1;
	}
	int rc = 0;
	size_t hlen;
	const unsigned char *h = container_header(k->c, &hlen);
	uint64_t n = 0;
	if (container_version(k->c) > CKPT_VERSION)
		rc = error("'%s': checkpoint format version %u is newer than this asyncpp supports (%d)",
			   path, container_version(k->c), CKPT_VERSION);
	else if (hlen != 16 || memcmp(h, HEADER_TAG, 8))
		rc = error("'%s': bad checkpoint header", path);
	else
		n = get_le64(h + 8);
	if (!rc && (n > (1u << 24) || container_nchunks(k->c) != n + 3))
		rc = error("'%s': the container holds %llu chunks, a checkpoint of %llu tensors needs %llu",
			   path, (unsigned long long)container_nchunks(k->c), (unsigned long long)n,
			   (unsigned long long)(n + 3));
	char *idx = NULL;
	if (!rc && (!(k->config = read_text(k->c, 0)) || !(k->meta = read_text(k->c, 1)) ||
		    !(idx = read_text(k->c, n + 2))))
		rc = -1;
	if (!rc)
		rc = parse_index(k, idx, n);
	if (!rc)
		rc = check_meta(k);
	free(idx);
	if (rc) {
		ckpt_close(k);
		return -1;
	}
	*out = k;
	return 0;
}

void ckpt_close(struct ckpt *k)
{
	if (!k)
		return;
	container_close(k->c);
	free(k->config);
	free(k->meta);
	free(k->rows);
	free(k);
}

const char *ckpt_path(const struct ckpt *k) { return container_path(k->c); }
const char *ckpt_config(const struct ckpt *k) { return k->config; }
const char *ckpt_meta(const struct ckpt *k) { return k->meta; }
int ckpt_count(const struct ckpt *k) { return k->n; }
const char *ckpt_name(const struct ckpt *k, int i) { return k->rows[i].name; }
size_t ckpt_numel(const struct ckpt *k, int i) { return k->rows[i].numel; }
void ckpt_shape(const struct ckpt *k, int i, int *rows, int *cols)
{
	*rows = k->rows[i].rows;
	*cols = k->rows[i].cols;
}

int ckpt_find(const struct ckpt *k, const char *name)
{
	for (int i = 0; i < k->n; i++)
		if (!strcmp(k->rows[i].name, name))
			return i;
	return -1;
}

int ckpt_read(struct ckpt *k, int i, float *out)
{
	return container_read_chunk(k->c, (uint64_t)i + 2, out);
}

int ckpt_verify(struct ckpt *k) { return container_verify(k->c); }

static void shape_text(char *out, size_t len, int rows, int cols)
{
	if (cols)
		snprintf(out, len, "%dx%d", rows, cols);
	else
		snprintf(out, len, "%d", rows);
}

int ckpt_read_named(struct ckpt *k, const char *name, float *out, int rows, int cols)
{
	int i = ckpt_find(k, name);
	if (i < 0)
		return error("'%s': no tensor '%s' in the checkpoint", ckpt_path(k), name);
	size_t numel = (size_t)rows * (size_t)(cols ? cols : 1);
	if (k->rows[i].numel != numel)
		return error("'%s': tensor '%s' has %zu values, expected %zu", ckpt_path(k), name,
			     k->rows[i].numel, numel);
	if (k->rows[i].rows != rows || k->rows[i].cols != cols) {
		char have[32], want[32];
		shape_text(have, sizeof(have), k->rows[i].rows, k->rows[i].cols);
		shape_text(want, sizeof(want), rows, cols);
		return error("'%s': tensor '%s' is %s in the index; the model of its configuration "
			     "has it %s", ckpt_path(k), name, have, want);
	}
	return ckpt_read(k, i, out);
}

/* The text after "KEY = " on KEY's metadata line, or NULL. (ckpt_open has
 * checked every line and that no key repeats.) */
static const char *meta_value(const struct ckpt *k, const char *key, size_t *len)
{
	size_t klen = strlen(key);
	for (const char *p = k->meta; p && *p;) {
		const char *nl = strchr(p, '\n');
		size_t n = nl ? (size_t)(nl - p) : strlen(p);
		if (n >= klen + 3 && !strncmp(p, key, klen) && !strncmp(p + klen, " = ", 3)) {
			*len = n - klen - 3;
			return p + klen + 3;
		}
		p = nl ? nl + 1 : p + n;
	}
	return NULL;
}

/* v[0..len) as a number: decimal digits, or where `hex` also 0x and hex
 * digits. 0 and *out; 1 if it is a '-' and digits (negative: out of any
 * range here); -1 if it is no number or above 2^64-1. */
static int parse_u64(const char *v, size_t len, int hex, uint64_t *out)
{
	int neg = len > 1 && v[0] == '-';
	size_t i = (size_t)neg;
	int base = 10;
	if (hex && !neg && len > 2 && v[0] == '0' && (v[1] == 'x' || v[1] == 'X')) {
		base = 16;
		i = 2;
	}
	if (i == len)
		return -1;
	uint64_t x = 0;
	for (; i < len; i++) {
		int d = v[i] >= '0' && v[i] <= '9' ? v[i] - '0' :
			base == 16 && v[i] >= 'a' && v[i] <= 'f' ? v[i] - 'a' + 10 :
			base == 16 && v[i] >= 'A' && v[i] <= 'F' ? v[i] - 'A' + 10 : -1;
		if (d < 0 || x > (UINT64_MAX - (uint64_t)d) / (uint64_t)base)
			return -1;
		x = x * (uint64_t)base + (uint64_t)d;
	}
	*out = x;
	return neg;
}

/* The metadata fields a reader checks (man/asyncpp-formats.5): a number in
 * [lo, hi], decimal (hex too where `hex`), or any text. Other keys are
 * accepted as any text: a newer writer may add some. */
enum { F_STEP, F_VERSIONS, F_SEED, F_STAGES, F_MICRO_BATCHES, F_DATA_POSITION, F_RNG_STATE,
       F_TOKENIZER_HASH, F_RUN_ID, F_IMPORTED_FROM, F_ROLLBACKS, F_DATA_SKIP, N_META_FIELDS };
static const struct meta_field {
	const char *key;
	int number, hex, required;
	uint64_t lo, hi;
} meta_fields[N_META_FIELDS] = {
	[F_STEP] = {"step", 1, 0, 1, 0, CKPT_MAX_STEP},
	[F_VERSIONS] = {"versions", 1, 0, 1, 1, CKPT_MAX_VERSIONS},
	[F_SEED] = {"seed", 1, 0, 0, 0, INT64_MAX},
	[F_STAGES] = {"stages", 1, 0, 0, 1, 4096}, /* pipeline.stages' range */
	[F_MICRO_BATCHES] = {"micro_batches", 1, 0, 0, 1, 1048576}, /* pipeline.micro_batches' */
	[F_DATA_POSITION] = {"data_position", 1, 0, 0, 0, INT64_MAX},
	[F_RNG_STATE] = {"rng_state", 1, 0, 0, 0, UINT64_MAX},
	[F_TOKENIZER_HASH] = {"tokenizer_hash", 1, 1, 0, 0, UINT64_MAX},
	[F_RUN_ID] = {"run_id", 1, 1, 0, 1, UINT64_MAX}, /* train's run (cmd/train_dir.h) */
	[F_IMPORTED_FROM] = {"imported_from", 0, 0, 0, 0, 0},
	/* a run that rolled back (train.on_divergence): both or neither */
	[F_ROLLBACKS] = {"rollbacks", 1, 0, 0, 1, INT64_MAX},
	[F_DATA_SKIP] = {"data_skip", 1, 0, 0, 1, INT64_MAX},
};
/* Writers write about ten lines; the bound keeps the check of repeated keys
 * (each line against the ones before) small. */
#define META_MAX_LINES 1024

/* The version K of a tensor named "weights.vK/...", -1 for any other set,
 * -2 for a "weights.v" name without a plain K. */
static int weight_version(const char *name)
{
	if (strncmp(name, "weights.v", 9))
		return -1;
	const char *p = name + 9;
	int v = 0, digits = 0;
	for (; *p >= '0' && *p <= '9' && digits < 3; p++, digits++)
		v = v * 10 + (*p - '0');
	if (!digits || *p != '/' || (digits > 1 && name[9] == '0'))
		return -2;
	return v;
}

/* Every metadata line "KEY = VALUE\n", no key twice, step and versions
 * present, each field above in its range; and versions equal to the weight
 * sets the index holds (weights.v0 to weights.v<versions-1>, each with the
 * tensors of v0), rng_state (if given) the one seed and step give. */
static int check_meta(const struct ckpt *k)
{
	const char *path = ckpt_path(k);
	int line_of[N_META_FIELDS] = {0};
	uint64_t val[N_META_FIELDS] = {0};
	int lineno = 0;
	for (const char *p = k->meta; *p;) {
		if (++lineno > META_MAX_LINES)
			return error("'%s': metadata has more than %d lines", path, META_MAX_LINES);
		const char *nl = strchr(p, '\n'), *eq = strstr(p, " = ");
		if (!nl)
			return error("'%s': metadata line %d does not end in a newline", path,
				     lineno);
		if (!eq || eq > nl || eq == p || eq + 3 == nl)
			return error("'%s': metadata line %d is not 'KEY = VALUE'", path, lineno);
		size_t klen = (size_t)(eq - p), vlen = (size_t)(nl - eq - 3);
		const char *v = eq + 3;
		for (const char *q = p; q < eq; q++)
			if (!((*q >= 'a' && *q <= 'z') || (*q >= '0' && *q <= '9') || *q == '_'))
				return error("'%s': metadata line %d: key '%.*s' is not lower-case "
					     "letters, digits and '_'", path, lineno, (int)klen, p);
		int f = 0;
		while (f < N_META_FIELDS &&
		       (strlen(meta_fields[f].key) != klen || strncmp(meta_fields[f].key, p, klen)))
			f++;
		/* an unknown key given twice is as ambiguous as a known one */
		for (const char *q = k->meta; q < p;) {
			const char *qnl = strchr(q, '\n');
			if (!strncmp(q, p, klen + 3))
				return error("'%s': metadata line %d gives '%.*s' again", path,
					     lineno, (int)klen, p);
			q = qnl + 1;
		}
		if (f == N_META_FIELDS || !meta_fields[f].number) {
			p = nl + 1;
			continue;
		}
		const struct meta_field *m = &meta_fields[f];
		int r = parse_u64(v, vlen, m->hex, &val[f]);
		if (r < 0)
			return error("'%s': metadata line %d: %s = %.*s is not a %snumber", path,
				     lineno, m->key, (int)(vlen > 40 ? 40 : vlen), v,
				     m->hex ? "decimal or 0x hex " : "decimal ");
		if (r > 0 || val[f] < m->lo || val[f] > m->hi)
			return error("'%s': metadata line %d: %s = %.*s is out of range "
				     "(%llu to %llu)", path, lineno, m->key,
				     (int)(vlen > 40 ? 40 : vlen), v, (unsigned long long)m->lo,
				     (unsigned long long)m->hi);
		line_of[f] = lineno;
		p = nl + 1;
	}
	for (int f = 0; f < N_META_FIELDS; f++)
		if (meta_fields[f].required && !line_of[f])
			return error("'%s': metadata has no '%s' (a checkpoint needs step and "
				     "versions)", path, meta_fields[f].key);
	if (!line_of[F_ROLLBACKS] != !line_of[F_DATA_SKIP])
		return error("'%s': metadata gives %s without %s (a run that rolled back writes "
			     "both)", path, line_of[F_ROLLBACKS] ? "rollbacks" : "data_skip",
			     line_of[F_ROLLBACKS] ? "data_skip" : "rollbacks");
	uint64_t step = val[F_STEP], nv = val[F_VERSIONS];
	if (line_of[F_SEED] && line_of[F_RNG_STATE] &&
	    val[F_RNG_STATE] != rng_mix(val[F_SEED], step))
		return error("'%s': metadata rng_state = %llu is not the one seed = %llu and "
			     "step = %llu give (the metadata was changed)", path,
			     (unsigned long long)val[F_RNG_STATE], (unsigned long long)val[F_SEED],
			     (unsigned long long)step);
	if (line_of[F_DATA_POSITION] && val[F_DATA_POSITION] < step)
		return error("'%s': metadata data_position = %llu is below step = %llu (every step "
			     "reads at least one micro-batch)", path,
			     (unsigned long long)val[F_DATA_POSITION], (unsigned long long)step);
	int count[CKPT_MAX_VERSIONS] = {0};
	for (int i = 0; i < k->n; i++) {
		int v = weight_version(k->rows[i].name);
		if (v == -2)
			return error("'%s': tensor '%s' names no weight version "
				     "(weights.vK/NAME, K from 0 to %d)", path, k->rows[i].name,
				     CKPT_MAX_VERSIONS - 1);
		if (v >= (int)nv)
			return error("'%s': tensor '%s' is beyond the metadata's versions = %llu "
				     "(weights.v0 to weights.v%llu)", path, k->rows[i].name,
				     (unsigned long long)nv, (unsigned long long)nv - 1);
		if (v >= 0)
			count[v]++;
	}
	for (int v = 0; v < (int)nv; v++)
		if (!count[v] || count[v] != count[0])
			return error("'%s': weights.v%d holds %d tensors, weights.v0 %d (metadata "
				     "versions = %llu: each version holds every weight)", path, v,
				     count[v], count[0], (unsigned long long)nv);
	return 0;
}

void ckpt_meta_add_text(char *meta, size_t size, const char *key, const char *text)
{
	size_t at = strlen(meta), klen = strlen(key);
	if (at + klen + 6 > size) /* "KEY = ?\n" and the NUL */
		return;
	memcpy(meta + at, key, klen);
	memcpy(meta + at + klen, " = ", 3);
	at += klen + 3;
	size_t room = size - at - 2; /* the '\n' and the NUL */
	size_t n = 0;
	for (; text[n] && n < room; n++)
		meta[at + n] = (unsigned char)text[n] < 0x20 || text[n] == 0x7f ? '?' : text[n];
	if (!n) /* a line needs a value */
		meta[at + n++] = '?';
	meta[at + n] = '\n';
	meta[at + n + 1] = 0;
}

static int meta_number(const struct ckpt *k, const char *key, int is_signed, long *sv,
		       uint64_t *uv)
{
	size_t len;
	const char *v = meta_value(k, key, &len);
	if (!v)
		return error("'%s': metadata has no '%s'", ckpt_path(k), key);
	uint64_t x;
	int r = parse_u64(v, len, !is_signed, &x);
	if (r != 0 || (is_signed && x > LONG_MAX))
		return error("'%s': metadata '%s' is not a number%s", ckpt_path(k), key,
			     is_signed ? " from 0 to 2^63-1" : "");
	if (is_signed)
		*sv = (long)x;
	else
		*uv = x;
	return 0;
}

int ckpt_meta_long(const struct ckpt *k, const char *key, long *out)
{
	return meta_number(k, key, 1, out, NULL);
}

int ckpt_meta_u64(const struct ckpt *k, const char *key, uint64_t *out)
{
	return meta_number(k, key, 0, NULL, out);
}

int ckpt_sniff(const char *path)
{
	char magic[8];
	int r = container_peek(path, magic);
	if (r <= 0)
		return r;
	return !memcmp(magic, CKPT_MAGIC, 8);
}

struct tensor_stats {
	double norm, min, max;
	size_t nonfinite; /* NaN and infinite values */
};

static struct tensor_stats stats_of(const float *x, size_t n)
{
	struct tensor_stats s = {0, n ? x[0] : 0, n ? x[0] : 0, floats_nonfinite(x, n, NULL)};
	double ss = 0;
	for (size_t i = 0; i < n; i++) {
		ss += (double)x[i] * x[i];
		if (x[i] < s.min)
			s.min = x[i];
		if (x[i] > s.max)
			s.max = x[i];
	}
	s.norm = sqrt(ss);
	return s;
}

int checkpoint_inspect(const char *path, FILE *out, int verbose)
{
	struct ckpt *k;
	if (ckpt_open(&k, path))
		return -1;
	fprintf(out, "%s: asyncpp checkpoint, format version %u, %d tensors\n", path,
		container_version(k->c), k->n);
	fprintf(out, "\n[metadata]\n%s", k->meta);
	if (verbose)
		fprintf(out, "\n[config]\n%s", k->config);
	fprintf(out, "\n%-40s %-14s %-5s %12s %12s %12s\n", "tensor", "shape", "dtype", "norm",
		"min", "max");
	int rc = 0, bad_tensors = 0;
	size_t total = 0, bad_values = 0;
	for (int i = 0; i < k->n; i++) {
		float *x = xmalloc(st_mult(k->rows[i].numel ? k->rows[i].numel : 1, sizeof(float)));
		if (ckpt_read(k, i, x)) {
			free(x);
			rc = -1;
			break;
		}
		struct tensor_stats s = stats_of(x, k->rows[i].numel);
		char shape[32];
		shape_text(shape, sizeof(shape), k->rows[i].rows, k->rows[i].cols);
		fprintf(out, "%-40s %-14s %-5s %12.6g %12.6g %12.6g", k->rows[i].name, shape, "f32",
			s.norm, s.min, s.max);
		if (s.nonfinite)
			fprintf(out, "  %zu NON-FINITE", s.nonfinite);
		fputc('\n', out);
		bad_tensors += s.nonfinite > 0;
		bad_values += s.nonfinite;
		total += k->rows[i].numel;
		free(x);
	}
	if (!rc && container_verify(k->c))
		rc = -1;
	if (!rc)
		fprintf(out, "\n%zu values; every checksum verified\n", total);
	if (!rc && bad_tensors)
		rc = error("'%s': %zu values in %d tensors are NaN or infinite; this checkpoint "
			   "cannot be trained or evaluated from (resume from an earlier one)", path,
			   bad_values, bad_tensors);
	ckpt_close(k);
	return rc;
}

struct diff_row {
	const char *name;
	double max_abs, rel;
	int differs; /* some value's bits differ (-0.0 and 0.0 included) */
};

static int cmp_diff(const void *a, const void *b)
{
	const struct diff_row *x = a, *y = b;
	if (x->differs != y->differs)
		return y->differs - x->differs;
	return (x->rel < y->rel) - (x->rel > y->rel);
}

/* Compare tensor i of a with tensor j of b into *row: 0, or -1 when one
 * could not be read (error() said why). */
static int diff_tensor(struct ckpt *a, int i, struct ckpt *b, int j, struct diff_row *row)
{
	size_t n_el = a->rows[i].numel;
	float *x = xmalloc(st_mult(n_el ? n_el : 1, sizeof(float)));
	float *y = xmalloc(st_mult(n_el ? n_el : 1, sizeof(float)));
	int rc = ckpt_read(a, i, x) || ckpt_read(b, j, y) ? -1 : 0;
	if (!rc) {
		double d2 = 0, x2 = 0, mx = 0;
		int differs = 0;
		for (size_t e = 0; e < n_el; e++) {
			/* NaN or inf on one side only is the largest difference
			 * there is; equal bits (NaN included) are none */
			if (!memcmp(&x[e], &y[e], sizeof(float)))
				continue;
			differs = 1;
			double d = (double)x[e] - y[e];
			if (!isfinite(d)) {
				mx = d2 = INFINITY;
				continue;
			}
			d2 += d * d;
			if (fabs(d) > mx)
				mx = fabs(d);
		}
		for (size_t e = 0; e < n_el; e++)
			if (isfinite(x[e]))
				x2 += (double)x[e] * x[e];
		double rel = isinf(d2) ? INFINITY : sqrt(d2) / (sqrt(x2) + 1e-30);
		*row = (struct diff_row){a->rows[i].name, mx, rel, differs};
	}
	free(x);
	free(y);
	return rc;
}

int checkpoint_diff(const char *pa, const char *pb, FILE *out, int top, int verbose)
{
	struct ckpt *a, *b;
	if (ckpt_open(&a, pa))
		return -1;
	if (ckpt_open(&b, pb)) {
		ckpt_close(a);
		return -1;
	}
	struct diff_row *rows = xcalloc((size_t)a->n + 1, sizeof(*rows));
	/* what cannot be compared, printed after the verdict */
	struct buf apart = {0};
	char line[512];
	int n = 0, rc = 0, only = 0;
	long sa = -1, sb = -1;
	set_error_quiet(1);
	ckpt_meta_long(a, "step", &sa);
	ckpt_meta_long(b, "step", &sb);
	set_error_quiet(0);
	for (int i = 0; i < a->n && !rc; i++) {
		int j = ckpt_find(b, a->rows[i].name);
		int len = 0;
		if (j < 0)
			len = snprintf(line, sizeof(line), "only in A: %s\n", a->rows[i].name);
		else if (b->rows[j].numel != a->rows[i].numel)
			len = snprintf(line, sizeof(line),
				       "shape differs: %s (%zu vs %zu values)\n", a->rows[i].name,
				       a->rows[i].numel, b->rows[j].numel);
		else if (diff_tensor(a, i, b, j, &rows[n]))
			rc = -1;
		else
			n++;
		if (len > 0) {
			buf_append(&apart, line, MIN((size_t)len, sizeof(line) - 1));
			only++;
		}
	}
	for (int j = 0; j < b->n && !rc; j++)
		if (ckpt_find(a, b->rows[j].name) < 0) {
			int len = snprintf(line, sizeof(line), "only in B: %s\n", b->rows[j].name);
			buf_append(&apart, line, MIN((size_t)len, sizeof(line) - 1));
			only++;
		}
	if (!rc) {
		qsort(rows, (size_t)n, sizeof(*rows), cmp_diff);
		int identical = 0;
		for (int i = 0; i < n; i++)
			identical += !rows[i].differs;
		/* the verdict first, then the two files, the counts, what could
		 * not be compared and the differing tensors (with -v every one) */
		if (identical == n && !only)
			fprintf(out, "identical: all %d tensors have the same bits\n", n);
		else
			fprintf(out, "different: %d of %d compared tensors differ, %d not "
				"comparable\n", n - identical, n, only);
		fprintf(out, "A: %s (step %ld)\nB: %s (step %ld)\n", pa, sa, pb, sb);
		fprintf(out, "%d tensors compared, %d identical, %d not comparable\n", n, identical,
			only);
		if (apart.len) /* data is NULL when nothing was set apart */
			fwrite(apart.data, 1, apart.len, out);
		int shown = verbose ? n : MIN(n - identical, top);
		if (shown > 0) {
			fprintf(out, "\n%-40s %14s %14s\n",
				verbose ? "tensors, most different first" : "largest differences",
				"max |a-b|", "|a-b|/|a|");
			for (int i = 0; i < shown; i++)
				fprintf(out, "%-40s %14.6g %14.6g%s\n", rows[i].name,
					rows[i].max_abs, rows[i].rel,
					rows[i].differs ? "" : "  identical");
		}
		if (!verbose && n - identical > shown)
			fprintf(out, "(%d more differ; --top %d lists them all)\n",
				n - identical - shown, n - identical);
	}
	buf_free(&apart);
	free(rows);
	ckpt_close(a);
	ckpt_close(b);
	return rc;
}
