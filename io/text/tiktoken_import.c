/* tiktoken_import.c - a tiktoken rank file (.tiktoken) as a tokenizer.
 *
 * tiktoken's BPE merges, at each step, the adjacent pair whose concatenation
 * has the lowest rank. A merges list gives the same ids when every token is
 * the result of exactly one merge and that merge is the pair tiktoken's BPE
 * reaches on the token's own bytes with the ranks below the token's: that
 * pair is what we record (as Hugging Face's tiktoken converter does). A file
 * where that BPE does not rebuild some token (Llama 3's) gets a merge for
 * every split of every token into two tokens and TOK_IGNORE_MERGES, as
 * Hugging Face's converter writes it; a token with no such split is refused.
 * tests/scripts/tokenizer_tiktoken.sh checks the ids against tiktoken's.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "pretok.h"
#include "tokenizer.h"

#define NONE UINT32_MAX
#define TIKTOKEN_MAX_TOKEN 1024 /* bytes; 8 times the longest of the published files */

struct entry {
	uint32_t rank;
	size_t off, len; /* the token's bytes in the decoded buffer */
	size_t line;
};

/* bytes -> rank, open addressing over the entries */
struct rank_map {
	uint32_t *slot; /* entry index, NONE: empty */
	size_t mask;
	const struct entry *e;
	const unsigned char *bytes;
};

static uint64_t bytes_hash(const unsigned char *p, size_t n)
{
	return fnv1a64(FNV1A64_INIT, p, n) * 0x9E3779B97F4A7C15ULL;
}

/* The entry with bytes p[0..n), or NONE. */
static uint32_t map_find(const struct rank_map *m, const unsigned char *p, size_t n)
{
	for (size_t i = bytes_hash(p, n) & m->mask;; i = (i + 1) & m->mask) {
		uint32_t k = m->slot[i];
		if (k == NONE)
			return NONE;
		if (m->e[k].len == n && !memcmp(m->bytes + m->e[k].off, p, n))
			return k;
	}
}

/* Insert entry k; returns the entry that has its bytes already, or NONE. */
static uint32_t map_add(struct rank_map *m, uint32_t k)
{
	const unsigned char *p = m->bytes + m->e[k].off;
	size_t n = m->e[k].len, i;
	for (i = bytes_hash(p, n) & m->mask; m->slot[i] != NONE; i = (i + 1) & m->mask) {
		uint32_t o = m->slot[i];
		if (m->e[o].len == n && !memcmp(m->bytes + m->e[o].off, p, n))
			return o;
	}
	m->slot[i] = k;
	return NONE;
}

static int b64_value(unsigned char c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == '+')
		return 62;
	if (c == '/')
		return 63;
	return -1;
}

/* Decode standard base64 s[0..n) (padded, n a multiple of 4) onto out;
 * -1 when it is not. */
static int b64_decode(const unsigned char *s, size_t n, struct buf *out)
{
	if (!n || n % 4)
		return -1;
	for (size_t i = 0; i < n; i += 4) {
		int v[4], pad = 0;
		for (int k = 0; k < 4; k++) {
			if (s[i + k] == '=' && i + 4 == n && k >= 2) {
				v[k] = 0;
				pad++;
				continue;
			}
			if (pad || (v[k] = b64_value(s[i + k])) < 0)
				return -1;
		}
		unsigned w = (unsigned)v[0] << 18 | (unsigned)v[1] << 12 | (unsigned)v[2] << 6 |
			     (unsigned)v[3];
		unsigned char b[3] = {(unsigned char)(w >> 16), (unsigned char)(w >> 8),
				      (unsigned char)w};
		buf_append(out, b, 3 - (size_t)pad);
	}
	return 0;
}

/* Parse the lines of data into *es (*n entries) and their bytes into dec.
 * Empty lines are skipped, as tiktoken does. */
