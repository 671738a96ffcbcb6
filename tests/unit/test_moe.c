/* test_moe.c - the mixture-of-experts layer of model/moe.h on its own: its
 * gradients (router, experts, shared expert, input; the load-balancing and
 * z losses alone) against central differences, the dispatch order, the
 * routing rules, the losses' values, and bit-identical results for 1, 2
 * and 3 threads. The layer reads host memory: it runs on the CPU backend.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/util.h"
#include "../../kernels/backend.h"
#include "../../model/moe.h"
#include "../test.h"

static const struct backend *be = &backend_cpu;

/* One layer's weights, inputs and buffers. */
struct layer {
	struct moe_dims d;
	float *w;      /* [nw]: router [E,C], fcw [E,2De,C], fcprojw [E,C,De], sh_fcw, sh_fcprojw */
	float *g;      /* [nw] gradients, same layout */
	size_t nw;
	float *x, *dx; /* [N,C] */
	float *r;      /* [N,C] the objective's weights on out: J = sum r*out + aux */
	float *out;    /* [N,C] */
	float *acts, *scratch;
	struct moe_acts a;
	struct moe_scratch s;
	struct moe_params p;
	struct moe_grads gp;
};

static void frand(float *x, size_t n, uint64_t seed, float scale)
{
	uint64_t s = seed;
	for (size_t i = 0; i < n; i++)
		x[i] = scale * rng_normal(&s);
}

static void layer_open(struct layer *l, const struct moe_dims *d, uint64_t seed)
{
	size_t C = d->C, E = d->E, De = d->De, N = d->N;
	size_t n_router = E * C, n_fc = E * 2 * De * C, n_proj = E * C * De;
	size_t n_sh = d->shared ? 2 * De * C + C * De : 0;

	memset(l, 0, sizeof(*l));
	l->d = *d;
	l->nw = n_router + n_fc + n_proj + n_sh;
	l->w = xmalloc(l->nw * sizeof(float));
	l->g = xcalloc(l->nw, sizeof(float));
	/* weights large enough that every path carries gradient well above
	 * fp32 round-off, the router's so that scores are far from uniform */
	frand(l->w, n_router, seed, 0.8f);
	frand(l->w + n_router, l->nw - n_router, seed + 1, 0.3f);
	l->x = xmalloc(N * C * sizeof(float));
	l->dx = xmalloc(N * C * sizeof(float));
	l->r = xmalloc(N * C * sizeof(float));
	l->out = xmalloc(N * C * sizeof(float));
	frand(l->x, N * C, seed + 2, 1.0f);
	frand(l->r, N * C, seed + 3, 1.0f);
	l->acts = xmalloc(moe_acts_view(d, NULL, &l->a) * sizeof(float));
	l->scratch = xmalloc(moe_scratch_view(d, NULL, &l->s) * sizeof(float));
	moe_acts_view(d, l->acts, &l->a);
	moe_scratch_view(d, l->scratch, &l->s);
	l->p = (struct moe_params){l->w, l->w + n_router, l->w + n_router + n_fc,
				   d->shared ? l->w + n_router + n_fc + n_proj : NULL,
				   d->shared ? l->w + n_router + n_fc + n_proj + 2 * De * C : NULL};
	l->gp = (struct moe_grads){l->g, l->g + n_router, l->g + n_router + n_fc,
				   d->shared ? l->g + n_router + n_fc + n_proj : NULL,
				   d->shared ? l->g + n_router + n_fc + n_proj + 2 * De * C : NULL};
}

static void layer_close(struct layer *l)
{
	free(l->w), free(l->g), free(l->x), free(l->dx), free(l->r), free(l->out);
	free(l->acts), free(l->scratch);
}

/* The objective: J = sum r*out + alpha*balance + beta*zloss (dloss 1). */
static double objective(struct layer *l)
{
	size_t n = (size_t)l->d.N * l->d.C;
	double j = 0;
	moe_forward(be, &l->d, &l->p, l->x, l->out, &l->a);
	for (size_t i = 0; i < n; i++)
		j += (double)l->r[i] * l->out[i];
	return j + (double)l->d.alpha * l->a.aux[0] + (double)l->d.beta * l->a.aux[1];
}

static void layer_grad(struct layer *l)
{
	memset(l->g, 0, l->nw * sizeof(float));
	objective(l);
	moe_backward(be, &l->d, &l->p, &l->gp, l->x, l->r, l->dx, &l->a, &l->s, NULL, 1.0f);
}

