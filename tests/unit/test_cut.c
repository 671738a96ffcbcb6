/* test_cut.c - pipeline cuts: the balanced chooser against a brute-force
 * search, the cost model against model_flops_per_token, pipeline.layers
 * parsing and every message of cut_from_config. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/config/config.h"
#include "../../io/util.h"
#include "../../model/cut.h"
#include "../../model/model.h"
#include "../test.h"

/* The largest stage cost of counts (the chooser's objective). */
static double max_cost(const int *n, int S, double f0, double f1, double layer)
{
	double worst = 0;
	for (int s = 0; s < S; s++) {
		double c = n[s] * layer + (s == 0 ? f0 : 0) + (s == S - 1 ? f1 : 0);
		worst = MAX(worst, c);
	}
	return worst;
}

/* The least largest cost over every valid count vector (middle stages at
 * least one layer), by enumeration. */
static double brute_force(int L, int S, double f0, double f1, double layer)
{
	int n[8] = {0};
	double best = INFINITY;
	for (;;) {
		int sum = 0, ok = 1;
		for (int s = 0; s < S - 1; s++) {
			sum += n[s];
			ok &= n[s] >= (s > 0);
		}
		n[S - 1] = L - sum;
		if (ok && n[S - 1] >= 0)
			best = MIN(best, max_cost(n, S, f0, f1, layer));
		/* next vector of the first S - 1 counts, each 0..L */
		int s = 0;
		while (s < S - 1 && ++n[s] > L)
			n[s++] = 0;
		if (s == S - 1)
			return best;
	}
}

TEST(balanced_chooser_matches_brute_force)
{
	uint64_t rs = 17;
	int cases = 0;
	for (int S = 1; S <= 5; S++)
		for (int L = MAX(1, S - 2); L <= 8; L++)
			for (int trial = 0; trial < 12; trial++) {
				/* fixed costs from nothing to several layers, some exact ties */
				double layer = 1.0 + (double)(rng_next(&rs) % 4);
				double f0 = trial % 3 ? (double)(rng_next(&rs) % 1000) / 100.0 : 0;
				double f1 = trial % 4 ? (double)(rng_next(&rs) % 2500) / 100.0
						      : layer * (double)(trial % 3);
				int n[8];
				CHECK(cut_balance_counts(f0, f1, layer, L, S, n) == 0);
				int sum = 0;
				for (int s = 0; s < S; s++) {
					sum += n[s];
					CHECK_MSG(n[s] >= (s > 0 && s < S - 1), "L=%d S=%d: stage %d gets %d",
						  L, S, s, n[s]);
				}
				CHECK_MSG(sum == L, "L=%d S=%d: %d layers handed out", L, S, sum);
				double got = max_cost(n, S, f0, f1, layer);
				double want = brute_force(L, S, f0, f1, layer);
				CHECK_MSG(got == want, "L=%d S=%d f0=%g f1=%g layer=%g: max %g, best %g", L,
					  S, f0, f1, layer, got, want);
				cases++;
				if (test_failed())
					return;
			}
	CHECK(cases > 400);
	/* impossible requests */
	int n[8];
	CHECK(cut_balance_counts(0, 0, 1, 2, 5, n) == -1); /* 3 middle stages, 2 layers */
	CHECK(cut_balance_counts(0, 0, 0, 4, 2, n) == -1); /* free layers */
	CHECK(cut_balance_counts(-1, 0, 1, 4, 2, n) == -1);
}

TEST(balanced_with_no_fixed_cost_is_even)
{
	for (int S = 1; S <= 6; S++)
		for (int L = S; L <= 13; L++) {
			int n[8];
			struct stage_cut even;
			CHECK(cut_even(&even, L, S) == 0);
			CHECK(cut_balance_counts(0, 0, 3, L, S, n) == 0);
			for (int s = 0; s < S; s++)
				CHECK_MSG(n[s] == cut_layers(&even, s), "L=%d S=%d stage %d: %d vs %d", L,
					  S, s, n[s], cut_layers(&even, s));
			cut_free(&even);
		}
}

static struct model_config gpt2_124m(void)
{
	struct model_config c = {.arch = ARCH_GPT2, .V = 50257, .L = 12, .C = 768, .NH = 12,
				 .T = 1024, .tied = 1};
	return c;
}

/* GPT-2 124M over 4 stages: the head (6 * 50304 * 768 FLOPs a token, about
 * 4.9 layers) gets a stage of its own. */
