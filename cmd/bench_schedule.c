/* bench_schedule.c - `asyncpp bench schedule`: build a pipeline schedule,
 * simulate it with given op times, print its timeline, bubble and what each
 * stage needs, and optionally draw it as SVG.
 *
 * With a model (-c FILE or --set model.*=...), each stage's times come from
 * the cost model of model/cut.h instead: its training FLOPs per token (in
 * GFLOP), a third forward and two thirds backward, under the cut that
 * pipeline.split chooses; a last table sets the even cut against the
 * balanced one (and pipeline.layers when given): per-stage cost and idle,
 * bubble and step time. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/config/config.h"
#include "../io/util.h"
#include "../model/cut.h"
#include "../model/model.h"
#include "../sched/schedule.h"
#include "bench.h"
#include "cmd.h"
#include "opts.h"
#include "run_common.h"

#define TIMELINE_WIDTH 120
#define TIMELINE_ROWS 32

static const char *const usage[] = {
	"asyncpp bench schedule --kind K --stages S --micro M [--virtual V] [--steps N] [--fwd T] "
	"[--bwd T] [--wfrac F] [--comm T] [--optim T] [-c FILE] [--set SECTION.KEY=VALUE]... "
	"[--svg FILE [--force]] [--no-timeline]",
	NULL,
};

#define DEFAULT_VOCAB 50257 /* GPT-2's, when model.vocab_size is 0 */

/* Stage s's times from the cost model: GFLOP per token of its cut, one
 * third forward and two thirds backward (2 and 4 FLOPs per weight). */
static struct sim_times *model_times(const struct model *m, const struct stage_cut *cut,
				     double comm, double optim)
{
	struct sim_times *per = xmalloc(st_mult((size_t)cut->S, sizeof(*per)));
	for (int s = 0; s < cut->S; s++) {
		double g = cut_stage_flops(m, cut, s) / 1e9;
		per[s] = (struct sim_times){.fwd = g / 3, .bwd = 2 * g / 3, .comm = comm, .optim = optim};
	}
	return per;
}

/* One row of the cut table: the cut's per-stage GFLOP per token and idle
 * share, its bubble and its step time (makespan) relative to base. */
static int print_cut_row(const char *name, const struct schedule *sc, const struct model *m,
			 const struct stage_cut *cut, double comm, double optim, double *makespan)
{
	struct sim_times *per = model_times(m, cut, comm, optim);
	struct sim_result r;
	int rc = sched_simulate_stages(sc, per, &r);
	free(per);
	if (rc < 0)
		return -1;
	char list[256], gflop[512] = "", idle[512] = "";
	size_t pg = 0, pi = 0;
	cut_format(cut, list, sizeof(list));
	for (int s = 0; s < cut->S && pg < sizeof(gflop) && pi < sizeof(idle); s++) {
		pg += (size_t)snprintf(gflop + pg, sizeof(gflop) - pg, "%s%.4f", s ? " " : "",
				       cut_stage_flops(m, cut, s) / 1e9);
		pi += (size_t)snprintf(idle + pi, sizeof(idle) - pi, "%s%.1f%%", s ? " " : "",
				       100 * r.stage_bubble[s]);
	}
	double bubble = sched_kind_async(sc->kind) && r.steady_bubble >= 0 ? r.steady_bubble
									    : r.bubble;
	printf("%-9s %-12s %8.4f %8.1f%% %9.4f  %-s\n%-9s %-12s %8s %9s %9s  %-s\n", name, list,
	       r.makespan, 100 * bubble, *makespan > 0 ? r.makespan / *makespan : 1.0, gflop, "", "",
	       "", "", "", idle);
	if (!(*makespan > 0))
		*makespan = r.makespan;
	sim_result_free(&r);
	return 0;
}

/* The even cut against the balanced one (and the listed one) for m. */
static int compare_cuts(const struct schedule *sc, struct config *cfg, const struct model *m,
			double comm, double optim)
{
	const struct model_config *c = &m->cfg;
	struct cut_costs k;
	cut_model_costs(m, &k);
	printf("\ncuts of %s, %d layers, d_model %d, vocabulary %d, seq_len %d over %d stages;\n"
	       "cost = training GFLOP per token: one layer %.4f, head %.4f (%.2f layers), "
	       "embeddings %.4f\n", c->arch == ARCH_GPT2 ? "gpt2" : "llama", c->L, c->C, c->V, c->T,
	       sc->S, k.layer / 1e9, k.last / 1e9, k.last / k.layer, k.first / 1e9);
	printf("bubble = %s; ratio = makespan / the first row's;\nidle share of each stage over "
	       "the whole segment\n\n", sched_kind_async(sc->kind)
	       ? "steady-state idle share (the middle of the segment)" : "idle / (S x makespan)");
	printf("%-9s %-12s %8s %9s %9s  %s\n", "split", "layers", "makespan", "bubble", "ratio",
	       "GFLOP per token by stage / idle share by stage");
	static const char *const splits[] = {"even", "balanced", "layers"};
	double base = 0;
	int rc = 0;
	for (int i = 0; i < 3 && !rc; i++) {
		struct stage_cut cut;
		if (i == 2 && strcmp(cfg->pipeline_split, "layers"))
			break;
		set_error_quiet(1);
		int bad = i == 0 ? cut_even(&cut, c->L, sc->S)
			: i == 1 ? cut_balanced(&cut, m, sc->S) : cut_from_config(&cut, cfg, m);
		set_error_quiet(0);
		if (bad) {
			printf("%-9s n/a: %s\n", splits[i], last_error());
			continue;
		}
		rc = print_cut_row(splits[i], sc, m, &cut, comm, optim, &base);
		cut_free(&cut);
	}
	return rc;
}

