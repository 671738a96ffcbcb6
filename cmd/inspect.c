/* inspect.c - `asyncpp inspect FILE...`: say what a file holds, verify it.
 *
 * The kind of each file comes from its first bytes: a token shard (asyncpp
 * or llm.c), a tokenizer file, or a checkpoint. Exit 0 when every file is
 * intact, 1 when any is corrupt or unreadable, 2 on bad usage. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/formats/checkpoint.h"
#include "../io/formats/container.h"
#include "../io/formats/shard.h"
#include "../io/text/tokenizer.h"
#include "../io/util.h"
#include "cmd.h"
#include "opts.h"
#include "progress.h"

#define LLMC_CKPT_MAGIC 20240326

static const char *const inspect_usage[] = {
	"asyncpp inspect [-v] FILE...",
	"asyncpp inspect --diff [-v] [--top N] CKPT_A CKPT_B",
	NULL,
};

enum file_kind {
	KIND_UNKNOWN,
	KIND_SHARD,
	KIND_TOKENIZER,
	KIND_CHECKPOINT,
	KIND_CONTAINER, /* a container of a kind this asyncpp does not know */
	KIND_LLMC_CKPT,
};

/* The kind of PATH by its first bytes; -1 if it cannot be read. */
static int file_kind(const char *path)
{
	FILE *fp = fopen(path, "rb");
	if (!fp)
		return error("cannot open '%s': %s", path, strerror(errno));
	unsigned char b[16] = {0};
	size_t n = fread(b, 1, sizeof(b), fp);
	int bad = ferror(fp);
	fclose(fp);
	if (bad)
		return error("cannot read '%s': %s", path, strerror(errno));
	char magic[8];
	int r = container_peek(path, magic);
	if (r < 0)
		return -1;
	if (r > 0 && !memcmp(magic, SHARD_MAGIC, 8))
		return KIND_SHARD;
	if (r > 0 && !memcmp(magic, CKPT_MAGIC, 8))
		return KIND_CHECKPOINT;
	if (r > 0)
		return KIND_CONTAINER;
	if (n >= 8 && !memcmp(b, TOKENIZER_MAGIC, 8))
		return KIND_TOKENIZER;
	if (n >= 4 && get_le32(b) == LLMC_SHARD_MAGIC)
		return KIND_SHARD;
	if (n >= 4 && get_le32(b) == LLMC_CKPT_MAGIC)
		return KIND_LLMC_CKPT;
	if (n >= 8 && !memcmp(b, SHARD_MAGIC, 8))
		return KIND_SHARD; /* not inside a header frame: shard_inspect says why */
	return KIND_UNKNOWN;
}

static int inspect_one(const char *path, int verbose, FILE *out)
{
	switch (file_kind(path)) {
	case KIND_SHARD:
		return shard_inspect(path, out);
	case KIND_TOKENIZER:
		return tokenizer_inspect(path, out);
	case KIND_CHECKPOINT:
		return checkpoint_inspect(path, out, verbose);
	case KIND_CONTAINER:
		return error("'%s': an asyncpp container of an unknown kind (newer asyncpp?)",
			     path);
	case KIND_LLMC_CKPT:
		/* TODO: llm.c GPT-2 checkpoints (see `asyncpp import-llmc`). */
		return error("'%s': inspecting llm.c checkpoint files is not implemented yet",
			     path);
	case KIND_UNKNOWN:
		return error("'%s': unknown kind of file (not a shard, tokenizer or checkpoint)",
			     path);
	default:
		return -1;
	}
}

int cmd_inspect(int argc, char **argv, const char *prog)
{
	int verbose = 0, diff = 0;
	long top = 10;
	const struct option opts[] = {
		OPT_FLAG('v', "verbose", &verbose, "show more (a checkpoint's configuration; with --diff, every tensor)"),
		OPT_FLAG(0, "diff", &diff, "compare two checkpoints tensor by tensor"),
		OPT_INT(0, "top", &top, "N", "with --diff, list the N most different tensors (10)"),
		OPT_END(),
	};
	const char *desc = "Show what a token shard, tokenizer file or checkpoint holds and verify\n"
			   "every checksum. Exits 1 if any file is corrupt or unreadable.";
	int n = opts_parse(argc, argv, inspect_usage, opts, desc);
	if (diff) {
		if (n != 2)
			opts_usage_error(inspect_usage, opts, "--diff needs two checkpoints");
		if (top < 0 || top > 1000000)
			opts_usage_error(inspect_usage, opts, "--top must be 0..1000000");
		int rc = checkpoint_diff(argv[0], argv[1], stdout, (int)top, verbose);
		fflush(stdout);
		return rc ? EXIT_FAIL : EXIT_OK;
	}
	if (n < 1)
		opts_usage_error(inspect_usage, opts, "no file to inspect");
	if (top != 10)
		opts_usage_error(inspect_usage, opts, "--top only applies with --diff");
	int failed = 0;
	for (int i = 0; i < n; i++) {
		if (i)
			putchar('\n');
		/* on a terminal, a progress line while a big file is read and
		 * verified; the report is held until it is erased */
		struct progress pg;
		progress_begin(&pg, 1, "reading and verifying %s", argv[i]);
		char *held = NULL;
		size_t len = 0;
		FILE *out = pg.on ? open_memstream(&held, &len) : NULL;
		if (inspect_one(argv[i], verbose, out ? out : stdout))
			failed = 1;
		if (out)
			fclose(out);
		progress_end(&pg);
		if (held)
			fwrite(held, 1, len, stdout);
		free(held);
		fflush(stdout);
	}
	return failed ? EXIT_FAIL : EXIT_OK;
}
