/* bpe_train.c - a fast byte-level BPE trainer.
 *
 * 1. Pre-tokenize the text (io/text/pretok.h) and count unique pieces ("words").
 * 2. Count adjacent pairs over the words, weighted by word count; keep for
 *    each pair the list of words that contain it.
 * 3. Repeatedly take the most frequent pair from a max-heap with lazy
 *    deletion (an entry is checked against the pair's live count when it is
 *    popped), merge it in the words on its list only, and adjust the counts
 *    of the neighbouring pairs by the local deltas.
 * Ties go to the smallest (left, right) ids, so training is deterministic.
 */
#include <stdlib.h>
#include <string.h>

#include "pretok.h"
#include "tokenizer.h"

#define MAX_WORD 1024 /* longer pieces (rare runs) are not used for training */

/* ---- counting words ---- */

struct wslot {
	uint64_t hash; /* 0: empty */
	uint64_t count;
	uint32_t off, len;
};

struct bpe_counter {
	struct wslot *slots;
	size_t mask, used;
	struct buf bytes;
};

struct bpe_counter *bpe_counter_new(void)
{
	struct bpe_counter *c = xcalloc(1, sizeof(*c));
	c->mask = (1 << 16) - 1;
	c->slots = xcalloc(c->mask + 1, sizeof(*c->slots));
	return c;
}

void bpe_counter_free(struct bpe_counter *c)
{
	if (!c)
		return;
	free(c->slots);
	buf_free(&c->bytes);
	free(c);
}

static uint64_t word_hash(const unsigned char *s, size_t n)
{
	uint64_t h = fnv1a64(FNV1A64_INIT, s, n);
	return h ? h : 1;
}

static void counter_grow(struct bpe_counter *c)
{
	size_t nmask = c->mask * 2 + 1;
	struct wslot *ns = xcalloc(nmask + 1, sizeof(*ns));
	for (size_t i = 0; i <= c->mask; i++) {
		if (!c->slots[i].hash)
			continue;
		size_t j = c->slots[i].hash & nmask;
		while (ns[j].hash)
			j = (j + 1) & nmask;
		ns[j] = c->slots[i];
	}
	free(c->slots);
	c->slots = ns;
	c->mask = nmask;
}

void bpe_counter_add(struct bpe_counter *c, const void *text, size_t len)
{
	const unsigned char *s = text;
	size_t pos = 0;
	while (pos < len) {
		size_t l = pretok_next(s + pos, len - pos);
		const unsigned char *w = s + pos;
		pos += l;
		if (l > MAX_WORD)
			continue;
		uint64_t h = word_hash(w, l);
		size_t i = h & c->mask;
		for (;; i = (i + 1) & c->mask) {
			struct wslot *sl = &c->slots[i];
			if (!sl->hash) {
				if (c->bytes.len + l > UINT32_MAX)
					return; /* 4 GB of distinct words: enough to train on */
				sl->hash = h;
				sl->count = 1;
				sl->off = (uint32_t)c->bytes.len;
				sl->len = (uint32_t)l;
				buf_append(&c->bytes, w, l);
				if (++c->used * 2 > c->mask)
					counter_grow(c);
				break;
			}
			if (sl->hash == h && sl->len == l && !memcmp(c->bytes.data + sl->off, w, l)) {
				sl->count++;
				break;
			}
		}
	}
}

/* ---- pairs ---- */

struct pair {
	uint32_t a, b;
	int64_t count;
	uint32_t *words, nwords, cap;
};

struct hent {
	int64_t count;
	uint32_t a, b, pid;
};

struct trainer {
	struct pair *pairs;
	size_t npairs, pcap;
	uint64_t *pkey; /* open addressing (a << 32 | b) + 1, 0 empty */
	uint32_t *pval;
	size_t pmask, pused;
	struct hent *heap;
	size_t nheap, hcap;
};

static inline int hent_before(const struct hent *x, const struct hent *y)
{
	if (x->count != y->count)
		return x->count > y->count;
	if (x->a != y->a)
		return x->a < y->a;
	return x->b < y->b;
}

static void hpush(struct trainer *t, struct hent e)
{
	if (t->nheap == t->hcap) {
		t->hcap = t->hcap ? 2 * t->hcap : 1024;
		t->heap = xrealloc(t->heap, st_mult(t->hcap, sizeof(*t->heap)));
	}
	size_t i = t->nheap++;
	while (i && hent_before(&e, &t->heap[(i - 1) / 2])) {
		t->heap[i] = t->heap[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	t->heap[i] = e;
}

static struct hent hpop(struct trainer *t)
{
	struct hent top = t->heap[0], e = t->heap[--t->nheap];
	size_t i = 0, n = t->nheap;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= n)
			break;
		if (c + 1 < n && hent_before(&t->heap[c + 1], &t->heap[c]))
			c++;
		if (!hent_before(&t->heap[c], &e))
			break;
		t->heap[i] = t->heap[c];
		i = c;
	}
	if (n)
		t->heap[i] = e;
	return top;
}

