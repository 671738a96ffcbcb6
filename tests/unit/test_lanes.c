/* test_lanes.c - lanes (backend.h): every cross-lane access is ordered.
 *
 * On a GPU, pipeline.devices puts stage s on lane s: its own stream, on its
 * own device or sharing one. Two lanes' ops run in any order unless a fence
 * or a synchronize orders them, and an op may touch only its lane's
 * device's memory (copy alone reads across). A missing fence is a race
 * that no CPU run shows and a GPU run shows only sometimes, as wrong bits.
 *
 * The spy below is the cpu backend with lanes made explicit: "devices" own
 * the memory allocated on them, every lane keeps a vector clock, each op
 * ticks its lane's clock, fence_new takes a snapshot that fence_wait joins
 * into the waiting lane, synchronize joins every lane into every lane.
 * Each allocation remembers its last write and each lane's last read; an
 * op that reads what another lane wrote (or writes what another lane read
 * or wrote) without that access in its lane's clock is a race, reported
 * with both ops' names. The ops still run (on the cpu, at once), so the
 * runs must also give the plain cpu run's bits: peer copies move the
 * right bytes.
 *
 * The spy's own tests show it finds each kind of race; then every schedule
 * trains, evaluates, checkpoints and resumes on four lanes over four,
 * two and one "devices", with data-parallel replicas, tied embeddings
 * (the board's exchange), weight prediction and error feedback.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../io/config/config.h"
#include "../../io/data/dataloader.h"
#include "../../io/formats/checkpoint.h"
#include "../../io/util.h"
#include "../../model/model.h"
#include "../../sched/trainer.h"
#include "../test.h"
#include "../tiny_model.h"

/* ---- the spy ---- */

#define SPY_LANES 8
#define SPY_ALLOCS 4096

struct spy_alloc {
	const char *p;
	size_t bytes;
	int dev;
	int w_lane;                 /* last write: lane and its clock */
	long w_clock;
	const char *w_op;
	long r_clock[SPY_LANES];    /* each lane's last read (0: none) */
	const char *r_op[SPY_LANES];
};

struct spy_fence {
	long vc[SPY_LANES];
};

