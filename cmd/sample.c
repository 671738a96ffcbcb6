/* sample.c - `asyncpp sample CKPT --prompt TEXT`: generate text. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/tokenizer.h"
#include "../io/util.h"
#include "cmd.h"
#include "model_load.h"
#include "opts.h"

static const char *const usage[] = {
	"asyncpp sample [--prompt TEXT] [-n N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--tokenizer FILE] [--device DEV] CKPT",
	NULL,
};

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

int cmd_sample(int argc, char **argv)
{
	const char *prompt = "", *tok_path = NULL, *device = NULL;
	long max_tokens = 200, top_k = 0, seed = 1;
	double temperature = 0.8, top_p = 0.95;
	const struct option options[] = {
		OPT_STRING('p', "prompt", &prompt, "TEXT", "text to continue (default: empty: start after <|endoftext|>)"),
		OPT_INT('n', "max-tokens", &max_tokens, "N", "tokens to generate (default 200)"),
		OPT_DOUBLE('t', "temperature", &temperature, "T", "softmax temperature; 0 is greedy (default 0.8)"),
		OPT_INT('k', "top-k", &top_k, "K", "sample among the K most likely tokens; 0 = all (default 0)"),
		OPT_DOUBLE(0, "top-p", &top_p, "P", "nucleus: the smallest set with probability >= P; 0 or 1 turns it off (default 0.95)"),
		OPT_INT(0, "seed", &seed, "S", "random seed (default 1)"),
		OPT_STRING(0, "tokenizer", &tok_path, "FILE", "tokenizer (default: the run's data.tokenizer)"),
		OPT_STRING(0, "device", &device, "DEV", "cpu or cuda (default: the run's train.device)"),
		OPT_END(),
	};
	int npos = opts_parse(argc, argv, usage, options,
			      "Generate text from a checkpoint, continuing a prompt.");
	if (npos != 1)
		opts_usage_error(usage, options, npos ? "too many arguments" : "no checkpoint given");
	if (max_tokens < 0)
		opts_usage_error(usage, options, "-n must be 0 or more, not %ld", max_tokens);
	if (!(temperature >= 0) || !isfinite(temperature))
		opts_usage_error(usage, options, "--temperature must be a finite number >= 0, not %g",
				 temperature);
	if (top_k < 0)
		opts_usage_error(usage, options, "--top-k must be 0 (all) or more, not %ld", top_k);
	if (!(top_p >= 0 && top_p <= 1))
		opts_usage_error(usage, options, "--top-p must be between 0 and 1, not %g", top_p);
	struct loaded_model lm;
	if (loaded_model_open(&lm, argv[0], device, 1))
		return EXIT_FAIL;
	if (!tok_path)
		tok_path = lm.cfg.data_tokenizer;
	if (!tok_path[0]) {
		error("the checkpoint names no tokenizer; give --tokenizer FILE");
		loaded_model_close(&lm);
		return EXIT_FAIL;
	}
	struct tokenizer *tok;
	if (tokenizer_load(&tok, tok_path)) {
		loaded_model_close(&lm);
		return EXIT_FAIL;
	}
	int T = lm.m.cfg.T, V = lm.m.cfg.V, Vp = lm.m.cfg.Vp;
	/* the tokenizer must be the one the model was trained with: the same
	 * identity hash when the checkpoint records it, else the same size */
	uint64_t want_hash = 0;
	if (lm.tokenizer_hash)
		want_hash = lm.tokenizer_hash;
	if (want_hash ? tokenizer_hash(tok) != want_hash : (int)tokenizer_vocab_size(tok) != V) {
		error("tokenizer '%s' (%u tokens) is not the one this model was trained with (%d "
		      "tokens%s); give the run's tokenizer with --tokenizer FILE", tok_path,
		      tokenizer_vocab_size(tok), V, want_hash ? ", another vocabulary" : "");
		tokenizer_free(tok);
		loaded_model_close(&lm);
		return EXIT_FAIL;
	}
	/* the ids buffer holds the prompt, then a sliding window of the last T
	 * tokens: its size never depends on -n */
	size_t plen = strlen(prompt);
	size_t cap = st_add(plen + 2, (size_t)T);
	uint32_t *ids = xmalloc(st_mult(cap, sizeof(uint32_t)));
	size_t n = 0;
	uint32_t eot = tokenizer_eot_id(tok);
	if (eot != TOKENIZER_NO_ID)
		ids[n++] = eot; /* documents start after a separator in training */
	n += tokenizer_encode(tok, prompt, plen, ids + n);
	int32_t *window = xcalloc((size_t)T, sizeof(int32_t));
	int32_t *dev_window = lm.be->alloc((size_t)T * sizeof(int32_t));
	float *logits = xmalloc((size_t)Vp * sizeof(float));
	float *dev_logits = lm.be->alloc((size_t)Vp * sizeof(float));
	struct cand *cands = xmalloc((size_t)V * sizeof(*cands));
	uint64_t rng = rng_mix((uint64_t)seed, 0x5a3b1e);
	fwrite(prompt, 1, plen, stdout);
	fflush(stdout);
	struct buf piece = {0};
	for (long g = 0; g < max_tokens; g++) {
		/* the last T tokens are the context; attention is causal, so the
		 * rest of the window does not matter */
		size_t start = n > (size_t)T ? n - (size_t)T : 0;
		int len = (int)(n - start);
		for (int i = 0; i < T; i++)
			window[i] = i < len ? (int32_t)ids[start + (size_t)i] : 0;
		lm.be->to_device(dev_window, window, (size_t)T * sizeof(int32_t));
		model_logits_at(&lm.st, lm.params, dev_window, len - 1, dev_logits);
		lm.be->to_host(logits, dev_logits, (size_t)Vp * sizeof(float));
		int next = pick(logits, V, temperature, top_k, top_p, &rng, cands);
		if ((uint32_t)next == eot)
			break;
		if (n == cap) { /* keep the last T tokens */
			memmove(ids, ids + (n - (size_t)T), (size_t)T * sizeof(uint32_t));
			n = (size_t)T;
		}
		ids[n++] = (uint32_t)next;
		piece.len = 0;
		uint32_t id = (uint32_t)next;
		if (!tokenizer_decode(tok, &id, 1, 0, &piece))
			fwrite(piece.data, 1, piece.len, stdout);
		fflush(stdout);
	}
	putchar('\n');
	buf_free(&piece);
	free(cands);
	free(logits);
	free(window);
	free(ids);
	lm.be->free(dev_window);
	lm.be->free(dev_logits);
	tokenizer_free(tok);
	loaded_model_close(&lm);
	return EXIT_OK;
}
