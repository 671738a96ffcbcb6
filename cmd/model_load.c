/* model_load.c - a checkpoint's newest weights as a one-stage model, for
 * eval, sample and export. */
#include "model_load.h"

#include <stdlib.h>
#include <string.h>

#include "../io/formats/checkpoint.h"
#include "../io/util.h"
#include "../sched/trainer.h"
#include "run_common.h"
#include "run_paths.h"

int loaded_model_open(struct loaded_model *lm, const char *path, const char *device, int B)
{
	memset(lm, 0, sizeof(*lm));
	struct ckpt *k;
	lm->path = find_checkpoint(path);
	if (!lm->path || ckpt_open(&k, lm->path))
		return -1;
	config_defaults(&lm->cfg);
	/* a corrupt file is rejected even where the damage is in a part this
	 * command would not read (optimizer state) */
	int rc = ckpt_verify(k);
	if (!rc)
		rc = config_load_string(&lm->cfg, ckpt_config(k), lm->path);
	if (!rc) /* a run of an earlier version stored them as given */
		run_paths_resolve(&lm->cfg, lm->path);
	if (!rc && device)
		rc = config_set_key(&lm->cfg, "train", "device", device, "--device");
	/* train.act_dtype is how the run stored activations: a bf16 run's
	 * checkpoint is read in bf16 on the device asked for (cpu and cuda both
	 * have bf16 storage); auto, the default, is resolved for that device
	 * (bf16 on cuda, f32 on cpu), as for training */
	if (!rc && !(lm->be = backend_from_config(&lm->cfg)))
		rc = -1;
	if (!rc)
		rc = model_from_ckpt_config(&lm->m, &lm->cfg, (int)lm->cfg.model_vocab_size,
					    lm->path);
	if (!rc) {
		lm->host = xmalloc(st_mult(lm->m.numel, sizeof(float)));
		rc = ckpt_load_weights(k, &lm->m, lm->host, 0);
	}
	if (!rc)
		rc = ckpt_meta_long(k, "step", &lm->step);
	set_error_quiet(1); /* older checkpoints and imports lack it */
	if (!rc && ckpt_meta_u64(k, "tokenizer_hash", &lm->tokenizer_hash))
		lm->tokenizer_hash = 0;
	set_error_quiet(0);
	ckpt_close(k);
	if (rc)
		return -1;
	lm->B = B;
	if (stage_init(&lm->st, &lm->m, lm->be, NULL, 0, B, lm->m.cfg.T, 1))
		return -1;
	lm->params = lm->be->alloc(lm->st.numel * sizeof(float));
	float *arena = xmalloc(st_mult(lm->st.numel, sizeof(float)));
	stage_gather(&lm->st, arena, lm->host);
	lm->be->to_device(lm->params, arena, lm->st.numel * sizeof(float));
	free(arena);
	return 0;
}

void loaded_model_close(struct loaded_model *lm)
{
	if (lm->be) {
		lm->be->free(lm->params);
		stage_free(&lm->st);
		model_free(&lm->m);
	}
	free(lm->host);
	free(lm->path);
	config_free(&lm->cfg);
	memset(lm, 0, sizeof(*lm));
}