static struct {
	const struct backend *base;
	int n;                        /* lanes */
	int dev[SPY_LANES];
	long vc[SPY_LANES][SPY_LANES]; /* vc[l][k]: lane k's ops lane l is ordered after */
	struct spy_alloc a[SPY_ALLOCS];
	long ops, races;
	char first[512];              /* the first race, for the message */
	pthread_mutex_t mu;
} spy = {.mu = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local int spy_lane;
static struct backend spy_table;

static void spy_race(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void spy_race(const char *fmt, ...)
{
	if (!spy.races++) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(spy.first, sizeof(spy.first), fmt, ap);
		va_end(ap);
	}
}

static struct spy_alloc *spy_find(const void *p)
{
	for (int i = 0; i < SPY_ALLOCS; i++) {
		struct spy_alloc *a = &spy.a[i];
		if (a->p && (const char *)p >= a->p && (const char *)p < a->p + (a->bytes ? a->bytes : 1))
			return a;
	}
	return NULL;
}

/* One access of op on the calling lane; spy.mu held. host: a pointer
 * outside backend memory is fine (to_device's source). cross: another
 * device's memory may be read (copy's source). */
enum { RD = 0, WR = 1 };
static void spy_touch(const char *op, const void *p, int write, int cross)
{
	if (!p)
		return;
	int c = spy_lane;
	struct spy_alloc *a = spy_find(p);
	if (!a) {
		spy_race("%s on lane %d: %p is not backend memory", op, c, p);
		return;
	}
	if (a->dev != spy.dev[c] && !cross)
		spy_race("%s on lane %d (device %d) touches memory of device %d", op, c, spy.dev[c],
			 a->dev);
	if (a->w_lane >= 0 && a->w_lane != c && a->w_clock > spy.vc[c][a->w_lane])
		spy_race("%s on lane %d %s memory that %s on lane %d wrote, unordered", op, c,
			 write ? "writes" : "reads", a->w_op, a->w_lane);
	for (int r = 0; write && r < spy.n; r++)
		if (r != c && a->r_clock[r] > spy.vc[c][r])
			spy_race("%s on lane %d overwrites memory that %s on lane %d reads, unordered",
				 op, c, a->r_op[r], r);
	long now = spy.vc[c][c];
	if (write)
		a->w_lane = c, a->w_clock = now, a->w_op = op;
	else
		a->r_clock[c] = now, a->r_op[c] = op;
}

/* An op's accesses: ticks the lane's clock, then records them. */
#define SPY_OP(name, ...)                                                         \
	do {                                                                      \
		pthread_mutex_lock(&spy.mu);                                      \
		spy.ops++;                                                        \
		spy.vc[spy_lane][spy_lane]++;                                     \
		const char *op_ = name;                                           \
		struct { const void *p; int w, x; } acc_[] = {__VA_ARGS__};       \
		for (size_t i_ = 0; i_ < sizeof(acc_) / sizeof(acc_[0]); i_++)   \
			spy_touch(op_, acc_[i_].p, acc_[i_].w, acc_[i_].x);       \
		pthread_mutex_unlock(&spy.mu);                                    \
	} while (0)
#define R(p) {(p), RD, 0}
#define W(p) {(p), WR, 0}
#define RX(p) {(p), RD, 1} /* read, any device */

static void *s_alloc(size_t bytes)
{
	void *p = spy.base->alloc(bytes);
	pthread_mutex_lock(&spy.mu);
	spy.vc[spy_lane][spy_lane]++;
	int i = 0;
	while (i < SPY_ALLOCS && spy.a[i].p)
		i++;
	if (i == SPY_ALLOCS)
		test_fail(__FILE__, __LINE__, "spy: more than %d live allocations", SPY_ALLOCS);
	else
		spy.a[i] = (struct spy_alloc){.p = p, .bytes = bytes, .dev = spy.dev[spy_lane],
					      .w_lane = spy_lane, .w_clock = spy.vc[spy_lane][spy_lane],
					      .w_op = "alloc"};
	pthread_mutex_unlock(&spy.mu);
	return p;
}

static void s_free(void *p)
{
	if (!p)
		return;
	SPY_OP("free", W(p));
	pthread_mutex_lock(&spy.mu);
	struct spy_alloc *a = spy_find(p);
	if (a && a->p == p)
		a->p = NULL;
	else
		spy_race("free of %p, which is not an allocation's start", p);
	pthread_mutex_unlock(&spy.mu);
	spy.base->free(p);
}

static void s_to_device(void *dst, const void *src, size_t n)
{
	SPY_OP("to_device", W(dst));
	spy.base->to_device(dst, src, n);
}

static void s_to_host(void *dst, const void *src, size_t n)
{
	SPY_OP("to_host", R(src));
	spy.base->to_host(dst, src, n);
}

static void s_copy(void *dst, const void *src, size_t n)
{
	if (dst == src || !n)
		return;
	SPY_OP("copy", RX(src), W(dst));
	spy.base->copy(dst, src, n);
}

static void s_zero(void *p, size_t n)
{
	SPY_OP("zero", W(p));
	spy.base->zero(p, n);
}

/* every lane ordered after every op so far */
static void s_synchronize(void)
{
	pthread_mutex_lock(&spy.mu);
	long j[SPY_LANES] = {0};
	for (int l = 0; l < spy.n; l++)
		for (int k = 0; k < spy.n; k++)
			j[k] = MAX(j[k], spy.vc[l][k]);
	for (int l = 0; l < spy.n; l++)
		memcpy(spy.vc[l], j, sizeof(j));
	pthread_mutex_unlock(&spy.mu);
	spy.base->synchronize();
}

static int s_set_lanes(const int *dev, int n, char *why, size_t len)
{
	if (n < 1 || n > SPY_LANES) {
		snprintf(why, len, "the spy has at most %d lanes", SPY_LANES);
		return 0;
	}
	pthread_mutex_lock(&spy.mu);
	spy.n = n;
	memcpy(spy.dev, dev, (size_t)n * sizeof(int));
	pthread_mutex_unlock(&spy.mu);
	return 1;
}

static int s_lanes(void) { return spy.n; }
static int s_lane_device(int l) { return l >= 0 && l < spy.n ? spy.dev[l] : -1; }

static void s_lane_bind(int l)
{
	if (l < 0 || l >= spy.n)
		test_fail(__FILE__, __LINE__, "spy: lane %d bound, %d exist", l, spy.n);
	else
		spy_lane = l;
}

static void *s_fence_new(void)
{
	struct spy_fence *f = xmalloc(sizeof(*f));
	pthread_mutex_lock(&spy.mu);
	memcpy(f->vc, spy.vc[spy_lane], sizeof(f->vc));
	pthread_mutex_unlock(&spy.mu);
	return f;
}

static void s_fence_wait(void *fp)
{
	struct spy_fence *f = fp;
	pthread_mutex_lock(&spy.mu);
	for (int k = 0; k < spy.n; k++)
		spy.vc[spy_lane][k] = MAX(spy.vc[spy_lane][k], f->vc[k]);
	pthread_mutex_unlock(&spy.mu);
}

static void s_fence_free(void *f) { free(f); }

/* ---- the ops, each with what it reads and writes ---- */

static void s_act_from_f32(void *out, const float *in, size_t n)
{
	SPY_OP("act_from_f32", R(in), W(out));
	spy.base->act_from_f32(out, in, n);
}
static void s_act_to_f32(float *out, const void *in, size_t n)
{
	SPY_OP("act_to_f32", R(in), W(out));
	spy.base->act_to_f32(out, in, n);
}
static void s_embed_forward(void *out, const int32_t *tok, const float *wte, const float *wpe,
			    int B, int T, int C)
{
	SPY_OP("embed_forward", R(tok), R(wte), R(wpe), W(out));
	spy.base->embed_forward(out, tok, wte, wpe, B, T, C);
}
static void s_embed_backward(float *dwte, float *dwpe, const void *dout, const int32_t *tok, int B,
			     int T, int C)
{
	SPY_OP("embed_backward", R(dout), R(tok), R(dwte), R(dwpe), W(dwte), W(dwpe));
	spy.base->embed_backward(dwte, dwpe, dout, tok, B, T, C);
}
static void s_layernorm_forward(void *out, float *mean, float *rstd, const void *inp,
				const float *w, const float *b, int N, int C, float eps)
{
	SPY_OP("layernorm_forward", R(inp), R(w), R(b), W(out), W(mean), W(rstd));
	spy.base->layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps);
}
static void s_layernorm_backward(void *dinp, float *dw, float *db, const void *dout,
				 const void *inp, const float *w, const float *mean,
				 const float *rstd, int N, int C)
{
	SPY_OP("layernorm_backward", R(dout), R(inp), R(w), R(mean), R(rstd), R(dw), R(db),
	       W(dinp), W(dw), W(db));
	spy.base->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}
