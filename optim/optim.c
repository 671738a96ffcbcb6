/* optim.c - per-stage optimizers composed from the backend's pieces, and the
 * error-feedback correction. See optim.h for the update rules. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../io/util.h"
#include "optim.h"
#include "soap.h"

/* The shape of a state part, from its tensor's [rows, cols]. */
enum part_shape { P_NUMEL, P_ROWS, P_ROWS_SQ, P_COLS_SQ };

/* Each rule's state buffers, in the order tensor_direction uses them. The
 * buffer names are what checkpoints store ("adam_m/wte"); never rename. */
static const struct optim_rule_def {
	const char *name;
	int n_parts;
	struct {
		const char *buf;
		enum part_shape shape;
	} part[6];
} rule_def[RULE_COUNT] = {
	[RULE_ADAMW] = {"adamw", 2, {{"adam_m", P_NUMEL}, {"adam_v", P_NUMEL}}},
	[RULE_MUON] = {"muon", 1, {{"muon_momentum", P_NUMEL}}},
	[RULE_LION] = {"lion", 1, {{"lion_m", P_NUMEL}}},
	[RULE_SGD] = {"sgd", 1, {{"sgd_momentum", P_NUMEL}}},
	[RULE_ADAN] = {"adan", 4,
		       {{"adan_m", P_NUMEL}, {"adan_v", P_NUMEL}, {"adan_n", P_NUMEL},
			{"adan_prev_grad", P_NUMEL}}},
	[RULE_MARS] = {"mars", 3,
		       {{"mars_m", P_NUMEL}, {"mars_v", P_NUMEL}, {"mars_prev_grad", P_NUMEL}}},
	[RULE_ADEMAMIX] = {"ademamix", 3,
			   {{"ademamix_m1", P_NUMEL}, {"ademamix_m2", P_NUMEL},
			    {"ademamix_nu", P_NUMEL}}},
	[RULE_SOAP] = {"soap", 6,
		       {{"soap_m", P_NUMEL}, {"soap_v", P_NUMEL}, {"soap_l", P_ROWS_SQ},
			{"soap_r", P_COLS_SQ}, {"soap_ql", P_ROWS_SQ}, {"soap_qr", P_COLS_SQ}}},
	[RULE_NORMUON] = {"normuon", 2, {{"normuon_momentum", P_NUMEL}, {"normuon_v", P_ROWS}}},
};

static const char *const kind_name[] = {"adamw", "muon",     "lion", "sgd",    "adan",
					"mars",  "ademamix", "soap", "normuon"};

static int check_unit(const char *key, double x)
{
	if (!(x >= 0.0 && x < 1.0))
		return error("optim.%s = %g is outside [0, 1)", key, x);
	return 0;
}

static int is_matrix_kind(int kind)
{
	return kind == OPTIM_MUON || kind == OPTIM_NORMUON || kind == OPTIM_SOAP ||
	       kind == OPTIM_MARS;
}