TEST(balanced_gpt2_124m)
{
	struct model_config c = gpt2_124m();
	struct model m;
	struct stage_cut cut;
	char buf[64];
	CHECK(model_init(&m, &c) == 0);
	struct cut_costs k;
	cut_model_costs(&m, &k);
	CHECK(k.first == 0);
	CHECK_MSG(k.last / k.layer > 4.8 && k.last / k.layer < 5.0, "head = %.3f layers",
		  k.last / k.layer);
	CHECK(cut_balanced(&cut, &m, 4) == 0);
	cut_format(&cut, buf, sizeof(buf));
	CHECK_MSG(!strcmp(buf, "4,4,4,0"), "balanced cut %s", buf);
	cut_free(&cut);
	CHECK(cut_balanced(&cut, &m, 2) == 0);
	cut_format(&cut, buf, sizeof(buf));
	CHECK_MSG(!strcmp(buf, "8,4"), "balanced cut %s", buf);
	cut_free(&cut);
	model_free(&m);
}

/* Summed over the stages of any cut, the cost model is
 * model_flops_per_token: tied and untied, both architectures. */
TEST(stage_flops_sum_to_model_flops)
{
	static const char *const lists[] = {"5", "3,2", "0,5", "5,0", "0,4,1", "1,1,1,2", "0,3,2,0"};
	for (int arch = 0; arch < 2; arch++)
		for (int tied = 0; tied <= 1; tied++) {
			struct model_config c = {.arch = arch ? ARCH_GPT2 : ARCH_LLAMA, .V = 300,
						 .L = 5, .C = 64, .NH = 4, .T = 32, .tied = tied};
			struct model m;
			CHECK(model_init(&m, &c) == 0);
			double want = model_flops_per_token(&m);
			for (size_t i = 0; i < ARRAY_SIZE(lists); i++) {
				int n[8];
				char err[64];
				int S = cut_parse_list(lists[i], n, 8, err, sizeof(err));
				struct stage_cut cut;
				CHECK(cut_from_counts(&cut, c.L, n, S) == 0);
				double sum = 0;
				for (int s = 0; s < S; s++)
					sum += cut_stage_flops(&m, &cut, s);
				CHECK_MSG(fabs(sum - want) <= 1e-12 * want, "arch %d tied %d cut %s: %.17g vs "
					  "%.17g", arch, tied, lists[i], sum, want);
				cut_free(&cut);
			}
			model_free(&m);
		}
}

TEST(layer_lists_parse)
{
	int n[8];
	char err[96];
	CHECK(cut_parse_list("3,4,4,2", n, 8, err, sizeof(err)) == 4);
	CHECK(n[0] == 3 && n[1] == 4 && n[2] == 4 && n[3] == 2);
	CHECK(cut_parse_list(" 0 , 12,\t0", n, 8, err, sizeof(err)) == 3);
	CHECK(n[0] == 0 && n[1] == 12 && n[2] == 0);
	static const struct {
		const char *list, *bad;
	} bad[] = {{"3,x,4", "'x'"}, {"3,,4", "''"}, {"3,4,", "''"}, {"-1,5", "'-1'"},
		   {"2.5,1", "'2.5'"}, {"3 4", "'3 4'"}, {"", "''"}, {"1,99999999999", "'99999999999'"}};
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		CHECK_MSG(cut_parse_list(bad[i].list, n, 8, err, sizeof(err)) == -1, "'%s' parsed",
			  bad[i].list);
		CHECK_MSG(strstr(err, bad[i].bad) && strstr(err, "is not a number of layers"),
			  "'%s': %s", bad[i].list, err);
	}
}

/* cut_from_config on a 12-layer model must fail naming the keys and the
 * fix; message fragments in want. */
static void config_fails(const char *split, const char *layers, int stages, const char *want1,
			 const char *want2)
{
	struct config cfg;
	struct model_config c = gpt2_124m();
	struct model m;
	struct stage_cut cut;
	char n[16];
	CHECK(model_init(&m, &c) == 0);
	config_defaults(&cfg);
	snprintf(n, sizeof(n), "%d", stages);
	CHECK(config_set_key(&cfg, "pipeline", "split", split, "test") == 0);
	CHECK(config_set_key(&cfg, "pipeline", "layers", layers, "test") == 0);
	CHECK(config_set_key(&cfg, "pipeline", "stages", n, "test") == 0);
	set_error_quiet(1);
	int rc = cut_from_config(&cut, &cfg, &m);
	set_error_quiet(0);
	CHECK_MSG(rc == -1, "split %s layers '%s' stages %d accepted", split, layers, stages);
	CHECK_MSG(strstr(last_error(), want1) && strstr(last_error(), want2),
		  "split %s layers '%s' stages %d: %s", split, layers, stages, last_error());
	config_free(&cfg);
	model_free(&m);
}

