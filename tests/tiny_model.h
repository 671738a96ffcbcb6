/* tests/tiny_model.h - the tiny model, configuration and token stream the
 * training tests share (test_equivalence, test_data_parallel, test_lanes):
 * 4 layers of width 32, 4 heads (llama: 2 key/value heads), 16 tokens of
 * context, micro-batches of 2 sequences and 4 of them a step, 20 steps of
 * warm-up 3, over a 67-token vocabulary. Header-only (each test file is
 * its own program). */
#ifndef ASYNCPP_TESTS_TINY_MODEL_H
#define ASYNCPP_TESTS_TINY_MODEL_H

#include <stdint.h>
#include <string.h>

#include "../io/config/config.h"
#include "../io/util.h"
#include "../model/model.h"

#define TINY_VOCAB 67

/* The tiny model for arch gpt2, llama or moe (llama whose feed-forwards
 * are mixtures of 4 experts of width 16, top-2, with a shared expert and
 * auxiliary losses large enough to matter), trained by optim. Not
 * finished: callers set their keys, then config_finish. */
static inline void tiny_config(struct config *cfg, const char *arch, const char *optim)
{
	config_defaults(cfg);
	if (!strcmp(arch, "moe")) {
		arch = "llama";
		config_set_key(cfg, "model", "n_expert", "4", "test");
		config_set_key(cfg, "model", "top_k", "2", "test");
		config_set_key(cfg, "model", "d_expert", "16", "test");
		config_set_key(cfg, "model", "shared_expert", "1", "test");
		config_set_key(cfg, "model", "aux_loss_coef", "0.1", "test");
		config_set_key(cfg, "model", "z_loss_coef", "0.01", "test");
	}
	config_set_key(cfg, "model", "arch", arch, "test");
	config_set_key(cfg, "model", "n_layer", "4", "test");
	config_set_key(cfg, "model", "d_model", "32", "test");
	config_set_key(cfg, "model", "n_head", "4", "test");
	config_set_key(cfg, "model", "n_kv_head", strcmp(arch, "gpt2") ? "2" : "4", "test");
	config_set_key(cfg, "model", "seq_len", "16", "test");
	config_set_key(cfg, "train", "batch_size", "2", "test");
	config_set_key(cfg, "train", "steps", "20", "test");
	config_set_key(cfg, "optim", "name", optim, "test");
	config_set_key(cfg, "optim", "warmup", "3", "test");
	config_set_key(cfg, "pipeline", "micro_batches", "4", "test");
}

/* A learnable stream: mostly the cycle i*7 mod TINY_VOCAB, one token in
 * four (about) random. */
static inline void tiny_tokens(uint32_t *tok, size_t n)
{
	uint64_t s = 99;
	for (size_t i = 0; i < n; i++)
		tok[i] = (rng_next(&s) % 4 == 0) ? (uint32_t)(rng_next(&s) % TINY_VOCAB)
						 : (uint32_t)((i * 7) % TINY_VOCAB);
}

/* cfg's model over TINY_VOCAB, as train builds it. */
static inline int tiny_model(struct model *m, const struct config *cfg)
{
	struct model_config mc;
	return model_config_from(&mc, cfg, TINY_VOCAB) || model_init(m, &mc) ? -1 : 0;
}

#endif
