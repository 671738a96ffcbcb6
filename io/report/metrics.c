/* metrics.c - write and read training metrics (see metrics.h). */
#include "metrics.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../util.h"

/* The columns; the last three only for a mixture-of-experts model, and
 * expert_tokens (a list) is not read back. */
static const char *const columns[] = {"step", "tokens", "wall_s", "loss", "val_loss", "lr",
				      "grad_norm", "tokens_per_s", "mfu", "bubble", "skipped",
				      "time", "moe_balance", "moe_z", "expert_tokens"};
enum { N_COLUMNS = 12, C_TIME = 11, C_MOE_BALANCE = 12, C_MOE_Z = 13, N_MOE_COLUMNS = 15 };

static int n_columns(const struct metrics_file *mf)
{
	return mf->n_expert > 0 ? N_MOE_COLUMNS : N_COLUMNS;
}

/* A CSV written by an earlier version has a header that is a prefix of
 * today's (columns are only ever added at the end): it gets the missing
 * names (atomically), so that a resumed run's rows line up with it. Its old
 * rows keep fewer fields; readers find columns by name. */
static int upgrade_header(const char *path, int n)
{
	char want[256];
	size_t wl = 0;
	for (int i = 0; i < n; i++)
		wl += (size_t)snprintf(want + wl, sizeof(want) - wl, "%s%s", i ? "," : "", columns[i]);
	struct buf text = {0};
	if (read_file(path, &text))
		return -1;
	int rc = 0;
	const char *nl = memchr(text.data, '\n', text.len);
	size_t hl = nl ? (size_t)(nl - (const char *)text.data) : text.len;
	/* an older header: a proper prefix of today's, ending at a column */
	if (hl < wl && !memcmp(text.data, want, hl) && want[hl] == ',') {
		struct atomic_file af;
		rc = atomic_open(&af, path);
		if (!rc && (atomic_write(&af, want, wl) ||
			    atomic_write(&af, text.data + hl, text.len - hl))) {
			atomic_abort(&af);
			rc = -1;
		} else if (!rc) {
			rc = atomic_commit(&af);
		}
	}
	buf_free(&text);
	return rc;
}

int metrics_open(struct metrics_file *mf, const char *path, enum metrics_format format,
		 int n_expert)
{
	memset(mf, 0, sizeof(*mf));
	mf->n_expert = n_expert;
	struct stat sb;
	int is_new = stat(path, &sb) || sb.st_size == 0;
	if (!is_new && format == METRICS_CSV && upgrade_header(path, n_columns(mf)))
		return -1;
	mf->fp = fopen(path, "a");
	if (!mf->fp)
		return error("cannot open metrics file '%s': %s", path, strerror(errno));
	mf->format = format;
	mf->path = xstrdup(path);
	if (is_new && format == METRICS_CSV) {
		for (int i = 0; i < n_columns(mf); i++)
			fprintf(mf->fp, "%s%s", i ? "," : "", columns[i]);
		fputc('\n', mf->fp);
	}
	fflush(mf->fp);
	return 0;
}

/* expert_tokens: E integers, separated by spaces (CSV) or ", " in a JSON
 * array. */
static void put_tokens(const struct metrics_file *mf, const struct metrics_row *r)
{
	int json = mf->format == METRICS_JSONL;
	if (json)
		fputc('[', mf->fp);
	for (int e = 0; e < mf->n_expert; e++)
		fprintf(mf->fp, "%s%.0f", e ? (json ? ", " : " ") : "", r->expert_tokens[e]);
	if (json)
		fputc(']', mf->fp);
}

