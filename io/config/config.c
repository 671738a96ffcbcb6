/* config.c - the INI configuration, driven by the key table in config_keys.h.
 *
 * Parsing goes through inih's ini_parse_stream() with a reader of our own.
 * The reader hands inih one line at a time, so it always knows the line
 * number the handler is working on (Debian's libinih is built without line
 * numbers in the handler), and it normalises the line first so that inih's
 * quirks cannot silently change a value:
 *
 *   - a line longer than CONFIG_MAX_LINE bytes is an error (inih would cut it
 *     at its 200-byte buffer and read the rest as another line);
 *   - leading whitespace is removed, so an indented line is never taken as a
 *     continuation of the previous value (inih's multi-line values);
 *   - a comment starts at '#' or ';' at the beginning of a line or after
 *     whitespace, anywhere on the line ("lr = 3e-3  # peak"); inih itself
 *     only strips "  ;" comments;
 *   - a section header must be exactly "[name]" (then only a comment), and a
 *     line that is neither blank, a comment, a section nor "key = value" is
 *     reported here rather than by inih, whose message has no detail.
 *
 * A value that config_print() could not write back (a string with a newline,
 * leading or trailing blanks, " #", or too long for one line) is refused when
 * it is set, so print -> load is always the identity.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <ini.h>

#include "config.h"
#include "../suggest.h"
#include "../util.h"

/* inih reads lines into a 200-byte buffer that must hold '\r', '\n', '\0'. */
#define CONFIG_MAX_LINE 197
#define CONFIG_MAX_ERRORS 20

enum key_kind { K_INT, K_FLOAT, K_STR, K_CHOICE };

/* Per-type pieces of the X-macro expansion. */
#define CFG_KIND_INT_IN(lo, hi) K_INT
#define CFG_KIND_FLOAT_IN(lo, hi) K_FLOAT
#define CFG_KIND_STR K_STR
#define CFG_KIND_CHOICE(c) K_CHOICE
#define CFG_KIND(type) CFG_KIND_##type
#define CFG_TNAME_INT_IN(lo, hi) "int"
#define CFG_TNAME_FLOAT_IN(lo, hi) "float"
#define CFG_TNAME_STR "string"
#define CFG_TNAME_CHOICE(c) "choice"
#define CFG_TNAME(type) CFG_TNAME_##type
#define CFG_CHOICES_INT_IN(lo, hi) NULL
#define CFG_CHOICES_FLOAT_IN(lo, hi) NULL
#define CFG_CHOICES_STR NULL
#define CFG_CHOICES_CHOICE(c) c
#define CFG_CHOICES(type) CFG_CHOICES_##type
#define CFG_RANGE_INT_IN(lo, hi) (lo), (hi)
#define CFG_RANGE_FLOAT_IN(lo, hi) (lo), (hi)
#define CFG_RANGE_STR 0, 0
#define CFG_RANGE_CHOICE(c) 0, 0
#define CFG_RANGE(type) CFG_RANGE_##type

