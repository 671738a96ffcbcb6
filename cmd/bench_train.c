/* bench_train.c - `asyncpp bench train`: time training steps of the real
 * trainer (sched/trainer.h) on a model built from the configuration, with
 * synthetic random tokens so no data is needed.
 *
 * Two reports:
 *  - thread rows (--threads LIST): for each CPU thread count, warm-up steps
 *    then timed steps; tokens/s, ms/step, achieved GFLOP/s and MFU (FLOPs
 *    per token from model_flops_per_token, peak from device_peak_flops),
 *    then the peak memory of the process (getrusage ru_maxrss) beside the
 *    bytes the run needs: weights (every version), gradients, optimizer
 *    state and scratch, activations (slots and scratch), exchange buffers
 *    and the synthetic tokens.
 *  - --sweep pipeline: 1f1b against 2bw for S = 2 and 4 and M = S, 2S, 4S.
 *    Each configuration runs a warm-up segment, then a segment of N steps
 *    and one of 2N steps on the same trainer; the difference of the two
 *    (wall time, each stage's busy and idle seconds) is N steps of steady
 *    state, free of the fill and drain that every segment pays once. The
 *    measured bubble is a stage's idle / (busy + idle) over that window,
 *    averaged over stages, beside (S-1)/(M+S-1), and the largest stage's
 *    idle share of step time (2bw's target: under 5%). --repeat R measures
 *    every configuration R times, the two schedules alternating so both see
 *    the same load, and keeps the fastest. 2 seg(N) - seg(2N) estimates what
 *    one segment pays once (fill, drain, set-up).
 *
 *  - --sweep overhead: every optimizer (the optim.name choices) x {sync 1f1b,
 *    2bw, 2bw + error feedback, 2bw + weight prediction} at the configured
 *    S (2 when 1) and M = max(M, S): per stage (the largest), the bytes of
 *    the weights, the extra weight versions, the optimizer state and the
 *    correction's state, and ms per step; each configuration runs in a
 *    child process, whose peak RSS above its start is printed beside the
 *    bytes accounted for it (all stages, activations and gradients too).
 *
 *  - --sweep schedules: every kind that trains in threads at S = 2 and 4
 *    (--stages), M = pipeline.micro_batches (2S when 1): tokens/s over the
 *    same 3N timed steps, the ratio to 1f1b, the last loss (the synchronous
 *    kinds must print 1f1b's exactly), and the simulator's predicted ratio
 *    from the 1f1b run's per-stage busy time (predict_rate).
 *
 * Timings are not asserted by any test (HACKING.md); bench/NOTES.md keeps
 * measured figures with their commands.
 */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../io/config/config.h"
#include "../io/data/dataloader.h"
#include "../io/util.h"
#include "../model/model.h"
#include "../sched/expert_mem.h"
#include "../sched/schedule.h"
#include "../sched/trainer.h"
#include "bench.h"
#include "cmd.h"
#include "opts.h"
#include "run_common.h"

static const char *const usage[] = {
	"asyncpp bench train [-c FILE] [--set SECTION.KEY=VALUE]... [--steps N] [--warmup N] "
	"[--threads LIST] [--sweep pipeline [--repeat R]] [--sweep overhead] "
	"[--sweep schedules [--stages LIST]]",
	NULL,
};

#define DEFAULT_VOCAB 50257 /* GPT-2's, when model.vocab_size is 0 */
#define MAX_THREAD_ROWS 16

struct bench_ctx {
	struct config *cfg;
	const struct backend *be;
	struct model m;
	uint32_t *tokens;
	size_t n_tokens;
	int ncores;
};

static double peak_rss_mb(void)
{
	struct rusage ru;
	if (getrusage(RUSAGE_SELF, &ru))
		return 0;
	return ru.ru_maxrss / 1024.0; /* KiB on Linux */
}

/* "1,2,0" -> counts (0 = all cores); returns how many, -1 on a bad list. */
static int parse_threads(const char *s, int *out, int max)
{
	int n = 0;
	while (*s) {
		char *end;
		long v = strtol(s, &end, 10);
		if (end == s || v < 0 || v > 4096 || n == max)
			return -1;
		out[n++] = (int)v;
		if (*end == ',')
			end++;
		else if (*end)
			return -1;
		s = end;
	}
	return n;
}

static int set_key(struct config *cfg, const char *section, const char *key, long v)
{
	char buf[32];
	snprintf(buf, sizeof(buf), "%ld", v);
	return config_set_key(cfg, section, key, buf, "bench");
}

/* Uniform random tokens: enough windows for a few steps; the data loader
 * cycles through them (timing does not depend on the values). */
static void make_tokens(struct bench_ctx *b, int B, int T, int M)
{
	size_t windows = (size_t)MAX(64, 4 * B * M);
	uint64_t st = rng_mix((uint64_t)b->cfg->train_seed, 0xbe7c4);
	b->n_tokens = st_mult(windows, (size_t)T + 1);
	b->tokens = xmalloc(st_mult(b->n_tokens, sizeof(uint32_t)));
	for (size_t i = 0; i < b->n_tokens; i++)
		b->tokens[i] = (uint32_t)(rng_next(&st) % (uint64_t)b->m.cfg.V);
}

/* A trainer over the bench's model and tokens, under cfg. */
static int make_trainer(struct bench_ctx *b, struct trainer *tr, struct dataloader *dl)
{
	const struct config *cfg = b->cfg;
	if (dataloader_from_tokens(dl, b->tokens, b->n_tokens, (uint32_t)b->m.cfg.V,
				   (int)cfg->train_batch_size, (int)cfg->model_seq_len,
				   (uint64_t)cfg->train_seed, 1))
		return -1;
	float *params = xmalloc(st_mult(b->m.numel, sizeof(float)));
	model_init_weights(&b->m, params, (uint64_t)cfg->train_seed);
	int rc = trainer_init(tr, cfg, &b->m, b->be, params, dl);
	free(params);
	if (rc)
		dataloader_close(dl);
	return rc;
}

