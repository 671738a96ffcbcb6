/* model.c - the parameter table, initialisation and the stages (their
 * parameters, activation slots and scratch: stage_layout.h) of a
 * decoder-only transformer (gpt2 and llama); the forward and backward that
 * run on a stage, written against the backend table in kernels/backend.h,
 * are in pass.c.
 *
 * Legend (as in backend.h): B sequences per micro-batch, T their length,
 * N = B*T rows, C width, NH/NKV heads, HD head width, QKV = (NH+2*NKV)*HD,
 * FC rows of fcw (4C gpt2, 2F llama), FO = width of the MLP activation
 * (4C gpt2, F llama), V/Vp vocabulary / padded vocabulary.
 *
 * A block (llm.c's train_gpt2.c, per layer):
 *   ln1 = norm1(x)                        [N,C]   (+ mean, rstd [N])
 *   qkv = ln1 @ qkvw^T + qkvb             [N,QKV] (llama: RoPE on q, k)
 *   atty = attention(qkv)                 [N,C]   (+ lse [B,NH,T])
 *   res2 = x + atty @ attprojw^T + attprojb
 *   ln2 = norm2(res2)
 *   fch = ln2 @ fcw^T + fcb               [N,FC]
 *   fca = gelu(fch) | swiglu(fch)         [N,FO]
 *   res3 = res2 + fca @ fcprojw^T + fcprojb   (the next block's x)
 * With n_expert > 0 (llama) the last three lines are the mixture of experts
 * of moe.h: res3 = res2 + moe(ln2), its activations saved in the slot.
 * Everything above is saved per slot; the backward reads it and writes
 * activation gradients into the stage's scratch (shared by slots).
 * Activations and their gradients (void * here) are stored in the backend's
 * act_dtype (kernels/act.h); the norms' mean/rstd, lse, losses, weights and
 * parameter gradients are float. Offsets into activations go through
 * act_at() with the element size, never float arithmetic.
 *
 * Nothing here is global or static-mutable: stages run in separate threads.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "moe.h"
#include "stage_layout.h"
#include "../io/config/config.h"
#include "../io/util.h"

static const char *const kind_name[NKIND] = {
	"ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
	"ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb",
	"router", "experts.0.fcw", "experts.0.fcprojw", "shared.fcw", "shared.fcprojw",
};
/* ---- the parameter table ---- */

static void add_param(struct model *m, int *cap, const char *name, int layer, int rows,
		      int cols, int group)
{
	struct param_info *p;

	if (m->n_params == *cap) {
		*cap = *cap ? 2 * *cap : 64;
		m->params = xrealloc(m->params, st_mult(*cap, sizeof(*m->params)));
	}
	p = &m->params[m->n_params++];
	memset(p, 0, sizeof(*p));
	if (layer >= 0)
		snprintf(p->name, sizeof(p->name), "h.%d.%s", layer, name);
	else
		snprintf(p->name, sizeof(p->name), "%s", name);
	p->layer = layer;
	p->rows = rows;
	p->cols = cols;
	p->offset = m->numel;
	p->numel = st_mult(rows, cols > 0 ? cols : 1);
	p->group = group;
	p->decay = cols > 0;
	m->numel = st_add(m->numel, p->numel);
}

/* A mixture-of-experts layer's tensors (model.h); every expert matrix is
 * GROUP_MATRIX (Muon orthogonalises each on its own), the router goes to
 * AdamW (GROUP_OTHER). */
static void add_moe_params(struct model *m, int *cap, int l)
{
	const struct model_config *c = &m->cfg;
	char name[40];

	add_param(m, cap, "router", l, c->E, c->C, GROUP_OTHER);
	for (int e = 0; e < c->E; e++) {
		snprintf(name, sizeof(name), "experts.%d.fcw", e);
		add_param(m, cap, name, l, 2 * c->De, c->C, GROUP_MATRIX);
	}
	for (int e = 0; e < c->E; e++) {
		snprintf(name, sizeof(name), "experts.%d.fcprojw", e);
		add_param(m, cap, name, l, c->C, c->De, GROUP_MATRIX);
	}
	if (c->shared) {
		add_param(m, cap, "shared.fcw", l, 2 * c->De, c->C, GROUP_MATRIX);
		add_param(m, cap, "shared.fcprojw", l, c->C, c->De, GROUP_MATRIX);
	}
}

