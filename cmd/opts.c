/* opts.c - option parsing and help text from one table (see opts.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../io/suggest.h"
#include "../io/util.h"
#include "opts.h"

void opts_usage(FILE *fp, const char *const *usage, const struct option *opts,
		const char *description)
{
	for (int i = 0; usage[i]; i++)
		fprintf(fp, "%s %s\n", i ? "   or:" : "usage:", usage[i]);
	if (description)
		fprintf(fp, "\n%s\n", description);
	int first = 1;
	for (const struct option *o = opts; o && o->type != OPT_T_END; o++) {
		if (o->type == OPT_T_GROUP) {
			fprintf(fp, "\n%s\n", o->help);
			first = 0;
			continue;
		}
		if (first) {
			fputc('\n', fp);
			first = 0;
		}
		char left[96];
		int n = 0;
		if (o->short_name && o->long_name)
			n = snprintf(left, sizeof(left), "-%c, --%s", o->short_name, o->long_name);
		else if (o->short_name)
			n = snprintf(left, sizeof(left), "-%c", o->short_name);
		else
			n = snprintf(left, sizeof(left), "    --%s", o->long_name);
		if (o->argname && n > 0 && (size_t)n < sizeof(left))
			snprintf(left + n, sizeof(left) - n, " %s", o->argname);
		if (strlen(left) > 24)
			fprintf(fp, "    %s\n%30s%s\n", left, "", o->help);
		else
			fprintf(fp, "    %-26s%s\n", left, o->help);
	}
}

void opts_usage_error(const char *const *usage, const struct option *opts,
		      const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fflush(stdout);
	fprintf(stderr, "asyncpp: %s\n", msg);
	opts_usage(stderr, usage, opts, NULL);
	exit(EXIT_USAGE);
}

static int takes_arg(const struct option *o)
{
	return o->type == OPT_T_INT || o->type == OPT_T_DOUBLE ||
	       o->type == OPT_T_STRING || o->type == OPT_T_LIST;
}

static void set_value(const char *const *usage, const struct option *opts,
		      const struct option *o, const char *arg, const char *shown)
{
	char *end;
	switch (o->type) {
	case OPT_T_FLAG:
		*(int *)o->value = 1;
		break;
	case OPT_T_INT:
		errno = 0;
		*(long *)o->value = strtol(arg, &end, 0);
		if (errno || end == arg || *end)
			opts_usage_error(usage, opts, "option '%s' expects an integer, got '%s'",
					 shown, arg);
		break;
	case OPT_T_DOUBLE:
		errno = 0;
		*(double *)o->value = strtod(arg, &end);
		if (errno || end == arg || *end)
			opts_usage_error(usage, opts, "option '%s' expects a number, got '%s'",
					 shown, arg);
		break;
	case OPT_T_STRING:
		*(const char **)o->value = arg;
		break;
	case OPT_T_LIST: {
		struct opt_list *l = o->value;
		l->items = xrealloc(l->items, sizeof(*l->items) * (size_t)(l->n + 1));
		l->items[l->n++] = arg;
		break;
	}
	default:
		break;
	}
}

/* "unknown option '--stpes'; did you mean '--steps'?": the nearest long
 * options (for a short one, the long options of its letter's neighbours
 * are no help: none is suggested). */
static void unknown_option(const char *const *usage, const struct option *opts, const char *arg,
			   const char *shown)
{
	char near[256] = "";
	if (arg[1] == '-') {
		char word[96];
		snprintf(word, sizeof(word), "%.*s", (int)strcspn(arg + 2, "="), arg + 2);
		struct suggest sg;
		suggest_init(&sg, word);
		for (const struct option *p = opts; p->type != OPT_T_END; p++)
			suggest_offer(&sg, p->long_name);
		suggest_offer(&sg, "help");
		suggest_text(&sg, "'--%s'", near, sizeof(near));
	}
	if (*near)
		opts_usage_error(usage, opts, "unknown option '%s'; did you mean %s?", shown, near);
	else
		opts_usage_error(usage, opts, "unknown option '%s'", shown);
}

int opts_parse(int argc, char **argv, const char *const *usage,
	       const struct option *opts, const char *description)
{
	int npos = 0, only_pos = 0;
	for (int i = 1; i < argc; i++) {
		char *a = argv[i];
		if (only_pos || a[0] != '-' || !a[1]) {
			argv[npos++] = a;
			continue;
		}
		if (!strcmp(a, "--")) {
			only_pos = 1;
			continue;
		}
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			opts_usage(stdout, usage, opts, description);
			exit(EXIT_OK);
		}
		const struct option *o = NULL;
		const char *inline_val = NULL;
		char shown[128];
		if (a[1] == '-') {
			const char *name = a + 2;
			const char *eq = strchr(name, '=');
			size_t len = eq ? (size_t)(eq - name) : strlen(name);
			for (const struct option *p = opts; p->type != OPT_T_END; p++)
				if (p->long_name && strlen(p->long_name) == len &&
				    !strncmp(p->long_name, name, len))
					o = p;
			snprintf(shown, sizeof(shown), "--%.*s", (int)len, name);
			if (eq)
				inline_val = eq + 1;
		} else {
			for (const struct option *p = opts; p->type != OPT_T_END; p++)
				if (p->short_name && p->short_name == a[1])
					o = p;
			snprintf(shown, sizeof(shown), "-%c", a[1]);
			if (a[2])
				inline_val = a + 2;
		}
		if (!o)
			unknown_option(usage, opts, a, shown);
		if (takes_arg(o)) {
			if (!inline_val) {
				if (i + 1 >= argc)
					opts_usage_error(usage, opts, "option '%s' needs a value",
							 shown);
				inline_val = argv[++i];
			}
			set_value(usage, opts, o, inline_val, shown);
		} else {
			if (inline_val)
				opts_usage_error(usage, opts, "option '%s' takes no value", shown);
			set_value(usage, opts, o, NULL, shown);
		}
	}
	argv[npos] = NULL;
	return npos;
}

int opts_output_is_new(const char *path, int force)
{
	struct stat sb;
	if (force || stat(path, &sb))
		return 0;
	return error("'%s' exists; pass --force to replace it, or choose another output", path);
}
