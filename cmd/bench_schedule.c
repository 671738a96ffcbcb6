/* bench_schedule.c - `asyncpp bench schedule`: build a pipeline schedule,
 * simulate it with given op times, print its timeline, bubble and what each
 * stage needs, and optionally draw it as SVG. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/util.h"
#include "../sched/schedule.h"
#include "bench.h"
#include "cmd.h"
#include "opts.h"

#define TIMELINE_WIDTH 120
#define TIMELINE_ROWS 32

static const char *const usage[] = {
	"asyncpp bench schedule --kind K --stages S --micro M [--steps N] [--fwd T] [--bwd T] "
	"[--comm T] [--optim T] [--svg FILE] [--no-timeline]",
	NULL,
};

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
	const char *kind_name = NULL, *svg = NULL;
	long S = LONG_MIN, M = LONG_MIN, steps = 0; /* LONG_MIN: not given */
	double fwd = 1, bwd = 2, comm = 0, optim = 0;
	int no_timeline = 0;
	const struct option opts[] = {
		OPT_STRING('k', "kind", &kind_name, "K", "schedule: gpipe, 1f1b, 2bw or pipedream"),
		OPT_INT('s', "stages", &S, "S", "pipeline stages"),
		OPT_INT('m', "micro", &M, "M", "micro-batches per optimizer step"),
		OPT_INT('n', "steps", &steps, "N",
			"optimizer steps in the segment (default: 1 for gpipe, 1f1b; 4 for 2bw; "
			"4*max(M,S) for pipedream, where a step is one micro-batch)"),
		OPT_GROUP("Simulated times (any unit):"),
		OPT_DOUBLE(0, "fwd", &fwd, "T", "forward of one micro-batch on one stage (1)"),
		OPT_DOUBLE(0, "bwd", &bwd, "T", "backward of one micro-batch on one stage (2)"),
		OPT_DOUBLE(0, "comm", &comm, "T", "latency of one activation or gradient message (0)"),
		OPT_DOUBLE(0, "optim", &optim, "T", "one optimizer step on one stage (0)"),
		OPT_GROUP("Output:"),
		OPT_STRING(0, "svg", &svg, "FILE", "also draw the timeline as SVG into FILE"),
		OPT_FLAG(0, "no-timeline", &no_timeline, "do not print the text timeline"),
		OPT_END(),
	};
	int npos = opts_parse(argc, argv, usage, opts,
			      "Build a pipeline schedule, simulate it and print its timeline (one row\n"
			      "per stage), the predicted bubble beside (S-1)/(M+S-1), and the peak\n"
			      "in-flight activations and weight versions of each stage.");
	if (npos)
		opts_usage_error(usage, opts, "unexpected argument '%s'", argv[0]);
	if (!kind_name)
		opts_usage_error(usage, opts, "missing --kind");
	int kind = sched_kind_from_name(kind_name);
	if (kind < 0)
		opts_usage_error(usage, opts, "unknown schedule kind '%s' (gpipe, 1f1b, 2bw, pipedream)",
				 kind_name);
	if (S == LONG_MIN || M == LONG_MIN)
		opts_usage_error(usage, opts, "missing --%s", S == LONG_MIN ? "stages" : "micro");
	if (S < 1 || S > 100000)
		opts_usage_error(usage, opts, "--stages must be between 1 and 100000, not %ld", S);
	if (M < 1 || M > 10000000)
		opts_usage_error(usage, opts, "--micro must be between 1 and 10000000, not %ld", M);
	if (!steps)
		steps = kind == SCHED_2BW ? 4 : kind == SCHED_PIPEDREAM ? 4 * MAX(M, S) : 1;
	if (steps < 1 || steps > 100000000)
		opts_usage_error(usage, opts, "--steps must be positive (got %ld)", steps);
	if (!(fwd >= 0 && bwd >= 0 && comm >= 0 && optim >= 0 && fwd + bwd + comm + optim < 1e300))
		opts_usage_error(usage, opts, "times must be finite and >= 0");

	char err[256];
	struct schedule *sc = sched_build(kind, (int)S, (int)M, (int)steps, err, sizeof(err));
	if (!sc)
		opts_usage_error(usage, opts, "%s", err);
	struct sim_times t = {fwd, bwd, comm, optim};
	struct sim_result r;
	if (sched_simulate(sc, &t, &r) < 0) {
		sched_free(sc);
		return EXIT_FAIL;
	}

	const char *kn = sched_kind_name(kind);
	long nact = 0;
	for (int s = 0; s < sc->S; s++)
		nact += sc->stage[s].n;
	if (kind == SCHED_PIPEDREAM)
		printf("schedule %s: %ld stages, %ld micro-batches with an optimizer step each "
		       "(window %ld), %ld actions\n", kn, S, steps, M, nact);
	else
		printf("schedule %s: %ld stages, %ld micro-batches per step, %ld step%s, %ld "
		       "actions\n", kn, S, M, steps, steps == 1 ? "" : "s", nact);
	printf("times: forward %g, backward %g, communication %g, optimizer %g\n", fwd, bwd, comm,
	       optim);
	if (!no_timeline) {
		printf("\n");
		sched_print_timeline(stdout, sc, &r, TIMELINE_WIDTH, TIMELINE_ROWS);
	}
	printf("\n%-6s %6s %9s %6s %12s %12s %8s\n", "stage", "slots", "versions", "delay", "busy",
	       "idle", "bubble");
	for (int s = 0; s < sc->S; s++) {
		const struct sched_stage *st = &sc->stage[s];
		char d[32];
		print_delay(d, sizeof(d), st);
		printf("%-6d %6d %9d %6s %12g %12g %8.4f\n", s, st->nslots, st->nversions, d,
		       r.busy[s], r.idle[s], r.stage_bubble[s]);
	}
	printf("\nmakespan             %g\n", r.makespan);
	printf("bubble (simulated)   %.6f\n", r.bubble);
	printf("bubble (formula)     %.6f   (S-1)/(M+S-1)\n", sched_bubble_formula((int)S, (int)M));
	if (sched_kind_async(kind)) {
		if (r.steady_bubble >= 0)
			printf("steady-state bubble  %.6f   micro-batches %d..%d, time %g..%g\n",
			       r.steady_bubble, r.steady_lo * sc->M, r.steady_hi * sc->M - 1,
			       r.steady_t0, r.steady_t1);
		else
			printf("steady-state bubble  n/a        (segment too short; raise --steps)\n");
	}
	int ret = EXIT_OK;
	if (svg) {
		if (sched_write_svg(svg, sc, &r) < 0)
			ret = EXIT_FAIL;
		else
			printf("wrote %s\n", svg);
	}
	sim_result_free(&r);
	sched_free(sc);
	return ret;
}
