/* import_hf.c - `asyncpp import-hf DIR -o OUT.ckpt`: a Hugging Face GPT-2,
 * Llama or Mixtral folder (config.json, safetensors weights, tokenizer.json) as an
 * asyncpp checkpoint (step 0, no optimizer state) and tokenizer file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/formats/checkpoint.h"
#include "../io/config/config.h"
#include "../model/formats/hf_model.h"
#include "../io/text/tokenizer.h"
#include "../io/util.h"
#include "../model/model.h"
#include "cmd.h"
#include "opts.h"
#include "progress.h"
#include "run_common.h"

static const char *const usage[] = {
	"asyncpp import-hf [-o OUT.ckpt] [--tokenizer-out FILE | --no-tokenizer] [--force] [--set SECTION.KEY=VALUE]... DIR",
	NULL,
};

/* OUT.ckpt -> OUT.tok (malloc'ed) */
static char *default_tok_path(const char *out)
{
	size_t n = strlen(out);
	char *p = xmalloc(n + 5);
	memcpy(p, out, n + 1);
	if (n > 5 && !strcmp(p + n - 5, ".ckpt"))
		p[n - 5] = 0;
	strcat(p, ".tok");
	return p;
}

static int set_model_keys(struct config *cfg, const struct model_config *mc, const char *src)
{
	char v[32];
	int rc = 0;
#define SETI(key, val) \
	(snprintf(v, sizeof(v), "%d", (int)(val)), config_set_key(cfg, "model", key, v, src))
#define SETF(key, val) \
	(snprintf(v, sizeof(v), "%.9g", (double)(val)), config_set_key(cfg, "model", key, v, src))
	rc |= config_set_key(cfg, "model", "arch", mc->arch == ARCH_GPT2 ? "gpt2" : "llama", src);
	rc |= SETI("n_layer", mc->L);
	rc |= SETI("d_model", mc->C);
	rc |= SETI("n_head", mc->NH);
	rc |= SETI("n_kv_head", mc->NKV);
	rc |= SETI("d_ff", mc->F);
	rc |= SETI("seq_len", mc->T);
	rc |= SETI("vocab_size", mc->V);
	rc |= SETI("tied", mc->tied);
	rc |= SETF("norm_eps", mc->eps);
	if (mc->arch == ARCH_LLAMA)
		rc |= SETF("rope_theta", mc->rope_theta);
	if (mc->E) { /* Mixtral: softmax router, no shared expert */
		rc |= SETI("n_expert", mc->E);
		rc |= SETI("top_k", mc->K);
		rc |= SETI("d_expert", mc->De);
		rc |= SETI("shared_expert", 0);
		rc |= config_set_key(cfg, "model", "router", "softmax", src);
		rc |= SETF("aux_loss_coef", mc->aux_coef);
		rc |= SETF("z_loss_coef", mc->z_coef);
	}
#undef SETI
#undef SETF
	return rc;
}

/* The tokenizer of DIR: tokenizer.json, else GPT-2's vocab.json + merges.txt. */
static int read_tokenizer(struct tokenizer **tok, const char *dir, long eos, int V)
{
	char *json = path_join(dir, "tokenizer.json"), *vocab = path_join(dir, "vocab.json"),
	     *merges = path_join(dir, "merges.txt");
	FILE *f;
	int rc;
	if ((f = fopen(json, "rb"))) {
		fclose(f);
		rc = hf_tokenizer_read(tok, json, eos);
	} else if ((f = fopen(vocab, "rb"))) {
		fclose(f);
		rc = gpt2_import(tok, vocab, merges);
	} else {
		rc = error("%s: no tokenizer.json (give --no-tokenizer to import the weights alone)",
			   dir);
	}
	if (!rc && tokenizer_vocab_size(*tok) > (uint32_t)V) {
		/* an id past the embedding has no row: refused, never truncated */
		rc = error("%s: the tokenizer has %u tokens but the model's embedding only %d rows "
			   "(config.json vocab_size): ids %d and up would have none; give the "
			   "model's own tokenizer, or --no-tokenizer to import the weights alone", dir,
			   tokenizer_vocab_size(*tok), V, V);
		tokenizer_free(*tok);
		*tok = NULL;
	}
	free(json);
	free(vocab);
	free(merges);
	return rc;
}

static int write_ckpt(const char *out, const struct config *cfg, const struct model *m,
		      const float *params, const char *meta)
{
	struct ckpt_writer *w;
	char *text = config_to_string(cfg);
	int rc = ckpt_create(&w, out, text, meta);
	free(text);
	if (rc)
		return -1;
	for (int i = 0; i < m->n_params && !rc; i++) {
		const struct param_info *p = &m->params[i];
		char name[128];
		snprintf(name, sizeof(name), "weights.v0/%s", p->name);
		rc = ckpt_add(w, name, params + p->offset, p->numel, p->rows, p->cols);
	}
	if (rc) {
		ckpt_abort(w);
		return -1;
	}
	return ckpt_commit(w);
}

