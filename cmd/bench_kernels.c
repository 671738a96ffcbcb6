/* bench_kernels.c - `asyncpp bench kernels`: time every operation of a
 * backend on the shapes of one GPT-2-like layer (and its loss and optimizer
 * step), and print a table of time per call, GFLOP/s or GB/s.
 *
 * Everything goes through the backend table (struct backend), so another
 * device is benchmarked by choosing its table; bench_time() is the one timing
 * helper (warm-up, then the median of up to N timed calls, each closed by the
 * backend's synchronize). On the CPU, each matrix product also gets a
 * reference line: plain cblas_sgemm of the same shape, on OpenBLAS's own
 * threads; last, one layer as a pipeline stage runs its forward, its fused
 * backward and the split backward's two parts (B and W: the ratios the
 * zero-bubble schedules are planned with).
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/util.h"
#include "../kernels/backend.h"
#include "../model/model.h"
#ifdef ASYNCPP_CUDA
#include "../kernels/cuda/cuda_bench.h"
#endif
#include "bench.h"
#include "cmd.h"
#include "opts.h"

static const char *const usage[] = {
	"asyncpp bench kernels [--device D] [--iters N] [--max-sec S] [--threads N] [--batch B] "
	"[--seq T] [--channels C] [--heads H] [--kv-heads H] [--vocab V] [--arch A] [--only NAME]",
	NULL,
};

/* ---- the timing helper ---- */

struct bench_timing {
	double median, min; /* seconds per call */
	int runs;
};

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* One warm-up call, then up to iters timed calls (fewer once max_sec of
 * timed calls have passed, but at least 3). */
static struct bench_timing bench_time(const struct backend *be, void (*fn)(void *), void *arg,
				      int iters, double max_sec)
{
	double *t = xmalloc(st_mult((size_t)iters, sizeof(double))), total = 0;
	struct bench_timing r = {0};
	int n = 0;

	fn(arg);
	be->synchronize();
	while (n < iters && (n < 3 || total < max_sec)) {
		double t0 = now_sec();
		fn(arg);
		be->synchronize();
		t[n] = now_sec() - t0;
		total += t[n++];
	}
	qsort(t, n, sizeof(double), cmp_double);
	r.runs = n;
	r.min = t[0];
	r.median = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
	free(t);
	return r;
}

/* ---- shapes and buffers ---- */

struct kb {
	const struct backend *be;
	int B, T, C, NH, NKV, HD, V, Vp, F, N, QKV;
	/* the matmul of the current row */
	int mm_in, mm_out, mm_bias;
	size_t nparam; /* optimizer tensor size */
	int ns_rows, ns_cols;
	/* device buffers */
	float *x, *y, *dy, *dx, *w, *dw, *b, *db, *mean, *rstd;
	float *qkv, *dqkv, *att, *datt, *lse, *logits, *losses, *wte, *dwte, *wpe, *dwpe;
	float *m, *v, *u, *uprev, *g, *ns_scr;
	int32_t *tok, *tgt;
	/* host copies for the reference sgemm */
	float *hx, *hw, *hy;
	int blas_threads;
};

static float *dev_random(const struct backend *be, size_t n, uint64_t seed, float scale)
{
	float *h = xmalloc(st_mult(n ? n : 1, sizeof(float)));
	float *d = be->alloc(st_mult(n ? n : 1, sizeof(float)));
	uint64_t st = seed;

	if (!d)
		die("cannot allocate %zu floats on device %s", n, be->name);
	for (size_t i = 0; i < n; i++)
		h[i] = scale * (2.0f * rng_uniform(&st) - 1.0f);
	be->to_device(d, h, n * sizeof(float));
	free(h);
	return d;
}

static int32_t *dev_tokens(const struct backend *be, size_t n, int V, uint64_t seed)
{
	int32_t *h = xmalloc(st_mult(n, sizeof(int32_t)));
	int32_t *d = be->alloc(st_mult(n, sizeof(int32_t)));
	uint64_t st = seed;

	if (!d)
		die("cannot allocate %zu tokens on device %s", n, be->name);
	for (size_t i = 0; i < n; i++)
		h[i] = (int32_t)(rng_next(&st) % (uint64_t)V);
	be->to_device(d, h, n * sizeof(int32_t));
	free(h);
	return d;
}