/* Resolve the [optim] keys into o; -1 on a bad value. */
static int read_config(struct optimizer *o, const struct config *cfg)
{
	const char *name = cfg->optim_name ? cfg->optim_name : "adamw";

	o->kind = -1;
	for (size_t i = 0; i < ARRAY_SIZE(kind_name); i++)
		if (!strcmp(name, kind_name[i]))
			o->kind = (int)i;
	if (o->kind < 0)
		return error("optim.name: unknown optimizer '%s' (expected adamw, muon, lion, sgd, "
			     "adan, mars, ademamix, soap or normuon)", name);
	o->beta1 = (float)cfg->optim_beta1;
	o->beta2 = (float)cfg->optim_beta2;
	o->beta3 = (float)cfg->optim_beta3;
	o->eps = (float)cfg->optim_eps;
	o->wd = (float)cfg->optim_weight_decay;
	o->momentum = (float)cfg->optim_momentum;
	o->nesterov = cfg->optim_nesterov != 0;
	o->ns_steps = (int)cfg->optim_ns_steps;
	o->muon_scale_rms = !cfg->optim_muon_scale || strcmp(cfg->optim_muon_scale, "shape");
	o->correction = cfg->optim_correction && !strcmp(cfg->optim_correction, "ef");
	o->ef_lambda = (float)cfg->optim_ef_lambda;
	o->mars_gamma = (float)cfg->optim_mars_gamma;
	o->ademamix_alpha = (float)cfg->optim_ademamix_alpha;
	o->ademamix_warmup =
		cfg->optim_ademamix_warmup > 0 ? cfg->optim_ademamix_warmup : cfg->train_steps;
	o->soap_every = cfg->optim_soap_every;

	/* every optimizer but sgd and the momentum of muon/normuon reads the
	 * betas (the matrix optimizers through their AdamW tensors) */
	if (o->kind != OPTIM_SGD &&
	    (check_unit("beta1", cfg->optim_beta1) || check_unit("beta2", cfg->optim_beta2)))
		return -1;
	if ((o->kind == OPTIM_ADAN || o->kind == OPTIM_ADEMAMIX) &&
	    check_unit("beta3", cfg->optim_beta3))
		return -1;
	if (o->kind != OPTIM_LION && o->kind != OPTIM_SGD && !(cfg->optim_eps > 0.0))
		return error("optim.eps = %g must be positive", cfg->optim_eps);
	if ((o->kind == OPTIM_MUON || o->kind == OPTIM_NORMUON || o->kind == OPTIM_SGD) &&
	    check_unit("momentum", cfg->optim_momentum))
		return -1;
	if ((o->kind == OPTIM_MUON || o->kind == OPTIM_NORMUON) &&
	    (cfg->optim_ns_steps < 1 || cfg->optim_ns_steps > 100))
		return error("optim.ns_steps = %ld is outside [1, 100]", cfg->optim_ns_steps);
	if (!(cfg->optim_weight_decay >= 0.0 && isfinite(cfg->optim_weight_decay)))
		return error("optim.weight_decay = %g must be a finite number >= 0",
			     cfg->optim_weight_decay);
	if (!isfinite(cfg->optim_ef_lambda))
		return error("optim.ef_lambda = %g is not finite", cfg->optim_ef_lambda);
	return 0;
}

/* Whether optim.ef_groups selects tensors of this group. */
static int ef_selects(const struct config *cfg, int group)
{
	const char *g = cfg->optim_ef_groups ? cfg->optim_ef_groups : "all";

	if (!strcmp(g, "muon"))
		return group == GROUP_MATRIX;
	if (!strcmp(g, "adamw"))
		return group != GROUP_MATRIX;
	return 1;
}

static int need_op(const struct backend *be, const void *slot, const char *op)
{
	if (!slot)
		return error("backend '%s' has no %s, which the optimizer needs", be->name, op);
	return 0;
}

/* The rule of a tensor under optimizer kind. */
static int tensor_rule(int kind, const struct param_info *pi)
{
	static const int whole[] = {
		[OPTIM_ADAMW] = RULE_ADAMW, [OPTIM_LION] = RULE_LION, [OPTIM_SGD] = RULE_SGD,
		[OPTIM_ADAN] = RULE_ADAN, [OPTIM_ADEMAMIX] = RULE_ADEMAMIX,
	};
	static const int matrix[] = {
		[OPTIM_MUON] = RULE_MUON, [OPTIM_NORMUON] = RULE_NORMUON,
		[OPTIM_SOAP] = RULE_SOAP, [OPTIM_MARS] = RULE_MARS,
	};
	if (!is_matrix_kind(kind))
		return whole[kind];
	return pi->group == GROUP_MATRIX && pi->rows > 0 && pi->cols > 0 ? matrix[kind] : RULE_ADAMW;
}

/* Index of the state buffer called name, added when new. */
static int state_buf(struct optimizer *o, const char *name)
{
	for (int i = 0; i < o->n_state; i++)
		if (!strcmp(o->state[i].name, name))
			return i;
	if (o->n_state == OPTIM_MAX_STATE)
		bug("more than %d optimizer state buffers", OPTIM_MAX_STATE);
	o->state[o->n_state].name = name;
	return o->n_state++;
}

/* Give tensor t a part of numel floats shaped [rows, cols] in buffer name;
 * a part of no floats is recorded with buf -1 (its data stays NULL). */
static void add_part(struct optimizer *o, struct optim_tensor *t, const char *name, size_t numel,
		     int rows, int cols)
{
	if (t->skip) { /* no part; only the name, so that optimizers differing
			* only in what is theirs list the same buffers */
		if (numel)
			state_buf(o, name);
		return;
	}
	struct optim_part *p = &t->part[t->n_part++];
	p->rows = rows;
	p->cols = cols;
	p->numel = numel;
	p->buf = -1;
	if (!numel)
		return;
	p->buf = state_buf(o, name);
	p->off = o->state[p->buf].numel;
	o->state[p->buf].numel = st_add(o->state[p->buf].numel, numel);
}

