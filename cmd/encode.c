/* encode.c - documents to token shards (see encode.h).
 *
 * A reader thread copies documents into batches of about BATCH_BYTES (two
 * of them, so that reading, decompressing and parsing the next batch
 * overlaps the encoding of this one). The documents of a batch are cut into
 * pieces at safe points (see pretok_split_point); the pieces are encoded and
 * hashed on all cores with one pre-token cache per thread; then the
 * documents are written in input order. The pieces of a document depend on
 * its text alone, so its hash (of the piece hashes in order) does too.
 */
#include "encode.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../io/formats/shard.h"
#include "../io/staged.h"
#include "../io/text/corpus.h"
#include "../io/text/pretok.h"
#include "../io/text/tokenizer.h"
#include "../io/util.h"

#define CHUNK_BYTES (256 << 10) /* pieces that threads encode */
#define BATCH_BYTES (4 << 20)   /* text encoded between writes (and progress lines) */
#define COPY_TOKENS (1 << 20)   /* tokens per read when the split moves to position */
#define VAL_BIT (1ULL << 63)

struct piece {
	size_t off, n;  /* text[off..off+n); its tokens go to ids[off..off+nids) */
	int doc_start;  /* first piece of a document */
	size_t nids;
	uint64_t hash;
};

/* Documents read ahead: text[0..len) holds the documents, which end at
 * ends[0..ndocs). last: the reader is done (rc says how). */
struct batch {
	struct buf text;
	size_t *ends, ndocs, cap;
	int full, last, rc;
};

struct reader {
	struct corpus *c;
	struct batch b[2];
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int stop;
};

struct encoder {
	const struct encode_opts *o;
	struct encode_result *r;
	struct tok_cache **caches;
	struct shard_writer *train, *val;
	const unsigned char *text; /* the batch being encoded */
	struct piece *pieces;
	size_t npieces, pcap;
	uint32_t *ids;             /* the tokens of the batch's pieces */
	size_t ids_cap;
	/* every document's token count (| VAL_BIT when drawn for val), kept while
	 * the split may still fall back to position */
	uint64_t *docs, min_docs;
	size_t ndocs, docs_cap;
	int recording;
	double t0;
};

static void *reader_main(void *arg)
{
	struct reader *rd = arg;
	for (int i = 0;; i ^= 1) {
		struct batch *b = &rd->b[i];
		pthread_mutex_lock(&rd->mu);
		while (b->full && !rd->stop)
			pthread_cond_wait(&rd->cv, &rd->mu);
		int stop = rd->stop;
		pthread_mutex_unlock(&rd->mu);
		if (stop)
			return NULL;
		b->text.len = b->ndocs = 0;
		const unsigned char *doc;
		size_t len;
		int got = 1;
		while (b->text.len < BATCH_BYTES && (got = corpus_next(rd->c, &doc, &len)) > 0) {
			buf_append(&b->text, doc, len);
			if (b->ndocs == b->cap) {
				b->cap = b->cap ? 2 * b->cap : 256;
				b->ends = xrealloc(b->ends, st_mult(b->cap, sizeof(*b->ends)));
			}
			b->ends[b->ndocs++] = b->text.len;
		}
		pthread_mutex_lock(&rd->mu);
		b->full = 1;
		b->last = got <= 0;
		b->rc = got < 0 ? -1 : 0;
		pthread_cond_broadcast(&rd->cv);
		pthread_mutex_unlock(&rd->mu);
		if (got <= 0)
			return NULL;
	}
}

static void progress(struct encoder *e, int final)
{
	if (!e->o->progress)
		return;
	double dt = now_sec() - e->t0;
	fprintf(stderr, "\rencoding: %.1f MB  %.1f MB/s%s", e->r->bytes / 1e6,
		dt > 0 ? e->r->bytes / 1e6 / dt : 0.0, final ? "\n" : "");
}

static void record_doc(struct encoder *e, uint64_t ntok, int to_val)
{
	if (!e->recording)
		return;
	if (e->ndocs == e->docs_cap) {
		e->docs_cap = e->docs_cap ? 2 * e->docs_cap : 64;
		e->docs = xrealloc(e->docs, st_mult(e->docs_cap, sizeof(*e->docs)));
	}
	e->docs[e->ndocs++] = ntok | (to_val ? VAL_BIT : 0);
	if (e->r->docs >= e->min_docs && e->r->val_docs > 0) { /* the split stays by document */
		free(e->docs);
		e->docs = NULL;
		e->ndocs = e->docs_cap = 0;
		e->recording = 0;
	}
}

