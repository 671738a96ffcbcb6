/* retired.h - device buffers that a carrier replaced mid-segment, freed when
 * it is destroyed.
 *
 * Freeing device memory (cudaFree) waits for everything queued on the GPU.
 * Under pipeline.transport = nccl a send of this rank may be queued there,
 * waiting for its peer's receive, which the peer posts only once this rank
 * has gone on: a free in the middle of a segment would hang both (nccl.h).
 * So a buffer that grows keeps its old one here until its owner goes, and
 * grows at least twofold, so that what is kept stays below its own size.
 */
#ifndef ASYNCPP_RETIRED_H
#define ASYNCPP_RETIRED_H

#include <stddef.h>

struct backend;

struct retired {
	void **p; /* [n] backend memory no longer in use */
	int n;
};

/* Bytes to allocate for need bytes where cap are held: need when nothing
 * is held, else at least twice cap. */
size_t retired_grow(size_t cap, size_t need);
/* Keep p (backend memory; NULL: nothing) until retired_free. */
void retired_keep(struct retired *r, void *p);
/* Free what is kept (after the last transfer that could use it). */
void retired_free(struct retired *r, const struct backend *be);

#endif