static void add_rule_parts(struct optimizer *o, struct optim_tensor *t)
{
	const struct optim_rule_def *d = &rule_def[t->rule];
	int rows = t->info.rows, cols = t->info.cols;
	size_t rr = rows <= SOAP_MAX_DIM ? st_mult((size_t)rows, (size_t)rows) : 0;
	size_t cc = cols <= SOAP_MAX_DIM ? st_mult((size_t)cols, (size_t)cols) : 0;
	for (int j = 0; j < d->n_parts; j++) {
		const char *name = d->part[j].buf;
		switch (d->part[j].shape) {
		case P_NUMEL:
			add_part(o, t, name, t->info.numel, rows, cols);
			break;
		case P_ROWS:
			add_part(o, t, name, (size_t)rows, rows, 0);
			break;
		case P_ROWS_SQ: /* a side past SOAP_MAX_DIM is not preconditioned */
			add_part(o, t, name, rr, rows, rows);
			break;
		case P_COLS_SQ:
			add_part(o, t, name, cc, cols, cols);
			break;
		}
	}
}

/* Floats of o->work the tensor's rule needs. Slices of work start at
 * 256-byte offsets (scratch_floats_aligned), as the CUDA kernels want. */
static size_t work_floats(const struct optim_tensor *t)
{
	size_t n = t->info.numel;
	switch (t->rule) {
	case RULE_MUON:
	case RULE_NORMUON:
		return st_add(scratch_floats_aligned(n),
			      newton_schulz_scratch(t->info.rows, t->info.cols));
	case RULE_MARS:
		return n;
	case RULE_SOAP:
		return soap_work_floats(t->info.rows, t->info.cols);
	default:
		return 0;
	}
}

/* ---- Newton-Schulz in batches (backend newton_schulz_many) ----
 *
 * Muon's and NorMuon's matrices of one shape are orthogonalised together:
 * their momenta go into o->ns side by side, one newton_schulz_many call
 * turns them into directions, and each is then scaled and applied as alone.
 * Tensors are independent and newton_schulz_many gives each matrix the bits
 * newton_schulz gives it, so the weights are those of the per-tensor loop. */
static size_t ns_limit = (size_t)1 << 24;

size_t optim_ns_batch_limit(size_t floats)
{
	size_t prev = ns_limit;
	ns_limit = floats ? floats : 1;
	return prev;
}

static int ns_rule(int rule)
{
	return rule == RULE_MUON || rule == RULE_NORMUON;
}

/* Matrices of n floats in one batch of a group of count, under limit */
static int ns_batch_len(size_t limit, size_t n, int count)
{
	size_t k = limit / scratch_floats_aligned(n);
	return (int)MIN((size_t)count, MAX(k, (size_t)1));
}

/* Floats of o->ns for a batch of len rows x cols matrices: momenta and
 * directions in 256-byte slices, then newton_schulz_many's scratch. */
static size_t ns_batch_floats(int len, int rows, int cols)
{
	size_t al = scratch_floats_aligned((size_t)rows * cols);
	return st_add(st_mult(2 * (size_t)len, al), newton_schulz_many_scratch(len, rows, cols));
}

/* Mark the tensors that share their shape with another one and fit two to
 * a batch; returns the floats o->ns needs (0: nothing to batch). */
static size_t ns_plan(struct optimizer *o)
{
	size_t need = 0;
	o->ns_limit = ns_limit;
	for (int k = 0; k < o->n; k++) {
		struct optim_tensor *t = &o->t[k];
		if (!ns_rule(t->rule) || !t->info.numel || t->skip)
			continue;
		int count = 0;
		for (int j = 0; j < o->n; j++)
			count += ns_rule(o->t[j].rule) && o->t[j].info.numel && !o->t[j].skip &&
				 o->t[j].info.rows == t->info.rows && o->t[j].info.cols == t->info.cols;
		int len = ns_batch_len(o->ns_limit, t->info.numel, count);
		if (len < 2) /* alone, or too large for two: the per-tensor path */
			continue;
		t->ns_batch = 1;
		need = MAX(need, ns_batch_floats(len, t->info.rows, t->info.cols));
	}
	return need;
}

