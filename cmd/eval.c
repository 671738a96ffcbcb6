/* eval.c - `asyncpp eval CKPT`: loss and perplexity on shards. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../io/data/dataloader.h"
#include "../io/util.h"
#include "cmd.h"
#include "model_load.h"
#include "opts.h"
#include "run_paths.h"

static const char *const usage[] = {
	"asyncpp eval [--data SHARDS] [--batches N] [--batch-size B] [--device DEV] [--force] CKPT",
	NULL,
};

int cmd_eval(int argc, char **argv, const char *prog)
{
	const char *data = NULL, *device = NULL;
	long batches = LONG_MIN, batch_size = LONG_MIN; /* LONG_MIN: not given */
	int force = 0;
	const struct option options[] = {
		OPT_STRING('d', "data", &data, "SHARDS", "shards to evaluate on (default: the run's data.val, else data.train)"),
		OPT_INT('n', "batches", &batches, "N", "micro-batches to evaluate, at most as many as the data holds (default: the run's eval.batches on its data.val, else all, at most 1000)"),
		OPT_INT('b', "batch-size", &batch_size, "B", "sequences per micro-batch (default: the run's train.batch_size)"),
		OPT_STRING(0, "device", &device, "DEV", "cpu or cuda (default: the run's train.device)"),
		OPT_FLAG(0, "force", &force, "evaluate on shards made with another tokenizer than the model's"),
		OPT_END(),
	};
	int npos = opts_parse(argc, argv, usage, options,
			      "Mean cross-entropy loss and perplexity of a checkpoint on token shards.");
	if (npos != 1)
		opts_usage_error(usage, options, npos ? "too many arguments" : "no checkpoint given");
	struct loaded_model lm;
	/* the batch size must be known before the model's buffers are made */
	if (batch_size != LONG_MIN && (batch_size < 1 || batch_size > 1 << 20))
		opts_usage_error(usage, options, "--batch-size must be between 1 and 1048576, not %ld",
				 batch_size);
	if (batches != LONG_MIN && batches < 1)
		opts_usage_error(usage, options, "--batches must be at least 1, not %ld", batches);
	int B = batch_size > 0 ? (int)batch_size : 0;
	if (loaded_model_open(&lm, argv[0], device, B ? B : 1))
		return EXIT_FAIL;
	if (!B && lm.cfg.train_batch_size != 1) {
		B = (int)lm.cfg.train_batch_size;
		loaded_model_close(&lm);
		if (loaded_model_open(&lm, argv[0], device, B))
			return EXIT_FAIL;
	}
	B = lm.B;
	/* the run's own validation data: the batches its logged `val` averaged */
	const char *given = data;
	int run_val = !data && lm.cfg.data_val[0];
	if (!data)
		data = run_val ? lm.cfg.data_val : lm.cfg.data_train;
	if (!data[0]) {
		error("the checkpoint names no data; give --data SHARDS");
		loaded_model_close(&lm);
		return EXIT_FAIL;
	}
	if (!given && run_path_check(&lm.cfg, run_val ? "val" : "train", lm.path,
				     "the shards with --data SHARDS")) {
		loaded_model_close(&lm);
		return EXIT_FAIL;
	}
	int T = lm.m.cfg.T;
	struct dataloader dl;
	if (dataloader_open_load(&dl, data, B, T, 0, 0, data_load_parse(lm.cfg.data_load))) {
		loaded_model_close(&lm);
		return EXIT_FAIL;
	}
	/* ids of another tokenizer are valid ids with other meanings: a loss
	 * that looks like an answer. Shards and checkpoints both carry the
	 * tokenizer's hash (llm.c shards and imported models may not) */
	if (dl.tokenizer_hash && lm.tokenizer_hash && dl.tokenizer_hash != lm.tokenizer_hash &&
	    !force) {
		error("'%s' was made with tokenizer 0x%016llx, but '%s' was trained with tokenizer "
		      "0x%016llx: its loss would mean nothing; encode the text with the model's "
		      "tokenizer (%s tokenize encode -t ...), or pass --force", data,
		      (unsigned long long)dl.tokenizer_hash, lm.path,
		      (unsigned long long)lm.tokenizer_hash, prog);
		loaded_model_close(&lm);
		dataloader_close(&dl);
		return EXIT_FAIL;
	}
	/* llm.c shards do not record their vocabulary (GPT-2's is assumed):
	 * what matters is that every token is one the model knows */
	uint32_t max_token = dl.max_token;
	if ((int)max_token >= lm.m.cfg.V) {
		if (dataloader_streaming(&dl)) /* the ids were not read: the vocabulary bounds them */
			error("'%s' has a vocabulary of %u, larger than the model's %d (streamed, so "
			      "its ids were not checked; data.load=memory checks them)", data,
			      dl.vocab, lm.m.cfg.V);
		else
			error("'%s' holds token %u, beyond the model's vocabulary of %d", data,
			      max_token, lm.m.cfg.V);
		loaded_model_close(&lm);
		dataloader_close(&dl);
		return EXIT_FAIL;
	}
	long available = (long)(dl.n_windows / (size_t)B);
	if (available < 1)
		available = 1;
	/* never average the same windows twice: the data's windows at most.
	 * On the run's data.val, its eval.batches (capped as the trainer caps
	 * them: trainer_eval_batches), so the loss is the one the run logged */
	long dflt = run_val ? MAX(lm.cfg.eval_batches, 1) : 1000;
	long n = MIN(batches > 0 ? batches : dflt, available);
	size_t bt = (size_t)B * (size_t)T;
	int32_t *in = xmalloc(bt * sizeof(int32_t)), *tg = xmalloc(bt * sizeof(int32_t));
	int32_t *d_in = lm.be->alloc(bt * sizeof(int32_t)), *d_tg = lm.be->alloc(bt * sizeof(int32_t));
	double sum = 0, t0 = now_sec(), shown = t0;
	/* on a terminal, a progress line twice a second (a large model over
	 * a thousand batches takes minutes); erased before the results */
	int tty = isatty(STDERR_FILENO);
	for (long i = 0; i < n && !dl.failed; i++) {
		double now = now_sec();
		if (tty && i > 0 && now - shown >= 0.5) {
			fprintf(stderr, "\revaluating: batch %ld of %ld, loss %.4f, %.0f tokens/s\033[K", i,
				n, sum / (double)i, (double)i * (double)bt / (now - t0));
			shown = now;
		}
		dataloader_batch(&dl, i, in, tg);
		lm.be->to_device(d_in, in, bt * sizeof(int32_t));
		lm.be->to_device(d_tg, tg, bt * sizeof(int32_t));
		float loss;
		stage_forward(&lm.st, 0, lm.params, d_in, NULL, d_tg, NULL, &loss, NULL, NULL, 1.0f);
		sum += loss;
	}
	if (tty && shown > t0)
		fprintf(stderr, "\r\033[K");
	double dt = now_sec() - t0, mean = sum / (double)n;
	if (!dl.failed) { /* else error() named the shard that could not be read */
		printf("checkpoint  %s (step %ld)\n", lm.path, lm.step);
		printf("data        %s (%zu tokens)\n", data, dl.n);
		printf("evaluated   %ld x %d x %d = %ld tokens%s: batches 0 to %ld of %ld\n", n, B, T,
		       n * (long)bt, (size_t)(n * B) > dl.n_windows ? " (the data repeats)" : "",
		       n - 1, available);
		printf("loss        %.4f\n", mean);
		printf("perplexity  %.3f\n", exp(mean));
		printf("tokens/s    %.0f\n", dt > 0 ? (double)n * (double)bt / dt : 0.0);
	}
	int failed = dl.failed;
	free(in);
	free(tg);
	lm.be->free(d_in);
	lm.be->free(d_tg);
	dataloader_close(&dl);
	loaded_model_close(&lm);
	return !failed && isfinite(mean) ? EXIT_OK : EXIT_FAIL;
}
