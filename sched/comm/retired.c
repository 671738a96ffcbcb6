/* retired.c - device buffers kept until their owner goes (retired.h). */
#include "retired.h"

#include <stdlib.h>

#include "../../io/util.h"
#include "../../kernels/backend.h"

size_t retired_grow(size_t cap, size_t need)
{
	if (!cap)
		return need;
	return need > st_mult(cap, 2) ? need : st_mult(cap, 2);
}

void retired_keep(struct retired *r, void *p)
{
	if (!p)
		return;
	r->p = xrealloc(r->p, sizeof(void *) * (size_t)(r->n + 1));
	r->p[r->n++] = p;
}

void retired_free(struct retired *r, const struct backend *be)
{
	for (int i = 0; i < r->n; i++)
		be->free(r->p[i]);
	free(r->p);
	r->p = NULL;
	r->n = 0;
}