/* The backend operations each rule calls. */
static int check_ops(const struct backend *be, int rule)
{
#define NEED(op) need_op(be, (const void *)be->op, #op)
	switch (rule) {
	case RULE_ADAMW:
		return NEED(adamw_dir);
	case RULE_LION:
		return NEED(lion_dir);
	case RULE_ADAN:
		return NEED(adan_dir);
	case RULE_SGD:
		return NEED(momentum) || NEED(scale);
	case RULE_MUON:
		return NEED(momentum) || NEED(scale) || NEED(newton_schulz);
	case RULE_NORMUON:
		return NEED(momentum) || NEED(scale) || NEED(newton_schulz) ||
		       NEED(row_normalize);
	case RULE_MARS:
		return NEED(mars_correct) || NEED(adamw_dir) || NEED(scale);
	case RULE_ADEMAMIX:
		return NEED(ademamix_dir);
	case RULE_SOAP:
		return NEED(gemm) || NEED(ema) || NEED(soap_adam) || NEED(scale) ||
		       NEED(to_host) || NEED(to_device) || NEED(zero);
	}
#undef NEED
	return 0;
}

size_t optim_bytes(const struct optimizer *o)
{
	size_t n = st_add(st_add(o->u_floats, o->work_floats), o->ns_floats);
	for (int i = 0; i < o->n_state; i++)
		n = st_add(n, o->state[i].numel);
	return st_mult(n, sizeof(float));
}

size_t optim_part_bound(const struct model *m)
{
	size_t most = 0;
	for (int k = 0; k < m->n_params; k++) {
		const struct param_info *pi = &m->params[k];
		size_t r = (size_t)pi->rows, c = (size_t)(pi->cols > 0 ? pi->cols : 0);
		most = MAX(most, pi->numel);
		most = MAX(most, st_mult(r, r));
		most = MAX(most, st_mult(c, c));
	}
	return most;
}

int optim_init(struct optimizer *o, const struct backend *be, const struct config *cfg,
	       const struct model *m, const struct stage_param *params, int n_params,
	       size_t numel)
{
	return optim_init_owned(o, be, cfg, m, params, n_params, numel, NULL);
}

/* What optim_init_owned and optim_size share: o's tensors, their rules and
 * state parts, and the sizes of the state buffers and scratch (ns_many: the
 * backend batches Newton-Schulz), allocating nothing on a backend. */
static int optim_layout(struct optimizer *o, const struct config *cfg, const struct model *m,
			const struct stage_param *params, int n_params, size_t numel,
			const unsigned char *mine, int ns_many, int *used)
{
	size_t max_numel = 0, max_work = 0;

	memset(o, 0, sizeof(*o));
	o->numel = numel;
	if (read_config(o, cfg))
		return -1;
	if (n_params < 0)
		return error("optimizer: negative tensor count %d", n_params);
	o->t = xcalloc(n_params ? n_params : 1, sizeof(*o->t));
	o->n = n_params;
	for (int k = 0; k < n_params; k++) {
		struct optim_tensor *t = &o->t[k];
		if (params[k].global < 0 || params[k].global >= m->n_params)
			return error("optimizer: tensor %d refers to parameter %d of %d", k,
				     params[k].global, m->n_params);
		const struct param_info *pi = &m->params[params[k].global];
		t->info = *pi;
		t->offset = params[k].offset;
		t->woffset = params[k].offset;
		t->tied_copy = params[k].tied_copy;
		if (pi->numel > numel || t->offset > numel - pi->numel)
			return error("optimizer: tensor '%s' (%zu floats at %zu) lies outside the "
				     "stage arena of %zu floats", pi->name, pi->numel, t->offset,
				     numel);
		t->rule = tensor_rule(o->kind, pi);
		t->skip = mine && !mine[k];
		used[t->rule] = 1;
		add_rule_parts(o, t);
		if (t->skip)
			continue;
		max_work = MAX(max_work, work_floats(t));
		max_numel = MAX(max_numel, pi->numel);
	}
	/* the correction's buffer comes last, after every rule's */
	for (int k = 0; k < n_params; k++) {
		struct optim_tensor *t = &o->t[k];
		t->ef = o->correction && ef_selects(cfg, t->info.group);
		if (t->ef)
			add_part(o, t, "ef_prev_update", t->info.numel, t->info.rows, t->info.cols);
		t->ef = t->ef && !t->skip;
	}
	o->u_floats = max_numel;
	o->work_floats = max_work;
	o->ns_floats = ns_many ? ns_plan(o) : 0;
	return 0;
}

int optim_size(const struct config *cfg, const struct model *m, const struct stage_param *params,
	       int n_params, size_t numel, const unsigned char *mine, int ns_many, size_t *bytes)
{
	struct optimizer o;
	int used[RULE_COUNT] = {0};
	int rc = optim_layout(&o, cfg, m, params, n_params, numel, mine, ns_many, used);

	*bytes = rc ? 0 : optim_bytes(&o);
	optim_free(&o); /* o.be is NULL: nothing on a backend to free */
	return rc;
}