const struct config_key_info config_key_table[] = {
#define X(sec, key, type, def, help) \
	{#sec, #key, CFG_TNAME(type), CFG_CHOICES(type), def, help, CFG_RANGE(type)},
	CONFIG_KEYS(X)
#undef X
};
const int config_key_count = (int)ARRAY_SIZE(config_key_table);

static const struct {
	enum key_kind kind;
	size_t offset;
} key_slot[] = {
#define X(sec, key, type, def, help) {CFG_KIND(type), offsetof(struct config, sec##_##key)},
	CONFIG_KEYS(X)
#undef X
};

static long *int_field(struct config *cfg, int i)
{
	return (long *)((char *)cfg + key_slot[i].offset);
}

static double *float_field(struct config *cfg, int i)
{
	return (double *)((char *)cfg + key_slot[i].offset);
}

static char **str_field(struct config *cfg, int i)
{
	return (char **)((char *)cfg + key_slot[i].offset);
}

static int is_blank(int c)
{
	return c == ' ' || c == '\t' || c == '\v' || c == '\f' || c == '\r';
}

/* ---- the key table ---- */

static int find_key(const char *section, const char *key)
{
	for (int i = 0; i < config_key_count; i++)
		if (!strcmp(config_key_table[i].section, section) &&
		    !strcmp(config_key_table[i].key, key))
			return i;
	return -1;
}

static int known_section(const char *section)
{
	for (int i = 0; i < config_key_count; i++)
		if (!strcmp(config_key_table[i].section, section))
			return 1;
	return 0;
}

const struct config_key_info *config_key_lookup(const char *section, const char *key)
{
	int i = find_key(section, key);
	return i < 0 ? NULL : &config_key_table[i];
}

/* "model, data, train, ..." in table order, each section once. */
static void section_list(char *out, size_t n)
{
	size_t len = 0;
	out[0] = '\0';
	for (int i = 0; i < config_key_count; i++) {
		const char *s = config_key_table[i].section;
		if (i > 0 && !strcmp(s, config_key_table[i - 1].section))
			continue;
		int w = snprintf(out + len, n - len, "%s%s", len ? ", " : "", s);
		if (w < 0 || (size_t)w >= n - len)
			break;
		len += w;
	}
}

/* "a, b, c" from "a|b|c". */
static void choice_list(const char *choices, char *out, size_t n)
{
	size_t len = 0;
	for (const char *p = choices; *p && len + 3 < n; p++) {
		if (*p == '|') {
			out[len++] = ',';
			out[len++] = ' ';
		} else {
			out[len++] = *p;
		}
	}
	out[len] = '\0';
}

/* A choice written "name:N" accepts name: followed by 1 to 4 digits
 * (train.device = cuda:1). */
static int is_indexed_choice(const char *p, size_t len, const char *value)
{
	if (len < 3 || strncmp(p + len - 2, ":N", 2) || strncmp(p, value, len - 1))
		return 0;
	size_t digits = strspn(value + len - 1, "0123456789");
	return digits >= 1 && digits <= 4 && value[len - 1 + digits] == '\0';
}

static int is_choice(const char *choices, const char *value)
{
	size_t n = strlen(value);
	const char *p = choices;
	while (*p) {
		const char *bar = strchr(p, '|');
		size_t len = bar ? (size_t)(bar - p) : strlen(p);
		if ((len == n && !strncmp(p, value, n)) || is_indexed_choice(p, len, value))
			return 1;
		if (!bar)
			break;
		p = bar + 1;
	}
	return 0;
}

/* "[eval], [sample] or [log]": every section that holds key; 0 when none. */
static int sections_of(const char *key, char *out, size_t n)
{
	int total = 0, k = 0;
	for (int i = 0; i < config_key_count; i++)
		total += !strcmp(config_key_table[i].key, key);
	size_t used = 0;
	out[0] = '\0';
	for (int i = 0; i < config_key_count && used < n; i++) {
		if (strcmp(config_key_table[i].key, key))
			continue;
		int w = snprintf(out + used, n - used, "%s[%s]",
				 k == 0 ? "" : k == total - 1 ? " or " : ", ",
				 config_key_table[i].section);
		used += w > 0 ? (size_t)w : 0;
		k++;
	}
	return total > 0;
}

/* "train.steps" (with value: "train.steps=10"), or "eval.every, log.every
 * or ...": the keys of any section nearest to key; "" when none is near. */
static int qualified_keys_near(const char *key, const char *value, char *out, size_t n)
{
	static const size_t width = 96;
	char *shown = xmalloc(st_mult((size_t)config_key_count, width));
	struct suggest sg;
	suggest_init(&sg, key);
	for (int i = 0; i < config_key_count; i++) {
		char *q = shown + (size_t)i * width;
		snprintf(q, width, "%s.%s%s%.40s", config_key_table[i].section,
			 config_key_table[i].key, value ? "=" : "", value ? value : "");
		suggest_offer_as(&sg, config_key_table[i].key, q);
	}
	int found = suggest_text(&sg, "%s", out, n);
	free(shown);
	return found;
}

/* "; did you mean 'name'?" from the keys of section nearest to key, else
 * from every section's ("; did you mean optim.name?"); "" when none is near. */
static void key_hint(const char *section, const char *key, char *out, size_t n)
{
	char names[224];
	struct suggest sg;
	suggest_init(&sg, key);
	for (int i = 0; i < config_key_count; i++)
		if (!strcmp(config_key_table[i].section, section))
			suggest_offer(&sg, config_key_table[i].key);
	out[0] = '\0';
	if (suggest_text(&sg, "'%s'", names, sizeof(names)) ||
	    qualified_keys_near(key, NULL, names, sizeof(names)))
		snprintf(out, n, "; did you mean %s?", names);
}

/* The error for a key that is not in the table, with a hint: the sections
 * where the key exists, else the nearest keys. */
static int unknown_key(const char *where, const char *section, const char *key)
{
	char list[256];
	if (sections_of(key, list, sizeof(list)))
		return error("%s: unknown key '%s' in [%s]; it belongs in %s", where, key, section,
			     list);
	key_hint(section, key, list, sizeof(list));
	return error("%s: unknown key '%s' in [%s]%s", where, key, section, list);
}

/* The error for a section that is not in the table, with the nearest. */
static void unknown_section_text(const char *section, char *out, size_t n)
{
	char list[256], near[128] = "";
	section_list(list, sizeof(list));
	struct suggest sg;
	suggest_init(&sg, section);
	for (int i = 0; i < config_key_count; i++)
		suggest_offer(&sg, config_key_table[i].section);
	if (suggest_text(&sg, "[%s]", near, sizeof(near)))
		snprintf(out, n, "unknown section [%s]; did you mean %s? The sections are %s",
			 section, near, list);
	else
		snprintf(out, n, "unknown section [%s]; sections are %s", section, list);
}

/* ---- values ---- */

static int parse_long(const char *s, long *out)
{
	char *end;
	if (!*s || is_blank((unsigned char)*s) || *s == '\n')
		return -1;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (*end || errno)
		return -1;
	*out = v;
	return 0;
}

/* true/false, yes/no, on/off (any case) for the 0..1 keys; -1 otherwise */
static int parse_bool(const char *s, long *out)
{
	static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
	for (int i = 0; i < 3; i++) {
		if (!strcasecmp(s, yes[i]))
			return *out = 1, 0;
		if (!strcasecmp(s, no[i]))
			return *out = 0, 0;
	}
	return -1;
}

static int parse_double(const char *s, double *out)
{
	char *end;
	if (!*s || is_blank((unsigned char)*s) || *s == '\n')
		return -1;
	errno = 0;
	double v = strtod(s, &end);
	if (*end || !isfinite(v) || (errno == ERANGE && fabs(v) > 1.0))
		return -1;
	if (errno == ERANGE && v == 0) /* underflow: 1e-400 would silently become 0 */
		return -2;
	*out = v;
	return 0;
}

/* Can `value` be written as "key = value" and read back unchanged? */
static const char *unprintable_reason(const char *key, const char *value)
{
	size_t n = strlen(value);
	if (n + strlen(key) + 3 > CONFIG_MAX_LINE)
		return "it is too long for one line of a config file";
	for (size_t i = 0; i < n; i++) {
		unsigned char c = value[i];
		if (c < 0x20 || c == 0x7f)
			return "it contains a control character";
		if ((c == '#' || c == ';') && (i == 0 || is_blank((unsigned char)value[i - 1])))
			return "a '#' or ';' at its start or after a blank would read as a comment";
	}
	if (n && (is_blank((unsigned char)value[0]) || is_blank((unsigned char)value[n - 1])))
		return "it starts or ends with a blank";
	return NULL;
}

void config_range_text(const struct config_key_info *k, char *out, size_t len)
{
	int is_int = strcmp(k->type, "int") == 0; /* whole numbers, never 1.04858e+06 */
	if (isinf(k->hi) && is_int)
		snprintf(out, len, "%.0f or more", k->lo);
	else if (isinf(k->hi))
		snprintf(out, len, "%g or more", k->lo);
	else if (is_int)
		snprintf(out, len, "%.0f..%.0f", k->lo, k->hi);
	else
		snprintf(out, len, "%g..%g", k->lo, k->hi);
}

static int out_of_range(const char *origin, const struct config_key_info *k, const char *value)
{
	char range[64];
	config_range_text(k, range, sizeof(range));
	return error("%s: %s.%s: %s is out of range (%s)", origin, k->section, k->key, value, range);
}

int config_set_key(struct config *cfg, const char *section, const char *key, const char *value,
		   const char *origin)
{
	int i = find_key(section, key);
	if (i < 0) {
		if (!known_section(section)) {
			char text[512];
			unknown_section_text(section, text, sizeof(text));
			return error("%s: %s", origin, text);
		}
		return unknown_key(origin, section, key);
	}
	const struct config_key_info *k = &config_key_table[i];
	switch (key_slot[i].kind) {
	case K_INT: {
		long v;
		int flag = k->lo == 0 && k->hi == 1; /* a yes/no key: true and false read too */
		if (flag && parse_bool(value, &v) == 0)
			;
		else if (parse_long(value, &v))
			return error(flag ? "%s: %s.%s: expected 0, 1, true or false, got '%s'"
					  : "%s: %s.%s: expected an integer, got '%s'",
				     origin, section, key, value);
		if ((double)v < k->lo || (double)v > k->hi)
			return out_of_range(origin, k, value);
		*int_field(cfg, i) = v;
		cfg->given[i] = 1;
		return 0;
	}
	case K_FLOAT: {
		double v;
		int bad = parse_double(value, &v);
		if (bad == -2)
			return error("%s: %s.%s: %s is too small for a double and would become 0; "
				     "write 0, or a number of at least 5e-324", origin, section, key,
				     value);
		if (bad)
			return error("%s: %s.%s: expected a number, got '%s'", origin, section, key,
				     value);
		if (v < k->lo || v > k->hi)
			return out_of_range(origin, k, value);
		*float_field(cfg, i) = v;
		cfg->given[i] = 1;
		return 0;
	}
	case K_CHOICE:
		if (!is_choice(k->choices, value)) {
			char list[256];
			choice_list(k->choices, list, sizeof(list));
			return error("%s: %s.%s: expected one of %s; got '%s'", origin, section, key,
				     list, value);
		}
		break;
	case K_STR: {
		const char *why = unprintable_reason(key, value);
		if (why)
			return error("%s: %s.%s: cannot use this value: %s", origin, section, key,
				     why);
		break;
	}
	}
	char **f = str_field(cfg, i);
	free(*f);
	*f = xstrdup(value);
	cfg->given[i] = 1;
	return 0;
}

void config_defaults(struct config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	for (int i = 0; i < config_key_count; i++) {
		const struct config_key_info *k = &config_key_table[i];
		if (key_slot[i].kind == K_STR || key_slot[i].kind == K_CHOICE)
			*str_field(cfg, i) = xstrdup("");
		/* A bad default is a bug in config_keys.h; test_config catches it. */
		config_set_key(cfg, k->section, k->key, k->def, "config_keys.h");
	}
	memset(cfg->given, 0, sizeof(cfg->given));
}

int config_finish(struct config *cfg)
{
	static const struct {
		const char *optim;
		int key;
		const char *value;
	} follow[] = {
#define Y(optim, sec, key, value) {optim, CONFIG_KEY_##sec##_##key, value},
		CONFIG_OPTIM_DEFAULTS(Y)
#undef Y
	};
	/* first the plain defaults (a configuration finished for another
	 * optimizer may hold that one's values), then the optimizer's own */
	for (size_t j = 0; j < ARRAY_SIZE(follow); j++) {
		const struct config_key_info *k = &config_key_table[follow[j].key];
		if (cfg->given[follow[j].key])
			continue;
		if (config_set_key(cfg, k->section, k->key, k->def, "config_keys.h"))
			return -1;
		cfg->given[follow[j].key] = 0;
	}
	for (size_t j = 0; j < ARRAY_SIZE(follow); j++) {
		const struct config_key_info *k = &config_key_table[follow[j].key];
		if (strcmp(cfg->optim_name, follow[j].optim) || cfg->given[follow[j].key])
			continue;
		/* a bad value is a bug in config_keys.h; test_config catches it */
		if (config_set_key(cfg, k->section, k->key, follow[j].value, "config_keys.h"))
			return -1;
		cfg->given[follow[j].key] = 0;
	}
	return 0;
}

void config_free(struct config *cfg)
{
	for (int i = 0; i < config_key_count; i++)
		if (key_slot[i].kind == K_STR || key_slot[i].kind == K_CHOICE) {
			char **f = str_field(cfg, i);
			free(*f);
			*f = NULL;
		}
}

void config_copy(struct config *dst, const struct config *src)
{
	memcpy(dst, src, sizeof(*dst));
	for (int i = 0; i < config_key_count; i++)
		if (key_slot[i].kind == K_STR || key_slot[i].kind == K_CHOICE) {
			char **f = str_field(dst, i);
			*f = xstrdup(*f ? *f : "");
		}
}

/* Shortest spelling that reads back as exactly v: integers as integers,
 * else the shortest "%.Ng" with its exponent tidied ("1e-05" -> "1e-5"). */
static void format_double(char *out, size_t n, double v)
{
	if (v == floor(v) && fabs(v) < 1e15) {
		snprintf(out, n, "%.0f", v);
		return;
	}
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(out, n, "%.*g", prec, v);
		if (strtod(out, NULL) == v)
			break;
	}
	char *e = strchr(out, 'e');
	if (!e)
		return;
	char *p = e + 1, *q = e + 1;
	if (*p == '+')
		p++;
	else if (*p == '-')
		p++, q++;
	while (*p == '0' && p[1])
		p++;
	memmove(q, p, strlen(p) + 1);
}

