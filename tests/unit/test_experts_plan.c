/* test_experts_plan.c - the plan of the experts' all-to-all between
 * processes (sched/comm/experts_plan.h), in plain C: the rows an owner
 * gets from each member are exactly that member's rows routed to the
 * owner's experts (found here by scanning each row's expert, not from the
 * counts' arithmetic), expert by expert, in the member's order; each
 * pass reads on the owner only rows that travelled in it or that the
 * owner kept from the member's earlier passes of them (moe.h's reads and
 * writes), and the member gets back what it reads; the owner's buffers
 * give every field its own rows at the widths of moe.h's buffers. */
#include <stdlib.h>
#include <string.h>

#include "../../kernels/act.h"
#include "../../kernels/backend.h"
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

/* What the owner of a member's rows holds of them after each pass it has
 * made, given the passes of one micro-batch: a pass may read only rows
 * that travelled in it or were kept from an earlier one (moe.h's reads),
 * and the member must get back every output it reads later itself. */
TEST(each_pass_reads_only_what_travelled_or_was_kept)
{
	/* moe.h: what moe_experts reads and writes per pass */
	int reads[3] = {1 << EP_XD, 1 << EP_DY | 1 << EP_ACT | 1 << EP_H | 1 << EP_XD,
			1 << EP_DY | 1 << EP_ACT | 1 << EP_DH | 1 << EP_XD};
	int writes[3] = {1 << EP_H | 1 << EP_ACT | 1 << EP_Y,
			 1 << EP_DACT | 1 << EP_DH | 1 << EP_DXD, 0};
	/* what the member itself reads of the experts' outputs afterwards
	 * (moe.c: the combine reads y, its backward dxd) */
	int member_reads[3] = {1 << EP_Y, 1 << EP_DXD, 0};
	/* fused (forward, backward with gradients) and split (forward, backward
	 * without, weight part) */
	int seqs[2][3] = {{MOE_PASS_FORWARD, MOE_PASS_BACKWARD, -1},
			  {MOE_PASS_FORWARD, MOE_PASS_BACKWARD, MOE_PASS_WEIGHT}};
	for (int split = 0; split < 2; split++) {
		int held = 0, released = 0;
		for (int i = 0; i < 3 && seqs[split][i] >= 0; i++) {
			int pass = seqs[split][i];
			struct ep_plan pl = ep_plan_of(pass);
			CHECK(!released);
			int in = 0, out = 0;
			for (int j = 0; j < pl.n_in; j++)
				in |= 1 << pl.in[j];
			for (int j = 0; j < pl.n_out; j++)
				out |= 1 << pl.out[j];
			/* every read travelled now or is held (kept) */
			CHECK((reads[pass] & ~(in | held)) == 0);
			/* what the member reads afterwards comes back */
			CHECK((member_reads[pass] & ~out) == 0);
			CHECK((out & ~writes[pass]) == 0);
			/* and nothing more travels: each row once each way */
			CHECK(in == (reads[pass] & ~held));
			CHECK(out == member_reads[pass]);
			/* the owner holds in its kept buffers what it got or made */
			for (int f = 0; f < EP_NFIELD; f++)
				if (((in | writes[pass]) >> f & 1) && ep_is_kept(f))
					held |= 1 << f;
			released = ep_releases(pass, !(split && pass == MOE_PASS_BACKWARD));
		}
		CHECK(released);
	}
	/* the later passes' reads are all kept buffers */
	for (int f = 0; f < EP_NFIELD; f++)
		if ((reads[1] | reads[2]) >> f & 1)
			CHECK(ep_is_kept(f));
}

TEST(block_layout_gives_every_buffer_its_own_rows)
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
		/* the fields of each buffer tile it without overlap */
		for (int kept = 0; kept < 2; kept++) {
			size_t total = kept ? ep_kept_bytes(&d, rows) : ep_scratch_bytes(&d, rows);
			static unsigned char used[16384];
			memset(used, 0, sizeof(used));
			size_t sum = 0;
			CHECK(total <= sizeof(used));
			for (int f = 0; f < EP_NFIELD; f++) {
				if (ep_is_kept(f) != kept)
					continue;
				size_t o = ep_offset(&d, rows, f), n = rows * ep_field_width(&d, f);
				CHECK(o + n <= total);
				for (size_t i = o; i < o + n; i++)
					CHECK(!used[i]++);
				sum += n;
			}
			CHECK(sum == total);
		}
		struct ep_plan b = ep_plan_of(MOE_PASS_BACKWARD);
		CHECK(ep_block_bytes(&b, &d, rows, &in, &out) == in + out);
		CHECK(in == rows * A * C && out == rows * A * C);
		CHECK(ep_block_bytes(&b, &d, 0, &in, &out) == 0 && in == 0 && out == 0);
	}
}

