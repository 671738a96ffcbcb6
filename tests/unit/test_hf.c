/* test_hf.c - Hugging Face import and export.
 *
 * The fixtures in testdata/hf (written by tests/scripts/hf_fixture.py, a
 * plain-Python forward that follows the HF modules: GPT-2's Conv1D and
 * gelu_new; Llama's RMSNorm, rotate_half RoPE, GQA and SwiGLU) hold the
 * logits at every position of fixed tokens. Imported, our model must give
 * them within 2e-4 + 2e-4*|logit| (the reference is double precision, we
 * compute in float32; a wrong q/k row order for RoPE, a missed transpose or
 * a swapped gate/up moves logits by O(1)). Then: export and import give
 * back the same weights bit for bit in f32, and in bf16/f16 for values
 * those types hold; the tokenizer survives both ways (same hash); and every
 * refusal names what it refuses.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../io/formats/half.h"
#include "../../model/formats/hf_model.h"
#include "../../model/formats/safetensors.h"
#include "../../io/text/json.h"
#include "../../io/text/tokenizer.h"
#include "../../io/util.h"
#include "../../kernels/backend.h"
#include "../../model/model.h"
#include "../test.h"

static char *fixture(const char *name)
{
	char rel[64];
	snprintf(rel, sizeof(rel), "hf/%s", name);
	return xstrdup(test_data(rel));
}

/* config + weights of DIR; 0 on success */
static int load(const char *dir, struct model *m, float **params)
{
	struct model_config mc;
	long eos;
	*params = NULL;
	if (hf_read_config(dir, &mc, &eos) || model_init(m, &mc))
		return -1;
	*params = xmalloc(m->numel * sizeof(float));
	if (hf_read_weights(dir, m, *params)) {
		free(*params);
		*params = NULL;
		model_free(m);
		return -1;
	}
	return 0;
}

static void check_logits(const char *name)
{
	char *dir = fixture(name), path[1200];
	struct model m;
	float *params;
	CHECK_MSG(load(dir, &m, &params) == 0, "%s: %s", dir, last_error());
	snprintf(path, sizeof(path), "%s/expected.txt", dir);
	FILE *f = fopen(path, "r");
	CHECK_MSG(f, "cannot open %s", path);
	int32_t tok[64];
	int T = 0, k;
	char line[1024], *s = line + 7;
	CHECK(fgets(line, sizeof(line), f) && !strncmp(line, "tokens:", 7));
	while (T < 64 && sscanf(s, "%d%n", &tok[T], &k) == 1) {
		s += k;
		T++;
	}
	const struct backend *be = test_backend();
	struct stage st;
	CHECK(stage_init(&st, &m, be, NULL, 0, 1, T, 1) == 0);
	float *arena = xmalloc(st.numel * sizeof(float));
	stage_gather(&st, arena, params);
	float *dparams = be->alloc(st.numel * sizeof(float));
	be->to_device(dparams, arena, st.numel * sizeof(float));
	int32_t *dtok = be->alloc(T * sizeof(int32_t));
	be->to_device(dtok, tok, T * sizeof(int32_t));
	int Vp = m.cfg.Vp, V = m.cfg.V;
	float *dlogits = be->alloc(Vp * sizeof(float)), *logits = xmalloc(Vp * sizeof(float));
	double worst = 0;
	int bad = 0;
	for (int pos = 0; pos < T && !bad; pos++) {
		model_logits_at(&st, dparams, dtok, pos, dlogits);
		be->to_host(logits, dlogits, Vp * sizeof(float));
		for (int v = 0; v < V; v++) {
			double want;
			if (fscanf(f, "%lf", &want) != 1) {
				bad = 1;
				break;
			}
			double d = fabs(logits[v] - want);
			worst = MAX(worst, d);
			if (d > 2e-4 + 2e-4 * fabs(want)) {
				test_fail(__FILE__, __LINE__, "%s: logit %d at position %d: %.7g, want %.7g",
					  name, v, pos, logits[v], want);
				bad = 1;
				break;
			}
		}
	}
	fclose(f);
	be->free(dlogits);
	be->free(dtok);
	be->free(dparams);
	free(logits);
	free(arena);
	stage_free(&st);
	free(params);
	model_free(&m);
	free(dir);
	CHECK_MSG(!bad, "%s: logits differ or expected.txt is short", name);
	CHECK(worst < 1e-3);
}

