/* plan_cache.h - the policy of cuda_matmul.cu's cuBLASLt plan caches, in
 * plain C so the CPU tests it (tests/unit/test_plan_cache.c): a table of
 * keys evicted least recently used first, and the bucket a varying
 * dimension is rounded up to before the algorithm is chosen.
 *
 * Nothing here decides an answer: a slot only says where the caller keeps
 * the entry built for a key. The caller builds that entry from the key
 * alone, so what a shape gets never depends on which calls came before
 * (a pipeline stage and one device get the same bits). */
#ifndef ASYNCPP_PLAN_CACHE_H
#define ASYNCPP_PLAN_CACHE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cap slots; keys (cap keys of key_size bytes, compared with memcmp) and
 * used (cap counters) are the caller's arrays, zeroed. */
struct plan_lru {
	unsigned char *keys;
	uint64_t *used; /* the clock when the slot was last looked up */
	size_t key_size;
	int cap, n;     /* slots, slots filled (0..n-1) */
	uint64_t clock;
};

/* The slot of key: *hit = 1 where it is stored (the entry there is the
 * caller's answer for it, unchanged); else *hit = 0 and the slot the
 * caller must (re)build for key: a free one, or the least recently looked
 * up (its old entry is the caller's to release). Either way key is stored
 * there and becomes the most recently used. */
int plan_lru_get(struct plan_lru *c, const void *key, int *hit);

/* The bucket of a dimension k >= 1: the next power of two (k itself when
 * it is one). Monotone, >= k, under twice k, 17 buckets over 1..65536.
 * k < 1 is its own bucket. */
int plan_bucket(int k);

#ifdef __cplusplus
}
#endif

#endif
