/* test_bf16.c - bf16 activation storage (kernels/act.h, backend_cpu_bf16).
 *
 *  - f32_to_bf16 against an independent definition (the nearer of the two
 *    bf16 neighbours, computed in double; ties to the even one), over every
 *    low half of chosen high halves (ties, denormals, overflow, NaN) and a
 *    sweep of all floats.
 *  - Each activation op of backend_cpu_bf16:
 *      exact: its bf16 outputs are the f32 op's outputs on the widened bf16
 *        inputs, rounded (bit for bit), and its float outputs (statistics,
 *        losses, parameter gradients) are that op's, bit for bit;
 *      close: against the f32 op on the unrounded inputs, every output
 *        element within TOL_BF16 * (|ref| + rms(ref)): bf16 keeps 8
 *        significant bits (a relative 2^-9 per rounding); inputs and output
 *        rounded give errors of a few 2^-9 of the output's scale, and 1/64
 *        (= 8 * 2^-9) holds them with room; the backward passes whose
 *        outputs are differences of rounded terms (norms, attention) get
 *        TOL_BF16_DIFF = 1/16;
 *      the same bits on 1 and 3 threads.
 *  - Whole models (gpt2, llama, MoE llama) in bf16 storage: one step's loss
 *    within 0.01 of f32 storage, and each parameter gradient within a
 *    relative L2 distance of 0.05 of the f32 gradient (bf16 rounds every
 *    activation of the forward and the backward; the gradient is a sum over
 *    B*T rows of products of such activations).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/util.h"
#include "../../kernels/cpu/cpu.h"
#include "../../model/model.h"
#include "../test.h"

#define TOL_BF16 (1.0 / 64)
#define TOL_BF16_DIFF (1.0 / 16)

/* ---- rounding ---- */

static float from_bits(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static uint32_t to_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

/* The bf16 nearest to a non-NaN f: of lo (f truncated to 16 bits, toward
 * zero) and hi (the next bf16 away from zero; past the largest finite one
 * that is infinity, which counts as 2^128 for the distance), the nearer,
 * in exact double arithmetic; on a tie, the one with an even last bit. */
static uint16_t ref_bf16(float f)
{
	uint32_t u = to_bits(f), lo = u & 0xffff0000u, hi = lo + 0x10000u;
	double x = fabs((double)f), vlo = fabs((double)from_bits(lo)), vhi;

	if (isinf(f))
		return (uint16_t)(u >> 16);
	vhi = (hi & 0x7fffffffu) == 0x7f800000u ? ldexp(1.0, 128) : fabs((double)from_bits(hi));
	if (x - vlo < vhi - x)
		return (uint16_t)(lo >> 16);
	if (x - vlo > vhi - x)
		return (uint16_t)(hi >> 16);
	return (uint16_t)(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
}

/* f32_to_bf16(f) agrees with the definition; a NaN stays a quiet NaN of
 * the same sign. Returns 0 and fails the test on the first mismatch. */
static int check_round(uint32_t u)
{
	float f = from_bits(u);
	uint16_t got = f32_to_bf16(f);

	if (isnan(f)) {
		int ok = (got & 0x7f80) == 0x7f80 && (got & 0x7f) && (got & 0x40) &&
			 (got & 0x8000) == ((u >> 16) & 0x8000);
		if (!ok)
			test_fail(__FILE__, __LINE__, "NaN 0x%08x -> 0x%04x", u, got);
		return ok;
	}
	if (got != ref_bf16(f)) {
		test_fail(__FILE__, __LINE__, "0x%08x (%.9g) -> 0x%04x, want 0x%04x", u, f, got,
			  ref_bf16(f));
		return 0;
	}
	return 1;
}

TEST(bf16_rounding_is_nearest_even)
{
	/* ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 */
	CHECK(f32_to_bf16(1.0f + 1.0f / 256) == 0x3f80);
	CHECK(f32_to_bf16(1.0f + 3.0f / 256) == 0x3f82);
	CHECK(f32_to_bf16(-(1.0f + 3.0f / 256)) == 0xbf82);
	/* just above a tie rounds up, just below rounds down */
	CHECK(f32_to_bf16(from_bits(0x3f808001u)) == 0x3f81);
	CHECK(f32_to_bf16(from_bits(0x3f817fffu)) == 0x3f81);
	/* zeros, infinities, overflow to infinity, the largest finite */
	CHECK(f32_to_bf16(0.0f) == 0x0000 && f32_to_bf16(-0.0f) == 0x8000);
	CHECK(f32_to_bf16(INFINITY) == 0x7f80 && f32_to_bf16(-INFINITY) == 0xff80);
	CHECK(f32_to_bf16(from_bits(0x7f7fffffu)) == 0x7f80);
	CHECK(f32_to_bf16(from_bits(0x7f7f7fffu)) == 0x7f7f);
	CHECK(f32_to_bf16(from_bits(0x7f7f8000u)) == 0x7f80); /* tie, odd: up */
	/* denormals: the smallest rounds to zero, ties to even */
	CHECK(f32_to_bf16(from_bits(0x00000001u)) == 0x0000);
	CHECK(f32_to_bf16(from_bits(0x00008000u)) == 0x0000);
	CHECK(f32_to_bf16(from_bits(0x00018000u)) == 0x0002);
	CHECK(f32_to_bf16(from_bits(0x00010000u)) == 0x0001);
	CHECK(bf16_to_f32(0x0001) == from_bits(0x00010000u));
	/* NaNs, even one whose payload lies only in the dropped bits */
	CHECK(isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7f800001u)))));
	CHECK(isnan(bf16_to_f32(f32_to_bf16(from_bits(0xff800001u)))));
	CHECK(f32_to_bf16(from_bits(0xffc00000u)) == 0xffc0);
	CHECK(round_bf16(3.0f) == 3.0f);
}

