/* optim.c - per-stage optimizers composed from the backend's pieces, and the
 * error-feedback correction. See optim.h for the update rules. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../io/util.h"
#include "optim.h"

static const char *rule_name[] = { "adamw", "muon", "lion", "sgd", "adan" };

static int check_unit(const char *key, double x)
{
	if (!(x >= 0.0 && x < 1.0))
		return error("optim.%s = %g is outside [0, 1)", key, x);
	return 0;
}

/* Resolve the [optim] keys into o; -1 on a bad value. */
static int read_config(struct optimizer *o, const struct config *cfg)
{
	const char *name = cfg->optim_name ? cfg->optim_name : "adamw";

	if (!strcmp(name, "adamw"))
		o->kind = OPTIM_ADAMW;
	else if (!strcmp(name, "muon"))
		o->kind = OPTIM_MUON;
	else if (!strcmp(name, "lion"))
		o->kind = OPTIM_LION;
	else if (!strcmp(name, "sgd"))
		o->kind = OPTIM_SGD;
	else if (!strcmp(name, "adan"))
		o->kind = OPTIM_ADAN;
	else
		return error("optim.name: unknown optimizer '%s' (expected adamw, muon, lion, sgd "
			     "or adan)", name);
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

	if (o->kind == OPTIM_ADAMW || o->kind == OPTIM_MUON || o->kind == OPTIM_LION) {
		if (check_unit("beta1", cfg->optim_beta1) || check_unit("beta2", cfg->optim_beta2))
			return -1;
	}
	if (o->kind == OPTIM_ADAN && (check_unit("beta1", cfg->optim_beta1) ||
				      check_unit("beta2", cfg->optim_beta2) ||
				      check_unit("beta3", cfg->optim_beta3)))
		return -1;
	if (o->kind == OPTIM_ADAMW || o->kind == OPTIM_MUON || o->kind == OPTIM_ADAN) {
		if (!(cfg->optim_eps > 0.0))
			return error("optim.eps = %g must be positive", cfg->optim_eps);
	}
	if (o->kind == OPTIM_MUON || o->kind == OPTIM_SGD) {
		if (check_unit("momentum", cfg->optim_momentum))
			return -1;
	}
	if (o->kind == OPTIM_MUON && (cfg->optim_ns_steps < 1 || cfg->optim_ns_steps > 100))
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

static float *alloc_floats(const struct backend *be, size_t n)
{
	if (!n)
		return NULL;
	return be->alloc(st_mult(n, sizeof(float)));
}

static void add_state(struct optimizer *o, const char *name, float *data, size_t numel)
{
	if (!numel)
		return;
	o->state[o->n_state].name = name;
	o->state[o->n_state].data = data;
	o->state[o->n_state].numel = numel;
	o->n_state++;
}

int optim_init(struct optimizer *o, const struct backend *be, const struct config *cfg,
	       const struct model *m, const struct stage_param *params, int n_params,
	       size_t numel)
{
	size_t max_numel = 0, max_mat = 0, max_ns = 0;
	int k;

	memset(o, 0, sizeof(*o));
	o->be = be;
	o->numel = numel;
	if (read_config(o, cfg))
		return -1;
	if (n_params < 0)
		return error("optimizer: negative tensor count %d", n_params);
	if (need_op(be, (const void *)be->alloc, "alloc") || need_op(be, (const void *)be->free, "free") ||
	    need_op(be, (const void *)be->copy, "copy") ||
	    need_op(be, (const void *)be->apply_update, "apply_update") ||
	    need_op(be, (const void *)be->sumsq, "sumsq"))
		return -1;

	o->t = xcalloc(n_params ? n_params : 1, sizeof(*o->t));
	o->n = n_params;
	for (k = 0; k < n_params; k++) {
		struct optim_tensor *t = &o->t[k];
		const struct param_info *pi;

		if (params[k].global < 0 || params[k].global >= m->n_params) {
			error("optimizer: tensor %d refers to parameter %d of %d", k,
			      params[k].global, m->n_params);
			goto fail;
		}
		pi = &m->params[params[k].global];
		t->info = *pi;
		t->offset = params[k].offset;
		t->tied_copy = params[k].tied_copy;
		if (pi->numel > numel || t->offset > numel - pi->numel) {
			error("optimizer: tensor '%s' (%zu floats at %zu) lies outside the stage arena of %zu floats",
			      pi->name, pi->numel, t->offset, numel);
			goto fail;
		}
		switch (o->kind) {
		case OPTIM_ADAMW:
			t->rule = RULE_ADAMW;
			break;
		case OPTIM_LION:
			t->rule = RULE_LION;
			break;
		case OPTIM_SGD:
			t->rule = RULE_SGD;
			break;
		case OPTIM_ADAN:
			t->rule = RULE_ADAN;
			break;
		case OPTIM_MUON:
			t->rule = pi->group == GROUP_MATRIX && pi->rows > 0 && pi->cols > 0 ?
					  RULE_MUON : RULE_ADAMW;
			break;
		}
		switch (t->rule) {
		case RULE_ADAMW:
			t->state_off = o->n_adam;
			o->n_adam = st_add(o->n_adam, pi->numel);
			break;
		case RULE_MUON:
		case RULE_SGD:
			t->state_off = o->n_mom;
			o->n_mom = st_add(o->n_mom, pi->numel);
			break;
		case RULE_LION:
			t->state_off = o->n_lion;
			o->n_lion = st_add(o->n_lion, pi->numel);
			break;
		case RULE_ADAN:
			t->state_off = o->n_adan;
			o->n_adan = st_add(o->n_adan, pi->numel);
			break;
		}
		if (t->rule == RULE_MUON) {
			size_t ns = newton_schulz_scratch(pi->rows, pi->cols);
			max_mat = MAX(max_mat, pi->numel);
			max_ns = MAX(max_ns, ns);
		}
		t->ef = o->correction && ef_selects(cfg, pi->group);
		if (t->ef) {
			t->ef_off = o->n_ef;
			o->n_ef = st_add(o->n_ef, pi->numel);
		}
		max_numel = MAX(max_numel, pi->numel);
	}

	if ((o->n_adam && need_op(be, (const void *)be->adamw_dir, "adamw_dir")) ||
	    (o->n_lion && need_op(be, (const void *)be->lion_dir, "lion_dir")) ||
	    (o->n_adan && need_op(be, (const void *)be->adan_dir, "adan_dir")) ||
	    (o->n_mom && need_op(be, (const void *)be->momentum, "momentum")) ||
	    (o->n_mom && need_op(be, (const void *)be->scale, "scale")) ||
	    (max_mat && need_op(be, (const void *)be->newton_schulz, "newton_schulz")))
		goto fail;

	o->adam_m = alloc_floats(be, o->n_adam);
	o->adam_v = alloc_floats(be, o->n_adam);
	o->lion_m = alloc_floats(be, o->n_lion);
	o->mom = alloc_floats(be, o->n_mom);
	o->ef_prev = alloc_floats(be, o->n_ef);
	o->adan_m = alloc_floats(be, o->n_adan);
	o->adan_v = alloc_floats(be, o->n_adan);
	o->adan_n = alloc_floats(be, o->n_adan);
	o->adan_gprev = alloc_floats(be, o->n_adan);
	o->u = alloc_floats(be, max_numel);
	o->mom_out = alloc_floats(be, max_mat);
	o->ns_scratch = alloc_floats(be, max_ns);
	if ((o->n_adam && (!o->adam_m || !o->adam_v)) || (o->n_lion && !o->lion_m) ||
	    (o->n_mom && !o->mom) || (o->n_ef && !o->ef_prev) || (max_numel && !o->u) ||
	    (max_mat && !o->mom_out) || (max_ns && !o->ns_scratch) ||
	    (o->n_adan && (!o->adan_m || !o->adan_v || !o->adan_n || !o->adan_gprev))) {
		error("optimizer: cannot allocate state on backend '%s'", be->name);
		goto fail;
	}
	/* be->alloc returns zeroed memory; the state starts at zero */
	add_state(o, "adam_m", o->adam_m, o->n_adam);
	add_state(o, "adam_v", o->adam_v, o->n_adam);
	add_state(o, o->kind == OPTIM_MUON ? "muon_momentum" : "sgd_momentum", o->mom, o->n_mom);
	add_state(o, "lion_m", o->lion_m, o->n_lion);
	add_state(o, "adan_m", o->adan_m, o->n_adan);
	add_state(o, "adan_v", o->adan_v, o->n_adan);
	add_state(o, "adan_n", o->adan_n, o->n_adan);
	add_state(o, "adan_prev_grad", o->adan_gprev, o->n_adan);
	add_state(o, "ef_prev_update", o->ef_prev, o->n_ef);
	return 0;
fail:
	optim_free(o);
	return -1;
}

void optim_free(struct optimizer *o)
{
	const struct backend *be = o->be;
	float *bufs[] = { o->adam_m, o->adam_v, o->mom, o->lion_m, o->ef_prev,
			  o->u, o->mom_out, o->ns_scratch, o->adan_m, o->adan_v, o->adan_n,
			  o->adan_gprev };
	size_t i;

	for (i = 0; i < ARRAY_SIZE(bufs); i++)
		if (bufs[i] && be && be->free)
			be->free(bufs[i]);
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

/* u = the direction of tensor t (times -lr), advancing its state. */
static void tensor_direction(struct optimizer *o, const struct optim_tensor *t, const float *g,
			     float lr, long step)
{
	const struct backend *be = o->be;
	size_t n = t->info.numel, so = t->state_off;

	switch (t->rule) {
	case RULE_ADAMW: {
		float bc1 = (float)(1.0 - pow((double)o->beta1, (double)step));
		float bc2 = (float)(1.0 - pow((double)o->beta2, (double)step));
		be->adamw_dir(o->u, g, o->adam_m + so, o->adam_v + so, n, lr, o->beta1,
			      o->beta2, o->eps, bc1, bc2);
		break;
	}
	case RULE_LION:
		be->lion_dir(o->u, g, o->lion_m + so, n, lr, o->beta1, o->beta2);
		break;
	case RULE_ADAN: {
		float bc[3];
		const float b[3] = {o->beta1, o->beta2, o->beta3};
		for (int i = 0; i < 3; i++)
			bc[i] = (float)(1.0 - pow((double)b[i], (double)step));
		be->adan_dir(o->u, g, o->adan_m + so, o->adan_v + so, o->adan_n + so,
			     o->adan_gprev + so, n, lr, o->beta1, o->beta2, o->beta3, o->eps, bc[0],
			     bc[1], bc[2], step == 1);
		break;
	}
	case RULE_SGD:
		be->momentum(o->u, g, o->mom + so, n, o->momentum, o->nesterov);
		be->scale(o->u, -lr, n);
		break;
	case RULE_MUON:
		be->momentum(o->mom_out, g, o->mom + so, n, o->momentum, o->nesterov);
		be->newton_schulz(o->u, o->mom_out, t->info.rows, t->info.cols, o->ns_steps,
				  o->ns_scratch);
		be->scale(o->u, -lr * muon_scale(o, t->info.rows, t->info.cols), n);
		break;
	}
}

void optim_step(struct optimizer *o, float *weights, const float *grads, float lr, long step)
{
	const struct backend *be = o->be;
	int k;

	if (step < 1)
		step = 1;
	for (k = 0; k < o->n; k++) {
		const struct optim_tensor *t = &o->t[k];
		size_t n = t->info.numel;
		float *w = weights + t->offset;
		float decay = t->info.decay ? lr * o->wd : 0.0f;

		if (!n)
			continue;
		tensor_direction(o, t, grads + t->offset, lr, step);
		if (!t->ef) {
			be->apply_update(w, o->u, NULL, n, decay, 0.0f);
		} else if (step == 1 || o->ef_lambda == 0.0f) {
			/* u[-1] = u[0]: no correction on the first step; lambda 0
			 * leaves the term out so it matches correction = none bit for
			 * bit. Either way u_prev records this update. */
			be->apply_update(w, o->u, NULL, n, decay, 0.0f);
			be->copy(o->ef_prev + t->ef_off, o->u, n * sizeof(float));
		} else {
			be->apply_update(w, o->u, o->ef_prev + t->ef_off, n, decay, o->ef_lambda);
		}
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

int optim_state_tensor(const struct optimizer *o, int i, int k, size_t *offset)
{
	const struct optim_tensor *t;
	const float *data;
	size_t off;

	if (i < 0 || i >= o->n_state || k < 0 || k >= o->n)
		return 0;
	t = &o->t[k];
	data = o->state[i].data;
	if (data == o->ef_prev) {
		if (!t->ef)
			return 0;
		off = t->ef_off;
	} else if (data == o->adam_m || data == o->adam_v) {
		if (t->rule != RULE_ADAMW)
			return 0;
		off = t->state_off;
	} else if (data == o->mom) {
		if (t->rule != RULE_MUON && t->rule != RULE_SGD)
			return 0;
		off = t->state_off;
	} else if (data == o->lion_m) {
		if (t->rule != RULE_LION)
			return 0;
		off = t->state_off;
	} else if (data == o->adan_m || data == o->adan_v || data == o->adan_n ||
		   data == o->adan_gprev) {
		if (t->rule != RULE_ADAN)
			return 0;
		off = t->state_off;
	} else {
		return 0;
	}
	if (offset)
		*offset = off;
	return 1;
}

void optim_grad_sumsq(const struct optimizer *o, const float *grads, double *per_tensor)
{
	int k;

	for (k = 0; k < o->n; k++) {
		const struct optim_tensor *t = &o->t[k];

		per_tensor[k] = t->tied_copy || !t->info.numel ?
					0.0 : o->be->sumsq(grads + t->offset, t->info.numel);
	}
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
	return rule >= 0 && rule < (int)ARRAY_SIZE(rule_name) ? rule_name[rule] : "?";
}