static int parse_lines(const unsigned char *data, size_t len, const char *name,
		       struct entry **es, size_t *n, struct buf *dec)
{
	size_t cap = 0, line = 0;
	*es = NULL;
	*n = 0;
	for (size_t at = 0; at < len;) {
		const unsigned char *s = data + at, *nl = memchr(s, '\n', len - at);
		size_t l = nl ? (size_t)(nl - s) : len - at;
		at += l + (nl != NULL);
		line++;
		if (l && s[l - 1] == '\r')
			l--;
		if (!l)
			continue;
		const unsigned char *sp = memchr(s, ' ', l);
		if (!sp)
			return error("%s:%zu: expected 'BASE64 RANK' (no space)", name, line);
		size_t bl = (size_t)(sp - s), off = dec->len;
		if (b64_decode(s, bl, dec))
			return error("%s:%zu: the token is not valid base64 ('%.*s')", name, line,
				     bl > 40 ? 40 : (int)bl, (const char *)s);
		/* rebuilding a token's merges costs the square of its length (a
		 * fuzzed 60000-byte token took 38 s) */
		if (dec->len - off > TIKTOKEN_MAX_TOKEN)
			return error("%s:%zu: a token of more than %d bytes (the longest of "
				     "cl100k_base, o200k_base and Llama 3 have 128)", name, line,
				     TIKTOKEN_MAX_TOKEN);
		uint64_t rank = 0;
		size_t i = bl + 1;
		if (i == l)
			return error("%s:%zu: no rank after the token", name, line);
		for (; i < l; i++) {
			if (s[i] < '0' || s[i] > '9')
				return error("%s:%zu: the rank is not a decimal number", name, line);
			rank = rank * 10 + (s[i] - '0');
			if (rank >= TOKENIZER_MAX_VOCAB)
				return error("%s:%zu: rank too large (the limit is %u)", name, line,
					     TOKENIZER_MAX_VOCAB - 1);
		}
		if (*n == TOKENIZER_MAX_VOCAB)
			return error("%s:%zu: more than %u tokens", name, line, TOKENIZER_MAX_VOCAB);
		if (*n == cap) {
			cap = cap ? 2 * cap : 1024;
			*es = xrealloc(*es, st_mult(cap, sizeof(**es)));
		}
		(*es)[(*n)++] = (struct entry){(uint32_t)rank, off, dec->len - off, line};
	}
	return 0;
}

/* tiktoken's BPE on token bytes p[0..n) (n >= 2) with ranks below max_rank;
 * when it ends in two parts, their entries in lr[2] and 0, else -1. */
static int split_of(const struct rank_map *m, const uint32_t *rank_of, const unsigned char *p,
		    size_t n, uint32_t max_rank, uint32_t lr[2])
{
	size_t start[256 + 1], np = n;
	size_t *st = n <= 256 ? start : xmalloc(st_mult(n + 1, sizeof(*st)));
	for (size_t i = 0; i <= n; i++)
		st[i] = i; /* part i is p[st[i]..st[i+1]) */
	for (;;) {
		uint32_t best = NONE;
		size_t at = 0;
		for (size_t i = 0; i + 1 < np; i++) {
			uint32_t k = map_find(m, p + st[i], st[i + 2] - st[i]);
			uint32_t r = k == NONE ? NONE : rank_of[k];
			if (r < max_rank && (best == NONE || r < best)) {
				best = r;
				at = i;
			}
		}
		if (best == NONE)
			break;
		memmove(st + at + 1, st + at + 2, (np - at - 1) * sizeof(*st));
		np--;
	}
	int rc = -1;
	if (np == 2) {
		lr[0] = map_find(m, p, st[1]);
		lr[1] = map_find(m, p + st[1], n - st[1]);
		rc = 0;
	}
	if (st != start)
		free(st);
	return rc;
}

static int cmp_split(const void *x, const void *y)
{
	const uint32_t *a = x, *b = y;
	return a[0] != b[0] ? (a[0] < b[0] ? -1 : 1) : (a[1] > b[1]) - (a[1] < b[1]);
}