TEST(bf16_rounding_matches_an_independent_definition)
{
	static const uint16_t high[] = {
		0x0000, 0x0001, 0x007f, 0x0080, 0x0081, 0x3f7f, 0x3f80, 0x3f81, 0x4049,
		0x7f7e, 0x7f7f, 0x7f80, 0x7fc0, 0x8000, 0x8001, 0x80ff, 0xbf80, 0xc2f7,
		0xff7f, 0xff80, 0xffff,
	};
	for (size_t h = 0; h < ARRAY_SIZE(high); h++)
		for (uint32_t l = 0; l < 0x10000u; l++)
			if (!check_round((uint32_t)high[h] << 16 | l))
				return;
	/* all floats, strided: 4099 is odd and coprime with 2^32 */
	for (uint64_t u = 0; u < (1ull << 32); u += 4099)
		if (!check_round((uint32_t)u))
			return;
	/* bf16 values round to themselves; widening is exact */
	for (uint32_t h = 0; h < 0x10000u; h++) {
		float f = bf16_to_f32((uint16_t)h);
		if (!isnan(f))
			CHECK(f32_to_bf16(f) == h);
	}
}

TEST(act_helpers_store_rounded_and_offset_by_the_element_size)
{
	uint16_t b[4] = {0};
	float f[4] = {0};
	act_store(b, 2, ACT_BF16, 1.0f + 3.0f / 256);
	CHECK(b[2] == 0x3f82 && b[1] == 0 && b[3] == 0);
	CHECK(act_load(b, 2, ACT_BF16) == 1.0f + 1.0f / 64);
	act_store(f, 1, ACT_F32, 0.1f);
	CHECK(f[1] == 0.1f && act_load(f, 1, ACT_F32) == 0.1f);
	CHECK(act_at(b, 3, 2) == (void *)&b[3] && act_at(f, 3, 4) == (void *)&f[3]);
	CHECK(act_dtype_size(ACT_BF16) == 2 && act_dtype_size(ACT_F32) == 4);
	CHECK(act_size(&backend_cpu_bf16) == 2 && act_size(&backend_cpu) == 4);
	CHECK(backend_with_act_dtype(&backend_cpu, ACT_BF16) == &backend_cpu_bf16);
	CHECK(backend_with_act_dtype(&backend_cpu_bf16, ACT_F32) == &backend_cpu);
	/* the array conversions are the scalar ones */
	float x[100];
	uint16_t y[100];
	float z[100];
	uint64_t s = 5;
	for (int i = 0; i < 100; i++)
		x[i] = (float)(rng_normal(&s) * 3.0);
	backend_cpu_bf16.act_from_f32(y, x, 100);
	backend_cpu_bf16.act_to_f32(z, y, 100);
	for (int i = 0; i < 100; i++)
		CHECK(y[i] == f32_to_bf16(x[i]) && z[i] == round_bf16(x[i]));
}

/* ---- ops: bf16 vs f32 ---- */

enum { A_IN, A_OUT, A_INOUT, F_IN, F_OUT, F_ACC, I_TOK, I_TGT };

struct dims {
	int B, T, C, NH, NKV, HD, QKV, OC, F, V, Vp;
	int N;
};

#define MAX_ARGS 8