TEST(gpt2_logits_match_hf_forward) { check_logits("gpt2"); }
TEST(llama_gqa_bf16_sharded_logits_match_hf_forward) { check_logits("llama"); }
TEST(llama_tied_f16_logits_match_hf_forward) { check_logits("llama-tied"); }
/* Mixtral's softmax over all experts, top-2 renormalised, w1 through the
 * SiLU and w3 beside it: a swapped w1/w3, a gate not renormalised or a
 * router read transposed moves the logits by O(1) */
TEST(mixtral_logits_match_hf_forward) { check_logits("mixtral"); }

TEST(config_of_the_fixtures)
{
	char *dir = fixture("llama");
	struct model_config mc;
	long eos;
	CHECK(hf_read_config(dir, &mc, &eos) == 0);
	CHECK(mc.arch == ARCH_LLAMA && mc.NH == 4 && mc.NKV == 2 && mc.F == 24 && !mc.tied);
	CHECK(mc.rope_theta == 500000.0f && mc.eps == 1e-5f && mc.T == 16 && eos == 260);
	free(dir);
	dir = fixture("gpt2");
	CHECK(hf_read_config(dir, &mc, &eos) == 0);
	CHECK(mc.arch == ARCH_GPT2 && mc.C == 16 && mc.F == 64 && mc.tied && mc.V == 261);
	free(dir);
	dir = fixture("mixtral");
	CHECK(hf_read_config(dir, &mc, &eos) == 0);
	CHECK(mc.arch == ARCH_LLAMA && mc.E == 4 && mc.K == 2 && mc.De == 12 && mc.F == 12);
	CHECK(mc.router == ROUTER_SOFTMAX && !mc.shared && mc.aux_coef == 0.02f && mc.z_coef == 0);
	CHECK(mc.rope_theta == 1e6f && mc.NKV == 2 && !mc.tied && eos == 260);
	free(dir);
}

/* ---- round trips ---- */

static char *tmpdir_named(const char *name)
{
	char *p = xmalloc(strlen(test_tmpdir()) + strlen(name) + 2);
	sprintf(p, "%s/%s", test_tmpdir(), name);
	mkdir(p, 0777);
	return p;
}

static void round_trip(const char *name, enum st_dtype dtype, int exact)
{
	char *dir = fixture(name), sub[64];
	struct model m, m2;
	float *p, *p2;
	CHECK(load(dir, &m, &p) == 0);
	snprintf(sub, sizeof(sub), "rt-%s-%s", name, st_dtype_name(dtype));
	char *out = tmpdir_named(sub);
	CHECK_MSG(hf_write_model(out, &m, p, dtype, 260) == 0, "%s", last_error());
	CHECK_MSG(load(out, &m2, &p2) == 0, "%s", last_error());
	CHECK(m2.numel == m.numel && !memcmp(&m2.cfg, &m.cfg, sizeof(m.cfg)));
	for (size_t i = 0; i < m.numel; i++) {
		float want = exact ? p[i] : dtype == ST_BF16 ? bf16_to_f32(f32_to_bf16(p[i]))
							      : f16_to_f32(f32_to_f16(p[i]));
		CHECK_MSG(f32_bits(p2[i]) == f32_bits(want), "%s %s: value %zu: %.9g, want %.9g",
			  name, st_dtype_name(dtype), i, p2[i], want);
	}
	free(p);
	free(p2);
	model_free(&m);
	model_free(&m2);
	free(out);
	free(dir);
}

