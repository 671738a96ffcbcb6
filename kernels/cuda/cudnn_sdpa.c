/* cudnn_sdpa.c - causal grouped-query attention on cuDNN (see cudnn_sdpa.h):
 * loading libcudnn with dlopen at first use (its headers give the types and
 * enum values only), handles, the engine choice, the plan cache and the
 * variant pack of each call. The graphs themselves: cudnn_sdpa_graph.c.
 *
 * Determinism: the backward's graph writes dQ straight from its product
 * (cudnn_sdpa_graph.c), and any engine carrying
 * CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC is refused.
 */
#include "cudnn_sdpa.h"

#include "../../io/util.h"

#if defined(__has_include)
#if __has_include(<cudnn_graph.h>)
#define SDPA_HAVE_HEADERS 1
#endif
#endif

#ifdef SDPA_HAVE_HEADERS
#include "cudnn_sdpa_graph.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEVICES 64
#define PLAN_CACHE 64
#define HEUR_CONFIGS 16
#define WS_ALIGN 256

struct sdpa_plan {
	struct sdpa_key key;
	cudnnBackendDescriptor_t plan; /* NULL: refused (cached as such) */
	/* the graph's descriptors, kept while the plan lives (the plan refers
	 * to its engine configuration, that to the graph) */
	cudnnBackendDescriptor_t *graph;
	int ngraph;
	size_t cudnn_ws;               /* cuDNN's workspace, bytes */
	size_t rowsum_bytes;           /* backward: B*NH*T floats after it */
	/* pass-by-value scalars: the variant pack points at these */
	float scale, neg_inf, one;
};

struct sdpa_ctx {
	pthread_mutex_t mu;
	char *libpath;
	void *lib;
	int state; /* 0 not loaded, 1 loaded, -1 failed */
	struct sdpa_api api;
	cudnnHandle_t handle[MAX_DEVICES];
	struct sdpa_plan plans[PLAN_CACHE];
	int nplans;
	long ndesc;
	int notices;
	char why[512];
	void (*notice)(void *arg, const char *msg);
	void *notice_arg;
};

/* the default notice: a warning line (io/util.h: kept off a progress line) */
static void notice_stderr(void *arg, const char *msg)
{
	(void)arg;
	warning("%s", msg);
}

struct sdpa_ctx *sdpa_ctx_new(const char *libpath)
{
	struct sdpa_ctx *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	pthread_mutex_init(&c->mu, NULL);
	c->libpath = libpath ? strdup(libpath) : NULL;
	c->notice = notice_stderr;
	return c;
}

void sdpa_ctx_set_notice(struct sdpa_ctx *c, void (*fn)(void *arg, const char *msg), void *arg)
{
	c->notice = fn ? fn : notice_stderr;
	c->notice_arg = arg;
}

int sdpa_ctx_notices(const struct sdpa_ctx *c)
{
	return c->notices;
}

const char *sdpa_ctx_why(const struct sdpa_ctx *c)
{
	return c->why;
}

long sdpa_ctx_descriptors(const struct sdpa_ctx *c)
{
	return c->ndesc;
}

/* Record why cuDNN is not used and say it once per context. */
static void refuse(struct sdpa_ctx *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->why, sizeof(c->why), fmt, ap);
	va_end(ap);
	if (!c->notices) {
		char msg[640];
		c->notices = 1;
		snprintf(msg, sizeof(msg),
			 "cuDNN attention not used (%s); running the flash kernels", c->why);
		c->notice(c->notice_arg, msg);
	}
}