char *config_get_string(const struct config *cfg, const char *section, const char *key)
{
	int i = find_key(section, key);
	if (i < 0)
		return NULL;
	char tmp[64];
	struct config *c = (struct config *)cfg;
	switch (key_slot[i].kind) {
	case K_INT:
		snprintf(tmp, sizeof(tmp), "%ld", *int_field(c, i));
		return xstrdup(tmp);
	case K_FLOAT:
		format_double(tmp, sizeof(tmp), *float_field(c, i));
		return xstrdup(tmp);
	default:
		return xstrdup(*str_field(c, i) ? *str_field(c, i) : "");
	}
}

/* text as "# " comment lines of at most 79 columns, broken between words
 * (a word longer than a line gets a line of its own), well within inih's
 * line limit. */
static void append_comment(struct buf *b, const char *text)
{
	const int width = 79 - 2;
	const char *p = text;
	while (*p) {
		while (*p == ' ')
			p++;
		size_t n = strlen(p);
		if (n > (size_t)width) {
			n = (size_t)width;
			while (n > 0 && p[n] != ' ')
				n--;
			if (!n)
				n = strcspn(p, " ");
		}
		buf_append(b, "# ", 2);
		buf_append(b, p, n);
		buf_append(b, "\n", 1);
		p += n;
	}
}

