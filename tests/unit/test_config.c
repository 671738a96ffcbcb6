/* test_config.c - the INI configuration: defaults, errors with file:line,
 * inih's quirks, --set, and print -> load round trips. */
#include <stdlib.h>
#include <string.h>

#include "../../io/config/config.h"
#include "../../io/util.h"
#include "../test.h"

/* The last error without the "asyncpp: " that error() prints before it. */
static const char *err(void)
{
	const char *msg = last_error();
	return strncmp(msg, "asyncpp: ", 9) ? msg : msg + 9;
}

/* Load text over the defaults; returns the rc, with the error in last_error(). */
static int load(struct config *cfg, const char *text)
{
	config_defaults(cfg);
	set_error_quiet(1);
	int rc = config_load_string(cfg, text, "run.ini");
	set_error_quiet(0);
	return rc;
}

/* Loading must fail with exactly this message (after "asyncpp: "). */
static int fails_with(const char *text, const char *want)
{
	struct config cfg;
	int rc = load(&cfg, text);
	config_free(&cfg);
	if (rc != -1) {
		fprintf(stderr, "loaded without error:\n%s\n", text);
		return 0;
	}
	const char *msg = last_error();
	if (!strncmp(msg, "asyncpp: ", 9))
		msg += 9;
	if (strcmp(msg, want)) {
		fprintf(stderr, "got  '%s'\nwant '%s'\n", msg, want);
		return 0;
	}
	return 1;
}

/* The error message must start with want. */
static int fails_starting(const char *text, const char *want)
{
	struct config cfg;
	int rc = load(&cfg, text);
	config_free(&cfg);
	const char *msg = last_error();
	if (!strncmp(msg, "asyncpp: ", 9))
		msg += 9;
	if (rc != -1 || strncmp(msg, want, strlen(want))) {
		fprintf(stderr, "rc %d, got '%s'\nwant prefix '%s'\n", rc, msg, want);
		return 0;
	}
	return 1;
}

TEST(defaults_match_table)
{
	struct config cfg;
	config_defaults(&cfg);
	CHECK(cfg.model_n_layer == 4);
	CHECK(cfg.train_steps == 300);
	CHECK_NEAR(cfg.optim_lr, 3e-3, 0);
	CHECK(!strcmp(cfg.model_arch, "llama"));
	CHECK(!strcmp(cfg.data_train, ""));
	CHECK(!strcmp(cfg.train_out_dir, "runs/default"));
	config_free(&cfg);
}

/* Every default must parse under its own key's type, so the table cannot
 * hold a bad default; and it must print back as itself (modulo float
 * spelling). */
TEST(every_default_parses)
{
	struct config cfg;
	config_defaults(&cfg);
	set_error_quiet(1);
	for (int i = 0; i < config_key_count; i++) {
		const struct config_key_info *k = &config_key_table[i];
		int rc = config_set_key(&cfg, k->section, k->key, k->def, "config_keys.h");
		CHECK_MSG(rc == 0, "default of %s.%s: %s", k->section, k->key, last_error());
		CHECK_MSG(config_key_lookup(k->section, k->key) == k, "lookup %s.%s", k->section,
			  k->key);
		CHECK_MSG(k->help && *k->help, "%s.%s has no help", k->section, k->key);
		CHECK(!strcmp(k->type, "int") || !strcmp(k->type, "float") ||
		      !strcmp(k->type, "string") || !strcmp(k->type, "choice"));
		CHECK((k->choices != NULL) == !strcmp(k->type, "choice"));
		char *v = config_get_string(&cfg, k->section, k->key);
		if (!strcmp(k->type, "float"))
			CHECK_MSG(strtod(v, NULL) == strtod(k->def, NULL), "%s.%s", k->section, k->key);
		else
			CHECK_MSG(!strcmp(v, k->def), "%s.%s prints '%s', default '%s'", k->section,
				  k->key, v, k->def);
		free(v);
	}
	set_error_quiet(0);
	config_free(&cfg);
}