/* ---- one function per timed operation ---- */

#define K(a) struct kb *k = (a)
static void op_embed_fwd(void *a) { K(a); k->be->embed_forward(k->x, k->tok, k->wte, k->wpe, k->B, k->T, k->C); }
static void op_embed_bwd(void *a) { K(a); k->be->embed_backward(k->dwte, k->dwpe, k->dy, k->tok, k->B, k->T, k->C); }
static void op_ln_fwd(void *a) { K(a); k->be->layernorm_forward(k->y, k->mean, k->rstd, k->x, k->w, k->b, k->N, k->C, 1e-5f); }
static void op_ln_bwd(void *a) { K(a); k->be->layernorm_backward(k->dx, k->dw, k->db, k->dy, k->x, k->w, k->mean, k->rstd, k->N, k->C); }
static void op_rms_fwd(void *a) { K(a); k->be->rmsnorm_forward(k->y, k->rstd, k->x, k->w, k->N, k->C, 1e-5f); }
static void op_rms_bwd(void *a) { K(a); k->be->rmsnorm_backward(k->dx, k->dw, k->dy, k->x, k->w, k->rstd, k->N, k->C); }
static void op_mm_fwd(void *a) { K(a); k->be->matmul_forward(k->y, k->x, k->w, k->mm_bias ? k->b : NULL, k->N, k->mm_in, k->mm_out); }
static void op_mm_bwd(void *a) { K(a); k->be->matmul_backward(k->dx, k->dw, k->mm_bias ? k->db : NULL, k->dy, k->x, k->w, k->N, k->mm_in, k->mm_out); }
static void op_rope_fwd(void *a) { K(a); k->be->rope_forward(k->qkv, k->B, k->T, k->NH, k->NKV, k->HD, 10000.0f); }
static void op_rope_bwd(void *a) { K(a); k->be->rope_backward(k->dqkv, k->B, k->T, k->NH, k->NKV, k->HD, 10000.0f); }
static void op_att_fwd(void *a) { K(a); k->be->attention_forward(k->att, k->lse, k->qkv, k->B, k->T, k->NH, k->NKV, k->HD); }
static void op_att_bwd(void *a) { K(a); k->be->attention_backward(k->dqkv, k->datt, k->qkv, k->att, k->lse, k->B, k->T, k->NH, k->NKV, k->HD); }
static void op_gelu_fwd(void *a) { K(a); k->be->gelu_forward(k->y, k->x, (size_t)k->N * k->F); }
static void op_gelu_bwd(void *a) { K(a); k->be->gelu_backward(k->dx, k->x, k->dy, (size_t)k->N * k->F); }
static void op_swiglu_fwd(void *a) { K(a); k->be->swiglu_forward(k->y, k->x, k->N, k->F); }
static void op_swiglu_bwd(void *a) { K(a); k->be->swiglu_backward(k->dx, k->dy, k->x, k->N, k->F); }
static void op_add(void *a) { K(a); k->be->add(k->y, k->x, k->dy, (size_t)k->N * k->C); }
static void op_xent(void *a) { K(a); k->be->softmax_xent(k->losses, k->dx, k->logits, k->tgt, k->N, k->V, k->Vp, 1.0f / k->N); }
static void op_adamw(void *a) { K(a); k->be->adamw_dir(k->u, k->g, k->m, k->v, k->nparam, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.5f, 0.5f); }
static void op_lion(void *a) { K(a); k->be->lion_dir(k->u, k->g, k->m, k->nparam, 1e-4f, 0.9f, 0.99f); }
static void op_momentum(void *a) { K(a); k->be->momentum(k->u, k->g, k->m, k->nparam, 0.95f, 1); }
static void op_apply(void *a) { K(a); k->be->apply_update(k->w, k->u, k->uprev, k->nparam, 1e-5f, 1.0f); }
static void op_sumsq(void *a) { K(a); volatile double s = k->be->sumsq(k->g, k->nparam); (void)s; }
static void op_scale(void *a) { K(a); k->be->scale(k->g, 1.0f, k->nparam); }
static void op_ns(void *a) { K(a); k->be->newton_schulz(k->u, k->g, k->ns_rows, k->ns_cols, 5, k->ns_scr); }
static void op_ref_sgemm(void *a)
{
	K(a);
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, k->N, k->mm_out, k->mm_in, 1.0f,
		    k->hx, k->mm_in, k->hw, k->mm_in, 0.0f, k->hy, k->mm_out);
}
#undef K