static void s_rmsnorm_forward(void *out, float *rstd, const void *inp, const float *w, int N,
			      int C, float eps)
{
	SPY_OP("rmsnorm_forward", R(inp), R(w), W(out), W(rstd));
	spy.base->rmsnorm_forward(out, rstd, inp, w, N, C, eps);
}
static void s_rmsnorm_backward(void *dinp, float *dw, const void *dout, const void *inp,
			       const float *w, const float *rstd, int N, int C)
{
	SPY_OP("rmsnorm_backward", R(dout), R(inp), R(w), R(rstd), R(dw), W(dinp), W(dw));
	spy.base->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
}
static void s_matmul_forward(void *out, const void *inp, const float *w, const float *bias, int N,
			     int C, int OC)
{
	SPY_OP("matmul_forward", R(inp), R(w), R(bias), W(out));
	spy.base->matmul_forward(out, inp, w, bias, N, C, OC);
}
static void s_matmul_backward(void *dinp, float *dw, float *dbias, const void *dout,
			      const void *inp, const float *w, int N, int C, int OC)
{
	SPY_OP("matmul_backward", R(dout), R(inp), R(w), R(dw), R(dbias), W(dinp), W(dw),
	       W(dbias));
	spy.base->matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC);
}
static void s_rope_forward(void *qkv, int B, int T, int NH, int NKV, int HD, float theta)
{
	SPY_OP("rope_forward", R(qkv), W(qkv));
	spy.base->rope_forward(qkv, B, T, NH, NKV, HD, theta);
}
static void s_rope_backward(void *dqkv, int B, int T, int NH, int NKV, int HD, float theta)
{
	SPY_OP("rope_backward", R(dqkv), W(dqkv));
	spy.base->rope_backward(dqkv, B, T, NH, NKV, HD, theta);
}
static void s_attention_forward(void *out, float *lse, const void *qkv, int B, int T, int NH,
				int NKV, int HD)
{
	SPY_OP("attention_forward", R(qkv), W(out), W(lse));
	spy.base->attention_forward(out, lse, qkv, B, T, NH, NKV, HD);
}
static void s_attention_backward(void *dqkv, const void *dout, const void *qkv, const void *out,
				 const float *lse, int B, int T, int NH, int NKV, int HD)
{
	SPY_OP("attention_backward", R(dout), R(qkv), R(out), R(lse), W(dqkv));
	spy.base->attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD);
}
static void s_gelu_forward(void *out, const void *inp, size_t n)
{
	SPY_OP("gelu_forward", R(inp), W(out));
	spy.base->gelu_forward(out, inp, n);
}
static void s_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n)
{
	SPY_OP("gelu_backward", R(inp), R(dout), W(dinp));
	spy.base->gelu_backward(dinp, inp, dout, n);
}
static void s_swiglu_forward(void *out, const void *inp, int N, int F)
{
	SPY_OP("swiglu_forward", R(inp), W(out));
	spy.base->swiglu_forward(out, inp, N, F);
}
static void s_swiglu_backward(void *dinp, const void *dout, const void *inp, int N, int F)
{
	SPY_OP("swiglu_backward", R(dout), R(inp), W(dinp));
	spy.base->swiglu_backward(dinp, dout, inp, N, F);
}
static void s_moe_route(float *score, int32_t *sel, float *gate, const void *z, int N, int E,
			int K, int router)
{
	SPY_OP("moe_route", R(z), W(score), W(sel), W(gate));
	spy.base->moe_route(score, sel, gate, z, N, E, K, router);
}
static void s_moe_dispatch(int32_t *count, int32_t *pos, const int32_t *sel, int N, int K, int E)
{
	SPY_OP("moe_dispatch", R(sel), W(count), W(pos));
	spy.base->moe_dispatch(count, pos, sel, N, K, E);
}
static void s_moe_gather(void *xd, const void *x, const int32_t *pos, int N, int K, int C)
{
	SPY_OP("moe_gather", R(x), R(pos), W(xd));
	spy.base->moe_gather(xd, x, pos, N, K, C);
}
static void s_moe_combine(void *out, const void *y, const float *gate, const int32_t *pos, int N,
			  int K, int C)
{
	SPY_OP("moe_combine", R(out), R(y), R(gate), R(pos), W(out));
	spy.base->moe_combine(out, y, gate, pos, N, K, C);
}
static void s_moe_combine_backward(void *dy, float *dgate, const void *dout, const void *y,
				   const float *gate, const int32_t *pos, int N, int K, int C)
{
	SPY_OP("moe_combine_backward", R(dout), R(y), R(gate), R(pos), W(dy), W(dgate));
	spy.base->moe_combine_backward(dy, dgate, dout, y, gate, pos, N, K, C);
}
static void s_moe_aux(float *aux, const void *z, const float *score, const int32_t *count, int N,
		      int E, int K, int router)
{
	SPY_OP("moe_aux", R(z), R(score), R(count), W(aux));
	spy.base->moe_aux(aux, z, score, count, N, E, K, router);
}
static void s_moe_router_backward(void *dz, const void *z, const float *score,
				  const int32_t *sel, const float *gate, const float *dgate,
				  const int32_t *count, int N, int E, int K, int router, float dloss,
				  float alpha, float beta)
{
	SPY_OP("moe_router_backward", R(z), R(score), R(sel), R(gate), R(dgate), R(count), W(dz));
	spy.base->moe_router_backward(dz, z, score, sel, gate, dgate, count, N, E, K, router, dloss,
				      alpha, beta);
}
/* count is host memory (moe.h: copied back once per pass): not a buffer */
static void s_moe_expert_forward(void *out, const void *inp, const float *w,
				 const int32_t *count, int E, int C, int OC)
{
	SPY_OP("moe_expert_forward", R(inp), R(w), W(out));
	spy.base->moe_expert_forward(out, inp, w, count, E, C, OC);
}
static void s_moe_expert_backward(void *dinp, float *dw, const void *dout, const void *inp,
				  const float *w, const int32_t *count, int E, int C, int OC)
{
	SPY_OP("moe_expert_backward", R(dout), R(inp), R(w), R(dw), W(dinp), W(dw));
	spy.base->moe_expert_backward(dinp, dw, dout, inp, w, count, E, C, OC);
}
static void s_add_act(void *out, const void *a, const void *b, size_t n)
{
	SPY_OP("add_act", R(a), R(b), W(out));
	spy.base->add_act(out, a, b, n);
}
static void s_add(float *out, const float *a, const float *b, size_t n)
{
	SPY_OP("add", R(a), R(b), W(out));
	spy.base->add(out, a, b, n);
}
static void s_softmax_xent(float *losses, void *dlogits, const void *logits,
			   const int32_t *targets, int N, int V, int Vp, float dloss)
{
	SPY_OP("softmax_xent", R(logits), R(targets), W(losses), W(dlogits));
	spy.base->softmax_xent(losses, dlogits, logits, targets, N, V, Vp, dloss);
}
static void s_loss_mean(float *out, const float *losses, int N)
{
	SPY_OP("loss_mean", R(losses), W(out));
	spy.base->loss_mean(out, losses, N);
}
static void s_adamw_dir(float *u, const float *g, float *m, float *v, size_t n, float lr,
			float b1, float b2, float eps, float bc1, float bc2)
{
	SPY_OP("adamw_dir", R(g), R(m), R(v), W(u), W(m), W(v));
	spy.base->adamw_dir(u, g, m, v, n, lr, b1, b2, eps, bc1, bc2);
}
static void s_adan_dir(float *u, const float *g, float *m, float *v, float *nacc, float *gprev,
		       size_t n, float lr, float b1, float b2, float b3, float eps, float bc1,
		       float bc2, float bc3, int first)
{
	SPY_OP("adan_dir", R(g), R(m), R(v), R(nacc), R(gprev), W(u), W(m), W(v), W(nacc),
	       W(gprev));
	spy.base->adan_dir(u, g, m, v, nacc, gprev, n, lr, b1, b2, b3, eps, bc1, bc2, bc3, first);
}
static void s_ademamix_dir(float *u, const float *g, float *m1, float *m2, float *nu, size_t n,
			   float lr, float b1, float b2, float b3, float alpha, float eps, float bc1,
			   float bc2)
{
	SPY_OP("ademamix_dir", R(g), R(m1), R(m2), R(nu), W(u), W(m1), W(m2), W(nu));
	spy.base->ademamix_dir(u, g, m1, m2, nu, n, lr, b1, b2, b3, alpha, eps, bc1, bc2);
}
static void s_mars_correct(float *c, const float *g, float *gprev, size_t n, float coef)
{
	SPY_OP("mars_correct", R(g), R(gprev), W(c), W(gprev));
	spy.base->mars_correct(c, g, gprev, n, coef);
}
static void s_ema(float *x, const float *g, size_t n, float beta)
{
	SPY_OP("ema", R(x), R(g), W(x));
	spy.base->ema(x, g, n, beta);
}
static void s_soap_adam(float *out, const float *mr, const float *gr, float *v, size_t n,
			float b2, float eps)
{
	SPY_OP("soap_adam", R(mr), R(gr), R(v), W(v), W(out));
	spy.base->soap_adam(out, mr, gr, v, n, b2, eps);
}
static void s_row_normalize(float *o, float *v, int rows, int cols, float b2, float eps)
{
	SPY_OP("row_normalize", R(o), R(v), W(o), W(v));
	spy.base->row_normalize(o, v, rows, cols, b2, eps);
}
static void s_gemm(float *c, const float *a, const float *b, int M, int N, int K, int ta, int tb,
		   float alpha, float beta)
{
	SPY_OP("gemm", R(a), R(b), R(c), W(c));
	spy.base->gemm(c, a, b, M, N, K, ta, tb, alpha, beta);
}
static void s_lion_dir(float *u, const float *g, float *m, size_t n, float lr, float b1, float b2)
{
	SPY_OP("lion_dir", R(g), R(m), W(u), W(m));
	spy.base->lion_dir(u, g, m, n, lr, b1, b2);
}
static void s_momentum(float *out, const float *g, float *m, size_t n, float mu, int nesterov)
{
	SPY_OP("momentum", R(g), R(m), W(m), W(out));
	spy.base->momentum(out, g, m, n, mu, nesterov);
}
static void s_newton_schulz(float *out, const float *in, int rows, int cols, int steps,
			    float *scratch)
{
	SPY_OP("newton_schulz", R(in), W(scratch), W(out));
	spy.base->newton_schulz(out, in, rows, cols, steps, scratch);
}
static void s_apply_update(float *w, const float *u, float *u_prev, size_t n, float decay,
			   float lambda)
{
	SPY_OP("apply_update", R(w), R(u), R(u_prev), W(w), W(u_prev));
	spy.base->apply_update(w, u, u_prev, n, decay, lambda);
}
static void s_elementwise_step(int rule, const struct optim_elem_tensor *t, int count, float lr,
			       float b1, float b2, float eps, float bc1, float bc2, float lambda)
{
	for (int k = 0; k < count; k++)
		SPY_OP("elementwise_step", R(t[k].g), R(t[k].w), R(t[k].s0), R(t[k].s1),
		       R(t[k].u_prev), W(t[k].w), W(t[k].s0), W(t[k].s1), W(t[k].u_prev));
	spy.base->elementwise_step(rule, t, count, lr, b1, b2, eps, bc1, bc2, lambda);
}
static double s_sumsq(const float *x, size_t n)
{
	SPY_OP("sumsq", R(x));
	return spy.base->sumsq(x, n);
}
static void s_sumsq_many(double *out, const float *const *x, const size_t *n, int count)
{
	for (int k = 0; k < count; k++)
		SPY_OP("sumsq_many", R(x[k]));
	spy.base->sumsq_many(out, x, n, count);
}
static void s_scale(float *x, float s, size_t n)
{
	SPY_OP("scale", R(x), W(x));
	spy.base->scale(x, s, n);
}

