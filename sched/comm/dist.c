/* dist.c - rank and world discovery, MPI start-up and the control channel.
 *
 * See dist.h for the environment variables and the checks. The control
 * channel is a duplicate of MPI_COMM_WORLD used only between pipeline
 * segments (checkpoint gathers, loss broadcasts, stop agreement), so its
 * messages never meet the transport's or the board's.
 */
#include "dist.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../io/staged.h"
#include "../../io/util.h"
#include "nccl.h"
#include "p2p.h"
#include "p2p_carrier.h"
#include "rendezvous.h"

#ifdef ASYNCPP_MPI
#include <mpi.h>

#include "mpi_wait.h"
#endif

/* The distributed runtime of a process (dist.h): made by dist_init, passed
 * to whatever talks to the other ranks, freed by dist_finalize. */
struct dist {
	int rank, world, local_rank;
	int mpi;            /* MPI initialised by dist_init with world > 1 */
	double timeout;     /* pipeline.timeout: the longest wait on another rank */
	int stages;         /* pipeline.stages: rank % stages is the stage */
	struct rdv *rdv;    /* the TCP rendezvous, when it connects the world */
	struct p2p_mesh *mesh; /* the TCP mesh over it (p2p_tcp.c) */
	struct p2p_carrier carrier; /* what carries messages: MPI or the mesh */
	struct p2p *msg;    /* dist_send/dist_recv's channel (over MPI or TCP) */
	void *pipe;         /* the pipeline's side (sched/executor.c), or NULL */
	void (*pipe_free)(void *pipe);
#ifdef ASYNCPP_MPI
	MPI_Comm ctl;
#endif
};

/* A non-negative int from variable name; -1 when unset, -2 when malformed. */
static int env_int(const char *name)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return -1;
	char *end;
	errno = 0;
	long x = strtol(v, &end, 10);
	if (errno || *end || x < 0 || x > INT_MAX) {
		error("environment variable %s = '%s': expected a non-negative integer", name, v);
		return -2;
	}
	return (int)x;
}

int dist_env_read(struct dist_env *e)
{
	static const struct {
		const char *rank, *size, *local, *size2, *needs, *from;
	} src[] = {
		{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", NULL,
		 NULL, "OMPI_COMM_WORLD_RANK/SIZE"},
		{"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", NULL, NULL, "PMI_RANK/PMI_SIZE"},
		/* a batch script also has SLURM_PROCID and SLURM_NTASKS; only a
		 * job step (srun) is a launch of several processes */
		{"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NTASKS",
		 "SLURM_STEP_ID", "SLURM_PROCID/SLURM_STEP_NUM_TASKS"},
		{"RANK", "WORLD_SIZE", "LOCAL_RANK", NULL, NULL, "RANK/WORLD_SIZE"},
	};
	*e = (struct dist_env){0, 1, 0, NULL};
	for (size_t i = 0; i < ARRAY_SIZE(src); i++) {
		if (src[i].needs && !getenv(src[i].needs))
			continue;
		int rank = env_int(src[i].rank), size = env_int(src[i].size);
		if (size == -1 && src[i].size2)
			size = env_int(src[i].size2);
		if (rank == -2 || size == -2)
			return -1;
		if (rank == -1 && size == -1)
			continue;
		if (rank == -1 || size == -1)
			return error("environment: %s gives %s without %s", src[i].from,
				     rank == -1 ? src[i].size : src[i].rank,
				     rank == -1 ? src[i].rank : src[i].size);
		if (size < 1 || rank >= size)
			return error("environment: %s says rank %d of %d processes", src[i].from,
				     rank, size);
		int local = env_int(src[i].local);
		if (local == -2)
			return -1;
		*e = (struct dist_env){rank, size, local < 0 ? 0 : local, src[i].from};
		return 0;
	}
	return 0;
}