int cmd_import_hf(int argc, char **argv, const char *prog)
{
	const char *out = "imported.ckpt", *tok_out = NULL;
	int no_tok = 0, force = 0;
	struct opt_list sets = {0};
	const struct option options[] = {
		OPT_STRING('o', "output", &out, "OUT.ckpt", "checkpoint to write (default imported.ckpt)"),
		OPT_STRING(0, "tokenizer-out", &tok_out, "FILE", "tokenizer file to write (default OUT.tok)"),
		OPT_FLAG(0, "no-tokenizer", &no_tok, "import the weights alone"),
		OPT_FLAG(0, "force", &force, "replace OUT.ckpt and the tokenizer file if they exist (they are kept otherwise)"),
		OPT_LIST('s', "set", &sets, "SECTION.KEY=VALUE", "set a config key stored with the weights, e.g. data.val"),
		OPT_END(),
	};
	int npos = opts_parse(argc, argv, usage, options,
			      "Convert a Hugging Face GPT-2, Llama or Mixtral model folder (config.json, "
			      "safetensors, tokenizer.json).");
	if (npos != 1)
		opts_usage_error(usage, options, npos ? "too many arguments" : "no model folder given");
	if (no_tok && tok_out)
		opts_usage_error(usage, options, "--tokenizer-out and --no-tokenizer exclude each other");
	const char *dir = argv[0];
	char *tok_path = no_tok ? NULL : tok_out ? xstrdup(tok_out) : default_tok_path(out);
	if (tok_path && !strcmp(tok_path, out)) {
		free(tok_path);
		opts_usage_error(usage, options, "--tokenizer-out '%s' is the checkpoint's path (-o): "
				 "give the tokenizer another name", out);
	}
	if (opts_output_is_new(out, force) || (tok_path && opts_output_is_new(tok_path, force))) {
		free(tok_path);
		return EXIT_FAIL;
	}
	struct model_config mc;
	long eos;
	struct tokenizer *tok = NULL;
	if (hf_read_config(dir, &mc, &eos) || (!no_tok && read_tokenizer(&tok, dir, eos, mc.V))) {
		free(tok_path);
		return EXIT_FAIL;
	}

	struct config cfg;
	config_defaults(&cfg);
	int rc = set_model_keys(&cfg, &mc, dir);
	if (!rc && tok)
		rc = config_set_key(&cfg, "data", "tokenizer", tok_path, dir);
	for (int i = 0; i < sets.n && !rc; i++)
		rc = config_set(&cfg, sets.items[i]);
	if (!rc)
		rc = config_finish(&cfg);
	struct model m = {0};
	float *params = NULL;
	if (!rc)
		rc = model_from_config(&m, &cfg, mc.V);
	if (!rc) {
		params = xmalloc(st_mult(m.numel, sizeof(float)));
		struct progress pg; /* on a terminal, when it takes seconds */
		progress_begin(&pg, 1, "reading the weights in %s", dir);
		rc = hf_read_weights(dir, &m, params);
		progress_end(&pg);
	}
	/* the tokenizer is written to its temporary first and moved into place
	 * only after the checkpoint: a failed import replaces neither file */
	struct atomic_file tok_file;
	int tok_open = 0;
	if (!rc && tok) {
		struct buf b = {0};
		tokenizer_serialize(tok, &b);
		rc = atomic_open(&tok_file, tok_path);
		tok_open = !rc;
		if (!rc)
			rc = atomic_write(&tok_file, b.data, b.len);
		buf_free(&b);
	}
	if (!rc) {
		char meta[1024];
		int k = snprintf(meta, sizeof(meta), "step = 0\nversions = 1\nseed = %ld\n",
				 cfg.train_seed);
		if (tok)
			k += snprintf(meta + k, sizeof(meta) - k, "tokenizer_hash = 0x%016llx\n",
				      (unsigned long long)tokenizer_hash(tok));
		ckpt_meta_add_text(meta, sizeof(meta), "imported_from", dir);
		struct progress pg;
		progress_begin(&pg, 1, "writing %s", out);
		rc = write_ckpt(out, &cfg, &m, params, meta);
		progress_end(&pg);
	}
	if (tok_open) {
		if (rc)
			atomic_abort(&tok_file);
		else
			rc = atomic_commit(&tok_file);
	}
	if (!rc) {
		const struct model_config *c = &m.cfg;
		printf("wrote %s: %s, %d layers, d_model %d, %d heads", out,
		       c->arch == ARCH_GPT2 ? "gpt2" : "llama", c->L, c->C, c->NH);
		if (c->NKV != c->NH)
			printf(" (%d key/value)", c->NKV);
		if (c->E)
			printf(", %d experts (top-%d, width %d)", c->E, c->K, c->De);
		printf(", context %d, vocabulary %d, %zu parameters\n", c->T, c->V, m.numel);
		if (tok)
			printf("wrote %s: %u tokens, %u merges, hash 0x%016llx\n", tok_path,
			       tokenizer_vocab_size(tok), tokenizer_nmerges(tok),
			       (unsigned long long)tokenizer_hash(tok));
	}
	free(params);
	free(tok_path);
	tokenizer_free(tok);
	model_free(&m);
	config_free(&cfg);
	return rc ? EXIT_FAIL : EXIT_OK;
}
