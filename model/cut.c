/* cut.c - the layers of each pipeline stage: even, balanced or listed. */
#include "cut.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/config/config.h"
#include "../io/util.h"
#include "model.h"

/* Stages with room for counts: first[] of S + 1 entries. */
static void cut_alloc(struct stage_cut *c, int L, int S)
{
	c->S = S;
	c->L = L;
	c->first = xcalloc((size_t)S + 1, sizeof(int));
}

void cut_free(struct stage_cut *c)
{
	free(c->first);
	memset(c, 0, sizeof(*c));
}

int cut_even(struct stage_cut *c, int L, int S)
{
	memset(c, 0, sizeof(*c));
	if (S < 1 || S > L)
		return error("pipeline.stages = %d: must be between 1 and model.n_layer (%d) for "
			     "pipeline.split = even", S, L);
	cut_alloc(c, L, S);
	int per = L / S, rem = L % S;
	for (int s = 0; s <= S; s++)
		c->first[s] = s * per + MIN(s, rem);
	return 0;
}

int cut_from_counts(struct stage_cut *c, int L, const int *counts, int S)
{
	memset(c, 0, sizeof(*c));
	if (S < 1)
		return error("a cut needs at least one stage, not %d", S);
	long sum = 0;
	for (int s = 0; s < S; s++) {
		if (counts[s] < 0)
			return error("stage %d: %d layers", s, counts[s]);
		/* a middle stage with no layer would only pass tensors on */
		if (counts[s] == 0 && s > 0 && s < S - 1)
			return error("stage %d has no layer; only the first stage (which holds the "
				     "embeddings) and the last (which holds the head) may have none", s);
		sum += counts[s];
	}
	if (sum != L)
		return error("the stages' layers sum to %ld, not model.n_layer = %d", sum, L);
	cut_alloc(c, L, S);
	for (int s = 0; s < S; s++)
		c->first[s + 1] = c->first[s] + counts[s];
	return 0;
}

int cut_parse_list(const char *list, int *counts, int max, char *err, size_t len)
{
	int n = 0;
	const char *p = list;
	for (;;) {
		while (*p == ' ' || *p == '\t')
			p++;
		const char *item = p;
		char *end;
		errno = 0;
		long v = isdigit((unsigned char)*p) ? strtol(p, &end, 10) : -1;
		if (v >= 0) {
			p = end;
			while (*p == ' ' || *p == '\t')
				p++;
		}
		if (v < 0 || errno || v > 1000000 || (*p && *p != ',')) {
			int w = (int)strcspn(item, ",");
			snprintf(err, len, "'%.*s' is not a number of layers", w, item);
			return -1;
		}
		if (n == max) {
			snprintf(err, len, "more than %d stages listed", max);
			return -1;
		}
		counts[n++] = (int)v;
		if (!*p)
			return n;
		p++; /* the comma */
	}
}

int cut_balance_counts(double first_fixed, double last_fixed, double layer, int L, int S,
		       int *counts)
{
	if (S < 1 || !(layer > 0) || !(first_fixed >= 0) || !(last_fixed >= 0) ||
	    (S == 1 ? L < 1 : L < S - 2))
		return -1;
	if (S == 1) {
		counts[0] = L;
		return 0;
	}
	/* Start from the least each stage must hold, then hand out the layers
	 * one at a time, each to the stage that is cheapest after taking it.
	 * Every layer costs the same, so this is optimal: the largest cost is
	 * the (L - S + 2)-th smallest of the values fixed_s + k * layer a
	 * stage passes through, which is the least any cut can reach. */
	double *cost = xmalloc(st_mult((size_t)S, sizeof(double)));
	for (int s = 0; s < S; s++) {
		counts[s] = s > 0 && s < S - 1;
		cost[s] = (s == 0 ? first_fixed : 0) + (s == S - 1 ? last_fixed : 0) +
			  counts[s] * layer;
	}
	for (int left = L - (S - 2); left > 0; left--) {
		int best = 0;
		for (int s = 1; s < S; s++)
			if (cost[s] < cost[best])
				best = s;
		counts[best]++;
		cost[best] += layer;
	}
	free(cost);
	return 0;
}

void cut_model_costs(const struct model *m, struct cut_costs *k)
{
	const struct model_config *mc = &m->cfg;
	memset(k, 0, sizeof(*k));
	for (int i = 0; i < m->n_params; i++) {
		const struct param_info *p = &m->params[i];
		double f = 6.0 * (double)p->numel * model_param_share(m, p);
		if (p->layer == 0)
			k->layer += f;
		else if (p->layer > 0 || !strcmp(p->name, "wpe"))
			continue;
		else if (!strcmp(p->name, "wte"))
			k->last += mc->tied ? f : 0; /* tied: the head's matrix */
		else
			k->last += f; /* lnfw, lnfb, head */
	}
	k->layer += 6.0 * mc->C * (double)mc->T;
}

double cut_stage_flops(const struct model *m, const struct stage_cut *c, int s)
{
	struct cut_costs k;
	cut_model_costs(m, &k);
	return cut_layers(c, s) * k.layer + (s == 0 ? k.first : 0) +
	       (s == c->S - 1 ? k.last : 0);
}