struct opcase {
	const char *name;
	int nargs;
	int kind[MAX_ARGS];
	size_t (*count)(const struct dims *d, int i); /* elements of argument i */
	/* fills dependent float inputs of p (float arrays) from the others */
	void (*prep)(float **p, const struct dims *d);
	void (*call)(const struct backend *be, void **p, const struct dims *d);
	double tol;
};

static size_t NC(const struct dims *d) { return (size_t)d->N * d->C; }

/* embed_forward(out, tokens, wte, wpe) */
static size_t c_embf(const struct dims *d, int i)
{
	size_t n[] = {NC(d), (size_t)d->N, (size_t)d->Vp * d->C, (size_t)d->T * d->C};
	return n[i];
}
static void k_embf(const struct backend *be, void **p, const struct dims *d)
{
	be->embed_forward(p[0], p[1], p[2], p[3], d->B, d->T, d->C);
}
/* embed_backward(dwte, dwpe, dout, tokens) */
static size_t c_embb(const struct dims *d, int i)
{
	size_t n[] = {(size_t)d->Vp * d->C, (size_t)d->T * d->C, NC(d), (size_t)d->N};
	return n[i];
}
static void k_embb(const struct backend *be, void **p, const struct dims *d)
{
	be->embed_backward(p[0], p[1], p[2], p[3], d->B, d->T, d->C);
}
/* layernorm_forward(out, mean, rstd, inp, w, b) */
static size_t c_lnf(const struct dims *d, int i)
{
	size_t n[] = {NC(d), (size_t)d->N, (size_t)d->N, NC(d), (size_t)d->C, (size_t)d->C};
	return n[i];
}
static void k_lnf(const struct backend *be, void **p, const struct dims *d)
{
	be->layernorm_forward(p[0], p[1], p[2], p[3], p[4], p[5], d->N, d->C, 1e-5f);
}
/* layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd) */
static size_t c_lnb(const struct dims *d, int i)
{
	size_t n[] = {NC(d), (size_t)d->C, (size_t)d->C, NC(d), NC(d), (size_t)d->C,
		      (size_t)d->N, (size_t)d->N};
	return n[i];
}
static void p_lnb(float **p, const struct dims *d)
{
	float *tmp = xmalloc(NC(d) * sizeof(float));
	cpu_layernorm_forward(tmp, p[6], p[7], p[4], p[5], NULL, d->N, d->C, 1e-5f);
	free(tmp);
}
static void k_lnb(const struct backend *be, void **p, const struct dims *d)
{
	be->layernorm_backward(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], d->N, d->C);
}
/* rmsnorm_forward(out, rstd, inp, w) */
static size_t c_rmsf(const struct dims *d, int i)
{
	size_t n[] = {NC(d), (size_t)d->N, NC(d), (size_t)d->C};
	return n[i];
}
static void k_rmsf(const struct backend *be, void **p, const struct dims *d)
{
	be->rmsnorm_forward(p[0], p[1], p[2], p[3], d->N, d->C, 1e-5f);
}
/* rmsnorm_backward(dinp, dw, dout, inp, w, rstd) */
static size_t c_rmsb(const struct dims *d, int i)
{
	size_t n[] = {NC(d), (size_t)d->C, NC(d), NC(d), (size_t)d->C, (size_t)d->N};
	return n[i];
}
static void p_rmsb(float **p, const struct dims *d)
{
	float *tmp = xmalloc(NC(d) * sizeof(float));
	cpu_rmsnorm_forward(tmp, p[5], p[3], p[4], d->N, d->C, 1e-5f);
	free(tmp);
}
static void k_rmsb(const struct backend *be, void **p, const struct dims *d)
{
	be->rmsnorm_backward(p[0], p[1], p[2], p[3], p[4], p[5], d->N, d->C);
}
/* matmul_forward(out, inp, w, bias) */
static size_t c_mmf(const struct dims *d, int i)
{
	size_t n[] = {(size_t)d->N * d->OC, NC(d), (size_t)d->OC * d->C, (size_t)d->OC};
	return n[i];
}
static void k_mmf(const struct backend *be, void **p, const struct dims *d)
{
	be->matmul_forward(p[0], p[1], p[2], p[3], d->N, d->C, d->OC);
}
/* matmul_backward(dinp, dw, dbias, dout, inp, w) */
static size_t c_mmb(const struct dims *d, int i)
{
	size_t n[] = {NC(d), (size_t)d->OC * d->C, (size_t)d->OC, (size_t)d->N * d->OC, NC(d),
		      (size_t)d->OC * d->C};
	return n[i];
}
static void k_mmb(const struct backend *be, void **p, const struct dims *d)
{
	be->matmul_backward(p[0], p[1], p[2], p[3], p[4], p[5], d->N, d->C, d->OC);
}
/* rope_forward / rope_backward(qkv) */
static size_t c_rope(const struct dims *d, int i)
{
	return (size_t)d->N * d->QKV;
}
static void k_ropef(const struct backend *be, void **p, const struct dims *d)
{
	be->rope_forward(p[0], d->B, d->T, d->NH, d->NKV, d->HD, 10000.0f);
}
static void k_ropeb(const struct backend *be, void **p, const struct dims *d)
{
	be->rope_backward(p[0], d->B, d->T, d->NH, d->NKV, d->HD, 10000.0f);
}
/* attention_forward(out, lse, qkv) */
static size_t c_attf(const struct dims *d, int i)
{
	size_t n[] = {NC(d), (size_t)d->B * d->NH * d->T, (size_t)d->N * d->QKV};
	return n[i];
}
static void k_attf(const struct backend *be, void **p, const struct dims *d)
{
	be->attention_forward(p[0], p[1], p[2], d->B, d->T, d->NH, d->NKV, d->HD);
}
/* attention_backward(dqkv, dout, qkv, out, lse) */
static size_t c_attb(const struct dims *d, int i)
{
	size_t n[] = {(size_t)d->N * d->QKV, NC(d), (size_t)d->N * d->QKV, NC(d),
		      (size_t)d->B * d->NH * d->T};
	return n[i];
}
static void p_attb(float **p, const struct dims *d)
{
	cpu_attention_forward(p[3], p[4], p[2], d->B, d->T, d->NH, d->NKV, d->HD);
}
static void k_attb(const struct backend *be, void **p, const struct dims *d)
{
	be->attention_backward(p[0], p[1], p[2], p[3], p[4], d->B, d->T, d->NH, d->NKV, d->HD);
}
/* gelu_forward(out, inp); gelu_backward(dinp, inp, dout) */
static size_t c_nf(const struct dims *d, int i)
{
	return (size_t)d->N * d->F;
}
static void k_geluf(const struct backend *be, void **p, const struct dims *d)
{
	be->gelu_forward(p[0], p[1], (size_t)d->N * d->F);
}
static void k_gelub(const struct backend *be, void **p, const struct dims *d)
{
	be->gelu_backward(p[0], p[1], p[2], (size_t)d->N * d->F);
}
/* swiglu_forward(out, inp[N,2F]); swiglu_backward(dinp[N,2F], dout, inp[N,2F]) */
static size_t c_swf(const struct dims *d, int i)
{
	return (size_t)d->N * d->F * (i == 1 ? 2 : 1);
}
static void k_swf(const struct backend *be, void **p, const struct dims *d)
{
	be->swiglu_forward(p[0], p[1], d->N, d->F);
}
static size_t c_swb(const struct dims *d, int i)
{
	return (size_t)d->N * d->F * (i == 1 ? 1 : 2);
}
static void k_swb(const struct backend *be, void **p, const struct dims *d)
{
	be->swiglu_backward(p[0], p[1], p[2], d->N, d->F);
}
/* add_act(out, a, b), and in place (out = a) */
static size_t c_add(const struct dims *d, int i)
{
	return NC(d);
}
static void k_add(const struct backend *be, void **p, const struct dims *d)
{
	be->add_act(p[0], p[1], p[2], NC(d));
}
static void k_add_inplace(const struct backend *be, void **p, const struct dims *d)
{
	be->add_act(p[0], p[0], p[1], NC(d));
}
/* softmax_xent(losses, dlogits, logits, targets), and in place */
static size_t c_xent(const struct dims *d, int i)
{
	size_t n[] = {(size_t)d->N, (size_t)d->N * d->Vp, (size_t)d->N * d->Vp, (size_t)d->N};
	return n[i];
}
static void k_xent(const struct backend *be, void **p, const struct dims *d)
{
	be->softmax_xent(p[0], p[1], p[2], p[3], d->N, d->V, d->Vp, 1.0f / d->N);
}
static size_t c_xent_inplace(const struct dims *d, int i)
{
	size_t n[] = {(size_t)d->N, (size_t)d->N * d->Vp, (size_t)d->N};
	return n[i];
}
static void k_xent_inplace(const struct backend *be, void **p, const struct dims *d)
{
	be->softmax_xent(p[0], p[1], p[1], p[2], d->N, d->V, d->Vp, 1.0f / d->N);
}

