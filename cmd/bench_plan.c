/* bench_plan.c - `asyncpp bench plan`: predicted tokens/s and idle of the
 * synchronous schedules (1F1B, interleaved 1F1B, ZB-H1, ZB-V) against
 * PipeDream-2BW at scales beyond the machines at hand, from a model shape, a
 * compute rate (measured: bench train --device cuda) and link figures, by
 * simulating the real schedules (sched/simulate.c).
 *
 * The model of one training step, per pipeline replica:
 *   layer forward  B*T*(24*C^2 + 4*T*C) FLOPs at the compute rate (the
 *                  per-token FLOPs of bench train's formula, a third of it);
 *                  backward twice that. The last stage also runs the head,
 *                  2*B*T*C*V forward FLOPs (and twice that backward).
 *   layers         L split evenly; the first L mod S stages take one more.
 *   hand-off       B*T*C activations of act_bytes each, over NVLink inside
 *                  a node (stages of a replica sit on consecutive GPUs) and
 *                  InfiniBand across nodes, plus a latency per message.
 *   optimizer      16 bytes of state traffic per parameter of the stage at
 *                  the memory bandwidth (AdamW: weights, gradient, moments).
 *   data parallel  a ring all-reduce of each stage's fp32 gradients over the
 *                  DP replicas, across nodes (InfiniBand): 2(N-1)/N x bytes
 *                  / bandwidth + 2(N-1) latencies, in buckets of --bucket-mb
 *                  (pipeline.bucket_mb) sent as the step's last backward
 *                  finishes them; the stage's optimizer step waits for the
 *                  last (sim_reduce_end), under both kinds, as the executor
 *                  does.
 * A mixture of experts (--experts; costs in bench_plan_moe.h) replaces a
 * layer's FLOPs by its active FLOPs, adds the all-to-all of each MoE layer
 * to its forward and backward, keeps E/EP of the experts on a GPU (for the
 * optimizer step, the memory column and the replicas' sum: the experts'
 * gradients are summed over the DP/EP replicas holding the same ones).
 *   chunks         interleaved (V = 2) and zb-v run each stage as two
 *                  chunks of half its layers: half its times per op, the
 *                  same hand-off bytes per message (twice the messages).
 *   split backward zb-h1 and zb-v split each backward into the input
 *                  gradient and the weight gradient, half of it each (the
 *                  weight gradient is the matmuls' second half).
 * A step's time is the simulated makespan per step (2BW and 2bw-zb: the
 * steady-state window's), tokens/s = DP x M x B x T / step time, idle = the simulated
 * bubble (waits for the replicas' sum included). Activation memory is the
 * most activation slots any stage holds, counted in micro-batches of that
 * stage's activations (a chunk's slot is 1/V of one). The split kinds also
 * hold the output gradients of the micro-batches between B and W ("held
 * W"). The memory table gives each schedule's fullest GPU in bytes, sized
 * by asyncpp's own code for the model it would build (bench_plan_mem.h;
 * the presets' heads, feed-forward widths and tied heads below), the
 * activations included; --gpu-mem marks the rows that fit.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/config/config.h"
#include "../io/util.h"
#include "../model/model.h"
#include "../sched/schedule.h"
#include "bench.h"
#include "bench_plan_mem.h"
#include "bench_plan_moe.h"
#include "opts.h"

static const char *const usage[] = {
	"asyncpp bench plan [--model NAME] [--layers L] [--d-model C] [--vocab V] [--seq T] [--batch B] [--micro-per-stage K] [--experts E] [--top-k K] [--d-expert DE] [--shared-expert] [--tflops F] [--nvlink GB/s] [--ib GB/s] [--hbm GB/s] [--latency US] [--gpus-per-node G] [--act-bytes N] [--bucket-mb MB] [--gpu-mem GB] [--optimizer NAME] [--stages LIST] [--dp LIST] [--ep LIST]",
	NULL,
};

struct plan {
	long L, C, V, T, B, K;               /* model, micro-batch, M = K*S */
	double tflops;                       /* achieved compute per GPU */
	double nvlink, ib, hbm;              /* GB/s */
	double latency;                      /* seconds per message */
	long gpus_per_node;
	double act_bytes;
	double bucket_mb;                    /* 0: one sum after the backward */
	struct plan_moe moe;                 /* E = 0: dense */
	/* memory (bench_plan_mem.h): the model asyncpp would build (sized:
	 * 0 with --vocab 0, which no asyncpp model has), the optimizer's
	 * configuration, the backend, the GPU's bytes */
	int sized;
	struct model m;
	struct config cfg;
	struct plan_device dev;
	double gpu_bytes;
};

struct prediction {
	double tokens_per_s, idle, step_s;
	struct plan_mem mem; /* the fullest GPU's bytes (when p->sized) */
	double act;       /* peak activations on a stage, in its micro-batches */
	double held;      /* peak B-done-W-pending micro-batches, the same unit */
	int versions;     /* peak weight versions on a stage */
	int ok;           /* 0: the schedule does not fit (its reason in why) */
	char why[160];
};