int optim_init_owned(struct optimizer *o, const struct backend *be, const struct config *cfg,
		     const struct model *m, const struct stage_param *params, int n_params,
		     size_t numel, const unsigned char *mine)
{
	int used[RULE_COUNT] = {0};

	memset(o, 0, sizeof(*o));
	if (need_op(be, (const void *)be->alloc, "alloc") ||
	    need_op(be, (const void *)be->free, "free") ||
	    need_op(be, (const void *)be->copy, "copy") ||
	    need_op(be, (const void *)be->apply_update, "apply_update") ||
	    need_op(be, (const void *)be->sumsq, "sumsq"))
		return -1;
	if (optim_layout(o, cfg, m, params, n_params, numel, mine, be->newton_schulz_many != NULL,
			 used))
		goto fail;
	o->be = be;
	for (int r = 0; r < RULE_COUNT; r++)
		if (used[r] && check_ops(be, r))
			goto fail;

	/* be->alloc returns zeroed memory; the state starts at zero */
	for (int i = 0; i < o->n_state; i++) {
		size_t bytes = st_mult(o->state[i].numel, sizeof(float));
		/* a buffer of no floats (optim_init_owned) stays NULL */
		if (bytes && !(o->state[i].data = be->alloc(bytes))) {
			error("optimizer: cannot allocate state '%s' (%zu floats) on backend '%s'",
			      o->state[i].name, o->state[i].numel, be->name);
			goto fail;
		}
	}
	o->u = o->u_floats ? be->alloc(st_mult(o->u_floats, sizeof(float))) : NULL;
	o->work = o->work_floats ? be->alloc(st_mult(o->work_floats, sizeof(float))) : NULL;
	o->ns = o->ns_floats ? be->alloc(st_mult(o->ns_floats, sizeof(float))) : NULL;
	if ((o->u_floats && !o->u) || (o->work_floats && !o->work) || (o->ns_floats && !o->ns)) {
		error("optimizer: cannot allocate scratch on backend '%s'", be->name);
		goto fail;
	}
	for (int k = 0; k < n_params; k++)
		for (int j = 0; j < o->t[k].n_part; j++) {
			struct optim_part *p = &o->t[k].part[j];
			p->data = p->buf >= 0 ? o->state[p->buf].data + p->off : NULL;
		}
	return 0;
fail:
	optim_free(o);
	return -1;
}

void optim_free(struct optimizer *o)
{
	const struct backend *be = o->be;
	for (int i = 0; i < o->n_state; i++)
		if (o->state[i].data && be && be->free)
			be->free(o->state[i].data);
	if (o->u && be && be->free)
		be->free(o->u);
	if (o->work && be && be->free)
		be->free(o->work);
	if (o->ns && be && be->free)
		be->free(o->ns);
	free(o->t);
	memset(o, 0, sizeof(*o));
}

/* Scale of Muon's orthogonalised update for a rows x cols matrix. */
static float muon_scale(const struct optimizer *o, int rows, int cols)
{
	if (o->muon_scale_rms)
		return 0.2f * (float)sqrt((double)MAX(rows, cols));
	return (float)sqrt(MAX(1.0, (double)rows / (double)cols));
}

static float bias_correction(float beta, long step)
{
	return (float)(1.0 - pow((double)beta, (double)step));
}

/* AdEMAMix's warm-ups at step t of T (Pagliardini et al. 2024, eq. for
 * alpha and beta3 schedulers): alpha rises linearly; beta3 moves from beta1
 * to beta3 so that the half-life of its average grows linearly. */
static void ademamix_schedule(const struct optimizer *o, long t, float *alpha, float *beta3)
{
	double T = (double)o->ademamix_warmup, a = o->ademamix_alpha, b3 = o->beta3;
	double b1 = o->beta1;
	if (T <= 0 || t >= T) {
		*alpha = (float)a;
		*beta3 = (float)b3;
		return;
	}
	double f = (double)t / T;
	*alpha = (float)(f * a);
	double lb1 = log(b1), lb3 = log(b3);
	/* beta1 -> 0 is the limit beta3^(T/t) (ln beta1 -> -inf) */
	double b = b3 <= 0.0 ? 0.0
		   : b1 > 0.0 ? exp(lb1 * lb3 / ((1.0 - f) * lb3 + f * lb1))
			      : (f > 0.0 ? pow(b3, 1.0 / f) : 0.0);
	*beta3 = (float)MIN(b, b3);
}