static void print_ini(struct buf *b, const struct config *cfg, int comments)
{
	char line[512];
	const char *section = NULL;
	if (comments) {
		const char *head = "# asyncpp configuration (see asyncpp.ini(5))\n";
		buf_append(b, head, strlen(head));
	}
	for (int i = 0; i < config_key_count; i++) {
		const struct config_key_info *k = &config_key_table[i];
		if (!section || strcmp(section, k->section)) {
			section = k->section;
			int n = snprintf(line, sizeof(line), "%s[%s]\n", i ? "\n" : "", section);
			buf_append(b, line, n);
		}
		if (comments) {
			char text[1024];
			if (k->choices) {
				char list[256];
				choice_list(k->choices, list, sizeof(list));
				snprintf(text, sizeof(text), "%s (one of %s; default %s)", k->help, list,
					 k->def);
			} else {
				snprintf(text, sizeof(text), "%s (%s; default %s)", k->help, k->type,
					 *k->def ? k->def : "empty");
			}
			append_comment(b, text);
		}
		char *v = config_get_string(cfg, k->section, k->key);
		int n = snprintf(line, sizeof(line), "%s =%s%s\n", k->key, *v ? " " : "", v);
		buf_append(b, line, MIN((size_t)n, sizeof(line) - 1));
		free(v);
	}
}