/* The chosen experts of the last forward, to tell a perturbation that
 * moved a token to another expert (the objective jumps there: top-k is
 * piecewise constant) from one that did not. */
static void routes(const struct layer *l, int32_t *sel)
{
	memcpy(sel, l->a.sel, (size_t)l->d.N * l->d.K * sizeof(int32_t));
}

/* Central differences of J against the backward for `samples` entries of
 * v[0..n) (a weight tensor or the input), whose gradient is g. An entry
 * passes when |fd - g| <= 3e-4 + 3e-4 |g|: J is a double sum of fp32
 * outputs of size ~1, so a difference quotient with eps 1e-2 carries
 * ~1e-5 of round-off and O(eps^2) truncation error (observed up to
 * 1.7e-4 at |g| = 0.25), while a missing term, a wrong sign or a factor
 * of 2 is off by |g| itself (a 10% error in the z-loss's gradient fails).
 * Perturbations that change a route are left out; at most a quarter may
 * be, and the largest |g| checked must exceed `floor` (not vacuous). */
static void fd_check(struct layer *l, const char *what, float *v, const float *g, size_t n,
		     int samples, double floor)
{
	size_t NK = (size_t)l->d.N * l->d.K;
	int32_t *base = xmalloc(NK * sizeof(int32_t)), *moved = xmalloc(NK * sizeof(int32_t));
	uint64_t s = 77;
	int skipped = 0, checked = 0;
	double gmax = 0;
	const float eps = 1e-2f;

	objective(l);
	routes(l, base);
	for (int k = 0; k < samples; k++) {
		size_t j = n <= (size_t)samples ? (size_t)k % n : rng_next(&s) % n;
		float v0 = v[j];
		double jp, jm, fd;
		int same;
		v[j] = v0 + eps;
		jp = objective(l);
		routes(l, moved);
		same = !memcmp(base, moved, NK * sizeof(int32_t));
		v[j] = v0 - eps;
		jm = objective(l);
		routes(l, moved);
		same &= !memcmp(base, moved, NK * sizeof(int32_t));
		v[j] = v0;
		if (!same) {
			skipped++;
			continue;
		}
		fd = (jp - jm) / (2.0 * eps);
		checked++;
		gmax = fmax(gmax, fabs(g[j]));
		CHECK_MSG(fabs(fd - g[j]) <= 3e-4 + 3e-4 * fabs(g[j]),
			  "%s (K %d, router %d, shared %d): [%zu]: backward %.7g, fd %.7g", what, l->d.K,
			  l->d.router, l->d.shared, j, (double)g[j], fd);
	}
	CHECK_MSG(skipped * 4 <= samples, "%s: %d of %d perturbations changed a route", what,
		  skipped, samples);
	CHECK_MSG(gmax > floor, "%s: the %d gradients checked are all below %g", what, checked,
		  floor);
	free(base);
	free(moved);
}

static struct moe_dims dims(int router, int K, int shared)
{
	struct moe_dims d = {.N = 12, .C = 8, .E = 4, .K = K, .De = 6, .shared = shared,
			     .router = router, .alpha = 0.5f, .beta = 0.05f};
	return d;
}

/* Every tensor of the layer and its input, for both routers, top-1 and
 * top-2, with and without the shared expert. */
static void grad_check_layer(int router, int K, int shared, uint64_t seed)
{
	struct moe_dims d = dims(router, K, shared);
	struct layer l;
	size_t C = d.C, E = d.E, De = d.De;
	layer_open(&l, &d, seed);
	layer_grad(&l);
	fd_check(&l, "router", l.w, l.g, E * C, 24, 1e-2);
	for (int e = 0; e < d.E && !test_failed(); e++) {
		size_t fc = E * C + (size_t)e * 2 * De * C, pr = E * C + E * 2 * De * C + e * C * De;
		if (l.a.count[e + 1] == l.a.count[e])
			continue; /* an expert no token reached has no gradient */
		fd_check(&l, "experts.fcw", l.w + fc, l.g + fc, 2 * De * C, 12, 1e-2);
		fd_check(&l, "experts.fcprojw", l.w + pr, l.g + pr, C * De, 12, 1e-2);
	}
	if (shared && !test_failed()) {
		size_t o = E * C + E * 2 * De * C + E * C * De;
		fd_check(&l, "shared.fcw", l.w + o, l.g + o, 2 * De * C, 16, 1e-2);
		fd_check(&l, "shared.fcprojw", l.w + o + 2 * De * C, l.g + o + 2 * De * C, C * De,
			 16, 1e-2);
	}
	if (!test_failed())
		fd_check(&l, "input", l.x, l.dx, (size_t)d.N * C, 24, 1e-2);
	layer_close(&l);
}

