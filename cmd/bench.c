/* bench.c - `asyncpp bench WHAT`: dispatch to one benchmark family. */
#include <stdio.h>
#include <string.h>

#include "../io/suggest.h"
#include "../io/util.h"
#include "bench.h"
#include "cmd.h"

static const struct {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *summary;
} benches[] = {
	{"kernels", bench_kernels, "time each backend operation against the device's peak"},
	{"train", bench_train, "tokens/s and MFU of training steps"},
	{"schedule", bench_schedule, "print a pipeline schedule's timeline, bubble and simulation"},
	{"tokenizer", bench_tokenizer, "BPE training and encoding speed"},
	{"plan", bench_plan, "predict 1F1B against 2BW tokens/s at S stages x DP replicas"},
};

static void usage(FILE *fp)
{
	fprintf(fp, "usage: asyncpp bench WHAT [options]\n\n");
	for (size_t i = 0; i < ARRAY_SIZE(benches); i++)
		fprintf(fp, "    %-10s %s\n", benches[i].name, benches[i].summary);
	fprintf(fp, "\n'asyncpp bench WHAT -h' shows its options.\n");
}

int cmd_bench(int argc, char **argv, const char *prog)
{
	if (argc < 2) {
		usage(stderr);
		return EXIT_USAGE;
	}
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		usage(stdout);
		return EXIT_OK;
	}
	for (size_t i = 0; i < ARRAY_SIZE(benches); i++)
		if (!strcmp(argv[1], benches[i].name))
			return benches[i].fn(argc - 1, argv + 1);
	struct suggest sg;
	char near[128];
	suggest_init(&sg, argv[1]);
	for (size_t i = 0; i < ARRAY_SIZE(benches); i++)
		suggest_offer(&sg, benches[i].name);
	if (suggest_text(&sg, "'%s'", near, sizeof(near)))
		fprintf(stderr, "asyncpp: unknown benchmark '%s'; did you mean %s?\n", argv[1], near);
	else
		fprintf(stderr, "asyncpp: unknown benchmark '%s'\n", argv[1]);
	usage(stderr);
	return EXIT_USAGE;
}
