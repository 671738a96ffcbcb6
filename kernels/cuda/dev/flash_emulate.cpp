/* flash_emulate.cpp - run cuda_flash.cu's kernels on the CPU, warp by warp
 * (flash_emu.h), against causal attention in double; for a machine with no
 * GPU. Not part of the build: a development check, like llm.c's dev/cuda.
 *
 *   g++ -std=c++20 -O2 -pthread -fsanitize=address -I. \
 *       -DFLASH_EMULATE='"dev/flash_emu.h"' \
 *       -o /tmp/flash_emulate kernels/cuda/dev/flash_emulate.cpp && /tmp/flash_emulate
 *
 * runs small shapes with one OS thread per CUDA thread under
 * AddressSanitizer (minutes: 128 threads meet at every warp instruction).
 * With -DFLASH_EMU_FIBERS -U_FORTIFY_SOURCE (and without -fsanitize) the
 * threads are fibers of one OS thread, about 30x faster, and
 * `flash_emulate --production` runs test_cuda_ops' production shapes;
 * `flash_emulate B T NH NKV HD` runs one shape.
 *
 * For each shape it prints the error of out, lse, dq, dk, dv relative to
 * max|reference| (the measure test_cuda_ops uses), checks that every output
 * element was written (outputs start as NaN), that a second backward gives
 * the same bits, and that qkv and dout 4 bytes off 16-byte alignment (the
 * scalar load path) give the same bits as aligned ones, and that the kernels
 * on bf16 activations (the bf16 table's) give the fp32 kernels' results on
 * the same values, rounded, bit for bit (aligned, where tiles stream in by
 * cp.async, emulated landing as late and as early as allowed; and 2 bytes
 * off, the synchronous loads). Exit
 * status 0 when every error is within the flash tolerances of
 * test_cuda_ops and every bit comparison holds.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <functional>
#include <thread>
#include <vector>

#include "../cuda_flash.cu"

emu_block *emu_cur;
dim3 gridDim, blockIdx;
thread_local dim3 threadIdx;
bool emu_cp_early;
/* fibers: run one warp as far as it goes (until it waits at a block barrier)
 * before the next, so warps drift apart as far as barriers allow */
static bool emu_skew;

#ifdef FLASH_EMU_FIBERS
#include <setjmp.h>
#include <ucontext.h>

/* A fiber starts on its own stack through makecontext/swapcontext once;
 * after that, switches are _setjmp/_longjmp (no signal-mask system call). */
static ucontext_t emu_main_uc, emu_uc[FL_THREADS];
static jmp_buf emu_main_jb, emu_jb[FL_THREADS];
static bool emu_started[FL_THREADS], emu_done[FL_THREADS];
static int emu_fiber;
static const std::function<void()> *emu_fn;
static const size_t emu_stack = 1 << 18;
static unsigned char *emu_stacks;
unsigned long emu_arrivals;

void emu_yield(void)
{
	if (!_setjmp(emu_jb[emu_fiber]))
		_longjmp(emu_main_jb, 1);
}

static void emu_trampoline(void)
{
	(*emu_fn)();
	emu_done[emu_fiber] = true;
	_longjmp(emu_main_jb, 1); /* never returns into the ucontext */
}