TEST(no_duplicate_keys)
{
	for (int i = 0; i < config_key_count; i++)
		for (int j = i + 1; j < config_key_count; j++)
			CHECK_MSG(strcmp(config_key_table[i].section, config_key_table[j].section) ||
					  strcmp(config_key_table[i].key, config_key_table[j].key),
				  "%s.%s declared twice", config_key_table[i].section,
				  config_key_table[i].key);
}

TEST(load_values)
{
	struct config cfg;
	CHECK(load(&cfg,
		   "; a comment\n"
		   "# another\n"
		   "\n"
		   "[model]\n"
		   "n_layer = 6\n"
		   "arch=gpt2\n"
		   "norm_eps = 1e-6\n"
		   "[optim]\r\n"
		   "lr = 0.01\r\n"
		   "name: muon\n"
		   "[data]\n"
		   "train = shards/train-*.zst\n"
		   "val =\n") == 0);
	CHECK(cfg.model_n_layer == 6);
	CHECK(!strcmp(cfg.model_arch, "gpt2"));
	CHECK_NEAR(cfg.model_norm_eps, 1e-6, 0);
	CHECK_NEAR(cfg.optim_lr, 0.01, 0);
	CHECK(!strcmp(cfg.optim_name, "muon"));
	CHECK(!strcmp(cfg.data_train, "shards/train-*.zst"));
	CHECK(!strcmp(cfg.data_val, ""));
	CHECK(cfg.train_steps == 300); /* untouched keys keep their defaults */
	config_free(&cfg);
}

TEST(error_unknown_section)
{
	CHECK(fails_with("[model]\nn_layer = 2\n[optimizer]\nlr = 1\n",
			 "run.ini:3: unknown section [optimizer]; did you mean [optim]? The "
			 "sections are model, data, train, optim, pipeline, eval, sample, log, "
			 "checkpoint"));
	CHECK(fails_with("[modle]\n", "run.ini:1: unknown section [modle]; did you mean [model]? "
			 "The sections are model, data, train, optim, pipeline, eval, sample, log, "
			 "checkpoint"));
	CHECK(fails_with("[zzz]\n", "run.ini:1: unknown section [zzz]; sections are model, data, "
			 "train, optim, pipeline, eval, sample, log, checkpoint"));
}

TEST(error_unknown_key)
{
	CHECK(fails_with("[optim]\n\n\n\n\n\n\n\n\n\n\nlr_max = 1\n",
			 "run.ini:12: unknown key 'lr_max' in [optim]"));
	CHECK(fails_with("[train]\nlr = 1\n",
			 "run.ini:2: unknown key 'lr' in [train]; it belongs in [optim]"));
	/* the nearest keys of the section, else of every section */
	CHECK(fails_with("[optim]\nnme = muon\n",
			 "run.ini:2: unknown key 'nme' in [optim]; did you mean 'name'?"));
	CHECK(fails_with("[train]\nbach_size = 4\n",
			 "run.ini:2: unknown key 'bach_size' in [train]; did you mean "
			 "'batch_size'?"));
	CHECK(fails_with("[model]\nstpes = 4\n",
			 "run.ini:2: unknown key 'stpes' in [model]; did you mean train.steps?"));
	CHECK(fails_with("[train]\nevery = 4\n", "run.ini:2: unknown key 'every' in [train]; it "
			 "belongs in [eval], [sample], [log] or [checkpoint]"));
}

TEST(error_bad_values)
{
	CHECK(fails_with("[optim]\n\n\n\n\n\nlr = fast\n",
			 "run.ini:7: optim.lr: expected a number, got 'fast'"));
	CHECK(fails_with("[model]\nn_layer = 4.5\n",
			 "run.ini:2: model.n_layer: expected an integer, got '4.5'"));
	CHECK(fails_with("[model]\nn_layer =\n",
			 "run.ini:2: model.n_layer: expected an integer, got ''"));
	CHECK(fails_with("[model]\nn_layer = 99999999999999999999999\n",
			 "run.ini:2: model.n_layer: expected an integer, got '99999999999999999999999'"));
	CHECK(fails_with("[optim]\nlr = nan\n", "run.ini:2: optim.lr: expected a number, got 'nan'"));
	CHECK(fails_with("[optim]\nlr = inf\n", "run.ini:2: optim.lr: expected a number, got 'inf'"));
	CHECK(fails_with("[optim]\nlr = 1e999\n",
			 "run.ini:2: optim.lr: expected a number, got '1e999'"));
}