void config_print(FILE *fp, const struct config *cfg)
{
	struct buf b = {0};
	print_ini(&b, cfg, 1);
	fwrite(b.data, 1, b.len, fp);
	buf_free(&b);
}

char *config_to_string(const struct config *cfg)
{
	struct buf b = {0};
	print_ini(&b, cfg, 0);
	buf_append(&b, "", 1);
	return (char *)b.data;
}

void config_first_difference(const char *a, const char *b, int rank_a, char *msg, size_t len)
{
	const char *section = "";
	char sec[64] = "";
	while (*a && *b) {
		size_t la = strcspn(a, "\n"), lb = strcspn(b, "\n");
		if (*a == '[' && la < sizeof(sec)) {
			snprintf(sec, sizeof(sec), "%.*s.", (int)(la - 2), a + 1);
			section = sec;
		}
		if (la != lb || memcmp(a, b, la)) {
			snprintf(msg, len, "%s%.*s on rank %d, but %s%.*s on rank 0", section, (int)la,
				 a, rank_a, section, (int)lb, b);
			return;
		}
		a += la + (a[la] != 0);
		b += lb + (b[lb] != 0);
	}
	snprintf(msg, len, "their lengths differ");
}

/* ---- parsing ---- */

struct parse_state {
	struct config *cfg;
	const char *origin;
	const char *p, *end; /* the text not yet handed to inih */
	int line;            /* number of the line inih holds now */
	int errors;
	int section_ok;      /* the current [section] is known (or none yet) */
	int set_line[ARRAY_SIZE(config_key_table)]; /* where each key was set */
};