double dist_kill_grace(void)
{
	if (!getenv("OMPI_COMM_WORLD_SIZE"))
		return 0;
	const char *v = getenv("OMPI_MCA_odls_base_sigkill_timeout");
	char *end = NULL;
	double t = v ? strtod(v, &end) : 0;
	return v && end != v && *end == '\0' && t > 0 ? t : 1.0; /* Open MPI's default */
}

int dist_rank(const struct dist *d) { return d ? d->rank : 0; }
int dist_world(const struct dist *d) { return d ? d->world : 1; }
int dist_local_rank(const struct dist *d) { return d ? d->local_rank : 0; }
int dist_active(const struct dist *d) { return d != NULL; }
int dist_mpi(const struct dist *d) { return d && d->mpi; }
int dist_rendezvous(const struct dist *d) { return d && d->rdv; }
int dist_is_root(const struct dist *d) { return dist_rank(d) == 0; }
double dist_timeout(const struct dist *d) { return d ? d->timeout : 0; }
const struct p2p_carrier *dist_carrier(const struct dist *d) { return d ? &d->carrier : NULL; }

void dist_set_pipeline(struct dist *d, void *pipe, void (*pipe_free)(void *pipe))
{
	d->pipe = pipe;
	d->pipe_free = pipe_free;
}

void *dist_pipeline(const struct dist *d) { return d ? d->pipe : NULL; }

/* ASYNCPP_TEST_STAGE_HOST=1 makes the cpu backend count as a device
 * backend here, so the carriers' staging through host buffers (the path
 * of cuda) runs, and is tested, on a machine without a GPU. */
int dist_backend_is_host(const struct backend *be)
{
	const char *t = getenv("ASYNCPP_TEST_STAGE_HOST");
	return !strcmp(be->name, "cpu") && !(t && !strcmp(t, "1"));
}

/* What is wrong with cfg for a world of e->world processes, into msg;
 * 0 when nothing is. Every rank finds the same. */
static int config_problem(const struct config *cfg, const struct dist_env *e, char *msg,
			  size_t len)
{
	int S = e->world;
	long want = cfg->pipeline_stages * MAX(cfg->pipeline_data_parallel, 1);
	long N = cfg->pipeline_data_parallel;
	if (!strcmp(cfg->train_schedule, "none"))
		snprintf(msg, len, "%d processes were launched, but train.schedule = none "
			 "trains on one process: choose a pipeline schedule (gpipe, 1f1b, "
			 "2bw, pipedream) with pipeline.stages (times pipeline.data_parallel) = "
			 "%d", S, S);
	else if (N < 1)
		snprintf(msg, len, "pipeline.data_parallel = %ld: must be at least 1", N);
	else if (N == 1 && cfg->pipeline_stages != S)
		snprintf(msg, len, "pipeline.stages = %ld, but %d processes were launched (%s): "
			 "each process runs one stage; launch %ld processes or set "
			 "pipeline.stages = %d", cfg->pipeline_stages, S, e->from,
			 cfg->pipeline_stages, S);
	else if (N > 1 && want != S)
		snprintf(msg, len, "pipeline.stages = %ld and pipeline.data_parallel = %ld need "
			 "%ld processes (one per stage of each replica: replica r's stage s "
			 "is rank r*%ld+s), but %d were launched (%s)", cfg->pipeline_stages,
			 N, want, cfg->pipeline_stages, S, e->from);
	else if (N > 1 && strcmp(cfg->train_schedule, "pipedream") &&
		 cfg->pipeline_micro_batches % N)
		snprintf(msg, len, "pipeline.micro_batches = %ld is not divisible by "
			 "pipeline.data_parallel = %ld: each replica takes an equal share of "
			 "every step's micro-batches", cfg->pipeline_micro_batches, N);
	else
		return 0;
	return 1;
}

/* Rank 0's report of a rank that runs another configuration (what:
 * config_first_difference's text). */
static void say_config_difference(int odd, const char *what)
{
	error("rank %d runs another configuration than rank 0 (%s): every rank must be "
	      "started with the same -c file and --set options", odd, what);
	fflush(stderr);
}