/* The yes/no keys (0..1) read true/false, yes/no, on/off in any case;
 * they print as 0 and 1, so a printed config reads back the same. */
TEST(booleans_read_as_words)
{
	struct config c;
	config_defaults(&c);
	CHECK(config_load_string(&c, "[model]\ntied = False\n[optim]\nnesterov = yes\n", "b.ini") == 0);
	CHECK(c.model_tied == 0 && c.optim_nesterov == 1);
	CHECK(config_set(&c, "model.tied=ON") == 0 && c.model_tied == 1);
	char *s = config_to_string(&c);
	CHECK(strstr(s, "tied = 1\n") != NULL);
	free(s);
	config_free(&c);
	CHECK(fails_with("[model]\ntied = maybe\n",
			 "run.ini:2: model.tied: expected 0, 1, true or false, got 'maybe'"));
	/* not for the other integer keys */
	CHECK(fails_with("[model]\nn_layer = true\n",
			 "run.ini:2: model.n_layer: expected an integer, got 'true'"));
}

TEST(error_bad_choice)
{
	CHECK(fails_with("[train]\nschedule = zerobubble\n",
			 "run.ini:2: train.schedule: expected one of none, gpipe, 1f1b, 2bw, "
			 "pipedream, interleaved, zb-h1, zb-v, 2bw-zb; got 'zerobubble'"));
	/* Choices match whole words, not prefixes. */
	CHECK(fails_starting("[train]\nschedule = gpip\n", "run.ini:2: train.schedule:"));
	CHECK(fails_starting("[train]\nschedule = GPIPE\n", "run.ini:2: train.schedule:"));
}

TEST(error_key_outside_section)
{
	CHECK(fails_with("# header\nsteps = 5\n[train]\n",
			 "run.ini:2: key 'steps' outside a section; put it under a [train] line"));
	CHECK(fails_with("stpes = 5\n[train]\n",
			 "run.ini:1: key 'stpes' outside a section; put it under a [section] "
			 "line"));
}

TEST(error_syntax)
{
	CHECK(fails_with("[model]\njust some words\n",
			 "run.ini:2: expected 'key = value' or '[section]', got 'just some words'"));
	CHECK(fails_with("[model\nn_layer = 2\n",
			 "run.ini:1: bad section header '[model'; expected [name]"));
	CHECK(fails_with("[model] extra\n", "run.ini:1: unexpected text after [model]"));
	CHECK(fails_with("[]\n", "run.ini:1: bad section header '[]'; expected [name]"));
	CHECK(fails_with("[model]\n= 3\n", "run.ini:2: missing key name before '='"));
	CHECK(fails_with("[model]\nn_layer = 2\nn_layer = 3\n",
			 "run.ini:3: model.n_layer is set twice (first at line 2)"));
}

/* inih's buffer is 200 bytes: a longer line must be an error, not cut in two
 * (the tail would be read as a line of its own). */
TEST(quirk_long_line)
{
	char text[512];
	char pad[300];
	memset(pad, 'x', 250);
	pad[250] = '\0';
	snprintf(text, sizeof(text), "[data]\ntrain = %s\n", pad);
	CHECK(fails_with(text, "run.ini:2: line is 258 bytes long; the limit is 197"));
	/* A long comment is just as long. */
	snprintf(text, sizeof(text), "[data]\n# %s\n", pad);
	CHECK(fails_starting(text, "run.ini:2: line is 252 bytes long"));
	/* 197 bytes is fine. */
	memset(pad, 'y', 189);
	pad[189] = '\0';
	snprintf(text, sizeof(text), "[data]\ntrain = %s\n", pad);
	CHECK(strlen(text) == 7 + 197 + 1);
	struct config cfg;
	CHECK(load(&cfg, text) == 0);
	CHECK(strlen(cfg.data_train) == 189);
	config_free(&cfg);
}

/* inih reads an indented line after "key = v" as a continuation and calls
 * the handler again with the same key: that must never change a value. */