/* the block's 128 fibers in turn until all have returned */
static void run_block(const std::function<void()> &fn)
{
	if (!emu_stacks)
		emu_stacks = (unsigned char *)malloc(emu_stack * FL_THREADS);
	emu_fn = &fn;
	for (int i = 0; i < FL_THREADS; i++) {
		getcontext(&emu_uc[i]);
		emu_uc[i].uc_stack.ss_sp = emu_stacks + (size_t)i * emu_stack;
		emu_uc[i].uc_stack.ss_size = emu_stack;
		emu_uc[i].uc_link = NULL;
		makecontext(&emu_uc[i], emu_trampoline, 0);
		emu_started[i] = emu_done[i] = false;
	}
	/* each fiber of [lo, hi) once, in order; how many are still running */
	auto pass = [](int lo, int hi) {
		int alive = 0;
		for (int i = lo; i < hi; i++) {
			if (emu_done[i])
				continue;
			emu_fiber = i;
			threadIdx = dim3{(unsigned)i, 0, 0};
			if (!_setjmp(emu_main_jb)) {
				if (!emu_started[i]) {
					emu_started[i] = true;
					swapcontext(&emu_main_uc, &emu_uc[i]);
				} else {
					_longjmp(emu_jb[i], 1);
				}
			}
			alive += !emu_done[i];
		}
		return alive;
	};
	for (int alive = FL_THREADS; alive > 0;) {
		if (!emu_skew) {
			alive = pass(0, FL_THREADS);
			continue;
		}
		alive = 0;
		for (int w = 0; w < FL_THREADS / 32; w++) {
			unsigned long before;
			int left;
			do { /* until the warp is done or stuck at a block barrier */
				before = emu_arrivals;
				left = pass(32 * w, 32 * w + 32);
			} while (left && emu_arrivals != before);
			alive += left;
		}
	}
}
#else
static void run_block(const std::function<void()> &fn)
{
	std::vector<std::thread> th;
	for (unsigned i = 0; i < FL_THREADS; i++)
		th.emplace_back([&fn, i] {
			threadIdx = dim3{i, 0, 0};
			fn();
		});
	for (auto &t : th)
		t.join();
}
#endif

/* every block of the grid in turn, 128 threads each */
template <class F> static void launch(dim3 grid, size_t smem, F fn)
{
	gridDim = grid;
	for (unsigned z = 0; z < grid.z; z++)
		for (unsigned y = 0; y < grid.y; y++)
			for (unsigned x = 0; x < grid.x; x++) {
				blockIdx = dim3{x, y, z};
				emu_block *blk = new emu_block;
				blk->smem_bytes = smem;
				blk->smem = (unsigned char *)aligned_alloc(128, (smem + 127) / 128 * 128);
				memset(blk->smem, 0xff, smem); /* bf16 NaN: unwritten tiles show */
				emu_cur = blk;
				run_block(std::function<void()>(fn));
				free(blk->smem);
				delete blk;
			}
}

template <bool AS, typename A>
static void emu_forward_as(A *out, float *lse, const A *qkv, dim3 grid, int T, int NH, int NKV,
			   int HD, float scale2)
{
	if (HD == 64)
		launch(grid, fl_smem_forward<64>(AS),
		       [&] { flash_forward_kernel<64, A, AS>(out, lse, qkv, T, NH, NKV, scale2); });
	else
		launch(grid, fl_smem_forward<128>(AS),
		       [&] { flash_forward_kernel<128, A, AS>(out, lse, qkv, T, NH, NKV, scale2); });
}

template <typename A>
static void emu_forward(A *out, float *lse, const A *qkv, int B, int T, int NH, int NKV, int HD)
{
	dim3 grid{(unsigned)(T + 63) / 64, (unsigned)NH, (unsigned)B};
	float scale2 = FL_LOG2E / sqrtf((float)HD);
	/* as fl_forward decides */
	if (fl_async(qkv))
		emu_forward_as<fl_can_async<A>::v>(out, lse, qkv, grid, T, NH, NKV, HD, scale2);
	else
		emu_forward_as<false>(out, lse, qkv, grid, T, NH, NKV, HD, scale2);
}

template <bool AS, typename A>
static void emu_dq_as(A *dqkv, const A *dout, const A *qkv, const float *lse, const float *D,
		      dim3 g, int T, int NH, int NKV, int HD, float scale2, float scale)
{
	if (HD == 64)
		launch(g, fl_smem_dq<64>(AS), [&] {
			flash_dq_kernel<64, A, AS>(dqkv, dout, qkv, lse, D, T, NH, NKV, scale2, scale);
		});
	else
		launch(g, fl_smem_dq<128>(AS), [&] {
			flash_dq_kernel<128, A, AS>(dqkv, dout, qkv, lse, D, T, NH, NKV, scale2, scale);
		});
}