int model_init(struct model *m, const struct model_config *cfg)
{
	struct model_config c = *cfg;
	int cap = 0, gpt2, l;

	memset(m, 0, sizeof(*m));
	if (c.arch != ARCH_GPT2 && c.arch != ARCH_LLAMA)
		return error("model: unknown architecture %d", c.arch);
	gpt2 = c.arch == ARCH_GPT2;
	if (c.V <= 0 || c.V > (1 << 24))
		return error("model: vocabulary size %d out of range (1..%d)", c.V, 1 << 24);
	if (c.L <= 0 || c.L > 4096)
		return error("model: n_layer %d out of range (1..4096)", c.L);
	if (c.C <= 0 || c.C > (1 << 16))
		return error("model: d_model %d out of range (1..65536)", c.C);
	if (c.NH <= 0 || c.C % c.NH)
		return error("model: d_model %d is not a multiple of n_head %d", c.C, c.NH);
	if (c.T <= 0 || c.T > (1 << 20))
		return error("model: seq_len %d out of range (1..%d)", c.T, 1 << 20);
	if (!c.NKV)
		c.NKV = c.NH;
	if (c.NKV < 0 || c.NH % c.NKV)
		return error("model: n_head %d is not a multiple of n_kv_head %d", c.NH, c.NKV);
	if (gpt2 && c.NKV != c.NH)
		return error("model: gpt2 has no grouped-query attention (n_kv_head %d != n_head %d)",
			     c.NKV, c.NH);
	if (c.HD && c.HD != c.C / c.NH)
		return error("model: head width %d != d_model / n_head = %d", c.HD, c.C / c.NH);
	c.HD = c.C / c.NH;
	if (!gpt2 && c.HD % 2)
		return error("model: RoPE needs an even head width (d_model / n_head = %d)", c.HD);
	if (!c.F)
		c.F = gpt2 ? 4 * c.C : ((int)lround(8.0 * c.C / 3.0) + 63) / 64 * 64;
	if (c.F < 0 || c.F > (1 << 20))
		return error("model: d_ff %d out of range (1..%d)", c.F, 1 << 20);
	if (!c.Vp)
		c.Vp = (c.V + 63) / 64 * 64;
	if (c.Vp < c.V || c.Vp > (1 << 24) + 64)
		return error("model: padded vocabulary %d smaller than vocabulary %d", c.Vp, c.V);
	if (!(c.eps > 0))
		c.eps = 1e-5f;
	if (!(c.rope_theta > 0))
		c.rope_theta = 10000.0f;
	if (!(c.init_std > 0))
		c.init_std = 0.02f;
	c.tied = !!c.tied;
	if (c.E < 0 || c.E > 4096)
		return error("model.n_expert = %d: must be between 0 and 4096", c.E);
	if (c.E) {
		if (gpt2)
			return error("model.n_expert = %d needs model.arch = llama (gpt2 has no "
				     "mixture-of-experts layer)", c.E);
		if (c.K < 1 || c.K > c.E)
			return error("model.top_k = %d: must be between 1 and model.n_expert = %d",
				     c.K, c.E);
		if (!c.De)
			c.De = c.F;
		if (c.De < 0 || c.De > (1 << 20))
			return error("model.d_expert = %d: must be between 1 and %d", c.De, 1 << 20);
		if (c.router != ROUTER_SOFTMAX && c.router != ROUTER_SIGMOID)
			return error("model: unknown router %d", c.router);
		if (!(c.aux_coef >= 0) || !(c.z_coef >= 0))
			return error("model.aux_loss_coef and model.z_loss_coef must be >= 0");
		c.shared = !!c.shared;
	} else {
		/* a dense model: the MoE fields mean nothing */
		c.K = c.De = c.shared = c.router = 0;
		c.aux_coef = c.z_coef = 0.0f;
	}
	m->cfg = c;

	add_param(m, &cap, "wte", -1, c.Vp, c.C, GROUP_OTHER);
	if (gpt2)
		add_param(m, &cap, "wpe", -1, c.T, c.C, GROUP_OTHER);
	for (l = 0; l < c.L; l++) {
		int qkv = qkv_width(&c), fc = fc_rows(&c);
		add_param(m, &cap, "ln1w", l, c.C, 0, GROUP_OTHER);
		if (gpt2)
			add_param(m, &cap, "ln1b", l, c.C, 0, GROUP_OTHER);
		add_param(m, &cap, "qkvw", l, qkv, c.C, GROUP_MATRIX);
		if (gpt2)
			add_param(m, &cap, "qkvb", l, qkv, 0, GROUP_OTHER);
		add_param(m, &cap, "attprojw", l, c.C, c.C, GROUP_MATRIX);
		if (gpt2)
			add_param(m, &cap, "attprojb", l, c.C, 0, GROUP_OTHER);
		add_param(m, &cap, "ln2w", l, c.C, 0, GROUP_OTHER);
		if (gpt2)
			add_param(m, &cap, "ln2b", l, c.C, 0, GROUP_OTHER);
		if (c.E) {
			add_moe_params(m, &cap, l);
			continue;
		}
		add_param(m, &cap, "fcw", l, fc, c.C, GROUP_MATRIX);
		if (gpt2)
			add_param(m, &cap, "fcb", l, fc, 0, GROUP_OTHER);
		add_param(m, &cap, "fcprojw", l, c.C, c.F, GROUP_MATRIX);
		if (gpt2)
			add_param(m, &cap, "fcprojb", l, c.C, 0, GROUP_OTHER);
	}
	add_param(m, &cap, "lnfw", -1, c.C, 0, GROUP_OTHER);
	if (gpt2)
		add_param(m, &cap, "lnfb", -1, c.C, 0, GROUP_OTHER);
	if (!c.tied)
		add_param(m, &cap, "head", -1, c.Vp, c.C, GROUP_OTHER);
	return 0;
}

void model_free(struct model *m)
{
	free(m->params);
	memset(m, 0, sizeof(*m));
}

