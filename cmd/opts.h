/* opts.h - one option table per command: it drives parsing and -h text.
 *
 * A command declares its synopsis lines and an array of struct option ending
 * with OPT_END(). opts_parse() handles -h/--help (usage on stdout, exit 0),
 * bad usage (message and usage on stderr, exit 2), "--", "--name=value",
 * "--name value" and "-x value", and returns the remaining positional
 * arguments compacted at the front of argv. The synopsis lines are what the
 * man page's SYNOPSIS must show (tests/scripts/docs_sync.sh checks it).
 */
#ifndef ASYNCPP_OPTS_H
#define ASYNCPP_OPTS_H

enum opt_type {
	OPT_T_END,
	OPT_T_FLAG,   /* int, set to 1 */
	OPT_T_INT,    /* long */
	OPT_T_DOUBLE, /* double */
	OPT_T_STRING, /* const char * */
	OPT_T_LIST,   /* struct opt_list: repeatable string */
	OPT_T_GROUP,  /* a heading in -h output */
};

struct opt_list {
	const char **items;
	int n;
};

struct option {
	enum opt_type type;
	char short_name;      /* 0 for none */
	const char *long_name;
	void *value;
	const char *argname;  /* shown in help, e.g. "FILE" */
	const char *help;
};

#define OPT_FLAG(s, l, v, h) {OPT_T_FLAG, (s), (l), (v), NULL, (h)}
#define OPT_INT(s, l, v, a, h) {OPT_T_INT, (s), (l), (v), (a), (h)}
#define OPT_DOUBLE(s, l, v, a, h) {OPT_T_DOUBLE, (s), (l), (v), (a), (h)}
#define OPT_STRING(s, l, v, a, h) {OPT_T_STRING, (s), (l), (v), (a), (h)}
#define OPT_LIST(s, l, v, a, h) {OPT_T_LIST, (s), (l), (v), (a), (h)}
#define OPT_GROUP(h) {OPT_T_GROUP, 0, NULL, NULL, NULL, (h)}
#define OPT_END() {OPT_T_END, 0, NULL, NULL, NULL, NULL}

/* usage: NULL-terminated synopsis lines, e.g. "asyncpp eval [options] CKPT".
 * Returns the number of positional arguments left in argv[0..n). argv[0] on
 * entry is the command name and is skipped. */
int opts_parse(int argc, char **argv, const char *const *usage,
	       const struct option *opts, const char *description);
void opts_usage(FILE *fp, const char *const *usage, const struct option *opts,
		const char *description);
/* Print usage to stderr and exit 2 with a message. */
void opts_usage_error(const char *const *usage, const struct option *opts,
		      const char *fmt, ...);

/* Outputs are never replaced without asking: returns -1 after error() when
 * path exists and force is 0, naming it and the --force option. Commands
 * call it before any long work. */
int opts_output_is_new(const char *path, int force);

#endif