#ifdef ASYNCPP_MPI
/* Every rank must run the same configuration (the same model, stages,
 * micro-batches, optimizer...): a rank started with other flags or another
 * file would compute another run. Compare hashes of the printed
 * configuration; a rank that differs sends its text to rank 0, which names
 * the first key that differs. Returns 0, or -1 on every rank after rank 0
 * said which. Collective. */
static int same_config_everywhere(const struct dist *d, const struct config *cfg)
{
	char *text = config_to_string(cfg);
	uint64_t mine = fnv1a64(FNV1A64_INIT, text, strlen(text));
	uint64_t *all = xcalloc((size_t)d->world, sizeof(uint64_t));
	MPI_Allgather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, d->ctl);
	int odd = -1;
	for (int q = 1; q < d->world && odd < 0; q++)
		if (all[q] != all[0])
			odd = q;
	free(all);
	if (odd < 0) {
		free(text);
		return 0;
	}
	if (d->rank == odd) {
		unsigned long long n = strlen(text) + 1;
		MPI_Send(&n, 1, MPI_UNSIGNED_LONG_LONG, 0, 7, d->ctl);
		MPI_Send(text, (int)n, MPI_CHAR, 0, 8, d->ctl);
	} else if (d->rank == 0) {
		unsigned long long n;
		MPI_Recv(&n, 1, MPI_UNSIGNED_LONG_LONG, odd, 7, d->ctl, MPI_STATUS_IGNORE);
		char *theirs = xmalloc(n);
		MPI_Recv(theirs, (int)n, MPI_CHAR, odd, 8, d->ctl, MPI_STATUS_IGNORE);
		char what[600];
		config_first_difference(theirs, text, odd, what, sizeof(what));
		say_config_difference(odd, what);
		free(theirs);
	}
	free(text);
	MPI_Barrier(d->ctl); /* no rank leaves before rank 0 has said it */
	return -1;
}
#endif

/* The seconds the ranks of a TCP rendezvous have to find each other:
 * ASYNCPP_CONNECT_TIMEOUT, else RDV_DEFAULT_CONNECT_TIMEOUT. -1 after
 * error() when malformed. */
static double connect_timeout(void)
{
	const char *v = getenv("ASYNCPP_CONNECT_TIMEOUT");
	if (!v || !*v)
		return RDV_DEFAULT_CONNECT_TIMEOUT;
	char *end;
	errno = 0;
	double t = strtod(v, &end);
	if (errno || *end || !(t >= 0) || t > 1e9)
		return error("environment variable ASYNCPP_CONNECT_TIMEOUT = '%s': expected seconds "
			     "(0 waits forever)", v);
	return t;
}

/* Was the process started by an MPI launcher (whose PMI wires MPI), rather
 * than by torchrun or by hand with MASTER_ADDR and MASTER_PORT? */
static int mpi_launched(const struct dist_env *e)
{
	if (!strncmp(e->from, "OMPI_", 5) || !strncmp(e->from, "PMI_", 4))
		return 1;
	/* srun: MPI through Slurm's PMI, unless the script chose a rendezvous */
	if (!strncmp(e->from, "SLURM_", 6))
		return !(getenv("MASTER_ADDR") && getenv("MASTER_PORT"));
	return 0;
}

/* A world of e->world > 1 without MPI (pipeline.transport = tcp, or nccl
 * without an MPI launcher): the TCP rendezvous at MASTER_ADDR:MASTER_PORT
 * connects the ranks, checks the configuration as the MPI start does and
 * carries dist_bcast and dist_max_int; then the TCP mesh (p2p_tcp.c)
 * carries the messages between ranks. */