static const struct opcase cases[] = {
	{"embed_forward", 4, {A_OUT, I_TOK, F_IN, F_IN}, c_embf, NULL, k_embf, TOL_BF16},
	{"embed_backward", 4, {F_ACC, F_ACC, A_IN, I_TOK}, c_embb, NULL, k_embb, TOL_BF16},
	{"layernorm_forward", 6, {A_OUT, F_OUT, F_OUT, A_IN, F_IN, F_IN}, c_lnf, NULL, k_lnf,
	 TOL_BF16},
	{"layernorm_backward", 8, {A_OUT, F_ACC, F_ACC, A_IN, A_IN, F_IN, F_IN, F_IN}, c_lnb, p_lnb,
	 k_lnb, TOL_BF16_DIFF},
	{"rmsnorm_forward", 4, {A_OUT, F_OUT, A_IN, F_IN}, c_rmsf, NULL, k_rmsf, TOL_BF16},
	{"rmsnorm_backward", 6, {A_OUT, F_ACC, A_IN, A_IN, F_IN, F_IN}, c_rmsb, p_rmsb, k_rmsb,
	 TOL_BF16_DIFF},
	{"matmul_forward", 4, {A_OUT, A_IN, F_IN, F_IN}, c_mmf, NULL, k_mmf, TOL_BF16},
	{"matmul_backward", 6, {A_OUT, F_ACC, F_ACC, A_IN, A_IN, F_IN}, c_mmb, NULL, k_mmb,
	 TOL_BF16},
	{"rope_forward", 1, {A_INOUT}, c_rope, NULL, k_ropef, TOL_BF16},
	{"rope_backward", 1, {A_INOUT}, c_rope, NULL, k_ropeb, TOL_BF16},
	{"attention_forward", 3, {A_OUT, F_OUT, A_IN}, c_attf, NULL, k_attf, TOL_BF16},
	{"attention_backward", 5, {A_OUT, A_IN, A_IN, A_IN, F_IN}, c_attb, p_attb, k_attb,
	 TOL_BF16_DIFF},
	{"gelu_forward", 2, {A_OUT, A_IN}, c_nf, NULL, k_geluf, TOL_BF16},
	{"gelu_backward", 3, {A_OUT, A_IN, A_IN}, c_nf, NULL, k_gelub, TOL_BF16},
	{"swiglu_forward", 2, {A_OUT, A_IN}, c_swf, NULL, k_swf, TOL_BF16},
	{"swiglu_backward", 3, {A_OUT, A_IN, A_IN}, c_swb, NULL, k_swb, TOL_BF16},
	{"add_act", 3, {A_OUT, A_IN, A_IN}, c_add, NULL, k_add, TOL_BF16},
	{"add_act in place", 2, {A_INOUT, A_IN}, c_add, NULL, k_add_inplace, TOL_BF16},
	{"softmax_xent", 4, {F_OUT, A_OUT, A_IN, I_TGT}, c_xent, NULL, k_xent, TOL_BF16},
	{"softmax_xent in place", 3, {F_OUT, A_INOUT, I_TGT}, c_xent_inplace, NULL, k_xent_inplace,
	 TOL_BF16},
};