TEST(grad_softmax_top2_shared)
{
	grad_check_layer(ROUTER_SOFTMAX, 2, 1, 11);
}

TEST(grad_softmax_top1)
{
	grad_check_layer(ROUTER_SOFTMAX, 1, 0, 12);
}

TEST(grad_sigmoid_top2)
{
	grad_check_layer(ROUTER_SIGMOID, 2, 0, 13);
}

TEST(grad_sigmoid_top1_shared)
{
	grad_check_layer(ROUTER_SIGMOID, 1, 1, 14);
}

TEST(grad_softmax_top3_of_5)
{
	struct moe_dims d = dims(ROUTER_SOFTMAX, 3, 0);
	struct layer l;
	d.E = 5;
	layer_open(&l, &d, 15);
	layer_grad(&l);
	fd_check(&l, "router", l.w, l.g, (size_t)d.E * d.C, 30, 1e-2);
	if (!test_failed())
		fd_check(&l, "input", l.x, l.dx, (size_t)d.N * d.C, 24, 1e-2);
	layer_close(&l);
}

/* The auxiliary losses alone: with r = 0 the objective is alpha*balance +
 * beta*zloss, and only the router (and the input, through it) has a
 * gradient. Each term on its own, for both routers. */
TEST(grad_of_the_auxiliary_losses)
{
	for (int router = 0; router < 2; router++)
		for (int which = 0; which < 2; which++) {
			struct moe_dims d = dims(router, 2, 1);
			struct layer l;
			d.alpha = which ? 0.0f : 1.0f;
			d.beta = which ? 1.0f : 0.0f;
			layer_open(&l, &d, 21 + router);
			memset(l.r, 0, (size_t)d.N * d.C * sizeof(float));
			layer_grad(&l);
			fd_check(&l, which ? "z-loss: router" : "balance: router", l.w, l.g,
				 (size_t)d.E * d.C, 32, which ? 1e-2 : 1e-3);
			if (!test_failed())
				fd_check(&l, which ? "z-loss: input" : "balance: input", l.x, l.dx,
					 (size_t)d.N * d.C, 24, which ? 1e-2 : 1e-3);
			for (size_t i = (size_t)d.E * d.C; i < l.nw && !test_failed(); i++)
				CHECK_MSG(l.g[i] == 0.0f, "an expert weight has gradient %g from the "
					  "auxiliary losses", (double)l.g[i]);
			layer_close(&l);
			if (test_failed())
				return;
		}
}

/* The losses' values where they are known: a router of zeros gives every
 * expert the same score, so ties send every token to experts 0..K-1 (the
 * lower index wins), P_i = 1/E, balance = E * sum_i f_i / E = 1 and
 * zloss = log(E)^2 (softmax); sigmoid scores are 1/2, normalised 1/E. */
TEST(loss_values_of_a_uniform_router)
{
	for (int router = 0; router < 2; router++) {
		struct moe_dims d = dims(router, 2, 0);
		struct layer l;
		layer_open(&l, &d, 31);
		memset(l.w, 0, (size_t)d.E * d.C * sizeof(float));
		objective(&l);
		for (int n = 0; n < d.N; n++)
			CHECK(l.a.sel[n * 2] == 0 && l.a.sel[n * 2 + 1] == 1);
		CHECK(l.a.count[1] == d.N && l.a.count[2] == 2 * d.N && l.a.count[4] == 2 * d.N);
		CHECK_NEAR(l.a.aux[0], 1.0, 1e-6);
		CHECK_NEAR(l.a.aux[1], log(4.0) * log(4.0), 1e-5);
		for (int i = 0; i < d.N * d.K; i++)
			CHECK_NEAR(l.a.gate[i], 0.5, 1e-7);
		layer_close(&l);
	}
}