PRINTF_LIKE(2, 3) static void parse_error(struct parse_state *st, const char *fmt, ...)
{
	char msg[768];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	error("%s:%d: %s", st->origin, st->line, msg);
	st->errors++;
}

/* Quote at most 40 bytes of a line for a message. */
static void excerpt(char *out, size_t n, const char *s, size_t len)
{
	size_t k = MIN(len, MIN((size_t)40, n - 4));
	memcpy(out, s, k);
	out[k] = '\0';
	if (k < len)
		strcat(out, "...");
}

/* Check one line (without its newline) and write what inih should see into
 * out: the line without indentation and comments, or "" when it is blank,
 * a comment, or an error already reported. */
static void check_line(struct parse_state *st, const char *s, size_t len, char *out)
{
	out[0] = '\0';
	if (len > CONFIG_MAX_LINE) {
		parse_error(st, "line is %zu bytes long; the limit is %d", len, CONFIG_MAX_LINE);
		return;
	}
	if (memchr(s, '\0', len)) {
		parse_error(st, "line contains a NUL byte");
		return;
	}
	if (st->line == 1 && len >= 3 && !memcmp(s, "\xef\xbb\xbf", 3)) {
		s += 3;
		len -= 3;
	}
	int indented = len > 0 && is_blank((unsigned char)s[0]);
	while (len > 0 && is_blank((unsigned char)*s)) {
		s++;
		len--;
	}
	/* Cut the comment: '#' or ';' at the start or after a blank. */
	for (size_t i = 0; i < len; i++)
		if ((s[i] == '#' || s[i] == ';') && (i == 0 || is_blank((unsigned char)s[i - 1]))) {
			len = i;
			break;
		}
	while (len > 0 && is_blank((unsigned char)s[len - 1]))
		len--;
	if (!len)
		return;
	char shown[64];
	excerpt(shown, sizeof(shown), s, len);
	if (s[0] == '[') {
		size_t i = 1;
		while (i < len && (isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == '-'))
			i++;
		if (i == 1 || i >= len || s[i] != ']') {
			parse_error(st, "bad section header '%s'; expected [name]", shown);
			st->section_ok = 0;
			return;
		}
		if (i + 1 != len) {
			parse_error(st, "unexpected text after [%.*s]", (int)(i - 1), s + 1);
			st->section_ok = 0;
			return;
		}
		char name[CONFIG_MAX_LINE + 1];
		memcpy(name, s + 1, i - 1);
		name[i - 1] = '\0';
		st->section_ok = known_section(name);
		if (!st->section_ok) {
			char text[512];
			unknown_section_text(name, text, sizeof(text));
			parse_error(st, "%s", text);
		}
		memcpy(out, s, len);
		out[len] = '\0';
		return;
	}
	const char *sep = NULL;
	for (size_t i = 0; i < len && !sep; i++)
		if (s[i] == '=' || s[i] == ':')
			sep = s + i;
	if (!sep) {
		parse_error(st, "expected 'key = value' or '[section]', got '%s'%s", shown,
			    indented ? " (an indented line does not continue the previous one)" : "");
		return;
	}
	if (sep == s) {
		parse_error(st, "missing key name before '%c'", *sep);
		return;
	}
	memcpy(out, s, len);
	out[len] = '\0';
}