static int tcp_init(const struct config *cfg, const struct dist_env *e, struct dist **out)
{
	int r = e->rank, S = e->world;
	const char *addr = getenv("MASTER_ADDR"), *port_s = getenv("MASTER_PORT");
	/* these variables may differ by rank: every rank says what it finds */
	if (!addr || !*addr || !port_s || !*port_s)
		return error("rank %d of %d (%s): pipeline.transport = %s without MPI meets the "
			     "other ranks at a TCP rendezvous, which needs MASTER_ADDR (rank 0's "
			     "host) and MASTER_PORT (a free port there), as torchrun sets them; "
			     "%s is not set", r, S, e->from, cfg->pipeline_transport,
			     !addr || !*addr ? "MASTER_ADDR" : "MASTER_PORT");
	char *end;
	errno = 0;
	long port = strtol(port_s, &end, 10);
	if (errno || *end || port < 1 || port > 65535)
		return error("environment variable MASTER_PORT = '%s': expected a TCP port, 1 to "
			     "65535", port_s);
	double ct = connect_timeout();
	if (ct < 0)
		return -1;
	char problem[600];
	int bad = config_problem(cfg, e, problem, sizeof(problem));
	struct rdv_opts o = {addr, (int)port, r, S, ct, cfg->pipeline_timeout};
	struct rdv *rdv = rdv_open(&o);
	if (!rdv)
		return bad && r == 0 ? error("%s", problem) : -1;
	if (bad) {
		/* the root says it once, and no rank leaves before it has (a
		 * launcher stops every rank when one exits) */
		if (r == 0) {
			error("%s", problem);
			fflush(stderr);
		}
		rdv_barrier(rdv);
		rdv_close(rdv);
		return -1;
	}
	char *text = config_to_string(cfg);
	char what[600];
	int odd = rdv_agree(rdv, text, what, sizeof(what));
	free(text);
	if (odd > 0) {
		if (r == 0)
			say_config_difference(odd, what);
		rdv_barrier(rdv);
	}
	struct p2p_mesh *mesh = odd ? NULL : p2p_tcp_start(rdv, cfg->pipeline_timeout, ct);
	if (!mesh) {
		rdv_close(rdv);
		return -1;
	}
	struct dist *d = xcalloc(1, sizeof(*d));
	d->rank = r;
	d->world = S;
	d->local_rank = e->local_rank;
	d->timeout = cfg->pipeline_timeout;
	d->stages = (int)MAX(cfg->pipeline_stages, 1);
	d->rdv = rdv;
	d->mesh = mesh;
	d->carrier = p2p_tcp_carrier(mesh);
	d->msg = p2p_open(&d->carrier);
	*out = d;
	return 0;
}

