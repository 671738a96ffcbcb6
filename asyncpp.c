/* asyncpp.c - the command table: the program's table of contents.
 *
 * To add a command, follow the checklist in cmd/cmd.h.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "io/staged.h"
#include "io/suggest.h"
#include "io/util.h"
#include "kernels/backend.h"

struct command {
	const char *name;
	int (*fn)(int argc, char **argv, const char *prog);
	const char *summary;
};

static const struct command commands[] = {
	{"tokenize", cmd_tokenize, "train a BPE tokenizer, import GPT-2's, tiktoken's or a tokenizer.json, encode corpora into shards, decode"},
	{"train", cmd_train, "train a model (one device, emulated delay, or a pipeline schedule)"},
	{"eval", cmd_eval, "loss and perplexity of a checkpoint on shards"},
	{"sample", cmd_sample, "generate text from a checkpoint"},
	{"inspect", cmd_inspect, "show and verify a shard, tokenizer or checkpoint; diff checkpoints"},
	{"bench", cmd_bench, "time kernels, a training step, or a pipeline schedule"},
	{"plot", cmd_plot, "draw metrics files as an SVG line chart"},
	{"import-llmc", cmd_import_llmc, "convert an llm.c GPT-2 checkpoint into an asyncpp checkpoint"},
	{"import-hf", cmd_import_hf, "convert a Hugging Face GPT-2, Llama or Mixtral folder into a checkpoint and tokenizer"},
	{"export", cmd_export, "write a checkpoint's weights as safetensors or a Hugging Face folder"},
};

int cmd_not_implemented(const char *name)
{
	fprintf(stderr, "asyncpp: '%s' is not implemented yet\n", name);
	return EXIT_FAIL;
}

static void print_version(void)
{
	printf("asyncpp %s\n", ASYNCPP_VERSION);
	printf("backends: cpu (OpenBLAS)%s\n", backend_cuda() ? ", cuda (cuBLAS, NCCL)" : "");
#ifdef ASYNCPP_MPI
	printf("transports: local (threads), mpi (processes)\n");
#else
	printf("transports: local (threads)\n");
#endif
	printf("built with: zstd, inih, OpenBLAS%s\n",
	       backend_cuda() ? ", CUDA runtime (static)" : "");
}

static void print_help(FILE *fp)
{
	fprintf(fp, "usage: asyncpp [--version] [help] COMMAND [ARGS]\n\n");
	fprintf(fp, "Pipeline-parallel language-model pretraining, synchronous or PipeDream-2BW.\n\n");
	fprintf(fp, "commands:\n");
	for (size_t i = 0; i < ARRAY_SIZE(commands); i++)
		fprintf(fp, "    %-12s %s\n", commands[i].name, commands[i].summary);
	fprintf(fp, "\n'asyncpp COMMAND -h' shows a command's options; 'asyncpp help COMMAND' its\n"
		    "manual page (also: help asyncpp, help ini, help formats, help distributed).\n");
	fprintf(fp, "'asyncpp train' with no arguments trains a tiny model on the built-in corpus.\n");
}

/* Like git: a command's output that could not be written is a failure. */
static int finish(int rc)
{
	if (fflush(stdout) || ferror(stdout)) {
		fprintf(stderr, "asyncpp: cannot write to standard output: %s\n", strerror(errno));
		return EXIT_FAIL;
	}
	return rc;
}

/* OpenMP threads that finish a parallel region spin for a few milliseconds
 * before they sleep (libgomp's default). A training step runs hundreds of
 * short regions, and on cores shared with other processes the spinning
 * thread takes the core its team mate needs: bench/NOTES.md measured 2
 * threads at 2.6x llm.c's speed with spinning and 4.5x with passive waiting.
 * libgomp reads OMP_WAIT_POLICY once, when it is loaded, before main() runs,
 * so the only way to choose it from here is to run ourselves again with it
 * set. Only for the commands that compute with OpenMP, and never when the
 * user chose a policy (OMP_WAIT_POLICY or GOMP_SPINCOUNT). */
static void prefer_passive_openmp_wait(const char *command, char **argv)
{
	static const char *const computes[] = {"train", "eval", "sample", "bench"};
	int found = 0;
	for (size_t i = 0; i < ARRAY_SIZE(computes); i++)
		found |= !strcmp(command, computes[i]);
	if (!found || getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT"))
		return;
	/* under valgrind the new image would run uninstrumented */
	const char *preload = getenv("LD_PRELOAD");
	if (preload && strstr(preload, "vgpreload"))
		return;
	if (setenv("OMP_WAIT_POLICY", "passive", 1))
		return;
	execv("/proc/self/exe", argv);
	/* no /proc (not Linux, a sandbox): go on with the default policy */
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		print_help(stderr);
		return EXIT_USAGE;
	}
	const char *name = argv[1];
	prefer_passive_openmp_wait(name, argv);
	staged_on_signals(); /* a signal leaves no half-written output */
	if (!strcmp(name, "--version") || !strcmp(name, "version")) {
		print_version();
		return finish(EXIT_OK);
	}
	if (!strcmp(name, "help") || !strcmp(name, "--help") || !strcmp(name, "-h")) {
		if (argc > 2) /* the manual page, compiled in (cmd/help.c) */
			return finish(cmd_help_topic(argv[2]));
		print_help(stdout);
		return finish(EXIT_OK);
	}
	/* as invoked, for the hints: a name without a slash was found
	 * through PATH (`asyncpp`), else the path typed (`./asyncpp`) */
	const char *prog = argv[0] && argv[0][0] ? argv[0] : "asyncpp";
	for (size_t i = 0; i < ARRAY_SIZE(commands); i++)
		if (!strcmp(commands[i].name, name))
			return finish(commands[i].fn(argc - 1, argv + 1, prog));
	/* like git: the nearest commands, when any is near */
	struct suggest sg;
	char near[256];
	suggest_init(&sg, name);
	for (size_t i = 0; i < ARRAY_SIZE(commands); i++)
		suggest_offer(&sg, commands[i].name);
	static const char *const others[] = {"help", "version", "--help", "--version"};
	for (size_t i = 0; i < ARRAY_SIZE(others); i++)
		suggest_offer(&sg, others[i]);
	if (suggest_text(&sg, "'%s'", near, sizeof(near)))
		fprintf(stderr, "asyncpp: '%s' is not a command; did you mean %s? See '%s "
			"help'\n", name, near, prog);
	else
		fprintf(stderr, "asyncpp: '%s' is not a command; see '%s help'\n", name, prog);
	return EXIT_USAGE;
}