TEST(gpt2_f32_round_trip_is_exact) { round_trip("gpt2", ST_F32, 1); }
TEST(llama_f32_round_trip_is_exact) { round_trip("llama", ST_F32, 1); }
TEST(llama_tied_f32_round_trip_is_exact) { round_trip("llama-tied", ST_F32, 1); }
/* the llama fixture's values are bf16 values, llama-tied's f16 values */
TEST(llama_bf16_round_trip_is_exact) { round_trip("llama", ST_BF16, 1); }
TEST(llama_tied_f16_round_trip_is_exact) { round_trip("llama-tied", ST_F16, 1); }
TEST(mixtral_f32_round_trip_is_exact) { round_trip("mixtral", ST_F32, 1); }
TEST(mixtral_bf16_round_to_nearest) { round_trip("mixtral", ST_BF16, 0); }

/* What the Mixtral layout cannot hold is refused naming the key */
TEST(moe_configs_without_a_mixtral_layout_are_refused)
{
	struct model_config c = {.arch = ARCH_LLAMA, .E = 4, .K = 2, .De = 8};
	CHECK(hf_moe_check(&c) == 0);
	set_error_quiet(1);
	c.router = ROUTER_SIGMOID;
	CHECK(hf_moe_check(&c) == -1 && strstr(last_error(), "model.router = sigmoid"));
	c.router = ROUTER_SOFTMAX;
	c.shared = 1;
	CHECK(hf_moe_check(&c) == -1 && strstr(last_error(), "model.shared_expert = 1"));
	c.shared = 0;
	c.K = 1;
	CHECK(hf_moe_check(&c) == -1 && strstr(last_error(), "model.top_k = 1"));
	set_error_quiet(0);
}

TEST(gpt2_bf16_f16_round_to_nearest) {
	round_trip("gpt2", ST_BF16, 0);
	round_trip("gpt2", ST_F16, 0);
}

TEST(half_conversions)
{
	CHECK(f32_to_f16(65504.0f) == 0x7bff && f32_to_f16(65520.0f) == 0x7c00);
	CHECK(f32_to_f16(65519.0f) == 0x7bff);
	CHECK(f32_to_f16(5.9604644775390625e-8f) == 1);      /* smallest subnormal */
	CHECK(f32_to_f16(2.98023223876953125e-8f) == 0);     /* half of it: ties to even */
	CHECK(f32_to_f16(4.4703483581542969e-8f) == 1);      /* 0.75 of it */
	CHECK(f32_to_f16(-1.0f) == 0xbc00 && f16_to_f32(0xbc00) == -1.0f);
	CHECK(f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00);     /* tie to even, down */
	CHECK(f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02);     /* tie to even, up */
	CHECK(f32_to_bf16(1.0f + 1.0f / 256) == 0x3f80 && f32_to_bf16(1.0f + 3.0f / 256) == 0x3f82);
	CHECK(isnan(f16_to_f32(f32_to_f16(NAN))) && isnan(bf16_to_f32(f32_to_bf16(NAN))));
	for (uint32_t h = 0; h < 0x7c00; h++) /* every finite f16 survives */
		CHECK(f32_to_f16(f16_to_f32((uint16_t)h)) == h &&
		      f32_to_f16(f16_to_f32((uint16_t)(h | 0x8000))) == (h | 0x8000));
}

/* ---- the tokenizer ---- */

static struct tokenizer *fixture_tok(const char *name)
{
	char *dir = fixture(name), *path = path_join(dir, "tokenizer.json");
	struct tokenizer *tok = NULL;
	if (hf_tokenizer_read(&tok, path, -1))
		tok = NULL;
	free(path);
	free(dir);
	return tok;
}

TEST(tokenizer_json_encodes_like_hf)
{
	struct tokenizer *tok = fixture_tok("gpt2"), *tok2 = fixture_tok("llama");
	CHECK_MSG(tok && tok2, "%s", last_error());
	uint32_t ids[16];
	/* "the" -> t he; " then" -> Ġt h e n -> Ġt he n -> Ġthe n */
	size_t n = tokenizer_encode(tok, "the then", 8, ids);
	CHECK(n == 4 && ids[0] == 't' - 33 && ids[1] == 257 && ids[2] == 258 && ids[3] == 'n' - 33);
	CHECK(tokenizer_eot_id(tok) == 260 && tokenizer_vocab_size(tok) == 261);
	/* the llama fixture spells merges as pairs and wraps ByteLevel in a
	 * Sequence: the same tokenizer */
	CHECK(tokenizer_hash(tok) == tokenizer_hash(tok2));
	tokenizer_free(tok);
	tokenizer_free(tok2);
}

