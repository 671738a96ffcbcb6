/* help.c - `asyncpp help TOPIC`: the man page, from the copy compiled into
 * the binary (cmd/builtin.h), so it works before `make install`. On a
 * terminal with man(1) the page goes through `man -l`; otherwise (a pipe,
 * no man) it is rendered here as plain text: sections, indented
 * paragraphs, no-fill blocks, simple tbl(1) tables and the common escapes,
 * with fonts dropped. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../io/staged.h"
#include "../io/util.h"
#include "builtin.h"
#include "cmd.h"

/* The page for a topic: a command ("train" -> asyncpp-train.1), "asyncpp",
 * or a page's own name without section ("asyncpp.ini", "asyncpp-formats",
 * or their short forms "ini", "formats", "distributed"). */
static const struct builtin_doc *find_page(const char *topic)
{
	char want[3][96];
	snprintf(want[0], sizeof(want[0]), "asyncpp-%s.", topic);
	snprintf(want[1], sizeof(want[1]), "%s.", topic);
	snprintf(want[2], sizeof(want[2]), "asyncpp.%s.", topic);
	for (int w = 0; w < 3; w++)
		for (int i = 0; i < builtin_manpages_count; i++) {
			const char *name = builtin_manpages[i].name;
			size_t n = strlen(want[w]);
			/* "NAME." followed by the one-character section */
			if (!strncmp(name, want[w], n) && strlen(name) == n + 1)
				return &builtin_manpages[i];
		}
	return NULL;
}

/* Append text with roff escapes resolved and fonts dropped. */
static void unescape(struct buf *out, const char *s, size_t n)
{
	static const struct {
		const char *from, *to;
	} named[] = {{"\\(aq", "'"}, {"\\(dq", "\""}, {"\\(mu", "x"}, {"\\(>=", ">="},
		     {"\\(<=", "<="}, {"\\(em", "--"}, {"\\(en", "-"}, {"\\(rs", "\\"},
		     {"\\(bu", "*"}, {"\\(co", "(c)"}, {"\\(->", "->"}, {"\\(*l", "lambda"},
		     {"\\(pc", "\xc2\xb7"}, {"\\(ti", "~"}, {"\\(ha", "^"}, {"\\(lq", "\""},
		     {"\\(rq", "\""}, {"\\(oq", "'"}, {"\\(cq", "'"}, {"\\(+-", "+-"},
		     {"\\(eq", "="}, {"\\(sl", "/"}, {"\\(at", "@"}, {"\\(ap", "~"},
		     {"\\(S2", "\xc2\xb2"}};
	for (size_t i = 0; i < n; i++) {
		if (s[i] != '\\' || i + 1 >= n) {
			buf_append(out, s + i, 1);
			continue;
		}
		char c = s[i + 1];
		if (c == 'f') { /* \fB \fI \fR \fP: a font change */
			i += i + 2 < n ? 2 : 1;
			continue;
		}
		if (c == '-' || c == 'e' || c == '\\' || c == '~' || c == ' ' || c == '0') {
			buf_append(out, c == '-' ? "-" : c == 'e' || c == '\\' ? "\\" : " ", 1);
			i++;
			continue;
		}
		/* zero-width: \& \: \c, and the thin spaces \| \^ */
		if (c == '&' || c == ':' || c == 'c' || c == '|' || c == '^') {
			i++;
			continue;
		}
		int done = 0;
		for (size_t k = 0; k < ARRAY_SIZE(named) && !done; k++) {
			size_t len = strlen(named[k].from);
			if (i + len <= n && !memcmp(s + i, named[k].from, len)) {
				buf_append(out, named[k].to, strlen(named[k].to));
				i += len - 1;
				done = 1;
			}
		}
		if (!done && c == '(' && i + 3 < n) { /* another \(xx: its two letters */
			buf_append(out, s + i + 2, 2);
			i += 3;
		} else if (!done) {
			buf_append(out, s + i, 1);
		}
	}
}

/* The arguments of a font macro (.B, .BR, ...) joined: quoted arguments
 * keep their blanks; the alternating forms join without a blank. */
static void macro_args(struct buf *out, const char *args, int alternating)
{
	const char *p = args;
	int first = 1;
	while (*p) {
		while (*p == ' ')
			p++;
		if (!*p)
			break;
		const char *start = p, *end;
		if (*p == '"') {
			start = ++p;
			while (*p && *p != '"')
				p++;
			end = p;
			if (*p)
				p++;
		} else {
			while (*p && *p != ' ')
				p++;
			end = p;
		}
		if (!first && !alternating)
			buf_append(out, " ", 1);
		unescape(out, start, (size_t)(end - start));
		first = 0;
	}
}

struct page {
	FILE *fp;
	struct buf para;   /* words of the paragraph being filled */
	int rs;            /* extra indent from .RS */
	int tp;            /* 1: the next line is a .TP tag; 2: in a .TP body */
	int nofill;        /* between .nf and .fi: lines as they are */
	int table;         /* in .TS: 1 before the format's '.', 2 in the rows */
	struct buf rows;   /* the table's rows, unescaped: cells split by tabs,
			    * rows ended by newlines */
};

