/* plan_cache.c - least-recently-used slots and the bucket of a varying
 * dimension for the cuBLASLt plan caches (plan_cache.h). */
#include <string.h>

#include "plan_cache.h"

int plan_lru_get(struct plan_lru *c, const void *key, int *hit)
{
	int slot = -1;
	for (int i = 0; i < c->n && slot < 0; i++)
		if (!memcmp(c->keys + (size_t)i * c->key_size, key, c->key_size))
			slot = i;
	*hit = slot >= 0;
	if (slot < 0 && c->n < c->cap) {
		slot = c->n++;
	} else if (slot < 0) { /* full: the least recently used (the lowest slot on a tie) */
		slot = 0;
		for (int i = 1; i < c->n; i++)
			if (c->used[i] < c->used[slot])
				slot = i;
	}
	if (!*hit)
		memcpy(c->keys + (size_t)slot * c->key_size, key, c->key_size);
	c->used[slot] = ++c->clock;
	return slot;
}

int plan_bucket(int k)
{
	if (k < 1)
		return k;
	int b = 1;
	while (b < k && b <= (1 << 29))
		b <<= 1;
	return b < k ? k : b; /* k above 2^30: its own bucket */
}