/* Shapes: big enough that the parallel regions really split (N*C, N*F and
 * N*Vp above CPU_PAR_MIN), grouped-query attention. */
static struct dims dims_of(void)
{
	struct dims d = {.B = 4, .T = 64, .C = 96, .NH = 4, .NKV = 2, .OC = 80, .F = 128,
			 .V = 500, .Vp = 512};
	d.N = d.B * d.T;
	d.HD = d.C / d.NH;
	d.QKV = (d.NH + 2 * d.NKV) * d.HD;
	return d;
}

static int is_act(int k) { return k == A_IN || k == A_OUT || k == A_INOUT; }
static int is_out(int k) { return k == A_OUT || k == A_INOUT || k == F_OUT || k == F_ACC; }

/* The inputs of one case, in float: random values, tokens, targets. */
static float **case_inputs(const struct opcase *oc, const struct dims *d, uint64_t seed)
{
	float **v = xcalloc(MAX_ARGS, sizeof(float *));
	for (int i = 0; i < oc->nargs; i++) {
		size_t n = oc->count(d, i);
		uint64_t s = rng_mix(seed, (uint64_t)i);
		v[i] = xcalloc(n ? n : 1, sizeof(float));
		for (size_t j = 0; j < n; j++) {
			if (oc->kind[i] == I_TOK)
				((int32_t *)v[i])[j] = (int32_t)(rng_next(&s) % (uint64_t)d->Vp);
			else if (oc->kind[i] == I_TGT)
				((int32_t *)v[i])[j] = (int32_t)(rng_next(&s) % (uint64_t)d->V);
			else if (oc->kind[i] == F_ACC)
				v[i][j] = (float)(0.01 * rng_normal(&s));
			else if (oc->kind[i] != A_OUT && oc->kind[i] != F_OUT)
				v[i][j] = (float)rng_normal(&s);
		}
	}
	if (oc->prep)
		oc->prep(v, d);
	return v;
}