TEST(quirk_indented_line)
{
	CHECK(fails_with("[optim]\nlr = 0.01\n    0.5\n",
			 "run.ini:3: expected 'key = value' or '[section]', got '0.5' (an indented "
			 "line does not continue the previous one)"));
	/* Indented "key = value" lines are ordinary keys. */
	struct config cfg;
	CHECK(load(&cfg, "[optim]\n  lr = 0.01\n\twarmup = 7\n") == 0);
	CHECK_NEAR(cfg.optim_lr, 0.01, 0);
	CHECK(cfg.optim_warmup == 7);
	config_free(&cfg);
	/* ... and an indented repeat of a key is still a duplicate. */
	CHECK(fails_with("[optim]\nlr = 0.01\n  lr = 0.5\n",
			 "run.ini:3: optim.lr is set twice (first at line 2)"));
}

/* inih does not strip "#" after a value; we do, like ";". */
TEST(quirk_inline_comment)
{
	struct config cfg;
	CHECK(load(&cfg, "[model]\nn_layer = 3 # three\nd_model = 64 ; width\n"
			 "[data]\ntrain = a#b.zst   # the '#' inside stays\n") == 0);
	CHECK(cfg.model_n_layer == 3);
	CHECK(cfg.model_d_model == 64);
	CHECK(!strcmp(cfg.data_train, "a#b.zst"));
	config_free(&cfg);
	CHECK(load(&cfg, "[model] # the model\nn_layer = 5\n") == 0);
	CHECK(cfg.model_n_layer == 5);
	config_free(&cfg);
}

TEST(quirk_bom_and_crlf)
{
	struct config cfg;
	CHECK(load(&cfg, "\xef\xbb\xbf[model]\r\nn_layer = 9\r\n") == 0);
	CHECK(cfg.model_n_layer == 9);
	config_free(&cfg);
}

/* A failed load leaves the configuration as it was. */
TEST(failed_load_changes_nothing)
{
	struct config cfg;
	config_defaults(&cfg);
	set_error_quiet(1);
	CHECK(config_load_string(&cfg, "[model]\nn_layer = 7\narch = gpt2\n[optim]\nlr = x\n",
				 "run.ini") == -1);
	set_error_quiet(0);
	CHECK(cfg.model_n_layer == 4);
	CHECK(!strcmp(cfg.model_arch, "llama"));
	config_free(&cfg);
}

TEST(many_errors_stop)
{
	struct buf b = {0};
	buf_append(&b, "[model]\n", 8);
	for (int i = 0; i < 100; i++)
		buf_append(&b, "bogus = 1\n", 10);
	buf_append(&b, "", 1);
	struct config cfg;
	CHECK(load(&cfg, (char *)b.data) == -1);
	CHECK(strstr(last_error(), "too many errors") != NULL);
	config_free(&cfg);
	buf_free(&b);
}

TEST(load_file_names_path)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/bad.ini", test_tmpdir());
	FILE *fp = fopen(path, "w");
	CHECK(fp);
	fputs("[train]\nsteps = 10\nthreads = many\n", fp);
	fclose(fp);
	struct config cfg;
	config_defaults(&cfg);
	set_error_quiet(1);
	CHECK(config_load_file(&cfg, path) == -1);
	char want[600];
	snprintf(want, sizeof(want), "%s:3: train.threads: expected an integer, got 'many'",
		 path);
	CHECK_MSG(!strcmp(err(), want), "got '%s'", err());
	char missing[512];
	snprintf(missing, sizeof(missing), "%s/none.ini", test_tmpdir());
	CHECK(config_load_file(&cfg, missing) == -1);
	CHECK(strstr(last_error(), "none.ini") != NULL);
	set_error_quiet(0);
	config_free(&cfg);
}

/* A file holding a NUL byte is rejected at its line. */
TEST(load_file_nul_byte)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/nul.ini", test_tmpdir());
	FILE *fp = fopen(path, "wb");
	CHECK(fp);
	fwrite("[train]\nsteps = 1\0 0\n", 1, 21, fp);
	fclose(fp);
	struct config cfg;
	config_defaults(&cfg);
	set_error_quiet(1);
	CHECK(config_load_file(&cfg, path) == -1);
	set_error_quiet(0);
	CHECK(strstr(last_error(), "nul.ini:2: line contains a NUL byte") != NULL);
	config_free(&cfg);
}