static double layer_fwd_s(const struct plan *p)
{
	double bt = (double)p->B * (double)p->T, C = (double)p->C;
	return bt * (24 * C * C + 4 * (double)p->T * C) / (p->tflops * 1e12);
}

/* Ring all-reduce of bytes over n ranks across nodes. */
static double ring_s(const struct plan *p, double bytes, long n)
{
	return 2.0 * (n - 1) / n * bytes / (p->ib * 1e9) + 2.0 * (n - 1) * p->latency;
}

/* The times of a stage of a mixture of experts (`layers` layers, emb its
 * embedding or head parameters, head_f the head's forward) at N replicas,
 * ep of them sharing out the experts. */
static void moe_stage(const struct plan *p, long layers, double emb, double head_f, int N,
		      long ep, struct sim_times *t)
{
	double bt = (double)p->B * (double)p->T;
	struct moe_layer_cost c;
	moe_layer_cost(&p->moe, (double)p->C, (double)p->T, bt, ep, p->act_bytes, &c);
	double f = (double)layers * c.fwd_flops / (p->tflops * 1e12) + head_f;
	double a2a = (double)layers * moe_a2a_seconds(c.a2a_bytes, ep, p->ib * 1e9, p->latency);
	double dense = (double)layers * c.dense_params + emb;
	double experts = (double)layers * c.expert_params / (double)ep;
	double params = dense + experts;
	t->fwd = f + a2a;
	t->bwd = 2 * f + a2a;
	t->optim = params * 16 / (p->hbm * 1e9);
	/* fp32 gradients: the shared part over all N replicas, each expert over
	 * the N/ep holding it */
	t->reduce = (N > 1 ? ring_s(p, dense * 4, N) : 0) +
		    (N / ep > 1 ? ring_s(p, experts * 4, N / ep) : 0);
	double bucket = p->bucket_mb * 1048576.0;
	t->buckets = bucket > 0 ? (int)MIN(ceil(params * 4 / bucket), 1 << 20) : 1;
	if (t->reduce == 0)
		t->buckets = 0;
}

/* One stage layout and schedule kind (V chunks per stage) at S stages and N
 * replicas, ep of them sharing out a mixture's experts (1 for a dense
 * model). A kind that cannot run this layout (too few layers for its
 * chunks, too few micro-batches) gets out->ok = 0 and returns 0. */
static int predict(const struct plan *p, int kind, int V, int S, int N, long ep,
		   struct prediction *out)
{
	int M = (int)p->K * S;
	memset(out, 0, sizeof(*out));
	if (p->L < (long)S * V) {
		snprintf(out->why, sizeof(out->why), "%d chunks need %d layers", S * V, S * V);
		return 0;
	}
	double C = (double)p->C, bt = (double)p->B * (double)p->T;
	double lf = layer_fwd_s(p), head_f = 2 * bt * C * (double)p->V / (p->tflops * 1e12);
	double hop_bytes = bt * C * p->act_bytes;
	struct sim_times *t = xcalloc((size_t)S, sizeof(*t));
	for (int s = 0; s < S; s++) {
		long layers = p->L / S + (s < p->L % S);
		if (p->moe.E) {
			double emb = s == S - 1 || s == 0 ? C * (double)p->V : 0;
			int crosses = (s + 1) % p->gpus_per_node == 0;
			moe_stage(p, layers, emb, s == S - 1 ? head_f : 0, N, ep, &t[s]);
			t[s].comm = p->latency + hop_bytes / ((crosses ? p->ib : p->nvlink) * 1e9);
			continue;
		}
		double f = (double)layers * lf + (s == S - 1 ? head_f : 0);
		double params = (double)layers * 12 * C * C + (s == S - 1 || s == 0 ? C * (double)p->V : 0);
		int crosses = (s + 1) % p->gpus_per_node == 0; /* s -> s+1 leaves the node */
		double bw = (crosses ? p->ib : p->nvlink) * 1e9;
		double bytes = params * 4, bucket = p->bucket_mb * 1048576.0;
		t[s] = (struct sim_times){.fwd = f, .bwd = 2 * f,
					  .comm = p->latency + hop_bytes / bw,
					  .optim = params * 16 / (p->hbm * 1e9)};
		if (N > 1) { /* the stage's gradients, fp32, ring over the replicas */
			t[s].reduce = 2.0 * (N - 1) / N * bytes / (p->ib * 1e9) +
				      2.0 * (N - 1) * p->latency;
			t[s].buckets = bucket > 0 ? (int)MIN(ceil(bytes / bucket), 1 << 20) : 1;
		}
	}
	int steps = sched_kind_async(kind) ? 6 : 1;
	char err[256];
	struct schedule *sc = sched_build_virtual(kind, S, M, V, steps, 0, err, sizeof(err));
	if (!sc) {
		free(t);
		snprintf(out->why, sizeof(out->why), "%.150s", err);
		return 0;
	}
	struct sim_result r;
	int rc = sched_simulate_stages(sc, t, &r);
	free(t);
	if (!rc && p->sized &&
	    plan_memory(&p->m, &p->cfg, sc, (int)p->B, (int)p->T, &p->dev, ep, &out->mem)) {
		sim_result_free(&r);
		rc = -1;
	}
	if (rc) {
		sched_free(sc);
		return -1;
	}
	double step = r.makespan, idle = r.bubble;
	if (sched_kind_async(kind) && r.steady_bubble >= 0 && r.steady_hi > r.steady_lo) {
		step = (r.steady_t1 - r.steady_t0) / (r.steady_hi - r.steady_lo);
		idle = r.steady_bubble;
	}
	out->step_s = step;
	out->idle = idle;
	out->tokens_per_s = (double)N * M * bt / step;
	for (int s = 0; s < S; s++) {
		const struct sched_stage *st = sched_stage(sc, s);
		out->act = MAX(out->act, (double)st->nslots / sc->V);
		out->held = MAX(out->held, (double)st->npending / sc->V);
		out->versions = MAX(out->versions, st->nversions);
	}
	out->ok = 1;
	sim_result_free(&r);
	sched_free(sc);
	return 0;
}