static void free_args(void **p, int n)
{
	for (int i = 0; i < n; i++)
		free(p[i]);
	free(p);
}

/* Run the case on be with the float inputs v: activation arguments are
 * stored in be's dtype (rounded for bf16), the rest copied. Returns the
 * arguments afterwards, all as floats (activations widened). */
static float **run_case(const struct opcase *oc, const struct dims *d, const struct backend *be,
			float **v)
{
	void **p = xcalloc(MAX_ARGS, sizeof(void *));
	float **out = xcalloc(MAX_ARGS, sizeof(float *));
	for (int i = 0; i < oc->nargs; i++) {
		size_t n = oc->count(d, i), m = n ? n : 1;
		if (is_act(oc->kind[i])) {
			p[i] = xcalloc(m, act_size(be));
			be->act_from_f32(p[i], v[i], n);
		} else {
			p[i] = xmalloc(m * sizeof(float));
			memcpy(p[i], v[i], m * sizeof(float));
		}
	}
	oc->call(be, p, d);
	for (int i = 0; i < oc->nargs; i++) {
		size_t n = oc->count(d, i), m = n ? n : 1;
		out[i] = xmalloc(m * sizeof(float));
		if (is_act(oc->kind[i]))
			be->act_to_f32(out[i], p[i], n);
		else
			memcpy(out[i], p[i], m * sizeof(float));
	}
	free_args(p, oc->nargs);
	return out;
}

/* The inputs as bf16 would hold them: activation arguments rounded. */
static float **rounded_inputs(const struct opcase *oc, const struct dims *d, float **v)
{
	float **r = xcalloc(MAX_ARGS, sizeof(float *));
	for (int i = 0; i < oc->nargs; i++) {
		size_t n = oc->count(d, i), m = n ? n : 1;
		r[i] = xmalloc(m * sizeof(float));
		memcpy(r[i], v[i], m * sizeof(float));
		if (is_act(oc->kind[i]))
			for (size_t j = 0; j < n; j++)
				r[i][j] = round_bf16(r[i][j]);
	}
	return r;
}

TEST(bf16_ops_are_the_f32_ops_on_rounded_inputs_rounded)
{
	struct dims d = dims_of();
	for (size_t c = 0; c < ARRAY_SIZE(cases); c++) {
		const struct opcase *oc = &cases[c];
		float **v = case_inputs(oc, &d, 100 + c), **r = rounded_inputs(oc, &d, v);
		float **got = run_case(oc, &d, &backend_cpu_bf16, v);
		float **want = run_case(oc, &d, &backend_cpu, r);
		for (int i = 0; i < oc->nargs && !test_failed(); i++) {
			size_t n = oc->count(&d, i);
			if (!is_out(oc->kind[i]))
				continue;
			for (size_t j = 0; j < n; j++) {
				float w = is_act(oc->kind[i]) ? round_bf16(want[i][j]) : want[i][j];
				if (memcmp(&got[i][j], &w, sizeof(float))) {
					test_fail(__FILE__, __LINE__, "%s: argument %d element %zu: "
						  "%.9g, want %.9g", oc->name, i, j, got[i][j], w);
					break;
				}
			}
		}
		free_args((void **)v, oc->nargs);
		free_args((void **)r, oc->nargs);
		free_args((void **)got, oc->nargs);
		free_args((void **)want, oc->nargs);
		if (test_failed())
			return;
	}
}