TEST(tokenizer_round_trip)
{
	struct tokenizer *tok = fixture_tok("gpt2"), *back = NULL, *gpt2 = NULL;
	CHECK(tok);
	char *out = tmpdir_named("tok");
	CHECK_MSG(hf_tokenizer_write(tok, out, 1, 16) == 0, "%s", last_error());
	char *json = path_join(out, "tokenizer.json"), *vocab = path_join(out, "vocab.json"),
	     *merges = path_join(out, "merges.txt");
	CHECK_MSG(hf_tokenizer_read(&back, json, -1) == 0, "%s", last_error());
	CHECK(tokenizer_hash(back) == tokenizer_hash(tok));
	/* GPT-2's own files read by `tokenize import-gpt2` agree too: the same
	 * tokens, merges and special tokens; tokenizer.json's finds its special
	 * tokens in text (Hugging Face's default), GPT-2's files' do not */
	CHECK_MSG(gpt2_import(&gpt2, vocab, merges) == 0, "%s", last_error());
	CHECK(tokenizer_flags(tok) == TOK_SPLIT_ADDED && tokenizer_flags(gpt2) == 0);
	struct buf a = {0}, b = {0};
	tokenizer_serialize(tok, &a);
	tokenizer_serialize(gpt2, &b);
	CHECK(a.len == b.len && !memcmp(a.data, b.data, 12) && !memcmp(a.data + 16, b.data + 16, 24) &&
	      !memcmp(a.data + 48, b.data + 48, a.len - 52));
	buf_free(&a);
	buf_free(&b);
	tokenizer_free(tok);
	tokenizer_free(back);
	tokenizer_free(gpt2);
	free(json);
	free(vocab);
	free(merges);
	free(out);
}

TEST(tokenizer_with_duplicate_strings_is_not_exported)
{
	/* two merges that spell "aaa": fine for us, impossible in a vocab map */
	uint32_t lens[256 + 3];
	unsigned char bytes[256 + 8];
	for (int b = 0; b < 256; b++) {
		lens[b] = 1;
		bytes[b] = (unsigned char)b;
	}
	lens[256] = 2;
	lens[257] = 3;
	lens[258] = 3;
	memcpy(bytes + 256, "aaaaaaaa", 8);
	uint32_t merges[3][3] = {{'a', 'a', 256}, {256, 'a', 257}, {'a', 256, 258}};
	struct tokenizer *tok;
	CHECK(tokenizer_build(&tok, 259, lens, bytes, 3, (const uint32_t(*)[3])merges, 0, NULL,
			      TOKENIZER_NO_ID) == 0);
	char *out = tmpdir_named("dup");
	set_error_quiet(1);
	int rc = hf_tokenizer_write(tok, out, 0, 16);
	set_error_quiet(0);
	CHECK(rc == -1 && strstr(last_error(), "tokens 257 and 258 have the same bytes"));
	tokenizer_free(tok);
	free(out);
}

/* ---- refusals ---- */

static void spit(const char *path, const char *text, size_t n)
{
	FILE *f = fopen(path, "wb");
	if (f) {
		fwrite(text, 1, n, f);
		fclose(f);
	}
}

static const char *find(const unsigned char *s, size_t n, const char *what)
{
	size_t k = strlen(what);
	for (size_t i = 0; i + k <= n; i++)
		if (!memcmp(s + i, what, k))
			return (const char *)s + i;
	return NULL;
}

/* A copy of fixture `name` in a fresh folder, with `file` edited: the first
 * `from` replaced by `to`. */
