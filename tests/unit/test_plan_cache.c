/* test_plan_cache.c - the policy of cuda_matmul.cu's cuBLASLt plan caches
 * (kernels/plan_cache.h), on the CPU:
 *  - plan_lru_get hits and misses exactly as an independent LRU (a list
 *    in recency order) on random streams, and keeps a hot set of shapes
 *    under a stream of new ones (the ring it replaces dropped them);
 *  - a hit returns the entry its key's last miss made;
 *  - plan_bucket: monotone, >= k, < 2k, a power of two, 17 buckets over
 *    1..65536.
 */
#include <stdlib.h>
#include <string.h>

#include "../../kernels/plan_cache.h"
#include "../test.h"

struct key {
	int M, N, K, flags;
};

#define CAP 8

struct cache {
	struct plan_lru lru;
	struct key keys[CAP];
	uint64_t used[CAP];
	long answer[CAP]; /* the caller's entry */
};

static void cache_init(struct cache *c)
{
	memset(c, 0, sizeof(*c));
	c->lru.keys = (unsigned char *)c->keys;
	c->lru.used = c->used;
	c->lru.key_size = sizeof(struct key);
	c->lru.cap = CAP;
}

/* The reference: keys in recency order, most recent first. */
struct ref {
	struct key k[CAP];
	int n;
};

static int ref_get(struct ref *r, const struct key *k)
{
	int i = 0;
	while (i < r->n && memcmp(&r->k[i], k, sizeof(*k)))
		i++;
	int hit = i < r->n;
	if (!hit)
		i = r->n < CAP ? r->n++ : CAP - 1; /* drop the least recent */
	memmove(&r->k[1], &r->k[0], (size_t)i * sizeof(*k));
	r->k[0] = *k;
	return hit;
}

static struct key shape(int i)
{
	struct key k = {64 + i % 5, 128, 1 + i, i % 2};
	return k;
}

TEST(lru_matches_an_independent_lru)
{
	struct cache c;
	struct ref r = {.n = 0};
	cache_init(&c);
	srand(7);
	int hits = 0;
	for (int t = 0; t < 20000; t++) {
		struct key k = shape(rand() % 12); /* 12 shapes, 8 slots */
		int hit;
		int s = plan_lru_get(&c.lru, &k, &hit);
		CHECK(s >= 0 && s < CAP);
		CHECK_MSG(hit == ref_get(&r, &k), "step %d: hit %d", t, hit);
		CHECK(!memcmp(&c.keys[s], &k, sizeof(k)));
		hits += hit;
	}
	CHECK(hits > 1000 && hits < 19000); /* both paths ran */
}

TEST(lru_keeps_the_hot_shapes_under_a_stream_of_new_ones)
{
	struct cache c;
	cache_init(&c);
	int misses = 0;
	for (int t = 0; t < 1000; t++) {
		for (int h = 0; h < CAP / 2; h++) { /* the dense model's shapes */
			struct key k = {768, 768 * (h + 1), 768, 0};
			int hit;
			plan_lru_get(&c.lru, &k, &hit);
			misses += !hit;
		}
		for (int e = 0; e < CAP / 2 - 1; e++) { /* the experts' new row counts */
			struct key k = {768, 3072, 1000 + t * 16 + e, 1};
			int hit;
			plan_lru_get(&c.lru, &k, &hit);
			CHECK(!hit);
		}
	}
	CHECK_MSG(misses == CAP / 2, "the hot shapes missed %d times", misses);
}

/* A stream of lookups whose every miss stores a new entry (the miss's
 * number): every hit must return the entry its key's last miss made (not
 * an older one of the same key, not another key's). */
TEST(a_hit_returns_the_entry_of_its_keys_last_miss)
{
	enum { N = 20000, SHAPES = 40 }; /* more shapes than slots: evictions */
	long last[SHAPES], misses = 0;
	struct cache c;
	cache_init(&c);
	srand(11);
	for (int i = 0; i < SHAPES; i++)
		last[i] = -1;
	for (int t = 0; t < N; t++) {
		int i = rand() % 4 ? rand() % 4 : rand() % SHAPES; /* 4 hot shapes */
		struct key k = shape(i);
		int hit;
		int s = plan_lru_get(&c.lru, &k, &hit);
		if (!hit) {
			c.answer[s] = last[i] = ++misses;
			continue;
		}
		CHECK_MSG(last[i] > 0 && c.answer[s] == last[i] && !memcmp(&c.keys[s], &k, sizeof(k)),
			  "lookup %d of shape %d: entry %ld, its last miss made %ld", t, i,
			  c.answer[s], last[i]);
		if (test_failed())
			return;
	}
	CHECK(misses > SHAPES); /* evictions happened */
}

TEST(bucket_properties)
{
	int buckets = 0, prev = 0;
	for (int k = 1; k <= 65536; k++) {
		int b = plan_bucket(k);
		CHECK_MSG(b >= k && b < 2 * k, "bucket(%d) = %d", k, b);
		CHECK_MSG((b & (b - 1)) == 0, "bucket(%d) = %d", k, b);
		CHECK_MSG(b >= prev, "bucket(%d) = %d < %d", k, b, prev);
		CHECK(plan_bucket(b) == b); /* a bucket is its own bucket */
		buckets += b != prev;
		prev = b;
	}
	CHECK_MSG(buckets == 17, "%d buckets", buckets);
	CHECK(plan_bucket(0) == 0 && plan_bucket(-3) == -3);
	CHECK(plan_bucket(1 << 30) == 1 << 30);
	CHECK(plan_bucket((1 << 30) + 1) == (1 << 30) + 1); /* no overflow */
}