/* Routing rules and the dispatch layout: K distinct experts per token,
 * best first; softmax gates (K > 1) sum to 1; expert e's rows are
 * [count[e], count[e+1]) in ascending token order, each (token, j) slot
 * exactly once; and the layer's output is shared(x) + sum_j gate_j *
 * expert_j(x) computed here from the dispatched rows. */
TEST(dispatch_order_and_combine)
{
	struct moe_dims d = dims(ROUTER_SOFTMAX, 2, 0);
	struct layer l;
	d.N = 40;
	d.E = 6;
	layer_open(&l, &d, 41);
	objective(&l);
	int N = d.N, K = d.K, E = d.E, C = d.C;
	char *seen = xcalloc((size_t)N * K, 1);
	CHECK(l.a.count[0] == 0 && l.a.count[E] == N * K);
	for (int n = 0; n < N; n++) {
		double gs = 0;
		for (int j = 0; j < K; j++) {
			int e = l.a.sel[n * K + j], r = l.a.pos[n * K + j];
			CHECK(e >= 0 && e < E);
			CHECK(r >= l.a.count[e] && r < l.a.count[e + 1]);
			CHECK(!seen[r]);
			seen[r] = 1;
			CHECK(!memcmp((const float *)l.a.xd + (size_t)r * C, l.x + (size_t)n * C, C * sizeof(float)));
			if (j)
				CHECK(l.a.score[n * E + e] <= l.a.score[n * E + l.a.sel[n * K + j - 1]] &&
				      e != l.a.sel[n * K + j - 1]);
			gs += l.a.gate[n * K + j];
		}
		CHECK_NEAR(gs, 1.0, 1e-6);
		/* no unchosen expert scores above the K-th */
		for (int e = 0; e < E; e++) {
			int chosen = 0;
			for (int j = 0; j < K; j++)
				chosen |= l.a.sel[n * K + j] == e;
			CHECK(chosen || l.a.score[n * E + e] <= l.a.score[n * E + l.a.sel[n * K + K - 1]]);
		}
	}
	/* ascending token order within each expert */
	for (int n = 0; n < N; n++)
		for (int m = n + 1; m < N; m++)
			for (int j = 0; j < K; j++)
				for (int i = 0; i < K; i++)
					if (l.a.sel[n * K + j] == l.a.sel[m * K + i])
						CHECK(l.a.pos[n * K + j] < l.a.pos[m * K + i]);
	for (int n = 0; n < N; n++)
		for (int c = 0; c < C; c++) {
			double want = 0;
			for (int j = 0; j < K; j++)
				want += (double)l.a.gate[n * K + j] *
					((const float *)l.a.y)[(size_t)l.a.pos[n * K + j] * C + c];
			CHECK_NEAR(l.out[(size_t)n * C + c], want, 1e-5);
		}
	free(seen);
	layer_close(&l);
}

/* Forward and backward on shapes big enough for the backend's parallel
 * paths give the same bits for 1, 2 and 3 threads. */
static void run_big(struct layer *l, float *out)
{
	size_t N = (size_t)l->d.N, C = (size_t)l->d.C;
	layer_grad(l);
	memcpy(out, l->out, N * C * sizeof(float));
	memcpy(out + N * C, l->dx, N * C * sizeof(float));
	memcpy(out + 2 * N * C, l->g, l->nw * sizeof(float));
}

TEST(thread_count_invariance)
{
	struct moe_dims d = {.N = 2 * 67, .C = 96, .E = 8, .K = 2, .De = 80, .shared = 1,
			     .router = ROUTER_SOFTMAX, .alpha = 0.01f, .beta = 0.001f};
	struct layer l;
	layer_open(&l, &d, 51);
	size_t n = 2 * (size_t)d.N * d.C + l.nw;
	float *ref = xmalloc(n * sizeof(float)), *got = xmalloc(n * sizeof(float));
	be->set_threads(1);
	run_big(&l, ref);
	for (int th = 2; th <= 3; th++) {
		be->set_threads(th);
		run_big(&l, got);
		CHECK_MSG(!memcmp(ref, got, 2 * (size_t)d.N * d.C * sizeof(float)),
			  "output or input gradient differs between 1 and %d threads", th);
		CHECK_MSG(!memcmp(ref, got, n * sizeof(float)),
			  "weight gradients differ between 1 and %d threads", th);
	}
	be->set_threads(0);
	free(ref);
	free(got);
	layer_close(&l);
}
