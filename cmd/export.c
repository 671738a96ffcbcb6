/* export.c - `asyncpp export CKPT -o OUT`: a checkpoint's newest weights for
 * PyTorch users, as one safetensors file with our names (model/formats/safetensors.h)
 * or as a Hugging Face model folder (model/formats/hf_model.h, asyncpp-export(1)). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../model/formats/hf_model.h"
#include "../model/formats/safetensors.h"
#include "../io/staged.h"
#include "../io/text/tokenizer.h"
#include "../io/util.h"
#include "cmd.h"
#include "model_load.h"
#include "opts.h"
#include "run_paths.h"

static const char *const usage[] = {
	"asyncpp export [--format safetensors] [-o OUT] [--force] CKPT",
	"asyncpp export --format hf [-o DIR] [--dtype f32|bf16|f16] [--tokenizer FILE | --no-tokenizer] [--force] CKPT",
	NULL,
};

/* DIR absent (made, and staged until the export is done: a signal or
 * an error removes it while empty), or an empty folder, or anything with
 * force. */
static int prepare_dir(const char *dir, int force, int *made)
{
	struct stat st;
	*made = 0;
	if (stat(dir, &st)) {
		if (errno != ENOENT)
			return error("cannot stat '%s': %s", dir, strerror(errno));
		staged_add(dir, 1);
		if (mkdir(dir, 0777)) {
			staged_drop(dir);
			return error("cannot create '%s': %s", dir, strerror(errno));
		}
		*made = 1;
		return 0;
	}
	if (!S_ISDIR(st.st_mode))
		return error("'%s' exists and is not a folder", dir);
	DIR *d = opendir(dir);
	if (!d)
		return error("cannot open '%s': %s", dir, strerror(errno));
	struct dirent *e;
	int empty = 1;
	while (empty && (e = readdir(d)))
		empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
	closedir(d);
	if (!empty && !force)
		return error("'%s' is not empty; pass --force to write into it, or choose another "
			     "output", dir);
	return 0;
}

/* The run's tokenizer (or FILE), checked against the checkpoint. */
static int load_tokenizer(struct tokenizer **tok, const struct loaded_model *lm,
			  const char *path)
{
	int given = path && *path;
	if (!given)
		path = lm->cfg.data_tokenizer;
	if (!path || !*path)
		return error("%s names no tokenizer; give --tokenizer FILE or --no-tokenizer",
			     lm->path);
	if (!given && run_path_check(&lm->cfg, "tokenizer", lm->path,
				     "the tokenizer with --tokenizer FILE (or --no-tokenizer)"))
		return -1;
	if (tokenizer_load(tok, path))
		return -1;
	uint32_t V = tokenizer_vocab_size(*tok);
	if ((lm->tokenizer_hash && tokenizer_hash(*tok) != lm->tokenizer_hash) ||
	    V > (uint32_t)lm->m.cfg.V) {
		error("tokenizer '%s' (%u tokens) is not the one %s was trained with (%d tokens); "
		      "give --tokenizer FILE", path, V, lm->path, lm->m.cfg.V);
		tokenizer_free(*tok);
		*tok = NULL;
		return -1;
	}
	return 0;
}

/* Remove the staging folder and what is in it. */
static void remove_staged(const char *stage)
{
	DIR *d = opendir(stage);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		char *path = path_join(stage, e->d_name);
		unlink(path);
		free(path);
	}
	if (d)
		closedir(d);
	rmdir(stage);
}

/* Move every file of stage into dir, after checking that none would land
 * on a folder, so that a refusal leaves dir as it was. */
static int move_staged(const char *stage, const char *dir)
{
	int rc = 0;
	for (int pass = 0; pass < 2 && !rc; pass++) {
		DIR *d = opendir(stage);
		if (!d)
			return error("cannot open '%s': %s", stage, strerror(errno));
		struct dirent *e;
		while (!rc && (e = readdir(d))) {
			if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
				continue;
			char *from = path_join(stage, e->d_name), *to = path_join(dir, e->d_name);
			struct stat st;
			if (pass == 0 && !lstat(to, &st) && S_ISDIR(st.st_mode))
				rc = error("'%s' is a folder; the export would replace it with a file: "
					   "remove it or choose another output", to);
			else if (pass == 1 && rename(from, to))
				rc = error("cannot move '%s' to '%s': %s", from, to, strerror(errno));
			free(from);
			free(to);
		}
		closedir(d);
	}
	return rc;
}

/* The folder's files are written into DIR/.partial.PID and moved into DIR
 * once all of them are (renames within DIR's file system, wherever DIR is
 * mounted or links to): a failed export leaves DIR's files as they were. */
