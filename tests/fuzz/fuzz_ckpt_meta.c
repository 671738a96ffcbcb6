/* fuzz_ckpt_meta.c - fuzz entry point for a checkpoint's metadata section.
 *
 * The container's checksums stop a byte-flipping fuzzer at the first chunk
 * it touches (fuzz_checkpoint covers that), so here the bytes are the
 * metadata itself, written through the checkpoint writer into a valid file
 * with a small index: the first byte picks how many weight sets it holds
 * (weights.v0 to v3, each of two tensors) and whether one of them is
 * named out of line (weights.v0K/b, a leading zero); the rest, up to the
 * first NUL, is the metadata text. ckpt_open must never crash, hang or read
 * out of bounds, and a file it accepts must satisfy what its readers rely
 * on: step and versions present and in range, every weight set below
 * versions and each version present. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../io/formats/checkpoint.h"
#include "../../io/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > 4096)
		return 0;
	int sets = data[0] & 3, odd = data[0] >> 2 & 1;
	char *meta = xmalloc(size);
	memcpy(meta, data + 1, size - 1);
	meta[size - 1] = 0; /* the writer takes text: up to the first NUL */
	char path[512];
	const char *tmp = getenv("TMPDIR");
	snprintf(path, sizeof(path), "%s/fuzz_ckpt_meta.%d.ckpt", tmp && *tmp ? tmp : "/tmp",
		 (int)getpid());
	set_error_quiet(1);
	struct ckpt_writer *w;
	static const float x[6] = {1, 2, 3, 4, 5, 6};
	if (ckpt_create(&w, path, "[model]\nn_layer = 1\n", meta)) {
		free(meta);
		return 0;
	}
	int rc = 0;
	for (int v = 0; v <= sets && !rc; v++) {
		char name[32];
		snprintf(name, sizeof(name), "weights.v%d/a", v);
		rc = ckpt_add(w, name, x, 6, 2, 3);
		snprintf(name, sizeof(name), odd && v == sets ? "weights.v0%d/b" : "weights.v%d/b",
			 v);
		if (!rc)
			rc = ckpt_add(w, name, x, 4, 4, 0);
	}
	if (!rc)
		rc = ckpt_add(w, "adam_m/a", x, 6, 3, 2);
	if (rc)
		ckpt_abort(w);
	else
		rc = ckpt_commit(w); /* the writer takes any text: only the reader judges */
	struct ckpt *k;
	if (!rc && !ckpt_open(&k, path)) {
		long step, nv;
		uint64_t h;
		if (ckpt_meta_long(k, "step", &step) || ckpt_meta_long(k, "versions", &nv) ||
		    step < 0 || (uint64_t)step > CKPT_MAX_STEP || nv < 1 ||
		    nv > CKPT_MAX_VERSIONS || nv != sets + 1 || odd)
			abort();
		for (int v = 0; v < nv; v++) {
			char name[32];
			snprintf(name, sizeof(name), "weights.v%d/b", v);
			if (ckpt_find(k, name) < 0)
				abort();
		}
		ckpt_meta_u64(k, "tokenizer_hash", &h);
		ckpt_close(k);
	}
	set_error_quiet(0);
	unlink(path);
	free(meta);
	return 0;
}
