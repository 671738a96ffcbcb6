/* test_cudnn_graph.c - the cuDNN attention graphs (kernels/cuda/cudnn_sdpa*.c)
 * built against a fake libcudnn (fixtures/fake_cudnn.c, built by the
 * Makefile beside this binary) that records every descriptor and attribute:
 * the operation sequence, each tensor's dims, strides, uid, type, alignment
 * and virtuality, the causal mask, the scale, the statistics output, the
 * deterministic backward (dQ straight from its product, non-deterministic
 * engines refused), the plan cache, the variant pack, and every fallback
 * (no library, a missing symbol, a refused finalize, no engine) giving one
 * notice. Runs on the CPU; skipped where the cuDNN headers are not found.
 */
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../io/util.h"
#include "../test.h"

#if defined(__has_include)
#if __has_include(<cudnn_graph.h>)
#define HAVE_CUDNN_HEADERS 1
#endif
#endif

#ifndef HAVE_CUDNN_HEADERS
TEST(cudnn_graph)
{
	SKIP("cudnn_graph.h not found (the CUDA toolkit with cuDNN 9 headers)");
}
#else

#include "../../kernels/cuda/cudnn_sdpa.c"
#include "../../kernels/cuda/cudnn_sdpa_graph.c"
#include "fixtures/fake_cudnn.h"

/* ---- the fake library and its record ---- */

static char fake_path[PATH_MAX + 32], fake_noexec_path[PATH_MAX + 32];
static struct {
	fake_cudnn_config_fn config;
	fake_cudnn_reset_fn reset;
	fake_cudnn_count_fn count;
	fake_cudnn_type_fn type;
	fake_cudnn_finalized_fn finalized;
	fake_cudnn_attr_fn attr;
	fake_cudnn_executions_fn executions;
	fake_cudnn_index_fn index;
} fk;

/* 0, or -1 when the fake library is missing (the test then fails) */
static int fake_open(void)
{
	char exe[PATH_MAX - 32];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0)
		return -1;
	exe[n] = 0;
	char *slash = strrchr(exe, '/');
	*slash = 0; /* BUILD/tests/unit -> BUILD/tests */
	snprintf(fake_path, sizeof(fake_path), "%s/../fake_cudnn.so", exe);
	snprintf(fake_noexec_path, sizeof(fake_noexec_path), "%s/../fake_cudnn_noexec.so", exe);
	static void *lib;
	if (!lib)
		lib = dlopen(fake_path, RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		return -1;
#define SYM(field, name)                                                   \
	{                                                                  \
		void *f_ = dlsym(lib, name);                               \
		if (!f_)                                                   \
			return -1;                                         \
		memcpy(&fk.field, &f_, sizeof(f_));                        \
	}
	SYM(config, "fake_cudnn_config");
	SYM(reset, "fake_cudnn_reset");
	SYM(count, "fake_cudnn_count");
	SYM(type, "fake_cudnn_type");
	SYM(finalized, "fake_cudnn_finalized");
	SYM(attr, "fake_cudnn_attr");
	SYM(executions, "fake_cudnn_executions");
	SYM(index, "fake_cudnn_index");
#undef SYM
	fk.reset();
	fk.config(2, 1, -1); /* two engines, the first non-deterministic */
	return 0;
}

static int notices;
static char notice_msg[1024];
static void count_notice(void *arg, const char *msg)
{
	notices++;
	snprintf(notice_msg, sizeof(notice_msg), "%s", msg);
}

static struct sdpa_ctx *ctx_for(const char *path)
{
	struct sdpa_ctx *c = sdpa_ctx_new(path);
	notices = 0;
	notice_msg[0] = 0;
	sdpa_ctx_set_notice(c, count_notice, NULL);
	return c;
}

static struct sdpa_key key(int B, int T, int NH, int NKV, int HD, int backward)
{
	struct sdpa_key k;
	memset(&k, 0, sizeof(k));
	k.B = B, k.T = T, k.NH = NH, k.NKV = NKV, k.HD = HD;
	k.bf16 = 1, k.causal = 1, k.backward = backward;
	return k;
}

/* ---- reading the graph back ---- */

