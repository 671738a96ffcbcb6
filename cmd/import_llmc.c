/* import_llmc.c - `asyncpp import-llmc FILE.bin -o OUT.ckpt`: an llm.c
 * GPT-2 checkpoint as an asyncpp checkpoint (step 0, no optimizer state),
 * which eval, sample, export and train --resume accept. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/formats/checkpoint.h"
#include "../io/config/config.h"
#include "../model/formats/llmc.h"
#include "../io/util.h"
#include "../model/model.h"
#include "cmd.h"
#include "opts.h"
#include "run_common.h"

static const char *const usage[] = {
	"asyncpp import-llmc [-o OUT.ckpt] [--set SECTION.KEY=VALUE]... FILE.bin",
	NULL,
};

int cmd_import_llmc(int argc, char **argv, const char *prog)
{
	const char *out = "imported.ckpt";
	struct opt_list sets = {0};
	int force = 0;
	const struct option options[] = {
		OPT_STRING('o', "output", &out, "OUT.ckpt", "checkpoint to write (default imported.ckpt)"),
		OPT_LIST('s', "set", &sets, "SECTION.KEY=VALUE", "set a config key stored with the weights, e.g. data.tokenizer"),
		OPT_FLAG(0, "force", &force, "replace OUT.ckpt if it exists (it is kept otherwise)"),
		OPT_END(),
	};
	int npos = opts_parse(argc, argv, usage, options,
			      "Convert an llm.c GPT-2 checkpoint (magic 20240326, version 3 fp32 or 5 bf16).");
	if (npos != 1)
		opts_usage_error(usage, options, npos ? "too many arguments" : "no llm.c checkpoint given");
	if (opts_output_is_new(out, force))
		return EXIT_FAIL;
	struct model_config mc;
	float *llmc_params;
	if (llmc_load(argv[0], &mc, &llmc_params))
		return EXIT_FAIL;
	/* the same shape through the config, as train will build it */
	struct config cfg;
	config_defaults(&cfg);
	char v[32];
	int rc = 0;
#define SETI(sec, key, val) \
	(snprintf(v, sizeof(v), "%d", (int)(val)), config_set_key(&cfg, sec, key, v, argv[0]))
	rc |= config_set_key(&cfg, "model", "arch", "gpt2", argv[0]);
	rc |= SETI("model", "n_layer", mc.L);
	rc |= SETI("model", "d_model", mc.C);
	rc |= SETI("model", "n_head", mc.NH);
	rc |= SETI("model", "n_kv_head", mc.NH);
	rc |= SETI("model", "seq_len", mc.T);
	rc |= SETI("model", "vocab_size", mc.V);
	rc |= SETI("model", "tied", 1);
	rc |= SETI("model", "d_ff", mc.F);
#undef SETI
	for (int i = 0; i < sets.n && !rc; i++)
		rc = config_set(&cfg, sets.items[i]);
	if (!rc)
		rc = config_finish(&cfg);
	struct model llmc_m, m;
	if (rc || model_init(&llmc_m, &mc) || model_from_config(&m, &cfg, mc.V)) {
		free(llmc_params);
		return EXIT_FAIL;
	}
	/* llm.c pads the vocabulary to its own Vp; ours may differ. Rows
	 * beyond V are never used, so copy tensor by tensor, row by row. */
	float *params = xcalloc(m.numel, sizeof(float));
	for (int i = 0; i < m.n_params; i++) {
		const struct param_info *dst = &m.params[i];
		int j = model_find_param(&llmc_m, dst->name);
		if (j < 0) {
			error("'%s': no tensor '%s'", argv[0], dst->name);
			rc = -1;
			break;
		}
		const struct param_info *src = &llmc_m.params[j];
		size_t row = (size_t)(dst->cols ? dst->cols : 1);
		size_t rows = (size_t)MIN(dst->rows, src->rows);
		if (dst->cols != src->cols) {
			error("'%s': tensor '%s' has %d columns, expected %d", argv[0], dst->name,
			      src->cols, dst->cols);
			rc = -1;
			break;
		}
		memcpy(params + dst->offset, llmc_params + src->offset, rows * row * sizeof(float));
		size_t at;
		if (floats_nonfinite(params + dst->offset, rows * row, &at)) {
			error("'%s': tensor '%s' holds %g at index %zu: NaN or infinite weights are "
			      "not imported", argv[0], dst->name, (double)params[dst->offset + at], at);
			rc = -1;
			break;
		}
	}
	free(llmc_params);
	if (!rc) {
		struct ckpt_writer *w;
		char *text = config_to_string(&cfg);
		char meta[1024];
		snprintf(meta, sizeof(meta), "step = 0\nversions = 1\nseed = %ld\n", cfg.train_seed);
		ckpt_meta_add_text(meta, sizeof(meta), "imported_from", argv[0]);
		rc = ckpt_create(&w, out, text, meta);
		free(text);
		int created = !rc;
		for (int i = 0; i < m.n_params && !rc; i++) {
			const struct param_info *p = &m.params[i];
			char name[128];
			snprintf(name, sizeof(name), "weights.v0/%s", p->name);
			rc = ckpt_add(w, name, params + p->offset, p->numel, p->rows, p->cols);
		}
		if (rc && created)
			ckpt_abort(w);
		else if (!rc)
			rc = ckpt_commit(w);
	}
	if (!rc)
		printf("wrote %s: gpt2, %d layers, d_model %d, %d heads, context %d, vocabulary %d, "
		       "%zu parameters\n", out, m.cfg.L, m.cfg.C, m.cfg.NH, m.cfg.T, m.cfg.V, m.numel);
	free(params);
	model_free(&m);
	model_free(&llmc_m);
	config_free(&cfg);
	return rc ? EXIT_FAIL : EXIT_OK;
}