void model_moe_from(struct model_config *mc, const struct config *cfg)
{
	mc->E = (int)cfg->model_n_expert;
	mc->K = (int)cfg->model_top_k;
	mc->De = (int)cfg->model_d_expert;
	mc->shared = (int)cfg->model_shared_expert;
	mc->router = strcmp(cfg->model_router, "sigmoid") ? ROUTER_SOFTMAX : ROUTER_SIGMOID;
	mc->aux_coef = (float)cfg->model_aux_loss_coef;
	mc->z_coef = (float)cfg->model_z_loss_coef;
}

int model_config_from(struct model_config *mc, const struct config *cfg, int V)
{
	struct model m;

	memset(mc, 0, sizeof(*mc));
	mc->arch = strcmp(cfg->model_arch, "gpt2") == 0 ? ARCH_GPT2 : ARCH_LLAMA;
	mc->V = V ? V : (int)cfg->model_vocab_size;
	mc->L = (int)cfg->model_n_layer;
	mc->C = (int)cfg->model_d_model;
	mc->NH = (int)cfg->model_n_head;
	mc->NKV = (int)cfg->model_n_kv_head;
	mc->F = (int)cfg->model_d_ff;
	mc->T = (int)cfg->model_seq_len;
	mc->tied = (int)cfg->model_tied;
	mc->eps = (float)cfg->model_norm_eps;
	mc->rope_theta = (float)cfg->model_rope_theta;
	mc->init_std = (float)cfg->model_init_std;
	model_moe_from(mc, cfg);
	if (cfg->model_n_layer > 4096 || cfg->model_d_model > 65536 || cfg->model_n_head > 65536 ||
	    cfg->model_n_kv_head > 65536 || cfg->model_d_ff > (1 << 20) ||
	    cfg->model_seq_len > (1 << 20) || cfg->model_vocab_size > (1 << 24))
		return error("model: a [model] size is out of range");
	if (model_init(&m, mc))
		return -1;
	*mc = m.cfg;
	model_free(&m);
	return 0;
}

int model_find_param(const struct model *m, const char *name)
{
	for (int i = 0; i < m->n_params; i++)
		if (!strcmp(m->params[i].name, name))
			return i;
	return -1;
}

/* The tensor's kind name without the "h.N." prefix. */
static const char *base_name(const struct param_info *p)
{
	const char *s = p->name;
	if (p->layer >= 0) {
		s = strchr(s + 2, '.');
		s = s ? s + 1 : p->name;
	}
	return s;
}

/* Layers [*begin, *end) of stage s under cut (NULL: one stage holding
 * every layer), and the number of stages. */
static int stage_layers(const struct model *m, const struct stage_cut *cut, int s, int *begin,
			int *end)
{
	if (!cut) {
		*begin = 0;
		*end = m->cfg.L;
		return 1;
	}
	*begin = cut->first[s];
	*end = cut->first[s + 1];
	return cut->S;
}

/* Does a stage of layers [begin, end) hold parameter p? The embeddings go
 * with the first stage, the final norm and head with the last. */
static int stage_holds(const struct param_info *p, int begin, int end, int has_embed,
		       int has_head)
{
	if (p->layer >= 0)
		return p->layer >= begin && p->layer < end;
	if (!strcmp(p->name, "wte") || !strcmp(p->name, "wpe"))
		return has_embed;
	return has_head; /* lnfw, lnfb, head */
}

/* Tensor i of the model, initialised from (seed, i) alone. */
static void init_tensor(const struct model *m, float *params, uint64_t seed, int i)
{
	const struct model_config *c = &m->cfg;
	const struct param_info *p = &m->params[i];
	const char *b = base_name(p);
	float *w = params + p->offset;
	uint64_t rs = rng_mix(seed, (uint64_t)i);
	float std = c->init_std;

	if (p->cols == 0) {
		/* norms' weights 1, biases 0 */
		float v = strchr(b, 'w') && strncmp(b, "ln", 2) == 0 ? 1.0f : 0.0f;
		for (size_t j = 0; j < p->numel; j++)
			w[j] = v;
		return;
	}
	if (!strcmp(b, "attprojw") || !strcmp(b, "fcprojw") ||
	    (strlen(b) > 8 && !strcmp(b + strlen(b) - 8, ".fcprojw")))
		std *= 1.0f / sqrtf(2.0f * c->L);
	for (size_t j = 0; j < p->numel; j++)
		w[j] = std * rng_normal(&rs);
	if (!strcmp(b, "wte") || !strcmp(b, "head"))
		for (size_t r = c->V; r < (size_t)c->Vp; r++)
			memset(w + r * c->C, 0, sizeof(float) * c->C);
}

void model_init_weights(const struct model *m, float *params, uint64_t seed)
{
	for (int i = 0; i < m->n_params; i++)
		init_tensor(m, params, seed, i);
}

void model_init_weights_stage(const struct model *m, float *params, uint64_t seed,
			      const struct stage_cut *cut, int s)
{
	int begin, end, S = stage_layers(m, cut, s, &begin, &end);
	for (int i = 0; i < m->n_params; i++) {
		const struct param_info *p = &m->params[i];
		int tied_copy = m->cfg.tied && s == S - 1 && !strcmp(p->name, "wte");
		if (tied_copy || stage_holds(p, begin, end, s == 0, s == S - 1))
			init_tensor(m, params, seed, i);
	}
}