/* The spy over base (the cpu backend, f32 or bf16), n lanes on devices
 * dev[n]; fresh bookkeeping. */
static const struct backend *spy_on(const struct backend *base, const int *dev, int n)
{
	pthread_mutex_lock(&spy.mu);
	memset(spy.a, 0, sizeof(spy.a));
	memset(spy.vc, 0, sizeof(spy.vc));
	spy.ops = spy.races = 0;
	spy.first[0] = 0;
	spy.base = base;
	pthread_mutex_unlock(&spy.mu);
	spy_lane = 0;
	char why[64];
	s_set_lanes(dev, n, why, sizeof(why));
	struct backend t = *base;
	t.alloc = s_alloc, t.free = s_free, t.to_device = s_to_device, t.to_host = s_to_host;
	t.copy = s_copy, t.zero = s_zero, t.synchronize = s_synchronize;
	t.set_lanes = s_set_lanes, t.lanes = s_lanes, t.lane_device = s_lane_device;
	t.lane_bind = s_lane_bind, t.fence_new = s_fence_new, t.fence_wait = s_fence_wait;
	t.fence_free = s_fence_free;
	t.act_from_f32 = s_act_from_f32, t.act_to_f32 = s_act_to_f32;
	t.embed_forward = s_embed_forward, t.embed_backward = s_embed_backward;
	t.layernorm_forward = s_layernorm_forward, t.layernorm_backward = s_layernorm_backward;
	t.rmsnorm_forward = s_rmsnorm_forward, t.rmsnorm_backward = s_rmsnorm_backward;
	t.matmul_forward = s_matmul_forward, t.matmul_backward = s_matmul_backward;
	t.rope_forward = s_rope_forward, t.rope_backward = s_rope_backward;
	t.attention_forward = s_attention_forward, t.attention_backward = s_attention_backward;
	t.gelu_forward = s_gelu_forward, t.gelu_backward = s_gelu_backward;
	t.swiglu_forward = s_swiglu_forward, t.swiglu_backward = s_swiglu_backward;
	t.moe_route = s_moe_route, t.moe_dispatch = s_moe_dispatch, t.moe_gather = s_moe_gather;
	t.moe_combine = s_moe_combine, t.moe_combine_backward = s_moe_combine_backward;
	t.moe_aux = s_moe_aux, t.moe_router_backward = s_moe_router_backward;
	t.moe_expert_forward = s_moe_expert_forward;
	t.moe_expert_backward = s_moe_expert_backward;
	t.add_act = s_add_act, t.add = s_add, t.softmax_xent = s_softmax_xent;
	t.loss_mean = s_loss_mean, t.adamw_dir = s_adamw_dir, t.adan_dir = s_adan_dir;
	t.ademamix_dir = s_ademamix_dir, t.mars_correct = s_mars_correct, t.ema = s_ema;
	t.soap_adam = s_soap_adam, t.row_normalize = s_row_normalize, t.gemm = s_gemm;
	t.lion_dir = s_lion_dir, t.momentum = s_momentum, t.newton_schulz = s_newton_schulz;
	t.apply_update = s_apply_update, t.elementwise_step = s_elementwise_step;
	t.sumsq = s_sumsq, t.sumsq_many = s_sumsq_many, t.scale = s_scale;
	/* Every op the cpu has must go through the spy: any slot still equal
	 * to the base's (set_threads aside, which touches no memory) is an op
	 * added to the cpu and not wrapped here. The slots from alloc on are
	 * all function pointers (backend.h), compared as such. */
	void (*const *mine)(void) = (void (*const *)(void))&t.alloc;
	void (*const *theirs)(void) = (void (*const *)(void))&base->alloc;
	size_t slots = (sizeof(t) - offsetof(struct backend, alloc)) / sizeof(*mine);
	size_t skip = (offsetof(struct backend, set_threads) - offsetof(struct backend, alloc)) /
		      sizeof(*mine);
	for (size_t i = 0; i < slots; i++)
		if (i != skip && theirs[i] && mine[i] == theirs[i])
			test_fail(__FILE__, __LINE__, "spy: backend slot %zu (after alloc) is a cpu op "
				  "the spy does not wrap", i);
	spy_table = t;
	return &spy_table;
}