/* The schedules compared: the synchronous ones, then 2bw. */
static const struct {
	const char *name;
	int kind, V;
} kinds[] = {
	{"1f1b", SCHED_1F1B, 1},
	{"interleaved/2", SCHED_INTERLEAVED, 2},
	{"zb-h1", SCHED_ZBH1, 1},
	{"zb-v", SCHED_ZBV, 2},
	{"2bw", SCHED_2BW, 1},
	{"2bw-zb", SCHED_2BW_ZB, 1},
};
#define N_SYNC 4 /* kinds[0..3] */
#define I_2BW 4  /* kinds[4] */

/* The memory table's explanation and column heads; ep: with an EP column */
static void mem_header(const struct plan *p, int ep)
{
	printf("memory of each schedule's fullest GPU (stage GPU), GB of 1e9 bytes, as asyncpp "
	       "allocates it\non the CUDA backend: weights = fp32 x the weight versions; bf16 = "
	       "their copies for the\nproducts; grads = two fp32 accumulators; optim = %s state "
	       "and update scratch;\nact/mb = MB one micro-batch saves on that GPU; acts = act x "
	       "that + backward scratch;\nfits = total <= --gpu-mem %g GB\n",
	       p->cfg.optim_name, p->gpu_bytes / 1e9);
	if (ep)
		printf("%6s %4s", "S", "EP");
	else
		printf("%6s", "S");
	printf("  %-13s %4s %8s %8s %8s %8s %8s %8s %8s %5s\n", "schedule", "GPU", "weights",
	       "bf16", "grads", "optim", "act/mb", "acts", "total", "fits");
}

/* A row of the memory table; ep 0: no EP column */
static void mem_row(const struct plan *p, long S, long ep, const char *name,
		    const struct prediction *pr)
{
	const struct plan_mem *m = &pr->mem;
	if (ep)
		printf("%6ld %4ld", S, ep);
	else
		printf("%6ld", S);
	printf("  %-13s %4d %8.3f %8.3f %8.3f %8.3f %8.1f %8.3f %8.3f %5s\n", name, m->stage,
	       m->weights / 1e9, m->copies / 1e9, m->grads / 1e9, m->optim / 1e9, m->slot / 1e6,
	       m->acts / 1e9, plan_mem_total(m) / 1e9,
	       plan_mem_total(m) <= p->gpu_bytes ? "yes" : "no");
}

/* Per schedule at S stages and N replicas: tokens/s, idle, activations in
 * micro-batches and versions, and each against 2bw; or (mem) the memory of
 * its fullest GPU. */
static int print_schedules(const struct plan *p, long S, long N, int mem)
{
	struct prediction pr[ARRAY_SIZE(kinds)];
	for (size_t k = 0; k < ARRAY_SIZE(kinds); k++)
		if (predict(p, kinds[k].kind, kinds[k].V, (int)S, (int)N, 1, &pr[k]))
			return -1;
	const struct prediction *bw = &pr[I_2BW];
	for (size_t k = 0; k < ARRAY_SIZE(kinds); k++) {
		if (!pr[k].ok && mem)
			printf("%6ld  %-14s (%s)\n", S, kinds[k].name, pr[k].why);
		else if (!pr[k].ok)
			printf("%6ld %6ld  %-14s (%s)\n", S, N, kinds[k].name, pr[k].why);
		if (!pr[k].ok)
			continue;
		if (mem) {
			mem_row(p, S, 0, kinds[k].name, &pr[k]);
			continue;
		}
		printf("%6ld %6ld  %-14s %12.4g %8.4f %7.2f %7.2f %9d", S, N, kinds[k].name,
		       pr[k].tokens_per_s, pr[k].idle, pr[k].act, pr[k].held, pr[k].versions);
		if (bw->ok)
			printf(" %8.3f", bw->tokens_per_s / pr[k].tokens_per_s);
		printf("\n");
	}
	return 0;
}

/* The rest of a preset's shape, for its memory (struct model_config):
 * architecture, head width HD, query heads per key/value head, feed-forward
 * width (0: the architecture's default), tied embedding and head. GPT-3 is
 * GPT-2's architecture (learned positions, tied head); the MoE is a llama
 * (asyncpp's mixtures are). */
