/* bench_plan_mem.c - a GPU's memory for bench plan (see bench_plan_mem.h). */
#include "bench_plan_mem.h"

#include <stdlib.h>
#include <string.h>

#include "../io/util.h"
#include "../model/cut.h"
#include "../optim/optim.h"

/* Piece p's part of stage memory: its weights, gradients, optimizer and
 * activations at `slots` activation slots and `versions` weight versions. */
static int piece_memory(const struct model *m, const struct config *cfg,
			const struct stage_cut *cut, int p, int slots, int versions, int split,
			int B, int T, const struct plan_device *dev, long ep, struct plan_mem *out)
{
	struct stage_size z;
	struct stage_param *params;
	if (stage_size(m, cut, p, B, T, dev->act_dtype, dev->cuda, split ? 0 : -1, &z, &params))
		return -1;
	/* member 0 of an expert-parallel group: the experts [0, E/ep) of each
	 * layer are its own (every member holds as many) */
	unsigned char *mine = NULL;
	size_t held = z.numel; /* its weight arena (model.h: stage_hold_weights) */
	if (ep > 1) {
		mine = xcalloc((size_t)z.n_params, 1);
		for (int k = 0; k < z.n_params; k++) {
			const struct param_info *pi = &m->params[params[k].global];
			int e = model_param_expert(m, pi);
			mine[k] = e < 0 || e < m->cfg.E / ep;
			held -= mine[k] ? 0 : pi->numel;
		}
	}
	size_t optim;
	int rc = optim_size(cfg, m, params, z.n_params, z.numel, mine, dev->cuda, &optim);
	free(mine);
	free(params);
	if (rc)
		return -1;
	/* weights and their bf16 copies hold the replica's own experts only;
	 * the gradients every expert (sched/comm/experts.h says why) */
	out->weights += (double)held * sizeof(float) * versions;
	out->copies += dev->cuda ? (double)held * 2 * versions : 0;
	out->grads += 2 * (double)z.numel * sizeof(float);
	out->optim += (double)optim;
	out->acts += (double)z.act_bytes_per_slot * slots + (double)z.scratch_bytes;
	out->slot += (double)z.act_bytes_per_slot;
	return 0;
}

int plan_stage_memory(const struct model *m, const struct config *cfg,
		      const struct schedule *sc, int s, int B, int T,
		      const struct plan_device *dev, long ep, struct plan_mem *out)
{
	struct stage_cut cut;
	memset(out, 0, sizeof(*out));
	out->stage = s;
	if (cut_even(&cut, m->cfg.L, sc->S * sc->V))
		return -1;
	int rc = 0, versions = sched_stage(sc, s)->nversions;
	for (int c = 0; c < sc->V && !rc; c++) {
		int p = sched_piece(sc, s, c);
		rc = piece_memory(m, cfg, &cut, p, sched_piece_slots(sc, p), versions,
				  sched_kind_split(sc->kind), B, T, dev, ep, out);
	}
	cut_free(&cut);
	return rc;
}

int plan_memory(const struct model *m, const struct config *cfg, const struct schedule *sc,
		int B, int T, const struct plan_device *dev, long ep, struct plan_mem *out)
{
	memset(out, 0, sizeof(*out));
	for (int s = 0; s < sc->S; s++) {
		struct plan_mem pm;
		if (plan_stage_memory(m, cfg, sc, s, B, T, dev, ep, &pm))
			return -1;
		if (s == 0 || plan_mem_total(&pm) > plan_mem_total(out))
			*out = pm;
	}
	return 0;
}