double model_param_share(const struct model *m, const struct param_info *p)
{
	if (m->cfg.E && !strncmp(base_name(p), "experts.", 8))
		return (double)m->cfg.K / m->cfg.E;
	return 1.0;
}

int model_param_expert(const struct model *m, const struct param_info *p)
{
	const char *b = base_name(p);
	if (!m->cfg.E || strncmp(b, "experts.", 8))
		return -1;
	return atoi(b + 8);
}

size_t model_flops_params(const struct model *m)
{
	double n = 0;

	for (int i = 0; i < m->n_params; i++) {
		const struct param_info *p = &m->params[i];
		if (!strcmp(p->name, "wpe") || (!m->cfg.tied && !strcmp(p->name, "wte")))
			continue;
		n += (double)p->numel * model_param_share(m, p);
	}
	return (size_t)llround(n);
}

double model_flops_per_token(const struct model *m)
{
	const struct model_config *c = &m->cfg;
	return 6.0 * (double)model_flops_params(m) + 6.0 * c->L * (double)c->C * c->T;
}

/* ---- stages ---- */

/* Take n elements of esz bytes (padded to 64 bytes) from *pos (bytes) of
 * base (base may be NULL: sizing only). */
static void *take(void *base, size_t *pos, size_t n, size_t esz)
{
	void *p = base ? (char *)base + *pos : NULL;
	*pos = st_add(*pos, (st_mult(n, esz) + 63) & ~(size_t)63);
	return p;
}

/* n activations of the stage's backend; n floats */
#define TAKE_ACT(base, pos, n) take(base, pos, n, act_dtype_size(st->act_dtype_))
#define TAKE_F32(base, pos, n) ((float *)take(base, pos, n, sizeof(float)))

void layout_moe_dims(const struct stage *st, struct moe_dims *d)
{
	const struct model_config *c = &st->m->cfg;
	d->N = st->B * st->T;
	d->C = c->C;
	d->E = c->E;
	d->K = c->K;
	d->De = c->De;
	d->shared = c->shared;
	d->router = c->router;
	d->alpha = c->aux_coef;
	d->beta = c->z_coef;
	d->act_dtype = st->act_dtype_;
	d->ep = st->moe_ep;
	d->w_e0 = st->w_e0;
	d->w_e1 = st->w_e1;
}

void stage_moe_dims(const struct stage *st, struct moe_dims *d)
{
	layout_moe_dims(st, d);
}

static void layer_view(const struct stage *st, void *base, struct layer_acts *a, size_t *pos)
{
	const struct model_config *c = &st->m->cfg;
	size_t N = (size_t)st->B * st->T, C = c->C;
	int gpt2 = c->arch == ARCH_GPT2;

	a->ln1 = TAKE_ACT(base, pos, N * C);
	a->ln1_mean = gpt2 ? TAKE_F32(base, pos, N) : NULL;
	a->ln1_rstd = TAKE_F32(base, pos, N);
	a->qkv = TAKE_ACT(base, pos, N * qkv_width(c));
	a->atty = TAKE_ACT(base, pos, N * C);
	a->lse = TAKE_F32(base, pos, (size_t)st->B * c->NH * st->T);
	a->res2 = TAKE_ACT(base, pos, N * C);
	a->ln2 = TAKE_ACT(base, pos, N * C);
	a->ln2_mean = gpt2 ? TAKE_F32(base, pos, N) : NULL;
	a->ln2_rstd = TAKE_F32(base, pos, N);
	if (c->E) {
		struct moe_dims d;
		layout_moe_dims(st, &d);
		a->fch = a->fca = NULL;
		*pos += moe_acts_view(&d, base ? (char *)base + *pos : NULL, &a->moe);
	} else {
		a->fch = TAKE_ACT(base, pos, N * fc_rows(c));
		a->fca = TAKE_ACT(base, pos, N * c->F);
	}
	a->res3 = TAKE_ACT(base, pos, N * C);
}

void layout_slot(const struct stage *st, void *base, struct slot_view *v)
{
	const struct model_config *c = &st->m->cfg;
	size_t N = (size_t)st->B * st->T, C = c->C, pos = 0;
	struct layer_acts a;
	int nl = st->layer_end - st->layer_begin;

	memset(v, 0, sizeof(*v));
	v->tokens = take(base, &pos, N, sizeof(int32_t));
	v->x0 = TAKE_ACT(base, &pos, N * C);
	v->layers = base ? (char *)base + pos : NULL;
	{
		size_t p0 = 0;
		layer_view(st, NULL, &a, &p0);
		v->layer_stride = p0;
	}
	pos += v->layer_stride * nl;
	if (st->has_head) {
		v->lnf = TAKE_ACT(base, &pos, N * C);
		v->lnf_mean = c->arch == ARCH_GPT2 ? TAKE_F32(base, &pos, N) : NULL;
		v->lnf_rstd = TAKE_F32(base, &pos, N);
		v->dx = TAKE_ACT(base, &pos, N * C);
	}
	v->total = pos;
	/* the slot's host counts: a stage's slots are st->slot_acts[] */
	for (int i = 0; base && st->moe_counts_ && i < st->n_slots; i++)
		if (st->slot_acts[i] == base)
			v->moe_counts = st->moe_counts_ + (size_t)i * nl * (c->E + 1);
}