static const struct {
	const char *name;
	long L, C, V;
	struct plan_moe moe;
	int arch, HD, group, F, tied;
} presets[] = {
	{"gpt2-124m", 12, 768, 50257, {0}, ARCH_GPT2, 64, 1, 0, 1},
	{"gpt2-1.5b", 48, 1600, 50257, {0}, ARCH_GPT2, 64, 1, 0, 1},
	{"llama-8b", 32, 4096, 128256, {0}, ARCH_LLAMA, 128, 4, 14336, 0},
	{"gpt3-175b", 96, 12288, 50257, {0}, ARCH_GPT2, 128, 1, 0, 1},
	/* the paper's 10B MoE: its shape is not published with the figures;
	 * this one (OLMoE's layer, 64 experts of width 1024, top-8, at 24
	 * layers) has 10.3B parameters, 1.8B active */
	{"moe-10b", 24, 2048, 50304, {64, 8, 1024, 0}, ARCH_LLAMA, 128, 1, 0, 0},
};

/* The model asyncpp would build for preset i at width C, L layers,
 * vocabulary V, context T, mixture moe: the preset's head width where it
 * divides C (else one head), a mixture on a llama. */
static int plan_model(struct model *m, size_t i, long L, long C, long V, long T,
		      const struct plan_moe *moe)
{
	struct model_config mc = {0};
	int hd = presets[i].HD;
	mc.arch = moe->E ? ARCH_LLAMA : presets[i].arch;
	mc.L = (int)L;
	mc.C = (int)C;
	mc.V = (int)V;
	mc.T = (int)T;
	mc.NH = C % hd ? 1 : (int)(C / hd);
	mc.NKV = mc.arch == ARCH_LLAMA && mc.NH % presets[i].group == 0 ? mc.NH / presets[i].group
								       : mc.NH;
	mc.F = C == presets[i].C && !moe->E ? presets[i].F : 0;
	mc.tied = moe->E ? 0 : presets[i].tied;
	mc.E = (int)moe->E;
	mc.K = (int)moe->K;
	mc.De = (int)moe->De;
	mc.shared = (int)moe->shared;
	return model_init(m, &mc);
}

/* --experts, --top-k, --d-expert, --shared-expert and --ep over the
 * preset's mixture (E = 0: dense, where they are refused but --experts). */
static void plan_moe_options(struct plan_moe *moe, long E, long K, long De, int shared,
			     const char *ep_list, const struct option *opts)
{
	if (E != -1) /* given */
		*moe = (struct plan_moe){E, moe->K, moe->De, moe->shared};
	if (!moe->E) {
		if (K || De || shared || ep_list)
			opts_usage_error(usage, opts, "--top-k, --d-expert, --shared-expert and --ep "
					 "need --experts E (or --model moe-10b)");
		return;
	}
	moe->K = K ? K : moe->K ? moe->K : 2;
	moe->De = De ? De : moe->De;
	moe->shared |= shared;
	if (moe->E < 1 || moe->E > 4096 || moe->K < 1 || moe->K > moe->E)
		opts_usage_error(usage, opts, "--experts must be 1..4096 and --top-k 1..E (got %ld "
				 "and %ld)", moe->E, moe->K);
	if (moe->De < 1)
		opts_usage_error(usage, opts, "--experts needs --d-expert DE, each expert's width");
}

/* Each expert-parallel degree of list: a count that divides E. */
static long parse_ep(const char *a, const struct plan_moe *moe, const struct option *opts)
{
	char *end;
	long ep = strtol(a, &end, 10);
	if (*end || ep < 1 || ep > moe->E || moe->E % ep)
		opts_usage_error(usage, opts, "--ep: '%s' is not a degree that divides the %ld experts "
				 "(model.expert_parallel)", a, moe->E);
	return ep;
}

/* The parts of the grid's memory, per S and EP (DP does not change them):
 * 1f1b's and 2bw's fullest GPU. */
static int moe_memory(const struct plan *p, const char *stages_list, const char *ep_list,
		      const struct option *opts)
{
	printf("\n");
	mem_header(p, 1);
	char *sl = xstrdup(stages_list);
	int rc = EXIT_OK;
	for (char *s1, *a = strtok_r(sl, ",", &s1); a && !rc; a = strtok_r(NULL, ",", &s1)) {
		long S = strtol(a, NULL, 10); /* checked by the grid */
		if (S > p->L)
			continue;
		char *el = xstrdup(ep_list);
		for (char *s2, *e = strtok_r(el, ",", &s2); e && !rc;
		     e = strtok_r(NULL, ",", &s2)) {
			long ep = parse_ep(e, &p->moe, opts);
			struct prediction sync, async;
			if (predict(p, SCHED_1F1B, 1, (int)S, (int)ep, ep, &sync) ||
			    predict(p, SCHED_2BW, 1, (int)S, (int)ep, ep, &async)) {
				rc = EXIT_FAIL;
				break;
			}
			mem_row(p, S, ep, "1f1b", &sync);
			mem_row(p, S, ep, "2bw", &async);
		}
		free(el);
	}
	free(sl);
	return rc;
}