int metrics_write(struct metrics_file *mf, const struct metrics_row *r)
{
	if (!mf->fp)
		return 0;
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	int moe = r->has_moe && r->expert_tokens;
	const int has[N_MOE_COLUMNS] = {1, 1, 1, r->has_loss, r->has_val_loss, r->has_lr,
					r->has_grad_norm, r->has_tps, r->has_mfu, r->has_bubble,
					r->has_skipped, 1, moe, moe, moe};
	double stamp = r->time > 0 ? r->time : (double)now.tv_sec + now.tv_nsec * 1e-9;
	const double val[N_MOE_COLUMNS] = {(double)r->step, r->tokens, r->wall_s, r->loss,
					   r->val_loss, r->lr, r->grad_norm, r->tokens_per_s,
					   r->mfu, r->bubble, r->skipped, stamp, r->moe_balance,
					   r->moe_z, 0};
	int n = n_columns(mf);
	if (mf->format == METRICS_CSV) {
		/* a non-finite value is written as nan, inf or -inf */
		for (int i = 0; i < n; i++) {
			if (i)
				fputc(',', mf->fp);
			if (has[i] && i == N_MOE_COLUMNS - 1)
				put_tokens(mf, r);
			else if (has[i] && isnan(val[i]))
				fputs("nan", mf->fp);
			else if (has[i])
				fprintf(mf->fp, i == C_TIME ? "%.3f" : "%.9g", val[i]);
		}
		fputc('\n', mf->fp);
	} else {
		/* JSON has no NaN or infinity: such a value is null */
		fputc('{', mf->fp);
		int first = 1;
		for (int i = 0; i < n; i++) {
			if (!has[i])
				continue;
			fprintf(mf->fp, "%s\"%s\": ", first ? "" : ", ", columns[i]);
			if (i == N_MOE_COLUMNS - 1)
				put_tokens(mf, r);
			else if (isfinite(val[i]))
				fprintf(mf->fp, i == C_TIME ? "%.3f" : "%.9g", val[i]);
			else
				fputs("null", mf->fp);
			first = 0;
		}
		fputs("}\n", mf->fp);
	}
	if (fflush(mf->fp) || ferror(mf->fp))
		return error("cannot write metrics file '%s': %s", mf->path, strerror(errno));
	return 0;
}

void metrics_close(struct metrics_file *mf)
{
	if (mf->fp)
		fclose(mf->fp);
	free(mf->path);
	memset(mf, 0, sizeof(*mf));
}

static int column_index(const char *name, size_t len)
{
	for (int i = 0; i < N_MOE_COLUMNS - 1; i++) /* expert_tokens: ignored */
		if (strlen(columns[i]) == len && !strncmp(columns[i], name, len))
			return i;
	return -1;
}

static void set_field(struct metrics_row *r, int col, double v)
{
	switch (col) {
	case 0: r->step = (long)v; break;
	case 1: r->tokens = v; break;
	case 2: r->wall_s = v; break;
	case 3: r->loss = v; r->has_loss = 1; break;
	case 4: r->val_loss = v; r->has_val_loss = 1; break;
	case 5: r->lr = v; r->has_lr = 1; break;
	case 6: r->grad_norm = v; r->has_grad_norm = 1; break;
	case 7: r->tokens_per_s = v; r->has_tps = 1; break;
	case 8: r->mfu = v; r->has_mfu = 1; break;
	case 9: r->bubble = v; r->has_bubble = 1; break;
	case 10: r->skipped = v; r->has_skipped = 1; break;
	case C_MOE_BALANCE: r->moe_balance = v; r->has_moe = 1; break;
	case C_MOE_Z: r->moe_z = v; r->has_moe = 1; break;
	}
}

static int parse_number(const char *s, const char *end, double *v)
{
	char tmp[64];
	size_t n = (size_t)(end - s);
	if (n == 0 || n >= sizeof(tmp))
		return -1;
	memcpy(tmp, s, n);
	tmp[n] = 0;
	char *e;
	errno = 0;
	*v = strtod(tmp, &e);
	while (*e == ' ')
		e++;
	return (errno || e == tmp || *e) ? -1 : 0;
}

static void push_row(struct metrics_series *out, const struct metrics_row *r)
{
	out->rows = xrealloc(out->rows, sizeof(*out->rows) * (size_t)(out->n + 1));
	out->rows[out->n++] = *r;
}

/* One JSON object per line with numeric values: {"step": 1, "loss": 2.5} */
static int read_jsonl_line(const char *path, int lineno, char *line, struct metrics_series *out)
{
	struct metrics_row r = {0};
	char *p = strchr(line, '{');
	if (!p)
		return error("%s:%d: expected a JSON object", path, lineno);
	p++;
	for (;;) {
		while (*p == ' ' || *p == ',')
			p++;
		if (*p == '}')
			break;
		if (*p != '"')
			return error("%s:%d: expected a key", path, lineno);
		char *key = ++p;
		char *q = strchr(p, '"');
		if (!q)
			return error("%s:%d: unterminated key", path, lineno);
		int col = column_index(key, (size_t)(q - key));
		p = q + 1;
		while (*p == ' ' || *p == ':')
			p++;
		char *vend = p;
		if (*p == '[') { /* a list (expert_tokens): not read */
			while (*vend && *vend != ']')
				vend++;
			if (!*vend)
				return error("%s:%d: unterminated list", path, lineno);
			p = vend + 1;
			continue;
		}
		while (*vend && *vend != ',' && *vend != '}')
			vend++;
		double v;
		if (vend - p >= 4 && !strncmp(p, "null", 4)) {
			p = vend; /* a non-finite value: absent */
			continue;
		}
		if (parse_number(p, vend, &v))
			return error("%s:%d: value of '%.*s' is not a number", path, lineno,
				     (int)(q - key), key);
		if (col >= 0)
			set_field(&r, col, v);
		p = vend;
		if (!*p)
			return error("%s:%d: unterminated object", path, lineno);
	}
	push_row(out, &r);
	return 0;
}