/* No lanes left behind for the next test (the helpers' thread-local lane
 * goes back to 0 with it). */
static void spy_off(void)
{
	backend_lane_bind(&spy_table, 0);
	spy.n = 1;
}

/* ---- the spy finds races ---- */

static const struct backend *cpu_base(void)
{
	return strcmp(test_backend()->name, "cpu") ? NULL : test_backend();
}

TEST(spy_finds_an_unfenced_read)
{
	if (!cpu_base())
		SKIP("the spy wraps the cpu backend");
	int dev[2] = {0, 0};
	const struct backend *be = spy_on(cpu_base(), dev, 2);
	float *x = be->alloc(64 * sizeof(float)), *y;
	be->scale(x, 2.0f, 64);               /* lane 0 writes x */
	backend_lane_bind(be, 1);
	y = be->alloc(64 * sizeof(float));
	be->add(y, x, x, 64);                 /* lane 1 reads it: no fence */
	CHECK_MSG(spy.races >= 1 && strstr(spy.first, "reads memory that scale on lane 0 wrote"),
		  "races %ld, first: %s", spy.races, spy.first);
	/* fenced, the same is fine */
	be->synchronize();
	spy.races = 0;
	backend_lane_bind(be, 0);
	be->scale(x, 2.0f, 64);
	void *f = backend_fence(be);
	backend_lane_bind(be, 1);
	backend_fence_take(be, f);
	be->add(y, x, x, 64);
	CHECK_MSG(spy.races == 0, "a fenced read reported: %s", spy.first);
	/* lane 0 overwriting what lane 1 read, unordered: a race */
	backend_lane_bind(be, 0);
	be->zero(x, 64 * sizeof(float));
	CHECK_MSG(spy.races == 1 && strstr(spy.first, "overwrites memory that add on lane 1"),
		  "races %ld, first: %s", spy.races, spy.first);
	spy.races = 0;
	be->synchronize(); /* orders everything */
	backend_lane_bind(be, 1);
	be->add(y, x, x, 64);
	be->free(y);
	backend_lane_bind(be, 0);
	be->synchronize();
	be->free(x);
	CHECK_MSG(spy.races == 0, "after synchronize: %s", spy.first);
	spy_off();
}