/* The mixture's grid: S stages x EP x DP replicas (EP dividing DP). */
static int plan_moe_table(const struct plan *p, const char *stages_list, const char *dp_list,
			  const char *ep_list, const struct option *opts)
{
	const struct plan_moe *m = &p->moe;
	double bt = (double)p->B * (double)p->T;
	printf("model: %ld layers, width %ld, vocabulary %ld, T %ld, micro-batch %ld x %ld tokens, "
	       "M = %ld x S\n", p->L, p->C, p->V, p->T, p->B, p->T, p->K);
	printf("experts: %ld a layer, top-%ld, width %ld, %s: %.4g parameters, %.4g active a "
	       "token\n", m->E, m->K, m->De, m->shared ? "a shared expert" : "no shared expert",
	       moe_model_params(m, p->L, (double)p->C, (double)p->V, 0),
	       moe_model_params(m, p->L, (double)p->C, (double)p->V, 1));
	printf("machine: %g TFLOP/s, NVLink %g GB/s, InfiniBand %g GB/s, HBM %g GB/s, %g us a "
	       "message, %ld GPUs a node\n", p->tflops, p->nvlink, p->ib, p->hbm,
	       p->latency * 1e6, p->gpus_per_node);
	if (p->bucket_mb > 0)
		printf("replicas' sum: in buckets of %g MiB during each step's last backward\n",
		       p->bucket_mb);
	else
		printf("replicas' sum: after each step's last backward\n");
	struct moe_layer_cost c;
	moe_layer_cost(m, (double)p->C, (double)p->T, bt, 1, p->act_bytes, &c);
	printf("layer forward %.4g ms per micro-batch (active FLOPs)\n",
	       c.fwd_flops / (p->tflops * 1e12) * 1e3);
	char *el = xstrdup(ep_list);
	for (char *save, *a = strtok_r(el, ",", &save); a; a = strtok_r(NULL, ",", &save)) {
		long ep = parse_ep(a, m, opts);
		if (ep == 1)
			continue;
		moe_layer_cost(m, (double)p->C, (double)p->T, bt, ep, p->act_bytes, &c);
		printf("all-to-all at EP %ld: %.4g MB a rank per layer and micro-batch, %.4g ms "
		       "(forward; the backward again)\n", ep, c.a2a_bytes / 1e6,
		       moe_a2a_seconds(c.a2a_bytes, ep, p->ib * 1e9, p->latency) * 1e3);
	}
	free(el);
	if (p->sized)
		printf("1f1b GB, 2bw GB: the memory of the schedule's fullest GPU, GB of 1e9 "
		       "bytes, as asyncpp\nallocates it (its parts: the table below); E/EP experts' weights "
		       "and optimizer\nstate, every expert's gradients; fits = the schedules within "
		       "--gpu-mem %g GB\n\n", p->gpu_bytes / 1e9);
	else
		printf("memory: not sized (--vocab 0: asyncpp builds no model without a "
		       "vocabulary)\n\n");
	printf("%6s %4s %6s %6s %8s %8s %5s %12s %7s %12s %7s %8s\n", "S", "EP", "DP", "GPUs",
	       "1f1b GB", "2bw GB", "fits", "1f1b tok/s", "idle", "2bw tok/s", "idle", "2bw/1f1b");
	int rc = EXIT_OK;
	char *sl = xstrdup(stages_list);
	for (char *s1, *a = strtok_r(sl, ",", &s1); a && rc == EXIT_OK; a = strtok_r(NULL, ",", &s1)) {
		char *end;
		long S = strtol(a, &end, 10);
		if (*end || S < 1 || S > 1024)
			opts_usage_error(usage, opts, "--stages: '%s' is not a count of 1..1024", a);
		if (S > p->L) {
			printf("%6ld %4s %6s %6s   (more stages than %ld layers)\n", S, "-", "-", "-",
			       p->L);
			continue;
		}
		el = xstrdup(ep_list);
		for (char *s2, *e = strtok_r(el, ",", &s2); e && rc == EXIT_OK;
		     e = strtok_r(NULL, ",", &s2)) {
			long ep = parse_ep(e, m, opts);
			char *dl = xstrdup(dp_list);
			for (char *s3, *b = strtok_r(dl, ",", &s3); b; b = strtok_r(NULL, ",", &s3)) {
				long N = strtol(b, &end, 10);
				if (*end || N < 1 || N > 1 << 20)
					opts_usage_error(usage, opts, "--dp: '%s' is not a count of "
							 "1..1048576", b);
				if (N % ep)
					continue;
				struct prediction sync = {0}, async = {0};
				if (predict(p, SCHED_1F1B, 1, (int)S, (int)N, ep, &sync) ||
				    predict(p, SCHED_2BW, 1, (int)S, (int)N, ep, &async)) {
					rc = EXIT_FAIL;
					break;
				}
				/* the GB columns: "-" when not sized */
				char g1[16] = "-", g2[16] = "-";
				const char *f = "-";
				if (p->sized) {
					double t1 = plan_mem_total(&sync.mem);
					double t2 = plan_mem_total(&async.mem);
					int f1 = t1 <= p->gpu_bytes, f2 = t2 <= p->gpu_bytes;
					snprintf(g1, sizeof(g1), "%.4g", t1 / 1e9);
					snprintf(g2, sizeof(g2), "%.4g", t2 / 1e9);
					f = f1 && f2 ? "both" : f1 ? "1f1b" : f2 ? "2bw" : "no";
				}
				printf("%6ld %4ld %6ld %6ld %8s %8s %5s %12.4g %7.4f %12.4g "
				       "%7.4f %8.3f\n", S, ep, N, S * N, g1, g2, f,
				       sync.tokens_per_s, sync.idle, async.tokens_per_s, async.idle,
				       async.tokens_per_s / sync.tokens_per_s);
			}
			free(dl);
		}
		free(el);
	}
	free(sl);
	if (rc == EXIT_OK && p->sized)
		rc = moe_memory(p, stages_list, ep_list, opts);
	return rc;
}