static char *edited(const char *name, const char *file, const char *from, const char *to)
{
	static int serial;
	static const char *const files[] = {"config.json", "tokenizer.json", "model.safetensors",
					    "model.safetensors.index.json",
					    "model-00001-of-00002.safetensors",
					    "model-00002-of-00002.safetensors"};
	char *src = fixture(name), sub[64];
	snprintf(sub, sizeof(sub), "edit%d", serial++);
	char *dst = tmpdir_named(sub);
	for (size_t i = 0; i < ARRAY_SIZE(files); i++) {
		char *a = path_join(src, files[i]), *b = path_join(dst, files[i]);
		struct buf buf = {0};
		set_error_quiet(1);
		if (!read_file(a, &buf)) {
			const char *hit = from && !strcmp(files[i], file) ?
				find(buf.data, buf.len, from) : NULL;
			if (hit) {
				struct buf o = {0};
				buf_append(&o, buf.data, (size_t)(hit - (const char *)buf.data));
				buf_append(&o, to, strlen(to));
				const char *rest = hit + strlen(from);
				buf_append(&o, rest, buf.len - (size_t)(rest - (const char *)buf.data));
				spit(b, (const char *)o.data, o.len);
				buf_free(&o);
			} else {
				spit(b, (const char *)buf.data, buf.len);
			}
		}
		set_error_quiet(0);
		buf_free(&buf);
		free(a);
		free(b);
	}
	free(src);
	return dst;
}

/* import DIR (config, weights, tokenizer) must fail with `want` in the message */
static int refused(const char *dir, const char *want)
{
	struct model m;
	float *p;
	struct tokenizer *tok = NULL;
	char *tj = path_join(dir, "tokenizer.json");
	set_error_quiet(1);
	int ok = load(dir, &m, &p) == 0;
	if (ok) {
		free(p);
		model_free(&m);
		ok = hf_tokenizer_read(&tok, tj, -1) == 0;
		tokenizer_free(tok);
	}
	set_error_quiet(0);
	free(tj);
	if (ok || !strstr(last_error(), want)) {
		printf("  wanted '%s', got: %s\n", want, ok ? "success" : last_error());
		return 0;
	}
	return 1;
}

#define REFUSE(name, file, from, to, want)                                  \
	do {                                                                \
		char *d_ = edited(name, file, from, to);                    \
		int r_ = refused(d_, want);                                 \
		free(d_);                                                   \
		CHECK_MSG(r_, "%s: %s -> %s not refused with '%s'", file, from, to, want); \
	} while (0)

TEST(unknown_architectures_are_refused)
{
	REFUSE("gpt2", "config.json", "\"model_type\": \"gpt2\"", "\"model_type\": \"mistral\"",
	       "unknown architecture: model_type 'mistral'");
	REFUSE("gpt2", "config.json", "\"GPT2LMHeadModel\"", "\"GPT2Model\"",
	       "unknown architecture 'GPT2Model'");
}

TEST(config_keys_we_cannot_honour_are_refused)
{
	REFUSE("llama", "config.json", "\"rope_scaling\": null",
	       "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}", "'rope_scaling'");
	REFUSE("llama", "config.json", "\"attention_bias\": false", "\"attention_bias\": true",
	       "'attention_bias' is true");
	REFUSE("llama", "config.json", "\"mlp_bias\": false", "\"mlp_bias\": true", "'mlp_bias'");
	REFUSE("llama", "config.json", "\"head_dim\": 4", "\"head_dim\": 8", "'head_dim' 8");
	REFUSE("llama", "config.json", "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"",
	       "'hidden_act' is 'gelu'");
	REFUSE("gpt2", "config.json", "\"activation_function\": \"gelu_new\"",
	       "\"activation_function\": \"relu\"", "'activation_function' is 'relu'");
	REFUSE("gpt2", "config.json", "\"n_head\": 2", "\"n_head\": 2.5", "'n_head' must be an integer");
	REFUSE("mixtral", "config.json", "\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 1",
	       "'num_experts_per_tok' is 1");
	REFUSE("mixtral", "config.json", "\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 5",
	       "'num_experts_per_tok' 5 is more than 'num_local_experts' 4");
	REFUSE("mixtral", "config.json", "\"num_local_experts\": 4", "\"num_local_expert\": 4",
	       "no 'num_local_experts'");
	REFUSE("mixtral", "config.json", "\"sliding_window\": null", "\"sliding_window\": 8",
	       "'sliding_window' 8 is shorter");
	REFUSE("mixtral", "config.json", "\"router_jitter_noise\": 0.0",
	       "\"router_jitter_noise\": 0.01", "'router_jitter_noise' is not 0");
	REFUSE("mixtral", "config.json", "\"MixtralForCausalLM\"", "\"LlamaForCausalLM\"",
	       "unknown architecture 'LlamaForCausalLM'");
}