static void print_delay(char *out, size_t n, const struct sched_stage *st)
{
	if (st->delay_min < 0)
		snprintf(out, n, "-");
	else if (st->delay_min == st->delay_max)
		snprintf(out, n, "%d", st->delay_min);
	else
		snprintf(out, n, "%d..%d", st->delay_min, st->delay_max);
}

int bench_schedule(int argc, char **argv)
{
	const char *kind_name = NULL, *svg = NULL, *config_file = NULL;
	struct opt_list sets = {0};
	long S = LONG_MIN, M = LONG_MIN, steps = 0, V = LONG_MIN; /* LONG_MIN: not given */
	double fwd = -1, bwd = -1, comm = 0, optim = 0, wfrac = 0.5; /* -1: not given */
	int no_timeline = 0, force = 0;
	const struct option opts[] = {
		OPT_STRING('k', "kind", &kind_name, "K",
			   "schedule: gpipe, 1f1b, 2bw, pipedream, interleaved, zb-h1, zb-v or 2bw-zb"),
		OPT_INT('s', "stages", &S, "S", "pipeline stages"),
		OPT_INT('m', "micro", &M, "M", "micro-batches per optimizer step"),
		OPT_INT('v', "virtual", &V, "V",
			"model chunks per stage (virtual stages): interleaved 1..64 (default 1), "
			"zb-v 2; the others 1"),
		OPT_INT('n', "steps", &steps, "N",
			"optimizer steps in the segment (default: 1; 4 for 2bw and 2bw-zb; "
			"4*max(M,S) for pipedream, where a step is one micro-batch)"),
		OPT_GROUP("Simulated times (any unit):"),
		OPT_DOUBLE(0, "fwd", &fwd, "T", "forward of one micro-batch on one stage (1)"),
		OPT_DOUBLE(0, "bwd", &bwd, "T", "backward of one micro-batch on one stage (2)"),
		OPT_DOUBLE(0, "wfrac", &wfrac, "F",
			   "zb-h1, zb-v: the weight gradient's share of the backward, the input "
			   "gradient taking the rest (0.5)"),
		OPT_DOUBLE(0, "comm", &comm, "T", "latency of one activation or gradient message (0)"),
		OPT_DOUBLE(0, "optim", &optim, "T", "one optimizer step on one stage (0)"),
		OPT_GROUP("Times from a model instead of --fwd and --bwd:"),
		OPT_STRING('c', "config", &config_file, "FILE",
			   "the model of this configuration: each stage's training GFLOP per token "
			   "under pipeline.split, and even against balanced"),
		OPT_LIST(0, "set", &sets, "SECTION.KEY=VALUE", "set one key (repeatable; after -c)"),
		OPT_GROUP("Output:"),
		OPT_STRING(0, "svg", &svg, "FILE", "also draw the timeline as SVG into FILE"),
		OPT_FLAG(0, "force", &force, "replace the --svg file if it exists (it is kept otherwise)"),
		OPT_FLAG(0, "no-timeline", &no_timeline, "do not print the text timeline"),
		OPT_END(),
	};
	int npos = opts_parse(argc, argv, usage, opts,
			      "Build a pipeline schedule, simulate it and print its timeline (one row\n"
			      "per stage), the predicted bubble beside its formula, and the peak\n"
			      "in-flight activations and weight versions of each stage.");
	if (npos)
		opts_usage_error(usage, opts, "unexpected argument '%s'", argv[0]);
	if (!kind_name)
		opts_usage_error(usage, opts, "missing --kind");
	int kind = sched_kind_from_name(kind_name);
	if (kind < 0)
		opts_usage_error(usage, opts, "unknown schedule kind '%s' (gpipe, 1f1b, 2bw, pipedream, "
				 "interleaved, zb-h1, zb-v, 2bw-zb)", kind_name);
	if (S == LONG_MIN || M == LONG_MIN)
		opts_usage_error(usage, opts, "missing --%s", S == LONG_MIN ? "stages" : "micro");
	if (S < 1 || S > 100000)
		opts_usage_error(usage, opts, "--stages must be between 1 and 100000, not %ld", S);
	if (M < 1 || M > 10000000)
		opts_usage_error(usage, opts, "--micro must be between 1 and 10000000, not %ld", M);
	if ((kind == SCHED_2BW || kind == SCHED_2BW_ZB) && M < S)
		opts_usage_error(usage, opts, "--kind %s needs --micro >= --stages (got %ld < %ld)",
				 sched_kind_name(kind), M, S);
	if (!steps)
		steps = kind == SCHED_2BW || kind == SCHED_2BW_ZB ? 4
			: kind == SCHED_PIPEDREAM		      ? 4 * MAX(M, S)
								      : 1;
	if (steps < 1 || steps > 100000000)
		opts_usage_error(usage, opts, "--steps must be positive (got %ld)", steps);
	if (svg && opts_output_is_new(svg, force))
		return EXIT_FAIL;
	int with_model = config_file || sets.n;
	if (with_model && (fwd != -1 || bwd != -1))
		opts_usage_error(usage, opts, "--fwd and --bwd come from the model with -c or --set");
	fwd = fwd == -1 ? 1 : fwd;
	bwd = bwd == -1 ? 2 : bwd;
	if (!(fwd >= 0 && bwd >= 0 && comm >= 0 && optim >= 0 && fwd + bwd + comm + optim < 1e300))
		opts_usage_error(usage, opts, "times must be finite and >= 0");
	if (!(wfrac > 0 && wfrac < 1))
		opts_usage_error(usage, opts, "--wfrac must be between 0 and 1 (exclusive), not %g",
				 wfrac);
	if (V != LONG_MIN && (V < 1 || V > 64))
		opts_usage_error(usage, opts, "--virtual must be between 1 and 64, not %ld", V);
	if (V == LONG_MIN)
		V = 0; /* the kind's default */
	struct config cfg;
	struct model m;
	struct stage_cut cut = {0};
	if (with_model) {
		char n[32];
		snprintf(n, sizeof(n), "%ld", S);
		if (config_from_args(&cfg, config_file, sets.items, sets.n))
			return EXIT_FAIL;
		if (config_set_key(&cfg, "pipeline", "stages", n, "--stages") ||
		    model_from_config(&m, &cfg, cfg.model_vocab_size ? 0 : DEFAULT_VOCAB) ||
		    cut_from_config(&cut, &cfg, &m)) {
			config_free(&cfg);
			return EXIT_FAIL;
		}
	}

	char err[256];
	struct schedule *sc = sched_build_virtual(kind, (int)S, (int)M, (int)V, (int)steps, 0, err,
						  sizeof(err));
	if (!sc)
		opts_usage_error(usage, opts, "%s", err);
	struct sim_times t = {.fwd = fwd, .bwd = bwd, .comm = comm, .optim = optim, .wfrac = wfrac};
	struct sim_times *per = with_model ? model_times(&m, &cut, comm, optim) : NULL;
	for (int s = 0; per && s < cut.S; s++)
		per[s].wfrac = wfrac;
	struct sim_result r;
	int bad = per ? sched_simulate_stages(sc, per, &r) : sched_simulate(sc, &t, &r);
	free(per);
	if (bad < 0) {
		sched_free(sc);
		return EXIT_FAIL;
	}

	const char *kn = sched_kind_name(kind);
	int split = sched_kind_split(kind);
	long nact = 0;
	for (int s = 0; s < sc->S; s++)
		nact += sc->stage[s].n;
	if (kind == SCHED_PIPEDREAM)
		printf("schedule %s: %ld stages, %ld micro-batches with an optimizer step each "
		       "(window %ld), %ld actions\n", kn, S, steps, M, nact);
	else if (sc->V > 1)
		printf("schedule %s: %ld stages of %d chunks (virtual stages), %ld micro-batches per "
		       "step, %ld step%s, %ld actions\n", kn, S, sc->V, M, steps, steps == 1 ? "" : "s",
		       nact);
	else
		printf("schedule %s: %ld stages, %ld micro-batches per step, %ld step%s, %ld "
		       "actions\n", kn, S, M, steps, steps == 1 ? "" : "s", nact);
	if (with_model) {
		char list[256];
		cut_format(&cut, list, sizeof(list));
		printf("times: stage s forward 1/3, backward 2/3 of its training GFLOP per token "
		       "(cut %s, %s), communication %g, optimizer %g\n", list, cfg.pipeline_split, comm,
		       optim);
	} else if (split) {
		printf("times: forward %g, backward %g (input gradient %g, weight gradient %g), "
		       "communication %g, optimizer %g\n", fwd, bwd, bwd * (1 - wfrac), bwd * wfrac,
		       comm, optim);
	} else {
		printf("times: forward %g, backward %g, communication %g, optimizer %g\n", fwd, bwd,
		       comm, optim);
	}
	if (sc->V > 1)
		printf("a chunk holds 1/%d of its stage's layers: its ops take 1/%d of these times\n",
		       sc->V, sc->V);
	if (!no_timeline) {
		printf("\n");
		sched_print_timeline(stdout, sc, &r, TIMELINE_WIDTH, TIMELINE_ROWS);
	}
	/* chunked or split: the activations in micro-batches of the stage and
	 * the W's held back besides the slots */
	int wide = sc->V > 1 || split;
	if (wide)
		printf("\n%-6s %6s %8s %7s %9s %6s %12s %12s %8s\n", "stage", "slots", "act", "held W",
		       "versions", "delay", "busy", "idle", "bubble");
	else
		printf("\n%-6s %6s %9s %6s %12s %12s %8s\n", "stage", "slots", "versions", "delay",
		       "busy", "idle", "bubble");
	double peak_act = 0;
	for (int s = 0; s < sc->S; s++) {
		const struct sched_stage *st = &sc->stage[s];
		char d[32];
		print_delay(d, sizeof(d), st);
		peak_act = MAX(peak_act, (double)st->nslots / sc->V);
		if (wide)
			printf("%-6d %6d %8.2f %7.2f %9d %6s %12g %12g %8.4f\n", s, st->nslots,
			       (double)st->nslots / sc->V, (double)st->npending / sc->V, st->nversions,
			       d, r.busy[s], r.idle[s], r.stage_bubble[s]);
		else
			printf("%-6d %6d %9d %6s %12g %12g %8.4f\n", s, st->nslots, st->nversions, d,
			       r.busy[s], r.idle[s], r.stage_bubble[s]);
	}
	if (wide)
		printf("(slots: of one chunk and micro-batch; act: the same in micro-batches of the "
		       "whole stage, peak %g\nagainst 1f1b's %ld; held W: micro-batches whose input "
		       "gradient ran and weight gradient waits,\ntheir output gradients kept)\n",
		       peak_act, MIN(S, M));
	printf("\nmakespan             %g\n", r.makespan);
	printf("bubble (simulated)   %.6f\n", r.bubble);
	char ftext[64];
	double formula = sched_bubble_published(sc, ftext, sizeof(ftext));
	if (kind < SCHED_NKINDS_FUSED)
		printf("bubble (formula)     %.6f   (S-1)/(M+S-1)\n", sched_bubble_formula((int)S,
										    (int)M));
	else if (formula >= 0)
		printf("bubble (formula)     %.6f   %s%s\n", formula, ftext,
		       kind == SCHED_ZBH1 ? " with F = B = W" : " with equal chunks");
	else
		printf("bubble (formula)     n/a        (none published; 1f1b's (S-1)/(M+S-1) is "
		       "%.6f)\n", sched_bubble_formula((int)S, (int)M));
	if (sched_kind_async(kind)) {
		if (r.steady_bubble >= 0)
			printf("steady-state bubble  %.6f   micro-batches %d..%d, time %g..%g\n",
			       r.steady_bubble, r.steady_lo * sc->M, r.steady_hi * sc->M - 1,
			       r.steady_t0, r.steady_t1);
		else
			printf("steady-state bubble  n/a        (segment too short; raise --steps)\n");
	}
	/* micro-batches per time unit: over the segment, or the steady window's
	 * for the asynchronous kinds (their fill and drain come once a run) */
	double rate = r.makespan > 0 ? sc->n_mb / r.makespan : 0;
	if (sched_kind_async(kind) && r.steady_bubble >= 0 && r.steady_t1 > r.steady_t0)
		rate = (double)(r.steady_hi - r.steady_lo) * sc->M / (r.steady_t1 - r.steady_t0);
	printf("throughput           %.6g micro-batches per time unit%s (x tokens per "
	       "micro-batch:\n                     tokens/s when the times are seconds)\n", rate,
	       sched_kind_async(kind) && r.steady_bubble >= 0 ? ", steady state" : "");
	int ret = EXIT_OK;
	if (with_model && compare_cuts(sc, &cfg, &m, comm, optim))
		ret = EXIT_FAIL;
	if (svg && ret == EXIT_OK) {
		if (sched_write_svg(svg, sc, &r) < 0)
			ret = EXIT_FAIL;
		else
			printf("wrote %s\n", svg);
	}
	sim_result_free(&r);
	sched_free(sc);
	if (with_model) {
		cut_free(&cut);
		model_free(&m);
		config_free(&cfg);
	}
	return ret;
}
