/* export.c - `asyncpp export CKPT -o OUT.safetensors`: a checkpoint's newest
 * weights for PyTorch users (names and layout: io/safetensors.h,
 * asyncpp-export(1)). */
#include <stdio.h>
#include <string.h>

#include "../io/safetensors.h"
#include "../io/util.h"
#include "cmd.h"
#include "model_load.h"
#include "opts.h"

static const char *const usage[] = {
	"asyncpp export [--format safetensors] [-o OUT] CKPT",
	NULL,
};

int cmd_export(int argc, char **argv)
{
	const char *format = "safetensors", *out = "model.safetensors";
	const struct option options[] = {
		OPT_STRING(0, "format", &format, "FMT", "output format: safetensors (the only one)"),
		OPT_STRING('o', "output", &out, "OUT", "file to write (default model.safetensors)"),
		OPT_END(),
	};
	int npos = opts_parse(argc, argv, usage, options,
			      "Write a checkpoint's newest weights in a format other tools load.");
	if (npos != 1)
		opts_usage_error(usage, options, npos ? "too many arguments" : "no checkpoint given");
	if (strcmp(format, "safetensors"))
		opts_usage_error(usage, options, "unknown format '%s' (expected safetensors)", format);
	struct loaded_model lm;
	if (loaded_model_open(&lm, argv[0], "cpu", 1))
		return EXIT_FAIL;
	char meta[256];
	snprintf(meta, sizeof(meta), "\"asyncpp_step\": \"%ld\"", lm.step);
	int rc = safetensors_write(out, &lm.m, lm.host, meta);
	if (!rc)
		printf("wrote %s: %d tensors, %zu parameters (step %ld of %s)\n", out, lm.m.n_params,
		       lm.m.numel, lm.step, lm.path);
	loaded_model_close(&lm);
	return rc ? EXIT_FAIL : EXIT_OK;
}