/* A member name given twice: the last value counts, in the first one's
 * place, as Python's json.load and serde_json (Hugging Face's readers) take
 * it; nested objects too, and a walk over the members sees each name once. */
TEST(json_duplicate_names_take_the_last_value)
{
	static const char text[] = "{\"a\": 1, \"b\": {\"x\": \"old\", \"x\": \"new\"}, \"a\": 2,\n"
				   "\"c\": [{\"k\": true, \"k\": null}], \"a\": {\"deep\": 3}}";
	struct json *j;
	CHECK(json_parse(&j, text, sizeof(text) - 1, "dup.json") == 0);
	CHECK(j->len == 3 && !strcmp(j->kids[0].key, "a") && !strcmp(j->kids[1].key, "b") &&
	      !strcmp(j->kids[2].key, "c"));
	const struct json *a = json_get(j, "a");
	CHECK(a && a->type == JSON_OBJECT && json_get(a, "deep") && json_get(a, "deep")->i == 3);
	const struct json *x = json_get(json_get(j, "b"), "x");
	CHECK(x && x->type == JSON_STRING && !strcmp(x->str, "new") && json_get(j, "b")->len == 1);
	const struct json *c = json_get(j, "c");
	CHECK(c && c->len == 1 && c->kids[0].len == 1 && c->kids[0].kids[0].type == JSON_NULL);
	json_free(j);
	/* a JSON Lines record's field, likewise */
	static const char rec[] = "{\"text\": \"first\", \"id\": 1, \"text\": \"second\"}";
	struct buf out = {0};
	struct json_record_error e;
	CHECK(json_record_string(rec, sizeof(rec) - 1, "text", &out, &e) == JSON_RECORD_OK);
	CHECK(out.len == 6 && !memcmp(out.data, "second", 6));
	static const char rec2[] = "{\"text\": \"first\", \"text\": 7}";
	CHECK(json_record_string(rec2, sizeof(rec2) - 1, "text", &out, &e) ==
	      JSON_RECORD_NOT_STRING);
	CHECK(out.len == 0 && e.type == JSON_NUMBER);
	buf_free(&out);
}

/* config.json's n_head given twice: the model Hugging Face would build */
TEST(hf_config_duplicate_key_takes_the_last)
{
	char *d = edited("gpt2", "config.json", "\"n_head\": 2", "\"n_head\": 16, \"n_head\": 2");
	struct model_config mc;
	long eos;
	CHECK_MSG(hf_read_config(d, &mc, &eos) == 0, "%s", last_error());
	CHECK_MSG(mc.NH == 2, "n_head %d, the last value is 2", mc.NH);
	free(d);
}

/* rewrite the gpt2 fixture's weights with one tensor dropped, added or reshaped */
static char *weights_edited(const char *drop, const char *add, const char *reshape)
{
	char *dir = edited("gpt2", "", NULL, NULL), *path = path_join(dir, "model.safetensors");
	struct st_file *f;
	if (st_open(&f, path))
		return dir;
	int n = st_count(f);
	struct st_tensor *t = xcalloc(n + 1, sizeof(*t));
	float **data = xcalloc(n + 1, sizeof(*data));
	int k = 0;
	for (int i = 0; i < n; i++) {
		if (drop && !strcmp(st_name(f, i), drop))
			continue;
		t[k].name = st_name(f, i);
		t[k].ndim = st_ndim(f, i);
		memcpy(t[k].shape, st_shape(f, i), sizeof(t[k].shape));
		if (reshape && !strcmp(st_name(f, i), reshape)) { /* [a, b] -> [b, a] */
			t[k].shape[0] = st_shape(f, i)[1];
			t[k].shape[1] = st_shape(f, i)[0];
		}
		t[k].data = data[k] = xmalloc(st_numel(f, i) * sizeof(float));
		st_read(f, i, data[k]);
		k++;
	}
	if (add) {
		static const float one = 1.0f;
		t[k].name = add;
		t[k].ndim = 1;
		t[k].shape[0] = 1;
		t[k].data = &one;
		k++;
	}
	st_write(path, t, k, ST_F32, NULL);
	for (int i = 0; i <= n; i++)
		free(data[i]);
	free(data);
	free(t);
	st_close(f);
	free(path);
	return dir;
}