template <bool AS, typename A>
static void emu_dkv_as(A *dqkv, const A *dout, const A *qkv, const float *lse, const float *D,
		       dim3 g, int T, int NH, int NKV, int HD, float scale2, float scale)
{
	if (HD == 64)
		launch(g, fl_smem_dkv<64>(AS), [&] {
			flash_dkv_kernel<64, A, AS>(dqkv, dout, qkv, lse, D, T, NH, NKV, scale2, scale);
		});
	else
		launch(g, fl_smem_dkv<128>(AS), [&] {
			flash_dkv_kernel<128, A, AS>(dqkv, dout, qkv, lse, D, T, NH, NKV, scale2,
						     scale);
		});
}

template <typename A>
static void emu_backward(A *dqkv, const A *dout, const A *qkv, const A *out, const float *lse,
			 int B, int T, int NH, int NKV, int HD)
{
	float scale = 1.0f / sqrtf((float)HD), scale2 = scale * FL_LOG2E;
	std::vector<float> Dd((size_t)B * NH * T);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < NH; h++)
			for (int t = 0; t < T; t++) {
				size_t off = ((size_t)b * T + t) * NH * HD + (size_t)h * HD;
				float s = 0;
				for (int d = 0; d < HD; d++)
					s += act_ld(dout, off + d) * act_ld(out, off + d);
				Dd[((size_t)b * NH + h) * T + t] = s;
			}
	const float *D = Dd.data();
	dim3 gq{(unsigned)(T + 63) / 64, (unsigned)NH, (unsigned)B};
	dim3 gkv{(unsigned)(T + 63) / 64, (unsigned)NKV, (unsigned)B};
	/* as fl_backward decides */
	const bool CA = fl_can_async<A>::v;
	bool aq = fl_async(qkv), akv = fl_async(qkv) && fl_async(dout);
	if (aq)
		emu_dq_as<CA>(dqkv, dout, qkv, lse, D, gq, T, NH, NKV, HD, scale2, scale);
	else
		emu_dq_as<false>(dqkv, dout, qkv, lse, D, gq, T, NH, NKV, HD, scale2, scale);
	if (akv)
		emu_dkv_as<CA>(dqkv, dout, qkv, lse, D, gkv, T, NH, NKV, HD, scale2, scale);
	else
		emu_dkv_as<false>(dqkv, dout, qkv, lse, D, gkv, T, NH, NKV, HD, scale2, scale);
}

/* ---- the reference: test_cuda_ops' (tests/ref_attention.h) ---- */

#include "../../../tests/ref_attention.h"

static void ref_attention(double *out, double *lse, double *dqkv, const float *qkv,
			  const float *dout, int B, int T, int NH, int NKV, int HD)
{
	ref_attention_forward(out, lse, qkv, B, T, NH, NKV, HD);
	ref_attention_backward(dqkv, dout, qkv, B, T, NH, NKV, HD);
}

/* max |got - ref| / max |ref| over rows x cols of a [rows, ld] tensor; NaN
 * (an element never written) gives infinity */
static double rel_err(const float *got, const double *ref, size_t rows, size_t cols, size_t ld)
{
	double num = 0, den = 0;
	for (size_t r = 0; r < rows; r++)
		for (size_t c = 0; c < cols; c++) {
			double x = got[r * ld + c], y = ref[r * ld + c];
			if (x != x)
				return INFINITY;
			num = fmax(num, fabs(x - y));
			den = fmax(den, fabs(y));
		}
	return den > 0 ? num / den : num;
}

/* The bf16 activation path: q, k, v, dout rounded to bf16, run through the
 * kernels both as bf16 and widened to fp32; the bf16 outputs must be the
 * fp32 ones rounded, lse the same bits (the backward gets the bf16 forward's
 * out in both). off: elements past alignment. */
