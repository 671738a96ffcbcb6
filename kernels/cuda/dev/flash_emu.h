/* flash_emu.h - just enough of CUDA to run cuda_flash.cu's kernels on the CPU
 * (included by it when FLASH_EMULATE names this file; see flash_emulate.cpp).
 *
 * A block is 128 std::threads; __syncthreads is a barrier of the block, and
 * every warp-collective instruction the kernels use (shfl.xor, ldmatrix with
 * and without .trans, mma.m16n8k16 bf16) is a barrier of the warp's 32
 * threads around an exchange through arrays. The fragment layouts below are
 * written from the PTX ISA's tables directly, independently of the address
 * arithmetic in the kernels, so a wrong index there shows up as a wrong
 * result here. What this cannot check: the hardware's own summation order
 * inside an mma (emulated as fp32 sums in k order), timing, and races that a
 * barrier of the emulation would hide (there are none by construction: every
 * collective is a full barrier of its warp).
 */
#ifndef ASYNCPP_FLASH_EMU_H
#define ASYNCPP_FLASH_EMU_H

#include <assert.h>
#include <algorithm>
#include <barrier>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)

struct dim3 {
	unsigned x, y, z;
};
struct float4 {
	float x, y, z, w;
};
struct uint2 {
	uint32_t x, y;
};
static inline uint2 make_uint2(uint32_t x, uint32_t y)
{
	return uint2{x, y};
}
static inline float4 make_float4(float x, float y, float z, float w)
{
	return float4{x, y, z, w};
}
template <class T> static inline T __ldg(const T *p)
{
	return *p;
}
using std::min;

/* bf16, round to nearest even as __floats2bfloat162_rn */
struct __nv_bfloat16 {
	uint16_t u;
};
struct __nv_bfloat162 {
	__nv_bfloat16 x, y;
};
static inline uint16_t emu_f2bf(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}
static inline float emu_bf2f(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b)
{
	return __nv_bfloat162{{emu_f2bf(a)}, {emu_f2bf(b)}};
}
static inline __nv_bfloat16 __float2bfloat16_rn(float a)
{
	return __nv_bfloat16{emu_f2bf(a)};
}
static inline float __bfloat162float(__nv_bfloat16 h)
{
	return emu_bf2f(h.u);
}

/* ---- the emulated block ---- */

#ifdef FLASH_EMU_FIBERS
/* One OS thread; the 128 threads of a block are ucontext fibers that run in
 * turn until they wait at a barrier (flash_emulate.cpp schedules them):
 * much faster than 128 OS threads meeting at every warp instruction. */
void emu_yield(void);
extern unsigned long emu_arrivals; /* barrier arrivals: progress, for the scheduler */
struct emu_barrier {
	int n, count = 0;
	unsigned gen = 0;
	explicit emu_barrier(int n_) : n(n_) {}
	void arrive_and_wait()
	{
		unsigned g = gen;
		emu_arrivals++;
		if (++count == n) {
			count = 0;
			gen++;
			return;
		}
		while (gen == g)
			emu_yield();
	}
};
#else
typedef std::barrier<> emu_barrier;
#endif

struct emu_warp {
	emu_barrier bar{32};
	float f[32];
	uint32_t a[32][4], b[32][2];
	float c[32][4];
	const unsigned char *p[32];
};
/* one thread's cp.async copies (fl_cp16 below) */
struct emu_copy {
	unsigned char *dst;
	unsigned char src[16];
};
struct emu_groups {
	std::vector<std::vector<emu_copy>> done; /* committed, in order */
	std::vector<emu_copy> open;
};
struct emu_block {
	emu_barrier bar{128};
	emu_warp warp[4];
	emu_groups cp[128];
	unsigned char *smem;
	size_t smem_bytes;
};
extern emu_block *emu_cur;
extern dim3 gridDim, blockIdx;
extern thread_local dim3 threadIdx;

static inline void __syncthreads(void)
{
	emu_cur->bar.arrive_and_wait();
}
static inline unsigned char *fl_smem(void)
{
	return emu_cur->smem;
}
static inline emu_warp &emu_w(void)
{
	return emu_cur->warp[threadIdx.x / 32];
}

static inline float fl_xor(float x, int m)
{
	emu_warp &W = emu_w();
	int lane = threadIdx.x & 31;
	W.f[lane] = x;
	W.bar.arrive_and_wait();
	float r = W.f[lane ^ m];
	W.bar.arrive_and_wait();
	return r;
}

