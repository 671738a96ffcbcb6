/* gpt2_import.c - build a tokenizer from GPT-2's encoder.json and vocab.bpe.
 *
 * encoder.json maps token strings to ids; the strings spell bytes through
 * GPT-2's bytes_to_unicode table (printable Latin-1 bytes stand for
 * themselves, the other 68 bytes for U+0100 upwards, in byte order).
 * vocab.bpe lists the merges in rank order, one "LEFT RIGHT" pair a line
 * after a "#version" line. <|endoftext|> becomes the special end-of-text id.
 */
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "tokenizer.h"

/* codepoint -> byte for the bytes_to_unicode alphabet, -1 elsewhere */
int gpt2_byte_of_cp(uint32_t cp)
{
	static int table[324];
	static int ready;
	if (!ready) {
		int n = 0;
		for (int i = 0; i < 324; i++)
			table[i] = -1;
		for (int b = 0; b < 256; b++) {
			int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
					(b >= 0xAE && b <= 0xFF);
			table[printable ? b : 256 + n++] = b;
		}
		ready = 1;
	}
	return cp < 324 ? table[cp] : -1;
}

uint32_t gpt2_cp_of_byte(unsigned char b)
{
	int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
	if (printable)
		return b;
	uint32_t n = 0; /* non-printable bytes below b */
	for (int i = 0; i < b; i++)
		n += !((i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE);
	return 256 + n;
}

/* ---- a string -> id map over the UTF-8 token names ---- */

struct names {
	struct buf text;     /* names, concatenated */
	uint32_t *off, *len; /* by id */
	uint32_t *slot;      /* id + 1, 0 empty */
	size_t mask;
	uint32_t nids;       /* ids seen: max id + 1 */
	uint32_t cap;
};

static uint64_t name_hash(const void *p, size_t n)
{
	return fnv1a64(FNV1A64_INIT, p, n);
}

static int names_find(const struct names *nm, const void *p, size_t n)
{
	for (size_t i = name_hash(p, n) & nm->mask; nm->slot[i]; i = (i + 1) & nm->mask) {
		uint32_t id = nm->slot[i] - 1;
		if (nm->len[id] == n && !memcmp(nm->text.data + nm->off[id], p, n))
			return (int)id;
	}
	return -1;
}

/* ---- encoder.json: {"token": id, ...}, ids 0..n-1 each once ---- */

static int read_encoder(const char *path, struct names *nm)
{
	struct json *root;
	if (json_parse_file(&root, path))
		return -1;
	int rc = -1;
	unsigned char *seen = NULL;
	if (root->type != JSON_OBJECT) {
		error("%s:%d: expected an object of token strings to ids", path, root->line);
		goto out;
	}
	size_t count = root->len;
	for (size_t k = 0; k < count; k++) {
		const struct json *v = &root->kids[k];
		if (v->type != JSON_NUMBER || !v->is_int || v->i < 0 ||
		    v->i >= TOKENIZER_MAX_VOCAB) {
			error("%s:%d: expected a token id (0..16777215)", path, v->line);
			goto out;
		}
		if ((uint32_t)v->i + 1 > nm->nids)
			nm->nids = (uint32_t)v->i + 1;
	}
	nm->cap = nm->nids ? nm->nids : 1;
	nm->off = xcalloc(nm->cap, sizeof(*nm->off));
	nm->len = xcalloc(nm->cap, sizeof(*nm->len));
	seen = xcalloc(nm->cap, 1);
	for (size_t k = 0; k < count; k++) {
		const struct json *v = &root->kids[k];
		uint32_t id = (uint32_t)v->i;
		if (seen[id]) {
			error("%s:%d: token id %u listed twice", path, v->line, id);
			goto out;
		}
		seen[id] = 1;
		nm->off[id] = (uint32_t)nm->text.len;
		nm->len[id] = (uint32_t)v->key_len;
		buf_append(&nm->text, v->key, v->key_len);
	}
	if (count != nm->nids) {
		error("%s: token ids are not 0..%u without gaps", path, nm->nids ? nm->nids - 1 : 0);
		goto out;
	}
	nm->mask = 1;
	while (nm->mask < 2 * (size_t)count)
		nm->mask = nm->mask * 2 + 1;
	nm->slot = xcalloc(nm->mask + 1, sizeof(*nm->slot));
	for (uint32_t id = 0; id < nm->nids; id++) {
		const unsigned char *s = nm->text.data + nm->off[id];
		if (names_find(nm, s, nm->len[id]) >= 0) {
			error("%s: token string of id %u listed twice", path, id);
			goto out;
		}
		size_t i = name_hash(s, nm->len[id]) & nm->mask;
		while (nm->slot[i])
			i = (i + 1) & nm->mask;
		nm->slot[i] = id + 1;
	}
	rc = 0;
out:
	free(seen);
	json_free(root);
	return rc;
}

int gpt2_import(struct tokenizer **tok, const char *encoder_json, const char *vocab_bpe)
{
	struct names nm = {0};
	struct buf bpe = {0}, bytes = {0}, cat = {0};
	uint32_t *lens = NULL, (*merges)[3] = NULL, *special = NULL;
	uint32_t nmerges = 0, mcap = 0, nspecial = 0, eot = TOKENIZER_NO_ID;
	int rc = -1;
	*tok = NULL;
	if (read_encoder(encoder_json, &nm) || read_file(vocab_bpe, &bpe))
		goto out;
	uint32_t V = nm.nids;
	lens = xcalloc(V ? V : 1, sizeof(*lens));
	special = xmalloc(st_mult(V ? V : 1, sizeof(*special)));
	/* token bytes */
	for (uint32_t id = 0; id < V; id++) {
		const unsigned char *s = nm.text.data + nm.off[id];
		size_t n = nm.len[id], start = bytes.len;
		if (n == strlen(TOKENIZER_EOT) && !memcmp(s, TOKENIZER_EOT, n)) {
			special[nspecial++] = eot = id;
			buf_append(&bytes, s, n);
			lens[id] = (uint32_t)n;
			continue;
		}
		for (size_t i = 0; i < n;) {
			uint32_t cp = s[i];
			size_t l = 1;
			if (cp >= 0x80) {
				if ((cp & 0xE0) == 0xC0 && i + 1 < n)
					cp = (cp & 0x1F) << 6 | (s[i + 1] & 0x3F), l = 2;
				else
					cp = UINT32_MAX;
			}
			int b = cp == UINT32_MAX ? -1 : gpt2_byte_of_cp(cp);
			if (b < 0) {
				error("%s: token %u is not spelled in GPT-2's byte alphabet",
				      encoder_json, id);
				goto out;
			}
			unsigned char ch = (unsigned char)b;
			buf_append(&bytes, &ch, 1);
			i += l;
		}
		lens[id] = (uint32_t)(bytes.len - start);
	}
	/* merges */
	char *line = (char *)bpe.data, *end = line + bpe.len;
	for (int lineno = 1; line < end; lineno++) {
		char *nl = memchr(line, '\n', (size_t)(end - line));
		char *le = nl ? nl : end;
		size_t len = (size_t)(le - line);
		if (len && line[len - 1] == '\r')
			len--;
		if (!(lineno == 1 && len && line[0] == '#') && len) {
			char *sp = memchr(line, ' ', len);
			if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - line))) {
				error("%s:%d: expected 'LEFT RIGHT'", vocab_bpe, lineno);
				goto out;
			}
			int a = names_find(&nm, line, (size_t)(sp - line));
			int b = names_find(&nm, sp + 1, len - (size_t)(sp + 1 - line));
			cat.len = 0;
			buf_append(&cat, line, (size_t)(sp - line));
			buf_append(&cat, sp + 1, len - (size_t)(sp + 1 - line));
			int c = names_find(&nm, cat.data, cat.len);
			if (a < 0 || b < 0 || c < 0) {
				error("%s:%d: merge of tokens not in %s", vocab_bpe, lineno,
				      encoder_json);
				goto out;
			}
			if (nmerges == mcap) {
				mcap = mcap ? 2 * mcap : 1024;
				merges = xrealloc(merges, st_mult(mcap, sizeof(*merges)));
			}
			merges[nmerges][0] = (uint32_t)a;
			merges[nmerges][1] = (uint32_t)b;
			merges[nmerges][2] = (uint32_t)c;
			nmerges++;
		}
		line = nl ? nl + 1 : end;
	}
	rc = tokenizer_build(tok, V, lens, bytes.data, nmerges, (const uint32_t(*)[3])merges,
			     nspecial, special, eot);
	if (rc)
		error("%s, %s: not a consistent GPT-2 tokenizer", encoder_json, vocab_bpe);
out:
	free(nm.off);
	free(nm.len);
	free(nm.slot);
	buf_free(&nm.text);
	buf_free(&bpe);
	buf_free(&bytes);
	buf_free(&cat);
	free(lens);
	free(merges);
	free(special);
	return rc;
}
