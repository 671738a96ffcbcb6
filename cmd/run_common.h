/* run_common.h - what train, eval, sample and bench share: building the
 * model from a config, finding checkpoints, device peaks. */
#ifndef ASYNCPP_RUN_COMMON_H
#define ASYNCPP_RUN_COMMON_H

#include "../io/config/config.h"
#include "../kernels/backend.h"
#include "../model/model.h"

/* Model shape from the [model] keys; vocab is used when model.vocab_size
 * is 0. Returns -1 with error() on a bad shape. */
int model_from_config(struct model *m, const struct config *cfg, int vocab);
/* The same for a configuration read from checkpoint CKPT: a bad shape's
 * message names the checkpoint. */
int model_from_ckpt_config(struct model *m, const struct config *cfg, int vocab,
			   const char *ckpt);
/* mkdir -p (cmd/builtin.c). */
int make_dirs(const char *path);
/* A checkpoint path from FILE or DIR (the newest checkpoint in it), malloc'ed. */
char *find_checkpoint(const char *path);
/* Whether NAME (without a directory) is a name train gives a checkpoint:
 * "ckpt-" + the step in at least 8 digits + ".ckpt". */
int checkpoint_name(const char *name);
/* Whether DIR/NAME is a checkpoint train wrote there: a checkpoint_name
 * that is a regular file holding a checkpoint (its magic; an unreadable one
 * counts). A user's "ckpt-best.ckpt", or notes saved as
 * "ckpt-00000002.ckpt", are not: never resumed, rotated or removed. */
int checkpoint_in_dir(const char *dir, const char *name);
/* The checkpoints of DIR (checkpoint_in_dir), sorted by step; returns the
 * count. */
int list_checkpoints(const char *dir, char ***paths);
/* Nominal peak FLOP/s of the device for MFU (CPU: cores x clock x SIMD
 * FMA width; CUDA: the device table). */
double device_peak_flops(const struct backend *be, int threads);
/* model.expert_parallel = N: 0 for N = 1 or a run that can split the
 * experts N ways; else -1 after an error saying what N must divide
 * (model.n_expert, pipeline.data_parallel) or naming the key that rules
 * it out (train.schedule = none, pipeline.transport = nccl). */
int expert_parallel_check(const struct config *cfg);
/* Backend for a config, with threads set. */
const struct backend *backend_from_config(const struct config *cfg);
/* pipeline.devices (one cuda:N per stage) declared as be's lanes, stage s
 * on lane s (empty: nothing to do); 0, or -1 after error() naming what to
 * change. train and bench train call it: eval, sample and export run one
 * stage and ignore the key. */
/* d: the process's distributed runtime (NULL: one process) */
struct dist;
int backend_lanes_from_config(const struct backend *be, const struct config *cfg,
			      const struct dist *d);
/* train.schedule and pipeline.virtual_stages as the stage workers can run
 * them: 0, or -1 after error() when the schedule is one bench schedule
 * draws but the workers do not execute yet (interleaved, zb-h1, zb-v), or
 * virtual stages are asked of another schedule. train and bench train call
 * it before anything runs. */
int run_check_schedule(const struct config *cfg);

#endif