TEST(spy_finds_an_op_on_another_device)
{
	if (!cpu_base())
		SKIP("the spy wraps the cpu backend");
	int dev[2] = {0, 1};
	const struct backend *be = spy_on(cpu_base(), dev, 2);
	float *x = be->alloc(64 * sizeof(float));
	void *f = backend_fence(be);
	backend_lane_bind(be, 1);
	backend_fence_take(be, f);
	float *y = be->alloc(64 * sizeof(float));
	be->copy(y, x, 64 * sizeof(float)); /* a peer copy: fine */
	CHECK_MSG(spy.races == 0, "a fenced peer copy reported: %s", spy.first);
	be->add(y, x, y, 64);                 /* a kernel reading device 0: not */
	CHECK_MSG(spy.races == 1 && strstr(spy.first, "touches memory of device 0"),
		  "races %ld, first: %s", spy.races, spy.first);
	CHECK(!backend_same_device(be, 0, 1) && backend_same_device(be, 1, 1));
	be->synchronize();
	be->free(y);
	backend_lane_bind(be, 0);
	be->free(x);
	spy_off();
}

/* ---- training on lanes ---- */

#define STEPS 12
#define VOCAB TINY_VOCAB

static void base_config(struct config *cfg, const char *arch, const char *optim,
			const char *schedule, int S)
{
	char s[16];
	snprintf(s, sizeof(s), "%d", S);
	tiny_config(cfg, arch, optim);
	config_set_key(cfg, "train", "schedule", schedule, "test");
	config_set_key(cfg, "pipeline", "stages", s, "test");
	config_finish(cfg);
}