TEST(missing_extra_and_misshapen_tensors_are_refused)
{
	char *d = weights_edited("h.1.ln_2.bias", NULL, NULL);
	CHECK(refused(d, "missing tensor 'h.1.ln_2.bias'"));
	free(d);
	d = weights_edited(NULL, "h.0.attn.rotary", NULL);
	CHECK(refused(d, "unexpected tensor 'h.0.attn.rotary'"));
	free(d);
	d = weights_edited(NULL, "lm_head.weight", NULL);
	CHECK(refused(d, "tie_word_embeddings is true"));
	free(d);
	d = weights_edited(NULL, NULL, "h.0.mlp.c_fc.weight");
	CHECK(refused(d, "tensor 'h.0.mlp.c_fc.weight' has shape [64, 16], expected [16, 64]"));
	free(d);
	/* sharded: the index names a tensor its shard lacks */
	REFUSE("llama", "model.safetensors.index.json", "\"model.norm.weight\"",
	       "\"model.normal.weight\"", "tensor 'model.normal.weight' is not in shard");
}

TEST(corrupt_files_are_refused_naming_them)
{
	char *d = edited("gpt2", "", NULL, NULL), *p = path_join(d, "model.safetensors");
	struct buf b = {0};
	CHECK(read_file(p, &b) == 0);
	spit(p, (const char *)b.data, b.len - 10);
	CHECK(refused(d, "model.safetensors: the tensors hold"));
	spit(p, (const char *)b.data, 100);
	CHECK(refused(d, "does not fit the file"));
	buf_free(&b);
	free(p);
	free(d);
	REFUSE("gpt2", "config.json", "\"n_layer\": 2,", "\"n_layer\": 2,,", "config.json:8:");
	REFUSE("gpt2", "tokenizer.json", "\"version\"", "version", "tokenizer.json:2:");
	REFUSE("gpt2", "model.safetensors", "\"F32\"", "\"I64\"", "dtype I64");
}

TEST(tokenizers_we_cannot_reproduce_are_refused)
{
	REFUSE("llama", "tokenizer.json", "\"pretokenizers\": [",
	       "\"pretokenizers\": [{\"type\": \"Digits\", \"individual_digits\": false}, ",
	       "pre_tokenizer.pretokenizers[0].individual_digits: Digits with individual_digits "
	       "false is not implemented");
	REFUSE("gpt2", "tokenizer.json", "\"normalizer\": null",
	       "\"normalizer\": {\"type\": \"NFKC\"}", "normalizer 'NFKC' is not implemented");
	REFUSE("gpt2", "tokenizer.json", "\"type\": \"BPE\"", "\"type\": \"Unigram\"",
	       "model type 'Unigram' is not implemented");
	REFUSE("gpt2", "tokenizer.json", "\"add_prefix_space\": false", "\"add_prefix_space\": true",
	       "add_prefix_space true");
	REFUSE("gpt2", "tokenizer.json", "\"lstrip\": false", "\"lstrip\": true",
	       "added_tokens[0].lstrip: an added token with lstrip true is not implemented");
	REFUSE("llama", "tokenizer.json", "\"post_processor\": null",
	       "\"post_processor\": {\"type\": \"TemplateProcessing\"}",
	       "post_processor.single: a template other than [SpecialToken, Sequence A]");
	REFUSE("gpt2", "tokenizer.json", "\"i n\"", "\"i x\"", "merge 3 ('i' 'x')");
}