static inline size_t pkey_slot(uint64_t key, size_t mask)
{
	return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 20) & mask;
}

static void pmap_grow(struct trainer *t)
{
	size_t nmask = t->pmask ? t->pmask * 2 + 1 : (1 << 16) - 1;
	uint64_t *nk = xcalloc(nmask + 1, sizeof(*nk));
	uint32_t *nv = xmalloc(st_mult(nmask + 1, sizeof(*nv)));
	for (size_t i = 0; t->pkey && i <= t->pmask; i++) {
		if (!t->pkey[i])
			continue;
		size_t j = pkey_slot(t->pkey[i], nmask);
		while (nk[j])
			j = (j + 1) & nmask;
		nk[j] = t->pkey[i];
		nv[j] = t->pval[i];
	}
	free(t->pkey);
	free(t->pval);
	t->pkey = nk;
	t->pval = nv;
	t->pmask = nmask;
}

static uint32_t pair_id(struct trainer *t, uint32_t a, uint32_t b)
{
	if ((t->pused + 1) * 2 > t->pmask)
		pmap_grow(t);
	uint64_t key = ((uint64_t)a << 32 | b) + 1;
	size_t i = pkey_slot(key, t->pmask);
	for (; t->pkey[i]; i = (i + 1) & t->pmask)
		if (t->pkey[i] == key)
			return t->pval[i];
	if (t->npairs == t->pcap) {
		t->pcap = t->pcap ? 2 * t->pcap : 4096;
		t->pairs = xrealloc(t->pairs, st_mult(t->pcap, sizeof(*t->pairs)));
	}
	uint32_t pid = (uint32_t)t->npairs++;
	t->pairs[pid] = (struct pair){.a = a, .b = b};
	t->pkey[i] = key;
	t->pval[i] = pid;
	t->pused++;
	return pid;
}

/* count += delta for pair (a, b) in word w. */
static void pair_add(struct trainer *t, uint32_t a, uint32_t b, int64_t delta, uint32_t w)
{
	uint32_t pid = pair_id(t, a, b);
	struct pair *p = &t->pairs[pid];
	p->count += delta;
	if (delta > 0) {
		if (!p->nwords || p->words[p->nwords - 1] != w) {
			if (p->nwords == p->cap) {
				p->cap = p->cap ? 2 * p->cap : 4;
				p->words = xrealloc(p->words, st_mult(p->cap, sizeof(*p->words)));
			}
			p->words[p->nwords++] = w;
		}
		hpush(t, (struct hent){p->count, a, b, pid});
	}
}

