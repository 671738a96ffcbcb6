/* train_dir.h - what train does to train.out_dir before it writes there, so
 * that no run is lost to another:
 *
 *   one trainer at a time  DIR/train.lock, held with flock(2) for the whole
 *                          run and holding the owner's pid; a second
 *                          trainer on DIR fails naming that pid. The lock
 *                          goes with the process (kill -9 included).
 *   one run per directory  DIR/run-id holds the run's id (0x + 16 hex
 *                          digits). A fresh run draws a new id; a resumed
 *                          run keeps the id of the directory its checkpoint
 *                          lies in. Writing into a directory that holds
 *                          another run's checkpoints or metrics is refused
 *                          unless the user passes --overwrite. Each
 *                          checkpoint records the id (metadata run_id);
 *                          one that records another run's (a copy from
 *                          elsewhere) is never resumed from the folder,
 *                          rotated or removed, only named. Those of older
 *                          versions record none and count as the folder's.
 *   others' files alone    DIR's train.lock, run-id, config.ini,
 *                          samples.txt and checkpoints are train's own,
 *                          recognised by their content (a pid line, "0x" +
 *                          16 hex digits, TRAIN_CONFIG_HEAD, "step ", a
 *                          checkpoint's magic under a ckpt-NNNNNNNN.ckpt
 *                          name): a run refuses to replace (or add to) a
 *                          file of those names that is not, even with
 *                          --overwrite, and leaves other ckpt-*.ckpt files
 *                          alone (never resumed, rotated or removed).
 *   no orphans             temporaries "NAME.tmp.PID" (io/util.h's atomic
 *                          writer) whose writer is gone are removed at the
 *                          start, and said so; --overwrite removes them all.
 *
 * Under MPI only the root calls these (it alone writes in DIR).
 */
#ifndef ASYNCPP_TRAIN_DIR_H
#define ASYNCPP_TRAIN_DIR_H

#include <stdint.h>

/* The first line of the config.ini train writes into its directory. */
#define TRAIN_CONFIG_HEAD "# written by asyncpp "

/* Take DIR's lock (creating DIR/train.lock); *fd stays open for the run.
 * Returns 0, or -1 after error() naming the pid of the trainer that holds
 * it, or the train.lock that is not train's. */
int train_dir_lock(const char *dir, int *fd);
/* 0 when no trainer holds DIR's lock, or -1 after error() naming the pid
 * of the one that does (--resume of a directory with no checkpoint yet).
 * Creates nothing. */
int train_dir_check_free(const char *dir);
/* 0 when DIR's run-id, config.ini, files named ckpt-NNNNNNNN.ckpt and
 * (when samples: sample.every is set) samples.txt are train's or absent;
 * -1 after error() naming the first that is not (the run would replace it
 * or, samples.txt, append to it). */
int train_dir_check_own(const char *dir, int samples);
/* A warning for each file of DIR named ckpt-*.ckpt without a checkpoint's
 * name (run_common.h's checkpoint_name), and for each checkpoint that
 * records another run than DIR/run-id's: it is left alone. */
void train_dir_mention_others(const char *dir);
/* 0 unless DIR holds another run's checkpoint (run_id) named for a step
 * after `from` and at most `to`, which this run would replace when it
 * gets there: then -1 after error() naming it and the fix. */
int train_dir_check_others_ahead(const char *dir, long from, long to);

/* DIR's run id from DIR/run-id; 0 when it has none (a directory written
 * before run ids, or not a run directory) or its run-id is not train's. */
uint64_t train_dir_run_id(const char *dir);
/* The run id a checkpoint records, else (older versions, import-hf's) that
 * of the directory it lies in; 0: none. */
uint64_t train_dir_run_id_of(const char *ckpt_path);
/* The run id the checkpoint's metadata records (run_id); 0 when it records
 * none or cannot be read. */
uint64_t train_dir_ckpt_run_id(const char *ckpt_path);
/* Whether the checkpoint is run id's to resume, rotate or remove: it
 * records id, or no id at all (id 0: every checkpoint is). */
int train_dir_ckpt_of_run(const char *ckpt_path, uint64_t id);
/* DIR's checkpoints (list_checkpoints) that are run id's, by step; the
 * count. */
int train_dir_checkpoints(const char *dir, uint64_t id, char ***paths);
/* Write DIR/run-id atomically. */
int train_dir_set_run_id(const char *dir, uint64_t id);
/* A fresh, non-zero run id (from the kernel's random source). */
uint64_t train_dir_new_run_id(void);

/* Remove DIR's temporaries "NAME.tmp.PID" of the files train writes there
 * (checkpoints, config.ini, run-id, metrics): those whose process is gone,
 * or every one but this process's when all is set. Each removal is reported
 * on stderr unless quiet. Returns how many were removed. */
int train_dir_remove_temporaries(const char *dir, int all, int quiet);

/* Whether the checkpoint file at path lies in directory dir (same directory
 * after resolving links). */
int train_dir_holds(const char *dir, const char *path);

#endif
