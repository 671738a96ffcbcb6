/* llmc.h - read llm.c's GPT-2 checkpoints (gpt2_124M.bin and friends).
 *
 * Format (llm.c train_gpt2.c): 256 little-endian int32 header
 *   [0] 20240326 (magic), [1] version: 3 = fp32, 5 = bf16, [2] maxT, [3] V,
 *   [4] L, [5] NH, [6] C, [7] Vp, the rest 0;
 * then the parameters, each tensor kind holding all layers back to back:
 *   wte (Vp*C), wpe (maxT*C), ln1w (L*C), ln1b (L*C), qkvw (L*3C*C),
 *   qkvb (L*3C), attprojw (L*C*C), attprojb (L*C), ln2w (L*C), ln2b (L*C),
 *   fcw (L*4C*C), fcb (L*4C), fcprojw (L*C*4C), fcprojb (L*C), lnfw (C),
 *   lnfb (C).
 * Matrices are (out, in) row-major, like ours, so importing only moves each
 * layer's slice to that layer's place in our per-layer arena (model.h).
 */
#ifndef ASYNCPP_LLMC_H
#define ASYNCPP_LLMC_H

#include "../model.h"

#define LLMC_MAGIC 20240326
#define LLMC_VERSION_FP32 3
#define LLMC_VERSION_BF16 5

/* Read an llm.c GPT-2 checkpoint. On success *cfg is a gpt2 model_config
 * (tied, F = 4C, T = maxT, Vp from the file, eps 1e-5) that model_init
 * accepts, and *params a malloc'ed arena of that model's numel floats laid
 * out by our parameter table (free() it). bf16 files (version 5) are widened
 * to fp32 exactly. Sizes are validated against the file's length. Returns
 * -1 with error() naming the file on any problem. */
int llmc_load(const char *path, struct model_config *cfg, float **params);

#endif