/* tiktoken's BPE exactly, for a rank file where some token is not the merge
 * BPE reaches on its bytes (Llama 3's): a merge for every split of every
 * token into two tokens, ordered by the token made (then by its parts),
 * which merges by the rank of a pair's concatenation as tiktoken
 * does, and TOK_IGNORE_MERGES, which takes a pre-token that is a token
 * whole as tiktoken does. The merges in *merges (reallocated), *nm. */
static int full_merges(const struct rank_map *m, const struct entry *es, const uint32_t *by_rank,
		       const uint32_t *rank_of, uint32_t N, const char *name,
		       uint32_t (**merges)[3], uint32_t *nm)
{
	size_t cap = (size_t)N, n = 0;
	uint32_t(*mg)[3] = xmalloc(st_mult(cap, sizeof(*mg)));
	for (uint32_t r = 0; r < N; r++) {
		const struct entry *e = &es[by_rank[r]];
		const unsigned char *p = m->bytes + e->off;
		size_t before = n;
		for (size_t k = 1; k < e->len; k++) {
			uint32_t a = map_find(m, p, k), b = map_find(m, p + k, e->len - k);
			if (a == NONE || b == NONE)
				continue;
			if (n == TOKENIZER_MAX_VOCAB) {
				free(mg);
				return error("%s: more than %u splits of tokens into two tokens",
					     name, TOKENIZER_MAX_VOCAB);
			}
			if (n == cap) {
				cap *= 2;
				mg = xrealloc(mg, st_mult(cap, sizeof(*mg)));
			}
			mg[n][0] = rank_of[a];
			mg[n][1] = rank_of[b];
			mg[n][2] = r;
			n++;
		}
		/* in the order of the left part's rank, then the right's, as Hugging
		 * Face's converter writes them (so both imports give one file) */
		qsort(mg + before, n - before, sizeof(*mg), cmp_split);
		if (e->len > 1 && n == before) {
			free(mg);
			return error("%s:%zu: the token of rank %u is not the merge of two tokens "
				     "(no split of its bytes is two tokens of the file)", name,
				     e->line, r);
		}
	}
	free(*merges);
	*merges = mg;
	*nm = (uint32_t)n;
	return 0;
}

/* Check the special tokens against the N ranks; *V the vocabulary size. */
static int check_special(const char *name, uint32_t N, uint32_t nspecial,
			 const char *const *names, const uint32_t *ids, uint32_t *V)
{
	*V = N;
	for (uint32_t i = 0; i < nspecial; i++) {
		if (!*names[i])
			return error("%s: special token %u has an empty name", name, ids[i]);
		if (ids[i] < N)
			return error("%s: special token %s has id %u, a rank of the file (ranks run "
				     "0..%u): give it an id of %u or more", name, names[i], ids[i],
				     N - 1, N);
		if (ids[i] >= TOKENIZER_MAX_VOCAB)
			return error("%s: special token %s: id %u is over the limit %u", name,
				     names[i], ids[i], TOKENIZER_MAX_VOCAB - 1);
		for (uint32_t j = 0; j < i; j++) {
			if (ids[j] == ids[i])
				return error("%s: special tokens %s and %s both have id %u", name,
					     names[j], names[i], ids[i]);
			if (!strcmp(names[j], names[i]))
				return error("%s: special token %s given twice", name, names[i]);
		}
		if (ids[i] + 1 > *V)
			*V = ids[i] + 1;
	}
	return 0;
}

