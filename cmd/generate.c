/* generate.c - sampling tokens from a model: temperature, top-k, top-p. */
#include "generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../io/util.h"

struct cand {
	float p;
	int id;
};

static int cmp_cand(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	if (x->p != y->p)
		return x->p < y->p ? 1 : -1;
	return x->id - y->id;
}

/* Draw a token from logits[V]: temperature, then top-k, then top-p. */
static int pick(const float *logits, int V, double temperature, long top_k, double top_p,
		uint64_t *rng, struct cand *c)
{
	if (temperature <= 0) { /* greedy */
		int best = 0;
		for (int i = 1; i < V; i++)
			if (logits[i] > logits[best])
				best = i;
		return best;
	}
	float mx = logits[0];
	for (int i = 1; i < V; i++)
		mx = logits[i] > mx ? logits[i] : mx;
	for (int i = 0; i < V; i++)
		c[i] = (struct cand){expf((float)((logits[i] - mx) / temperature)), i};
	qsort(c, (size_t)V, sizeof(*c), cmp_cand);
	int n = V;
	if (top_k > 0 && top_k < n)
		n = (int)top_k;
	double total = 0;
	for (int i = 0; i < n; i++)
		total += c[i].p;
	if (top_p > 0 && top_p < 1) {
		double acc = 0;
		for (int i = 0; i < n; i++) {
			acc += c[i].p / total;
			if (acc >= top_p) {
				n = i + 1;
				break;
			}
		}
		total = 0;
		for (int i = 0; i < n; i++)
			total += c[i].p;
	}
	double r = rng_uniform(rng) * total, acc = 0;
	for (int i = 0; i < n; i++) {
		acc += c[i].p;
		if (r < acc)
			return c[i].id;
	}
	return c[n - 1].id;
}

void generate(struct stage *st, const float *params, const struct tokenizer *tok,
	      const char *prompt, const struct gen_opts *o,
	      void (*emit)(const void *text, size_t len, void *ctx), void *ctx)
{
	const struct backend *be = st->be;
	int T = st->m->cfg.T, V = st->m->cfg.V, Vp = st->m->cfg.Vp;
	/* the ids buffer holds the prompt, then a sliding window of the last T
	 * tokens: its size never depends on max_tokens */
	size_t plen = strlen(prompt);
	size_t cap = st_add(tokenizer_max_ids(tok, plen) + 2, (size_t)T);
	uint32_t *ids = xmalloc(st_mult(cap, sizeof(uint32_t)));
	size_t n = 0;
	uint32_t eot = tokenizer_eot_id(tok);
	if (eot != TOKENIZER_NO_ID)
		ids[n++] = eot; /* documents start after a separator in training */
	n += tokenizer_encode(tok, prompt, plen, ids + n);
	int32_t *window = xcalloc((size_t)T, sizeof(int32_t));
	int32_t *dev_window = be->alloc((size_t)T * sizeof(int32_t));
	float *logits = xmalloc((size_t)Vp * sizeof(float));
	float *dev_logits = be->alloc((size_t)Vp * sizeof(float));
	struct cand *cands = xmalloc((size_t)V * sizeof(*cands));
	uint64_t rng = rng_mix(o->seed, 0x5a3b1e);
	struct buf piece = {0};
	for (long g = 0; g < o->max_tokens; g++) {
		/* the last T tokens are the context; attention is causal, so the
		 * rest of the window does not matter */
		size_t start = n > (size_t)T ? n - (size_t)T : 0;
		int len = (int)(n - start);
		for (int i = 0; i < T; i++)
			window[i] = i < len ? (int32_t)ids[start + (size_t)i] : 0;
		be->to_device(dev_window, window, (size_t)T * sizeof(int32_t));
		model_logits_at(st, params, dev_window, len - 1, dev_logits);
		be->to_host(logits, dev_logits, (size_t)Vp * sizeof(float));
		int next = pick(logits, V, o->temperature, o->top_k, o->top_p, &rng, cands);
		if ((uint32_t)next == eot)
			break;
		if (n == cap) { /* keep the last T tokens */
			memmove(ids, ids + (n - (size_t)T), (size_t)T * sizeof(uint32_t));
			n = (size_t)T;
		}
		ids[n++] = (uint32_t)next;
		piece.len = 0;
		uint32_t id = (uint32_t)next;
		if (!tokenizer_decode(tok, &id, 1, TOK_DECODE_CONTINUE, &piece)) /* after the prompt */
			emit(piece.data, piece.len, ctx);
	}
	buf_free(&piece);
	free(cands);
	free(logits);
	free(window);
	free(ids);
	be->free(dev_window);
	be->free(dev_logits);
}