/* A 64-bit hash of s[0..n), eight bytes a step (the split needs well
 * spread bits, not a cryptographic hash; rng_mix finishes it). */
static uint64_t text_hash(const unsigned char *s, size_t n)
{
	uint64_t h = n * 0x9E3779B97F4A7C15ULL, w;
	for (; n >= 8; s += 8, n -= 8) {
		memcpy(&w, s, 8);
		h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
		h ^= h >> 32;
	}
	w = 0;
	memcpy(&w, s, n);
	return rng_mix(h, w);
}

/* Where the ids of piece q at byte off go (q = npieces, off the text's
 * length: the room all need). A piece of n bytes has at most
 * tokenizer_max_ids(n) tokens, which is affine in n (n * mult + extra): the
 * pieces before q need max_ids(their bytes) plus one extra each beyond the
 * first. */
static size_t ids_at(const struct encoder *e, size_t q, size_t off)
{
	const struct tokenizer *t = e->o->tok;
	return tokenizer_max_ids(t, off) + q * tokenizer_max_ids(t, 0);
}

/* Encode the queued pieces in parallel, then write their documents. */
static int flush_pieces(struct encoder *e, size_t text_len)
{
	const struct encode_opts *o = e->o;
	long np = (long)e->npieces;
	/* a piece of n bytes has at most tokenizer_max_ids(n) tokens (ids_at) */
	size_t need = ids_at(e, e->npieces, text_len);
	if (need > e->ids_cap) {
		free(e->ids);
		e->ids_cap = need;
		e->ids = xmalloc(st_mult(need, sizeof(*e->ids)));
	}
#pragma omp parallel for schedule(dynamic, 1) num_threads(o->nthreads)
	for (long i = 0; i < np; i++) {
		struct piece *pc = &e->pieces[i];
		const unsigned char *p = e->text + pc->off;
		pc->nids = tokenizer_encode_cached(o->tok, e->caches[omp_get_thread_num()], p,
						   pc->n, e->ids + ids_at(e, (size_t)i, pc->off));
		pc->hash = text_hash(p, pc->n);
	}
	uint32_t eot = tokenizer_eot_id(o->tok);
	int has_eot = eot != TOKENIZER_NO_ID, rc = 0;
	for (size_t i = 0; i < e->npieces;) {
		size_t j = i + 1, k = has_eot + e->pieces[i].nids;
		uint64_t h = rng_mix(0, e->pieces[i].hash);
		while (j < e->npieces && !e->pieces[j].doc_start) {
			k += e->pieces[j].nids;
			h = rng_mix(h, e->pieces[j++].hash);
		}
		e->r->docs++;
		if (!o->train_path) {
			const char *sep = "";
			for (size_t q = i; q < j; q++) {
				const uint32_t *ids = e->ids + ids_at(e, q, e->pieces[q].off);
				for (size_t t = 0; t < e->pieces[q].nids; t++, sep = " ")
					fprintf(o->ids_out, "%s%u", sep, ids[t]);
			}
			fputc('\n', o->ids_out);
		} else {
			/* 53 random bits from (seed, hash): the same text, the same side */
			double u = (double)(rng_mix(o->seed, h) >> 11) * 0x1p-53;
			int to_val = u < o->val_fraction;
			struct shard_writer *w = to_val ? e->val : e->train;
			e->r->val_docs += to_val;
			record_doc(e, k, to_val);
			if (has_eot && !rc && shard_writer_add(w, &eot, 1, 1))
				rc = -1;
			for (size_t q = i; q < j && !rc; q++) {
				const struct piece *pc = &e->pieces[q];
				int first = !has_eot && q == i;
				if (shard_writer_add(w, e->ids + ids_at(e, q, pc->off), pc->nids,
						     first))
					rc = -1;
			}
		}
		for (size_t q = i; q < j; q++)
			e->r->bytes += e->pieces[q].n;
		i = j;
	}
	e->npieces = 0;
	progress(e, 0);
	return rc;
}

static void add_piece(struct encoder *e, size_t off, size_t n, int doc_start)
{
	if (e->npieces == e->pcap) {
		e->pcap = e->pcap ? 2 * e->pcap : 256;
		e->pieces = xrealloc(e->pieces, st_mult(e->pcap, sizeof(*e->pieces)));
	}
	e->pieces[e->npieces++] = (struct piece){.off = off, .n = n, .doc_start = doc_start};
}

