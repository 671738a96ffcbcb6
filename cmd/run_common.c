/* run_common.c - model construction, checkpoint lookup, device peaks. */
#include "run_common.h"

#include <dirent.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../io/formats/checkpoint.h"
#include "../io/util.h"
#include "../sched/comm/dist.h"
#include "../sched/schedule.h"

int model_from_config(struct model *m, const struct config *cfg, int vocab)
{
	struct model_config mc = {0};
	mc.arch = strcmp(cfg->model_arch, "gpt2") ? ARCH_LLAMA : ARCH_GPT2;
	mc.V = cfg->model_vocab_size ? (int)cfg->model_vocab_size : vocab;
	if (mc.V <= 0)
		return error("model.vocab_size is 0 and the data gives no vocabulary size");
	if (vocab > mc.V)
		return error("the data's vocabulary (%d) is larger than model.vocab_size (%d)", vocab,
			     mc.V);
	mc.L = (int)cfg->model_n_layer;
	mc.C = (int)cfg->model_d_model;
	mc.NH = (int)cfg->model_n_head;
	mc.NKV = cfg->model_n_kv_head ? (int)cfg->model_n_kv_head : mc.NH;
	if (mc.arch == ARCH_GPT2)
		mc.NKV = mc.NH;
	mc.F = (int)cfg->model_d_ff;
	mc.T = (int)cfg->model_seq_len;
	mc.tied = (int)cfg->model_tied;
	if (mc.arch == ARCH_GPT2 && !mc.tied)
		return error("model.arch = gpt2 always ties the head to the embedding; set model.tied = 1");
	mc.eps = (float)cfg->model_norm_eps;
	mc.rope_theta = (float)cfg->model_rope_theta;
	mc.init_std = (float)cfg->model_init_std;
	model_moe_from(&mc, cfg);
	return model_init(m, &mc);
}

int model_from_ckpt_config(struct model *m, const struct config *cfg, int vocab,
			   const char *ckpt)
{
	set_error_quiet(1);
	int rc = model_from_config(m, cfg, vocab);
	set_error_quiet(0);
	if (rc)
		return error("'%s': %s", ckpt, last_error());
	return 0;
}

int checkpoint_name(const char *n)
{
	size_t len = strlen(n);
	if (len < 5 + 8 + 5 || strncmp(n, "ckpt-", 5) || strcmp(n + len - 5, ".ckpt"))
		return 0;
	for (size_t i = 5; i < len - 5; i++)
		if (n[i] < '0' || n[i] > '9')
			return 0;
	return 1;
}

int checkpoint_in_dir(const char *dir, const char *name)
{
	if (!checkpoint_name(name))
		return 0;
	char *path = path_join(dir, name);
	struct stat sb;
	/* stat first: reading a FIFO of that name would block */
	int is = !stat(path, &sb) && S_ISREG(sb.st_mode) &&
		 (access(path, R_OK) || ckpt_sniff(path) == 1);
	free(path);
	return is;
}

/* By step: a longer name is a larger step (past 8 digits), then by name. */
static int cmp_step(const void *a, const void *b)
{
	const char *x = *(char *const *)a, *y = *(char *const *)b;
	size_t lx = strlen(x), ly = strlen(y);
	return lx != ly ? (lx < ly ? -1 : 1) : strcmp(x, y);
}

int list_checkpoints(const char *dir, char ***paths)
{
	*paths = NULL;
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (!checkpoint_in_dir(dir, e->d_name))
			continue;
		*paths = xrealloc(*paths, sizeof(char *) * (size_t)(n + 1));
		/* path_join, as every path of the run directory is made: the
		 * names are compared (train's checkpoint.keep, --resume) */
		(*paths)[n++] = path_join(dir, e->d_name);
	}
	closedir(d);
	if (n > 1)
		qsort(*paths, (size_t)n, sizeof(char *), cmp_step);
	return n;
}

char *find_checkpoint(const char *path)
{
	struct stat sb;
	if (stat(path, &sb)) {
		error("cannot open '%s': no such file or directory", path);
		return NULL;
	}
	if (!S_ISDIR(sb.st_mode))
		return xstrdup(path);
	char **paths;
	int n = list_checkpoints(path, &paths);
	if (!n) {
		error("'%s' holds no checkpoint (ckpt-NNNNNNNN.ckpt)", path);
		return NULL;
	}
	char *newest = paths[n - 1];
	for (int i = 0; i < n - 1; i++)
		free(paths[i]);
	free(paths);
	return newest;
}

/* Nominal CPU peak: cores x clock x fp32 FLOPs per cycle (two FMA units of
 * the widest vector the CPU reports). A nominal figure, like the GPU
 * table's: MFU against it is comparable across runs, not an absolute. */
static double cpu_peak(int threads)
{
	FILE *fp = fopen("/proc/cpuinfo", "r");
	double mhz = 0;
	int avx512 = 0, avx2 = 0, fma = 0;
	char line[4096];
	while (fp && fgets(line, sizeof(line), fp)) {
		if (!mhz && !strncmp(line, "cpu MHz", 7)) {
			char *c = strchr(line, ':');
			if (c)
				mhz = atof(c + 1);
		}
		if (!strncmp(line, "flags", 5)) {
			avx512 |= strstr(line, " avx512f") != NULL;
			avx2 |= strstr(line, " avx2") != NULL;
			fma |= strstr(line, " fma") != NULL;
		}
	}
	if (fp)
		fclose(fp);
	if (mhz <= 0)
		mhz = 2000;
	double per_cycle = avx512 ? 64 : (avx2 && fma) ? 32 : 8;
	return threads * mhz * 1e6 * per_cycle;
}

