/* run_paths.h - the paths a run stores (data.train, data.val,
 * data.tokenizer): absolute when train stores them, found again for a
 * checkpoint that stored them relative, named with their origin when gone. */
#ifndef ASYNCPP_RUN_PATHS_H
#define ASYNCPP_RUN_PATHS_H

#include "../io/config/config.h"

/* Makes the relative ones absolute against the working directory (train,
 * before it stores the configuration in config.ini and the checkpoints). */
void run_paths_absolute(struct config *cfg);
/* A configuration read from the checkpoint ckpt_path: a relative path (a
 * run of an earlier version) is looked for from the working directory, then
 * from the directory train ran in (the checkpoint's folder less
 * train.out_dir), then from the run's folder; the first that exists is
 * stored absolute. One found nowhere is kept as it is (run_path_check). */
void run_paths_resolve(struct config *cfg, const char *ckpt_path);
/* 0 when data.KEY (train, val or tokenizer) names something that exists;
 * else -1 after error() saying it came from ckpt_path and that `option`
 * (e.g. "--data SHARDS") overrides it. */
int run_path_check(const struct config *cfg, const char *key, const char *ckpt_path,
		   const char *option);

/* train --resume: the checkpoint's data.train, val and tokenizer (after
 * run_paths_resolve) are saved before -c and --set apply ... */
struct run_paths_saved {
	char *v[3];
};
void run_paths_save(const struct config *cfg, struct run_paths_saved *saved);
/* ... then each still as stored is checked as run_path_check does, naming
 * "--set data.KEY=..." as the fix; frees saved. */
int run_paths_check_kept(const struct config *cfg, struct run_paths_saved *saved,
			 const char *ckpt_path);

#endif