/* Encode the documents of a batch. */
static int encode_batch(struct encoder *e, const struct batch *b)
{
	e->text = b->text.data;
	for (size_t d = 0, start = 0; d < b->ndocs; start = b->ends[d++]) {
		const unsigned char *s = b->text.data + start;
		size_t n = b->ends[d] - start;
		for (size_t at = 0; at < n;) {
			size_t cut = n - at <= CHUNK_BYTES ? n - at :
				     tokenizer_split_point(e->o->tok, s + at, n - at, CHUNK_BYTES);
			add_piece(e, start + at, cut, at == 0);
			at += cut;
		}
	}
	return flush_pieces(e, b->text.len);
}

/* A shard writer of path (staged or final), named name in messages. */
static int open_writer(struct shard_writer **w, const char *path, const char *name,
		       const struct encode_opts *o)
{
	if (shard_writer_open_named(w, path, name, tokenizer_vocab_size(o->tok),
				    tokenizer_hash(o->tok)))
		return -1;
	return o->chunk_tokens ? shard_writer_set_chunk_tokens(*w, o->chunk_tokens) : 0;
}

/* Rewrite the two shards split by position: the documents in input order,
 * read back from the staged shards (pass[2]) they were written to, the last
 * nval tokens to val, into out[2] (staged too: the caller moves them into
 * place). */
static int split_by_position(struct encoder *e, char *const pass[2], char *const out[2])
{
	const struct encode_opts *o = e->o;
	uint64_t total = e->r->train_tokens + e->r->val_tokens;
	uint64_t nval = (uint64_t)llround(o->val_fraction * (double)total);
	nval = nval < 1 ? 1 : nval > total ? total : nval;
	uint64_t cut = total - nval, at = 0, cursor[2] = {0, 0};
	struct shard *src[2] = {NULL, NULL};
	struct shard_writer *dst[2] = {NULL, NULL};
	uint32_t *buf = NULL;
	int rc = -1;
	if (shard_open(&src[0], pass[0]) || shard_open(&src[1], pass[1]) ||
	    open_writer(&dst[0], out[0], o->train_path, o) ||
	    open_writer(&dst[1], out[1], o->val_path, o))
		goto out;
	buf = xmalloc(COPY_TOKENS * sizeof(*buf));
	for (size_t d = 0; d < e->ndocs; d++) {
		int from = (e->docs[d] & VAL_BIT) != 0;
		uint64_t len = e->docs[d] & ~VAL_BIT;
		for (uint64_t done = 0; done < len;) {
			size_t k = (size_t)MIN((uint64_t)COPY_TOKENS, len - done);
			if (at < cut && at + k > cut)
				k = (size_t)(cut - at);
			int to = at >= cut;
			if (shard_read(src[from], cursor[from], k, buf) ||
			    shard_writer_add(dst[to], buf, k, done == 0 || at == cut))
				goto out;
			cursor[from] += k;
			done += k;
			at += k;
		}
	}
	shard_close(src[0]);
	shard_close(src[1]);
	src[0] = src[1] = NULL;
	rc = shard_writer_close(dst[0]);
	dst[0] = NULL;
	if (!rc)
		rc = shard_writer_close(dst[1]);
	dst[1] = NULL;
	e->r->train_tokens = cut;
	e->r->val_tokens = nval;
	e->r->by_position = 1;
out:
	free(buf);
	shard_close(src[0]);
	shard_close(src[1]);
	shard_writer_abort(dst[0]);
	shard_writer_abort(dst[1]);
	return rc;
}

/* Whether a Split regex ran out of PCRE2's limits while encoding (after
 * error()): its text then stayed unsplit, and no shard may keep it. */
static int regex_failed(const struct tokenizer *tok)
{
	const char *re = "";
	size_t n = 0;
	uint64_t fails = tokenizer_regex_failures(tok, &re, &n);
	if (fails)
		error("the Split regex %.*s ran out of PCRE2's backtracking limits %" PRIu64
		      " time(s), even retried with 10 times the limits: text there was left "
		      "unsplit, so no shard was written; rewrite the regex without nested "
		      "quantifiers such as (a+)+ (they backtrack exponentially), or cut the "
		      "documents shorter", (int)n, re, fails);
	return fails != 0;
}