TEST(bf16_ops_are_close_to_f32)
{
	struct dims d = dims_of();
	for (size_t c = 0; c < ARRAY_SIZE(cases); c++) {
		const struct opcase *oc = &cases[c];
		float **v = case_inputs(oc, &d, 200 + c);
		float **got = run_case(oc, &d, &backend_cpu_bf16, v);
		float **ref = run_case(oc, &d, &backend_cpu, v);
		for (int i = 0; i < oc->nargs && !test_failed(); i++) {
			size_t n = oc->count(&d, i);
			double ss = 0, worst = 0;
			size_t at = 0;
			if (!is_out(oc->kind[i]))
				continue;
			/* an accumulator is compared by what was added */
			for (size_t j = 0; j < n; j++) {
				double x = ref[i][j] - (oc->kind[i] == F_ACC ? v[i][j] : 0);
				ss += x * x;
			}
			double rms = sqrt(ss / (double)(n ? n : 1));
			for (size_t j = 0; j < n; j++) {
				double base = oc->kind[i] == F_ACC ? v[i][j] : 0;
				double x = ref[i][j] - base, y = got[i][j] - base;
				double e = fabs(x - y) / (fabs(x) + rms);
				if (!(e <= worst))
					worst = e, at = j;
			}
			if (!(worst <= oc->tol))
				test_fail(__FILE__, __LINE__, "%s: argument %d element %zu: bf16 %.9g, "
					  "f32 %.9g: error %.3g of (|f32| + rms %.3g) > %.3g", oc->name,
					  i, at, got[i][at], ref[i][at], worst, rms, oc->tol);
			/* and it did round: bf16 is not f32 */
			if (is_act(oc->kind[i]) && !memcmp(got[i], ref[i], n * sizeof(float)))
				test_fail(__FILE__, __LINE__, "%s: argument %d is f32's bit for bit",
					  oc->name, i);
		}
		free_args((void **)v, oc->nargs);
		free_args((void **)got, oc->nargs);
		free_args((void **)ref, oc->nargs);
		if (test_failed())
			return;
	}
}

TEST(bf16_ops_do_not_depend_on_the_thread_count)
{
	struct dims d = dims_of();
	for (size_t c = 0; c < ARRAY_SIZE(cases); c++) {
		const struct opcase *oc = &cases[c];
		float **v = case_inputs(oc, &d, 300 + c);
		backend_cpu_bf16.set_threads(1);
		float **one = run_case(oc, &d, &backend_cpu_bf16, v);
		backend_cpu_bf16.set_threads(3);
		float **three = run_case(oc, &d, &backend_cpu_bf16, v);
		backend_cpu_bf16.set_threads(0);
		for (int i = 0; i < oc->nargs; i++)
			CHECK_MSG(!memcmp(one[i], three[i], oc->count(&d, i) * sizeof(float)),
				  "%s: argument %d differs on 1 and 3 threads", oc->name, i);
		free_args((void **)v, oc->nargs);
		free_args((void **)one, oc->nargs);
		free_args((void **)three, oc->nargs);
		if (test_failed())
			return;
	}
}

/* ---- whole models ---- */

struct mrun {
	struct model m;
	struct stage st;
	float *params, *grads;
	int32_t *tok, *tgt;
};

static int mrun_open(struct mrun *r, const struct model_config *c, const struct backend *be,
		     int B, int T)
{
	uint64_t s = 77;
	memset(r, 0, sizeof(*r));
	if (model_init(&r->m, c) || stage_init(&r->st, &r->m, be, NULL, 0, B, T, 1))
		return -1;
	r->params = xcalloc(r->m.numel, sizeof(float));
	r->grads = xcalloc(r->m.numel, sizeof(float));
	r->tok = xmalloc((size_t)B * T * 4);
	r->tgt = xmalloc((size_t)B * T * 4);
	model_init_weights(&r->m, r->params, 4321);
	for (int i = 0; i < B * T; i++) {
		r->tok[i] = (int32_t)(rng_next(&s) % (uint64_t)c->V);
		r->tgt[i] = (int32_t)(rng_next(&s) % (uint64_t)c->V);
	}
	return 0;
}

static void mrun_close(struct mrun *r)
{
	stage_free(&r->st);
	model_free(&r->m);
	free(r->params);
	free(r->grads);
	free(r->tok);
	free(r->tgt);
}

static float mrun_step(struct mrun *r)
{
	float loss = NAN;
	stage_forward(&r->st, 0, r->params, r->tok, NULL, r->tgt, NULL, &loss, NULL, r->grads, 1.0f);
	stage_backward(&r->st, 0, r->params, r->grads, NULL, NULL);
	stage_finish_grads(&r->st, r->grads);
	return loss;
}

static struct model_config model_of(const char *kind)
{
	struct model_config c;
	memset(&c, 0, sizeof(c));
	c.arch = strcmp(kind, "gpt2") ? ARCH_LLAMA : ARCH_GPT2;
	c.V = 67;
	c.L = 2;
	c.C = 32;
	c.NH = 4;
	c.NKV = c.arch == ARCH_LLAMA ? 2 : 0;
	c.T = 16;
	c.tied = 1;
	/* larger weights than the default 0.02 so that every layer matters */
	c.init_std = 0.1f;
	if (!strcmp(kind, "moe")) {
		c.E = 4;
		c.K = 2;
		c.De = 16;
		c.shared = 1;
		c.aux_coef = 0.1f;
		c.z_coef = 0.01f;
	}
	return c;
}

