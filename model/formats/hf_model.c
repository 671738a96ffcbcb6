/* hf_model.c - Hugging Face config.json and weights (see hf_model.h). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf_model.h"
#include "../../io/text/json.h"
#include "../../io/util.h"

/* ---- config.json ---- */

struct cfgr {
	const char *path;
	const struct json *root;
};

/* key absent or null: *out = def (required: an error) */
static int cfg_int(const struct cfgr *c, const char *key, int required, long def, long lo,
		   long hi, long *out)
{
	const struct json *j = json_get(c->root, key);
	if (!j || j->type == JSON_NULL) {
		if (required)
			return error("%s: no '%s'", c->path, key);
		*out = def;
		return 0;
	}
	if (j->type != JSON_NUMBER || !j->is_int || j->i < lo || j->i > hi)
		return error("%s:%d: '%s' must be an integer in [%ld, %ld]", c->path, j->line, key, lo,
			     hi);
	*out = (long)j->i;
	return 0;
}

static int cfg_num(const struct cfgr *c, const struct json *obj, const char *key, double def,
		   double *out)
{
	const struct json *j = json_get(obj, key);
	if (!j || j->type == JSON_NULL) {
		*out = def;
		return 0;
	}
	if (j->type != JSON_NUMBER || !(j->num > 0) || !isfinite(j->num))
		return error("%s:%d: '%s' must be a positive number", c->path, j->line, key);
	*out = j->num;
	return 0;
}

static int cfg_bool(const struct cfgr *c, const char *key, int def, int *out)
{
	const struct json *j = json_get(c->root, key);
	if (!j || j->type == JSON_NULL) {
		*out = def;
		return 0;
	}
	if (j->type != JSON_TRUE && j->type != JSON_FALSE)
		return error("%s:%d: '%s' must be true or false", c->path, j->line, key);
	*out = j->type == JSON_TRUE;
	return 0;
}

static const char *cfg_str(const struct cfgr *c, const char *key, const char *def)
{
	const struct json *j = json_get(c->root, key);
	if (!j || j->type == JSON_NULL)
		return def;
	return j->type == JSON_STRING ? j->str : NULL;
}

/* A key whose value we cannot honour unless it is `want` (or absent). */
static int cfg_must(const struct cfgr *c, const char *key, enum json_type want,
		    const char *why)
{
	const struct json *j = json_get(c->root, key);
	if (!j || j->type == want)
		return 0;
	if (want == JSON_NULL && j->type == JSON_NULL)
		return 0;
	return error("%s:%d: '%s' is %s; asyncpp implements only %s (%s)", c->path, j->line, key,
		     j->type == JSON_TRUE ? "true" : j->type == JSON_FALSE ? "false" :
		     json_type_name(j->type), want == JSON_NULL ? "null" :
		     want == JSON_TRUE ? "true" : "false", why);
}

/* architectures, when present, must name cls */
static int cfg_arch(const struct cfgr *c, const char *cls)
{
	const struct json *a = json_get(c->root, "architectures");
	if (!a || a->type == JSON_NULL)
		return 0;
	if (a->type != JSON_ARRAY || a->len != 1 || a->kids[0].type != JSON_STRING)
		return error("%s:%d: 'architectures' must list one class name", c->path, a->line);
	if (strcmp(a->kids[0].str, cls))
		return error("%s:%d: unknown architecture '%s' (asyncpp imports %s for this "
			     "model_type)", c->path, a->line, a->kids[0].str, cls);
	return 0;
}