static int load_locked(struct sdpa_ctx *c)
{
	static const char *names[] = {
		"libcudnn.so.9", "libcudnn.so", "/usr/local/cuda/lib64/libcudnn.so.9",
	};
	if (c->state)
		return c->state > 0 ? 0 : -1;
	c->state = -1;
	const char *err = "not found";
	if (c->libpath) {
		c->lib = dlopen(c->libpath, RTLD_NOW | RTLD_LOCAL);
		if (!c->lib)
			err = dlerror();
	}
	for (size_t i = 0; !c->libpath && i < sizeof(names) / sizeof(names[0]) && !c->lib; i++) {
		c->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
		if (!c->lib)
			err = dlerror();
	}
	if (!c->lib) {
		refuse(c, "cannot load %s: %s", c->libpath ? c->libpath : "libcudnn.so.9",
		       err ? err : "not found");
		return -1;
	}
	/* dlsym's void * to a function pointer goes through memcpy (ISO C) */
#define X(name, ret, args)                                                              \
	{                                                                               \
		void *f_ = dlsym(c->lib, #name);                                        \
		if (!f_) {                                                              \
			refuse(c, "libcudnn lacks %s", #name);                          \
			return -1;                                                      \
		}                                                                       \
		memcpy(&c->api.name, &f_, sizeof(f_));                                  \
	}
	SDPA_FUNCS(X)
#undef X
	size_t v = c->api.cudnnGetVersion();
	if (v < 90000) {
		refuse(c, "cuDNN %zu is older than 9.0", v);
		return -1;
	}
	c->state = 1;
	return 0;
}

void *sdpa_ctx_handle(struct sdpa_ctx *c, int device)
{
	void *h = NULL;
	pthread_mutex_lock(&c->mu);
	if (device < 0 || device >= MAX_DEVICES) {
		refuse(c, "device %d out of range", device);
	} else if (load_locked(c) == 0) {
		if (!c->handle[device]) {
			cudnnStatus_t st = c->api.cudnnCreate(&c->handle[device]);
			if (st != CUDNN_STATUS_SUCCESS) {
				c->handle[device] = NULL;
				refuse(c, "cudnnCreate: %s", c->api.cudnnGetErrorString(st));
			}
		}
		h = c->handle[device];
	}
	pthread_mutex_unlock(&c->mu);
	return h;
}

int sdpa_ctx_set_stream(struct sdpa_ctx *c, void *handle, void *stream)
{
	if (c->state <= 0)
		return -1;
	cudnnStatus_t st = c->api.cudnnSetStream((cudnnHandle_t)handle, (cudaStream_t)stream);
	if (st != CUDNN_STATUS_SUCCESS) {
		pthread_mutex_lock(&c->mu);
		refuse(c, "cudnnSetStream: %s", c->api.cudnnGetErrorString(st));
		pthread_mutex_unlock(&c->mu);
		return -1;
	}
	return 0;
}

/* 1 if the engine configuration's engine is deterministic */
static int engine_deterministic(struct gb *g, cudnnBackendDescriptor_t cfg)
{
	const struct sdpa_api *a = g->api;
	cudnnBackendDescriptor_t eng = sdpa_gb_new(g, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
	if (!eng)
		return 0;
	int64_t n = 0;
	cudnnStatus_t st = a->cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE,
						       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng);
	if (st != CUDNN_STATUS_SUCCESS || n != 1)
		return 0;
	cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
	n = 0;
	st = a->cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
					 CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT,
					 &n, notes);
	if (st != CUDNN_STATUS_SUCCESS)
		return 0;
	for (int64_t i = 0; i < n && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; i++)
		if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)
			return 0;
	return 1;
}

/* The engines heuristics `mode` offers for graph, in their order: the first
 * deterministic one whose execution plan finalizes becomes p's plan.
 * *offered and *ndet count the configurations offered and the
 * deterministic ones; g->why says why the last one tried failed. */