static void drop_trainer(struct trainer *tr, struct dataloader *dl)
{
	trainer_free(tr);
	dataloader_close(dl);
}

static int run_steps(struct trainer *tr, int n, double *loss)
{
	struct step_stats *st = xcalloc((size_t)MAX(n, 1), sizeof(*st));
	int rc = n > 0 ? trainer_run(tr, n, st) : 0;
	if (loss && n > 0)
		*loss = st[n - 1].loss;
	free(st);
	if (rc)
		return error("loss is not finite at step %ld", tr->step + 1);
	return 0;
}

/* ---- memory accounting ---- */

struct mem {
	double weights, grads, optim, acts, exchange, data;
	double copies; /* the weights' operand copies (backend weights_bf16) */
	int versions, slots, n_grads;
	struct ep_mem ep_procs; /* what the expert exchange would hold between processes */
	int ep_P;                   /* model.expert_parallel */
};

static void account(const struct trainer *tr, const struct bench_ctx *b, struct mem *mm)
{
	size_t act = (size_t)tr->B * tr->T * tr->m->cfg.C;
	memset(mm, 0, sizeof(*mm));
	for (int s = 0; s < tr->S; s++) {
		const struct stage_worker *w = &tr->w[s];
		/* the weight arena may hold fewer tensors than the gradients'
		 * (expert parallelism: model.h, stage_hold_weights) */
		double bytes = (double)w->st.numel * sizeof(float);
		double wbytes = (double)w->st.wnumel * sizeof(float);
		mm->weights += wbytes * w->n_versions * (1 + w->predict); /* + predicted copies */
		mm->n_grads = w->grads[1] != w->grads[0] ? 2 : 1;
		mm->grads += mm->n_grads * bytes;
		mm->optim += (double)optim_bytes(&w->opt);
		mm->acts += (double)w->st.act_bytes_per_slot * w->st.n_slots + w->st.scratch_bytes;
		mm->versions = MAX(mm->versions, w->n_versions);
		mm->slots = MAX(mm->slots, w->st.n_slots);
		/* a bf16 copy of each version a pass runs on (at most 8 kept) */
		if (tr->be->weights_bf16)
			mm->copies += (double)w->st.wnumel * 2 * w->n_versions * (1 + w->predict);
	}
	mm->weights += mm->copies; /* counted with the weights (their line says so) */
	/* the trainer's activations between stages, input and target tokens */
	mm->exchange = 2.0 * (tr->S + 1) * act * act_size(tr->be) +
		       2.0 * tr->B * tr->T * sizeof(int32_t);
	/* ours (u32) and the loader's copy (u16 when the vocabulary allows) */
	mm->data = (double)b->n_tokens * (sizeof(uint32_t) + (tr->data->tokens16 ? 2 : 4));
	/* expert parallelism: its exchange holds nothing in these threads; what
	 * one process a stage would hold */
	mm->ep_P = (int)tr->cfg->model_expert_parallel;
	trainer_ep_mem(tr, &mm->ep_procs);
}

/* dev_peak: the device's peak bytes (backend memory_peak), 0 for host
 * memory; the accounting is then compared with it instead of the RSS. */
static void print_memory(const struct mem *mm, double rss_start, double rss_peak,
			 double dev_peak)
{
	double mb = 1e6, total = mm->weights + mm->grads + mm->optim + mm->acts + mm->exchange +
				 mm->data;
	printf("\nmemory: peak RSS %.1f MB (%.1f MB at start: program, libraries)\n",
	       rss_peak * 1.048576, rss_start * 1.048576);
	if (dev_peak > 0)
		printf("device memory: peak %.1f MB (allocations and scratch pool)\n", dev_peak / mb);
	printf("  weights          %8.1f MB  (%d version%s%s)\n", mm->weights / mb, mm->versions,
	       mm->versions == 1 ? "" : "s", mm->copies > 0 ? ", and their bf16 copies" : "");
	printf("  gradients        %8.1f MB  (%s)\n", mm->grads / mb,
	       mm->n_grads == 2 ? "2 accumulators, by step parity" : "1 accumulator");
	printf("  optimizer        %8.1f MB  (state + update scratch)\n", mm->optim / mb);
	printf("  activations      %8.1f MB  (%d slot%s + backward scratch, logits)\n",
	       mm->acts / mb, mm->slots, mm->slots == 1 ? "" : "s");
	printf("  exchange         %8.1f MB  (between stages, tokens)\n", mm->exchange / mb);
	printf("  synthetic data   %8.1f MB\n", mm->data / mb);
	if (mm->ep_P > 1) {
		const struct ep_mem *e = &mm->ep_procs;
		char host[48] = "";
		if (e->staging)
			snprintf(host, sizeof(host), ", host copies %.1f", e->staging / mb);
		printf("  expert exchange  %8.1f MB  (threads: none of its own; a process per stage "
		       "would hold %.1f MB: kept rows %.1f, scratch %.1f, accumulators %.1f%s)\n",
		       0.0, ep_mem_total(e) / mb, e->kept / mb, e->scratch / mb, e->acc / mb, host);
	}
	if (dev_peak > 0)
		printf("  accounted        %8.1f MB  = %.0f%% of the device peak\n", total / mb,
		       100.0 * total / dev_peak);
	else
		printf("  accounted        %8.1f MB  = %.0f%% of peak RSS above start\n", total / mb,
		       rss_peak > rss_start ? 100.0 * total / ((rss_peak - rss_start) * 1048576.0)
					    : 0);
}

/* ---- thread rows ---- */