/* NorMuon's row normalisation of the orthogonalised O[rows, cols] (in
 * place) with its per-row second moment v[rows], then the scale. */
static void normuon_rows(struct optimizer *o, float *O, float *v, int rows, int cols, float lr)
{
	const struct backend *be = o->be;
	size_t n = (size_t)rows * cols;
	double before = sqrt(be->sumsq(O, n));
	be->row_normalize(O, v, rows, cols, o->beta2, 1e-10f);
	double after = sqrt(be->sumsq(O, n)) + 1e-10;
	double s = o->muon_scale_rms ? 0.2 * sqrt((double)n) / after
				     : before / after * sqrt(MAX(1.0, (double)rows / cols));
	be->scale(O, (float)(-lr * s), n);
}

/* Muon's or NorMuon's direction from the orthogonalised momentum O of t,
 * in place: Muon's scale, or NorMuon's row normalisation and scale. */
static void ns_finish(struct optimizer *o, const struct optim_tensor *t, float *O, float lr)
{
	int rows = t->info.rows, cols = t->info.cols;
	if (t->rule == RULE_MUON)
		o->be->scale(O, -lr * muon_scale(o, rows, cols), t->info.numel);
	else
		normuon_rows(o, O, t->part[1].data, rows, cols, lr);
}

/* u = the direction of tensor t (times -lr), advancing its state. */
static void tensor_direction(struct optimizer *o, const struct optim_tensor *t, const float *g,
			     float lr, long step)
{
	const struct backend *be = o->be;
	size_t n = t->info.numel;
	int rows = t->info.rows, cols = t->info.cols;
	float *s[OPTIM_MAX_PARTS]; /* the rule's state, in rule_def's order */
	for (int j = 0; j < t->n_part; j++)
		s[j] = t->part[j].data;

	switch (t->rule) {
	case RULE_ADAMW:
		be->adamw_dir(o->u, g, s[0], s[1], n, lr, o->beta1, o->beta2, o->eps,
			      bias_correction(o->beta1, step), bias_correction(o->beta2, step));
		break;
	case RULE_LION:
		be->lion_dir(o->u, g, s[0], n, lr, o->beta1, o->beta2);
		break;
	case RULE_ADAN:
		be->adan_dir(o->u, g, s[0], s[1], s[2], s[3], n, lr, o->beta1, o->beta2, o->beta3,
			     o->eps, bias_correction(o->beta1, step), bias_correction(o->beta2, step),
			     bias_correction(o->beta3, step), step == 1);
		break;
	case RULE_ADEMAMIX: {
		float alpha, beta3;
		ademamix_schedule(o, step, &alpha, &beta3);
		be->ademamix_dir(o->u, g, s[0], s[1], s[2], n, lr, o->beta1, o->beta2, beta3, alpha,
				 o->eps, bias_correction(o->beta1, step),
				 bias_correction(o->beta2, step));
		break;
	}
	case RULE_MARS: {
		/* the corrected gradient c in work, clipped to norm 1, then AdamW */
		float *c = o->work;
		float coef = o->mars_gamma * o->beta1 / (1.0f - o->beta1);
		be->mars_correct(c, g, s[2], n, coef);
		double norm = sqrt(be->sumsq(c, n));
		if (norm > 1.0)
			be->scale(c, (float)(1.0 / norm), n);
		be->adamw_dir(o->u, c, s[0], s[1], n, lr, o->beta1, o->beta2, o->eps,
			      bias_correction(o->beta1, step), bias_correction(o->beta2, step));
		break;
	}
	case RULE_SGD:
		be->momentum(o->u, g, s[0], n, o->momentum, o->nesterov);
		be->scale(o->u, -lr, n);
		break;
	case RULE_MUON:
	case RULE_NORMUON:
		be->momentum(o->work, g, s[0], n, o->momentum, o->nesterov);
		be->newton_schulz(o->u, o->work, rows, cols, o->ns_steps,
				  o->work + scratch_floats_aligned(n));
		ns_finish(o, t, o->u, lr);
		break;
	case RULE_SOAP: {
		struct soap_state st = {s[0], s[1], s[2], s[3], s[4], s[5]};
		soap_direction(be, &st, o->u, g, o->work, rows, cols, lr, step, o->beta1,
			       o->beta2, o->eps, o->soap_every);
		break;
	}
	}
}