int dist_init(const struct config *cfg, struct dist **out)
{
	*out = NULL;
	struct dist_env e;
	if (dist_env_read(&e))
		return -1;
	const char *tp = cfg->pipeline_transport;
	if (!strcmp(tp, "nccl"))
		nccl_env_prepare(); /* before anything (MPI_Init included) starts CUDA */
	long want = cfg->pipeline_stages * MAX(cfg->pipeline_data_parallel, 1);
	if (e.world == 1) {
		if (!strcmp(tp, "mpi") && want > 1)
			return error("pipeline.transport = mpi runs one stage per process: start %ld "
				     "processes with 'mpirun -np %ld asyncpp train ...' or 'srun -n %ld "
				     "asyncpp train ...'", want, want, want);
		return 0;
	}
	int r = e.rank, S = e.world;
	int nccl = !strcmp(tp, "nccl");
	if (!strcmp(tp, "tcp"))
		return tcp_init(cfg, &e, out);
#ifndef ASYNCPP_CUDA
	if (nccl) /* every rank finds it; the root says it */
		return r == 0 ? error("launched as rank %d of %d (%s) with pipeline.transport = "
				      "nccl, but this asyncpp was built without CUDA: use "
				      "pipeline.transport = mpi (CPU stages) or a CUDA build", r, S,
				      e.from)
			      : -1;
#endif
#ifdef ASYNCPP_MPI
	if (nccl && !mpi_launched(&e))
		return tcp_init(cfg, &e, out);
#else
	if (nccl)
		return tcp_init(cfg, &e, out);
	(void)mpi_launched;
#endif
#ifndef ASYNCPP_MPI
	/* every rank finds it; the root says it */
	return r == 0 ? error("launched as rank %d of %d (%s), but this asyncpp was built "
			      "without MPI: install libopenmpi-dev and rebuild, or use "
			      "pipeline.transport = tcp (or nccl, on GPUs) with MASTER_ADDR and "
			      "MASTER_PORT", r, S,
			      e.from)
		      : -1;
#else
	char problem[600];
	int bad = config_problem(cfg, &e, problem, sizeof(problem));
	int provided;
	if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
		return bad ? error("%s", problem) : error("rank %d: MPI_Init_thread failed", r);
	if (bad) {
		/* the root says it once, and no rank leaves before it has: a rank
		 * that exited at once could have the launcher kill the root
		 * before its message was out */
		if (r == 0) {
			error("%s", problem);
			fflush(stderr);
		}
		MPI_Barrier(MPI_COMM_WORLD);
		MPI_Finalize();
		return -1;
	}
	int mr, ms;
	MPI_Comm_rank(MPI_COMM_WORLD, &mr);
	MPI_Comm_size(MPI_COMM_WORLD, &ms);
	if (ms != S || mr != r) {
		error("the environment (%s) says rank %d of %d, but MPI says rank %d of %d: start "
		      "asyncpp with mpirun or srun (--mpi=pmix), not by setting the variables",
		      e.from, r, S, mr, ms);
		MPI_Finalize();
		return -1;
	}
	if (provided < MPI_THREAD_FUNNELED) {
		error("MPI provides thread level %d; asyncpp needs MPI_THREAD_FUNNELED", provided);
		MPI_Finalize();
		return -1;
	}
	struct dist *d = xcalloc(1, sizeof(*d));
	MPI_Comm_dup(MPI_COMM_WORLD, &d->ctl);
	d->rank = r;
	d->world = S;
	d->local_rank = e.local_rank;
	d->timeout = cfg->pipeline_timeout;
	d->stages = (int)MAX(cfg->pipeline_stages, 1);
	d->mpi = 1;
	if (same_config_everywhere(d, cfg)) {
		MPI_Comm_free(&d->ctl);
		free(d);
		MPI_Finalize();
		return -1;
	}
	d->carrier = p2p_mpi_carrier(r, S);
	d->msg = p2p_open(&d->carrier);
	*out = d;
	return 0;
#endif
}

void dist_finalize(struct dist *d)
{
	if (!d)
		return;
	if (d->pipe_free) /* its transports and replica sums run on what follows */
		d->pipe_free(d->pipe);
	p2p_close(d->msg);
	if (d->rdv) {
		p2p_tcp_stop(d->mesh);
		rdv_close(d->rdv);
	}
#ifdef ASYNCPP_MPI
	if (d->mpi) {
		MPI_Comm_free(&d->ctl);
		MPI_Finalize();
	}
#endif
	free(d);
}

int dist_max_int(const struct dist *d, int v)
{
	if (!d)
		return v;
	if (d->rdv) {
		int *all = xcalloc((size_t)d->world, sizeof(int));
		if (rdv_allgather(d->rdv, &v, all, sizeof(int)))
			dist_abort(); /* the rendezvous said why */
		int out = all[0];
		for (int q = 1; q < d->world; q++)
			out = MAX(out, all[q]);
		free(all);
		return out;
	}
#ifdef ASYNCPP_MPI
	if (d->mpi) {
		int out;
		MPI_Request req;
		MPI_Comm ctl = d->ctl;
		MPI_Iallreduce(&v, &out, 1, MPI_INT, MPI_MAX, ctl, &req);
		mpi_wait_all(d->rank, 1, &req, MPI_STATUSES_IGNORE, d->timeout, d->rank % d->stages,
			     "the other ranks at a step boundary (every rank joins there)");
		return out;
	}
#endif
	return v;
}

int dist_agree(const struct dist *d, int failed, const char *what)
{
	if (!d)
		return failed ? -1 : 0;
	if (!dist_max_int(d, failed != 0))
		return 0;
	if (!failed)
		error("rank %d: stopping: another rank failed %s (its message above says why)",
		      d->rank, what);
	return -1;
}