static int plan_run(const struct plan *pp, const char *stages_list, const char *dp_list,
		    const char *ep_list, const struct option *opts);

int bench_plan(int argc, char **argv)
{
	const char *model = "gpt3-175b";
	long L = 0, C = 0, V = -1, T = 2048, B = 1, K = 2, gpn = 8;
	double tflops = 400, nvlink = 450, ib = 50, hbm = 3000, latency_us = 10, act_bytes = 2;
	double bucket_mb = 25, gpu_mem = 80;
	const char *optimizer = "adamw";
	const char *stages_list = "4,8,16,32,64", *dp_list = "1,8,64,1024", *ep_list = NULL;
	long E = -1, topk = 0, De = 0;
	int shared = 0;
	const struct option opts[] = {
		OPT_GROUP("Model:"),
		OPT_STRING(0, "model", &model, "NAME",
			   "gpt2-124m, gpt2-1.5b, llama-8b, gpt3-175b or moe-10b (default gpt3-175b)"),
		OPT_INT(0, "layers", &L, "L", "layers (overrides the model's)"),
		OPT_INT(0, "d-model", &C, "C", "width (overrides the model's)"),
		OPT_INT(0, "vocab", &V, "V", "vocabulary, for the head on the last stage; 0: no head"),
		OPT_INT(0, "seq", &T, "T", "sequence length (default 2048)"),
		OPT_INT(0, "batch", &B, "B", "sequences per micro-batch (default 1)"),
		OPT_INT(0, "micro-per-stage", &K, "K", "micro-batches per step M = K x S (default 2)"),
		OPT_GROUP("Mixture of experts (model.n_expert, top_k, d_expert, shared_expert):"),
		OPT_INT(0, "experts", &E, "E", "routed experts per layer (overrides the model's; 0: dense)"),
		OPT_INT(0, "top-k", &topk, "K", "experts per token (default: the model's, else 2)"),
		OPT_INT(0, "d-expert", &De, "DE",
			"an expert's width (needed with --experts unless the model has one)"),
		OPT_FLAG(0, "shared-expert", &shared, "add a shared expert of width DE"),
		OPT_GROUP("Machine (per GPU):"),
		OPT_DOUBLE(0, "tflops", &tflops, "F",
			   "achieved TFLOP/s of the layers (measure it: bench train --device cuda; default 400)"),
		OPT_DOUBLE(0, "nvlink", &nvlink, "GB/s", "one direction inside a node (default 450)"),
		OPT_DOUBLE(0, "ib", &ib, "GB/s", "one direction across nodes, per GPU (default 50: 400 Gb/s)"),
		OPT_DOUBLE(0, "hbm", &hbm, "GB/s", "memory bandwidth for the optimizer step (default 3000)"),
		OPT_DOUBLE(0, "latency", &latency_us, "US", "per message, microseconds (default 10)"),
		OPT_INT(0, "gpus-per-node", &gpn, "G", "GPUs in a node (default 8)"),
		OPT_DOUBLE(0, "act-bytes", &act_bytes, "N",
			   "bytes per activation value: 2 (bf16, the default) or 4 (f32), train.act_dtype"),
		OPT_DOUBLE(0, "bucket-mb", &bucket_mb, "MB",
			   "replicas' sum in buckets of MB MiB during the backward (pipeline.bucket_mb; default 25; 0: one sum after it)"),
		OPT_DOUBLE(0, "gpu-mem", &gpu_mem, "GB",
			   "memory of a GPU, 1e9 bytes: the fits column (default 80)"),
		OPT_STRING(0, "optimizer", &optimizer, "NAME",
			   "the optimizer whose state the memory counts (optim.name; default "
			   "adamw)"),
		OPT_GROUP("Grid:"),
		OPT_STRING(0, "stages", &stages_list, "LIST", "pipeline stages S (default 4,8,16,32,64)"),
		OPT_STRING(0, "dp", &dp_list, "LIST", "data-parallel replicas (default 1,8,64,1024)"),
		OPT_STRING(0, "ep", &ep_list, "LIST",
			   "expert-parallel degrees (model.expert_parallel; default 1,8, or 1 where 8 does not divide E): each divides E; rows where it does not divide DP are left out"),
		OPT_END(),
	};
	int npos = opts_parse(argc, argv, usage, opts,
			      "Predict tokens/s, idle, activation memory and weight versions of the\n"
			      "synchronous schedules (1f1b, interleaved, zb-h1, zb-v) and PipeDream-2BW for\n"
			      "a model on S stages x DP replicas, by simulating the schedules with per-stage\n"
			      "times from a compute rate and link figures, and the memory of each\n"
			      "schedule's fullest GPU as asyncpp allocates it, against --gpu-mem\n"
			      "(see asyncpp-bench(1) for the cost model).");
	if (npos)
		opts_usage_error(usage, opts, "unexpected argument '%s'", argv[0]);
	size_t found = ARRAY_SIZE(presets);
	struct plan_moe moe = {0};
	for (size_t i = 0; i < ARRAY_SIZE(presets); i++)
		if (!strcmp(model, presets[i].name)) {
			L = L ? L : presets[i].L;
			C = C ? C : presets[i].C;
			V = V >= 0 ? V : presets[i].V;
			moe = presets[i].moe;
			found = i;
		}
	if (found == ARRAY_SIZE(presets))
		opts_usage_error(usage, opts, "unknown --model '%s' (gpt2-124m, gpt2-1.5b, llama-8b, "
				 "gpt3-175b, moe-10b)", model);
	if (L < 1 || C < 1 || V < 0 || T < 1 || B < 1 || K < 1 || gpn < 1)
		opts_usage_error(usage, opts, "--layers, --d-model, --seq, --batch, --micro-per-stage "
				 "and --gpus-per-node must be at least 1, --vocab at least 0");
	if (!(tflops > 0 && nvlink > 0 && ib > 0 && hbm > 0 && latency_us >= 0 && act_bytes > 0 &&
	      bucket_mb >= 0) || !isfinite(bucket_mb))
		opts_usage_error(usage, opts, "rates must be positive, the latency and --bucket-mb >= 0");
	if (act_bytes != 2 && act_bytes != 4)
		opts_usage_error(usage, opts, "--act-bytes must be 2 (bf16) or 4 (f32), as "
				 "train.act_dtype stores activations");
	if (!(gpu_mem > 0) || !isfinite(gpu_mem))
		opts_usage_error(usage, opts, "--gpu-mem must be a positive number of GB");
	if (L > 1 << 20 || C > 1 << 20 || V > 1 << 30 || T > 1 << 30 || B > 1 << 20)
		opts_usage_error(usage, opts, "--layers, --d-model, --vocab, --seq or --batch is "
				 "beyond any model asyncpp builds");
	plan_moe_options(&moe, E, topk, De, shared, ep_list, opts);
	struct plan p = {.L = L, .C = C, .V = V, .T = T, .B = B, .K = K, .tflops = tflops,
			 .nvlink = nvlink, .ib = ib, .hbm = hbm, .latency = latency_us * 1e-6,
			 .gpus_per_node = gpn, .act_bytes = act_bytes, .bucket_mb = bucket_mb,
			 .moe = moe};
	/* the CUDA backend stores activations as --act-bytes says */
	p.dev = (struct plan_device){act_bytes == 2 ? ACT_BF16 : ACT_F32, 1};
	p.gpu_bytes = gpu_mem * 1e9;
	config_defaults(&p.cfg);
	if (config_set_key(&p.cfg, "optim", "name", optimizer, "--optimizer") ||
	    config_finish(&p.cfg)) {
		config_free(&p.cfg);
		opts_usage_error(usage, opts, "--optimizer: '%s' is not an optim.name (above)",
				 optimizer);
	}
	p.sized = V > 0;
	if (p.sized && plan_model(&p.m, found, L, C, V, T, &moe)) {
		config_free(&p.cfg);
		return EXIT_FAIL;
	}
	int rc = plan_run(&p, stages_list, dp_list, ep_list, opts);
	if (p.sized)
		model_free(&p.m);
	config_free(&p.cfg);
	return rc;
}

