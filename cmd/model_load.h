/* model_load.h - open a checkpoint's newest weights as a one-stage model. */
#ifndef ASYNCPP_MODEL_LOAD_H
#define ASYNCPP_MODEL_LOAD_H

#include <stdint.h>

#include "../io/config/config.h"
#include "../model/model.h"

struct loaded_model {
	char *path;              /* the checkpoint file */
	struct config cfg;       /* its configuration */
	struct model m;
	const struct backend *be;
	struct stage st;         /* the whole model as one stage, B x T */
	float *params;           /* stage arena, backend memory */
	float *host;             /* global arena, host memory */
	long step;
	uint64_t tokenizer_hash;   /* of the training data; 0 when unknown */
	int B;
};

/* path: a checkpoint file or a directory (its newest checkpoint); device
 * overrides train.device when not NULL. */
int loaded_model_open(struct loaded_model *lm, const char *path, const char *device, int B);
void loaded_model_close(struct loaded_model *lm);

#endif