/* The backend's elementwise rule of a tensor rule, or -1. */
static int elementwise_rule(int rule)
{
	return rule == RULE_ADAMW ? OPTIM_ELEM_ADAMW : rule == RULE_LION ? OPTIM_ELEM_LION : -1;
}

/* Every AdamW tensor, then every Lion tensor, in one elementwise_step call
 * each (tensors are independent, so their order does not matter). Returns 1
 * (the per-tensor loop then skips them). */
static int elementwise_batch(struct optimizer *o, float *weights, const float *grads, float lr,
			     long step)
{
	struct optim_elem_tensor *e = xmalloc(sizeof(*e) * (size_t)(o->n + 1));
	for (int rule = OPTIM_ELEM_ADAMW; rule <= OPTIM_ELEM_LION; rule++) {
		int count = 0;
		for (int k = 0; k < o->n; k++) {
			const struct optim_tensor *t = &o->t[k];
			if (elementwise_rule(t->rule) != rule || !t->info.numel || t->skip)
				continue;
			e[count++] = (struct optim_elem_tensor){
				.w = weights + t->woffset,
				.g = grads + t->offset,
				.s0 = t->part[0].data,
				.s1 = rule == OPTIM_ELEM_ADAMW ? t->part[1].data : NULL,
				.u_prev = t->ef ? t->part[t->n_part - 1].data : NULL,
				.n = t->info.numel,
				.decay = t->info.decay ? lr * o->wd : 0.0f,
				/* as below: no correction on the first step or at lambda 0 */
				.correct = t->ef && step > 1 && o->ef_lambda != 0.0f,
			};
		}
		if (count)
			o->be->elementwise_step(rule, e, count, lr, o->beta1, o->beta2, o->eps,
						bias_correction(o->beta1, step),
						bias_correction(o->beta2, step), o->ef_lambda);
	}
	free(e);
	return 1;
}

/* w of tensor t += its direction u (decay, and the correction when t->ef). */
static void apply_direction(struct optimizer *o, const struct optim_tensor *t, float *weights,
			    const float *u, float lr, long step)
{
	const struct backend *be = o->be;
	size_t n = t->info.numel;
	float *w = weights + t->woffset;
	float decay = t->info.decay ? lr * o->wd : 0.0f;
	float *u_prev = t->ef ? t->part[t->n_part - 1].data : NULL;
	/* SOAP's first step only builds its bases (u = 0): its first update,
	 * the one without a correction, is step 2 */
	long first = t->rule == RULE_SOAP ? 2 : 1;
	if (t->rule == RULE_SOAP && step == 1)
		decay = 0.0f;
	if (!t->ef) {
		be->apply_update(w, u, NULL, n, decay, 0.0f);
	} else if (step <= first || o->ef_lambda == 0.0f) {
		/* u[-1] = u[0]: no correction on the first step; lambda 0
		 * leaves the term out so it matches correction = none bit for
		 * bit. Either way u_prev records this update. */
		be->apply_update(w, u, NULL, n, decay, 0.0f);
		be->copy(u_prev, u, n * sizeof(float));
	} else {
		be->apply_update(w, u, u_prev, n, decay, o->ef_lambda);
	}
}

/* Every ns_batch tensor: grouped by shape (in tensor order), in batches
 * of ns_batch_len: momenta into o->ns, one newton_schulz_many, then each
 * direction finished and applied as tensor_direction and the loop would. */
static void ns_batches(struct optimizer *o, float *weights, const float *grads, float lr,
		       long step)
{
	const struct backend *be = o->be;
	char *done = xcalloc((size_t)o->n, 1);
	int *idx = xmalloc(sizeof(int) * (size_t)o->n);
	const float **in = xmalloc(sizeof(*in) * (size_t)o->n);
	float **out = xmalloc(sizeof(*out) * (size_t)o->n);
	for (int k = 0; k < o->n; k++) {
		const struct optim_tensor *t = &o->t[k];
		if (!t->ns_batch || done[k])
			continue;
		int rows = t->info.rows, cols = t->info.cols, count = 0;
		for (int j = k; j < o->n; j++)
			if (o->t[j].ns_batch && !done[j] && o->t[j].info.rows == rows &&
			    o->t[j].info.cols == cols)
				idx[count++] = j, done[j] = 1;
		size_t n = t->info.numel, al = scratch_floats_aligned(n);
		int len = ns_batch_len(o->ns_limit, n, count);
		float *mom = o->ns, *dir = o->ns + (size_t)len * al, *scratch = dir + (size_t)len * al;
		for (int b0 = 0; b0 < count; b0 += len) {
			int nb = MIN(len, count - b0);
			for (int i = 0; i < nb; i++) {
				const struct optim_tensor *u = &o->t[idx[b0 + i]];
				float *m = mom + (size_t)i * al;
				be->momentum(m, grads + u->offset, u->part[0].data, n, o->momentum,
					     o->nesterov);
				in[i] = m;
				out[i] = dir + (size_t)i * al;
			}
			be->newton_schulz_many(out, in, nb, rows, cols, o->ns_steps, scratch);
			for (int i = 0; i < nb; i++) {
				const struct optim_tensor *u = &o->t[idx[b0 + i]];
				ns_finish(o, u, out[i], lr);
				apply_direction(o, u, weights, out[i], lr, step);
			}
		}
	}
	free(done), free(idx), free(in), free(out);
}