double device_peak_flops(const struct backend *be, int threads)
{
	if (threads <= 0)
		threads = omp_get_num_procs();
	if (be == &backend_cpu || be == &backend_cpu_bf16)
		return cpu_peak(threads);
	return 989e12; /* H100 SXM / H200 dense bf16; see kernels/cuda */
}

int expert_parallel_check(const struct config *cfg)
{
	long N = cfg->model_expert_parallel, E = cfg->model_n_expert,
	     dp = cfg->pipeline_data_parallel;
	if (N == 1)
		return 0;
	if (!E)
		return error("model.expert_parallel = %ld splits experts, and model.n_expert is 0 "
			     "(a dense model): set model.expert_parallel = 1", N);
	if (E % N)
		return error("model.expert_parallel = %ld does not divide model.n_expert = %ld: each "
			     "of the %ld ranks holds an equal share of every layer's experts", N, E, N);
	if (dp % N)
		return error("model.expert_parallel = %ld does not divide pipeline.data_parallel = "
			     "%ld: the experts are split over ranks of one data-parallel group", N, dp);
	if (!strcmp(cfg->train_schedule, "none"))
		return error("model.expert_parallel = %ld needs a pipeline schedule "
			     "(train.schedule = gpipe, 1f1b, 2bw, pipedream, interleaved or a "
			     "zero-bubble kind): train.schedule = none runs the replicas one after "
			     "another on one thread, so no replica can run another's experts; or "
			     "set model.expert_parallel = 1", N);
	return 0;
}

const struct backend *backend_from_config(const struct config *cfg)
{
	const struct backend *be = backend_by_name(cfg->train_device);
	/* the MoE layer (model/moe.c) is the backend's routing, dispatch and
	 * expert ops (backend.h moe_*): the cpu and cuda backends have them all */
	if (be && cfg->model_n_expert > 0 && !backend_has_moe(be)) {
		error("model.n_expert = %ld: the %s backend has no mixture-of-experts ops; set "
		      "train.device = cpu (eval and sample: --device cpu)", cfg->model_n_expert,
		      be->name);
		return NULL;
	}
	/* auto: bf16 where it is the fast mode (cuda), f32 on the cpu, where
	 * bf16 storage is a check of the plumbing and slower */
	const char *dt = cfg->train_act_dtype;
	if (be && !strcmp(dt, "bf16"))
		be = backend_with_act_dtype(be, ACT_BF16);
	else if (be && !strcmp(dt, "auto") && strcmp(be->name, "cpu")) {
		set_error_quiet(1); /* a backend without bf16 storage keeps f32 */
		const struct backend *b16 = backend_with_act_dtype(be, ACT_BF16);
		set_error_quiet(0);
		be = b16 ? b16 : be;
	}
	if (be && be->set_threads)
		be->set_threads((int)cfg->train_threads);
	return be;
}

int backend_lanes_from_config(const struct backend *be, const struct config *cfg,
			      const struct dist *d)
{
	const char *list = cfg->pipeline_devices;
	long S = cfg->pipeline_stages;
	if (!*list)
		return 0;
	if (strcmp(cfg->pipeline_transport, "local") || dist_active(d))
		return error("pipeline.devices = %s places the stages of one process; with "
			     "pipeline.transport = %s (or under a launcher) each process takes its local "
			     "rank's GPU: leave pipeline.devices empty", list,
			     dist_active(d) && !strcmp(cfg->pipeline_transport, "local") ? "mpi"
											  : cfg->pipeline_transport);
	if (!strcmp(cfg->train_schedule, "none"))
		return error("pipeline.devices = %s needs a pipeline schedule (train.schedule = "
			     "1f1b, gpipe, 2bw or pipedream): train.schedule = none runs the stages "
			     "one after another on one device", list);
	int *dev = xcalloc((size_t)S, sizeof(int)), n = 0, rc = 0;
	const char *p = list;
	while (!rc && *p) {
		size_t len = strcspn(p, ",");
		char item[32] = "";
		if (len < sizeof(item))
			memcpy(item, p, len);
		int d = device_index_from_name(item);
		if (d < 0)
			rc = error("pipeline.devices = %s: '%.*s' is not a GPU; list one cuda:N per stage, "
				   "e.g. cuda:0,cuda:1", list, (int)len, p);
		else if (n == S)
			rc = error("pipeline.devices = %s lists more devices than pipeline.stages = %ld",
				   list, S);
		else
			dev[n++] = d;
		p += len + (p[len] == ',');
	}
	if (!rc && n != S)
		rc = error("pipeline.devices = %s lists %d device(s); pipeline.stages = %ld needs one "
			   "per stage", list, n, S);
	char why[256] = "";
	if (!rc && !be->set_lanes)
		rc = error("pipeline.devices = %s: the %s backend runs every stage on the host; set "
			   "train.device = cuda", list, be->name);
	else if (!rc && !be->set_lanes(dev, n, why, sizeof(why)))
		rc = error("pipeline.devices = %s cannot be served: %s", list, why);
	free(dev);
	return rc;
}

int run_check_schedule(const struct config *cfg)
{
	int kind = sched_kind_from_name(cfg->train_schedule);
	if (kind >= 0 && !sched_kind_trainable(kind))
		return error("train.schedule = %s is drawn and simulated by asyncpp bench schedule "
			     "--kind %s but not yet executed by asyncpp train: pick gpipe, 1f1b, 2bw, "
			     "pipedream, interleaved, zb-h1 or 2bw-zb", cfg->train_schedule, cfg->train_schedule);
	if (cfg->pipeline_virtual_stages != 1 && kind != SCHED_INTERLEAVED)
		return error("pipeline.virtual_stages = %ld is for train.schedule = interleaved, "
			     "not %s: leave it at 1", cfg->pipeline_virtual_stages,
			     cfg->train_schedule);
	return 0;
}
