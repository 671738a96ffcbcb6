/* cmd.h - subcommand entry points. Each takes (argc, argv) with argv[0] the
 * command name, and prog: the program as it was invoked ("asyncpp" when
 * found through PATH, "./asyncpp", "build/asyncpp"), which the hints that
 * show a command to run next begin with. Each returns the process exit code
 * (0, 1, or 2 for usage).
 *
 * Adding a command (the checklist):
 *   1. a row in the table in asyncpp.c;
 *   2. cmd/NAME.c with its option table (cmd/opts.h) and cmd_NAME();
 *   3. man/asyncpp-NAME.1, whose SYNOPSIS matches the -h usage lines;
 *   4. tests: tests/cli/NAME-*.cmd and what proves the command works.
 * The Makefile picks up new .c files by itself.
 */
#ifndef ASYNCPP_CMD_H
#define ASYNCPP_CMD_H

int cmd_tokenize(int argc, char **argv, const char *prog);
int cmd_train(int argc, char **argv, const char *prog);
int cmd_eval(int argc, char **argv, const char *prog);
int cmd_sample(int argc, char **argv, const char *prog);
int cmd_inspect(int argc, char **argv, const char *prog);
int cmd_bench(int argc, char **argv, const char *prog);
int cmd_plot(int argc, char **argv, const char *prog);
int cmd_import_llmc(int argc, char **argv, const char *prog);
int cmd_import_hf(int argc, char **argv, const char *prog);
int cmd_export(int argc, char **argv, const char *prog);
/* `asyncpp help TOPIC`: the compiled-in man page of a command or topic
 * (cmd/help.c); EXIT_USAGE for an unknown topic. */
int cmd_help_topic(const char *topic);

/* For commands that a later issue fills in: says so and returns 1. */
int cmd_not_implemented(const char *name);

#endif
