/* fuzz_nfc.c - utf8_nfc (io/text/unicode_nfc.c) on any bytes: the result is
 * within UTF8_NFC_MAX, normal (NFC of it is itself), the same when written
 * with a short cap (its first cap bytes), and every byte that is not UTF-8
 * is kept in order. Text the quick check passes is returned unchanged. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/text/pretok.h"
#include "../../io/text/unicode_nfc.h"
#include "../../io/util.h"

/* the bytes of s[0..n) that start no valid UTF-8 sequence, in order */
static size_t bad_bytes(const unsigned char *s, size_t n, unsigned char *out)
{
	size_t k = 0;
	for (size_t i = 0; i < n;) {
		uint32_t cp;
		size_t l = s[i] < 0x80 ? 1 : utf8_decode(s + i, n - i, &cp);
		if (!l)
			out[k++] = s[i], l = 1;
		i += l;
	}
	return k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *in = (const char *)data;
	size_t cap = UTF8_NFC_MAX(size) + 1;
	char *a = xmalloc(cap), *b = xmalloc(cap), *c = xmalloc(cap);
	size_t n = utf8_nfc(in, size, a, cap);
	if (n > UTF8_NFC_MAX(size))
		abort();
	if (utf8_is_nfc_quick(in, size) && (n != size || memcmp(a, in, size)))
		abort();
	if (utf8_nfc(a, n, b, cap) != n || memcmp(a, b, n))
		abort();
	size_t short_cap = n / 2;
	if (utf8_nfc(in, size, c, short_cap) != n || memcmp(a, c, short_cap))
		abort();
	unsigned char *x = xmalloc(size + 1), *y = xmalloc(n + 1);
	size_t kx = bad_bytes(data, size, x), ky = bad_bytes((unsigned char *)a, n, y);
	if (kx != ky || memcmp(x, y, kx))
		abort();
	free(a);
	free(b);
	free(c);
	free(x);
	free(y);
	return 0;
}