/* The owner's kept blocks: a forward takes one per member and key, the
 * later passes find that one (not another member's, not another key's),
 * a released one is reused by the next forward, and a backward of rows
 * never forwarded finds nothing. */
TEST(kept_blocks_follow_their_member_and_key)
{
	const struct backend *be = &backend_cpu;
	struct moe_dims d = {.N = 8, .C = 8, .E = 4, .K = 2, .De = 4};
	struct ep_store st = {0};
	int32_t c0[5] = {0, 1, 3, 3, 6}, c1[5] = {0, 2, 2, 5, 9};
	/* owner of experts [2, 4): member 0 has rows 3..6, member 1 rows 2..9 */
	struct ep_kept *a = ep_store_get(&st, be, &d, MOE_PASS_FORWARD, 0, 100, c0, 2, 2);
	struct ep_kept *b = ep_store_get(&st, be, &d, MOE_PASS_FORWARD, 1, 100, c1, 2, 2);
	struct ep_kept *c = ep_store_get(&st, be, &d, MOE_PASS_FORWARD, 0, 200, c1, 2, 2);
	CHECK(a && b && c && a != b && a != c && b != c);
	CHECK(a->rows == 3 && a->cnt[0] == 0 && a->cnt[1] == 0 && a->cnt[2] == 3);
	CHECK(b->rows == 7 && b->cnt[1] == 3 && b->cnt[2] == 7);
	CHECK(ep_store_get(&st, be, &d, MOE_PASS_BACKWARD, 0, 100, c0, 2, 2) == a);
	CHECK(ep_store_get(&st, be, &d, MOE_PASS_WEIGHT, 1, 100, c1, 2, 2) == b);
	CHECK(ep_store_get(&st, be, &d, MOE_PASS_BACKWARD, 1, 200, c1, 2, 2) == NULL);
	/* released: not found any more, and the next forward takes its memory */
	a->used = 0;
	CHECK(ep_store_get(&st, be, &d, MOE_PASS_BACKWARD, 0, 100, c0, 2, 2) == NULL);
	CHECK(ep_store_get(&st, be, &d, MOE_PASS_FORWARD, 1, 300, c0, 2, 2) == a);
	CHECK(a->k == 1 && a->key == 300 && a->rows == 3);
	/* forwarding the same rows again takes the same entry */
	CHECK(ep_store_get(&st, be, &d, MOE_PASS_FORWARD, 1, 100, c1, 2, 2) == b);
	CHECK(st.n == 3);
	ep_store_free(&st, be);
}

/* What an owner holds between processes at most (ep_owner_mem), against a
 * hand computation: C = 8, De = 4, E = 4, top-2, 8 tokens, f32. Rows of
 * one member at one owner: 8 min(2, G); a kept block's row is xd, h, act,
 * dy, dh = C + 2De + De + C + 2De = 36 floats, a scratch row y, dact, dxd
 * = 20; one expert's gradient fcw + fcprojw = 3 De C = 96 floats. */
TEST(owner_memory_is_the_hand_computed_bound)
{
	struct ep_piece_mem pc = {.d = {.N = 8, .C = 8, .E = 4, .K = 2, .De = 4}, .layers = 3,
				  .slots = 2, .arenas = 2};
	struct ep_mem m;
	/* P = 2: G = 2, 16 rows; one other member, 3 layers x 2 slots */
	ep_owner_mem(2, 0, &pc, 1, &m);
	CHECK(m.kept == 6 * 16 * 36 * 4);
	CHECK(m.scratch == 16 * 20 * 4);
	CHECK(m.acc == 2 * 3 * (2 * 2) * 96 * 4); /* arenas x layers x [P][G] */
	CHECK(m.staging == 0);
	/* staged: the member's 16 rows out and back (xd, y: 2C), one block's
	 * copy, and deliver's two copies of the widest accumulator (fcw) */
	ep_owner_mem(2, 1, &pc, 1, &m);
	CHECK(m.staging == 16 * 16 * 4 + 16 * 16 * 4 + 2 * 4 * 2 * 4 * 8 * 4);
	CHECK(ep_mem_total(&m) == m.kept + m.scratch + m.acc + m.staging);
	/* P = 4: G = 1 < K, so 8 rows at an owner, 3 other members; two
	 * pieces: the kept blocks and accumulators add up, the scratch and
	 * copies are the larger piece's */
	struct ep_piece_mem two[2] = {pc, pc};
	two[0].layers = two[0].slots = two[0].arenas = 1;
	ep_owner_mem(4, 1, two, 2, &m);
	CHECK(m.kept == 3 * (1 + 6) * 8 * 36 * 4);
	CHECK(m.scratch == 3 * 8 * 20 * 4);
	CHECK(m.acc == (1 + 6) * 4 * 96 * 4);
	CHECK(m.staging == 16 * 16 * 4 + 3 * 8 * 16 * 4 + 2 * 4 * 2 * 4 * 8 * 4);
	/* a piece without a MoE layer adds nothing, not even scratch */
	two[0].layers = 0;
	ep_owner_mem(4, 1, two, 2, &m);
	struct ep_mem one;
	ep_owner_mem(4, 1, &pc, 1, &one);
	CHECK(m.kept == one.kept && m.scratch == one.scratch && m.acc == one.acc &&
	      m.staging == one.staging);
	two[1].layers = 0;
	ep_owner_mem(4, 1, two, 2, &m);
	CHECK(ep_mem_total(&m) == 0);
	/* no expert parallelism: nothing */
	ep_owner_mem(1, 1, &pc, 1, &m);
	CHECK(ep_mem_total(&m) == 0);
}

