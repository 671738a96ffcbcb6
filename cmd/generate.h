/* generate.h - text from a one-stage model: what `asyncpp sample` prints
 * and what training's sample.every logs. */
#ifndef ASYNCPP_GENERATE_H
#define ASYNCPP_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "../io/text/tokenizer.h"
#include "../model/model.h"

struct gen_opts {
	long max_tokens;    /* at most this many new tokens (fewer at <|endoftext|>) */
	double temperature; /* 0: greedy */
	long top_k;         /* 0: all */
	double top_p;       /* 0 or 1: off */
	uint64_t seed;
};

/* Continue prompt with the whole model as one stage st (batch 1 or more;
 * row 0 is used) whose arena params lies on st's backend. Each new token's
 * text goes to emit as soon as it is drawn. Deterministic for a seed. */
void generate(struct stage *st, const float *params, const struct tokenizer *tok,
	      const char *prompt, const struct gen_opts *o,
	      void (*emit)(const void *text, size_t len, void *ctx), void *ctx);

#endif