static int body_indent(const struct page *pg)
{
	return 7 + pg->rs + (pg->tp == 2 ? 7 : 0);
}

/* Print the filled paragraph, wrapped to 79 columns. */
static void flush(struct page *pg)
{
	int indent = body_indent(pg), width = 79 - indent;
	if (width < 30)
		width = 30;
	const char *p = (const char *)pg->para.data, *end = p + pg->para.len;
	while (p < end) {
		while (p < end && *p == ' ')
			p++;
		if (p >= end)
			break;
		const char *cut = p + width < end ? p + width : end, *brk = cut;
		if (cut < end) { /* break at the last blank that fits, else after the word */
			while (brk > p && *brk != ' ')
				brk--;
			if (brk == p)
				for (brk = cut; brk < end && *brk != ' '; brk++)
					;
		}
		fprintf(pg->fp, "%*s%.*s\n", indent, "", (int)(brk - p), p);
		p = brk;
	}
	pg->para.len = 0;
}

/* A line of output text: the .TP tag on its own line, a no-fill line as
 * it is, else words for the paragraph. */
static void add_text(struct page *pg, const struct buf *t)
{
	if (pg->tp == 1) {
		fprintf(pg->fp, "%*s%.*s\n", 7 + pg->rs, "", (int)t->len, (const char *)t->data);
		pg->tp = 2;
	} else if (pg->nofill) {
		fprintf(pg->fp, "%*s%.*s\n", body_indent(pg), "", (int)t->len, (const char *)t->data);
	} else {
		if (pg->para.len)
			buf_append(&pg->para, " ", 1);
		buf_append(&pg->para, t->data, t->len);
	}
}

/* Print the table's rows in columns two blanks apart; a row "_" or "="
 * is a rule across them. */
static void print_table(struct page *pg)
{
	enum { MAX_COLS = 16 };
	int width[MAX_COLS] = {0}, cols = 0, total = 0;
	const char *text = (const char *)pg->rows.data, *end = text + pg->rows.len;
	for (int pass = 0; pass < 2; pass++) {
		for (const char *p = text; p < end;) {
			const char *nl = memchr(p, '\n', (size_t)(end - p));
			const char *row_end = nl ? nl : end;
			if (row_end - p == 1 && (*p == '_' || *p == '=')) {
				if (pass)
					fprintf(pg->fp, "%*s%.*s\n", body_indent(pg), "", total,
						"----------------------------------------------------"
						"----------------------------------------------------");
				p = row_end + 1;
				continue;
			}
			if (pass)
				fprintf(pg->fp, "%*s", body_indent(pg), "");
			for (int col = 0; p <= row_end && col < MAX_COLS; col++) {
				const char *tab = memchr(p, '\t', (size_t)(row_end - p));
				int last = !tab || col == MAX_COLS - 1; /* it takes the rest */
				const char *cell_end = last ? row_end : tab;
				int w = (int)(cell_end - p);
				if (!pass && w > width[col])
					width[col] = w;
				if (!pass && col + 1 > cols)
					cols = col + 1;
				if (pass)
					fprintf(pg->fp, "%-*.*s%s", last ? 0 : width[col], w, p,
						last ? "" : "  ");
				p = cell_end + 1;
				if (last)
					break;
			}
			if (pass)
				fputc('\n', pg->fp);
			p = row_end + 1;
		}
		for (int col = 0; !pass && col < cols; col++)
			total += width[col] + (col ? 2 : 0);
	}
	pg->rows.len = 0;
}

/* A line inside .TS/.TE: the options and format lines (up to the one
 * that ends in '.'), then rows. */
static void table_line(struct page *pg, const char *s, size_t n)
{
	if (n >= 3 && !memcmp(s, ".TE", 3)) {
		print_table(pg);
		pg->table = 0;
	} else if (pg->table == 1) {
		while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
			n--;
		if (n && s[n - 1] == '.')
			pg->table = 2;
	} else if (!n || s[0] != '.') { /* other requests (.sp) inside: dropped */
		unescape(&pg->rows, s, n);
		buf_append(&pg->rows, "\n", 1);
	}
}