int cut_balanced(struct stage_cut *c, const struct model *m, int S)
{
	int L = m->cfg.L;
	memset(c, 0, sizeof(*c));
	if (S < 1 || (S > 2 && L < S - 2))
		return error("pipeline.stages = %d: pipeline.split = balanced needs at most "
			     "model.n_layer + 2 = %d stages (every middle stage needs a layer)", S,
			     L + 2);
	struct cut_costs k;
	cut_model_costs(m, &k);
	int *counts = xmalloc(st_mult((size_t)S, sizeof(int)));
	int rc = cut_balance_counts(k.first, k.last, k.layer, L, S, counts);
	if (!rc)
		rc = cut_from_counts(c, L, counts, S);
	else
		rc = error("internal error: no balanced cut of %d layers over %d stages", L, S);
	free(counts);
	return rc;
}

/* pipeline.split = layers: pipeline.layers, checked against the stages
 * and the layers; every message names the keys and says what to write. */
static int cut_listed(struct stage_cut *c, const struct config *cfg, int L, int S)
{
	const char *list = cfg->pipeline_layers;
	if (!list[0])
		return error("pipeline.split = layers needs pipeline.layers: one layer count per "
			     "stage, e.g. pipeline.layers = %d%s", L, S > 1 ? ",... (as many as "
			     "pipeline.stages)" : "");
	int items = 1;
	for (const char *p = list; *p; p++)
		items += *p == ',';
	int *counts = xmalloc(st_mult((size_t)items, sizeof(int)));
	char why[160];
	int n = cut_parse_list(list, counts, items, why, sizeof(why));
	int rc = -1;
	if (n < 0) {
		error("pipeline.layers = %s: %s; write one count per stage, e.g. 3,4,4,2", list,
		      why);
	} else if (n != S) {
		error("pipeline.layers = %s lists %d stage%s, but pipeline.stages = %d; give one "
		      "layer count per stage", list, n, n == 1 ? "" : "s", S);
	} else {
		long sum = 0;
		for (int s = 0; s < S; s++)
			sum += counts[s];
		int mid0 = -1;
		for (int s = 1; s < S - 1 && mid0 < 0; s++)
			if (!counts[s])
				mid0 = s;
		if (sum != L)
			error("pipeline.layers = %s sums to %ld layers, but model.n_layer = %d; the "
			      "counts must add up to model.n_layer", list, sum, L);
		else if (mid0 >= 0)
			error("pipeline.layers = %s gives stage %d no layer; only the first stage "
			      "(which holds the embeddings) and the last (which holds the head) may "
			      "have none", list, mid0);
		else
			rc = cut_from_counts(c, L, counts, S);
	}
	free(counts);
	return rc;
}

int cut_from_config(struct stage_cut *c, const struct config *cfg, const struct model *m)
{
	int L = m->cfg.L, S = (int)cfg->pipeline_stages;
	const char *split = cfg->pipeline_split;
	memset(c, 0, sizeof(*c));
	if (strcmp(split, "layers") && cfg->pipeline_layers[0])
		return error("pipeline.layers = %s is set, but pipeline.split = %s; set "
			     "pipeline.split = layers to use it (or empty pipeline.layers)",
			     cfg->pipeline_layers, split);
	if (!strcmp(split, "layers"))
		return cut_listed(c, cfg, L, S);
	if (!strcmp(split, "balanced"))
		return cut_balanced(c, m, S);
	return cut_even(c, L, S);
}

void cut_format(const struct stage_cut *c, char *buf, size_t len)
{
	size_t pos = 0;
	if (len)
		buf[0] = '\0';
	for (int s = 0; s < c->S && pos < len; s++)
		pos += (size_t)snprintf(buf + pos, len - pos, "%s%d", s ? "," : "", cut_layers(c, s));
}

/* The lightest and heaviest stage of c by modelled cost; lightest/heaviest. */
static double cut_spread(const struct model *m, const struct stage_cut *c, int *lo, int *hi)
{
	*lo = *hi = 0;
	double cmin = cut_stage_flops(m, c, 0), cmax = cmin;
	for (int s = 1; s < c->S; s++) {
		double f = cut_stage_flops(m, c, s);
		if (f < cmin) {
			cmin = f;
			*lo = s;
		}
		if (f > cmax) {
			cmax = f;
			*hi = s;
		}
	}
	return cmax > 0 ? cmin / cmax : 1.0;
}

int cut_advice(const struct stage_cut *c, const struct model *m, const char *split, char *buf,
	       size_t len)
{
	int lo, hi, blo, bhi;
	double ratio = c->S > 1 ? cut_spread(m, c, &lo, &hi) : 1.0;
	struct stage_cut b;
	/* a valid cut has a layer on every middle stage: a balanced one exists */
	if (ratio >= 1.0 - CUT_SPREAD_MAX || cut_balanced(&b, m, c->S))
		return 0;
	double bratio = cut_spread(m, &b, &blo, &bhi);
	/* better: a lighter heaviest stage (every step waits for it) */
	int better = cut_stage_flops(m, &b, bhi) < cut_stage_flops(m, c, hi);
	if (better) {
		char have[64], want[64];
		cut_format(c, have, sizeof(have));
		cut_format(&b, want, sizeof(want));
		snprintf(buf, len, "pipeline.split = %s (layers %s) models stage %d at %.0f%% of "
			 "stage %d's cost%s, so stage %d waits for it every step; set "
			 "pipeline.split = balanced (layers %s: the lightest stage at %.0f%% of "
			 "the heaviest)", split, have, lo, 100 * ratio, hi,
			 hi == c->S - 1 ? " (the last stage holds the head)" : "", lo, want,
			 100 * bratio);
	}
	cut_free(&b);
	return better;
}
