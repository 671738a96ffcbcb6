/* cut.h - where the pipeline is cut: which layers each stage owns.
 *
 * Stage s of S owns layers [first[s], first[s+1]); stage 0 also holds the
 * embeddings, the last stage the final norm and the head. Three ways to
 * choose the cut (pipeline.split):
 *   even      L/S layers each, the first L%S stages one more (the rule
 *             every release before pipeline.split used);
 *   balanced  the counts that minimise the largest stage cost, the cost
 *             being cut_stage_flops (the head of a 50k vocabulary weighs
 *             about five GPT-2 124M layers); the default;
 *   layers    pipeline.layers, one count per stage.
 * Every stage but the first and the last has at least one layer; the first
 * and the last may have none, since they still hold the embeddings and the
 * head (a head-only last stage is what balanced picks for GPT-2 124M over
 * 4 stages). Every part of a run that needs the layers of a stage (the
 * threads of a pipeline, each MPI rank, the one-worker emulation, bench)
 * takes them from cut_from_config, so they cannot disagree.
 *
 * A checkpoint does not depend on the cut: it holds the global arena.
 */
#ifndef ASYNCPP_CUT_H
#define ASYNCPP_CUT_H

#include <stddef.h>

struct model;
struct config;

struct stage_cut {
	int S, L;
	int *first; /* [S + 1], first[0] = 0, first[S] = L */
};

/* Layers of stage s under cut c. */
static inline int cut_layers(const struct stage_cut *c, int s)
{
	return c->first[s + 1] - c->first[s];
}

/* The even cut of L layers over S stages; -1 with error() when S < 1 or
 * S > L (every stage needs a layer). */
int cut_even(struct stage_cut *c, int L, int S);
/* A cut from per-stage counts[S]; -1 with error() when a count is negative,
 * a middle stage has none, or the counts do not sum to L. */
int cut_from_counts(struct stage_cut *c, int L, const int *counts, int S);
/* Parse "3,4,4,2" (blanks around the numbers allowed) into counts[max];
 * returns how many, or -1 with a message in err naming the bad item. */
int cut_parse_list(const char *list, int *counts, int max, char *err, size_t len);
/* The counts[S] (summing to L) that minimise the largest stage cost
 * first_fixed + n_0 * layer, n_s * layer, ..., last_fixed + n_(S-1) * layer
 * (S = 1: first_fixed + last_fixed + L * layer), middle stages having at
 * least one layer; of the optimal counts, the ones that give each layer in
 * turn to the cheapest stage after it, the earlier on a tie (so equal
 * costs give the even cut). Needs layer > 0, fixed costs >= 0 and
 * L >= S - 2 (L >= 1 when S = 1); returns -1 otherwise. */
int cut_balance_counts(double first_fixed, double last_fixed, double layer, int L, int S,
		       int *counts);
/* The balanced cut of m over S stages (cut_balance_counts on
 * cut_model_costs); -1 with error() when S > L + 2. */
int cut_balanced(struct stage_cut *c, const struct model *m, int S);
/* The cut pipeline.split, pipeline.layers and pipeline.stages describe for
 * m; -1 with error() naming the key and the fix. */
int cut_from_config(struct stage_cut *c, const struct config *cfg, const struct model *m);
void cut_free(struct stage_cut *c);
/* "3,4,4,2" into buf. */
void cut_format(const struct stage_cut *c, char *buf, size_t len);
/* When c's stages' modelled costs (cut_stage_flops) differ by more than
 * CUT_SPREAD_MAX (the lightest below 80% of the heaviest) and the balanced
 * cut of m does better: 1, with a sentence in buf saying so and which
 * pipeline.split to use (split: the one that made c); else 0. */
#define CUT_SPREAD_MAX 0.20
int cut_advice(const struct stage_cut *c, const struct model *m, const char *split, char *buf,
	       size_t len);

/* The cost model: training FLOPs per token (forward + backward), the
 * accounting of model_flops_per_token split by where it is spent: 6 per
 * weight a stage multiplies with (norm weights and biases included; an
 * expert's weights times the share K/E of the tokens routed to it), plus
 * 6 * C * T per layer for attention; the embedding lookup counts 0 (wte is
 * counted where it is the head, wpe never). Summed over the stages of any
 * cut it is model_flops_per_token(m). */
struct cut_costs {
	double layer;      /* one block */
	double first;      /* stage 0 without its layers: the embeddings (0) */
	double last;       /* the last stage without its layers: lnf and the head */
};
void cut_model_costs(const struct model *m, struct cut_costs *k);
double cut_stage_flops(const struct model *m, const struct stage_cut *c, int s);

#endif