/* ---- the table ---- */

struct row_opts {
	int iters;
	double max_sec;
	const char *only;
};

static void print_row(struct kb *k, const struct row_opts *ro, const char *name,
		      const char *shape, void (*fn)(void *), double flops, double bytes)
{
	if (ro->only && !strstr(name, ro->only))
		return;
	struct bench_timing t = bench_time(k->be, fn, k, ro->iters, ro->max_sec);
	printf("%-26s %-24s %10.3f", name, shape, t.median * 1e3);
	if (flops > 0)
		printf(" %10.1f", flops / t.median * 1e-9);
	else
		printf(" %10s", "-");
	if (bytes > 0)
		printf(" %9.1f", bytes / t.median * 1e-9);
	else
		printf(" %9s", "-");
	printf(" %5d\n", t.runs);
	fflush(stdout);
}

static void matmul_rows(struct kb *k, const struct row_opts *ro, const char *what, int in,
			int out, int bias)
{
	char name[64], shape[64];
	double fl = 2.0 * k->N * in * out;

	k->mm_in = in, k->mm_out = out, k->mm_bias = bias;
	snprintf(shape, sizeof(shape), "%dx%d @ %dx%d^T", k->N, in, out, in);
	snprintf(name, sizeof(name), "matmul_forward %s", what);
	print_row(k, ro, name, shape, op_mm_fwd, fl, 0);
	if (k->hx && (!ro->only || strstr(name, ro->only))) {
		struct row_opts all = *ro;
		all.only = NULL;
		openblas_set_num_threads(k->blas_threads);
		print_row(k, &all, "  cblas_sgemm (reference)", shape, op_ref_sgemm, fl, 0);
		openblas_set_num_threads(1);
	}
	snprintf(name, sizeof(name), "matmul_backward %s", what);
	print_row(k, ro, name, shape, op_mm_bwd, 2 * fl, 0);
}

/* ---- pipeline stages: one layer's forward, fused backward and the
 * split backward's parts (model.h: stage_backward_input, _weight); the
 * head's stage with its gradient in the forward or left to W ---- */

struct sb {
	struct stage st;
	float *p, *g;
	void *x_in, *x_out, *dx_out, *dx_in;
	int32_t *tgt;
};

#define SB(a) struct sb *b = (a)
static void op_stage_fwd(void *a) { SB(a); stage_forward(&b->st, 0, b->p, NULL, b->x_in, NULL, b->x_out, NULL, NULL, NULL, 0.0f); }
static void op_stage_fwd_loss(void *a) { SB(a); stage_forward(&b->st, 0, b->p, NULL, b->x_in, b->tgt, NULL, NULL, NULL, b->g, 1.0f); }
static void op_stage_bwd(void *a) { SB(a); stage_backward(&b->st, 0, b->p, b->g, b->dx_out, b->dx_in); }
static void op_stage_bwd_in(void *a) { SB(a); stage_backward_input(&b->st, 0, b->p, b->dx_out, b->dx_in); }
static void op_stage_bwd_w(void *a) { SB(a); stage_backward_weight(&b->st, 0, b->p, b->g); }

/* Stage s of cut over m on k's backend, split with flags, its weights
 * from the model's initialisation, the rest random. */