/* The bound is what the owner's store takes when every row of every
 * member goes to it (the worst routing): its kept blocks of layers x
 * slots micro-batches in flight per other member. */
TEST(owner_memory_bound_is_reached_by_the_worst_routing)
{
	const struct backend *be = &backend_cpu;
	struct ep_piece_mem pc = {.d = {.N = 8, .C = 8, .E = 4, .K = 2, .De = 4}, .layers = 3,
				  .slots = 2, .arenas = 1};
	int32_t all[5] = {0, 0, 0, 8, 16}; /* each token's 2 rows on experts 2 and 3 */
	struct ep_store st = {0};
	/* owner 1 (experts [2, 4)) of a group of 2: member 0's rows of each
	 * layer and slot in flight at once */
	for (int key = 0; key < pc.layers * pc.slots; key++)
		CHECK(ep_store_get(&st, be, &pc.d, MOE_PASS_FORWARD, 0, (uint64_t)key, all, 2, 2));
	size_t held = 0;
	for (int i = 0; i < st.n; i++)
		held += st.e[i]->cap;
	struct ep_mem m;
	ep_owner_mem(2, 0, &pc, 1, &m);
	CHECK_MSG(held == m.kept, "held %zu, bound %zu", held, m.kept);
	ep_store_free(&st, be);
}

/* The backend's allocations and frees, counted */
static int spy_allocs, spy_frees;
static void *spy_alloc(size_t bytes)
{
	spy_allocs++;
	return backend_cpu.alloc(bytes);
}
static void spy_free(void *p)
{
	spy_frees += p != NULL;
	backend_cpu.free(p);
}

/* A kept block that must grow takes new memory without freeing the old
 * one (a free mid-segment waits for the whole GPU, where a NCCL send may
 * wait for its peer: sched/comm/retired.h), grows at least twofold, and
 * the store frees every allocation once when it goes. */
TEST(outgrown_blocks_are_kept_until_the_store_goes)
{
	struct backend spy = backend_cpu;
	spy.alloc = spy_alloc;
	spy.free = spy_free;
	struct moe_dims d = {.N = 8, .C = 8, .E = 4, .K = 2, .De = 4};
	struct ep_store st = {0};
	/* member 0's rows of experts [2, 4): 3, 7, 8, then 9 */
	int32_t c3[5] = {0, 1, 3, 3, 6}, c7[5] = {0, 2, 2, 5, 9}, c8[5] = {0, 0, 0, 4, 8},
		c9[5] = {0, 0, 0, 4, 9};
	int32_t *cs[4] = {c3, c7, c8, c9};
	int allocs[4] = {1, 2, 3, 3}; /* 8 rows outgrow 7; 9 fit in twice 7 */
	spy_allocs = spy_frees = 0;
	struct ep_kept *first = NULL;
	for (int i = 0; i < 4; i++) {
		struct ep_kept *e = ep_store_get(&st, &spy, &d, MOE_PASS_FORWARD, 0, 100 + i, cs[i],
						 2, 2);
		CHECK(e && (!first || e == first) && e->cap >= ep_kept_bytes(&d, e->rows));
		CHECK_MSG(spy_allocs == allocs[i] && spy_frees == 0,
			  "forward %d: %d allocations, %d frees", i, spy_allocs, spy_frees);
		first = e;
		if (e)
			e->used = 0; /* released: the next forward takes it */
	}
	ep_store_free(&st, &spy);
	CHECK(spy_frees == spy_allocs);
}