struct lanes_run {
	double loss[STEPS];
	double eval;
	float *weights;
	size_t numel;
};

/* STEPS steps on be (split at `save_at`: saved there, a new trainer
 * loads it and goes on; 0: no split), then an evaluation. */
static int lanes_train(const struct config *cfg, const struct backend *be, int save_at,
		       struct lanes_run *r)
{
	static uint32_t tok[20000];
	tiny_tokens(tok, ARRAY_SIZE(tok));
	struct dataloader dl;
	if (dataloader_from_tokens(&dl, tok, ARRAY_SIZE(tok), VOCAB, (int)cfg->train_batch_size,
				   (int)cfg->model_seq_len, 7, 1))
		return -1;
	struct model m;
	if (tiny_model(&m, cfg))
		return -1;
	float *params = xmalloc(m.numel * sizeof(float));
	model_init_weights(&m, params, 1234);
	char path[64];
	snprintf(path, sizeof(path), "/tmp/asyncpp-lanes-%d.ckpt", (int)getpid());
	struct trainer tr;
	struct step_stats st[STEPS];
	int rc = trainer_init(&tr, cfg, &m, be, params, &dl);
	int first = save_at ? save_at : STEPS;
	if (!rc)
		rc = trainer_run(&tr, first, st);
	if (!rc && save_at) {
		char *text = config_to_string(cfg);
		rc = trainer_save(&tr, path, text, NULL);
		free(text);
		trainer_free(&tr);
		struct ckpt *k = NULL;
		rc = rc ? rc : trainer_init(&tr, cfg, &m, be, params, &dl);
		rc = rc ? rc : ckpt_open(&k, path);
		rc = rc ? rc : trainer_load(&tr, k);
		if (k)
			ckpt_close(k);
		unlink(path);
		rc = rc ? rc : trainer_run(&tr, STEPS - first, st + first);
	}
	if (!rc) {
		for (int i = 0; i < STEPS; i++)
			r->loss[i] = st[i].loss;
		r->eval = trainer_eval(&tr, &dl, 3);
		r->numel = m.numel;
		r->weights = xmalloc(m.numel * sizeof(float));
		trainer_gather_weights(&tr, 0, r->weights);
		trainer_free(&tr);
	}
	model_free(&m);
	free(params);
	dataloader_close(&dl);
	return rc;
}

/* cfg on lanes over dev[S] (the spy) == cfg on the plain cpu, bit for bit,
 * with no race. */
static void check_lanes(const char *what, const struct config *cfg, const int *dev, int save_at)
{
	struct lanes_run plain = {0}, lanes = {0};
	int S = (int)cfg->pipeline_stages;
	const struct backend *base = cpu_base();
	if (!strcmp(cfg->train_act_dtype, "bf16"))
		base = backend_with_act_dtype(base, ACT_BF16);
	if (lanes_train(cfg, base, save_at, &plain)) {
		test_fail(__FILE__, __LINE__, "%s: plain run failed: %s", what, last_error());
		return;
	}
	const struct backend *be = spy_on(base, dev, S);
	int rc = lanes_train(cfg, be, save_at, &lanes);
	long ops = spy.ops;
	spy_off();
	if (rc)
		test_fail(__FILE__, __LINE__, "%s: run on lanes failed: %s", what, last_error());
	else if (spy.races)
		test_fail(__FILE__, __LINE__, "%s: %ld unordered access(es); the first: %s", what,
			  spy.races, spy.first);
	else if (ops < 1000)
		test_fail(__FILE__, __LINE__, "%s: only %ld ops went through the spy", what, ops);
	else if (memcmp(plain.loss, lanes.loss, sizeof(plain.loss)) ||
		 memcmp(&plain.eval, &lanes.eval, sizeof(double)) ||
		 memcmp(plain.weights, lanes.weights, plain.numel * sizeof(float)))
		test_fail(__FILE__, __LINE__, "%s: the lanes' bits differ from the plain run's "
			  "(step 1 loss %.9g vs %.9g, eval %.9g vs %.9g)", what, plain.loss[0],
			  lanes.loss[0], plain.eval, lanes.eval);
	free(plain.weights);
	free(lanes.weights);
}

static const int four_devices[] = {0, 1, 2, 3}, two_devices[] = {0, 1, 0, 1},
		 one_device[] = {0, 0, 0, 0}, halves[] = {0, 0, 1, 1};

