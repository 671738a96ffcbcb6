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
 * count[(k+1) G]). An owner lays out member k's block as the pass's
 * inputs, then its outputs, then its own scratch, each rows wide, so the
 * inputs (received) and the outputs (sent back) are each one range.
 */
#ifndef ASYNCPP_EXPERTS_PLAN_H
#define ASYNCPP_EXPERTS_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "../../model/moe.h"

/* The moe_rows buffers (moe.h), by index. */
enum { EP_XD, EP_H, EP_ACT, EP_Y, EP_DY, EP_DACT, EP_DH, EP_DXD, EP_NFIELD };

/* What a pass (enum moe_pass) moves: in[] to the owner, out[] back, tmp[]
 * made and used by the owner only. */
struct ep_plan {
	int in[4], n_in;
	int out[3], n_out;
	int tmp[2], n_tmp;
};
struct ep_plan ep_plan_of(int pass);

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

/* Bytes of a block of `rows` rows: its inputs (*in), its outputs (*out,
 * right after them) and all of it with the scratch (returned). */
size_t ep_block_bytes(const struct ep_plan *pl, const struct moe_dims *d, size_t rows,
		      size_t *in, size_t *out);

#endif