static int read_gpt2(const struct cfgr *c, struct model_config *mc)
{
	long V = 0, C = 0, L = 0, NH = 0, T = 0, F = 0;
	double eps = 0;
	int tied = 0;
	const char *act = cfg_str(c, "activation_function", "gelu_new");
	if (cfg_arch(c, "GPT2LMHeadModel") || cfg_int(c, "vocab_size", 1, 0, 1, 1 << 24, &V) ||
	    cfg_int(c, "n_embd", 1, 0, 1, 65536, &C) || cfg_int(c, "n_layer", 1, 0, 1, 4096, &L) ||
	    cfg_int(c, "n_head", 1, 0, 1, 4096, &NH) || cfg_int(c, "n_inner", 0, 0, 1, 1 << 20, &F) ||
	    cfg_num(c, c->root, "layer_norm_epsilon", 1e-5, &eps) ||
	    cfg_bool(c, "tie_word_embeddings", 1, &tied))
		return -1;
	if (cfg_int(c, "n_positions", 0, -1, 1, 1 << 20, &T) ||
	    (T < 0 && cfg_int(c, "n_ctx", 1, 0, 1, 1 << 20, &T)))
		return -1;
	if (!act || (strcmp(act, "gelu_new") && strcmp(act, "gelu_pytorch_tanh")))
		return error("%s: 'activation_function' is '%s'; asyncpp implements only gelu_new "
			     "(the tanh approximation)", c->path, act ? act : "not a string");
	if (cfg_must(c, "scale_attn_weights", JSON_TRUE, "scores scaled by 1/sqrt(head width)") ||
	    cfg_must(c, "scale_attn_by_inverse_layer_idx", JSON_FALSE, "no per-layer scaling") ||
	    cfg_must(c, "add_cross_attention", JSON_FALSE, "a decoder-only model"))
		return -1;
	mc->arch = ARCH_GPT2;
	mc->V = (int)V;
	mc->C = (int)C;
	mc->L = (int)L;
	mc->NH = mc->NKV = (int)NH;
	mc->T = (int)T;
	mc->F = F ? (int)F : 4 * (int)C;
	mc->eps = (float)eps;
	mc->tied = tied;
	return 0;
}

/* LlamaForCausalLM, or (cls MixtralForCausalLM) the attention and norms of
 * a Mixtral, whose defaults differ: rope_theta 1e6, num_key_value_heads 8
 * (required here rather than guessed). */
static int read_llama(const struct cfgr *c, struct model_config *mc, const char *cls)
{
	long V = 0, C = 0, L = 0, NH = 0, NKV = 0, HD = 0, T = 0, F = 0, tp = 0;
	double eps = 0, theta = 0;
	int mixtral = !strcmp(cls, "MixtralForCausalLM");
	int tied = 0;
	const char *act = cfg_str(c, "hidden_act", "silu");
	/* what we cannot honour first: the message names it */
	if (cfg_must(c, "rope_scaling", JSON_NULL, "plain RoPE") ||
	    cfg_must(c, "attention_bias", JSON_FALSE, "no biases") ||
	    cfg_must(c, "mlp_bias", JSON_FALSE, "no biases"))
		return -1;
	if (cfg_arch(c, cls) || cfg_int(c, "vocab_size", 1, 0, 1, 1 << 24, &V) ||
	    cfg_int(c, "hidden_size", 1, 0, 1, 65536, &C) ||
	    cfg_int(c, "intermediate_size", 1, 0, 1, 1 << 20, &F) ||
	    cfg_int(c, "num_hidden_layers", 1, 0, 1, 4096, &L) ||
	    cfg_int(c, "num_attention_heads", 1, 0, 1, 4096, &NH) ||
	    cfg_int(c, "num_key_value_heads", mixtral, NH, 1, 4096, &NKV) ||
	    cfg_int(c, "max_position_embeddings", 1, 0, 1, 1 << 20, &T) ||
	    cfg_int(c, "head_dim", 0, C / NH, 1, 65536, &HD) ||
	    cfg_int(c, "pretraining_tp", 0, 1, 1, 1 << 20, &tp) ||
	    cfg_num(c, c->root, "rms_norm_eps", 1e-6, &eps) ||
	    cfg_num(c, c->root, "rope_theta", mixtral ? 1e6 : 10000.0, &theta) ||
	    cfg_bool(c, "tie_word_embeddings", 0, &tied))
		return -1;
	if (!act || strcmp(act, "silu"))
		return error("%s: 'hidden_act' is '%s'; asyncpp implements only silu (SwiGLU)",
			     c->path, act ? act : "not a string");
	if (C % NH || HD != C / NH)
		return error("%s: 'head_dim' %ld is not hidden_size / num_attention_heads (%ld / "
			     "%ld); asyncpp needs that", c->path, HD, C, NH);
	if (NH % NKV)
		return error("%s: num_attention_heads %ld is not a multiple of "
			     "num_key_value_heads %ld", c->path, NH, NKV);
	if (tp != 1)
		return error("%s: 'pretraining_tp' is %ld; asyncpp implements only 1", c->path, tp);
	/* transformers 5 keeps RoPE settings in rope_parameters */
	const struct json *rp = json_get(c->root, "rope_parameters");
	if (rp && rp->type != JSON_NULL) {
		const struct json *type = json_get(rp, "rope_type");
		if (rp->type != JSON_OBJECT || (type && (type->type != JSON_STRING ||
							 strcmp(type->str, "default"))))
			return error("%s:%d: 'rope_parameters' must have rope_type \"default\"; "
				     "asyncpp implements only plain RoPE", c->path, rp->line);
		for (size_t i = 0; i < rp->len; i++)
			if (strcmp(rp->kids[i].key, "rope_type") && strcmp(rp->kids[i].key, "rope_theta"))
				return error("%s:%d: 'rope_parameters' has '%s'; asyncpp implements "
					     "only plain RoPE", c->path, rp->line, rp->kids[i].key);
		if (cfg_num(c, rp, "rope_theta", theta, &theta))
			return -1;
	}
	mc->arch = ARCH_LLAMA;
	mc->V = (int)V;
	mc->C = (int)C;
	mc->L = (int)L;
	mc->NH = (int)NH;
	mc->NKV = (int)NKV;
	mc->T = (int)T;
	mc->F = (int)F;
	mc->eps = (float)eps;
	mc->rope_theta = (float)theta;
	mc->tied = tied;
	return 0;
}