TEST(set_values)
{
	struct config cfg;
	config_defaults(&cfg);
	CHECK(config_set(&cfg, "optim.lr=0.5") == 0);
	CHECK_NEAR(cfg.optim_lr, 0.5, 0);
	CHECK(config_set(&cfg, " train.schedule = 2bw ") == 0);
	CHECK(!strcmp(cfg.train_schedule, "2bw"));
	CHECK(config_set(&cfg, "data.train=a=b.zst") == 0); /* first '=' splits */
	CHECK(!strcmp(cfg.data_train, "a=b.zst"));
	set_error_quiet(1);
	CHECK(config_set(&cfg, "optim.lr") == -1);
	CHECK(!strcmp(err(), "--set: expected SECTION.KEY=VALUE, got 'optim.lr'"));
	CHECK(config_set(&cfg, "lr=1") == -1);
	CHECK(!strcmp(err(), "--set: expected SECTION.KEY=VALUE, got 'lr=1'; did you mean "
			     "optim.lr=1?"));
	CHECK(config_set(&cfg, "qqqq=1") == -1);
	CHECK(!strcmp(err(), "--set: expected SECTION.KEY=VALUE, got 'qqqq=1'"));
	CHECK(config_set(&cfg, ".lr=1") == -1);
	CHECK(config_set(&cfg, "optim.lr=fast") == -1);
	CHECK(!strcmp(err(), "--set: optim.lr: expected a number, got 'fast'"));
	CHECK(config_set(&cfg, "optim.lr_max=1") == -1);
	CHECK(!strcmp(err(), "--set: unknown key 'lr_max' in [optim]"));
	CHECK(config_set(&cfg, "optimizer.lr=1") == -1);
	CHECK(!strncmp(err(), "--set: unknown section [optimizer]; did you mean [optim]? The "
			      "sections are", 69));
	CHECK(config_set(&cfg, "optim.name=adam") == -1);
	CHECK(!strncmp(err(), "--set: optim.name: expected one of adamw, muon, lion, sgd, ", 59));
	CHECK(strstr(err(), "; got 'adam'"));
	/* Strings that could not be written back to a file are refused. */
	CHECK(config_set(&cfg, "data.train=a #b") == -1);
	CHECK(strstr(last_error(), "--set: data.train: cannot use this value") != NULL);
	CHECK(config_set(&cfg, "data.train=#x") == -1);
	CHECK(config_set(&cfg, "data.train=a\nb") == -1);
	set_error_quiet(0);
	CHECK(!strcmp(cfg.data_train, "a=b.zst")); /* failed sets changed nothing */
	CHECK_NEAR(cfg.optim_lr, 0.5, 0);
	config_free(&cfg);
}

/* Defaults, then the file, then each --set in order: the last one wins. */
TEST(from_args_precedence)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/run.ini", test_tmpdir());
	FILE *fp = fopen(path, "w");
	CHECK(fp);
	fputs("[train]\nsteps = 10\nbatch_size = 2\n[optim]\nlr = 0.1\n", fp);
	fclose(fp);
	const char *sets[] = {"train.steps=20", "optim.name=muon", "train.steps=30"};
	struct config cfg;
	CHECK(config_from_args(&cfg, path, sets, 3) == 0);
	CHECK(cfg.train_steps == 30);            /* --set over file, later over earlier */
	CHECK(cfg.train_batch_size == 2);        /* file over default */
	CHECK_NEAR(cfg.optim_lr, 0.1, 0);        /* file */
	CHECK(!strcmp(cfg.optim_name, "muon"));  /* --set over default */
	CHECK(cfg.model_n_layer == 4);           /* default */
	config_free(&cfg);

	CHECK(config_from_args(&cfg, NULL, NULL, 0) == 0);
	CHECK(cfg.train_steps == 300);
	config_free(&cfg);

	const char *bad[] = {"train.steps=x"};
	set_error_quiet(1);
	CHECK(config_from_args(&cfg, path, bad, 1) == -1);
	CHECK(!strcmp(err(), "--set: train.steps: expected an integer, got 'x'"));
	set_error_quiet(0);
	config_free(&cfg); /* harmless after a failure */
}

