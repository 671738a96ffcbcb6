/* run_paths.c - a run's stored data paths: absolute, found, or explained. */
#include "run_paths.h"

#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../io/util.h"

static const char *const keys[] = {"train", "val", "tokenizer"};

/* path as it is, or against dir (NULL: the working directory) without its
 * leading "./" (malloc'ed); NULL when the working directory is unknown. */
static char *absolute_in(const char *dir, const char *path)
{
	if (path[0] == '/')
		return xstrdup(path);
	char *cwd = dir ? NULL : getcwd(NULL, 0);
	if (!dir && !(dir = cwd))
		return NULL;
	while (path[0] == '.' && path[1] == '/')
		for (path += 2; *path == '/'; path++)
			;
	char *abs = strcmp(path, ".") && *path ? path_join(dir, path) : xstrdup(dir);
	free(cwd);
	return abs;
}

/* A file, a directory, or a glob that matches something. */
static int exists(const char *pattern)
{
	struct stat st;
	if (!stat(pattern, &st))
		return 1;
	glob_t g;
	int found = glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc > 0;
	if (found)
		globfree(&g);
	return found;
}

static void set_path(struct config *cfg, const char *key, const char *path)
{
	config_set_key(cfg, "data", key, path, "the run's stored paths");
}

void run_paths_absolute(struct config *cfg)
{
	for (size_t i = 0; i < ARRAY_SIZE(keys); i++) {
		char *v = config_get_string(cfg, "data", keys[i]);
		char *abs = v[0] && v[0] != '/' ? absolute_in(NULL, v) : NULL;
		if (abs)
			set_path(cfg, keys[i], abs);
		free(abs);
		free(v);
	}
	/* the log files too: a resume from another directory appends to the
	 * run's own, not to a file of that name where it is started */
	static const char *const logs[] = {"metrics", "tensorboard"};
	for (size_t i = 0; i < ARRAY_SIZE(logs); i++) {
		char *v = config_get_string(cfg, "log", logs[i]);
		char *abs = v[0] && v[0] != '/' ? absolute_in(NULL, v) : NULL;
		if (abs)
			config_set_key(cfg, "log", logs[i], abs, "the run's stored paths");
		free(abs);
		free(v);
	}
}

/* The directory the checkpoint's run was started in: its folder less
 * train.out_dir (runs/kjv/ckpt-*.ckpt with out_dir runs/kjv: the folder
 * above runs); NULL when out_dir does not end the folder's path. */
static char *started_in(const char *run_dir, const char *out_dir)
{
	while (out_dir[0] == '.' && out_dir[1] == '/')
		out_dir += 2;
	size_t n = strlen(out_dir), d = strlen(run_dir);
	while (n > 1 && out_dir[n - 1] == '/')
		n--;
	if (!n || out_dir[0] == '/' || n >= d || run_dir[d - n - 1] != '/' ||
	    strncmp(run_dir + d - n, out_dir, n))
		return NULL;
	char *base = xstrdup(run_dir);
	base[d - n - 1 > 0 ? d - n - 1 : 1] = '\0';
	return base;
}

void run_paths_resolve(struct config *cfg, const char *ckpt_path)
{
	char *ck = absolute_in(NULL, ckpt_path);
	if (!ck)
		return;
	char *slash = strrchr(ck, '/');
	*slash = '\0'; /* absolute: there is one; now the run's folder */
	if (!ck[0])
		strcpy(ck, "/");
	char *base = started_in(ck, cfg->train_out_dir);
	for (size_t i = 0; i < ARRAY_SIZE(keys); i++) {
		char *v = config_get_string(cfg, "data", keys[i]);
		const char *dirs[] = {NULL, base, ck};
		for (size_t j = 0; v[0] && v[0] != '/' && j < ARRAY_SIZE(dirs); j++) {
			if (j && !dirs[j])
				continue;
			char *abs = absolute_in(dirs[j], v);
			if (abs && exists(abs)) {
				set_path(cfg, keys[i], abs);
				free(abs);
				break;
			}
			free(abs);
		}
		free(v);
	}
	free(base);
	free(ck);
}

int run_path_check(const struct config *cfg, const char *key, const char *ckpt_path,
		   const char *option)
{
	char *v = config_get_string(cfg, "data", key);
	const char *what = strcmp(key, "tokenizer") ? "matches no shard file or directory"
						    : "is not there";
	const char *where = v[0] == '/' ? "" : " (looked for from the working directory, the "
					       "directory the run was started in and the run's folder)";
	int rc = exists(v) ? 0 : error("data.%s = %s, stored in the checkpoint '%s', %s%s; give %s",
				       key, v, ckpt_path, what, where, option);
	free(v);
	return rc;
}

void run_paths_save(const struct config *cfg, struct run_paths_saved *saved)
{
	for (size_t i = 0; i < ARRAY_SIZE(keys); i++)
		saved->v[i] = config_get_string(cfg, "data", keys[i]);
}

int run_paths_check_kept(const struct config *cfg, struct run_paths_saved *saved,
			 const char *ckpt_path)
{
	static const char *const fixes[] = {"the shards with --set data.train=SHARDS",
					    "the shards with --set data.val=SHARDS",
					    "the tokenizer with --set data.tokenizer=FILE"};
	int rc = 0;
	for (size_t i = 0; i < ARRAY_SIZE(keys); i++) {
		char *v = config_get_string(cfg, "data", keys[i]);
		if (!rc && v[0] && !strcmp(v, saved->v[i]))
			rc = run_path_check(cfg, keys[i], ckpt_path, fixes[i]);
		free(v);
		free(saved->v[i]);
		saved->v[i] = NULL;
	}
	return rc;
}