/* The memory table: each schedule's fullest GPU, per S of the list. */
static int print_memory(const struct plan *p, const char *stages_list, long dp0)
{
	if (!p->sized) {
		printf("\nmemory: not sized (--vocab 0: asyncpp builds no model without a "
		       "vocabulary)\n");
		return EXIT_OK;
	}
	printf("\n");
	mem_header(p, 0);
	int rc = EXIT_OK;
	char *sl = xstrdup(stages_list);
	for (char *save, *a = strtok_r(sl, ",", &save); a && !rc; a = strtok_r(NULL, ",", &save)) {
		long S = strtol(a, NULL, 10); /* checked by the table above */
		if (S > p->L)
			printf("%6ld  (more stages than %ld layers)\n", S, p->L);
		else if (print_schedules(p, S, dp0, 1))
			rc = EXIT_FAIL;
	}
	free(sl);
	return rc;
}

/* bench plan's tables for p (plan_moe_table for a mixture) */
static int plan_run(const struct plan *pp, const char *stages_list, const char *dp_list,
		    const char *ep_list, const struct option *opts)
{
	const struct plan_moe moe = pp->moe;
	const struct plan p = *pp;
	long L = p.L, C = p.C, V = p.V, T = p.T, B = p.B, K = p.K, gpn = p.gpus_per_node;
	double tflops = p.tflops, nvlink = p.nvlink, ib = p.ib, hbm = p.hbm;
	double latency_us = p.latency * 1e6, bucket_mb = p.bucket_mb;
	if (moe.E)
		return plan_moe_table(&p, stages_list, dp_list,
				      ep_list ? ep_list : moe.E % 8 ? "1" : "1,8", opts);
	printf("model: %ld layers, width %ld, vocabulary %ld, T %ld, micro-batch %ld x %ld tokens, "
	       "M = %ld x S\n", L, C, V, T, B, T, K);
	printf("machine: %g TFLOP/s, NVLink %g GB/s, InfiniBand %g GB/s, HBM %g GB/s, %g us a "
	       "message, %ld GPUs a node\n", tflops, nvlink, ib, hbm, latency_us, gpn);
	if (bucket_mb > 0)
		printf("replicas' sum: in buckets of %g MiB during each step's last backward\n",
		       bucket_mb);
	else
		printf("replicas' sum: after each step's last backward\n");
	printf("layer forward %.3f ms per micro-batch\n\n", layer_fwd_s(&p) * 1e3);
	int rc = EXIT_OK;
	/* per schedule, at the first replica count */
	long dp0 = strtol(dp_list, NULL, 10);
	printf("each schedule at DP = %ld: act = the most activations a stage holds, in "
	       "micro-batches of that stage's\nactivations (x its bytes per micro-batch); held W = "
	       "those whose weight gradient waits (their\noutput gradients held too); versions = "
	       "weight copies per stage; 2bw/x = 2bw's tokens/s over x's\n", dp0);
	printf("%6s %6s  %-14s %12s %8s %7s %7s %9s %8s\n", "S", "DP", "schedule", "tokens/s", "idle",
	       "act", "held W", "versions", "2bw/x");
	char *sl0 = xstrdup(stages_list);
	for (char *save, *a = strtok_r(sl0, ",", &save); a && !rc; a = strtok_r(NULL, ",", &save)) {
		char *end;
		long S = strtol(a, &end, 10);
		if (*end || S < 1 || S > 1024)
			opts_usage_error(usage, opts, "--stages: '%s' is not a count of 1..1024", a);
		if (dp0 < 1 || dp0 > 1 << 20)
			opts_usage_error(usage, opts, "--dp: '%s' does not start with a count of "
					 "1..1048576", dp_list);
		if (S > L)
			printf("%6ld %6s   (more stages than %ld layers)\n", S, "-", L);
		else if (print_schedules(&p, S, dp0, 0))
			rc = EXIT_FAIL;
	}
	free(sl0);
	if (rc)
		return rc;
	if ((rc = print_memory(&p, stages_list, dp0)))
		return rc;
	printf("\n2bw beside 1f1b and beside the fastest synchronous schedule (best sync):\n");
	printf("%6s %6s %6s %16s %8s %16s %8s %8s  %-14s %8s\n", "S", "DP", "GPUs", "1f1b tokens/s",
	       "idle", "2bw tokens/s", "idle", "2bw/1f1b", "best sync", "2bw/best");
	char *sl = xstrdup(stages_list);
	for (char *save1, *a = strtok_r(sl, ",", &save1); a; a = strtok_r(NULL, ",", &save1)) {
		char *end;
		long S = strtol(a, &end, 10);
		if (*end || S < 1 || S > 1024)
			opts_usage_error(usage, opts, "--stages: '%s' is not a count of 1..1024", a);
		if (S > L) {
			printf("%6ld %6s %6s   (more stages than %ld layers)\n", S, "-", "-", L);
			continue;
		}
		char *dl = xstrdup(dp_list);
		for (char *save2, *b = strtok_r(dl, ",", &save2); b; b = strtok_r(NULL, ",", &save2)) {
			long N = strtol(b, &end, 10);
			if (*end || N < 1 || N > 1 << 20)
				opts_usage_error(usage, opts, "--dp: '%s' is not a count of 1..1048576", b);
			struct prediction sync = {0}, async = {0}, best = {0}, x;
			int bi = 0;
			if (predict(&p, SCHED_1F1B, 1, (int)S, (int)N, 1, &sync) ||
			    predict(&p, SCHED_2BW, 1, (int)S, (int)N, 1, &async)) {
				rc = EXIT_FAIL;
				break;
			}
			if (!sync.ok || !async.ok) { /* cannot happen: S <= L, M = K*S >= S */
				rc = error("bench plan: %s", sync.ok ? async.why : sync.why);
				break;
			}
			best = sync;
			for (int k = 1; k < N_SYNC; k++) {
				if (predict(&p, kinds[k].kind, kinds[k].V, (int)S, (int)N, 1, &x)) {
					rc = EXIT_FAIL;
					break;
				}
				if (x.ok && x.tokens_per_s > best.tokens_per_s)
					best = x, bi = k;
			}
			if (rc)
				break;
			printf("%6ld %6ld %6ld %16.4g %8.4f %16.4g %8.4f %8.3f  %-14s %8.3f\n", S, N,
			       S * N, sync.tokens_per_s, sync.idle, async.tokens_per_s, async.idle,
			       async.tokens_per_s / sync.tokens_per_s, kinds[bi].name,
			       async.tokens_per_s / best.tokens_per_s);
		}
		free(dl);
	}
	free(sl);
	return rc;
}
