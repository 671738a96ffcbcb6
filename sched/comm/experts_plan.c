/* experts_plan.c - the experts' all-to-all, planned (experts_plan.h). */
#include "experts_plan.h"

#include "../../kernels/act.h"

struct ep_plan ep_plan_of(int pass)
{
	if (pass == MOE_PASS_FORWARD)
		return (struct ep_plan){{EP_XD}, 1, {EP_Y, EP_H, EP_ACT}, 3, {0}, 0};
	if (pass == MOE_PASS_BACKWARD)
		return (struct ep_plan){{EP_DY, EP_ACT, EP_H, EP_XD}, 4, {EP_DXD, EP_DH}, 2,
					{EP_DACT}, 1};
	return (struct ep_plan){{EP_DY, EP_ACT, EP_DH, EP_XD}, 4, {0}, 0, {0}, 0};
}

size_t ep_field_width(const struct moe_dims *d, int f)
{
	size_t C = (size_t)d->C, De = (size_t)d->De;
	size_t w[EP_NFIELD] = {C, 2 * De, De, C, C, De, 2 * De, C};
	return w[f] * act_dtype_size(d->act_dtype);
}

void **ep_field(struct moe_rows *r, int f)
{
	void **p[EP_NFIELD] = {&r->xd, &r->h,    &r->act, &r->y,
			       &r->dy, &r->dact, &r->dh,  &r->dxd};
	return p[f];
}

void ep_own_range(const int32_t *count, int G, int k, size_t *lo, size_t *rows)
{
	*lo = (size_t)count[k * G];
	*rows = (size_t)count[(k + 1) * G] - *lo;
}

size_t ep_block_counts(const int32_t *count_k, int e0, int G, int32_t *cnt)
{
	for (int e = 0; e <= G; e++)
		cnt[e] = count_k[e0 + e] - count_k[e0];
	return (size_t)cnt[G];
}

size_t ep_block_bytes(const struct ep_plan *pl, const struct moe_dims *d, size_t rows,
		      size_t *in, size_t *out)
{
	size_t i_b = 0, o_b = 0, t_b = 0;
	for (int i = 0; i < pl->n_in; i++)
		i_b += rows * ep_field_width(d, pl->in[i]);
	for (int i = 0; i < pl->n_out; i++)
		o_b += rows * ep_field_width(d, pl->out[i]);
	for (int i = 0; i < pl->n_tmp; i++)
		t_b += rows * ep_field_width(d, pl->tmp[i]);
	*in = i_b;
	*out = o_b;
	return i_b + o_b + t_b;
}
