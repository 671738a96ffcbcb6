/* config.h - the effective configuration, generated from config_keys.h. */
#ifndef ASYNCPP_CONFIG_H
#define ASYNCPP_CONFIG_H

#include <stdio.h>

#include "config_keys.h"

/* Field type per key type. CHOICE values are stored as strings that are
 * guaranteed to be one of the listed choices. */
#define CFG_FIELD_INT_IN(lo, hi) long
#define CFG_FIELD_FLOAT_IN(lo, hi) double
#define CFG_FIELD_STR char *
#define CFG_FIELD_CHOICE(c) char *
#define CFG_FIELD(type) CFG_FIELD_##type

enum {
#define X(sec, key, type, def, help) CONFIG_KEY_##sec##_##key,
	CONFIG_KEYS(X)
#undef X
	CONFIG_KEY_COUNT
};

struct config {
#define X(sec, key, type, def, help) CFG_FIELD(type) sec##_##key;
	CONFIG_KEYS(X)
#undef X
	/* given[i]: key i was set by a file, --set or a checkpoint (not a
	 * default); config_finish fills only the keys not given */
	unsigned char given[CONFIG_KEY_COUNT];
};

/* One row of the key table, for printing and documentation checks. */
struct config_key_info {
	const char *section, *key;
	const char *type;    /* "int", "float", "string" or "choice" */
	const char *choices; /* "a|b|c" for choice keys, else NULL */
	const char *def, *help;
	double lo, hi;       /* inclusive range of int and float keys */
};
extern const struct config_key_info config_key_table[];
extern const int config_key_count;

/* "lo..hi" or "lo or more": the range of an int or float key, for docs. */
void config_range_text(const struct config_key_info *k, char *out, size_t len);
/* Fill every key with its default. */
void config_defaults(struct config *cfg);
/* Parse an INI file over the current values. Errors name "FILE:LINE". */
int config_load_file(struct config *cfg, const char *path);
/* Parse INI text held in memory; origin names it in errors. */
int config_load_string(struct config *cfg, const char *text, const char *origin);
/* Apply "section.key=value" (from --set). */
int config_set(struct config *cfg, const char *assignment);
/* Set one key; origin (e.g. "run.ini:12" or "--set") prefixes errors. */
int config_set_key(struct config *cfg, const char *section, const char *key,
		   const char *value, const char *origin);
/* After every file and --set: the defaults that follow another key's value
 * (CONFIG_OPTIM_DEFAULTS in config_keys.h) for the keys not given; -1 only
 * for a bad value in that table. */
int config_finish(struct config *cfg);
/* Print the effective configuration as INI that config_load_file reads back. */
void config_print(FILE *fp, const struct config *cfg);
/* Serialise to a malloc'ed INI string (stored in checkpoints). */
char *config_to_string(const struct config *cfg);
/* Where two texts of config_to_string differ: the first differing line as
 * "SECTION.KEY = A on rank RANK_A, but SECTION.KEY = B on rank 0" in msg (a
 * is rank rank_a's text, b rank 0's), or "their lengths differ". Used by
 * the multi-process checks that every rank runs the same configuration
 * (sched/comm/dist.c over MPI, sched/comm/rendezvous.c over TCP). */
void config_first_difference(const char *a, const char *b, int rank_a, char *msg, size_t len);
void config_free(struct config *cfg);
/* Deep copy. */
void config_copy(struct config *dst, const struct config *src);

/* The table row of section.key, or NULL. */
const struct config_key_info *config_key_lookup(const char *section, const char *key);
/* The value of section.key as config_print writes it (malloc'ed), or NULL
 * for an unknown key. */
char *config_get_string(const struct config *cfg, const char *section, const char *key);
/* For commands that take a configuration: defaults, then config_file (when
 * not NULL), then each "section.key=value" of sets in order (--set). cfg
 * need not be initialised. On failure returns -1 after error() and leaves
 * nothing to free; on success the caller frees with config_free(). */
int config_from_args(struct config *cfg, const char *config_file, const char *const *sets,
		     int n_sets);

#endif