static void sb_open(struct sb *b, const struct kb *k, const struct model *m,
		    const struct stage_cut *cut, int s, int flags)
{
	const struct backend *be = k->be;
	size_t nc = (size_t)k->N * k->C;

	if (stage_init(&b->st, m, be, cut, s, k->B, k->T, 1) || stage_split_init(&b->st, flags))
		die("bench kernels: %s", last_error());
	float *host = xcalloc(m->numel, sizeof(float)), *sp = xmalloc(st_mult(b->st.numel, 4));
	model_init_weights_stage(m, host, 1, cut, s);
	stage_gather(&b->st, sp, host);
	b->p = be->alloc(b->st.numel * sizeof(float));
	be->to_device(b->p, sp, b->st.numel * sizeof(float));
	free(host);
	free(sp);
	b->g = dev_random(be, b->st.numel, 30, 0.0f);
	float *f = dev_random(be, nc, 31, 1.0f);
	b->x_in = be->alloc(nc * act_size(be));
	b->x_out = be->alloc(nc * act_size(be));
	b->dx_out = be->alloc(nc * act_size(be));
	b->dx_in = be->alloc(nc * act_size(be));
	be->act_from_f32(b->x_in, f, nc);
	be->scale(f, 1e-3f, nc);
	be->act_from_f32(b->dx_out, f, nc);
	be->free(f);
	b->tgt = dev_tokens(be, (size_t)k->N, k->V, 32);
}

static void sb_close(struct sb *b)
{
	const struct backend *be = b->st.be;
	void *bufs[] = {b->p, b->g, b->x_in, b->x_out, b->dx_out, b->dx_in, b->tgt};
	for (size_t i = 0; i < ARRAY_SIZE(bufs); i++)
		be->free(bufs[i]);
	stage_free(&b->st);
}

/* n calls timed in rounds (each once, then again), so that their ratios
 * compare calls made at the same time on a machine whose load changes;
 * one row each, the medians into med[n]. */
static void rounds(const struct backend *be, const struct row_opts *ro, int n,
		   const char *const *names, void (*const *fns)(void *), void *const *args,
		   const char *shape, double *med)
{
	double *ts = xmalloc(st_mult((size_t)ro->iters * n, sizeof(double))), total = 0;
	int r = 0;

	for (int i = 0; i < n; i++) /* warm-up */
		fns[i](args[i]);
	be->synchronize();
	while (r < ro->iters && (r < 3 || total < n * ro->max_sec)) {
		for (int i = 0; i < n; i++) {
			double t0 = now_sec();
			fns[i](args[i]);
			be->synchronize();
			ts[(size_t)i * ro->iters + r] = now_sec() - t0;
			total += ts[(size_t)i * ro->iters + r];
		}
		r++;
	}
	for (int i = 0; i < n; i++) {
		double *ti = ts + (size_t)i * ro->iters;
		qsort(ti, r, sizeof(double), cmp_double);
		med[i] = r % 2 ? ti[r / 2] : 0.5 * (ti[r / 2 - 1] + ti[r / 2]);
		printf("%-26s %-24s %10.3f %10s %9s %5d\n", names[i], shape, med[i] * 1e3, "-", "-",
		       r);
	}
	free(ts);
}

/* A 3-layer model of arch with k's shapes: the middle stage of the cut
 * 1,1,1 (one layer, no embedding, no head), then the last stage of the
 * cut 1,2,0 (the final norm and the head alone) with the head's gradient
 * in the forward and left to W (SPLIT_HEAD). A backward leaves the slot's
 * activations as they are, so each row repeats its call on the one
 * forward's activations. */