static int64_t a1(int id, int name) /* the first value of an attribute, or -999 */
{
	const struct fake_attr *a = fk.attr(id, name);
	return a && a->count >= 1 ? a->i64[0] : -999;
}

static int find_type(int type) /* the last descriptor of a type */
{
	for (int i = fk.count() - 1; i >= 0; i--)
		if (fk.type(i) == type)
			return i;
	return -1;
}

/* One operation of the graph, as "matmul", "mul", "gen2", "max", ... */
static const char *op_name(int op)
{
	static char buf[32];
	switch (fk.type(op)) {
	case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: return "matmul";
	case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: return "reshape";
	case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
		int r = (int)a1(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC);
		int64_t rop = a1(r, CUDNN_ATTR_REDUCTION_OPERATOR);
		if (rop == CUDNN_REDUCE_TENSOR_MAX)
			return "rmax";
		return rop == CUDNN_REDUCE_TENSOR_ADD ? "rsum" : "r?";
	}
	case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
		int pw = (int)a1(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
		switch (a1(pw, CUDNN_ATTR_POINTWISE_MODE)) {
		case CUDNN_POINTWISE_MUL: return "mul";
		case CUDNN_POINTWISE_ADD: return "add";
		case CUDNN_POINTWISE_SUB: return "sub";
		case CUDNN_POINTWISE_DIV: return "div";
		case CUDNN_POINTWISE_EXP: return "exp";
		case CUDNN_POINTWISE_LOG: return "log";
		case CUDNN_POINTWISE_CMP_GE: return "ge";
		case CUDNN_POINTWISE_BINARY_SELECT: return "select";
		case CUDNN_POINTWISE_GEN_INDEX:
			snprintf(buf, sizeof(buf), "gen%lld",
				 (long long)a1(pw, CUDNN_ATTR_POINTWISE_AXIS));
			return buf;
		default: return "pw?";
		}
	}
	default: return "?";
	}
}