/* MixtralForCausalLM: a llama whose feed-forward is a softmax-routed
 * mixture of SwiGLU experts, top-k renormalised, no shared expert (moe.h's
 * softmax router with K >= 2; asyncpp's K = 1 keeps the score as the gate
 * where Mixtral's renormalised one gate is 1.0). */
static int read_mixtral(const struct cfgr *c, struct model_config *mc)
{
	long E = 0, K = 0, window = 0;
	double aux = 0;
	if (read_llama(c, mc, "MixtralForCausalLM") ||
	    cfg_int(c, "num_local_experts", 1, 0, 1, 4096, &E) ||
	    cfg_int(c, "num_experts_per_tok", 1, 0, 1, 4096, &K) ||
	    cfg_int(c, "sliding_window", 0, -1, 1, 1L << 40, &window))
		return -1;
	const struct json *j = json_get(c->root, "router_aux_loss_coef");
	if (!j || j->type == JSON_NULL)
		aux = 0.001; /* MixtralConfig's default */
	else if (j->type != JSON_NUMBER || !(j->num >= 0) || !isfinite(j->num))
		return error("%s:%d: 'router_aux_loss_coef' must be a number >= 0", c->path, j->line);
	else
		aux = j->num;
	j = json_get(c->root, "router_jitter_noise");
	if (j && j->type != JSON_NULL && (j->type != JSON_NUMBER || j->num != 0))
		return error("%s:%d: 'router_jitter_noise' is not 0; asyncpp's router has no "
			     "jitter (multiplicative noise on its inputs in training)", c->path,
			     j->line);
	if (K > E)
		return error("%s: 'num_experts_per_tok' %ld is more than 'num_local_experts' %ld",
			     c->path, K, E);
	if (K == 1)
		return error("%s: 'num_experts_per_tok' is 1: Mixtral renormalises the top-k weights, "
			     "so its one gate is 1.0, where asyncpp's model.top_k = 1 gate is the "
			     "router's score (Switch); asyncpp imports 2 or more", c->path);
	/* a window as long as the context masks nothing */
	if (window >= 0 && window < mc->T)
		return error("%s: 'sliding_window' %ld is shorter than 'max_position_embeddings' %d; "
			     "asyncpp implements only full causal attention", c->path, window, mc->T);
	mc->E = (int)E;
	mc->K = (int)K;
	mc->De = mc->F;
	mc->router = ROUTER_SOFTMAX;
	mc->aux_coef = (float)aux;
	mc->z_coef = 0; /* Mixtral's objective has no z-loss */
	return 0;
}

int hf_read_config(const char *dir, struct model_config *mc, long *eos)
{
	char *path = path_join(dir, "config.json");
	struct json *root;
	int rc = -1;
	memset(mc, 0, sizeof(*mc));
	*eos = -1;
	if (json_parse_file(&root, path)) {
		free(path);
		return -1;
	}
	struct cfgr c = {path, root};
	const char *type = cfg_str(&c, "model_type", NULL);
	if (root->type != JSON_OBJECT)
		error("%s: not a JSON object", path);
	else if (!type)
		error("%s: no 'model_type' string", path);
	else if (!strcmp(type, "gpt2"))
		rc = read_gpt2(&c, mc);
	else if (!strcmp(type, "llama"))
		rc = read_llama(&c, mc, "LlamaForCausalLM");
	else if (!strcmp(type, "mixtral"))
		rc = read_mixtral(&c, mc);
	else
		error("%s: unknown architecture: model_type '%s' (asyncpp imports gpt2, llama and "
		      "mixtral)", path, type);
	const struct json *e = json_get(root, "eos_token_id");
	if (!rc && e && e->type == JSON_NUMBER && e->is_int && e->i >= 0 && e->i < mc->V)
		*eos = (long)e->i;
	json_free(root);
	free(path);
	return rc;
}