static double cpu_sec(void)
{
	struct rusage ru;
	if (getrusage(RUSAGE_SELF, &ru))
		return 0;
	return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
	       1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

/* Time `steps` steps: one call per step when steps are independent calls
 * (schedule none), else one pipeline segment. *best gets the fastest step
 * (the segment's mean for a pipeline). Returns the wall seconds. */
static double timed_steps(struct trainer *tr, int steps, double *best, double *cpu, double *loss)
{
	double c0 = cpu_sec(), t0 = now_sec(), total;
	*best = INFINITY;
	if (tr->kind >= 0) {
		if (run_steps(tr, steps, loss))
			return -1;
		total = now_sec() - t0;
		*best = total / steps;
	} else {
		for (int i = 0; i < steps; i++) {
			double ts = now_sec();
			if (run_steps(tr, 1, loss))
				return -1;
			*best = MIN(*best, now_sec() - ts);
		}
		total = now_sec() - t0;
	}
	*cpu = cpu_sec() - c0;
	return total;
}

/* ---- time per phase (schedule none) ---- */

/* The trainer's on_phase hook: a marker at each boundary of a step (a
 * device marker where the backend has them, else the host clock, which
 * times a backend whose ops finish before they return); the intervals are
 * summed per phase once the step has ended, so the device is waited for
 * once a step. */
#define PHASE_MARKS 4096
struct phase_timer {
	const struct backend *be;
	int n;                  /* markers of the current step */
	int full;               /* the step had more boundaries than markers */
	int phase[PHASE_MARKS]; /* the phase each one starts */
	void *mark[PHASE_MARKS];
	double t[PHASE_MARKS];
	double ms[TRAINER_PHASES];
	int steps;
};

/* the current step's markers freed, none kept */
static void phase_drop(struct phase_timer *pt)
{
	for (int i = 0; pt->be->mark_free && i < pt->n; i++)
		pt->be->mark_free(pt->mark[i]);
	pt->n = 0;
	pt->full = 0;
}

static void phase_mark(void *ctx, int p)
{
	struct phase_timer *pt = ctx;
	const struct backend *be = pt->be;
	if (pt->n == PHASE_MARKS) /* more micro-batches than markers: this step is not timed */
		pt->full = 1;
	if (!pt->full) {
		pt->phase[pt->n] = p;
		pt->mark[pt->n] = be->mark_new ? be->mark_new() : NULL;
		pt->t[pt->n] = be->mark_new ? 0 : now_sec();
		pt->n++;
	}
	if (p != TRAINER_PHASE_END)
		return;
	if (!pt->full) {
		for (int i = 0; i + 1 < pt->n; i++)
			pt->ms[pt->phase[i]] += be->mark_new ? be->mark_ms(pt->mark[i], pt->mark[i + 1])
							     : 1e3 * (pt->t[i + 1] - pt->t[i]);
		pt->steps++;
	}
	phase_drop(pt);
}

/* `steps` more steps of tr with the hook on: *pt gets the sums. */
static int measure_phases(struct trainer *tr, int steps, struct phase_timer *pt)
{
	memset(pt, 0, sizeof(*pt));
	pt->be = tr->be;
	tr->on_phase = phase_mark;
	tr->on_phase_ctx = pt;
	int rc = run_steps(tr, steps, NULL);
	tr->on_phase = NULL;
	phase_drop(pt); /* a step cut short leaves markers */
	return rc;
}

static void print_phases(const struct phase_timer *pt)
{
	static const char *const names[TRAINER_PHASES] = {"data", "forward", "backward",
							   "optimizer"};
	double total = 0;
	if (pt->steps < 1)
		return;
	for (int p = 0; p < TRAINER_PHASES; p++)
		total += pt->ms[p];
	printf("\ntime per phase (mean of %d further step%s, %s):\n", pt->steps,
	       pt->steps == 1 ? "" : "s", pt->be->mark_new ? "device markers" : "host clock");
	for (int p = 0; p < TRAINER_PHASES; p++)
		printf("  %-10s %9.2f ms  %5.1f%%\n", names[p], pt->ms[p] / pt->steps,
		       total > 0 ? 100 * pt->ms[p] / total : 0);
	printf("  %-10s %9.2f ms\n", "step", total / pt->steps);
}

static int bench_threads(struct bench_ctx *b, const int *threads, int nthreads, int steps,
			 int warmup)
{
	const struct config *cfg = b->cfg;
	const struct model_config *c = &b->m.cfg;
	double fpt = model_flops_per_token(&b->m);
	double tok_step = (double)cfg->pipeline_micro_batches * cfg->train_batch_size *
			  cfg->model_seq_len;
	double rss_start = peak_rss_mb(), rss_first = 0, dev_first = 0;
	struct mem mm = {0};
	struct phase_timer *pt = xcalloc(1, sizeof(*pt)); /* no steps: nothing printed */
	if (b->be->memory_peak)
		nthreads = 1; /* a device backend: CPU threads do not change its rate */

	printf("bench train: %s, L=%d d=%d H=%d T=%d V=%d (padded %d), %zu parameters, "
	       "%.1f MFLOP per token (6N + 6LdT, N = %zu)\n",
	       c->arch == ARCH_GPT2 ? "gpt2" : "llama", c->L, c->C, c->NH, c->T, c->V, c->Vp,
	       b->m.numel, fpt / 1e6, model_flops_params(&b->m));
	printf("step: schedule %s, %ld stage(s), %ld micro-batch(es) of %ld x %ld tokens, "
	       "optimizer %s, %s backend (OpenBLAS %s kernels, OpenMP wait policy %s); "
	       "%d warm-up + %d timed steps\n",
	       cfg->train_schedule, cfg->pipeline_stages, cfg->pipeline_micro_batches,
	       cfg->train_batch_size, cfg->model_seq_len, cfg->optim_name, b->be->name,
	       openblas_get_corename(),
	       getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "default", warmup, steps);
	printf("\n%7s %9s %9s %9s %9s %8s %7s %8s %8s\n", "threads", "tokens/s", "ms/step",
	       "best ms", "cpu ms", "GFLOP/s", "MFU", "peak", "loss");
	for (int i = 0; i < nthreads; i++) {
		int nt = threads[i] > 0 ? threads[i] : b->ncores;
		struct trainer tr;
		struct dataloader dl;
		double loss = 0, best, cpu;
		if (b->be->set_threads)
			b->be->set_threads(nt);
		if (make_trainer(b, &tr, &dl)) {
			free(pt);
			return -1;
		}
		double dt = run_steps(&tr, warmup, NULL) ? -1 : timed_steps(&tr, steps, &best, &cpu,
									      &loss);
		if (dt < 0) {
			drop_trainer(&tr, &dl);
			free(pt);
			return -1;
		}
		/* a pipeline runs S stage threads of nt threads each */
		int used = tr.kind >= 0 ? MIN(b->ncores, nt * tr.S) : nt;
		double tps = tok_step * steps / dt, peak = device_peak_flops(b->be, used);
		printf("%7d %9.0f %9.1f %9.1f %9.1f %8.1f %6.2f%% %8.1f %8.4f\n", nt, tps,
		       1e3 * dt / steps, 1e3 * best, 1e3 * cpu / steps, tps * fpt / 1e9,
		       peak > 0 ? 100 * tps * fpt / peak : 0, peak / 1e9, loss);
		fflush(stdout);
		if (i == 0) {
			account(&tr, b, &mm);
			rss_first = peak_rss_mb();
			dev_first = b->be->memory_peak ? (double)b->be->memory_peak() : 0;
		}
		/* the per-phase split (schedule none), on the first row's trainer,
		 * after its timed steps: device markers wait once a step */
		if (i == 0 && tr.kind < 0 && measure_phases(&tr, 2, pt)) {
			drop_trainer(&tr, &dl);
			free(pt);
			return -1;
		}
		drop_trainer(&tr, &dl);
	}
	printf("(best ms: fastest single step; cpu ms: process CPU time per step; peak: nominal\n"
	       " GFLOP/s of the threads used; GFLOP/s and MFU from the mean step)\n");
	print_phases(pt);
	free(pt);
	print_memory(&mm, rss_start, rss_first, dev_first);
	return 0;
}

/* ---- the pipeline sweep ---- */

#define SWEEP_MAX_S 4

struct seg {
	double wall, busy[SWEEP_MAX_S], idle[SWEEP_MAX_S];
};

static void snap(const struct trainer *tr, struct seg *s)
{
	s->wall = now_sec();
	for (int i = 0; i < tr->S && i < SWEEP_MAX_S; i++) {
		s->busy[i] = tr->w[i].busy_s;
		s->idle[i] = tr->w[i].idle_s;
	}
}

/* One configuration's steady state: per step, wall and each stage's busy
 * and idle seconds; seg_cost what a segment pays once. */
struct sweep_res {
	double wall, seg_cost, busy[SWEEP_MAX_S], idle[SWEEP_MAX_S];
	double mean, mean_busy[SWEEP_MAX_S]; /* per step over all 3 N timed steps */
};

/* *loss (unless NULL): the last step's, after warm-up + 3 N steps from the
 * same initial weights and data whatever the kind. */
static int sweep_measure(struct bench_ctx *b, const char *kind, int S, int M, int steps,
			 int warmup, int per_stage_threads, struct sweep_res *r, double *loss)
{
	struct config *cfg = b->cfg;
	struct trainer tr;
	struct dataloader dl;
	struct seg s0, s1, s2;

	if (config_set_key(cfg, "train", "schedule", kind, "bench") ||
	    set_key(cfg, "pipeline", "stages", S) || set_key(cfg, "pipeline", "micro_batches", M))
		return -1;
	if (b->be->set_threads)
		b->be->set_threads(per_stage_threads);
	if (make_trainer(b, &tr, &dl))
		return -1;
	int rc = run_steps(&tr, warmup, NULL);
	snap(&tr, &s0);
	rc = rc ? rc : run_steps(&tr, steps, NULL);
	snap(&tr, &s1);
	rc = rc ? rc : run_steps(&tr, 2 * steps, loss);
	snap(&tr, &s2);
	drop_trainer(&tr, &dl);
	if (rc)
		return -1;
	/* steady state: the 2N-step segment minus the N-step segment; what a
	 * segment pays once (fill, drain, set-up): 2 seg(N) - seg(2N) */
	r->wall = ((s2.wall - s1.wall) - (s1.wall - s0.wall)) / steps;
	r->seg_cost = 2 * (s1.wall - s0.wall) - (s2.wall - s1.wall);
	r->mean = (s2.wall - s0.wall) / (3 * steps);
	for (int s = 0; s < S; s++) {
		r->mean_busy[s] = (s2.busy[s] - s0.busy[s]) / (3 * steps);
		r->busy[s] = ((s2.busy[s] - s1.busy[s]) - (s1.busy[s] - s0.busy[s])) / steps;
		r->idle[s] = ((s2.idle[s] - s1.idle[s]) - (s1.idle[s] - s0.idle[s])) / steps;
		if (r->idle[s] < 0)
			r->idle[s] = 0;
	}
	return 0;
}

static void sweep_print(const struct bench_ctx *b, const char *kind, int S, int M,
			const struct sweep_res *r)
{
	double bubble = 0, max_idle_share = 0, formula = sched_bubble_formula(S, M);
	double tokens = (double)M * b->cfg->train_batch_size * b->cfg->model_seq_len;
	char detail[256];
	size_t pos = 0;

	if (!(r->wall > 0)) {
		printf("%-5s %2d %3d  (no steady-state window: timings too noisy; raise --steps)\n",
		       kind, S, M);
		return;
	}
	detail[0] = 0;
	for (int s = 0; s < S; s++) {
		double busy = r->busy[s], idle = r->idle[s];
		bubble += busy + idle > 0 ? idle / (busy + idle) : 0;
		max_idle_share = MAX(max_idle_share, idle / r->wall);
		if (pos < sizeof(detail))
			pos += (size_t)snprintf(detail + pos, sizeof(detail) - pos, "%s%.0f/%.0f",
						s ? " " : "", 1e3 * busy, 1e3 * idle);
	}
	bubble /= S;
	printf("%-5s %2d %3d %8.3f %9.1f %9.0f %7.1f%% %7.1f%% %6.2f %7.1f%% %8.0f  %s\n", kind,
	       S, M, 1 / r->wall, 1e3 * r->wall, tokens / r->wall, 100 * bubble, 100 * formula,
	       bubble / formula, 100 * max_idle_share, 1e3 * r->seg_cost, detail);
	fflush(stdout);
}

static int bench_sweep(struct bench_ctx *b, int steps, int warmup, int repeat, int threads_given,
		       int threads0)
{
	const struct model_config *c = &b->m.cfg;
	static const int stages[] = {2, 4};
	static const char *const kinds[] = {"1f1b", "2bw"};
	printf("pipeline sweep: %s, L=%d d=%d H=%d T=%d V=%d, micro-batches of %ld x %ld tokens, "
	       "optimizer %s\n", c->arch == ARCH_GPT2 ? "gpt2" : "llama", c->L, c->C, c->NH, c->T,
	       c->V, b->cfg->train_batch_size, b->cfg->model_seq_len, b->cfg->optim_name);
	printf("steady state = segment of %d steps minus segment of %d steps (after %d warm-up "
	       "steps), best of %d; %d cores\n", 2 * steps, steps, warmup, repeat, b->ncores);
	printf("bubble = mean over stages of idle/(busy+idle); idle/st = largest stage idle share "
	       "of step time;\nseg ms = what a segment pays once (fill, drain, set-up): 2 seg(N) - "
	       "seg(2N)\n\n");
	printf("%-5s %2s %3s %8s %9s %9s %8s %8s %6s %8s %8s  %s\n", "sched", "S", "M", "steps/s",
	       "ms/step", "tokens/s", "bubble", "formula", "ratio", "idle/st", "seg ms",
	       "per stage busy/idle ms per step");
	for (size_t i = 0; i < ARRAY_SIZE(stages); i++) {
		int S = stages[i];
		if (c->L % S) {
			printf("S=%d: skipped (n_layer %d is not a multiple of %d)\n", S, c->L, S);
			continue;
		}
		int pt = threads_given ? (threads0 > 0 ? threads0 : b->ncores) : MAX(1, b->ncores / S);
		printf("-- S=%d, %d thread%s per stage\n", S, pt, pt == 1 ? "" : "s");
		for (int mult = 1; mult <= 4; mult *= 2) {
			struct sweep_res best[2];
			/* the kinds alternate, so both see the same conditions */
			for (int r = 0; r < repeat; r++) {
				for (int k = 0; k < 2; k++) {
					struct sweep_res res;
					if (sweep_measure(b, kinds[k], S, mult * S, steps, warmup, pt,
							  &res, NULL))
						return -1;
					if (!r || (res.wall > 0 && (!(best[k].wall > 0) ||
								    res.wall < best[k].wall)))
						best[k] = res;
				}
			}
			for (int k = 0; k < 2; k++)
				sweep_print(b, kinds[k], S, mult * S, &best[k]);
		}
	}
	return 0;
}

/* ---- --sweep schedules ---- */

/* The split backward's weight gradient W as a share of the fused backward
 * on the CPU (bench/NOTES.md), for the simulator's B/W split. */
#define SWEEP_WFRAC 0.4

/* Why kind cannot train at S stages and M micro-batches on L layers, in
 * buf; NULL when it can. */
static const char *kind_misfit(enum sched_kind kind, int S, int M, int L, char *buf, size_t len)
{
	int V = kind == SCHED_INTERLEAVED || kind == SCHED_ZBV ? 2 : 1;
	if (L % (S * V))
		snprintf(buf, len, "n_layer %d is not a multiple of S x %d chunk%s = %d", L, V,
			 V == 1 ? "" : "s", S * V);
	else if (kind == SCHED_INTERLEAVED && M % S)
		snprintf(buf, len, "M = %d is not a multiple of S = %d", M, S);
	else if (kind == SCHED_ZBV && M < 2 * S)
		snprintf(buf, len, "M = %d is under 2S = %d", M, 2 * S);
	else
		return NULL;
	return buf;
}

/* The simulator's steps per second of kind at S, M with each stage's
 * forward and backward from the 1f1b run's busy seconds per step: busy =
 * M (fwd + bwd) with bwd = 2 fwd, W = SWEEP_WFRAC of bwd, no message
 * latency. Over the steady window where there is one, else the makespan.
 * 0 when it cannot be simulated. */
static double predict_rate(enum sched_kind kind, int S, int M, const double *busy)
{
	struct sim_times per[SWEEP_MAX_S];
	char err[256];
	int steps = 6;
	struct schedule *sc = sched_build_virtual(kind, S, M, kind == SCHED_INTERLEAVED ? 2 : 0,
						 steps, 0, err, sizeof(err));
	if (!sc)
		return 0;
	for (int s = 0; s < S; s++)
		per[s] = (struct sim_times){.fwd = busy[s] / (3.0 * M),
					    .bwd = 2 * busy[s] / (3.0 * M),
					    .wfrac = SWEEP_WFRAC};
	struct sim_result r;
	double rate = 0;
	if (!sched_simulate_stages(sc, per, &r)) {
		if (r.steady_bubble >= 0 && r.steady_t1 > r.steady_t0)
			rate = (r.steady_hi - r.steady_lo) / (r.steady_t1 - r.steady_t0);
		else if (r.makespan > 0)
			rate = steps / r.makespan;
		sim_result_free(&r);
	}
	sched_free(sc);
	return rate;
}

static const enum sched_kind sweep_kinds[] = {SCHED_1F1B,  SCHED_GPIPE, SCHED_INTERLEAVED,
					      SCHED_ZBH1,  SCHED_ZBV,   SCHED_2BW,
					      SCHED_2BW_ZB};

/* One S: every kind in sweep_kinds, 1f1b first (its loss and stage times
 * are the others' reference). */
static int schedules_at(struct bench_ctx *b, int S, int M, int steps, int warmup, int pt)
{
	struct config *cfg = b->cfg;
	double tokens = (double)M * cfg->train_batch_size * cfg->model_seq_len;
	double ref_tps = 0, ref_loss = 0, ref_rate = 0, ref_busy[SWEEP_MAX_S] = {0};
	printf("-- S=%d, M=%d, %d thread%s per stage\n", S, M, pt, pt == 1 ? "" : "s");
	for (size_t k = 0; k < ARRAY_SIZE(sweep_kinds); k++) {
		enum sched_kind kind = sweep_kinds[k];
		const char *name = sched_kind_name(kind);
		char why[128];
		if (kind_misfit(kind, S, M, b->m.cfg.L, why, sizeof(why))) {
			printf("%-12s %2d %3d  skipped: %s\n", name, S, M, why);
			if (kind == SCHED_1F1B)
				return 0; /* no reference for the others */
			continue;
		}
		struct sweep_res r;
		double loss = 0;
		if (set_key(cfg, "pipeline", "virtual_stages", kind == SCHED_INTERLEAVED ? 2 : 1) ||
		    sweep_measure(b, name, S, M, steps, warmup, pt, &r, &loss))
			return -1;
		double tps = tokens / r.mean;
		if (kind == SCHED_1F1B) {
			ref_tps = tps;
			ref_loss = loss;
			memcpy(ref_busy, r.mean_busy, sizeof(ref_busy));
			ref_rate = predict_rate(kind, S, M, ref_busy);
		}
		double rate = predict_rate(kind, S, M, ref_busy);
		/* the synchronous kinds compute 1f1b's step (DESIGN.md): the
		 * same loss, bit for bit */
		const char *mark = sched_kind_async(kind) ? "(async)"
				   : loss == ref_loss  ? "= 1f1b"
						       : "MISMATCH";
		printf("%-12s %2d %3d %9.0f %9.1f %7.3f %7.3f %10.6f  %s\n", name, S, M, tps,
		       1e3 * r.mean, tps / ref_tps, ref_rate > 0 ? rate / ref_rate : 0, loss, mark);
		fflush(stdout);
	}
	return set_key(cfg, "pipeline", "virtual_stages", 1);
}

static int bench_schedules(struct bench_ctx *b, const int *stages, int nstages, int steps,
			   int warmup, int threads_given, int threads0)
{
	const struct model_config *c = &b->m.cfg;
	printf("schedule sweep: %s, L=%d d=%d H=%d T=%d V=%d, micro-batches of %ld x %ld tokens, "
	       "optimizer %s, threads; %d warm-up + %d timed steps per kind from the same weights "
	       "and data; %d cores\n", c->arch == ARCH_GPT2 ? "gpt2" : "llama", c->L, c->C, c->NH,
	       c->T, c->V, b->cfg->train_batch_size, b->cfg->model_seq_len, b->cfg->optim_name,
	       warmup, 3 * steps, b->ncores);
	printf("x 1f1b: measured tokens/s over 1f1b's; predicted: the simulator's "
	       "(bench schedule)\nsteps/s over 1f1b's, from each stage's busy time per step in the 1f1b run split\n"
	       "as busy = M (F + B), B = 2F, W = %.1f B (the split backward's share on the CPU);\n"
	       "loss: the last step's, which the synchronous kinds must give exactly as 1f1b\n\n",
	       SWEEP_WFRAC);
	printf("%-12s %2s %3s %9s %9s %7s %7s %10s\n", "schedule", "S", "M", "tokens/s", "ms/step",
	       "x 1f1b", "predict", "loss");
	long M0 = b->cfg->pipeline_micro_batches; /* each run sets its own */
	for (int i = 0; i < nstages; i++) {
		int S = stages[i];
		long M = M0 > 1 ? M0 : 2 * S;
		int pt = threads_given ? (threads0 > 0 ? threads0 : b->ncores)
				       : MAX(1, b->ncores / S);
		if (schedules_at(b, S, (int)M, steps, warmup, pt))
			return -1;
	}
	return 0;
}

/* ---- --sweep overhead ---- */

/* VmRSS or VmHWM of this process from /proc (MB), 0 when unknown. */
static double proc_status_mb(const char *field)
{
	FILE *fp = fopen("/proc/self/status", "r");
	char line[256];
	double kb = 0;
	size_t n = strlen(field);
	while (fp && fgets(line, sizeof(line), fp))
		if (!strncmp(line, field, n) && line[n] == ':')
			kb = atof(line + n + 1);
	if (fp)
		fclose(fp);
	return kb / 1024.0 * 1.048576;
}

/* One configuration, in this (child) process: its row. adamw_ms[mode]
 * (shared with the parent) holds AdamW's ms/step of each mode, whose row
 * comes first: the ratio column divides by it. */
static int overhead_row(struct bench_ctx *b, const char *optim, int mode, int steps, int warmup,
			double *adamw_ms)
{
	static const char *const modes[] = {"sync", "2bw", "2bw+ef", "2bw+predict"};
	struct config *cfg = b->cfg;
	double rss0 = proc_status_mb("VmRSS");
	if (config_set_key(cfg, "optim", "name", optim, "bench") ||
	    config_set_key(cfg, "train", "schedule", mode ? "2bw" : "1f1b", "bench") ||
	    config_set_key(cfg, "optim", "correction",
			   mode == 2 ? "ef" : mode == 3 ? "predict" : "none", "bench") ||
	    config_finish(cfg)) /* the optimizer's own betas */
		return -1;
	struct trainer tr;
	struct dataloader dl;
	double best, cpu;
	if (make_trainer(b, &tr, &dl) || run_steps(&tr, warmup, NULL))
		return -1;
	double dt = timed_steps(&tr, steps, &best, &cpu, NULL);
	double w = 0, vers = 0, opt = 0, corr = 0, mb = 1e6;
	for (int s = 0; s < tr.S; s++) { /* the largest stage */
		const struct stage_worker *wk = &tr.w[s];
		double bytes = (double)wk->st.wnumel * sizeof(float), o = 0, c = 0;
		for (int i = 0; i < optim_state_count(&wk->opt); i++) {
			struct optim_state_buf sb = optim_state(&wk->opt, i);
			*(strcmp(sb.name, "ef_prev_update") ? &o : &c) += (double)sb.numel * sizeof(float);
		}
		c += wk->predict ? bytes * wk->n_versions : 0;
		if (bytes + o + c > w + opt + corr) {
			w = bytes;
			vers = bytes * (wk->n_versions - 1);
			opt = o;
			corr = c;
		}
	}
	struct mem mm;
	account(&tr, b, &mm);
	double total = mm.weights + mm.grads + mm.optim + mm.acts + mm.exchange + mm.data;
	double rss = proc_status_mb("VmHWM") - rss0;
	double ms = 1e3 * dt / steps;
	if (!strcmp(optim, "adamw"))
		adamw_ms[mode] = ms;
	printf("%-10s %-12s %9.2f %9.2f %9.2f %9.2f %9.1f %8.2f %10.1f %9.1f %5.0f%%\n", optim,
	       modes[mode], w / mb, vers / mb, opt / mb, corr / mb, ms,
	       adamw_ms[mode] > 0 ? ms / adamw_ms[mode] : 0.0, total / mb, rss,
	       rss > 0 ? 100.0 * total / mb / rss : 0);
	fflush(stdout);
	drop_trainer(&tr, &dl);
	return 0;
}

static int bench_overhead(struct bench_ctx *b, int steps, int warmup)
{
	struct config *cfg = b->cfg;
	long S = MAX(2, cfg->pipeline_stages);
	if (set_key(cfg, "pipeline", "stages", S) ||
	    set_key(cfg, "pipeline", "micro_batches", MAX(S, cfg->pipeline_micro_batches)))
		return -1;
	const struct config_key_info *k = config_key_lookup("optim", "name");
	char *names = xstrdup(k->choices);
	printf("bench train --sweep overhead: %zu parameters, S = %ld, M = %ld, %d timed steps; "
	       "MB per stage (the largest), one child process per row\n\n", b->m.numel, S,
	       cfg->pipeline_micro_batches, steps);
	printf("%-10s %-12s %9s %9s %9s %9s %9s %8s %10s %9s %6s\n", "optimizer", "mode", "weights",
	       "versions", "optim", "correct", "ms/step", "x adamw", "accounted", "peak RSS", "");
	fflush(stdout);
	double *adamw_ms = mmap(NULL, 4 * sizeof(double), PROT_READ | PROT_WRITE,
				MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (adamw_ms == MAP_FAILED) {
		free(names);
		return error("bench: cannot map a shared page: %s", strerror(errno));
	}
	int rc = 0;
	for (char *save, *name = strtok_r(names, "|", &save); name && !rc;
	     name = strtok_r(NULL, "|", &save))
		for (int mode = 0; mode < 4 && !rc; mode++) {
			pid_t pid = fork();
			if (pid == 0) /* a fresh peak RSS, and nothing left for the next row */
				_exit(overhead_row(b, name, mode, steps, warmup, adamw_ms) ? 1 : 0);
			int status;
			if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
			    WEXITSTATUS(status))
				rc = error("the %s %d row failed (above)", name, mode);
		}
	free(names);
	munmap(adamw_ms, 4 * sizeof(double));
	printf("\n(weights: one version; versions: the extra ones the delay keeps; correct: the\n"
	       " error-feedback buffer or the predicted weights; x adamw: ms/step over AdamW's\n"
	       " in the same mode, measured in this command; accounted: every stage's\n"
	       " weights, gradients, optimizer, activations and data, against the child's\n"
	       " peak RSS above its start)\n");
	return rc;
}

int bench_train(int argc, char **argv)
{
	const char *config_file = NULL, *threads_arg = NULL, *sweep = NULL, *stages_arg = NULL;
	struct opt_list sets = {0};
	long steps = 0, warmup = -1, repeat = 1;
	const struct option options[] = {
		OPT_STRING('c', "config", &config_file, "FILE", "read the configuration from an INI file"),
		OPT_LIST('s', "set", &sets, "SECTION.KEY=VALUE", "set one key (repeatable; after -c)"),
		OPT_INT('n', "steps", &steps, "N",
			"timed steps (default 10; the sweep times N and 2N steps per configuration, default 4; "
			"2 for --sweep schedules)"),
		OPT_INT('w', "warmup", &warmup, "N", "untimed steps first (default 2)"),
		OPT_STRING('j', "threads", &threads_arg, "LIST",
			   "CPU thread counts, one row each, e.g. 1,2 (0 = all cores; default 1,all); "
			   "with --sweep, the first is the threads of each stage (default cores/S)"),
		OPT_STRING(0, "sweep", &sweep, "pipeline|overhead|schedules",
			   "instead: pipeline, 1f1b against 2bw for S = 2, 4 and M = S, 2S, 4S; "
			   "overhead, memory and time of every optimizer x {sync, 2bw, 2bw+ef, 2bw+predict}; "
			   "schedules, every schedule kind's tokens/s and loss beside the simulator's "
			   "prediction (M = pipeline.micro_batches, 2S when 1)"),
		OPT_STRING(0, "stages", &stages_arg, "LIST",
			   "--sweep schedules: the stage counts, 2 to 4 (default 2,4)"),
		OPT_INT('r', "repeat", &repeat, "R",
			"sweep: measure each configuration R times, keep the fastest (default 1)"),
		OPT_END(),
	};
	int npos = opts_parse(argc, argv, usage, options,
			      "Time training steps of the model the configuration describes, on\n"
			      "synthetic random tokens (model.vocab_size, GPT-2's 50257 when 0):\n"
			      "tokens/s, ms/step, GFLOP/s and MFU per thread count, and the peak\n"
			      "memory against weights, gradients, optimizer state and activations.");
	if (npos)
		opts_usage_error(usage, options, "unexpected argument '%s'", argv[0]);
	if (sweep && strcmp(sweep, "pipeline") && strcmp(sweep, "overhead") &&
	    strcmp(sweep, "schedules"))
		opts_usage_error(usage, options,
				 "unknown sweep '%s' (pipeline, overhead or schedules)", sweep);
	int stages[SWEEP_MAX_S] = {2, 4}, nstages = 2;
	if (stages_arg && (!sweep || strcmp(sweep, "schedules")))
		opts_usage_error(usage, options, "--stages is for --sweep schedules");
	if (stages_arg) {
		nstages = parse_threads(stages_arg, stages, SWEEP_MAX_S);
		for (int i = 0; i < nstages; i++)
			if (stages[i] < 2 || stages[i] > SWEEP_MAX_S)
				nstages = -1;
		if (nstages <= 0)
			opts_usage_error(usage, options, "--stages wants a comma-separated "
					 "list of 2 to %d, e.g. 2,4", SWEEP_MAX_S);
	}
	if (!steps)
		steps = !sweep ? 10 : !strcmp(sweep, "schedules") ? 2 : 4; /* 14 trainers */
	if (warmup < 0)
		warmup = 2;
	if (steps < 1 || steps > 1000000 || warmup > 1000000 || repeat < 1 || repeat > 1000)
		opts_usage_error(usage, options,
				 "--steps must be 1..1000000, --warmup 0..1000000, --repeat 1..1000");
	int threads[MAX_THREAD_ROWS], nthreads;
	struct bench_ctx b = {.ncores = omp_get_num_procs()};
	if (threads_arg) {
		nthreads = parse_threads(threads_arg, threads, MAX_THREAD_ROWS);
		if (nthreads <= 0)
			opts_usage_error(usage, options,
					 "--threads wants a comma-separated list of counts, e.g. 1,2");
	} else {
		threads[0] = 1;
		threads[1] = b.ncores;
		nthreads = b.ncores > 1 ? 2 : 1;
	}

	struct config cfg;
	if (config_from_args(&cfg, config_file, sets.items, sets.n))
		return EXIT_FAIL;
	b.cfg = &cfg;
	int rc = EXIT_FAIL;
	if (sweep && *cfg.pipeline_devices) {
		error("--sweep %s builds trainers of other stage counts, and pipeline.devices = %s "
		      "lists a device per stage: leave pipeline.devices empty for a sweep", sweep,
		      cfg.pipeline_devices);
		goto out_cfg;
	}
	if (run_check_schedule(&cfg) || expert_parallel_check(&cfg)) /* what train refuses */
		goto out_cfg;
	if (!(b.be = backend_from_config(&cfg)) || backend_lanes_from_config(b.be, &cfg, NULL))
		goto out_cfg;
	if (model_from_config(&b.m, &cfg, cfg.model_vocab_size ? 0 : DEFAULT_VOCAB))
		goto out_cfg;
	if (sweep && !strcmp(sweep, "schedules")) {
		make_tokens(&b, (int)cfg.train_batch_size, (int)cfg.model_seq_len, 16);
		rc = bench_schedules(&b, stages, nstages, (int)steps, (int)warmup,
				     threads_arg != NULL, threads[0]) ? EXIT_FAIL : EXIT_OK;
	} else if (sweep && !strcmp(sweep, "overhead")) {
		make_tokens(&b, (int)cfg.train_batch_size, (int)cfg.model_seq_len, 16);
		rc = bench_overhead(&b, (int)steps, (int)warmup) ? EXIT_FAIL : EXIT_OK;
	} else if (sweep) {
		make_tokens(&b, (int)cfg.train_batch_size, (int)cfg.model_seq_len, 16);
		rc = bench_sweep(&b, (int)steps, (int)warmup, (int)repeat, threads_arg != NULL,
				 threads[0]) ? EXIT_FAIL : EXIT_OK;
	} else {
		make_tokens(&b, (int)cfg.train_batch_size, (int)cfg.model_seq_len,
			    (int)MAX(1, cfg.pipeline_micro_batches));
		rc = bench_threads(&b, threads, nthreads, (int)steps, (int)warmup) ? EXIT_FAIL : EXIT_OK;
	}
	free(b.tokens);
	model_free(&b.m);
out_cfg:
	config_free(&cfg);
	return rc;
}