/* PTX ISA, mma.m16n8k16 .bf16: A element (row, col) of a 16x16 tile lives in
 * lane (row % 8) * 4 + (col % 8) / 2, register (row >= 8) + 2 * (col >= 8),
 * half col % 2; B element (k, n) in lane n * 4 + (k % 8) / 2, register
 * k >= 8, half k % 2; C element (row, col) in lane (row % 8) * 4 + col / 2,
 * index 2 * (row >= 8) + col % 2. */
static inline float emu_half(uint32_t r, int hi)
{
	return emu_bf2f((uint16_t)(hi ? r >> 16 : r & 0xffff));
}
static inline void fl_mma(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
	emu_warp &W = emu_w();
	int lane = threadIdx.x & 31;
	memcpy(W.a[lane], a, sizeof(W.a[lane]));
	W.b[lane][0] = b0;
	W.b[lane][1] = b1;
	memcpy(W.c[lane], d, sizeof(W.c[lane]));
	W.bar.arrive_and_wait();
	float out[4];
	for (int e = 0; e < 4; e++) {
		int row = lane / 4 + 8 * (e >> 1), col = 2 * (lane % 4) + (e & 1);
		float acc = W.c[(row % 8) * 4 + col / 2][2 * (row >= 8) + col % 2];
		for (int k = 0; k < 16; k++) {
			float x = emu_half(W.a[(row % 8) * 4 + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)],
					   k % 2);
			float y = emu_half(W.b[col * 4 + (k % 8) / 2][k >= 8], k % 2);
			acc += x * y;
		}
		out[e] = acc;
	}
	W.bar.arrive_and_wait();
	memcpy(d, out, sizeof(out));
}

/* ldmatrix .x4: lanes 8i..8i+7 address rows 0..7 of matrix i (16 bytes
 * each, 16-byte aligned, in the block's shared memory), which lands in
 * register i: lane L gets (row L/4, cols 2(L%4), 2(L%4)+1), or with .trans
 * (rows 2(L%4), 2(L%4)+1, col L/4). */
static inline void emu_ldsm(uint32_t r[4], const __nv_bfloat16 *p, bool trans)
{
	emu_warp &W = emu_w();
	int lane = threadIdx.x & 31;
	const unsigned char *q = (const unsigned char *)p;
	assert(((uintptr_t)q & 15) == 0);
	assert(q >= emu_cur->smem && q + 16 <= emu_cur->smem + emu_cur->smem_bytes);
	W.p[lane] = q;
	W.bar.arrive_and_wait();
	for (int i = 0; i < 4; i++) {
		uint16_t h[2];
		for (int j = 0; j < 2; j++) {
			int row = trans ? 2 * (lane % 4) + j : lane / 4;
			int col = trans ? lane / 4 : 2 * (lane % 4) + j;
			memcpy(&h[j], W.p[8 * i + row] + 2 * col, 2);
		}
		r[i] = (uint32_t)h[0] | (uint32_t)h[1] << 16;
	}
	W.bar.arrive_and_wait();
}
static inline void fl_ldsm(uint32_t r[4], const __nv_bfloat16 *p)
{
	emu_ldsm(r, p, false);
}
static inline void fl_ldsm_t(uint32_t r[4], const __nv_bfloat16 *p)
{
	emu_ldsm(r, p, true);
}

/* cp.async lands some time between the copy and the wait that completes its
 * group; the emulation takes either end. Late (emu_cp_early false): at that
 * wait, so a tile read before its wait and barrier shows the previous tile
 * or the NaN fill. Early: at once, so a buffer refilled while another warp
 * still reads it (a missing barrier) shows the new tile there. Either way a
 * wrong result. */
extern bool emu_cp_early;
static inline void fl_cp16(void *s, const void *g, bool valid)
{
	emu_copy c;
	c.dst = (unsigned char *)s;
	assert(((uintptr_t)c.dst & 15) == 0 && ((uintptr_t)g & 15) == 0);
	assert(c.dst >= emu_cur->smem && c.dst + 16 <= emu_cur->smem + emu_cur->smem_bytes);
	if (valid)
		memcpy(c.src, g, 16); /* the global inputs do not change during a kernel */
	else
		memset(c.src, 0, 16);
	if (emu_cp_early)
		memcpy(c.dst, c.src, 16);
	else
		emu_cur->cp[threadIdx.x].open.push_back(c);
}
static inline void fl_cp_commit(void)
{
	emu_groups &G = emu_cur->cp[threadIdx.x];
	G.done.push_back(G.open);
	G.open.clear();
}
template <int N> static inline void fl_cp_wait(void)
{
	emu_groups &G = emu_cur->cp[threadIdx.x];
	while (G.done.size() > (size_t)N) {
		for (const emu_copy &c : G.done.front())
			memcpy(c.dst, c.src, 16);
		G.done.erase(G.done.begin());
	}
}

#endif
