/* sample.c - `asyncpp sample CKPT --prompt TEXT`: generate text. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/text/tokenizer.h"
#include "../io/util.h"
#include "cmd.h"
#include "generate.h"
#include "model_load.h"
#include "opts.h"
#include "run_paths.h"

static const char *const usage[] = {
	"asyncpp sample [--prompt TEXT] [-n N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--tokenizer FILE] [--device DEV] CKPT",
	NULL,
};

static void to_stdout(const void *text, size_t len, void *ctx)
{
	(void)ctx;
	fwrite(text, 1, len, stdout);
	fflush(stdout);
}

int cmd_sample(int argc, char **argv, const char *prog)
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
	const char *given = tok_path;
	if (!tok_path)
		tok_path = lm.cfg.data_tokenizer;
	if (!tok_path[0]) {
		error("the checkpoint names no tokenizer; give --tokenizer FILE");
		loaded_model_close(&lm);
		return EXIT_FAIL;
	}
	if (!given && run_path_check(&lm.cfg, "tokenizer", lm.path,
				     "the tokenizer with --tokenizer FILE")) {
		loaded_model_close(&lm);
		return EXIT_FAIL;
	}
	struct tokenizer *tok;
	if (tokenizer_load(&tok, tok_path)) {
		loaded_model_close(&lm);
		return EXIT_FAIL;
	}
	int V = lm.m.cfg.V;
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
	struct gen_opts go = {.max_tokens = max_tokens, .temperature = temperature,
			      .top_k = top_k, .top_p = top_p, .seed = (uint64_t)seed};
	fputs(prompt, stdout);
	fflush(stdout);
	generate(&lm.st, lm.params, tok, prompt, &go, to_stdout, NULL);
	putchar('\n');
	tokenizer_free(tok);
	loaded_model_close(&lm);
	return EXIT_OK;
}