static void stage_rows(struct kb *k, const struct row_opts *ro, int arch)
{
	const struct backend *be = k->be;
	struct model_config c = {.arch = arch, .V = k->V, .L = 3, .C = k->C, .NH = k->NH,
				 .NKV = k->NKV, .T = k->T, .tied = 1};
	struct model m;
	struct stage_cut cut;
	struct sb b, h[2];
	char sh[64];
	double med[3];
	int layer[3] = {1, 1, 1}, head[3] = {1, 2, 0};
	int show_layer = !ro->only ||
			 strstr("stage_forward stage_backward_input stage_backward_weight", ro->only);
	int show_head = !ro->only || strstr("head_forward head_backward_weight", ro->only);

	if (model_init(&m, &c))
		die("bench kernels: %s", last_error());
	if (show_layer) {
		if (cut_from_counts(&cut, c.L, layer, 3))
			die("bench kernels: %s", last_error());
		sb_open(&b, k, &m, &cut, 1, 0);
		snprintf(sh, sizeof(sh), "1 %s layer, %dx%d", arch == ARCH_GPT2 ? "gpt2" : "llama",
			 k->N, k->C);
		struct bench_timing tf = bench_time(be, op_stage_fwd, &b, ro->iters, ro->max_sec);
		printf("%-26s %-24s %10.3f %10s %9s %5d\n", "stage_forward", sh, tf.median * 1e3,
		       "-", "-", tf.runs);
		static const char *const names[3] = {"stage_backward (fused)",
						     "stage_backward_input (B)",
						     "stage_backward_weight (W)"};
		void (*const fns[3])(void *) = {op_stage_bwd, op_stage_bwd_in, op_stage_bwd_w};
		void *const args[3] = {&b, &b, &b};
		rounds(be, ro, 3, names, fns, args, sh, med);
		printf("  B/fused %.3f, W/fused %.3f, (B+W)/fused %.3f; B keeps %.1f MB per "
		       "micro-batch for W\n",
		       med[1] / med[0], med[2] / med[0], (med[1] + med[2]) / med[0],
		       b.st.split_bytes_per_slot / 1e6);
		fflush(stdout);
		sb_close(&b);
		cut_free(&cut);
	}
	if (show_head) {
		if (cut_from_counts(&cut, c.L, head, 3))
			die("bench kernels: %s", last_error());
		sb_open(&h[0], k, &m, &cut, 2, 0);
		sb_open(&h[1], k, &m, &cut, 2, SPLIT_HEAD);
		/* W reads what its forward kept */
		op_stage_fwd_loss(&h[1]);
		snprintf(sh, sizeof(sh), "%dx%d @ %dx%d^T", k->N, k->C, k->Vp, k->C);
		static const char *const names[3] = {"head_forward (with dW)", "head_forward (no dW)",
						     "head_backward_weight"};
		void (*const fns[3])(void *) = {op_stage_fwd_loss, op_stage_fwd_loss, op_stage_bwd_w};
		void *const args[3] = {&h[0], &h[1], &h[1]};
		rounds(be, ro, 3, names, fns, args, sh, med);
		printf("  SPLIT_HEAD: forward %.3f, W %.3f, both %.3f of the forward with dW\n",
		       med[1] / med[0], med[2] / med[0], (med[1] + med[2]) / med[0]);
		fflush(stdout);
		sb_close(&h[0]);
		sb_close(&h[1]);
		cut_free(&cut);
	}
	model_free(&m);
}