TEST(bad_cuts_are_named)
{
	config_fails("layers", "3,4,4", 4, "pipeline.layers = 3,4,4 lists 3 stages, but "
		     "pipeline.stages = 4", "one layer count per stage");
	config_fails("layers", "3,4,4,1,0", 4, "lists 5 stages, but pipeline.stages = 4",
		     "one layer count per stage");
	config_fails("layers", "3,4,4,2", 4, "pipeline.layers = 3,4,4,2 sums to 13 layers, but "
		     "model.n_layer = 12", "must add up to model.n_layer");
	config_fails("layers", "3,x,4,5", 4, "pipeline.layers = 3,x,4,5: 'x' is not a number of "
		     "layers", "e.g. 3,4,4,2");
	config_fails("layers", "6,0,6", 3, "gives stage 1 no layer", "only the first stage");
	config_fails("layers", "", 4, "pipeline.split = layers needs pipeline.layers",
		     "one layer count per stage");
	config_fails("even", "6,6", 2, "pipeline.layers = 6,6 is set, but pipeline.split = even",
		     "set pipeline.split = layers");
	config_fails("balanced", "6,6", 2, "but pipeline.split = balanced", "pipeline.split = layers");
	config_fails("even", "", 13, "pipeline.stages = 13: must be between 1 and model.n_layer (12)",
		     "pipeline.split = even");
	config_fails("balanced", "", 15, "pipeline.stages = 15: pipeline.split = balanced needs at "
		     "most model.n_layer + 2 = 14 stages", "every middle stage needs a layer");
}

/* An uneven cut is named with the split to use; the balanced one is not */
TEST(uneven_cut_advised)
{
	struct model_config c = gpt2_124m();
	struct model m;
	struct stage_cut cut;
	char msg[400];
	CHECK(model_init(&m, &c) == 0);
	CHECK(cut_even(&cut, 12, 4) == 0);
	CHECK(cut_advice(&cut, &m, "even", msg, sizeof(msg)) == 1);
	CHECK_MSG(strstr(msg, "pipeline.split = even (layers 3,3,3,3) models stage 0 at ") &&
		  strstr(msg, "of stage 3's cost (the last stage holds the head)") &&
		  strstr(msg, "set pipeline.split = balanced (layers 4,4,4,0: "), "%s", msg);
	cut_free(&cut);
	CHECK(cut_balanced(&cut, &m, 4) == 0);
	CHECK(cut_advice(&cut, &m, "balanced", msg, sizeof(msg)) == 0);
	cut_free(&cut);
	int listed[2] = {9, 3}; /* 9 layers, 3 and the head: within 20% */
	CHECK(cut_from_counts(&cut, 12, listed, 2) == 0);
	CHECK(cut_advice(&cut, &m, "layers", msg, sizeof(msg)) == 0);
	cut_free(&cut);
	listed[0] = 6, listed[1] = 6;
	CHECK(cut_from_counts(&cut, 12, listed, 2) == 0);
	CHECK(cut_advice(&cut, &m, "layers", msg, sizeof(msg)) == 1);
	CHECK_MSG(strstr(msg, "pipeline.split = layers (layers 6,6) models stage 0 at "), "%s", msg);
	cut_free(&cut);
	model_free(&m);
}

TEST(good_cuts_from_config)
{
	struct config cfg;
	struct model_config c = gpt2_124m();
	struct model m;
	struct stage_cut cut;
	char buf[64];
	CHECK(model_init(&m, &c) == 0);
	config_defaults(&cfg);
	CHECK(config_set_key(&cfg, "pipeline", "stages", "5", "test") == 0);
	CHECK(cut_from_config(&cut, &cfg, &m) == 0); /* the default: balanced */
	cut_format(&cut, buf, sizeof(buf));
	CHECK_MSG(!strcmp(buf, "3,3,3,3,0"), "%s", buf);
	cut_free(&cut);
	CHECK(config_set_key(&cfg, "pipeline", "split", "even", "test") == 0);
	CHECK(cut_from_config(&cut, &cfg, &m) == 0);
	cut_format(&cut, buf, sizeof(buf));
	CHECK_MSG(!strcmp(buf, "3,3,2,2,2"), "%s", buf);
	cut_free(&cut);
	CHECK(config_set_key(&cfg, "pipeline", "split", "layers", "test") == 0);
	CHECK(config_set_key(&cfg, "pipeline", "layers", "0, 4,4,4 ,0", "test") == 0);
	CHECK(cut_from_config(&cut, &cfg, &m) == 0);
	CHECK(cut.S == 5 && cut.first[1] == 0 && cut.first[4] == 12 && cut_layers(&cut, 4) == 0);
	cut_free(&cut);
	/* 14 stages of a 12-layer model: only with empty ends */
	CHECK(config_set_key(&cfg, "pipeline", "split", "balanced", "test") == 0);
	CHECK(config_set_key(&cfg, "pipeline", "layers", "", "test") == 0);
	CHECK(config_set_key(&cfg, "pipeline", "stages", "14", "test") == 0);
	CHECK(cut_from_config(&cut, &cfg, &m) == 0);
	cut_format(&cut, buf, sizeof(buf));
	CHECK_MSG(!strcmp(buf, "0,1,1,1,1,1,1,1,1,1,1,1,1,0"), "%s", buf);
	cut_free(&cut);
	config_free(&cfg);
	model_free(&m);
}