void layout_layer(const struct stage *st, const struct slot_view *v, int li,
		       struct layer_acts *a)
{
	size_t pos = 0;
	layer_view(st, (char *)v->layers + v->layer_stride * li, a, &pos);
	if (v->moe_counts)
		a->moe.count_host = v->moe_counts + (size_t)li * (st->m->cfg.E + 1);
}

/* The head's logits are held HEAD_CHUNK_BYTES at a time (GPT-2's 50304
 * columns for 16 x 1024 rows would take 3.3 GB in f32): the rows go
 * through the head in chunks, a multiple of 64 rows, at least B (for
 * model_logits_at) and at most all of them. A model whose logits fit runs
 * the head in one chunk, as if it were not chunked. The price is one more
 * pass over the head's gradient per chunk (it accumulates chunk after
 * chunk): for GPT-2 at 16 x 1024 rows, 13 chunks in f32 move about 4 GB
 * more, which a GPU does in about a millisecond, while the 3 GB saved is
 * a third of what PyTorch needs for the whole step. */
#define HEAD_CHUNK_BYTES ((size_t)256 << 20)

int layout_head_rows(const struct stage *st)
{
	const struct model_config *c = &st->m->cfg;
	size_t N = (size_t)st->B * st->T, row = (size_t)c->Vp * act_dtype_size(st->act_dtype_);
	size_t rows = HEAD_CHUNK_BYTES / row;
	if (rows > 64)
		rows -= rows % 64;
	rows = MAX(rows, (size_t)st->B);
	return (int)MIN(rows, N);
}

void layout_scratch(const struct stage *st, void *base, struct scratch_view *v)
{
	const struct model_config *c = &st->m->cfg;
	size_t N = (size_t)st->B * st->T, C = c->C, pos = 0;

	memset(v, 0, sizeof(*v));
	v->dres = TAKE_ACT(base, &pos, N * C);
	/* the norms' dinp before its residual add; a backend that fuses the
	 * two (norm_backward_add) needs none */
	v->dbuf = st->fused_norm_ ? NULL : TAKE_ACT(base, &pos, N * C);
	v->dln = TAKE_ACT(base, &pos, N * C);
	v->dqkv = TAKE_ACT(base, &pos, N * qkv_width(c));
	v->datty = TAKE_ACT(base, &pos, N * C);
	if (c->E) {
		struct moe_dims d;
		layout_moe_dims(st, &d);
		pos += moe_scratch_view(&d, base ? (char *)base + pos : NULL, &v->moe);
	} else {
		v->dfch = TAKE_ACT(base, &pos, N * fc_rows(c));
		v->dfca = TAKE_ACT(base, &pos, N * c->F);
	}
	if (st->has_head) {
		v->logits = TAKE_ACT(base, &pos, (size_t)st->head_rows * c->Vp);
		v->losses = TAKE_F32(base, &pos, N);
		v->dlnf = TAKE_ACT(base, &pos, N * C);
	}
	v->total = pos;
}

/* The split backward's saved gradients of one layer (stage_layout.h,
 * layer_dsave) over base, A bytes per activation; returns the bytes. */
static size_t dsave_view(const struct model_config *c, int N_, size_t A, void *base,
			 struct layer_dsave *d)
{
	size_t N = (size_t)N_, C = c->C, pos = 0;

	memset(d, 0, sizeof(*d));
	d->dres3 = !c->E || c->shared ? take(base, &pos, N * C, A) : NULL;
	d->dfch = c->E ? NULL : take(base, &pos, N * fc_rows(c), A);
	d->dln2 = take(base, &pos, N * C, A);
	d->dres2 = take(base, &pos, N * C, A);
	d->dqkv = take(base, &pos, N * qkv_width(c), A);
	d->dln1 = take(base, &pos, N * C, A);
	if (c->E) {
		struct moe_dims md = {.N = N_, .C = c->C, .E = c->E, .K = c->K, .De = c->De,
				      .shared = c->shared, .act_dtype = A == 2 ? ACT_BF16 : ACT_F32};
		pos += moe_dsave_view(&md, base ? (char *)base + pos : NULL, &d->moe);
	}
	return pos;
}

/* The split view of nl layers (and d(x0) on stage 0, the targets and
 * d(lnf) with a deferred head) over base. */
static void split_view_of(const struct model_config *c, int N, size_t A, int nl, int has_embed,
			  int head, void *base, struct split_view *v)
{
	struct layer_dsave d;
	size_t pos = 0;

	memset(v, 0, sizeof(*v));
	v->layer_stride = dsave_view(c, N, A, NULL, &d);
	v->layers = base;
	pos = v->layer_stride * nl;
	v->dx0 = has_embed ? take(base, &pos, (size_t)N * c->C, A) : NULL;
	v->targets = head ? take(base, &pos, (size_t)N, sizeof(int32_t)) : NULL;
	v->dlnf = head ? take(base, &pos, (size_t)N * c->C, A) : NULL;
	v->total = pos;
}

void layout_split(const struct stage *st, void *base, struct split_view *v)
{
	split_view_of(&st->m->cfg, st->B * st->T, act_dtype_size(st->act_dtype_),
		      st->layer_end - st->layer_begin, st->has_embed, st->split_head, base, v);
}