int tiktoken_import_mem(struct tokenizer **tok, const void *data, size_t len, const char *name,
			uint32_t kind, uint32_t nspecial, const char *const *names,
			const uint32_t *ids)
{
	struct entry *es = NULL;
	struct buf dec = {0}, all = {0};
	struct rank_map m = {0};
	uint32_t *by_rank = NULL, *rank_of = NULL, *lens = NULL, (*merges)[3] = NULL;
	uint32_t *special = NULL;
	size_t n = 0;
	int rc = -1;
	*tok = NULL;
	if (len > TIKTOKEN_MAX_BYTES)
		return error("%s: %zu bytes; a .tiktoken file is at most %zu MiB", name, len,
			     TIKTOKEN_MAX_BYTES >> 20);
	if (parse_lines(data, len, name, &es, &n, &dec))
		goto out;
	if (n < 256) {
		error("%s: %zu tokens; a rank file has at least the 256 bytes", name, n);
		goto out;
	}
	uint32_t N = (uint32_t)n; /* at most TOKENIZER_MAX_VOCAB */
	by_rank = xmalloc(st_mult(N, sizeof(*by_rank)));
	rank_of = xmalloc(st_mult(N, sizeof(*rank_of)));
	memset(by_rank, 0xff, (size_t)N * sizeof(*by_rank));
	for (uint32_t k = 0; k < N; k++) {
		rank_of[k] = es[k].rank;
		if (es[k].rank < N && by_rank[es[k].rank] != NONE) {
			error("%s:%zu: rank %u repeats line %zu's", name, es[k].line, es[k].rank,
			      es[by_rank[es[k].rank]].line);
			goto out;
		}
		if (es[k].rank < N)
			by_rank[es[k].rank] = k;
	}
	for (uint32_t r = 0; r < N; r++)
		if (by_rank[r] == NONE) { /* then some rank is N or more */
			for (uint32_t k = 0; k < N; k++)
				if (es[k].rank >= N) {
					error("%s:%zu: rank %u, but rank %u is missing: the %u ranks "
					      "of a file run 0..%u without gaps", name, es[k].line,
					      es[k].rank, r, N, N - 1);
					break;
				}
			goto out;
		}
	size_t cap = 4;
	while (cap < 2 * (size_t)N)
		cap *= 2;
	m = (struct rank_map){xmalloc(st_mult(cap, sizeof(*m.slot))), cap - 1, es, dec.data};
	memset(m.slot, 0xff, cap * sizeof(*m.slot));
	for (uint32_t k = 0; k < N; k++) {
		uint32_t o = map_add(&m, k);
		if (o != NONE) {
			error("%s:%zu: the token of rank %u repeats line %zu's (rank %u)", name,
			      es[k].line, es[k].rank, es[o].line, es[o].rank);
			goto out;
		}
	}
	for (int b = 0; b < 256; b++) {
		unsigned char c = (unsigned char)b;
		if (map_find(&m, &c, 1) == NONE) {
			error("%s: no token for the byte 0x%02x (a rank file has all 256)", name, b);
			goto out;
		}
	}
	uint32_t V;
	if (check_special(name, N, nspecial, names, ids, &V))
		goto out;
	/* tokens in id order: the ranks, then the special tokens and fillers */
	lens = xmalloc(st_mult(V, sizeof(*lens)));
	merges = xmalloc(st_mult(N - 256 + 1, sizeof(*merges)));
	special = xmalloc(st_mult(V - N + 1, sizeof(*special)));
	uint32_t nm = 0;
	int full = 0;
	for (uint32_t r = 0; r < N; r++) {
		const struct entry *e = &es[by_rank[r]];
		const unsigned char *p = dec.data + e->off;
		buf_append(&all, p, e->len);
		lens[r] = (uint32_t)e->len;
		if (e->len == 1)
			continue;
		uint32_t lr[2];
		if (!full && split_of(&m, rank_of, p, e->len, r, lr))
			full = 1; /* from here on, every split */
		if (!full) {
			merges[nm][0] = rank_of[lr[0]];
			merges[nm][1] = rank_of[lr[1]];
			merges[nm][2] = r;
			nm++;
		}
	}
	if (full && full_merges(&m, es, by_rank, rank_of, N, name, &merges, &nm))
		goto out;
	uint32_t eot = TOKENIZER_NO_ID;
	for (uint32_t id = N; id < V; id++) {
		const char *s = NULL;
		char filler[32];
		for (uint32_t i = 0; i < nspecial; i++)
			if (ids[i] == id)
				s = names[i];
		if (!s) {
			snprintf(filler, sizeof(filler), "<|unused_%u|>", id);
			s = filler;
		} else if (!strcmp(s, TOKENIZER_EOT)) {
			eot = id;
		} else if (!strcmp(s, TOKENIZER_EOT_LLAMA3) && eot == TOKENIZER_NO_ID) {
			eot = id; /* Llama 3's, unless <|endoftext|> comes later */
		}
		size_t sl = strlen(s);
		if (sl > UINT32_MAX)
			sl = UINT32_MAX;
		buf_append(&all, s, sl);
		lens[id] = (uint32_t)sl;
		special[id - N] = id;
	}
	if (tokenizer_build_flags(tok, V, lens, all.data, nm, (const uint32_t(*)[3])merges, V - N,
				 special, eot, full ? TOK_IGNORE_MERGES : 0) ||
	    tokenizer_set_pretok(*tok, kind)) {
		tokenizer_free(*tok);
		*tok = NULL;
		goto out;
	}
	rc = 0;
out:
	free(es);
	free(m.slot);
	free(by_rank);
	free(rank_of);
	free(lens);
	free(merges);
	free(special);
	buf_free(&dec);
	buf_free(&all);
	return rc;
}