static int bf16_case(const float *qkv, const float *dy, int B, int T, int NH, int NKV, int HD,
		     int off)
{
	int QKV = (NH + 2 * NKV) * HD, C = NH * HD, N = B * T;
	size_t nq = (size_t)N * QKV, no = (size_t)N * C, nl = (size_t)B * NH * T;
	std::vector<__nv_bfloat16> qb(nq + off), db(no + off), ob(no), dqb(nq);
	std::vector<float> qf(nq + off), df(no + off), of(no, NAN), dqf(nq, NAN), of2(no);
	std::vector<float> lf(nl, NAN), lb(nl, NAN);
	for (size_t i = 0; i < nq; i++) {
		qb[off + i] = __float2bfloat16_rn(qkv[i]);
		qf[off + i] = __bfloat162float(qb[off + i]);
	}
	for (size_t i = 0; i < no; i++) {
		db[off + i] = __float2bfloat16_rn(dy[i]);
		df[off + i] = __bfloat162float(db[off + i]);
	}
	memset(ob.data(), 0xff, no * 2), memset(dqb.data(), 0xff, nq * 2); /* NaN */
	emu_forward(of.data(), lf.data(), qf.data() + off, B, T, NH, NKV, HD);
	emu_forward(ob.data(), lb.data(), qb.data() + off, B, T, NH, NKV, HD);
	for (size_t i = 0; i < no; i++)
		of2[i] = __bfloat162float(ob[i]);
	emu_backward(dqf.data(), df.data() + off, qf.data() + off, of2.data(), lb.data(), B, T, NH,
		     NKV, HD);
	emu_backward(dqb.data(), db.data() + off, qb.data() + off, ob.data(), lb.data(), B, T, NH,
		     NKV, HD);
	size_t bad = memcmp(lf.data(), lb.data(), nl * sizeof(float)) != 0;
	for (size_t i = 0; i < no; i++)
		bad += ob[i].u != __float2bfloat16_rn(of[i]).u;
	for (size_t i = 0; i < nq; i++)
		bad += dqb[i].u != __float2bfloat16_rn(dqf[i]).u;
	return bad == 0;
}

static uint64_t rng = 88172645463325252ull;
static double unif(void)
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return (rng >> 11) * (1.0 / 9007199254740992.0);
}
static float normal(void)
{
	return (float)(sqrt(-2 * log(unif() + 1e-300)) * cos(6.283185307179586 * unif()));
}

