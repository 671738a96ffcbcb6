/* experts_plan.h - the experts' all-to-all between processes (experts.h),
 * planned in plain C: which buffers a pass moves each way, how wide their
 * rows are, which of a member's rows go to which owner, and where a
 * member's block lies in its owner's buffer. The carriers (experts_p2p.c
 * over MPI or TCP, experts_nccl.c over NCCL) make their calls from it, in
 * the same order, so they move the same rows to the same places.
 *
 * Member q of a group of P owns experts [q G, (q+1) G), G = E/P. Its rows
 * R (moe.h: dispatched by expert, expert e's rows [count[e], count[e+1]))
 * hold owner k's experts' rows as the one range [count[k G],
 * count[(k+1) G]); owner k holds them, as member q's block, from q's
 * forward to its backward (and the split backward's weight part).
 */
#ifndef ASYNCPP_EXPERTS_PLAN_H
#define ASYNCPP_EXPERTS_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "../../kernels/backend.h"
#include "../../model/moe.h"
#include "experts.h"
#include "retired.h"

/* The moe_rows buffers (moe.h), by index. */
enum { EP_XD, EP_H, EP_ACT, EP_Y, EP_DY, EP_DACT, EP_DH, EP_DXD, EP_NFIELD };

/* What a pass (enum moe_pass) moves: in[] to the owner, out[] back. The
 * owner keeps what else the pass needs from the member's forward (xd, h,
 * act) and backward (dy, dh: for the split backward's weight part), so
 * (moe.h's reads and writes)
 *   forward:  xd in; y back (h and act stay with the owner)
 *   backward: dy in; dxd back (xd, h, act kept; dh kept for the weight part)
 *   weight:   nothing travels (dy, act, dh, xd kept)
 * and each row travels once each way, as little as the products allow. */
struct ep_plan {
	int in[1], n_in;
	int out[1], n_out;
};
struct ep_plan ep_plan_of(int pass);

/* The header a member sends every other member of its call before a pass
 * (int32s): its E+1 counts, the key of its rows (ep_kept), the pass and
 * its work (experts.h), which the receiver compares with its own. */
size_t ep_head_ints(int E);
void ep_head_pack(int32_t *h, int E, const int32_t *count, uint64_t key, int pass,
		  const struct ep_work *w);
uint64_t ep_head_key(const int32_t *h, int E);
/* Whether header h's pass and work are (pass, w); when not, what each is,
 * for the message: "the backward of micro-batch 3 of step 5 on weight
 * version 4" (and the piece when they differ in it) */
int ep_head_agrees(const int32_t *h, int E, int pass, const struct ep_work *w,
		   char *mine, char *theirs, size_t n);
/* The same for two calls in memory (threads) */
int ep_work_agrees(int pass_a, const struct ep_work *a, int pass_b, const struct ep_work *b,
		   char *sa, char *sb, size_t n);

/* Bytes of one row of buffer f (act_dtype's size times its width). */
size_t ep_field_width(const struct moe_dims *d, int f);
/* The address of buffer f's pointer in r. */
void **ep_field(struct moe_rows *r, int f);

/* The range [*lo, *lo + *rows) of a member's rows (its counts, E+1) that
 * owner k's experts take (G experts each). */
void ep_own_range(const int32_t *count, int G, int k, size_t *lo, size_t *rows);

/* Member k's block at the owner of experts [e0, e0 + G), from k's counts:
 * cnt[0..G] (its experts' rows from 0) and the rows (returned). */
size_t ep_block_counts(const int32_t *count_k, int e0, int G, int32_t *cnt);

/* Where an owner holds member k's block of `rows` rows: the buffers it
 * keeps from the forward to the backward (and weight part), xd, h, act, dy
 * and dh, in one allocation of ep_kept_bytes; the pass's scratch (y, dact,
 * dxd) in another of ep_scratch_bytes. ep_is_kept(f): which of the two;
 * ep_offset: where f's rows start in it. */
int ep_is_kept(int f);
size_t ep_offset(const struct moe_dims *d, size_t rows, int f);
size_t ep_kept_bytes(const struct moe_dims *d, size_t rows);
size_t ep_scratch_bytes(const struct moe_dims *d, size_t rows);

/* Bytes of a block's travelling rows: its inputs (*in), its outputs (*out);
 * returns their sum (a host copy holds the outputs after the inputs). */
size_t ep_block_bytes(const struct ep_plan *pl, const struct moe_dims *d, size_t rows,
		      size_t *in, size_t *out);

/* The most memory an owner's side of the exchange between processes
 * (experts_p2p.c, experts_nccl.c) holds of its own on one process, from
 * the plan: for each piece the process runs, pc[i] gives a layer's dims
 * at the configured micro-batch (d.N rows of tokens), its MoE layers, the
 * most micro-batches it has in flight (from a forward to the pass that
 * ends it) and its gradient arenas.
 * A member's rows at one owner are at most N min(K, G) (a token picks K
 * distinct experts; the owner has G = E/P), and an owner keeps them
 * (ep_kept_bytes) for each other member, layer and slot in flight; it
 * runs them in a scratch block per member (ep_scratch_bytes, the largest
 * reused); it accumulates the weight gradients of each other member's
 * rows in a [P][G] accumulator of each fcw and fcprojw, per layer and
 * arena; staged (a device backend over p2p) adds the host copies of the
 * travelling rows and of the accumulators' delivery. Threads hold none of
 * these (experts_local.c computes in the members' buffers). */
struct ep_piece_mem {
	struct moe_dims d;
	int layers, slots, arenas;
};
struct ep_mem {
	size_t kept, scratch, acc; /* backend memory */
	size_t staging;            /* host memory */
};
void ep_owner_mem(int P, int staged, const struct ep_piece_mem *pc, int n, struct ep_mem *m);
static inline size_t ep_mem_total(const struct ep_mem *m)
{
	return m->kept + m->scratch + m->acc + m->staging;
}

/* Whether the owner lets go of a member's kept block after a pass of its
 * (the fused backward, or the split one's weight part: the member's rows
 * then need nothing more); with_grads: the pass makes weight gradients. */
int ep_releases(int pass, int with_grads);

/* What an owner keeps of the members' blocks (ep_is_kept's buffers): an
 * entry per member k and key (the member's xd address: its activation
 * slot's, the same in the forward, the backward and the weight part of one
 * micro-batch, and no other rows' while they are in flight). */
struct ep_kept {
	int k, used;
	uint64_t key;
	int32_t *cnt;      /* [G + 1] counts of the owner's experts, from 0 */
	size_t rows, cap;  /* rows; bytes of mem */
	char *mem;         /* backend memory, ep_kept_bytes(rows) */
};
struct ep_store {
	struct ep_kept **e; /* [n] in use, or free for the next forward */
	int n;
	struct retired old; /* memory an entry outgrew, freed with the store */
};
/* Member k's entry of key for a pass over the owner's experts [e0, e0+G):
 * a forward takes one (the key's own when the rows are forwarded again,
 * else a free one, else a new one) and sets its counts from the member's
 * (ck, E+1) and its memory; the other passes find it. NULL when a later
 * pass's rows were never forwarded, or the memory cannot be had. Free an
 * entry with used = 0 (ep_releases) once its last pass has run. */
struct ep_kept *ep_store_get(struct ep_store *st, const struct backend *be,
			     const struct moe_dims *d, int pass, int k, uint64_t key,
			     const int32_t *ck, int e0, int G);
void ep_store_free(struct ep_store *st, const struct backend *be);

#endif