int encode_corpus(struct corpus *c, const struct encode_opts *o, struct encode_result *r)
{
	struct encoder e = {.o = o, .r = r};
	memset(r, 0, sizeof(*r));
	e.caches = xmalloc(st_mult(o->nthreads, sizeof(*e.caches)));
	for (int i = 0; i < o->nthreads; i++)
		e.caches[i] = tok_cache_new(o->tok);
	int splitting = o->train_path && o->val_fraction > 0;
	if (splitting) {
		double m = ceil(1 / o->val_fraction);
		e.min_docs = r->min_docs = m < 1e18 ? (uint64_t)m : (uint64_t)1e18;
		e.recording = 1;
	}
	e.t0 = now_sec();
	int rc = -1;
	/* a split is staged beside the outputs (PATH.pass.PID; rewritten by
	 * position into PATH.split.PID) and both shards are moved into place
	 * only once both are final, so the shards they replace stay until then */
	char *pass[2] = {NULL, NULL}, *split[2] = {NULL, NULL};
	if (splitting)
		for (int i = 0; i < 2; i++) {
			const char *final = i ? o->val_path : o->train_path;
			size_t n = strlen(final) + 32;
			pass[i] = xmalloc(n);
			split[i] = xmalloc(n);
			snprintf(pass[i], n, "%s.pass.%ld", final, (long)getpid());
			snprintf(split[i], n, "%s.split.%ld", final, (long)getpid());
			staged_add(pass[i], 0);
			staged_add(split[i], 0);
		}
	/* the staged shards are named by their final names in messages */
	if (o->train_path &&
	    open_writer(&e.train, splitting ? pass[0] : o->train_path, o->train_path, o))
		goto out;
	if (splitting && open_writer(&e.val, pass[1], o->val_path, o))
		goto out;
	/* encode batch after batch as the reader fills them */
	struct reader rd = {.c = c};
	pthread_mutex_init(&rd.mu, NULL);
	pthread_cond_init(&rd.cv, NULL);
	if (pthread_create(&rd.thread, NULL, reader_main, &rd))
		die("cannot start a thread");
	int done = 0, failed = 0;
	for (int i = 0; !done && !failed; i ^= 1) {
		struct batch *b = &rd.b[i];
		pthread_mutex_lock(&rd.mu);
		while (!b->full)
			pthread_cond_wait(&rd.cv, &rd.mu);
		pthread_mutex_unlock(&rd.mu);
		done = b->last;
		failed = b->rc || encode_batch(&e, b);
		pthread_mutex_lock(&rd.mu);
		b->full = 0;
		rd.stop = failed;
		pthread_cond_broadcast(&rd.cv);
		pthread_mutex_unlock(&rd.mu);
	}
	pthread_join(rd.thread, NULL);
	pthread_mutex_destroy(&rd.mu);
	pthread_cond_destroy(&rd.cv);
	for (int i = 0; i < 2; i++) {
		buf_free(&rd.b[i].text);
		free(rd.b[i].ends);
	}
	if (failed || regex_failed(o->tok))
		goto out;
	progress(&e, 1);
	if (!o->train_path) {
		rc = 0;
		goto out;
	}
	r->train_tokens = shard_writer_ntokens(e.train);
	r->val_tokens = e.val ? shard_writer_ntokens(e.val) : 0;
	int bad = shard_writer_close(e.train);
	e.train = NULL;
	if (e.val)
		bad |= shard_writer_close(e.val);
	e.val = NULL;
	if (bad)
		goto out;
	rc = 0;
	if (splitting) {
		char *const *done = pass;
		if (e.recording && r->train_tokens + r->val_tokens > 0) {
			rc = split_by_position(&e, pass, split);
			done = split;
		}
		if (!rc && (rename(done[0], o->train_path) || rename(done[1], o->val_path)))
			rc = error("cannot move the shards into place ('%s', '%s'): %s",
				   o->train_path, o->val_path, strerror(errno));
	}
out:
	for (int i = 0; i < 2; i++) { /* the staged files, gone where moved into place */
		if (pass[i]) {
			unlink(pass[i]);
			unlink(split[i]);
			staged_drop(pass[i]);
			staged_drop(split[i]);
		}
		free(pass[i]);
		free(split[i]);
	}
	shard_writer_abort(e.train);
	shard_writer_abort(e.val);
	free(e.pieces);
	free(e.ids);
	free(e.docs);
	for (int i = 0; i < o->nthreads; i++)
		tok_cache_free(e.caches[i]);
	free(e.caches);
	return rc;
}
