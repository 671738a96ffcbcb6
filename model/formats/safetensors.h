/* safetensors.h - read and write the safetensors format.
 *
 * File: 8-byte little-endian header length n, n bytes of JSON (padded with
 * spaces to a multiple of 8), then the tensors' raw little-endian data back
 * to back in the order of our parameter table. The JSON maps each tensor
 * name to {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}
 * (byte offsets relative to the start of the data) and holds "__metadata__",
 * string pairs: format "pt", arch, vocab_size, padded_vocab_size, n_layer,
 * d_model, n_head, n_kv_head, head_dim, d_ff, seq_len, tied, norm_eps,
 * rope_theta, and whatever the caller adds.
 *
 * Tensor names are ours (model.h): wte, wpe, h.N.ln1w, h.N.ln1b, h.N.qkvw,
 * h.N.qkvb, h.N.attprojw, h.N.attprojb, h.N.ln2w, h.N.ln2b, h.N.fcw, h.N.fcb,
 * h.N.fcprojw, h.N.fcprojb, lnfw, lnfb, head (only when untied). Matrices are
 * (out, in) row-major, the layout of PyTorch's nn.Linear.weight; vectors
 * have shape [n]. wte and head have Vp rows (padded vocabulary, padding rows
 * never used): take the first vocab_size rows.
 *
 * Mapping to Hugging Face GPT-2 (GPT2LMHeadModel; its Conv1D weights are
 * stored (in, out), so the four matrices marked T must be transposed):
 *   wte[:V]      transformer.wte.weight (and lm_head.weight, tied)
 *   wpe          transformer.wpe.weight
 *   h.N.ln1w/b   transformer.h.N.ln_1.weight/bias
 *   h.N.qkvw     transformer.h.N.attn.c_attn.weight (T)  [rows q | k | v]
 *   h.N.qkvb     transformer.h.N.attn.c_attn.bias
 *   h.N.attprojw transformer.h.N.attn.c_proj.weight (T), attprojb -> .bias
 *   h.N.ln2w/b   transformer.h.N.ln_2.weight/bias
 *   h.N.fcw      transformer.h.N.mlp.c_fc.weight (T),   fcb -> .bias
 *   h.N.fcprojw  transformer.h.N.mlp.c_proj.weight (T), fcprojb -> .bias
 *   lnfw/lnfb    transformer.ln_f.weight/bias
 *
 * Mapping to Hugging Face Llama (LlamaForCausalLM; nn.Linear, no transpose;
 * our RoPE pairs (i, i + HD/2) like HF's rotate_half, so no permutation):
 *   wte[:V]      model.embed_tokens.weight
 *   h.N.ln1w     model.layers.N.input_layernorm.weight
 *   h.N.qkvw     rows [0, NH*HD)            model.layers.N.self_attn.q_proj.weight
 *                rows [NH*HD, +NKV*HD)      model.layers.N.self_attn.k_proj.weight
 *                rows [(NH+NKV)*HD, +NKV*HD) model.layers.N.self_attn.v_proj.weight
 *   h.N.attprojw model.layers.N.self_attn.o_proj.weight
 *   h.N.ln2w     model.layers.N.post_attention_layernorm.weight
 *   h.N.fcw      rows [0, F)  model.layers.N.mlp.gate_proj.weight
 *                rows [F, 2F) model.layers.N.mlp.up_proj.weight
 *   h.N.fcprojw  model.layers.N.mlp.down_proj.weight
 *   lnfw         model.norm.weight
 *   head[:V]     lm_head.weight (tied: wte[:V], tie_word_embeddings = true)
 */
#ifndef ASYNCPP_SAFETENSORS_H
#define ASYNCPP_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "../model.h"

/* Write params (a host arena laid out by m) to path, atomically.
 * metadata_json_pairs, when non-NULL and non-empty, is added to
 * __metadata__: JSON string pairs without braces, e.g.
 * "\"step\": \"1000\", \"run\": \"a\"" (each value must be a string, as
 * safetensors requires; it is checked). Returns 0, or -1 with error(). */
int safetensors_write(const char *path, const struct model *m, const float *params,
		      const char *metadata_json_pairs);

/* ---- any tensors, in F32, F16 or BF16 ---- */

enum st_dtype { ST_F32, ST_F16, ST_BF16 };
/* "F32", "F16", "BF16" */
const char *st_dtype_name(enum st_dtype d);
/* "f32", "f16", "bf16" (the --dtype spelling) -> dtype; -1 when unknown */
int st_dtype_parse(const char *s);

#define ST_MAX_DIMS 8

/* One tensor to write: data holds numel float32 values in row-major order
 * of shape[0..ndim); they are rounded to the file's dtype (half.h). */
struct st_tensor {
	const char *name;
	int ndim;
	int64_t shape[ST_MAX_DIMS];
	const float *data;
};
/* Write n tensors, in the order given, atomically. metadata_json_pairs as
 * for safetensors_write (without the "format" pair, which is always
 * written first). Returns 0, or -1 with error(). */
int st_write(const char *path, const struct st_tensor *t, int n, enum st_dtype dtype,
	     const char *metadata_json_pairs);

/* Reading. st_open checks the whole header: JSON, every entry's dtype (F32,
 * F16 or BF16; others are refused naming the tensor), shape and offsets
 * (the data of all tensors tiles the data area exactly, no overlap, no gap,
 * sizes match shapes), __metadata__ string pairs, unique names, and that
 * the file is as long as the header says. Errors name the file and tensor. */
struct st_file;
int st_open(struct st_file **f, const char *path);
void st_close(struct st_file *f);
const char *st_path(const struct st_file *f);
int st_count(const struct st_file *f);
const char *st_name(const struct st_file *f, int i);
enum st_dtype st_dtype(const struct st_file *f, int i);
int st_ndim(const struct st_file *f, int i);
const int64_t *st_shape(const struct st_file *f, int i);
size_t st_numel(const struct st_file *f, int i);
int st_find(const struct st_file *f, const char *name); /* -1 if absent */
/* A __metadata__ value, or NULL. */
const char *st_meta(const struct st_file *f, const char *key);
/* Read tensor i into out[st_numel] as float32 (widened exactly). */
int st_read(struct st_file *f, int i, float *out);

#endif