static int export_hf(const struct loaded_model *lm, const char *dir, int dtype,
		     const char *tok_path, int no_tok)
{
	struct tokenizer *tok = NULL;
	if (!no_tok && load_tokenizer(&tok, lm, tok_path))
		return -1;
	long eos = -1;
	if (tok && tokenizer_eot_id(tok) != TOKENIZER_NO_ID)
		eos = tokenizer_eot_id(tok);
	char name[40];
	snprintf(name, sizeof(name), ".partial.%ld", (long)getpid());
	char *stage = path_join(dir, name);
	int rc = 0;
	staged_add(stage, 1); /* with the files committed into it */
	if (mkdir(stage, 0777))
		rc = error("cannot write into '%s' (its staging folder '%s'): %s", dir, stage,
			   strerror(errno));
	if (!rc)
		rc = hf_write_model(stage, &lm->m, lm->host, (enum st_dtype)dtype, eos);
	if (!rc && tok)
		rc = hf_tokenizer_write(tok, stage, lm->m.cfg.arch == ARCH_GPT2, lm->m.cfg.T);
	if (!rc)
		rc = move_staged(stage, dir);
	remove_staged(stage); /* empty by now when it worked */
	staged_drop(stage);
	free(stage);
	if (!rc)
		printf("wrote %s: %s, %s, %zu parameters (step %ld of %s)%s\n", dir,
		       lm->m.cfg.arch == ARCH_GPT2 ? "GPT2LMHeadModel" :
		       lm->m.cfg.E ? "MixtralForCausalLM" : "LlamaForCausalLM",
		       st_dtype_name((enum st_dtype)dtype), lm->m.numel, lm->step, lm->path,
		       tok ? ", with its tokenizer" : "");
	tokenizer_free(tok);
	return rc;
}

int cmd_export(int argc, char **argv, const char *prog)
{
	const char *format = "safetensors", *out = NULL, *dtype_s = "f32", *tok_path = NULL;
	int force = 0, no_tok = 0;
	const struct option options[] = {
		OPT_STRING(0, "format", &format, "FMT", "safetensors (our names, f32) or hf (a Hugging Face folder)"),
		OPT_STRING('o', "output", &out, "OUT", "file or folder to write (default model.safetensors, or hf)"),
		OPT_STRING(0, "dtype", &dtype_s, "TYPE", "hf: f32 (default), bf16 or f16"),
		OPT_STRING(0, "tokenizer", &tok_path, "FILE", "hf: tokenizer to write (default: the run's data.tokenizer)"),
		OPT_FLAG(0, "no-tokenizer", &no_tok, "hf: write the model alone"),
		OPT_FLAG(0, "force", &force, "replace OUT if it exists; hf: write into a folder that is not empty"),
		OPT_END(),
	};
	int npos = opts_parse(argc, argv, usage, options,
			      "Write a checkpoint's newest weights in a format other tools load.");
	if (npos != 1)
		opts_usage_error(usage, options, npos ? "too many arguments" : "no checkpoint given");
	int hf = !strcmp(format, "hf");
	if (!hf && strcmp(format, "safetensors"))
		opts_usage_error(usage, options, "unknown format '%s' (expected safetensors or hf)",
				 format);
	int dtype = st_dtype_parse(dtype_s);
	if (dtype < 0)
		opts_usage_error(usage, options, "unknown --dtype '%s' (expected f32, bf16 or f16)",
				 dtype_s);
	if (!hf && (dtype != ST_F32 || tok_path || no_tok))
		opts_usage_error(usage, options,
				 "--dtype, --tokenizer and --no-tokenizer need --format hf");
	if (no_tok && tok_path)
		opts_usage_error(usage, options, "--tokenizer and --no-tokenizer exclude each other");
	if (!out)
		out = hf ? "hf" : "model.safetensors";
	int made = 0;
	if (hf ? prepare_dir(out, force, &made) : opts_output_is_new(out, force))
		return EXIT_FAIL;
	struct loaded_model lm;
	int opened = !loaded_model_open(&lm, argv[0], "cpu", 1), rc = opened ? 0 : -1;
	if (opened && hf) {
		rc = export_hf(&lm, out, dtype, tok_path, no_tok);
	} else if (opened) {
		char meta[256];
		snprintf(meta, sizeof(meta), "\"asyncpp_step\": \"%ld\"", lm.step);
		rc = safetensors_write(out, &lm.m, lm.host, meta);
		if (!rc)
			printf("wrote %s: %d tensors, %zu parameters (step %ld of %s)\n", out,
			       lm.m.n_params, lm.m.numel, lm.step, lm.path);
	}
	if (opened)
		loaded_model_close(&lm);
	if (rc && made) /* a folder it made, left as it found the path */
		rmdir(out);
	staged_drop(out);
	return rc ? EXIT_FAIL : EXIT_OK;
}