TEST(every_schedule_on_lanes_is_race_free_and_exact)
{
	if (!cpu_base())
		SKIP("the spy wraps the cpu backend");
	static const char *const sched[] = {"gpipe", "1f1b", "2bw", "pipedream", "zb-h1", "2bw-zb"};
	static const int *const maps[] = {four_devices, two_devices, one_device, halves};
	static const char *const map_name[] = {"0,1,2,3", "0,1,0,1", "0,0,0,0", "0,0,1,1"};
	for (size_t i = 0; i < ARRAY_SIZE(sched) && !test_failed(); i++)
		for (size_t k = 0; k < ARRAY_SIZE(maps) && !test_failed(); k++) {
			struct config cfg;
			base_config(&cfg, "gpt2", "adamw", sched[i], 4); /* tied: the board's exchange */
			char what[96];
			snprintf(what, sizeof(what), "%s S=4 on devices %s", sched[i], map_name[k]);
			check_lanes(what, &cfg, maps[k], 0);
			config_free(&cfg);
		}
}

/* Two pieces per stage (interleaved, zb-v): a stage's pieces share its
 * lane, zb-v's turn at the last stage and its two tied ends on stage 0
 * stay on one lane, interleaved hands the last stage's chunk 0 to stage
 * 0's chunk 1 across devices; the plain run's bits, no race, resume. */
TEST(chunked_schedules_on_lanes_are_race_free_and_exact)
{
	if (!cpu_base())
		SKIP("the spy wraps the cpu backend");
	static const char *const sched[] = {"interleaved", "zb-v"};
	static const int *const maps[] = {four_devices, two_devices, halves};
	static const char *const map_name[] = {"0,1,2,3", "0,1,0,1", "0,0,1,1"};
	for (size_t i = 0; i < ARRAY_SIZE(sched) && !test_failed(); i++)
		for (size_t k = 0; k < ARRAY_SIZE(maps) && !test_failed(); k++) {
			struct config cfg;
			base_config(&cfg, "gpt2", "adamw", sched[i], 4); /* tied */
			config_set_key(&cfg, "model", "n_layer", "8", "test");
			config_set_key(&cfg, "pipeline", "micro_batches", "8", "test");
			if (!strcmp(sched[i], "interleaved"))
				config_set_key(&cfg, "pipeline", "virtual_stages", "2", "test");
			config_finish(&cfg);
			char what[96];
			snprintf(what, sizeof(what), "%s S=4 V=2 on devices %s%s", sched[i],
				 map_name[k], k == 0 ? ", saved at 5 and resumed" : "");
			check_lanes(what, &cfg, maps[k], k == 0 ? 5 : 0);
			config_free(&cfg);
		}
}

TEST(lanes_resume_replicas_and_corrections_are_race_free_and_exact)
{
	if (!cpu_base())
		SKIP("the spy wraps the cpu backend");
	struct config cfg;
	/* a checkpoint taken and loaded on lanes mid-run */
	base_config(&cfg, "llama", "muon", "2bw", 4);
	config_set_key(&cfg, "optim", "correction", "ef", "test");
	check_lanes("2bw S=4 + ef, saved at 5 and resumed, devices 0,1,2,3", &cfg, four_devices, 5);
	config_free(&cfg);
	/* replicas of a stage share its lane; their sum in buckets of 26
	 * floats, started during the backward */
	base_config(&cfg, "gpt2", "adamw", "1f1b", 2);
	config_set_key(&cfg, "pipeline", "data_parallel", "2", "test");
	config_set_key(&cfg, "pipeline", "bucket_mb", "0.0001", "test");
	check_lanes("1f1b S=2 x 2 replicas, bucketed sums, devices 0,1", &cfg, two_devices, 0);
	config_free(&cfg);
	/* weight prediction's extra versions */
	base_config(&cfg, "gpt2", "adamw", "pipedream", 4);
	config_set_key(&cfg, "optim", "correction", "predict", "test");
	check_lanes("pipedream S=4 + predict, devices 0,1,0,1", &cfg, two_devices, 0);
	config_free(&cfg);
	/* bf16 activations: the messages are half the bytes */
	base_config(&cfg, "gpt2", "adamw", "2bw", 2);
	config_set_key(&cfg, "train", "act_dtype", "bf16", "test");
	check_lanes("2bw S=2, bf16 activations, devices 0,1", &cfg, two_devices, 0);
	config_free(&cfg);
}

/* A lane per stage: a trainer with another stage count is refused by name
 * (bench train's sweeps would otherwise bind lanes that do not exist). */
TEST(lanes_must_match_the_stages)
{
	if (!cpu_base())
		SKIP("the spy wraps the cpu backend");
	struct config cfg;
	base_config(&cfg, "gpt2", "adamw", "1f1b", 2);
	struct lanes_run r = {0};
	const struct backend *be = spy_on(cpu_base(), four_devices, 4);
	set_error_quiet(1);
	int rc = lanes_train(&cfg, be, 0, &r);
	set_error_quiet(0);
	spy_off();
	CHECK_MSG(rc && strstr(last_error(), "4 lanes (pipeline.devices) and this run 2 stages"),
		  "rc %d: %s", rc, last_error());
	free(r.weights);
	config_free(&cfg);
}