/* The graph's operations (ids) and their names joined by spaces. */
static int graph_ops(int *ops, int max, char *seq, size_t len)
{
	int g = find_type(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
	const struct fake_attr *a = fk.attr(g, CUDNN_ATTR_OPERATIONGRAPH_OPS);
	if (!a)
		return 0;
	seq[0] = 0;
	int n = (int)a->count < max ? (int)a->count : max;
	for (int i = 0; i < n; i++) {
		ops[i] = (int)a->i64[i];
		size_t used = strlen(seq);
		snprintf(seq + used, len - used, "%s%s", i ? " " : "", op_name(ops[i]));
	}
	return n;
}

/* a tensor's properties, compared with what is wanted */
struct tens {
	int64_t uid, dtype, virt, byval, align;
	int64_t d[4], s[4];
};

static struct tens tensor(int id)
{
	struct tens t;
	memset(&t, 0, sizeof(t));
	t.uid = a1(id, CUDNN_ATTR_TENSOR_UNIQUE_ID);
	t.dtype = a1(id, CUDNN_ATTR_TENSOR_DATA_TYPE);
	t.virt = a1(id, CUDNN_ATTR_TENSOR_IS_VIRTUAL);
	if (fk.attr(id, CUDNN_ATTR_TENSOR_IS_BY_VALUE))
		t.byval = a1(id, CUDNN_ATTR_TENSOR_IS_BY_VALUE);
	t.align = a1(id, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT);
	const struct fake_attr *d = fk.attr(id, CUDNN_ATTR_TENSOR_DIMENSIONS);
	const struct fake_attr *s = fk.attr(id, CUDNN_ATTR_TENSOR_STRIDES);
	for (int i = 0; i < 4; i++) {
		t.d[i] = d && d->count == 4 ? d->i64[i] : -1;
		t.s[i] = s && s->count == 4 ? s->i64[i] : -1;
	}
	return t;
}

static int same4(const int64_t *a, int64_t b0, int64_t b1, int64_t b2, int64_t b3)
{
	return a[0] == b0 && a[1] == b1 && a[2] == b2 && a[3] == b3;
}

/* the tensor descriptor id an operation has in attribute name */
static int opt(int op, int name)
{
	return (int)a1(op, name);
}

#define MM_A(op) tensor(opt(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC))
#define MM_B(op) tensor(opt(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC))
#define MM_C(op) tensor(opt(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC))
#define PW_X(op) opt(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC)
#define PW_B(op) opt(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC)
#define PW_T(op) opt(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC)
#define PW_Y(op) opt(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC)

/* Every descriptor finalized, every tensor 16-byte aligned with 4 dims. */
static int all_final(void)
{
	for (int i = 0; i < fk.count(); i++) {
		int t = fk.type(i);
		if (t == CUDNN_BACKEND_ENGINE_DESCRIPTOR ||
		    t == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR ||
		    t == CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
			continue;
		if (!fk.finalized(i))
			return 0;
		if (t == CUDNN_BACKEND_TENSOR_DESCRIPTOR &&
		    (tensor(i).align != 16 || tensor(i).d[3] < 1))
			return 0;
	}
	return 1;
}

/* The chosen plan: built on the heuristics' second (deterministic) engine. */
static int plan_engine_index(void)
{
	int p = find_type(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
	int cfg = opt(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
	return fk.index(cfg);
}

/* The variant pack of the last execution: the pointer given for uid. */
static void *pack_ptr(int64_t uid)
{
	int plan, pack;
	if (!fk.executions(&plan, &pack))
		return NULL;
	const struct fake_attr *u = fk.attr(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
	const struct fake_attr *p = fk.attr(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
	if (!u || !p || u->count != p->count)
		return NULL;
	for (int i = 0; i < u->count; i++)
		if (u->i64[i] == uid)
			return p->ptr[i];
	return NULL;
}

/* ---- the forward graph ---- */

TEST(cudnn_graph_forward)
{
	CHECK_MSG(fake_open() == 0, "fake libcudnn not found beside the test: %s", fake_path);
	struct sdpa_ctx *c = ctx_for(fake_path);
	int B = 2, T = 5, NH = 4, NKV = 2, HD = 64;
	int64_t ld = (NH + 2 * NKV) * HD;
	void *h = sdpa_ctx_handle(c, 0);
	CHECK(h);
	struct sdpa_key k = key(B, T, NH, NKV, HD, 0);
	const struct sdpa_plan *p = sdpa_plan_get(c, h, &k);
	CHECK_MSG(p, "refused: %s", sdpa_ctx_why(c));
	CHECK(notices == 0);
	CHECK(all_final());

	int ops[64];
	char seq[512];
	int n = graph_ops(ops, 64, seq, sizeof(seq));
	CHECK_MSG(!strcmp(seq, "matmul mul gen2 gen3 ge select rmax sub exp rsum log add div "
			       "matmul"),
		  "forward ops: %s", seq);
	CHECK(n == 14);
	int g = find_type(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
	CHECK(fk.attr(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE)->ptr[0] == h);

	/* S = Q K^T: Q and K^T read in place from qkv, fp32 scores */
	struct tens q = MM_A(ops[0]), kt = MM_B(ops[0]), s = MM_C(ops[0]);
	CHECK(q.uid == SDPA_UID_Q && q.dtype == CUDNN_DATA_BFLOAT16 && !q.virt);
	CHECK(same4(q.d, B, NH, T, HD) && same4(q.s, T * ld, HD, ld, 1));
	CHECK(kt.uid == SDPA_UID_K && kt.dtype == CUDNN_DATA_BFLOAT16 && !kt.virt);
	CHECK(same4(kt.d, B, NKV, HD, T) && same4(kt.s, T * ld, HD, 1, ld));
	CHECK(s.virt && s.dtype == CUDNN_DATA_FLOAT && same4(s.d, B, NH, T, T));
	int mm = opt(ops[0], CUDNN_ATTR_OPERATION_MATMUL_DESC);
	CHECK(a1(mm, CUDNN_ATTR_MATMUL_COMP_TYPE) == CUDNN_DATA_FLOAT);

	/* scale: a by-value fp32 scalar multiplying S */
	CHECK(PW_X(ops[1]) == opt(ops[0], CUDNN_ATTR_OPERATION_MATMUL_CDESC));
	struct tens sc = tensor(PW_B(ops[1]));
	CHECK(sc.uid == SDPA_UID_SCALE && sc.byval && !sc.virt && sc.dtype == CUDNN_DATA_FLOAT);
	CHECK(same4(sc.d, 1, 1, 1, 1));

	/* causal: row index (axis 2) >= column index (axis 3) keeps the score */
	int scaled = PW_Y(ops[1]);
	CHECK(PW_X(ops[2]) == scaled && PW_X(ops[3]) == scaled);
	CHECK(tensor(PW_Y(ops[2])).dtype == CUDNN_DATA_INT32);
	CHECK(PW_X(ops[4]) == PW_Y(ops[2]) && PW_B(ops[4]) == PW_Y(ops[3]));
	CHECK(tensor(PW_Y(ops[4])).dtype == CUDNN_DATA_BOOLEAN);
	CHECK(PW_X(ops[5]) == scaled && PW_T(ops[5]) == PW_Y(ops[4]));
	CHECK(tensor(PW_B(ops[5])).uid == SDPA_UID_NEG_INF && tensor(PW_B(ops[5])).byval);

	/* softmax: max over the last dim, exp(s - max), sum, stats = max + log sum */
	int masked = PW_Y(ops[5]);
	CHECK(opt(ops[6], CUDNN_ATTR_OPERATION_REDUCTION_XDESC) == masked);
	int mx = opt(ops[6], CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
	CHECK(same4(tensor(mx).d, B, NH, T, 1) && tensor(mx).virt);
	CHECK(PW_X(ops[7]) == masked && PW_B(ops[7]) == mx);
	CHECK(PW_X(ops[8]) == PW_Y(ops[7]));
	int z = opt(ops[9], CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
	CHECK(opt(ops[9], CUDNN_ATTR_OPERATION_REDUCTION_XDESC) == PW_Y(ops[8]));
	CHECK(PW_X(ops[10]) == z);
	CHECK(PW_X(ops[11]) == mx && PW_B(ops[11]) == PW_Y(ops[10]));
	struct tens st = tensor(PW_Y(ops[11]));
	CHECK(st.uid == SDPA_UID_STATS && !st.virt && st.dtype == CUDNN_DATA_FLOAT);
	CHECK(same4(st.d, B, NH, T, 1) && same4(st.s, NH * T, T, 1, 1)); /* = lse[B,NH,T] */
	CHECK(PW_X(ops[12]) == PW_Y(ops[8]) && PW_B(ops[12]) == z);
	struct tens pr = tensor(PW_Y(ops[12]));
	CHECK(pr.virt && pr.dtype == CUDNN_DATA_BFLOAT16);

	/* O = P V into out[B*T, NH*HD] */
	struct tens v = MM_B(ops[13]), o = MM_C(ops[13]);
	CHECK(opt(ops[13], CUDNN_ATTR_OPERATION_MATMUL_ADESC) == PW_Y(ops[12]));
	CHECK(v.uid == SDPA_UID_V && same4(v.d, B, NKV, T, HD) && same4(v.s, T * ld, HD, ld, 1));
	CHECK(o.uid == SDPA_UID_O && !o.virt && o.dtype == CUDNN_DATA_BFLOAT16);
	CHECK(same4(o.d, B, NH, T, HD) && same4(o.s, T * NH * HD, HD, NH * HD, 1));

	/* heuristics mode A on this graph; the deterministic engine chosen */
	int heur = find_type(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
	CHECK(a1(heur, CUDNN_ATTR_ENGINEHEUR_MODE) == CUDNN_HEUR_MODE_A);
	CHECK(a1(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH) == g);
	CHECK(plan_engine_index() == 1);
	CHECK(sdpa_plan_workspace(p) == 1024); /* the fake's 1000, rounded to 256 */

	/* the variant pack: q, k, v at their offsets in qkv, the scalars' values */
	static char qkv[4096], out[4096], ws[4096];
	static float lse[64];
	struct sdpa_ptrs x = {.qkv = qkv, .out = out, .lse = lse};
	CHECK(sdpa_plan_run(c, h, p, &x, ws) == 0);
	CHECK(pack_ptr(SDPA_UID_Q) == qkv);
	CHECK(pack_ptr(SDPA_UID_K) == qkv + 2 * NH * HD);
	CHECK(pack_ptr(SDPA_UID_V) == qkv + 2 * (NH + NKV) * HD);
	CHECK(pack_ptr(SDPA_UID_O) == out && pack_ptr(SDPA_UID_STATS) == lse);
	CHECK(*(float *)pack_ptr(SDPA_UID_SCALE) == 0.125f);
	float neg_inf = *(float *)pack_ptr(SDPA_UID_NEG_INF);
	CHECK(isinf(neg_inf) && neg_inf < 0);
	int plan, pack;
	CHECK(fk.executions(&plan, &pack) == 1);
	CHECK(fk.attr(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE)->ptr[0] == ws);
	sdpa_ctx_free(c);
}

/* ---- the backward graph ---- */

static void check_backward(int NH, int NKV)
{
	fk.reset();
	struct sdpa_ctx *c = ctx_for(fake_path);
	int B = 3, T = 7, HD = 128;
	int64_t ld = (NH + 2 * NKV) * HD;
	void *h = sdpa_ctx_handle(c, 0);
	struct sdpa_key k = key(B, T, NH, NKV, HD, 1);
	const struct sdpa_plan *p = sdpa_plan_get(c, h, &k);
	CHECK_MSG(p, "refused: %s", sdpa_ctx_why(c));
	CHECK(all_final());
	int ops[64];
	char seq[512];
	int n = graph_ops(ops, 64, seq, sizeof(seq));
	const char *want = NH == NKV
		? "mul rsum mul matmul mul sub gen2 gen3 ge select exp reshape matmul matmul sub "
		  "mul mul reshape matmul reshape matmul"
		: "mul rsum mul matmul mul sub gen2 gen3 ge select exp reshape matmul rsum matmul "
		  "sub mul mul reshape matmul rsum reshape matmul";
	CHECK_MSG(!strcmp(seq, want), "backward ops (NH %d NKV %d): %s", NH, NKV, seq);
	int g = NH == NKV ? 0 : 1; /* the reductions shift later indices */

	/* Dsum = rowsum(dO * O) into our fp32 workspace tensor */
	struct tens dout = tensor(PW_X(ops[0])), o = tensor(PW_B(ops[0]));
	CHECK(dout.uid == SDPA_UID_DO && same4(dout.d, B, NH, T, HD));
	CHECK(same4(dout.s, T * NH * HD, HD, NH * HD, 1));
	CHECK(o.uid == SDPA_UID_O);
	struct tens rs = tensor(PW_Y(ops[2]));
	CHECK(rs.uid == SDPA_UID_SOFTMAX_SUM && !rs.virt && rs.dtype == CUDNN_DATA_FLOAT);
	CHECK(same4(rs.d, B, NH, T, 1) && same4(rs.s, NH * T, T, 1, 1));
	CHECK(tensor(PW_B(ops[2])).uid == SDPA_UID_ONE);

	/* P = exp(mask(S * scale - stats)) */
	CHECK(MM_A(ops[3]).uid == SDPA_UID_Q && MM_B(ops[3]).uid == SDPA_UID_K);
	CHECK(tensor(PW_B(ops[4])).uid == SDPA_UID_SCALE);
	CHECK(tensor(PW_B(ops[5])).uid == SDPA_UID_STATS);
	CHECK(PW_X(ops[6]) == PW_Y(ops[5]) && PW_X(ops[9]) == PW_Y(ops[5]));
	CHECK(tensor(PW_B(ops[9])).uid == SDPA_UID_NEG_INF);
	int P = PW_Y(ops[10]);
	CHECK(PW_X(ops[10]) == PW_Y(ops[9]));

	/* dV = P^T dO (summed over each group's heads) */
	struct tens pt = tensor(opt(ops[11], CUDNN_ATTR_OPERATION_RESHAPE_YDESC));
	CHECK(opt(ops[11], CUDNN_ATTR_OPERATION_RESHAPE_XDESC) == P);
	CHECK(pt.dtype == CUDNN_DATA_BFLOAT16 && same4(pt.s, NH * T * T, T * T, 1, T));
	CHECK(MM_B(ops[12]).uid == SDPA_UID_DO);
	struct tens dv = NH == NKV ? MM_C(ops[12])
				   : tensor(opt(ops[13], CUDNN_ATTR_OPERATION_REDUCTION_YDESC));
	CHECK(dv.uid == SDPA_UID_DV && !dv.virt && same4(dv.d, B, NKV, T, HD));
	CHECK(same4(dv.s, T * ld, HD, ld, 1));
	if (NH != NKV)
		CHECK(same4(MM_C(ops[12]).d, B, NH, T, HD) && MM_C(ops[12]).virt);

	/* dS = (dO V^T - Dsum) * P * scale */
	int i = 13 + g;
	CHECK(MM_A(ops[i]).uid == SDPA_UID_DO);
	struct tens vt = MM_B(ops[i]);
	CHECK(vt.uid == SDPA_UID_V && same4(vt.d, B, NKV, HD, T) && same4(vt.s, T * ld, HD, 1, ld));
	CHECK(tensor(PW_B(ops[i + 1])).uid == SDPA_UID_SOFTMAX_SUM);
	CHECK(PW_B(ops[i + 2]) == P);
	CHECK(tensor(PW_B(ops[i + 3])).uid == SDPA_UID_SCALE);
	int dS = PW_Y(ops[i + 3]);

	/* dK = dS^T Q */
	CHECK(opt(ops[i + 4], CUDNN_ATTR_OPERATION_RESHAPE_XDESC) == dS);
	CHECK(MM_B(ops[i + 5]).uid == SDPA_UID_Q);
	struct tens dk = NH == NKV ? MM_C(ops[i + 5])
				   : tensor(opt(ops[i + 6], CUDNN_ATTR_OPERATION_REDUCTION_YDESC));
	CHECK(dk.uid == SDPA_UID_DK && same4(dk.d, B, NKV, T, HD));
	CHECK(same4(dk.s, T * ld, HD, ld, 1));

	/* dQ = dS K, written by the product itself: no fp32 accumulator */
	int j = n - 2;
	struct tens kk = tensor(opt(ops[j], CUDNN_ATTR_OPERATION_RESHAPE_YDESC));
	CHECK(tensor(opt(ops[j], CUDNN_ATTR_OPERATION_RESHAPE_XDESC)).uid == SDPA_UID_K);
	CHECK(same4(kk.d, B, NKV, T, HD) && same4(kk.s, T * ld, HD, ld, 1));
	CHECK(opt(ops[j + 1], CUDNN_ATTR_OPERATION_MATMUL_ADESC) == dS);
	struct tens dq = MM_C(ops[j + 1]);
	CHECK(dq.uid == SDPA_UID_DQ && dq.dtype == CUDNN_DATA_BFLOAT16 && !dq.virt);
	CHECK(same4(dq.d, B, NH, T, HD) && same4(dq.s, T * ld, HD, ld, 1));
	CHECK(plan_engine_index() == 1);

	/* workspace: cuDNN's, then the row sums */
	size_t rows = (size_t)B * NH * T * sizeof(float);
	CHECK(sdpa_plan_workspace(p) == 1024 + (rows + 255) / 256 * 256);
	static char qkv[8], dqkv[1 << 16], ws[1 << 16];
	struct sdpa_ptrs x = {.qkv = qkv, .out_in = qkv, .dout = qkv, .dqkv = dqkv, .lse_in = NULL};
	CHECK(sdpa_plan_run(c, h, p, &x, ws) == 0);
	CHECK(pack_ptr(SDPA_UID_DQ) == dqkv);
	CHECK(pack_ptr(SDPA_UID_DK) == dqkv + 2 * NH * HD);
	CHECK(pack_ptr(SDPA_UID_DV) == dqkv + 2 * (NH + NKV) * HD);
	CHECK(pack_ptr(SDPA_UID_SOFTMAX_SUM) == ws + 1024);
	CHECK(*(float *)pack_ptr(SDPA_UID_ONE) == 1.0f);
	CHECK(notices == 0);
	sdpa_ctx_free(c);
}

TEST(cudnn_graph_backward_gqa)
{
	CHECK_MSG(fake_open() == 0, "fake libcudnn not found beside the test: %s", fake_path);
	check_backward(6, 2);
}

TEST(cudnn_graph_backward_mha)
{
	CHECK_MSG(fake_open() == 0, "fake libcudnn not found beside the test: %s", fake_path);
	check_backward(4, 4);
}

/* ---- the plan cache ---- */

TEST(cudnn_graph_plan_cache)
{
	CHECK_MSG(fake_open() == 0, "fake libcudnn not found beside the test: %s", fake_path);
	struct sdpa_ctx *c = ctx_for(fake_path);
	void *h = sdpa_ctx_handle(c, 0);
	struct sdpa_key f = key(2, 64, 4, 4, 64, 0), b = key(2, 64, 4, 4, 64, 1);
	const struct sdpa_plan *p1 = sdpa_plan_get(c, h, &f);
	int made = fk.count();
	CHECK(p1 && sdpa_plan_get(c, h, &f) == p1 && fk.count() == made);
	const struct sdpa_plan *p2 = sdpa_plan_get(c, h, &b);
	CHECK(p2 && p2 != p1 && fk.count() > made);
	struct sdpa_key f2 = f;
	f2.T = 65; /* another shape, another plan */
	const struct sdpa_plan *p3 = sdpa_plan_get(c, h, &f2);
	CHECK(p3 && p3 != p1);
	f2.device = 1; /* another device's handle, another plan */
	CHECK(sdpa_plan_get(c, sdpa_ctx_handle(c, 1), &f2) != p3);
	CHECK(sdpa_plan_get(c, h, &f) == p1 && sdpa_plan_get(c, h, &b) == p2);
	sdpa_ctx_free(c);
}

/* ---- fallbacks: each refusal returns NULL, and only the first says so ---- */

static void refused(struct sdpa_ctx *c, const char *why_part)
{
	void *h = sdpa_ctx_handle(c, 0);
	struct sdpa_key f = key(2, 16, 4, 2, 64, 0), b = key(2, 16, 4, 2, 64, 1);
	CHECK(sdpa_plan_get(c, h, &f) == NULL);
	CHECK(sdpa_plan_get(c, h, &b) == NULL);
	CHECK(sdpa_plan_get(c, h, &f) == NULL);
	CHECK_MSG(notices == 1, "%d notices", notices);
	CHECK_MSG(strstr(notice_msg, why_part), "notice: %s", notice_msg);
	CHECK(strstr(notice_msg, "cuDNN attention not used (") == notice_msg);
	CHECK(strstr(notice_msg, "); running the flash kernels"));
}

TEST(cudnn_graph_fallback_no_library)
{
	struct sdpa_ctx *c = ctx_for("/nonexistent/libcudnn.so.9");
	refused(c, "cannot load /nonexistent/libcudnn.so.9");
	CHECK(sdpa_ctx_handle(c, 0) == NULL);
	sdpa_ctx_free(c);
}

TEST(cudnn_graph_fallback_missing_symbol)
{
	CHECK_MSG(fake_open() == 0, "fake libcudnn not found beside the test: %s", fake_path);
	struct sdpa_ctx *c = ctx_for(fake_noexec_path);
	refused(c, "libcudnn lacks cudnnBackendExecute");
	sdpa_ctx_free(c);
}

TEST(cudnn_graph_fallback_plan_refused)
{
	CHECK_MSG(fake_open() == 0, "fake libcudnn not found beside the test: %s", fake_path);
	fk.config(2, 0, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
	struct sdpa_ctx *c = ctx_for(fake_path);
	refused(c, "forward attention B=2 T=16 NH=4 NKV=2 HD=64: execution plan: ");
	sdpa_ctx_free(c);
	fk.config(2, 0, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
	c = ctx_for(fake_path);
	refused(c, "operation graph: CUDNN_STATUS_NOT_SUPPORTED");
	sdpa_ctx_free(c);
}

TEST(cudnn_graph_fallback_no_engine)
{
	CHECK_MSG(fake_open() == 0, "fake libcudnn not found beside the test: %s", fake_path);
	fk.config(0, 0, -1);
	struct sdpa_ctx *c = ctx_for(fake_path);
	refused(c, "the heuristics offer no engine");
	sdpa_ctx_free(c);
}

TEST(cudnn_graph_fallback_nondeterministic)
{
	CHECK_MSG(fake_open() == 0, "fake libcudnn not found beside the test: %s", fake_path);
	fk.config(3, 0x707, -1); /* three engines in each list, none deterministic */
	struct sdpa_ctx *c = ctx_for(fake_path);
	refused(c, "no deterministic engine among 6");
	CHECK(fk.executions(&(int){0}, &(int){0}) == 0);
	sdpa_ctx_free(c);
}

/* The real libcudnn, where this machine has one (no GPU needed): every
 * tensor, operation and the operation graph of both directions pass
 * cuDNN's own finalize checks at the production and odd shapes. (Engines
 * and plans need a device: gpu-check's cuda_bf16_attention_cudnn.)
 * ASYNCPP_TEST_CUDNN=PATH names the library; skipped where none loads. */
TEST(cudnn_graph_real_library)
{
	const char *env = getenv("ASYNCPP_TEST_CUDNN");
	static const char *paths[] = {"libcudnn.so.9", "/usr/local/cuda/lib64/libcudnn.so.9"};
	const char *path = NULL;
	for (size_t i = 0; !path && i < ARRAY_SIZE(paths); i++) {
		const char *p = env && *env ? env : paths[i];
		void *lib = dlopen(p, RTLD_NOW | RTLD_LOCAL);
		if (lib) {
			dlclose(lib);
			path = p;
		}
	}
	if (!path)
		SKIP("no libcudnn.so.9 on this machine (ASYNCPP_TEST_CUDNN=PATH names one)");
	static const int shapes[][5] = {
		{16, 1024, 12, 12, 64}, {4, 2048, 15, 5, 64}, {2, 1023, 4, 2, 64},
		{2, 1, 4, 2, 64},       {3, 257, 6, 3, 128},
	};
	struct sdpa_ctx *c = ctx_for(path);
	for (size_t i = 0; i < ARRAY_SIZE(shapes); i++)
		for (int bwd = 0; bwd < 2; bwd++) {
			struct sdpa_key k = key(shapes[i][0], shapes[i][1], shapes[i][2],
						shapes[i][3], shapes[i][4], bwd);
			CHECK_MSG(sdpa_graph_check(c, &k) == 0,
				  "%s B=%d T=%d NH=%d NKV=%d HD=%d: %s",
				  bwd ? "backward" : "forward", k.B, k.T, k.NH, k.NKV, k.HD,
				  sdpa_ctx_why(c));
		}
	CHECK(notices == 0);
	sdpa_ctx_free(c);
}

/* No deterministic engine in mode A's list: the fallback list's first
 * deterministic one (the fake numbers those from 8). */
TEST(cudnn_graph_heuristics_fallback)
{
	CHECK_MSG(fake_open() == 0, "fake libcudnn not found beside the test: %s", fake_path);
	fk.config(2, 0x103, -1); /* A: 0, 1 non-deterministic; fallback: 8 too, 9 not */
	struct sdpa_ctx *c = ctx_for(fake_path);
	void *h = sdpa_ctx_handle(c, 0);
	struct sdpa_key k = key(2, 64, 4, 2, 64, 1);
	CHECK_MSG(sdpa_plan_get(c, h, &k), "refused: %s", sdpa_ctx_why(c));
	int heur = find_type(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
	CHECK(a1(heur, CUDNN_ATTR_ENGINEHEUR_MODE) == CUDNN_HEUR_MODE_FALLBACK);
	CHECK(plan_engine_index() == 9);
	CHECK(notices == 0);
	sdpa_ctx_free(c);
}

/* shapes cuDNN is not asked about: the caller's kernels, no notice */
TEST(cudnn_graph_not_asked)
{
	CHECK_MSG(fake_open() == 0, "fake libcudnn not found beside the test: %s", fake_path);
	struct sdpa_ctx *c = ctx_for(fake_path);
	void *h = sdpa_ctx_handle(c, 0);
	struct sdpa_key k = key(2, 16, 4, 2, 96, 0);
	CHECK(sdpa_plan_get(c, h, &k) == NULL); /* HD 96 */
	k = key(2, 16, 4, 2, 64, 0);
	k.bf16 = 0; /* f32 activations */
	CHECK(sdpa_plan_get(c, h, &k) == NULL);
	k = key(2, 16, 6, 4, 64, 0); /* NKV does not divide NH */
	CHECK(sdpa_plan_get(c, h, &k) == NULL);
	CHECK(notices == 0 && fk.count() == 0);
	sdpa_ctx_free(c);
}

#endif