static void choose_engine(struct gb *g, cudnnHandle_t h, cudnnBackendDescriptor_t graph,
			  cudnnBackendHeurMode_t mode, struct sdpa_plan *p, int64_t *offered,
			  int *ndet)
{
	const struct sdpa_api *a = g->api;
	cudnnBackendDescriptor_t heur = sdpa_gb_new(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
	sdpa_gb_set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
		    CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
	sdpa_gb_set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
	sdpa_gb_finalize(g, heur, "engine heuristics");
	cudnnBackendDescriptor_t cfg[HEUR_CONFIGS];
	int64_t ncfg = 0;
	for (int i = 0; i < HEUR_CONFIGS; i++)
		cfg[i] = sdpa_gb_new(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
	if (g->failed)
		return;
	cudnnStatus_t st = a->cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
						       CUDNN_TYPE_BACKEND_DESCRIPTOR, HEUR_CONFIGS,
						       &ncfg, cfg);
	if (st != CUDNN_STATUS_SUCCESS) {
		sdpa_gb_fail(g, "engine heuristics results", st);
		return;
	}
	*offered += ncfg;
	for (int64_t i = 0; !g->failed && i < ncfg && i < HEUR_CONFIGS && !p->plan; i++) {
		if (!engine_deterministic(g, cfg[i]))
			continue;
		(*ndet)++;
		cudnnBackendDescriptor_t plan = NULL;
		if (a->cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
						    &plan) != CUDNN_STATUS_SUCCESS)
			break;
		(*g->created)++;
		st = a->cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
						 CUDNN_TYPE_HANDLE, 1, &h);
		if (st == CUDNN_STATUS_SUCCESS)
			st = a->cudnnBackendSetAttribute(plan,
							 CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
							 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]);
		if (st == CUDNN_STATUS_SUCCESS)
			st = a->cudnnBackendFinalize(plan);
		int64_t ws = 0, n = 0;
		if (st == CUDNN_STATUS_SUCCESS)
			st = a->cudnnBackendGetAttribute(plan,
							 CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
							 CUDNN_TYPE_INT64, 1, &n, &ws);
		if (st != CUDNN_STATUS_SUCCESS || ws < 0) {
			snprintf(g->why, sizeof(g->why), "execution plan: %s",
				 a->cudnnGetErrorString(st));
			a->cudnnBackendDestroyDescriptor(plan);
			continue;
		}
		p->plan = plan;
		p->cudnn_ws = (size_t)ws;
	}
}

/* Build k's graph, choose its engine, make the plan; with c->mu held. */
static void plan_build(struct sdpa_ctx *c, cudnnHandle_t h, struct sdpa_plan *p)
{
	const struct sdpa_key *k = &p->key;
	struct gb g = {.api = &c->api, .created = &c->ndesc, .next_uid = SDPA_UID_VIRTUAL};
	if (k->backward)
		sdpa_build_backward(&g, k);
	else
		sdpa_build_forward(&g, k);

	cudnnBackendDescriptor_t graph = sdpa_gb_new(&g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
	sdpa_gb_set(&g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
	sdpa_gb_set(&g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.nops,
	       g.ops);
	sdpa_gb_finalize(&g, graph, "operation graph");

	/* the heuristics' first choice, then their fallback list */
	static const cudnnBackendHeurMode_t modes[] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
	int64_t offered = 0;
	int ndet = 0;
	for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]) && !g.failed && !p->plan; m++)
		choose_engine(&g, h, graph, modes[m], p, &offered, &ndet);
	if (!g.failed && !p->plan && !offered)
		snprintf(g.why, sizeof(g.why), "the heuristics offer no engine");
	else if (!g.failed && !p->plan && !ndet)
		snprintf(g.why, sizeof(g.why), "no deterministic engine among %lld",
			 (long long)offered);
	if (p->plan) {
		p->graph = malloc((size_t)g.ndesc * sizeof(*p->graph));
		if (p->graph) {
			memcpy(p->graph, g.desc, (size_t)g.ndesc * sizeof(*p->graph));
			p->ngraph = g.ndesc;
			g.ndesc = 0;
		}
	}
	sdpa_gb_destroy_all(&g);
	if (!p->plan) {
		refuse(c, "%s attention B=%d T=%d NH=%d NKV=%d HD=%d: %s",
		       k->backward ? "backward" : "forward", k->B, k->T, k->NH, k->NKV, k->HD,
		       g.why[0] ? g.why : "refused");
		return;
	}
	p->rowsum_bytes = k->backward ? (size_t)k->B * k->NH * k->T * sizeof(float) : 0;
	p->scale = 1.0f / sqrtf((float)k->HD);
	p->neg_inf = -INFINITY;
	p->one = 1.0f;
}

