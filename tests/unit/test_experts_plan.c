/* test_experts_plan.c - the plan of the experts' all-to-all between
 * processes (sched/comm/experts_plan.h), in plain C: the rows an owner
 * gets from each member are exactly that member's rows routed to the
 * owner's experts (found here by scanning each row's expert, not from the
 * counts' arithmetic), expert by expert, in the member's order; and each
 * pass moves what moe.h says moe_experts reads and writes, at the widths
 * of its buffers. */
#include <stdlib.h>
#include <string.h>

#include "../../kernels/act.h"
#include "../../sched/comm/experts_plan.h"
#include "../test.h"

enum { MAXR = 64, MAXE = 16 };

/* A member's rows: expert[i] of row i, ascending (dispatched order), and
 * its counts (E+1). */
struct member {
	int n, expert[MAXR];
	int32_t count[MAXE + 1];
};

static void make_member(struct member *m, int E, unsigned *seed)
{
	int per[MAXE] = {0};
	m->n = 0;
	for (int e = 0; e < E; e++) {
		*seed = *seed * 1103515245u + 12345u;
		per[e] = (int)((*seed >> 16) % 5); /* 0..4 rows: some experts get none */
	}
	m->count[0] = 0;
	for (int e = 0; e < E; e++) {
		for (int i = 0; i < per[e]; i++)
			m->expert[m->n++] = e;
		m->count[e + 1] = m->count[e] + per[e];
	}
}

TEST(every_owner_gets_exactly_its_experts_rows)
{
	unsigned seed = 7;
	int shapes[][2] = {{4, 2}, {8, 4}, {8, 2}, {6, 3}, {16, 4}, {4, 4}, {2, 1}};
	for (size_t t = 0; t < sizeof(shapes) / sizeof(shapes[0]); t++) {
		int E = shapes[t][0], P = shapes[t][1], G = E / P;
		struct member mem[4];
		for (int k = 0; k < P; k++)
			make_member(&mem[k], E, &seed);
		for (int k = 0; k < P; k++) {
			size_t total = 0, next = 0;
			for (int j = 0; j < P; j++) {
				size_t lo, rows;
				int32_t cnt[MAXE + 1];
				ep_own_range(mem[k].count, G, j, &lo, &rows);
				/* the ranges go to owners 0, 1, ... back to back */
				CHECK(lo == next);
				next = lo + rows;
				total += rows;
				/* owner j's view of member k's block is the same rows */
				CHECK(ep_block_counts(mem[k].count, j * G, G, cnt) == rows);
				CHECK(cnt[0] == 0);
				/* row i of the block is member k's row lo + i, of owner j's
				 * expert j*G + e where cnt[e] <= i < cnt[e+1] */
				for (int e = 0; e < G; e++) {
					CHECK(cnt[e] <= cnt[e + 1]);
					for (int i = cnt[e]; i < cnt[e + 1]; i++)
						CHECK(mem[k].expert[lo + (size_t)i] == j * G + e);
				}
				/* and every row of member k routed to j's experts is in it */
				size_t mine = 0;
				for (int i = 0; i < mem[k].n; i++)
					mine += mem[k].expert[i] / G == j;
				CHECK(mine == rows);
			}
			CHECK(total == (size_t)mem[k].n);
		}
	}
}

TEST(each_pass_moves_what_moe_experts_reads_and_writes)
{
	/* moe.h: forward xd -> h, act, y; backward dy, act, h, xd -> dact, dh,
	 * dxd (dact the owner's scratch); weight dy, act, dh, xd -> gradients */
	struct ep_plan f = ep_plan_of(MOE_PASS_FORWARD), b = ep_plan_of(MOE_PASS_BACKWARD),
		       w = ep_plan_of(MOE_PASS_WEIGHT);
	CHECK(f.n_in == 1 && f.in[0] == EP_XD && f.n_out == 3 && f.n_tmp == 0);
	int fo = 0;
	for (int i = 0; i < 3; i++)
		fo |= 1 << f.out[i];
	CHECK(fo == (1 << EP_Y | 1 << EP_H | 1 << EP_ACT));
	int bi = 0, bo = 0, wi = 0;
	for (int i = 0; i < b.n_in; i++)
		bi |= 1 << b.in[i];
	for (int i = 0; i < b.n_out; i++)
		bo |= 1 << b.out[i];
	for (int i = 0; i < w.n_in; i++)
		wi |= 1 << w.in[i];
	CHECK(b.n_in == 4 && bi == (1 << EP_DY | 1 << EP_ACT | 1 << EP_H | 1 << EP_XD));
	CHECK(b.n_out == 2 && bo == (1 << EP_DXD | 1 << EP_DH));
	CHECK(b.n_tmp == 1 && b.tmp[0] == EP_DACT);
	CHECK(w.n_in == 4 && wi == (1 << EP_DY | 1 << EP_ACT | 1 << EP_DH | 1 << EP_XD));
	CHECK(w.n_out == 0 && w.n_tmp == 0);
}

TEST(block_bytes_are_the_rows_of_each_buffer)
{
	for (int dt = ACT_F32; dt <= ACT_BF16; dt++) {
		struct moe_dims d = {.N = 8, .C = 24, .E = 4, .K = 2, .De = 40, .act_dtype = dt};
		size_t A = dt == ACT_BF16 ? 2 : 4, C = 24, De = 40, in, out, rows = 7;
		struct moe_rows r = {0};
		/* each field's width is its buffer's (moe.h), and its pointer */
		size_t want[EP_NFIELD] = {C, 2 * De, De, C, C, De, 2 * De, C};
		void **ptr[EP_NFIELD] = {&r.xd, &r.h, &r.act, &r.y, &r.dy, &r.dact, &r.dh, &r.dxd};
		for (int f = 0; f < EP_NFIELD; f++) {
			CHECK(ep_field_width(&d, f) == want[f] * A);
			CHECK(ep_field(&r, f) == ptr[f]);
		}
		struct ep_plan b = ep_plan_of(MOE_PASS_BACKWARD);
		size_t all = ep_block_bytes(&b, &d, rows, &in, &out);
		CHECK(in == rows * A * (C + De + 2 * De + C));
		CHECK(out == rows * A * (C + 2 * De));
		CHECK(all == in + out + rows * A * De);
		CHECK(ep_block_bytes(&b, &d, 0, &in, &out) == 0 && in == 0 && out == 0);
	}
}