/* inih's fgets-style reader: hand over the next line, checked. */
static char *reader(char *str, int num, void *stream)
{
	struct parse_state *st = stream;
	if (st->p >= st->end || st->errors >= CONFIG_MAX_ERRORS)
		return NULL;
	const char *nl = memchr(st->p, '\n', st->end - st->p);
	size_t len = nl ? (size_t)(nl - st->p) : (size_t)(st->end - st->p);
	const char *s = st->p;
	st->p = nl ? nl + 1 : st->end;
	st->line++;
	char line[CONFIG_MAX_LINE + 1];
	check_line(st, s, len, line);
	/* inih needs room for the line, '\n' and '\0'. */
	size_t n = strlen(line);
	if (n + 2 > (size_t)num) {
		parse_error(st, "line is too long for inih's %d-byte buffer", num);
		n = 0;
	}
	memcpy(str, line, n);
	str[n] = '\n';
	str[n + 1] = '\0';
	return str;
}

static int handler(void *user, const char *section, const char *name, const char *value)
{
	struct parse_state *st = user;
	char where[512];
	if (!st->section_ok)
		return 1; /* the section line was reported already */
	if (!*section) {
		char list[256];
		if (sections_of(name, list, sizeof(list)))
			parse_error(st, "key '%s' outside a section; put it under a %s line", name,
				    list);
		else
			parse_error(st, "key '%s' outside a section; put it under a [section] line",
				    name);
		return 1;
	}
	snprintf(where, sizeof(where), "%s:%d", st->origin, st->line);
	int i = find_key(section, name);
	if (i >= 0 && st->set_line[i]) {
		parse_error(st, "%s.%s is set twice (first at line %d)", section, name,
			    st->set_line[i]);
		return 1;
	}
	if (config_set_key(st->cfg, section, name, value, where)) {
		st->errors++;
		return 1;
	}
	st->set_line[i] = st->line;
	return 1;
}