int dist_fault(const struct dist *d, const char *point, long first, long last,
	       const char *what)
{
	const char *v = getenv("ASYNCPP_FAULT");
	size_t len = strlen(point);
	long step = 0, rank = 0;
	if (!v || strncmp(v, point, len) || v[len] != ':' ||
	    sscanf(v + len + 1, "%ld:%ld", &step, &rank) < 1)
		return 0;
	if (step < first || step > last || rank != dist_rank(d))
		return 0;
	if (d)
		error("rank %d: cannot %s: a fault injected by ASYNCPP_FAULT=%s", d->rank, what, v);
	else
		error("cannot %s: a fault injected by ASYNCPP_FAULT=%s", what, v);
	return 1;
}

int dist_send(const struct dist *d, const void *buf, size_t bytes, int to, int tag)
{
	if (!d || !d->msg)
		return error("internal error: dist_send outside a multi-process run");
	struct p2p_op *op = p2p_isend(d->msg, buf, bytes, to, tag);
	p2p_wait(d->msg, &op, 1, d->timeout, d->rank % d->stages, "rank %d to take %zu bytes", to,
		 bytes);
	return 0;
}

int dist_recv(const struct dist *d, void *buf, size_t bytes, int from, int tag)
{
	if (!d || !d->msg)
		return error("internal error: dist_recv outside a multi-process run");
	struct p2p_op *op = p2p_irecv(d->msg, buf, bytes, from, tag);
	p2p_wait(d->msg, &op, 1, d->timeout, d->rank % d->stages, "%zu bytes from rank %d", bytes,
		 from);
	return 0;
}

/* MPI counts are ints: large broadcasts go in pieces of 1 GiB. */
#define PIECE ((size_t)1 << 30)

int dist_bcast(const struct dist *d, void *buf, size_t bytes, int root)
{
	if (!d)
		return 0; /* one process: the buffer already holds the value */
#ifdef ASYNCPP_MPI
	if (d->mpi) {
		char *p = buf;
		do {
			size_t n = MIN(bytes, PIECE);
			MPI_Request req;
			MPI_Comm ctl = d->ctl;
			if (MPI_Ibcast(p, (int)n, MPI_BYTE, root, ctl, &req) != MPI_SUCCESS)
				return error("rank %d: MPI_Bcast from rank %d failed", d->rank, root);
			mpi_wait_all(d->rank, 1, &req, MPI_STATUSES_IGNORE, d->timeout,
				     d->rank % d->stages, "a broadcast of %zu bytes from rank %d", n,
				     root);
			p += n;
			bytes -= n;
		} while (bytes);
		return 0;
	}
#endif
	return rdv_bcast(d->rdv, buf, bytes, root);
}

void dist_never_came(int rank, int stage, double waited, double timeout, const char *fmt,
		     va_list ap)
{
	char what[300];
	vsnprintf(what, sizeof(what), fmt, ap);
	error("rank %d (stage %d) waited %.0f s for %s, which never came: that rank is stuck, "
	      "stopped or gone (pipeline.timeout = %g s; 0 waits forever); aborting the job", rank,
	      stage, waited, what, timeout);
	dist_abort();
}

void dist_abort(void)
{
	/* this rank's unfinished files (a checkpoint it was writing when a peer
	 * died): neither exit nor MPI_Abort removes them (io/staged.h) */
	staged_remove_all();
	fflush(NULL); /* every output stream: what _exit leaves is lost */
#ifdef ASYNCPP_MPI
	/* MPI's own state says whether it runs: nothing of ours is needed */
	int on = 0, off = 0;
	MPI_Initialized(&on);
	MPI_Finalized(&off);
	if (on && !off)
		MPI_Abort(MPI_COMM_WORLD, 1);
#endif
	/* _exit, not exit: exit's teardown (the CUDA runtime's, among the
	 * static destructors) can wait for the GPU, where NCCL kernels wait
	 * for peers that wait for this rank; the kernel closes this rank's
	 * sockets, and the peers fail on the dropped connections */
	_exit(1);
}