static int run_case(int B, int T, int NH, int NKV, int HD)
{
	int QKV = (NH + 2 * NKV) * HD, C = NH * HD, N = B * T;
	size_t nq = (size_t)N * QKV, no = (size_t)N * C, nl = (size_t)B * NH * T;
	/* one float of slack in front: the same data at +1 float is misaligned */
	std::vector<float> qkv_buf(nq + 4), dy_buf(no + 4);
	float *qkv = qkv_buf.data(), *dy = dy_buf.data();
	for (size_t i = 0; i < nq; i++)
		qkv[i] = normal();
	for (size_t i = 0; i < no; i++)
		dy[i] = normal();
	std::vector<double> out(no), lse(nl), dq(nq);
	ref_attention(out.data(), lse.data(), dq.data(), qkv, dy, B, T, NH, NKV, HD);

	std::vector<float> ho(no, NAN), hl(nl, NAN), hd(nq, NAN), hd2(nq, NAN), hd3(nq, NAN);
	emu_forward(ho.data(), hl.data(), qkv, B, T, NH, NKV, HD);
	emu_backward(hd.data(), dy, qkv, ho.data(), hl.data(), B, T, NH, NKV, HD);
	emu_backward(hd2.data(), dy, qkv, ho.data(), hl.data(), B, T, NH, NKV, HD);
	/* the scalar path: qkv and dout 4 bytes past 16-byte alignment */
	memmove(qkv + 1, qkv, nq * sizeof(float));
	memmove(dy + 1, dy, no * sizeof(float));
	std::vector<float> ho3(no, NAN), hl3(nl, NAN);
	emu_forward(ho3.data(), hl3.data(), qkv + 1, B, T, NH, NKV, HD);
	emu_backward(hd3.data(), dy + 1, qkv + 1, ho.data(), hl.data(), B, T, NH, NKV, HD);

	double e[5] = {
		rel_err(ho.data(), out.data(), N, C, C),
		rel_err(hl.data(), lse.data(), nl, 1, 1),
		rel_err(hd.data(), dq.data(), N, C, QKV),
		rel_err(hd.data() + C, dq.data() + C, N, (size_t)NKV * HD, QKV),
		rel_err(hd.data() + C + NKV * HD, dq.data() + C + NKV * HD, N, (size_t)NKV * HD, QKV),
	};
	int det = !memcmp(hd.data(), hd2.data(), nq * sizeof(float));
	int align = !memcmp(ho.data(), ho3.data(), no * sizeof(float)) &&
		    !memcmp(hl.data(), hl3.data(), nl * sizeof(float)) &&
		    !memcmp(hd.data(), hd3.data(), nq * sizeof(float));
	memmove(qkv, qkv + 1, nq * sizeof(float));
	memmove(dy, dy + 1, no * sizeof(float));
	/* aligned bf16 streams its tiles with cp.async: landing late and early */
	int bf = bf16_case(qkv, dy, B, T, NH, NKV, HD, 0);
	emu_cp_early = emu_skew = true; /* with warps apart: a missing barrier shows */
	bf = bf && bf16_case(qkv, dy, B, T, NH, NKV, HD, 0);
	emu_cp_early = emu_skew = false;
	bf = bf && bf16_case(qkv, dy, B, T, NH, NKV, HD, 1);
	int ok = e[0] <= 1e-2 && e[1] <= 1e-2 && e[2] <= 2e-2 && e[3] <= 2e-2 && e[4] <= 2e-2 &&
		 det && align && bf;
	printf("B=%d T=%d NH=%d NKV=%d HD=%d  out %.2e lse %.2e dq %.2e dk %.2e dv %.2e  "
	       "repeat %s  misaligned %s  bf16 %s  %s\n",
	       B, T, NH, NKV, HD, e[0], e[1], e[2], e[3], e[4], det ? "same" : "DIFFERENT",
	       align ? "same" : "DIFFERENT", bf ? "rounded fp32" : "DIFFERENT", ok ? "ok" : "FAIL");
	fflush(stdout);
	return ok;
}

int main(int argc, char **argv)
{
	static const int shapes[][5] = {
		{1, 64, 1, 1, 64},  {2, 70, 4, 2, 64},   {1, 129, 2, 1, 128}, {1, 257, 3, 3, 64},
		{1, 200, 6, 3, 128}, {1, 130, 6, 2, 64}, {2, 33, 2, 2, 128},  {1, 1, 2, 1, 64},
	};
	/* test_cuda_ops' production shapes (--production; minutes with fibers) */
	static const int production[][5] = {
		{1, 1024, 12, 12, 64}, {1, 2048, 15, 5, 64}, {2, 1024, 8, 2, 128},
		{2, 1023, 4, 2, 64},   {3, 257, 6, 3, 128},
	};
	int fails = 0;
	const int(*list)[5] = shapes;
	size_t n = sizeof(shapes) / sizeof(shapes[0]);
	if (argc == 6) {
		return !run_case(atoi(argv[1]), atoi(argv[2]), atoi(argv[3]), atoi(argv[4]),
				 atoi(argv[5]));
	}
	if (argc == 2 && !strcmp(argv[1], "--production"))
		list = production, n = sizeof(production) / sizeof(production[0]);
	for (size_t k = 0; k < n; k++)
		fails += !run_case(list[k][0], list[k][1], list[k][2], list[k][3], list[k][4]);
	printf("%zu passed, %d failed\n", n - fails, fails);
	return fails != 0;
}