void layout_layer_dsave(const struct stage *st, const struct split_view *v, int li,
			struct layer_dsave *d)
{
	dsave_view(&st->m->cfg, st->B * st->T, act_dtype_size(st->act_dtype_),
		   (char *)v->layers + v->layer_stride * li, d);
}

size_t stage_split_bytes(const struct model *m, const struct stage_cut *cut, int s, int B,
			 int T, size_t act_size, int flags)
{
	int begin, end, S = stage_layers(m, cut, s, &begin, &end);
	struct split_view v;

	split_view_of(&m->cfg, B * T, act_size, end - begin, s == 0,
		      (flags & SPLIT_HEAD) && s == S - 1, NULL, &v);
	return v.total;
}

int stage_param_count(const struct model *m, const struct stage_cut *cut, int s)
{
	int begin, end, n = 0, S = stage_layers(m, cut, s, &begin, &end);
	for (int i = 0; i < m->n_params; i++)
		n += stage_holds(&m->params[i], begin, end, s == 0, s == S - 1);
	return n + (m->cfg.tied && s == S - 1 && s != 0); /* the tied copy of wte */
}

/* When stage_backward has finished each tensor's gradient (model.h:
 * grads_done): the embedding tables at the end (after the lookup's
 * backward), a layer's tensors after that layer, the rest (final norm,
 * head, the tied copy) at the start, since the forward of the last stage
 * finished them. Each tensor's range reaches to the next one's offset, so
 * the runs tile the arena; neighbours done at the same point are one run. */

static void grad_runs(struct stage *st)
{
	st->runs_ = xcalloc((size_t)st->n_params + 1, sizeof(*st->runs_));
	st->n_runs_ = 0;
	size_t covered = 0;
	for (int i = 0; i < st->n_params; i++) {
		const struct param_info *p = &st->m->params[st->params[i].global];
		const char *b = base_name(p);
		int when = p->layer >= 0 ? p->layer - st->layer_begin
			   : !st->params[i].tied_copy && (!strcmp(b, "wte") || !strcmp(b, "wpe"))
				 ? GRADS_AT_END
				 : GRADS_AT_START;
		size_t lo = st->params[i].offset;
		size_t hi = i + 1 < st->n_params ? st->params[i + 1].offset : st->numel;
		if (lo != covered || hi < lo)
			bug("stage %d's tensor %s at %zu, expected at %zu", st->s, p->name, lo,
			    covered);
		struct grad_run *last = st->n_runs_ ? &st->runs_[st->n_runs_ - 1] : NULL;
		if (last && last->when == when)
			last->n += hi - lo;
		else
			st->runs_[st->n_runs_++] = (struct grad_run){lo, hi - lo, when};
		covered = hi;
	}
	if (covered != st->numel)
		bug("stage %d's tensors cover %zu of %zu floats", st->s, covered, st->numel);
}

/* Report the runs done at point `when` (stage_backward). */
void layout_grads_done(const struct stage *st, int when)
{
	if (!st->grads_done)
		return;
	/* the later runs first: the order in which a backward finishes them */
	for (int i = st->n_runs_ - 1; i >= 0; i--)
		if (st->runs_[i].when == when)
			st->grads_done(st->grads_done_ctx, st->runs_[i].lo, st->runs_[i].n);
}

/* What stage_init and stage_size share: st's shape (range checks, layers,
 * tensors, slot and scratch sizes) for activations of act_dtype, with or
 * without the fused norm backward; st->params is the only allocation
 * (host memory). Neither the layout nor the sizes read anything else of a
 * backend, so a plan sized here is what a build allocates. */
static int stage_shape(struct stage *st, const struct model *m, int act_dtype, int fused_norm,
		       const struct stage_cut *cut, int s, int B, int T, int n_slots)
{
	const struct model_config *c = &m->cfg;
	int S = cut ? cut->S : 1, cap;
	size_t base_off, end_off;
	struct slot_view sv;
	struct scratch_view xv;

	memset(st, 0, sizeof(*st));
	if (S < 1 || s < 0 || s >= S)
		return error("stage: stage %d of %d is out of range", s, S);
	if (cut && cut->L != c->L)
		return error("stage: a cut of %d layers for a model of %d", cut->L, c->L);
	if (B <= 0 || T <= 0 || T > c->T)
		return error("stage: micro-batch %dx%d invalid (seq_len %d)", B, T, c->T);
	if (n_slots <= 0)
		return error("stage: %d activation slots", n_slots);
	if ((size_t)B * T > (1u << 30) / (size_t)c->C)
		return error("stage: micro-batch %dx%d too large", B, T);
	st->m = m;
	st->act_dtype_ = act_dtype;
	st->fused_norm_ = fused_norm;
	st->s = s;
	st->S = S;
	stage_layers(m, cut, s, &st->layer_begin, &st->layer_end);
	st->has_embed = s == 0;
	st->has_head = s == S - 1;
	st->B = B;
	st->T = T;
	st->n_slots = n_slots;

	/* The stage's tensors: a contiguous global range [base_off, end_off). */
	base_off = NONE;
	end_off = 0;
	cap = m->n_params + 1;
	st->params = xcalloc(cap, sizeof(*st->params));
	for (int i = 0; i < m->n_params; i++) {
		const struct param_info *p = &m->params[i];
		if (!stage_holds(p, st->layer_begin, st->layer_end, st->has_embed, st->has_head))
			continue;
		if (base_off == NONE)
			base_off = p->offset;
		st->params[st->n_params].global = i;
		st->params[st->n_params].offset = p->offset - base_off;
		st->params[st->n_params].woffset = p->offset - base_off;
		st->n_params++;
		end_off = p->offset + p->numel;
	}
	if (!st->n_params) { /* a middle stage without layers: cut_from_counts refuses it */
		free(st->params);
		st->params = NULL;
		return error("stage %d of %d holds no tensor", s, S);
	}
	st->numel = end_off - base_off;
	if (c->tied && st->has_head && !st->has_embed) {
		int w = model_find_param(m, "wte");
		st->params[st->n_params].global = w;
		st->params[st->n_params].offset = st->numel;
		st->params[st->n_params].woffset = st->numel;
		st->params[st->n_params].tied_copy = 1;
		st->n_params++;
		st->numel += m->params[w].numel;
	}
	st->head_rows = layout_head_rows(st);
	layout_slot(st, NULL, &sv);
	layout_scratch(st, NULL, &xv);
	st->act_bytes_per_slot = sv.total;
	st->scratch_bytes = xv.total;
	return 0;
}