/* The published encodings: tiktoken's openai_public.py. */
static const char *const cl100k_names[] = {
	"<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|endofprompt|>",
};
static const uint32_t cl100k_ids[] = {100257, 100258, 100259, 100260, 100276};
static const char *const o200k_names[] = {"<|endoftext|>", "<|endofprompt|>"};
static const uint32_t o200k_ids[] = {199999, 200018};

uint32_t tiktoken_published(uint32_t kind, const char *const **names, const uint32_t **ids)
{
	switch (kind) {
	case PRETOK_CL100K:
		*names = cl100k_names;
		*ids = cl100k_ids;
		return 5;
	case PRETOK_O200K:
		*names = o200k_names;
		*ids = o200k_ids;
		return 2;
	default:
		*names = NULL;
		*ids = NULL;
		return 0;
	}
}

/* Llama 3's: its tokenizer.json's added tokens (and Meta's tokenizer.py) */
void tiktoken_llama3_special(uint32_t i, char *name, size_t cap)
{
	static const char *const named[] = {
		[0] = "begin_of_text", [1] = "end_of_text", [6] = "start_header_id",
		[7] = "end_header_id", [9] = "eot_id",
	};
	if (i < ARRAY_SIZE(named) && named[i])
		snprintf(name, cap, "<|%s|>", named[i]);
	else /* reserved 0-3 at 2-5, 4 at 8, then 5 on at 10 */
		snprintf(name, cap, "<|reserved_special_token_%u|>",
			 i < 6 ? i - 2 : i < 9 ? 4 : i - 5);
}

uint32_t tiktoken_published_ranks(uint32_t kind)
{
	return kind == PRETOK_CL100K ? 100256 : kind == PRETOK_O200K ? 199998 : 0;
}

int tiktoken_read(const char *path, struct buf *out)
{
	struct stat sb;
	if (strcmp(path, "-") && stat(path, &sb) == 0 && (uint64_t)sb.st_size > TIKTOKEN_MAX_BYTES)
		return error("%s: %" PRIu64 " bytes; a .tiktoken file is at most %zu MiB", path,
			     (uint64_t)sb.st_size, TIKTOKEN_MAX_BYTES >> 20);
	return read_file(path, out);
}

uint32_t tiktoken_count_ranks(const void *data, size_t len)
{
	const unsigned char *p = data;
	uint32_t n = 0;
	for (size_t i = 0; i < len;) { /* lines with more than "\r" */
		const unsigned char *nl = memchr(p + i, '\n', len - i);
		size_t l = nl ? (size_t)(nl - (p + i)) : len - i;
		n += l > 1 || (l == 1 && p[i] != '\r');
		i += l + 1;
	}
	return n;
}

int tiktoken_import(struct tokenizer **tok, const char *path, uint32_t kind, uint32_t nspecial,
		    const char *const *names, const uint32_t *ids)
{
	*tok = NULL;
	struct buf b = {0};
	if (tiktoken_read(path, &b))
		return -1;
	int rc = tiktoken_import_mem(tok, b.data, b.len, path, kind, nspecial, names, ids);
	buf_free(&b);
	return rc;
}