int bench_kernels(int argc, char **argv)
{
	const char *device = "cpu", *only = NULL, *arch = "gpt2";
	long iters = 10, threads = 0, B = 8, T = 128, C = 768, NH = 12, NKV = 0, V = 50257;
	double max_sec = 2.0;
	const struct option opts[] = {
		OPT_STRING('d', "device", &device, "D", "backend: cpu, cuda or cuda:N (cpu)"),
		OPT_INT('n', "iters", &iters, "N", "timed calls per operation; the median is shown (10)"),
		OPT_DOUBLE(0, "max-sec", &max_sec, "S",
			   "stop timing an operation after S seconds of calls, once 3 are done (2)"),
		OPT_INT('j', "threads", &threads, "N", "CPU threads (0 = all cores)"),
		OPT_STRING(0, "only", &only, "NAME", "only operations whose name contains NAME"),
		OPT_GROUP("Shapes (one GPT-2 small layer by default):"),
		OPT_INT('B', "batch", &B, "B", "sequences per micro-batch (8)"),
		OPT_INT('T', "seq", &T, "T", "sequence length (128; try 1024)"),
		OPT_INT('C', "channels", &C, "C", "model width (768)"),
		OPT_INT(0, "heads", &NH, "H", "query heads (12)"),
		OPT_INT(0, "kv-heads", &NKV, "H", "key/value heads (default: as many as query heads)"),
		OPT_INT(0, "vocab", &V, "V", "vocabulary; the logits are padded to a multiple of 128 "
			"(50257)"),
		OPT_STRING(0, "arch", &arch, "A",
			   "architecture of the stage rows: gpt2 or llama (gpt2)"),
		OPT_END(),
	};
	int npos = opts_parse(argc, argv, usage, opts,
			      "Time each backend operation on the shapes of one transformer layer, its\n"
			      "loss and an optimizer step: milliseconds per call (median), GFLOP/s for\n"
			      "matrix products and attention, GB/s (bytes read + written) for the rest.\n"
			      "On the CPU, each matrix product is followed by plain cblas_sgemm on the\n"
			      "same shape, on all of OpenBLAS's threads, as a reference. On a GPU\n"
			      "(--device cuda) the shapes are fixed (GPT-2 124M and SmolLM-360M layers,\n"
			      "B 8, T 1024), calls are timed with device events, and every rate is a\n"
			      "percentage of the GEMM and copy rates measured first on the same device.\n"
			      "On the CPU the last rows run one layer as a pipeline stage: its forward,\n"
			      "fused backward and the split backward's B and W parts, with their ratios;\n"
			      "then the head's stage (final norm, head, loss) with the head's gradient\n"
			      "made in the forward, and left to W (SPLIT_HEAD).");
	if (npos)
		opts_usage_error(usage, opts, "unexpected argument '%s'", argv[0]);
	if (!NKV)
		NKV = NH;
	if (iters < 1 || iters > 1000000 || threads < 0 || threads > 4096)
		opts_usage_error(usage, opts, "--iters must be >= 1 and --threads >= 0");
	if (B < 1 || T < 1 || C < 1 || NH < 1 || NKV < 1 || V < 2 || B * T > (1L << 24) ||
	    C > 65536 || V > (1L << 24))
		opts_usage_error(usage, opts, "shapes must be positive (and not absurdly large)");
	if (C % NH || NH % NKV || (C / NH) % 2)
		opts_usage_error(usage, opts,
				 "--heads must divide --channels into an even head width, and "
				 "--kv-heads must divide --heads");
	if (!(max_sec > 0))
		opts_usage_error(usage, opts, "--max-sec must be positive");
	if (strcmp(arch, "gpt2") && strcmp(arch, "llama"))
		opts_usage_error(usage, opts, "--arch must be gpt2 or llama, not '%s'", arch);

	const struct backend *be = backend_by_name(device);
	if (!be)
		return EXIT_FAIL;
	if (be != &backend_cpu) {
		/* timed with device events on fixed model shapes, against the
		 * device's measured GEMM and copy rates */
#ifdef ASYNCPP_CUDA
		return cuda_bench_kernels(stdout, (int)iters) ? EXIT_FAIL : EXIT_OK;
#endif
	}
	be->set_threads((int)threads);

	struct kb k = {.be = be, .B = (int)B, .T = (int)T, .C = (int)C, .NH = (int)NH,
		       .NKV = (int)NKV, .V = (int)V};
	k.HD = k.C / k.NH;
	k.N = k.B * k.T;
	k.Vp = (k.V + 127) / 128 * 128;
	k.F = 4 * k.C;
	k.QKV = (k.NH + 2 * k.NKV) * k.HD;
	k.nparam = (size_t)k.C * k.F;
	k.ns_rows = k.C, k.ns_cols = k.F;
	size_t N = k.N, big = MAX(MAX(N * 2 * k.F, N * k.QKV), (size_t)k.F * k.C);
	size_t nout = MAX(big, N * k.Vp), nw = (size_t)MAX(k.F, k.Vp) * k.C;

	/* activations sized for the widest use (2F for swiglu's input) */
	k.x = dev_random(be, big, 1, 1.0f);
	k.y = dev_random(be, nout, 2, 1.0f);
	k.dy = dev_random(be, nout, 3, 1.0f);
	k.dx = dev_random(be, nout, 4, 1.0f);
	k.w = dev_random(be, nw, 5, 0.02f);
	k.dw = dev_random(be, nw, 6, 0.0f);
	k.b = dev_random(be, (size_t)k.F, 7, 0.02f);
	k.db = dev_random(be, (size_t)k.F, 8, 0.0f);
	k.mean = dev_random(be, N, 9, 0.0f);
	k.rstd = dev_random(be, N, 10, 0.0f);
	k.qkv = dev_random(be, N * k.QKV, 11, 1.0f);
	k.dqkv = dev_random(be, N * k.QKV, 12, 1.0f);
	k.att = dev_random(be, N * k.C, 13, 0.0f);
	k.datt = dev_random(be, N * k.C, 14, 1.0f);
	k.lse = dev_random(be, N * k.NH, 15, 0.0f);
	k.logits = dev_random(be, N * k.Vp, 16, 4.0f);
	k.losses = dev_random(be, N, 17, 0.0f);
	k.wte = dev_random(be, (size_t)k.Vp * k.C, 18, 0.02f);
	k.dwte = dev_random(be, (size_t)k.Vp * k.C, 19, 0.0f);
	k.wpe = dev_random(be, (size_t)k.T * k.C, 20, 0.02f);
	k.dwpe = dev_random(be, (size_t)k.T * k.C, 21, 0.0f);
	k.m = dev_random(be, k.nparam, 22, 0.001f);
	k.v = dev_random(be, k.nparam, 23, 0.001f);
	be->scale(k.v, 0.0f, k.nparam); /* a second moment is >= 0 */
	k.u = dev_random(be, k.nparam, 24, 0.0f);
	k.uprev = dev_random(be, k.nparam, 25, 0.0f);
	k.g = dev_random(be, k.nparam, 26, 0.01f);
	k.ns_scr = dev_random(be, newton_schulz_scratch(k.ns_rows, k.ns_cols), 27, 0.0f);
	k.tok = dev_tokens(be, N, k.V, 28);
	k.tgt = dev_tokens(be, N, k.V, 29);
	/* the attention backward needs a consistent forward (out, lse) */
	op_att_fwd(&k);
	be->synchronize();

	int nthreads = 0;
	if (!strcmp(be->name, "cpu")) {
		nthreads = threads ? (int)threads : openblas_get_num_procs();
		k.blas_threads = nthreads;
		k.hx = xmalloc(st_mult(N * k.F, sizeof(float)));
		k.hw = xmalloc(st_mult(nw, sizeof(float)));
		k.hy = xmalloc(st_mult(nout, sizeof(float)));
		be->to_host(k.hx, k.x, N * k.F * sizeof(float));
		be->to_host(k.hw, k.w, nw * sizeof(float));
	}

	printf("asyncpp bench kernels: device %s", be->name);
	if (nthreads)
		printf(" (%d thread%s)", nthreads, nthreads > 1 ? "s" : "");
	printf(", B=%d T=%d C=%d heads %d/%d (HD %d) V=%d (Vp %d), median of up to %ld calls\n",
	       k.B, k.T, k.C, k.NH, k.NKV, k.HD, k.V, k.Vp, iters);
	printf("%-26s %-24s %10s %10s %9s %5s\n", "operation", "shape", "ms/call", "GFLOP/s",
	       "GB/s", "runs");

	struct row_opts ro = {(int)iters, max_sec, only};
	char sh[64];
	double f4 = 4.0, nc = (double)N * k.C, nf = (double)N * k.F;

	snprintf(sh, sizeof(sh), "%dx%d", k.N, k.C);
	print_row(&k, &ro, "embed_forward", sh, op_embed_fwd, 0, f4 * 3 * nc);
	print_row(&k, &ro, "embed_backward", sh, op_embed_bwd, 0, f4 * 5 * nc);
	print_row(&k, &ro, "layernorm_forward", sh, op_ln_fwd, 0, f4 * 2 * nc);
	print_row(&k, &ro, "layernorm_backward", sh, op_ln_bwd, 0, f4 * 5 * nc);
	print_row(&k, &ro, "rmsnorm_forward", sh, op_rms_fwd, 0, f4 * 2 * nc);
	print_row(&k, &ro, "rmsnorm_backward", sh, op_rms_bwd, 0, f4 * 5 * nc);
	print_row(&k, &ro, "add", sh, op_add, 0, f4 * 3 * nc);

	matmul_rows(&k, &ro, "qkv", k.C, k.QKV, 1);
	matmul_rows(&k, &ro, "attn proj", k.C, k.C, 1);
	matmul_rows(&k, &ro, "fc", k.C, k.F, 1);
	matmul_rows(&k, &ro, "fc proj", k.F, k.C, 1);

	/* attention: QK^T and PV over the causal half, 2 flops per multiply-add;
	 * the backward counted as 2.5x the forward (flash convention) */
	double afl = 4.0 * k.B * k.NH * k.HD * ((double)k.T * (k.T + 1) / 2);
	snprintf(sh, sizeof(sh), "%dx%d, %d/%d heads", k.N, k.QKV, k.NH, k.NKV);
	print_row(&k, &ro, "rope_forward", sh, op_rope_fwd, 0, f4 * 2 * N * (k.NH + k.NKV) * k.HD);
	print_row(&k, &ro, "rope_backward", sh, op_rope_bwd, 0, f4 * 2 * N * (k.NH + k.NKV) * k.HD);
	print_row(&k, &ro, "attention_forward", sh, op_att_fwd, afl, 0);
	print_row(&k, &ro, "attention_backward", sh, op_att_bwd, 2.5 * afl, 0);

	snprintf(sh, sizeof(sh), "%dx%d", k.N, k.F);
	print_row(&k, &ro, "gelu_forward", sh, op_gelu_fwd, 0, f4 * 2 * nf);
	print_row(&k, &ro, "gelu_backward", sh, op_gelu_bwd, 0, f4 * 3 * nf);
	print_row(&k, &ro, "swiglu_forward", sh, op_swiglu_fwd, 0, f4 * 3 * nf);
	print_row(&k, &ro, "swiglu_backward", sh, op_swiglu_bwd, 0, f4 * 5 * nf);

	matmul_rows(&k, &ro, "lm head", k.C, k.Vp, 0);
	snprintf(sh, sizeof(sh), "%dx%d (V %d)", k.N, k.Vp, k.V);
	print_row(&k, &ro, "softmax_xent", sh, op_xent, 0, f4 * 2 * N * k.Vp);

	snprintf(sh, sizeof(sh), "%zu", k.nparam);
	double np = (double)k.nparam;
	print_row(&k, &ro, "adamw_dir", sh, op_adamw, 0, f4 * 6 * np);
	print_row(&k, &ro, "lion_dir", sh, op_lion, 0, f4 * 4 * np);
	print_row(&k, &ro, "momentum", sh, op_momentum, 0, f4 * 4 * np);
	print_row(&k, &ro, "apply_update", sh, op_apply, 0, f4 * 5 * np);
	print_row(&k, &ro, "sumsq", sh, op_sumsq, 0, f4 * np);
	print_row(&k, &ro, "scale", sh, op_scale, 0, f4 * 2 * np);
	/* per step: X X^T (2 m m n), A A (2 m^3), B X (2 m m n) */
	double m = MIN(k.ns_rows, k.ns_cols), n = MAX(k.ns_rows, k.ns_cols);
	snprintf(sh, sizeof(sh), "%dx%d, 5 steps", k.ns_rows, k.ns_cols);
	print_row(&k, &ro, "newton_schulz", sh, op_ns, 5 * (4 * m * m * n + 2 * m * m * m), 0);
	stage_rows(&k, &ro, strcmp(arch, "llama") ? ARCH_GPT2 : ARCH_LLAMA);

	float *bufs[] = {k.x, k.y, k.dy, k.dx, k.w, k.dw, k.b, k.db, k.mean, k.rstd, k.qkv,
			 k.dqkv, k.att, k.datt, k.lse, k.logits, k.losses, k.wte, k.dwte,
			 k.wpe, k.dwpe, k.m, k.v, k.u, k.uprev, k.g, k.ns_scr};
	for (size_t i = 0; i < ARRAY_SIZE(bufs); i++)
		be->free(bufs[i]);
	be->free(k.tok);
	be->free(k.tgt);
	free(k.hx);
	free(k.hw);
	free(k.hy);
	return EXIT_OK;
}
