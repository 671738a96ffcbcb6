/* svg.c - SVG writing helpers (see svg.h). */
#include "svg.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void svg_printf(struct buf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n <= 0)
		return;
	buf_reserve(b, (size_t)n + 1);
	va_start(ap, fmt);
	vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

/* Length of the valid UTF-8 sequence starting at s (1..4), or 0. Overlong
 * forms, surrogates and code points above U+10FFFF are invalid. */
static int utf8_len(const unsigned char *s)
{
	unsigned c = s[0];
	int n;
	unsigned cp;
	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf) {
		n = 2;
		cp = c & 0x1f;
	} else if (c >= 0xe0 && c <= 0xef) {
		n = 3;
		cp = c & 0x0f;
	} else if (c >= 0xf0 && c <= 0xf4) {
		n = 4;
		cp = c & 0x07;
	} else {
		return 0;
	}
	for (int i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3f);
	}
	if ((n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
	    (n == 4 && (cp < 0x10000 || cp > 0x10ffff)))
		return 0;
	return n;
}

void svg_text(struct buf *b, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	while (*p) {
		const char *ent = NULL;
		switch (*p) {
		case '&': ent = "&amp;"; break;
		case '<': ent = "&lt;"; break;
		case '>': ent = "&gt;"; break;
		case '"': ent = "&quot;"; break;
		case '\'': ent = "&apos;"; break;
		}
		if (ent) {
			buf_append(b, ent, strlen(ent));
			p++;
			continue;
		}
		if (*p < 0x20 && *p != '\t') {
			buf_append(b, "?", 1);
			p++;
			continue;
		}
		int n = utf8_len(p);
		if (!n) {
			buf_append(b, "?", 1);
			p++;
			continue;
		}
		buf_append(b, p, (size_t)n);
		p += n;
	}
}

int svg_save(const struct buf *b, const char *path)
{
	if (!path || !strcmp(path, "-")) {
		if (b->len && fwrite(b->data, 1, b->len, stdout) != b->len)
			return error("cannot write to standard output: %s", strerror(errno));
		if (fflush(stdout))
			return error("cannot write to standard output: %s", strerror(errno));
		return 0;
	}
	struct atomic_file af;
	if (atomic_open(&af, path))
		return -1;
	if (atomic_write(&af, b->data, b->len)) {
		atomic_abort(&af);
		return -1;
	}
	return atomic_commit(&af);
}