/* Change every key away from its default, print, load: the same struct. */
static void perturb(struct config *cfg)
{
	for (int i = 0; i < config_key_count; i++) {
		const struct config_key_info *k = &config_key_table[i];
		char v[128];
		/* numbers move within their key's range, so every set succeeds */
		if (!strcmp(k->type, "int")) {
			long x = strtol(k->def, NULL, 10) * 3 + 7 + i;
			snprintf(v, sizeof(v), "%ld", x > k->hi ? (long)k->hi - (x % 2 && k->hi > k->lo) : x);
		} else if (!strcmp(k->type, "float")) {
			double x = strtod(k->def, NULL) / 3.0 + 0.1 * i;
			snprintf(v, sizeof(v), "%.17g", x > k->hi ? k->lo + (k->hi - k->lo) / 3.0 : x);
		} else if (!strcmp(k->type, "choice")) {
			const char *last = strrchr(k->choices, '|');
			snprintf(v, sizeof(v), "%s", last ? last + 1 : k->choices);
		} else {
			snprintf(v, sizeof(v), "some dir/%s_%d#x;y.zst", k->key, i);
		}
		if (config_set_key(cfg, k->section, k->key, v, "test"))
			test_fail(__FILE__, __LINE__, "perturb: %s", last_error());
	}
}

static int configs_equal(const struct config *a, const struct config *b)
{
	for (int i = 0; i < config_key_count; i++) {
		const struct config_key_info *k = &config_key_table[i];
		char *va = config_get_string(a, k->section, k->key);
		char *vb = config_get_string(b, k->section, k->key);
		int same = !strcmp(va, vb);
		if (!same)
			fprintf(stderr, "%s.%s: '%s' != '%s'\n", k->section, k->key, va, vb);
		free(va);
		free(vb);
		if (!same)
			return 0;
	}
	return 1;
}

TEST(round_trip_print_load)
{
	struct config a, b;
	config_defaults(&a);
	perturb(&a);
	CHECK(a.optim_lr != 3e-3);
	char path[512];
	snprintf(path, sizeof(path), "%s/printed.ini", test_tmpdir());
	FILE *fp = fopen(path, "w");
	CHECK(fp);
	config_print(fp, &a);
	fclose(fp);
	config_defaults(&b);
	CHECK(config_load_file(&b, path) == 0);
	CHECK(configs_equal(&a, &b));
	CHECK(!memcmp(&a.optim_lr, &b.optim_lr, sizeof(double))); /* bit for bit */
	CHECK(a.model_n_layer == b.model_n_layer);
	/* config_to_string / config_load_string, as checkpoints use them. */
	char *s = config_to_string(&a);
	struct config c;
	config_defaults(&c);
	CHECK(config_load_string(&c, s, "checkpoint") == 0);
	CHECK(configs_equal(&a, &c));
	/* Printing is a fixed point. */
	char *s2 = config_to_string(&c);
	CHECK(!strcmp(s, s2));
	free(s);
	free(s2);
	config_free(&a);
	config_free(&b);
	config_free(&c);
}

/* Awkward floats survive printing exactly. */
TEST(round_trip_floats)
{
	const double vals[] = {0.1, 1.0 / 3.0, 1e-300, 5e-324, 2.5e300, 123456789.0, 3e-3};
	for (size_t i = 0; i < ARRAY_SIZE(vals); i++) {
		struct config a, b;
		config_defaults(&a);
		a.optim_lr = vals[i];
		char *s = config_to_string(&a);
		config_defaults(&b);
		CHECK(config_load_string(&b, s, "x") == 0);
		CHECK_MSG(b.optim_lr == vals[i], "%.17g came back as %.17g", vals[i], b.optim_lr);
		free(s);
		config_free(&a);
		config_free(&b);
	}
}

TEST(copy_is_deep)
{
	struct config a, b;
	config_defaults(&a);
	CHECK(config_set(&a, "data.train=x.zst") == 0);
	config_copy(&b, &a);
	CHECK(config_set(&a, "data.train=y.zst") == 0);
	CHECK(!strcmp(b.data_train, "x.zst"));
	CHECK(b.data_train != a.data_train);
	config_free(&a);
	config_free(&b);
}