int sdpa_graph_check(struct sdpa_ctx *c, const struct sdpa_key *k)
{
	pthread_mutex_lock(&c->mu);
	if (load_locked(c) < 0) {
		pthread_mutex_unlock(&c->mu);
		return -1;
	}
	struct gb g = {.api = &c->api, .created = &c->ndesc, .next_uid = SDPA_UID_VIRTUAL};
	if (k->backward)
		sdpa_build_backward(&g, k);
	else
		sdpa_build_forward(&g, k);
	cudnnBackendDescriptor_t graph = sdpa_gb_new(&g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
	sdpa_gb_set(&g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.nops,
	       g.ops);
	sdpa_gb_finalize(&g, graph, "operation graph");
	sdpa_gb_destroy_all(&g);
	if (g.failed)
		snprintf(c->why, sizeof(c->why), "%s", g.why);
	pthread_mutex_unlock(&c->mu);
	return g.failed ? -1 : 0;
}

static void plan_destroy(struct sdpa_ctx *c, struct sdpa_plan *p)
{
	if (p->plan)
		c->api.cudnnBackendDestroyDescriptor(p->plan);
	for (int i = 0; i < p->ngraph; i++)
		c->api.cudnnBackendDestroyDescriptor(p->graph[i]);
	free(p->graph);
	memset(p, 0, sizeof(*p));
}

const struct sdpa_plan *sdpa_plan_get(struct sdpa_ctx *c, void *handle, const struct sdpa_key *k)
{
	struct sdpa_plan *p = NULL;
	pthread_mutex_lock(&c->mu);
	for (int i = 0; i < c->nplans; i++)
		if (!memcmp(&c->plans[i].key, k, sizeof(*k))) {
			p = &c->plans[i];
			break;
		}
	if (!p) {
		if (!k->bf16 || !k->causal || k->B <= 0 || k->T <= 0 || k->NKV <= 0 ||
		    k->NH % k->NKV || (k->HD != 64 && k->HD != 128)) {
			/* never asked of cuDNN: the caller's kernels serve it, no notice */
			pthread_mutex_unlock(&c->mu);
			return NULL;
		}
		if (load_locked(c) < 0 || !handle) {
			pthread_mutex_unlock(&c->mu);
			return NULL;
		}
		if (c->nplans == PLAN_CACHE) { /* a model has a handful of shapes; start over */
			for (int i = 0; i < c->nplans; i++)
				plan_destroy(c, &c->plans[i]);
			c->nplans = 0;
		}
		p = &c->plans[c->nplans++];
		memset(p, 0, sizeof(*p));
		p->key = *k;
		plan_build(c, (cudnnHandle_t)handle, p);
	}
	pthread_mutex_unlock(&c->mu);
	return p->plan ? p : NULL;
}

static size_t ws_round(size_t n)
{
	return (n + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN;
}

size_t sdpa_plan_workspace(const struct sdpa_plan *p)
{
	return ws_round(p->cudnn_ws) + ws_round(p->rowsum_bytes);
}

int sdpa_plan_run(struct sdpa_ctx *c, void *handle, const struct sdpa_plan *p,
		  const struct sdpa_ptrs *x, void *workspace)
{
	const struct sdpa_key *k = &p->key;
	struct sdpa_api *a = &c->api;
	size_t q = 0, kk = (size_t)k->NH * k->HD, v = (size_t)(k->NH + k->NKV) * k->HD;
	const char *qkv = x->qkv;
	int64_t uids[16];
	void *ptrs[16];
	int n = 0;
#define PUT(uid, ptr) (uids[n] = (uid), ptrs[n] = (void *)(ptr), n++)
	PUT(SDPA_UID_Q, qkv + 2 * q); /* bf16: 2 bytes an element */
	PUT(SDPA_UID_K, qkv + 2 * kk);
	PUT(SDPA_UID_V, qkv + 2 * v);
	PUT(SDPA_UID_SCALE, &p->scale);
	PUT(SDPA_UID_NEG_INF, &p->neg_inf);
	if (!k->backward) {
		PUT(SDPA_UID_O, x->out);
		PUT(SDPA_UID_STATS, x->lse);
	} else {
		char *d = x->dqkv;
		PUT(SDPA_UID_O, x->out_in);
		PUT(SDPA_UID_STATS, x->lse_in);
		PUT(SDPA_UID_DO, x->dout);
		PUT(SDPA_UID_DQ, d + 2 * q);
		PUT(SDPA_UID_DK, d + 2 * kk);
		PUT(SDPA_UID_DV, d + 2 * v);
		PUT(SDPA_UID_ONE, &p->one);
		PUT(SDPA_UID_SOFTMAX_SUM, (char *)workspace + ws_round(p->cudnn_ws));
	}
#undef PUT
	cudnnBackendDescriptor_t pack = NULL;
	cudnnStatus_t st = a->cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR,
							   &pack);
	if (st == CUDNN_STATUS_SUCCESS)
		st = a->cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
						 CUDNN_TYPE_INT64, n, uids);
	if (st == CUDNN_STATUS_SUCCESS)
		st = a->cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
						 CUDNN_TYPE_VOID_PTR, n, ptrs);
	if (st == CUDNN_STATUS_SUCCESS)
		st = a->cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
						 CUDNN_TYPE_VOID_PTR, 1, &workspace);
	if (st == CUDNN_STATUS_SUCCESS)
		st = a->cudnnBackendFinalize(pack);
	if (st == CUDNN_STATUS_SUCCESS)
		st = a->cudnnBackendExecute((cudnnHandle_t)handle, p->plan, pack);
	if (pack)
		a->cudnnBackendDestroyDescriptor(pack);
	if (st != CUDNN_STATUS_SUCCESS) {
		pthread_mutex_lock(&c->mu);
		refuse(c, "executing the %s plan: %s", k->backward ? "backward" : "forward",
		       a->cudnnGetErrorString(st));
		pthread_mutex_unlock(&c->mu);
		return -1;
	}
	return 0;
}