/* The tied head's separate gradient (model.h: tied_head_grad), counted
 * with the scratch */
static size_t tied_head_grad_bytes(const struct stage *st)
{
	const struct model_config *c = &st->m->cfg;
	return c->tied && st->S == 1 ? st_mult((size_t)c->Vp * c->C, sizeof(float)) : 0;
}

int stage_size(const struct model *m, const struct stage_cut *cut, int s, int B, int T,
	       int act_dtype, int fused_norm, int split, struct stage_size *out,
	       struct stage_param **params)
{
	struct stage st;

	memset(out, 0, sizeof(*out));
	if (stage_shape(&st, m, act_dtype, fused_norm, cut, s, B, T, 1))
		return -1;
	out->numel = st.numel;
	out->act_bytes_per_slot = st.act_bytes_per_slot;
	out->scratch_bytes = st.scratch_bytes + tied_head_grad_bytes(&st);
	if (split >= 0) {
		out->split_bytes_per_slot = stage_split_bytes(m, cut, s, B, T,
							      act_dtype_size(act_dtype), split);
		out->act_bytes_per_slot += out->split_bytes_per_slot;
	}
	out->n_params = st.n_params;
	if (params)
		*params = st.params;
	else
		free(st.params);
	return 0;
}

int stage_init(struct stage *st, const struct model *m, const struct backend *be,
	       const struct stage_cut *cut, int s, int B, int T, int n_slots)
{
	const struct model_config *c = &m->cfg;
	int nl;
	size_t *off;

	if (c->E && !backend_has_moe(be)) { /* moe.c calls the backend's moe_* ops */
		memset(st, 0, sizeof(*st));
		return error("stage: the mixture-of-experts layer (model.n_expert = %d) needs "
			     "the backend's moe ops, which %s lacks", c->E, be->name);
	}
	if (stage_shape(st, m, be->act_dtype, be->norm_backward_add != NULL, cut, s, B, T,
			n_slots))
		return -1;
	st->be = be;
	nl = st->layer_end - st->layer_begin;

	off = st->off_ = xmalloc(st_mult((size_t)nl * NKIND + NGLOBAL, sizeof(size_t)));
	for (size_t i = 0; i < (size_t)nl * NKIND + NGLOBAL; i++)
		off[i] = NONE;
	for (int i = 0; i < st->n_params; i++) {
		const struct param_info *p = &m->params[st->params[i].global];
		const char *b = base_name(p);
		size_t o = st->params[i].offset;
		if (p->layer >= 0) {
			for (int k = 0; k < NKIND; k++)
				if (!strcmp(b, kind_name[k]))
					off[(size_t)(p->layer - st->layer_begin) * NKIND + k] = o;
		} else if (!strcmp(b, "wte")) {
			off[(size_t)nl * NKIND + G_WTE] = o;
			if (c->tied && st->has_head)
				off[(size_t)nl * NKIND + G_HEAD] = o;
		} else if (!strcmp(b, "wpe")) {
			off[(size_t)nl * NKIND + G_WPE] = o;
		} else if (!strcmp(b, "lnfw")) {
			off[(size_t)nl * NKIND + G_LNFW] = o;
		} else if (!strcmp(b, "lnfb")) {
			off[(size_t)nl * NKIND + G_LNFB] = o;
		} else if (!strcmp(b, "head")) {
			off[(size_t)nl * NKIND + G_HEAD] = o;
		}
	}

	/* the weight arena: the gradients' layout until stage_hold_weights */
	st->wnumel = st->numel;
	st->w_e0 = 0;
	st->w_e1 = c->E;
	st->woff_ = xmalloc(st_mult((size_t)nl * NKIND + NGLOBAL, sizeof(size_t)));
	memcpy(st->woff_, off, ((size_t)nl * NKIND + NGLOBAL) * sizeof(size_t));
	grad_runs(st);
	st->slot_acts = xcalloc(n_slots, sizeof(*st->slot_acts));
	for (int i = 0; i < n_slots; i++) {
		st->slot_acts[i] = be->alloc(st->act_bytes_per_slot);
		if (!st->slot_acts[i]) {
			size_t bytes = st->act_bytes_per_slot; /* stage_free clears st */
			stage_free(st);
			return error("stage %d: cannot allocate %zu bytes of activations", s, bytes);
		}
	}
	st->scratch = be->alloc(st->scratch_bytes);
	if (!st->scratch) {
		size_t bytes = st->scratch_bytes; /* stage_free clears st */
		stage_free(st);
		return error("stage %d: cannot allocate %zu bytes of scratch", s, bytes);
	}
	if (tied_head_grad_bytes(st)) {
		st->tied_head_grad = be->alloc(tied_head_grad_bytes(st));
		if (!st->tied_head_grad) {
			stage_free(st);
			return error("stage %d: cannot allocate the tied head's gradient", s);
		}
		st->scratch_bytes += tied_head_grad_bytes(st);
	}
	if (st->has_head && !(st->loss_dev_ = be->alloc(sizeof(float)))) {
		stage_free(st);
		return error("stage %d: cannot allocate the loss on backend '%s'", s, be->name);
	}
	st->slot_dloss_ = xcalloc(n_slots, sizeof(float));
	if (c->E)
		st->moe_counts_ = xcalloc(st_mult((size_t)n_slots * nl, (size_t)c->E + 1),
					  sizeof(int32_t));
	if (c->E && nl && !(st->moe_aux_dev_ = be->alloc(2 * sizeof(float) * (size_t)nl))) {
		stage_free(st);
		return error("stage %d: cannot allocate the auxiliary losses' gather on backend '%s'",
			     s, be->name);
	}
	return 0;
}

