/* test_tok_fastpath.c - the encoder's fast paths give the plain paths'
 * results: the scanners' eight-bytes-at-a-time ASCII letter run against a
 * byte loop, and the pre-token cache (its word-wise compare, the masked load
 * of a piece's last bytes near the end of the text, its clearing when full)
 * against encoding without it, for every pre-tokenizer kind. */
#include <stdlib.h>
#include <string.h>

#include "../../io/text/pretok.h"
#include "../../io/text/tokenizer.h"
#include "../../io/util.h"
#include "../test.h"

/* Bytes at and beside the edges of the ranges ascii_run tests, and the
 * same with the top bit set (0xe1 is 'a' | 0x80). */
static const unsigned char edge_bytes[] = {'a', 'z', 'A', 'Z', 'm', 'Q', '@', '[', '`', '{',
					   '0', ' ', '\n', 0x7f, 0x80, 0xc3, 0xe1, 0xfa,
					   0xc1, 0xda, 0xff, 0xe0, 0xfb};

TEST(ascii_run_matches_a_byte_loop)
{
	uint64_t st = 7;
	unsigned char s[48];
	for (int iter = 0; iter < 3000; iter++) {
		size_t len = 1 + rng_next(&st) % sizeof(s);
		int letters = (int)(rng_next(&st) % 4); /* mostly letters in most buffers */
		for (size_t i = 0; i < len; i++) {
			uint64_t r = rng_next(&st);
			s[i] = (r % 4) < (uint64_t)letters ? (unsigned char)("azAZkq"[r / 4 % 6])
							   : edge_bytes[r / 4 % sizeof(edge_bytes)];
		}
		for (size_t n = 0; n <= len; n++)
			for (size_t i = 0; i <= n; i++) {
				size_t a = i, b = i;
				while (a < n && ((s[a] >= 'a' && s[a] <= 'z') ||
						 (s[a] >= 'A' && s[a] <= 'Z')))
					a++;
				while (b < n && s[b] >= 'a' && s[b] <= 'z')
					b++;
				CHECK_MSG(ascii_run(s, i, n, 0x20) == a, "letters %zu..%zu", i, n);
				CHECK_MSG(ascii_run(s, i, n, 0) == b, "lower case %zu..%zu", i, n);
				if (test_failed())
					return;
			}
	}
}

/* A tokenizer of the 256 bytes and merges of the pairs "th", "he", "the",
 * " t", "an", "in": enough to give multi-id and one-id pieces. */
static struct tokenizer *small_tokenizer(void)
{
	static const char *const m[][2] = {{"t", "h"}, {"h", "e"}, {"th", "e"}, {" ", "t"},
					   {"a", "n"}, {"i", "n"}, {" t", "he"}};
	uint32_t lens[256 + 7], merges[7][3];
	unsigned char bytes[256 + 32];
	size_t nb = 0;
	for (int b = 0; b < 256; b++)
		lens[b] = 1, bytes[nb++] = (unsigned char)b;
	for (int r = 0; r < 7; r++) {
		uint32_t ids[2];
		for (int k = 0; k < 2; k++) {
			size_t off = 256, want = strlen(m[r][k]);
			ids[k] = want == 1 ? (unsigned char)m[r][k][0] : UINT32_MAX;
			for (uint32_t id = 256; id < 256 + (uint32_t)r && want > 1; id++) {
				if (lens[id] == want && !memcmp(bytes + off, m[r][k], want))
					ids[k] = id;
				off += lens[id];
			}
		}
		merges[r][0] = ids[0];
		merges[r][1] = ids[1];
		merges[r][2] = 256 + (uint32_t)r;
		lens[256 + r] = (uint32_t)(strlen(m[r][0]) + strlen(m[r][1]));
		memcpy(bytes + nb, m[r][0], strlen(m[r][0]));
		memcpy(bytes + nb + strlen(m[r][0]), m[r][1], strlen(m[r][1]));
		nb += lens[256 + r];
	}
	struct tokenizer *t = NULL;
	if (tokenizer_build(&t, 256 + 7, lens, bytes, 7, (const uint32_t(*)[3])merges, 0, NULL,
			    TOKENIZER_NO_ID))
		return NULL;
	return t;
}

/* Random words (1..40 bytes: letters, digits, the odd non-ASCII letter or
 * invalid byte) with spaces, newlines and punctuation between. */
static size_t random_text(uint64_t *st, unsigned char *p, size_t cap)
{
	static const char *const pieces[] = {"the", "an", "in", "é", "\xff", "7", "'s", " ",
					     "  ", "\n", ".", ", ", "Ω", "th"};
	size_t n = 0;
	while (n + 48 < cap) {
		size_t wl = 1 + rng_next(st) % 40;
		for (size_t i = 0; i < wl; i++) {
			uint64_t r = rng_next(st);
			if (r % 8 == 0) {
				const char *x = pieces[r / 8 % ARRAY_SIZE(pieces)];
				memcpy(p + n, x, strlen(x));
				n += strlen(x);
			} else {
				p[n++] = (unsigned char)("abehintTHE"[r / 8 % 10]);
			}
		}
		p[n++] = rng_next(st) % 5 ? ' ' : '\n';
	}
	return n;
}

TEST(cache_matches_plain_encoding)
{
	struct tokenizer *t = small_tokenizer();
	CHECK(t);
	if (!t)
		return;
	/* about 2 MB of mostly distinct words: the cache fills and is cleared
	 * several times (at 32768 pieces) */
	size_t cap = 2u << 20;
	unsigned char *text = xmalloc(cap);
	uint32_t *a = xmalloc(cap * sizeof(*a)), *b = xmalloc(cap * sizeof(*b));
	uint64_t st = 11;
	size_t n = random_text(&st, text, cap);
	for (uint32_t kind = 0; kind < PRETOK_NKINDS; kind++) {
		/* the regex needs its pattern (tokenizer_split_regex.sh); the
		 * SentencePiece-style kinds their vocabulary (test_spm) */
		if (kind == PRETOK_SPLIT_REGEX || kind == PRETOK_SPM || kind == PRETOK_METASPACE)
			continue;
		CHECK(tokenizer_set_pretok(t, kind) == 0);
		struct tok_cache *c = tok_cache_new(t);
		size_t na = tokenizer_encode(t, text, n, a);
		for (int pass = 0; pass < 2; pass++) { /* misses, then hits */
			size_t nb = tokenizer_encode_cached(t, c, text, n, b);
			CHECK_MSG(na == nb && !memcmp(a, b, na * sizeof(*a)), "kind %u pass %d", kind,
				  pass);
		}
		/* texts that end a few bytes after a piece starts, each in a
		 * buffer of exactly its size (ASan sees a read past it) */
		for (int iter = 0; iter < 400; iter++) {
			size_t off = rng_next(&st) % (n - 64), len = 1 + rng_next(&st) % 64;
			unsigned char *x = xmalloc(len);
			memcpy(x, text + off, len);
			size_t k1 = tokenizer_encode(t, x, len, a);
			size_t k2 = tokenizer_encode_cached(t, c, x, len, b);
			CHECK_MSG(k1 == k2 && !memcmp(a, b, k1 * sizeof(*a)), "kind %u, %zu bytes at %zu",
				  kind, len, off);
			free(x);
		}
		tok_cache_free(c);
	}
	free(text);
	free(a);
	free(b);
	tokenizer_free(t);
}