static int load_buffer(struct config *cfg, const char *text, size_t len, const char *origin)
{
	struct config tmp;
	struct parse_state st;
	memset(&st, 0, sizeof(st));
	config_copy(&tmp, cfg);
	st.cfg = &tmp;
	st.origin = origin;
	st.p = text;
	st.end = text + len;
	st.section_ok = 1;
	int rc = ini_parse_stream(reader, &st, handler, &st);
	if (rc > 0 && !st.errors) {
		st.line = rc;
		parse_error(&st, "syntax error");
	} else if (rc < 0 && !st.errors) {
		error("%s: cannot parse (inih error %d)", origin, rc);
		st.errors++;
	}
	if (st.errors >= CONFIG_MAX_ERRORS && st.p < st.end)
		error("%s: too many errors; stopped at line %d", origin, st.line);
	if (st.errors) {
		config_free(&tmp);
		return -1;
	}
	config_free(cfg);
	*cfg = tmp;
	return 0;
}

int config_load_string(struct config *cfg, const char *text, const char *origin)
{
	return load_buffer(cfg, text, strlen(text), origin ? origin : "(string)");
}

int config_load_file(struct config *cfg, const char *path)
{
	struct buf b = {0};
	if (read_file(path, &b))
		return -1;
	int rc = load_buffer(cfg, (const char *)b.data, b.len,
			     strcmp(path, "-") ? path : "(stdin)");
	buf_free(&b);
	return rc;
}

/* "--set steps=10": the error names the sections holding the key (or the
 * nearest keys), spelt out: "did you mean train.steps=10?". */
static int set_without_section(const char *assignment, const char *eq)
{
	const char *k = assignment, *ke = eq, *v = eq + 1;
	while (k < ke && is_blank((unsigned char)*k))
		k++;
	while (ke > k && is_blank((unsigned char)ke[-1]))
		ke--;
	while (is_blank((unsigned char)*v))
		v++;
	char *key = xmalloc((size_t)(ke - k) + 1), near[512];
	memcpy(key, k, (size_t)(ke - k));
	key[ke - k] = '\0';
	int found = *key && qualified_keys_near(key, v, near, sizeof(near));
	free(key);
	if (found)
		return error("--set: expected SECTION.KEY=VALUE, got '%s'; did you mean %s?",
			     assignment, near);
	return error("--set: expected SECTION.KEY=VALUE, got '%s'", assignment);
}

int config_set(struct config *cfg, const char *assignment)
{
	const char *eq = strchr(assignment, '=');
	const char *dot = eq ? memchr(assignment, '.', eq - assignment) : NULL;
	if (eq && !dot)
		return set_without_section(assignment, eq);
	if (!eq)
		return error("--set: expected SECTION.KEY=VALUE, got '%s'", assignment);
	const char *s = assignment, *se = dot, *k = dot + 1, *ke = eq, *v = eq + 1;
	while (s < se && is_blank((unsigned char)*s))
		s++;
	while (ke > k && is_blank((unsigned char)ke[-1]))
		ke--;
	while (is_blank((unsigned char)*v))
		v++;
	size_t vlen = strlen(v);
	while (vlen && is_blank((unsigned char)v[vlen - 1]))
		vlen--;
	char *section = xmalloc(se - s + 1), *key = xmalloc(ke - k + 1), *value = xmalloc(vlen + 1);
	memcpy(section, s, se - s);
	section[se - s] = '\0';
	memcpy(key, k, ke - k);
	key[ke - k] = '\0';
	memcpy(value, v, vlen);
	value[vlen] = '\0';
	int rc;
	if (!*section || !*key)
		rc = error("--set: expected SECTION.KEY=VALUE, got '%s'", assignment);
	else
		rc = config_set_key(cfg, section, key, value, "--set");
	free(section);
	free(key);
	free(value);
	return rc;
}

int config_from_args(struct config *cfg, const char *config_file, const char *const *sets,
		     int n_sets)
{
	config_defaults(cfg);
	if (config_file && config_load_file(cfg, config_file))
		goto fail;
	for (int i = 0; i < n_sets; i++)
		if (config_set(cfg, sets[i]))
			goto fail;
	if (config_finish(cfg))
		goto fail;
	return 0;
fail:
	config_free(cfg);
	return -1;
}