/* ---- the name map ---- */

/* One HF tensor: rows [row0, row0+rows) of our tensor `param`; HF stores it
 * as [rows, cols] ([rows] for a vector), or [cols, rows] when transposed. */
struct piece {
	char name[128];
	int param;
	int row0, rows;
	int transpose;
};

struct pieces {
	struct piece *p;
	int n, cap;
};

static void add(struct pieces *ps, const struct model *m, const char *pname, int row0, int rows,
		int transpose, const char *fmt, ...) PRINTF_LIKE(7, 8);
static void add(struct pieces *ps, const struct model *m, const char *pname, int row0, int rows,
		int transpose, const char *fmt, ...)
{
	va_list ap;
	if (ps->n == ps->cap) {
		ps->cap = ps->cap ? 2 * ps->cap : 64;
		ps->p = xrealloc(ps->p, st_mult(ps->cap, sizeof(*ps->p)));
	}
	struct piece *p = &ps->p[ps->n++];
	va_start(ap, fmt);
	vsnprintf(p->name, sizeof(p->name), fmt, ap);
	va_end(ap);
	p->param = model_find_param(m, pname);
	p->row0 = row0;
	p->rows = rows < 0 ? m->params[p->param].rows : rows;
	p->transpose = transpose;
}

/* Layer l's Mixtral feed-forward: the router is block_sparse_moe.gate; an
 * expert's fcw rows are [gate | up] (swiglu's first half goes through the
 * SiLU), i.e. w1 (SiLU'd) then w3, and fcprojw is w2. */
static void map_moe_layer(const struct model *m, int l, struct pieces *ps)
{
	int De = m->cfg.De;
	char n[48];
	snprintf(n, sizeof(n), "h.%d.router", l);
	add(ps, m, n, 0, -1, 0, "model.layers.%d.block_sparse_moe.gate.weight", l);
	for (int e = 0; e < m->cfg.E; e++) {
		snprintf(n, sizeof(n), "h.%d.experts.%d.fcw", l, e);
		add(ps, m, n, 0, De, 0, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, e);
		add(ps, m, n, De, De, 0, "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l,
		    e);
		snprintf(n, sizeof(n), "h.%d.experts.%d.fcprojw", l, e);
		add(ps, m, n, 0, -1, 0, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, e);
	}
}

/* Every HF tensor of m, prefix ("transformer." or "") for GPT-2's names. */
static void map_model(const struct model *m, const char *prefix, struct pieces *ps)
{
	const struct model_config *c = &m->cfg;
	char n[48];
#define P(fmt, ...) (snprintf(n, sizeof(n), fmt, __VA_ARGS__), n)
	if (c->arch == ARCH_GPT2) {
		add(ps, m, "wte", 0, c->V, 0, "%swte.weight", prefix);
		add(ps, m, "wpe", 0, -1, 0, "%swpe.weight", prefix);
		for (int l = 0; l < c->L; l++) {
			static const char *const ours[] = {"ln1w", "ln1b", "qkvw", "qkvb", "attprojw",
							   "attprojb", "ln2w", "ln2b", "fcw", "fcb",
							   "fcprojw", "fcprojb"};
			static const char *const theirs[] = {
				"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
				"attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
				"mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight",
				"mlp.c_proj.bias"};
			for (int k = 0; k < 12; k++)
				add(ps, m, P("h.%d.%s", l, ours[k]), 0, -1, k % 2 == 0 && k != 0 && k != 6,
				    "%sh.%d.%s", prefix, l, theirs[k]);
		}
		add(ps, m, "lnfw", 0, -1, 0, "%sln_f.weight", prefix);
		add(ps, m, "lnfb", 0, -1, 0, "%sln_f.bias", prefix);
	} else {
		int q = c->NH * c->HD, kv = c->NKV * c->HD;
		add(ps, m, "wte", 0, c->V, 0, "model.embed_tokens.weight");
		for (int l = 0; l < c->L; l++) {
			add(ps, m, P("h.%d.ln1w", l), 0, -1, 0, "model.layers.%d.input_layernorm.weight",
			    l);
			add(ps, m, P("h.%d.qkvw", l), 0, q, 0, "model.layers.%d.self_attn.q_proj.weight",
			    l);
			add(ps, m, P("h.%d.qkvw", l), q, kv, 0,
			    "model.layers.%d.self_attn.k_proj.weight", l);
			add(ps, m, P("h.%d.qkvw", l), q + kv, kv, 0,
			    "model.layers.%d.self_attn.v_proj.weight", l);
			add(ps, m, P("h.%d.attprojw", l), 0, -1, 0,
			    "model.layers.%d.self_attn.o_proj.weight", l);
			add(ps, m, P("h.%d.ln2w", l), 0, -1, 0,
			    "model.layers.%d.post_attention_layernorm.weight", l);
			if (c->E) {
				map_moe_layer(m, l, ps);
				continue;
			}
			add(ps, m, P("h.%d.fcw", l), 0, c->F, 0, "model.layers.%d.mlp.gate_proj.weight",
			    l);
			add(ps, m, P("h.%d.fcw", l), c->F, c->F, 0, "model.layers.%d.mlp.up_proj.weight",
			    l);
			add(ps, m, P("h.%d.fcprojw", l), 0, -1, 0, "model.layers.%d.mlp.down_proj.weight",
			    l);
		}
		add(ps, m, "lnfw", 0, -1, 0, "model.norm.weight");
	}
	if (!c->tied)
		add(ps, m, "head", 0, c->V, 0, "lm_head.weight");
#undef P
}

