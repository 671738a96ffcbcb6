/* hf_model.h - Hugging Face model folders: config.json and safetensors
 * weights of GPT2LMHeadModel, LlamaForCausalLM and MixtralForCausalLM, to and from our
 * parameter table.
 *
 * Names and layouts (see also asyncpp-import-hf(1)):
 *   GPT-2 (names with or without the "transformer." prefix; Conv1D weights
 *   are stored (in, out), transposed from our (out, in); T marks them):
 *     wte[:V] wte.weight, wpe wpe.weight, h.N.ln1w/b h.N.ln_1.weight/bias,
 *     h.N.qkvw h.N.attn.c_attn.weight (T, columns q | k | v), qkvb .bias,
 *     h.N.attprojw h.N.attn.c_proj.weight (T), h.N.ln2w/b h.N.ln_2,
 *     h.N.fcw h.N.mlp.c_fc.weight (T), h.N.fcprojw h.N.mlp.c_proj.weight (T),
 *     lnfw/b ln_f.weight/bias, head[:V] lm_head.weight (untied only).
 *   Llama (nn.Linear (out, in), no transposes; HF's rotate_half RoPE pairs
 *   dimension i with i + HD/2, as kernels/cpu/cpu_attention.c does, so q
 *   and k rows are not permuted):
 *     wte[:V] model.embed_tokens.weight, h.N.ln1w
 *     model.layers.N.input_layernorm.weight, h.N.qkvw rows q | k | v =
 *     self_attn.{q,k,v}_proj.weight, h.N.attprojw self_attn.o_proj.weight,
 *     h.N.ln2w post_attention_layernorm.weight, h.N.fcw rows gate | up =
 *     mlp.{gate,up}_proj.weight, h.N.fcprojw mlp.down_proj.weight, lnfw
 *     model.norm.weight, head[:V] lm_head.weight (untied only).
 *   Mixtral (a llama whose feed-forward is moe.h's softmax router with
 *   top_k >= 2 and no shared expert; per layer, instead of mlp.*):
 *     h.N.router model.layers.N.block_sparse_moe.gate.weight [E,C],
 *     h.N.experts.M.fcw rows gate | up = block_sparse_moe.experts.M.w1 |
 *     .w3 (.weight, [De,C] each), h.N.experts.M.fcprojw
 *     block_sparse_moe.experts.M.w2.weight [C,De].
 * Buffers that are not parameters are skipped: GPT-2's h.N.attn.bias and
 * h.N.attn.masked_bias, Llama's self_attn.rotary_emb.inv_freq.
 */
#ifndef ASYNCPP_HF_MODEL_H
#define ASYNCPP_HF_MODEL_H

#include "../model.h"
#include "safetensors.h"

/* Read DIR/config.json into *mc (V the config's vocab_size, Vp 0 so that
 * model_init pads it). Unknown model types and architectures, and keys we
 * cannot honour (rope_scaling, attention_bias, mlp_bias, head_dim other
 * than hidden_size / num_attention_heads, ...) are refused by name.
 * *eos gets eos_token_id (-1 when absent). */
int hf_read_config(const char *dir, struct model_config *mc, long *eos);

/* Read the weights of DIR (model.safetensors, or model.safetensors.index.json
 * and its shards) for the model m (built by model_init from hf_read_config's
 * config) into params[m->numel] (zeroed first: padded vocabulary rows stay
 * 0). Missing, misshapen and unexpected tensors are refused by name. */
int hf_read_weights(const char *dir, const struct model *m, float *params);

/* 0 when the mixture-of-experts model c has the Mixtral layout; else -1
 * after an error naming the key that rules it out (model.router = sigmoid,
 * model.shared_expert = 1, model.top_k = 1) and why. */
int hf_moe_check(const struct model_config *c);

/* Write DIR/config.json, DIR/generation_config.json and
 * DIR/model.safetensors (every file atomically; DIR must exist) for m's
 * weights params in dtype. eos is the end-of-text id for bos/eos_token_id
 * (-1: none). */
int hf_write_model(const char *dir, const struct model *m, const float *params,
		   enum st_dtype dtype, long eos);

#endif