int stage_split_init(struct stage *st, int flags)
{
	struct split_view v;
	size_t bytes;
	void **slots;
	int head = (flags & SPLIT_HEAD) && st->has_head;

	if (st->split)
		return st->split_head == head ? 0
					       : error("stage %d: the split backward is set up "
						       "already, with the head %s", st->s,
						       st->split_head ? "split" : "in the forward");
	st->split_head = head; /* layout_split reads it */
	layout_split(st, NULL, &v);
	bytes = st->act_bytes_per_slot + v.total;
	/* new slots, then the old ones go: a failure leaves the stage whole */
	slots = xcalloc(st->n_slots, sizeof(*slots));
	for (int i = 0; i < st->n_slots; i++) {
		if (!(slots[i] = st->be->alloc(bytes))) {
			for (int j = 0; j < i; j++)
				st->be->free(slots[j]);
			free(slots);
			st->split_head = 0;
			return error("stage %d: cannot allocate %zu bytes of activations for the "
				     "split backward (%zu of them kept for the weight gradients)",
				     st->s, bytes, v.total);
		}
	}
	for (int i = 0; i < st->n_slots; i++)
		st->be->free(st->slot_acts[i]);
	free(st->slot_acts);
	st->slot_acts = slots;
	st->act_bytes_per_slot = bytes;
	st->split_bytes_per_slot = v.total;
	st->split = 1;
	return 0;
}

void stage_free(struct stage *st)
{
	if (st->slot_acts) {
		for (int i = 0; i < st->n_slots; i++)
			if (st->slot_acts[i])
				st->be->free(st->slot_acts[i]);
		free(st->slot_acts);
	}
	if (st->scratch)
		st->be->free(st->scratch);
	if (st->tied_head_grad)
		st->be->free(st->tied_head_grad);
	free(st->params);
	free(st->runs_);
	free(st->off_);
	free(st->woff_);
	if (st->loss_dev_)
		st->be->free(st->loss_dev_);
	free(st->slot_dloss_);
	free(st->moe_counts_);
	if (st->moe_aux_dev_)
		st->be->free(st->moe_aux_dev_);
	memset(st, 0, sizeof(*st));
}

void stage_gather(const struct stage *st, float *stage_arena, const float *global)
{
	for (int i = 0; i < st->n_params; i++) {
		const struct param_info *p = &st->m->params[st->params[i].global];
		if (st->params[i].woffset != NONE)
			memcpy(stage_arena + st->params[i].woffset, global + p->offset,
			       p->numel * sizeof(float));
	}
}

void stage_scatter(const struct stage *st, float *global, const float *stage_arena)
{
	for (int i = 0; i < st->n_params; i++) {
		const struct param_info *p = &st->m->params[st->params[i].global];
		if (st->params[i].tied_copy || st->params[i].woffset == NONE)
			continue;
		memcpy(global + p->offset, stage_arena + st->params[i].woffset,
		       p->numel * sizeof(float));
	}
}

long stage_wte_offset(const struct stage *st)
{
	size_t o = goff(st)[G_WTE];
	return o == NONE ? -1 : (long)o;
}

long stage_head_offset(const struct stage *st)
{
	size_t o = goff(st)[G_HEAD];
	return o == NONE ? -1 : (long)o;
}

void stage_finish_grads(struct stage *st, float *grads)
{
	const struct model_config *c = &st->m->cfg;
	size_t n = (size_t)c->Vp * c->C;
	float *g;

	if (!st->tied_head_grad)
		return;
	g = GG(st, grads, G_WTE);
	st->be->add(g, g, st->tied_head_grad, n);
	st->be->zero(st->tied_head_grad, n * sizeof(float));
}