/* The HF shape of piece p: dims into shape, returns ndim. */
static int piece_shape(const struct model *m, const struct piece *p, int64_t *shape)
{
	const struct param_info *pi = &m->params[p->param];
	if (!pi->cols) {
		shape[0] = p->rows;
		return 1;
	}
	shape[0] = p->transpose ? pi->cols : p->rows;
	shape[1] = p->transpose ? p->rows : pi->cols;
	return 2;
}

static void shape_str(char *s, size_t cap, const int64_t *shape, int ndim)
{
	size_t k = 0;
	k += snprintf(s + k, cap - k, "[");
	for (int d = 0; d < ndim && k < cap; d++)
		k += snprintf(s + k, cap - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
	if (k < cap)
		snprintf(s + k, cap - k, "]");
}

/* ---- reading the weights ---- */

struct hf_tensors {
	struct st_file **f;
	int nf;
	struct { int file, idx; } *t;
	int n;
};

static void tensors_free(struct hf_tensors *ts)
{
	for (int i = 0; i < ts->nf; i++)
		st_close(ts->f[i]);
	free(ts->f);
	free(ts->t);
}

static const char *tname(const struct hf_tensors *ts, int k)
{
	return st_name(ts->f[ts->t[k].file], ts->t[k].idx);
}

static int tfind(const struct hf_tensors *ts, const char *name)
{
	for (int k = 0; k < ts->n; k++)
		if (!strcmp(tname(ts, k), name))
			return k;
	return -1;
}

static int add_file(struct hf_tensors *ts, const char *path)
{
	struct st_file *f;
	if (st_open(&f, path))
		return -1;
	ts->f = xrealloc(ts->f, st_mult(ts->nf + 1, sizeof(*ts->f)));
	ts->f[ts->nf++] = f;
	ts->t = xrealloc(ts->t, st_mult(ts->n + st_count(f) + 1, sizeof(*ts->t)));
	for (int i = 0; i < st_count(f); i++) {
		if (tfind(ts, st_name(f, i)) >= 0)
			return error("%s: tensor '%s' is also in another shard", path, st_name(f, i));
		ts->t[ts->n].file = ts->nf - 1;
		ts->t[ts->n].idx = i;
		ts->n++;
	}
	return 0;
}

/* model.safetensors, or the shards of model.safetensors.index.json */
static int open_tensors(const char *dir, struct hf_tensors *ts)
{
	char *single = path_join(dir, "model.safetensors"), *index = NULL;
	struct json *root = NULL;
	int rc = -1;
	FILE *probe = fopen(single, "rb");
	if (probe) {
		fclose(probe);
		rc = add_file(ts, single);
		goto out;
	}
	index = path_join(dir, "model.safetensors.index.json");
	probe = fopen(index, "rb");
	if (!probe) {
		error("%s: no model.safetensors or model.safetensors.index.json (only safetensors "
		      "weights are read)", dir);
		goto out;
	}
	fclose(probe);
	if (json_parse_file(&root, index))
		goto out;
	const struct json *wm = json_get(root, "weight_map");
	if (!wm || wm->type != JSON_OBJECT || !wm->len) {
		error("%s: no 'weight_map' object", index);
		goto out;
	}
	/* open each shard once, in order of first mention */
	for (size_t i = 0; i < wm->len; i++) {
		const struct json *v = &wm->kids[i];
		if (v->type != JSON_STRING || !v->len || strchr(v->str, '/') ||
		    strlen(v->str) != v->len) {
			error("%s:%d: tensor '%s': the shard must be a file name in %s", index, v->line,
			      v->key, dir);
			goto out;
		}
		int seen = 0;
		for (size_t j = 0; j < i && !seen; j++)
			seen = !strcmp(wm->kids[j].str, v->str);
		if (!seen) {
			char *shard = path_join(dir, v->str);
			int bad = add_file(ts, shard);
			free(shard);
			if (bad)
				goto out;
		}
	}
	/* the index and the shards agree */
	for (size_t i = 0; i < wm->len; i++) {
		int k = tfind(ts, wm->kids[i].key);
		char *shard = path_join(dir, wm->kids[i].str);
		int ok = k >= 0 && !strcmp(st_path(ts->f[ts->t[k].file]), shard);
		free(shard);
		if (!ok) {
			error("%s: tensor '%s' is not in shard %s", index, wm->kids[i].key,
			      wm->kids[i].str);
			goto out;
		}
	}
	if ((size_t)ts->n != wm->len) {
		for (int k = 0; k < ts->n; k++)
			if (!json_get(wm, tname(ts, k))) {
				error("%s: tensor '%s' is not in %s", st_path(ts->f[ts->t[k].file]),
				      tname(ts, k), index);
				goto out;
			}
		error("%s: a tensor is listed twice in weight_map", index);
		goto out;
	}
	rc = 0;
out:
	json_free(root);
	free(single);
	free(index);
	return rc;
}

/* Buffers saved by some versions that are not parameters. */
static int is_buffer(const char *name, const int64_t *shape, int ndim)
{
	const char *dot = strrchr(name, '.');
	if (!dot)
		return 0;
	if (!strcmp(dot, ".masked_bias") || (!strcmp(dot, ".bias") && ndim == 4 &&
					     dot - name > 5 && !memcmp(dot - 5, ".attn", 5)))
		return 1;
	return !strcmp(dot, ".inv_freq") && ndim == 1 && strstr(name, "rotary_emb");
}

int hf_read_weights(const char *dir, const struct model *m, float *params)
{
	struct hf_tensors ts = {0};
	struct pieces ps = {0};
	unsigned char *used = NULL;
	float *tmp = NULL;
	size_t tmp_cap = 0;
	int rc = -1;
	memset(params, 0, m->numel * sizeof(float));
	if (open_tensors(dir, &ts))
		goto out;
	const char *prefix = "";
	if (m->cfg.arch == ARCH_GPT2 && tfind(&ts, "wte.weight") < 0)
		prefix = "transformer.";
	map_model(m, prefix, &ps);
	used = xcalloc(ts.n + 1, 1);
	for (int i = 0; i < ps.n; i++) {
		const struct piece *p = &ps.p[i];
		const struct param_info *pi = &m->params[p->param];
		int k = tfind(&ts, p->name);
		if (k < 0) {
			error("%s: missing tensor '%s'", ts.nf == 1 ? st_path(ts.f[0]) : dir, p->name);
			goto out;
		}
		struct st_file *f = ts.f[ts.t[k].file];
		int idx = ts.t[k].idx;
		int64_t want[2];
		int nd = piece_shape(m, p, want);
		if (st_ndim(f, idx) != nd || memcmp(st_shape(f, idx), want, nd * sizeof(int64_t))) {
			char a[64], b[64];
			shape_str(a, sizeof(a), st_shape(f, idx), st_ndim(f, idx));
			shape_str(b, sizeof(b), want, nd);
			error("%s: tensor '%s' has shape %s, expected %s", st_path(f), p->name, a, b);
			goto out;
		}
		used[k] = 1;
		size_t numel = st_numel(f, idx), cols = pi->cols ? (size_t)pi->cols : 1;
		if (numel > tmp_cap) {
			free(tmp);
			tmp = xmalloc(st_mult(numel, sizeof(float)));
			tmp_cap = numel;
		}
		if (st_read(f, idx, tmp))
			goto out;
		size_t at;
		if (floats_nonfinite(tmp, numel, &at)) {
			error("%s: tensor '%s' holds %g at index %zu: NaN or infinite weights are not "
			      "imported", st_path(f), p->name, (double)tmp[at], at);
			goto out;
		}
		float *dst = params + pi->offset + (size_t)p->row0 * cols;
		if (!p->transpose) {
			memcpy(dst, tmp, numel * sizeof(float));
		} else { /* HF [cols, rows] -> ours [rows, cols] */
			for (size_t r = 0; r < (size_t)p->rows; r++)
				for (size_t c = 0; c < cols; c++)
					dst[r * cols + c] = tmp[c * p->rows + r];
		}
	}
	for (int k = 0; k < ts.n; k++) {
		struct st_file *f = ts.f[ts.t[k].file];
		int idx = ts.t[k].idx;
		if (!used[k] && !is_buffer(tname(&ts, k), st_shape(f, idx), st_ndim(f, idx))) {
			error("%s: unexpected tensor '%s' (not part of this %s model%s)", st_path(f),
			      tname(&ts, k), m->cfg.arch == ARCH_GPT2 ? "gpt2" :
			      m->cfg.E ? "mixtral" : "llama",
			      !strcmp(tname(&ts, k), "lm_head.weight") && m->cfg.tied ?
				      ": tie_word_embeddings is true" : "");
			goto out;
		}
	}
	rc = 0;
out:
	free(tmp);
	free(used);
	free(ps.p);
	tensors_free(&ts);
	return rc;
}

/* ---- writing ---- */

/* The shortest decimal that reads back as the same float, JSON-shaped. */
static void put_float(struct buf *b, float v)
{
	char s[48];
	for (int prec = 1; prec <= 9; prec++) {
		snprintf(s, sizeof(s), "%.*g", prec, v);
		if (strtof(s, NULL) == v)
			break;
	}
	buf_append(b, s, strlen(s));
	if (!strpbrk(s, ".e"))
		buf_append(b, ".0", 2);
}

static void put(struct buf *b, const char *fmt, ...) PRINTF_LIKE(2, 3);
static void put(struct buf *b, const char *fmt, ...)
{
	char s[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(s, sizeof(s), fmt, ap);
	va_end(ap);
	if (n > 0)
		buf_append(b, s, MIN((size_t)n, sizeof(s) - 1));
}

static int write_text(const char *dir, const char *name, const struct buf *b)
{
	char *path = path_join(dir, name);
	int rc = atomic_write_file(path, b->data, b->len);
	free(path);
	return rc;
}

static const char *torch_dtype(enum st_dtype d)
{
	return d == ST_F16 ? "float16" : d == ST_BF16 ? "bfloat16" : "float32";
}

/* The fields Llama's and Mixtral's config.json share, from the opening
 * brace to rope_theta's value (width ff: d_ff, or an expert's) */
static void llama_fields(struct buf *b, const struct model_config *c, const char *arch,
			 const char *type, int ff)
{
	put(b, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n", arch, type);
	put(b, "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n",
	    c->V, c->C, ff);
	put(b, "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n", c->L, c->NH);
	put(b, "  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n", c->NKV, c->HD);
	put(b, "  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": ", c->T);
	put_float(b, c->eps);
	put(b, ",\n  \"rope_theta\": ");
	put_float(b, c->rope_theta);
}

static void config_json(struct buf *b, const struct model_config *c, enum st_dtype dtype,
			long eos)
{
	if (c->arch == ARCH_GPT2) {
		put(b, "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n");
		put(b, "  \"vocab_size\": %d,\n  \"n_embd\": %d,\n  \"n_layer\": %d,\n", c->V, c->C,
		    c->L);
		put(b, "  \"n_head\": %d,\n  \"n_positions\": %d,\n  \"n_ctx\": %d,\n", c->NH, c->T,
		    c->T);
		if (c->F == 4 * c->C)
			put(b, "  \"n_inner\": null,\n");
		else
			put(b, "  \"n_inner\": %d,\n", c->F);
		put(b, "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": ");
		put_float(b, c->eps);
		put(b, ",\n  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n");
		put(b, "  \"scale_attn_weights\": true,\n  \"initializer_range\": ");
		put_float(b, c->init_std);
		put(b, ",\n");
	} else if (c->E) {
		llama_fields(b, c, "MixtralForCausalLM", "mixtral", c->De);
		put(b, ",\n  \"sliding_window\": null,\n  \"hidden_act\": \"silu\",\n");
		put(b, "  \"attention_dropout\": 0.0,\n  \"num_local_experts\": %d,\n", c->E);
		put(b, "  \"num_experts_per_tok\": %d,\n  \"router_aux_loss_coef\": ", c->K);
		put_float(b, c->aux_coef);
		put(b, ",\n  \"output_router_logits\": false,\n  \"router_jitter_noise\": 0.0,\n");
		put(b, "  \"initializer_range\": ");
		put_float(b, c->init_std);
		put(b, ",\n");
	} else {
		llama_fields(b, c, "LlamaForCausalLM", "llama", c->F);
		put(b, ",\n  \"rope_scaling\": null,\n  \"hidden_act\": \"silu\",\n");
		put(b, "  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n");
		put(b, "  \"mlp_bias\": false,\n  \"pretraining_tp\": 1,\n  \"initializer_range\": ");
		put_float(b, c->init_std);
		put(b, ",\n");
	}
	put(b, "  \"tie_word_embeddings\": %s,\n", c->tied ? "true" : "false");
	if (eos >= 0)
		put(b, "  \"bos_token_id\": %ld,\n  \"eos_token_id\": %ld,\n", eos, eos);
	put(b, "  \"use_cache\": true,\n  \"torch_dtype\": \"%s\"\n}\n", torch_dtype(dtype));
}

int hf_moe_check(const struct model_config *c)
{
	static const char *const fix = "; use --format safetensors";
	if (c->router != ROUTER_SOFTMAX)
		return error("export --format hf: model.router = sigmoid has no Mixtral layout "
			     "(MixtralForCausalLM routes by a softmax over the experts)%s", fix);
	if (c->shared)
		return error("export --format hf: model.shared_expert = 1 has no Mixtral layout "
			     "(MixtralForCausalLM has no shared expert)%s", fix);
	if (c->K == 1)
		return error("export --format hf: model.top_k = 1 has no Mixtral layout (Mixtral "
			     "renormalises the top-k weights, so its one gate is 1.0, where asyncpp's "
			     "is the router's score)%s", fix);
	return 0;
}

int hf_write_model(const char *dir, const struct model *m, const float *params,
		   enum st_dtype dtype, long eos)
{
	struct pieces ps = {0};
	struct buf b = {0};
	if (m->cfg.E && hf_moe_check(&m->cfg))
		return -1;
	map_model(m, m->cfg.arch == ARCH_GPT2 ? "transformer." : "", &ps);
	struct st_tensor *t = xcalloc(ps.n, sizeof(*t));
	float **owned = xcalloc(ps.n, sizeof(*owned));
	for (int i = 0; i < ps.n; i++) {
		const struct piece *p = &ps.p[i];
		const struct param_info *pi = &m->params[p->param];
		size_t cols = pi->cols ? (size_t)pi->cols : 1;
		const float *src = params + pi->offset + (size_t)p->row0 * cols;
		t[i].name = p->name;
		t[i].ndim = piece_shape(m, p, t[i].shape);
		t[i].data = src;
		if (p->transpose) { /* ours [rows, cols] -> HF [cols, rows] */
			float *d = owned[i] = xmalloc(st_mult(st_mult(p->rows, cols), sizeof(float)));
			for (size_t r = 0; r < (size_t)p->rows; r++)
				for (size_t c = 0; c < cols; c++)
					d[c * p->rows + r] = src[r * cols + c];
			t[i].data = d;
		}
	}
	char *st = path_join(dir, "model.safetensors");
	int rc = st_write(st, t, ps.n, dtype, NULL);
	free(st);
	for (int i = 0; i < ps.n; i++)
		free(owned[i]);
	free(owned);
	free(t);
	free(ps.p);
	if (!rc) {
		config_json(&b, &m->cfg, dtype, eos);
		rc = write_text(dir, "config.json", &b);
	}
	if (!rc) {
		b.len = 0;
		put(&b, "{\n");
		if (eos >= 0)
			put(&b, "  \"bos_token_id\": %ld,\n  \"eos_token_id\": %ld,\n", eos, eos);
		put(&b, "  \"_from_model_config\": true\n}\n");
		rc = write_text(dir, "generation_config.json", &b);
	}
	buf_free(&b);
	return rc;
}