void optim_weights_at(struct optimizer *o, const struct stage_param *params)
{
	for (int k = 0; k < o->n; k++)
		if (!o->t[k].skip) {
			if (params[k].woffset == (size_t)-1)
				bug("optimizer: tensor '%s' is updated and its weights are not "
				    "held", o->t[k].info.name);
			o->t[k].woffset = params[k].woffset;
		}
}

void optim_step(struct optimizer *o, float *weights, const float *grads, float lr, long step)
{
	const struct backend *be = o->be;

	if (step < 1)
		step = 1;
	/* AdamW and Lion tensors go to the backend together (one pass, one
	 * launch per group on CUDA; the same bits as the calls below) */
	int batched = be->elementwise_step ? elementwise_batch(o, weights, grads, lr, step) : 0;
	if (o->ns)
		ns_batches(o, weights, grads, lr, step);
	for (int k = 0; k < o->n; k++) {
		const struct optim_tensor *t = &o->t[k];
		if (!t->info.numel || t->skip || (batched && elementwise_rule(t->rule) >= 0) ||
		    (o->ns && t->ns_batch))
			continue;
		tensor_direction(o, t, grads + t->offset, lr, step);
		apply_direction(o, t, weights, o->u, lr, step);
	}
	o->last_step = step;
}

int optim_state_count(const struct optimizer *o)
{
	return o->n_state;
}

struct optim_state_buf optim_state(const struct optimizer *o, int i)
{
	struct optim_state_buf none = { NULL, NULL, 0 };

	if (i < 0 || i >= o->n_state)
		return none;
	return o->state[i];
}

int optim_state_tensor(const struct optimizer *o, int i, int k, struct optim_part *part)
{
	if (i < 0 || i >= o->n_state || k < 0 || k >= o->n)
		return 0;
	const struct optim_tensor *t = &o->t[k];
	for (int j = 0; j < t->n_part; j++)
		if (t->part[j].buf == i) {
			if (part)
				*part = t->part[j];
			return 1;
		}
	return 0;
}

void optim_grad_sumsq(const struct optimizer *o, const float *grads, double *per_tensor)
{
	const float **x = xmalloc(sizeof(*x) * (size_t)(o->n + 1));
	size_t *n = xmalloc(sizeof(*n) * (size_t)(o->n + 1));
	int *at = xmalloc(sizeof(*at) * (size_t)(o->n + 1)), count = 0;
	for (int k = 0; k < o->n; k++) {
		const struct optim_tensor *t = &o->t[k];
		per_tensor[k] = 0.0; /* a tied copy counts once, in its owner */
		if (t->tied_copy || !t->info.numel)
			continue;
		x[count] = grads + t->offset;
		n[count] = t->info.numel;
		at[count++] = k;
	}
	double *sums = xmalloc(sizeof(double) * (size_t)(count + 1));
	if (o->be->sumsq_many) {
		o->be->sumsq_many(sums, x, n, count);
	} else {
		for (int i = 0; i < count; i++)
			sums[i] = o->be->sumsq(x[i], n[i]);
	}
	for (int i = 0; i < count; i++)
		per_tensor[at[i]] = sums[i];
	free(sums);
	free(at);
	free(n);
	free(x);
}

float optim_clip_scale(double sumsq, double max_norm)
{
	double norm = sqrt(sumsq);

	if (!(max_norm > 0.0) || !(norm > max_norm))
		return 1.0f;
	return (float)(max_norm / norm);
}

const char *optim_rule_name(int rule)
{
	return rule >= 0 && rule < RULE_COUNT ? rule_def[rule].name : "?";
}