TEST(lookup_unknown)
{
	struct config cfg;
	config_defaults(&cfg);
	CHECK(config_key_lookup("optim", "nope") == NULL);
	CHECK(config_get_string(&cfg, "nope", "lr") == NULL);
	const struct config_key_info *k = config_key_lookup("train", "schedule");
	CHECK(k && !strcmp(k->type, "choice") && strstr(k->choices, "2bw"));
	config_free(&cfg);
}

/* Numbers outside a key's range are refused where they are set. */
TEST(out_of_range_values_name_file_and_line)
{
	struct config cfg;
	config_defaults(&cfg);
	set_error_quiet(1);
	CHECK(config_load_string(&cfg, "[optim]\nlr = -1\n", "run.ini") != 0);
	CHECK_MSG(strstr(last_error(), "run.ini:2: optim.lr: -1 is out of range (0 or more)"),
		  "got: %s", last_error());
	CHECK(config_set(&cfg, "model.tied=7") != 0);
	CHECK_MSG(strstr(last_error(), "--set: model.tied: 7 is out of range (0..1)"), "got: %s",
		  last_error());
	CHECK(config_set(&cfg, "optim.beta1=1.5") != 0);
	CHECK(config_set(&cfg, "train.delay=65") != 0);
	CHECK(config_set(&cfg, "train.delay=64") == 0);   /* bounds are inclusive */
	CHECK(config_set(&cfg, "optim.min_lr_ratio=1") == 0);
	set_error_quiet(0);
	config_free(&cfg);
}

/* optim.name sets the defaults of the keys that follow it (the paper's
 * values), never a key the user set, and a resumed configuration (every key
 * given) keeps what it holds. */
TEST(optimizer_defaults_follow_the_name)
{
	const char *adan[] = {"optim.name=adan", "optim.beta2=0.5"};
	struct config cfg;
	CHECK(config_from_args(&cfg, NULL, adan, 2) == 0);
	CHECK_NEAR(cfg.optim_beta1, 0.98, 0);        /* Adan's default */
	CHECK_NEAR(cfg.optim_beta2, 0.5, 0);         /* the user's value wins */
	CHECK_NEAR(cfg.optim_beta3, 0.99, 0);
	CHECK_NEAR(cfg.optim_weight_decay, 0.02, 0);
	char *saved = config_to_string(&cfg);
	config_free(&cfg);

	/* a resume from an AdamW run that switches the name keeps the saved betas */
	struct config back;
	config_defaults(&back);
	CHECK(config_load_string(&back, saved, "checkpoint") == 0);
	CHECK(config_set(&back, "optim.name=adamw") == 0);
	CHECK(config_finish(&back) == 0);
	CHECK_NEAR(back.optim_beta1, 0.98, 0);
	config_free(&back);
	free(saved);

	/* every optimizer's defaults are valid values of their keys */
	static const char *const names[] = {"adamw", "muon", "lion", "sgd", "adan", "mars", "ademamix", "soap", "normuon"};
	for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
		char set[64];
		snprintf(set, sizeof(set), "optim.name=%s", names[i]);
		const char *one[] = {set};
		CHECK(config_from_args(&cfg, NULL, one, 1) == 0);
		config_free(&cfg);
	}
	CHECK(config_from_args(&cfg, NULL, NULL, 0) == 0);
	CHECK_NEAR(cfg.optim_beta1, 0.9, 0); /* adamw: the table's default */
	/* finished again for another optimizer: that one's defaults, then back */
	CHECK(config_set(&cfg, "optim.name=adan") == 0 && config_finish(&cfg) == 0);
	CHECK_NEAR(cfg.optim_beta1, 0.98, 0);
	CHECK(config_set(&cfg, "optim.name=adamw") == 0 && config_finish(&cfg) == 0);
	CHECK_NEAR(cfg.optim_beta1, 0.9, 0);
	CHECK_NEAR(cfg.optim_weight_decay, 0.1, 0);
	config_free(&cfg);
}