int bpe_train(struct tokenizer **tok, struct bpe_counter *c, const struct bpe_train_opts *o)
{
	*tok = NULL;
	if (o->vocab_size < 257 || o->vocab_size > TOKENIZER_MAX_VOCAB)
		return error("vocabulary size %u out of range (257..%u)", o->vocab_size,
			     TOKENIZER_MAX_VOCAB);
	uint32_t want_merges = o->vocab_size - 257;

	/* words: symbol arrays, counts */
	size_t nw = c->used;
	uint32_t *woff = xmalloc(st_mult(nw ? nw : 1, sizeof(*woff)));
	uint32_t *wlen = xmalloc(st_mult(nw ? nw : 1, sizeof(*wlen)));
	uint64_t *wcount = xmalloc(st_mult(nw ? nw : 1, sizeof(*wcount)));
	uint32_t *sym = xmalloc(st_mult(c->bytes.len ? c->bytes.len : 1, sizeof(*sym)));
	size_t k = 0;
	/* slot order depends only on the words seen, so this is deterministic */
	for (size_t i = 0; i <= c->mask; i++) {
		struct wslot *sl = &c->slots[i];
		if (!sl->hash)
			continue;
		woff[k] = sl->off;
		wlen[k] = sl->len;
		wcount[k] = sl->count;
		for (uint32_t j = 0; j < sl->len; j++)
			sym[sl->off + j] = c->bytes.data[sl->off + j];
		k++;
	}

	struct trainer t = {0};
	pmap_grow(&t);
	for (uint32_t w = 0; w < nw; w++) {
		uint32_t *s = sym + woff[w];
		for (uint32_t j = 0; j + 1 < wlen[w]; j++) {
			uint32_t pid = pair_id(&t, s[j], s[j + 1]);
			struct pair *p = &t.pairs[pid];
			p->count += (int64_t)wcount[w];
			if (!p->nwords || p->words[p->nwords - 1] != w) {
				if (p->nwords == p->cap) {
					p->cap = p->cap ? 2 * p->cap : 4;
					p->words = xrealloc(p->words, st_mult(p->cap, sizeof(*p->words)));
				}
				p->words[p->nwords++] = w;
			}
		}
	}
	for (size_t pid = 0; pid < t.npairs; pid++)
		hpush(&t, (struct hent){t.pairs[pid].count, t.pairs[pid].a, t.pairs[pid].b,
					(uint32_t)pid});

	/* tokens: 256 bytes, then merges, then <|endoftext|> */
	uint32_t vmax = o->vocab_size;
	uint32_t *lens = xmalloc(st_mult(vmax, sizeof(*lens)));
	uint64_t *toff = xmalloc(st_mult(vmax + 1, sizeof(*toff)));
	uint32_t (*merges)[3] = xmalloc(st_mult(want_merges ? want_merges : 1, sizeof(*merges)));
	struct buf tb = {0};
	for (int b = 0; b < 256; b++) {
		unsigned char ch = (unsigned char)b;
		lens[b] = 1;
		toff[b] = b;
		buf_append(&tb, &ch, 1);
	}
	uint32_t *stamp = xcalloc(nw ? nw : 1, sizeof(*stamp));
	uint32_t m = 0;
	double t0 = now_sec();
	while (m < want_merges && t.nheap) {
		struct hent e = hpop(&t);
		struct pair *p = &t.pairs[e.pid];
		if (p->count != e.count) {
			if (p->count > 0 && p->count < e.count)
				hpush(&t, (struct hent){p->count, p->a, p->b, e.pid});
			continue;
		}
		if (p->count <= 0)
			continue;
		uint32_t a = p->a, b = p->b, cid = 256 + m;
		merges[m][0] = a;
		merges[m][1] = b;
		merges[m][2] = cid;
		lens[cid] = lens[a] + lens[b];
		toff[cid] = tb.len;
		buf_reserve(&tb, lens[cid]);
		buf_append(&tb, tb.data + toff[a], lens[a]);
		buf_append(&tb, tb.data + toff[b], lens[b]);
		m++;
		/* the pair's own list gets no appends below: every pair touched
		 * involves the new id cid, or is (a, b) with a negative delta */
		uint32_t *list = p->words, nlist = p->nwords;
		uint32_t pid = e.pid;
		for (uint32_t li = 0; li < nlist; li++) {
			uint32_t w = list[li];
			if (stamp[w] == m)
				continue;
			stamp[w] = m;
			uint32_t *s = sym + woff[w], n = wlen[w], out = 0;
			int64_t cnt = (int64_t)wcount[w];
			for (uint32_t i = 0; i < n;) {
				if (i + 1 < n && s[i] == a && s[i + 1] == b) {
					if (out) {
						pair_add(&t, s[out - 1], a, -cnt, w);
						pair_add(&t, s[out - 1], cid, cnt, w);
					}
					if (i + 2 < n) {
						pair_add(&t, b, s[i + 2], -cnt, w);
						pair_add(&t, cid, s[i + 2], cnt, w);
					}
					t.pairs[pid].count -= cnt;
					s[out++] = cid;
					i += 2;
				} else {
					s[out++] = s[i++];
				}
			}
			wlen[w] = out;
		}
		p = &t.pairs[pid];
		free(p->words);
		p->words = NULL;
		p->nwords = p->cap = 0;
		if (o->verbose && (m % 500 == 0 || m == want_merges))
			fprintf(stderr, "\rmerges: %u/%u  %.1f s", m, want_merges, now_sec() - t0);
	}
	if (o->verbose)
		fputc('\n', stderr);

	/* <|endoftext|> */
	uint32_t eot = 256 + m;
	lens[eot] = (uint32_t)strlen(TOKENIZER_EOT);
	toff[eot] = tb.len;
	buf_append(&tb, TOKENIZER_EOT, lens[eot]);
	int rc = tokenizer_build(tok, eot + 1, lens, tb.data, m, (const uint32_t(*)[3])merges, 1,
				 &eot, eot);

	for (size_t i = 0; i < t.npairs; i++)
		free(t.pairs[i].words);
	free(t.pairs);
	free(t.pkey);
	free(t.pval);
	free(t.heap);
	free(stamp);
	free(lens);
	free(toff);
	free(merges);
	buf_free(&tb);
	free(woff);
	free(wlen);
	free(wcount);
	free(sym);
	return rc;
}