void sdpa_ctx_free(struct sdpa_ctx *c)
{
	if (!c)
		return;
	if (c->state > 0) {
		for (int i = 0; i < c->nplans; i++)
			plan_destroy(c, &c->plans[i]);
		for (int d = 0; d < MAX_DEVICES; d++)
			if (c->handle[d])
				c->api.cudnnDestroy(c->handle[d]);
	}
	if (c->lib)
		dlclose(c->lib);
	pthread_mutex_destroy(&c->mu);
	free(c->libpath);
	free(c);
}

#else /* built without cuDNN's headers: every context refuses, once */

#include <stdio.h>
#include <stdlib.h>

struct sdpa_ctx {
	int notices;
	void (*notice)(void *arg, const char *msg);
	void *notice_arg;
};

#define SDPA_NO_HEADERS "built without cuDNN's headers (cudnn_graph.h; make CUDNN_INC=-IDIR)"

/* the default notice: a warning line (io/util.h: kept off a progress line) */
static void notice_stderr(void *arg, const char *msg)
{
	(void)arg;
	warning("%s", msg);
}

struct sdpa_ctx *sdpa_ctx_new(const char *libpath)
{
	(void)libpath;
	struct sdpa_ctx *c = calloc(1, sizeof(*c));
	if (c)
		c->notice = notice_stderr;
	return c;
}

void sdpa_ctx_free(struct sdpa_ctx *c)
{
	free(c);
}

void sdpa_ctx_set_notice(struct sdpa_ctx *c, void (*fn)(void *arg, const char *msg), void *arg)
{
	c->notice = fn ? fn : notice_stderr;
	c->notice_arg = arg;
}

int sdpa_ctx_notices(const struct sdpa_ctx *c)
{
	return c->notices;
}

const char *sdpa_ctx_why(const struct sdpa_ctx *c)
{
	return SDPA_NO_HEADERS;
}

long sdpa_ctx_descriptors(const struct sdpa_ctx *c)
{
	return 0;
}

void *sdpa_ctx_handle(struct sdpa_ctx *c, int device)
{
	(void)device;
	if (!c->notices++)
		c->notice(c->notice_arg, "cuDNN attention not used (" SDPA_NO_HEADERS
					 "); running the flash kernels");
	c->notices = 1;
	return NULL;
}

int sdpa_ctx_set_stream(struct sdpa_ctx *c, void *handle, void *stream)
{
	return -1;
}

const struct sdpa_plan *sdpa_plan_get(struct sdpa_ctx *c, void *handle, const struct sdpa_key *k)
{
	return NULL;
}

size_t sdpa_plan_workspace(const struct sdpa_plan *p)
{
	return 0;
}

int sdpa_plan_run(struct sdpa_ctx *c, void *handle, const struct sdpa_plan *p,
		  const struct sdpa_ptrs *x, void *workspace)
{
	return -1;
}

int sdpa_graph_check(struct sdpa_ctx *c, const struct sdpa_key *k)
{
	return -1;
}

#endif