TEST(bf16_models_match_f32_models_closely)
{
	static const char *const kinds[] = {"gpt2", "llama", "moe"};
	for (size_t k = 0; k < ARRAY_SIZE(kinds); k++) {
		struct model_config c = model_of(kinds[k]);
		struct mrun a, b;
		CHECK_MSG(!mrun_open(&a, &c, &backend_cpu, 2, 16) &&
				  !mrun_open(&b, &c, &backend_cpu_bf16, 2, 16),
			  "%s: %s", kinds[k], last_error());
		CHECK(b.st.act_bytes_per_slot < a.st.act_bytes_per_slot);
		float la = mrun_step(&a), lb = mrun_step(&b);
		CHECK_MSG(fabsf(la - lb) < 0.01f && la != lb, "%s: loss f32 %.7f bf16 %.7f", kinds[k],
			  la, lb);
		for (int i = 0; i < a.m.n_params && !test_failed(); i++) {
			const struct param_info *p = &a.m.params[i];
			double d2 = 0, r2 = 0;
			for (size_t j = 0; j < p->numel; j++) {
				double x = a.grads[p->offset + j], y = b.grads[p->offset + j];
				d2 += (x - y) * (x - y);
				r2 += x * x;
			}
			CHECK_MSG(r2 > 0 && sqrt(d2 / r2) < 0.05,
				  "%s: %s: gradient relative L2 distance %.4f (|g| %.3g)", kinds[k],
				  p->name, sqrt(d2 / (r2 > 0 ? r2 : 1)), sqrt(r2));
		}
		/* the same bits again, and on another thread count */
		float *g1 = xmalloc(b.m.numel * sizeof(float));
		memcpy(g1, b.grads, b.m.numel * sizeof(float));
		memset(b.grads, 0, b.m.numel * sizeof(float));
		backend_cpu_bf16.set_threads(1);
		float lb1 = mrun_step(&b);
		backend_cpu_bf16.set_threads(0);
		CHECK(!memcmp(&lb, &lb1, sizeof(float)));
		CHECK(!memcmp(g1, b.grads, b.m.numel * sizeof(float)));
		free(g1);
		mrun_close(&a);
		mrun_close(&b);
		if (test_failed())
			return;
	}
}

/* model_logits_at gives float logits in both storages: bf16's are the
 * rounded logits of the bf16 forward, close to f32's. */
TEST(bf16_logits_for_sampling_are_float)
{
	struct model_config c = model_of("llama");
	struct mrun a, b;
	CHECK(!mrun_open(&a, &c, &backend_cpu, 2, 16) && !mrun_open(&b, &c, &backend_cpu_bf16, 2, 16));
	int Vp = a.m.cfg.Vp;
	float *la = xmalloc((size_t)2 * Vp * sizeof(float)), *lb = xmalloc((size_t)2 * Vp * sizeof(float));
	model_logits_at(&a.st, a.params, a.tok, 5, la);
	model_logits_at(&b.st, b.params, b.tok, 5, lb);
	double worst = 0;
	for (int i = 0; i < 2 * Vp; i++) {
		CHECK(lb[i] == round_bf16(lb[i]));
		worst = fmax(worst, fabs(la[i] - lb[i]));
	}
	CHECK_MSG(worst < 0.05, "logits differ by %.4f", worst);
	free(la);
	free(lb);
	mrun_close(&a);
	mrun_close(&b);
}

/* A backend without bf16 storage is refused with a message naming the key;
 * f32 on it is the backend itself. CUDA has both (its bf16 twin). */
TEST(bf16_is_refused_where_the_backend_has_none)
{
	struct backend fake = backend_cpu;
	fake.name = "fake";
	CHECK(backend_with_act_dtype(&fake, ACT_F32) == &fake);
	CHECK(backend_with_act_dtype(&fake, ACT_BF16) == NULL);
	CHECK_MSG(strstr(last_error(), "train.act_dtype = bf16") && strstr(last_error(), "fake"),
		  "message: %s", last_error());
	const struct backend *cu = backend_cuda(), *cb = backend_cuda_bf16();
	if (!cu)
		return;
	CHECK(cu->act_dtype == ACT_F32 && cb && cb->act_dtype == ACT_BF16);
	CHECK(backend_with_act_dtype(cu, ACT_BF16) == cb);
	CHECK(backend_with_act_dtype(cb, ACT_BF16) == cb);
	CHECK(backend_with_act_dtype(cb, ACT_F32) == cu);
	CHECK(backend_with_act_dtype(cu, ACT_F32) == cu);
}