/* One macro line (without its dot). */
static void macro(struct page *pg, const char *mac, const char *args)
{
	struct buf t = {0};
	if (!strcmp(mac, "SH") || !strcmp(mac, "SS")) {
		flush(pg);
		macro_args(&t, args, 0);
		fprintf(pg->fp, "\n%*s%.*s\n", !strcmp(mac, "SH") ? 0 : 3, "", (int)t.len,
			t.data ? (const char *)t.data : "");
		pg->rs = pg->tp = 0;
	} else if (!strcmp(mac, "PP") || !strcmp(mac, "P") || !strcmp(mac, "LP")) {
		flush(pg);
		fputc('\n', pg->fp);
		pg->tp = 0;
	} else if (!strcmp(mac, "TP")) {
		flush(pg);
		fputc('\n', pg->fp);
		pg->tp = 1;
	} else if (!strcmp(mac, "IP")) { /* .IP [TAG [INDENT]]: TAG as .TP's */
		flush(pg);
		fputc('\n', pg->fp);
		/* the first argument only: quoted, or up to a blank */
		const char *a = args + strspn(args, " "), *e;
		if (*a == '"')
			e = strchr(a + 1, '"') ? strchr(a + 1, '"') + 1 : a + strlen(a);
		else
			e = a + strcspn(a, " ");
		size_t n = (size_t)(e - a);
		char *tag = xmalloc(n + 1);
		memcpy(tag, a, n);
		tag[n] = 0;
		macro_args(&t, tag, 0);
		free(tag);
		pg->tp = 1;
		if (t.len)
			add_text(pg, &t);
		else
			pg->tp = 2;
	} else if (!strcmp(mac, "RS") || !strcmp(mac, "RE")) {
		flush(pg);
		pg->rs = !strcmp(mac, "RS") ? pg->rs + 7 : pg->rs >= 7 ? pg->rs - 7 : 0;
	} else if (!strcmp(mac, "br") || !strcmp(mac, "nf") || !strcmp(mac, "fi")) {
		flush(pg);
		if (strcmp(mac, "br"))
			pg->nofill = !strcmp(mac, "nf");
	} else if (!strcmp(mac, "TS")) {
		flush(pg);
		fputc('\n', pg->fp);
		pg->table = 1;
	} else if (!strcmp(mac, "B") || !strcmp(mac, "I") || !strcmp(mac, "SM")) {
		macro_args(&t, args, 0);
		add_text(pg, &t);
	} else if (strlen(mac) == 2 && strchr("BIR", mac[0]) && strchr("BIR", mac[1])) {
		macro_args(&t, args, 1);
		add_text(pg, &t);
	} /* .TH, comments and the rest: nothing to show */
	buf_free(&t);
}

/* Render roff man source as plain text. */
static void render(FILE *fp, const char *text, size_t len)
{
	struct page pg = {.fp = fp};
	struct buf t = {0};
	for (const char *p = text, *end = text + len; p < end;) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
		const char *s = p;
		p += n + (nl != NULL);
		if (pg.table) {
			table_line(&pg, s, n);
			continue;
		}
		if (n && (s[0] == '.' || s[0] == '\'')) {
			char mac[8] = "";
			size_t m = 1;
			while (m < n && s[m] != ' ')
				m++;
			memcpy(mac, s + 1, MIN(m - 1, sizeof(mac) - 1));
			char *args = xmalloc(n - m + 1);
			memcpy(args, s + m, n - m);
			args[n - m] = 0;
			macro(&pg, mac, args);
			free(args);
			continue;
		}
		if (!n && !pg.nofill) { /* a blank line: a paragraph break */
			flush(&pg);
			fputc('\n', fp);
			continue;
		}
		t.len = 0;
		unescape(&t, s, n);
		add_text(&pg, &t);
	}
	if (pg.table) /* no .TE: the rows still show */
		print_table(&pg);
	flush(&pg);
	buf_free(&t);
	buf_free(&pg.para);
	buf_free(&pg.rows);
}

/* man -l on a temporary copy; 0 when man showed it. Ctrl-C belongs to
 * man's pager while it runs (as system(3) would have it): ignored here. */
static int show_with_man(const struct builtin_doc *page)
{
	char path[] = "/tmp/asyncpp-help.XXXXXX";
	int fd = mkstemp(path);
	if (fd < 0)
		return -1;
	staged_add(path, 0);
	int ok = write(fd, page->data, page->len) == (ssize_t)page->len;
	close(fd);
	int rc = -1;
	pid_t pid = ok ? fork() : -1;
	if (pid == 0) { /* (handlers reset by exec; ignored only after the fork) */
		staged_children_default();
		execlp("man", "man", "-l", path, (char *)NULL);
		_exit(127);
	}
	void (*old_int)(int) = signal(SIGINT, SIG_IGN), (*old_quit)(int) = signal(SIGQUIT, SIG_IGN);
	int status = 0;
	if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
	    WEXITSTATUS(status) == 0)
		rc = 0;
	signal(SIGINT, old_int);
	signal(SIGQUIT, old_quit);
	unlink(path);
	staged_drop(path);
	/* the user stopped man: so are we (not a reason to print the page) */
	if (pid > 0 && WIFSIGNALED(status) &&
	    (WTERMSIG(status) == SIGINT || WTERMSIG(status) == SIGQUIT))
		raise(WTERMSIG(status));
	return rc;
}

int cmd_help_topic(const char *topic)
{
	const struct builtin_doc *page = find_page(topic);
	if (!page) {
		fprintf(stderr, "asyncpp: no manual page for '%s'; topics are the commands and",
			topic);
		for (int i = 0; i < builtin_manpages_count; i++) {
			const char *name = builtin_manpages[i].name;
			if (name[strlen(name) - 1] != '1')
				fprintf(stderr, " %.*s", (int)(strlen(name) - 2), name);
		}
		fprintf(stderr, "\n");
		return EXIT_USAGE;
	}
	fflush(stdout);
	if (isatty(STDOUT_FILENO) && !show_with_man(page))
		return EXIT_OK;
	render(stdout, (const char *)page->data, page->len);
	return EXIT_OK;
}