int metrics_read(const char *path, struct metrics_series *out)
{
	memset(out, 0, sizeof(*out));
	struct buf b = {0};
	if (read_file(path, &b))
		return -1;
	int map[64], ncols = 0, lineno = 0, rc = 0, jsonl = -1;
	char *next_line = (char *)b.data;
	while (next_line && *next_line) {
		char *line = next_line;
		char *nl = strchr(line, '\n');
		if (nl)
			*nl = 0;
		next_line = nl ? nl + 1 : NULL;
		lineno++;
		size_t len = strlen(line);
		if (len && line[len - 1] == '\r')
			line[--len] = 0;
		if (!len)
			continue;
		if (jsonl < 0)
			jsonl = line[0] == '{';
		if (jsonl) {
			if ((rc = read_jsonl_line(path, lineno, line, out)))
				break;
			continue;
		}
		if (!ncols) { /* header */
			char *s = line;
			for (;;) {
				char *comma = strchr(s, ',');
				size_t n = comma ? (size_t)(comma - s) : strlen(s);
				if (ncols == 64) {
					rc = error("%s:%d: too many columns", path, lineno);
					break;
				}
				map[ncols++] = column_index(s, n);
				if (!comma)
					break;
				s = comma + 1;
			}
			if (rc)
				break;
			if (column_index("step", 4) < 0 || map[0] != 0) {
				int has_step = 0;
				for (int i = 0; i < ncols; i++)
					has_step |= map[i] == 0;
				if (!has_step) {
					rc = error("%s:1: not a metrics file (no 'step' column)", path);
					break;
				}
			}
			continue;
		}
		struct metrics_row r = {0};
		char *s = line;
		for (int c = 0; c < ncols; c++) {
			char *comma = strchr(s, ',');
			char *end = comma ? comma : s + strlen(s);
			double v;
			if (end > s && map[c] >= 0) {
				if (parse_number(s, end, &v)) {
					rc = error("%s:%d: column %d is not a number", path, lineno,
						   c + 1);
					break;
				}
				set_field(&r, map[c], v);
			}
			if (!comma)
				break;
			s = comma + 1;
		}
		if (rc)
			break;
		push_row(out, &r);
	}
	buf_free(&b);
	if (rc)
		metrics_series_free(out);
	return rc;
}

int metrics_keep_until(const char *path, long step)
{
	struct buf in = {0}, out = {0};
	if (access(path, F_OK))
		return 0;
	if (read_file(path, &in))
		return -1;
	int header = 1;
	for (char *p = (char *)in.data; p && *p;) {
		char *nl = strchr(p, '\n');
		size_t len = nl ? (size_t)(nl - p + 1) : strlen(p);
		const char *s = p;
		if (*s == '{') { /* JSONL: find "step": */
			const char *k = strstr(s, "\"step\":");
			s = k ? k + 7 : NULL;
		} else if (header) {
			buf_append(&out, p, len); /* the CSV header */
			header = 0;
			p += len;
			continue;
		}
		/* step is the first CSV column */
		if (s && strtol(s, NULL, 10) <= step)
			buf_append(&out, p, len);
		p += len;
	}
	struct atomic_file af;
	int rc = atomic_open(&af, path);
	if (!rc && (atomic_write(&af, out.data ? out.data : (unsigned char *)"", out.len) ||
		    atomic_commit(&af)))
		rc = -1;
	buf_free(&in);
	buf_free(&out);
	return rc;
}

int metrics_is_metrics_file(const char *path)
{
	FILE *fp = fopen(path, "rb");
	if (!fp)
		return errno == ENOENT;
	char head[16] = "";
	size_t n = fread(head, 1, sizeof(head) - 1, fp);
	fclose(fp);
	head[n] = 0;
	return n == 0 || !strncmp(head, "step,", 5) || !strncmp(head, "{\"step\"", 7);
}

void metrics_series_free(struct metrics_series *s)
{
	free(s->rows);
	s->rows = NULL;
	s->n = 0;
}
