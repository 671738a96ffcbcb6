/* schedule.h - pipeline schedules as data.
 *
 * Legend: S stages (0-based s), M micro-batches per optimizer step, n_steps
 * optimizer steps in a segment. A segment is what the executor runs between
 * two checkpoints: it starts with an empty pipeline and drains it at its end,
 * so for the asynchronous kinds the segment's warm-up and drain hold their
 * only bubble.
 *
 * sched_build() gives each stage a list of actions. One worker per stage
 * executes its list in order:
 *
 *   FORWARD    mb on weight version `version`, activations kept in `slot`
 *   BACKWARD   mb on the same version, frees `slot`; gradients accumulate
 *   SEND_ACT   mb's output activation to stage s+1 (right after FORWARD)
 *   RECV_ACT   mb's input activation from stage s-1 (right before FORWARD)
 *   SEND_GRAD  mb's input gradient to stage s-1 (right after BACKWARD)
 *   RECV_GRAD  mb's output gradient from stage s+1 (right before BACKWARD)
 *   OPTIM_STEP optimizer step `step`: reads version `version`-1, applies the
 *              accumulated gradients, writes version `version`, zeroes them
 *
 * Matching: a RECV_x(mb) on stage s matches the one SEND_x(mb) of its peer
 * stage, by (kind, mb). Sends are asynchronous: they never block, and the
 * transport buffers them. Between stages s and s+1 at most nslots(s)
 * messages per direction are ever sent and not yet received (an unreceived
 * activation or gradient belongs to a micro-batch in flight on stage s).
 * With blocking (rendezvous) sends the 1F1B orders would deadlock.
 *
 * Versions count the optimizer updates applied to a stage's weights within
 * the segment: version 0 is the weights the segment starts from. A segment
 * that starts at global step first_step > 0 (sched_build_at) may use negative
 * versions: -k is the weights k updates before the segment's start, which
 * the checkpoint holds (2bw needs -1, pipedream down to -(S-1-s)). The
 * versions alive on a stage at any moment fit in nversions weight buffers:
 * vbuf[v - vmin] names the buffer holding version v (each FORWARD, BACKWARD
 * and OPTIM_STEP repeats it as wbuf). OPTIM_STEP making version v reads the
 * buffer of v-1 and writes its wbuf; when the two are the same the update is
 * in place (nothing needs v-1 any more). A version's buffer is not reused
 * while a later action needs that version.
 *
 * Activation slots: a FORWARD takes the lowest free slot and its BACKWARD
 * (or BACKWARD_WEIGHT, below) frees it; a stage needs nslots activation
 * buffers.
 *
 * The kinds:
 *   gpipe      per step: all M forwards, all M backwards (ascending mb),
 *              OPTIM_STEP (flush). version = step.
 *   1f1b       per step: min(S-1-s, M) warm-up forwards, one-forward-one-
 *              backward, the remaining backwards, OPTIM_STEP (flush).
 *              version = step; at most S-s micro-batches in flight.
 *   2bw        M >= S. The n_steps*M micro-batches are one 1F1B stream with
 *              no flush; OPTIM_STEP t right after the stage's last backward of
 *              step t. Step t uses version max(t-1, 0) (global steps), so each
 *              update sees a gradient exactly one step old:
 *              w[t+1] = w[t] + U(g(w[t-1])). Two versions alive per stage.
 *   pipedream  an optimizer step per micro-batch: n_steps micro-batches in
 *              one 1F1B stream, OPTIM_STEP after every backward; micro-batch j
 *              on stage s uses version max(j - (S-1-s), 0) (weight stashing),
 *              so its updates see delay S-1-s; up to S-s versions alive.
 *              M only sets the window the simulator and timeline report.
 *
 * Micro-batch indices are segment-global: mb of step t are [t*M, (t+1)*M)
 * (pipedream: mb j is step j). Backwards run in ascending mb order on every
 * stage, so gradients accumulate in the same order as on a single device.
 *
 * Chunks (virtual stages). The kinds below split the model into P = S*V
 * pieces in model order and give stage s the V pieces sched_piece(sc, s, c)
 * for its chunks c = 0..V-1 (V = 1 above: piece s). Every action names its
 * chunk. Piece p's output activation goes to piece p+1 and p+1's input
 * gradient back to p: by a SEND/RECV pair with `peer` the other piece's
 * stage, or, when both pieces sit on the same stage, locally with no message
 * (the later compute then follows the earlier in the list). Matching rule:
 * a RECV_x(mb, chunk c) on stage s matches the one SEND_x(mb, chunk c') of
 * its peer whose piece is the neighbour of piece (s, c): (kind, mb, chunk).
 * Weights, slots and gradients are per chunk: a slot holds one chunk's
 * activations of one micro-batch, so nslots counts chunk-micro-batches.
 *
 * Split backward (the zero-bubble kinds):
 *   BACKWARD_INPUT  (B) mb's input gradient on chunk c, from its output
 *                   gradient; frees nothing: the slot stays for W. SEND_GRAD
 *                   follows it, RECV_GRAD precedes it.
 *   BACKWARD_WEIGHT (W) mb's weight gradient on chunk c (accumulated), after
 *                   its B; frees the slot.
 * A kind uses either the fused BACKWARD or B and W, never both. The W's of a
 * chunk run in ascending mb (weight gradients accumulate in one worker's
 * order, bit for bit); B's need not, though every kind here runs them in
 * ascending mb per chunk too. The B-done-W-pending micro-batches keep their
 * output gradients besides the slot (npending).
 *
 *   interleaved Megatron-LM's interleaved 1F1B (Narayanan et al., SC'21;
 *              megatron/core/pipeline_parallel/schedules.py,
 *              forward_backward_pipelining_with_interleaving): V chunks per
 *              stage, chunk c of stage s is piece c*S + s (stage S-1 chunk c
 *              hands to stage 0 chunk c+1). M must be a multiple of S when
 *              V > 1 (Megatron's condition). Per
 *              step the M*V (chunk, mb) units run in Megatron's order: unit
 *              k is mb (k / (S*V))*S + k%S on chunk (k % (S*V)) / S forward
 *              and V-1 minus that backward; (S-s-1)*2 + (V-1)*S warm-up
 *              forwards (all M*V when M = S), then one forward one
 *              backward, then the remaining backwards; OPTIM_STEP (flush).
 *              V = 1 is exactly 1f1b. version = step.
 *   zb-h1      ZB-H1 of Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR
 *              2024): B and W split, at most min(S, M) micro-batches in
 *              flight on every stage (1F1B's peak, stage 0's). Per step on
 *              stage s: min(S-s, M) warm-up forwards; then for k = 0..M-1:
 *              B of k, W of k-s once k >= s, F of k+S-s while any is left;
 *              then the s W's put off, which fill the cooldown's waits;
 *              OPTIM_STEP (flush). Bubble (S-1)(F+B-W) per stage against
 *              1F1B's (S-1)(F+B+W): with F = B = W, (S-1)/(3M+S-1).
 *   zb-v       ZB-V of Qi et al., "Pipeline Parallelism with Controllable
 *              Memory" (2024), in the order of torch.distributed.pipelining's
 *              ScheduleZBVZeroBubble: V = 2, chunk 0 of stage s is piece s
 *              (down), chunk 1 piece 2S-1-s (back up); the handoff at stage
 *              S-1 is local. M >= 2S. Per step on stage s: 2(S-s)-1 forwards
 *              of chunk 0; s times (F chunk 1, F chunk 0); S-s times (F, B,
 *              W of chunk 1); then while work remains (F chunk 0 while any
 *              is left, B and W chunk 0, F, B and W chunk 1); cooldown: s
 *              times (B chunk 1, B chunk 0), S-s times (B, W chunk 0); the
 *              remaining W's of chunk 1, then of chunk 0; OPTIM_STEP.
 * All three are synchronous: version = step, one OPTIM_STEP per step after
 * every chunk's last W (or BACKWARD), updating all the stage's chunks.
 *   2bw-zb     2bw's update (M >= S, version max(t-1, 0) for step t, two
 *              versions, delay 1) with the backward split and the W's put
 *              off as zb-h1 puts them off: the n_steps*M micro-batches are
 *              one stream in zb-h1's order on stage s (min(S-s, n) warm-up
 *              forwards; for k: B of k, W of k-s once k >= s, F of k+S-s),
 *              OPTIM_STEP t right after the W of step t's last micro-batch.
 *              The forwards of step t+2, which need the version OPTIM_STEP
 *              t makes, come after it since M >= S. Less idle in the
 *              segment's drain (and where messages' latency leaves waits);
 *              up to min(S, M) micro-batches in flight.
 * The executor runs them all (sched/executor.c): B and W with
 * stage_backward_input and _weight, the slot free after W; with V chunks
 * each piece is a worker of its own and a stage's thread (or process) runs
 * its list on them.
 */
#ifndef ASYNCPP_SCHEDULE_H
#define ASYNCPP_SCHEDULE_H

#include <stddef.h>
#include <stdio.h>

enum sched_kind {
	SCHED_GPIPE,
	SCHED_1F1B,
	SCHED_2BW,
	SCHED_PIPEDREAM,
	SCHED_INTERLEAVED,
	SCHED_ZBH1,
	SCHED_ZBV,
	SCHED_2BW_ZB,
	SCHED_NKINDS
};

/* The kinds with one chunk and the fused backward (gpipe .. pipedream). */
#define SCHED_NKINDS_FUSED (SCHED_PIPEDREAM + 1)

enum sched_op {
	SCHED_FORWARD,
	SCHED_BACKWARD,
	SCHED_SEND_ACT,
	SCHED_RECV_ACT,
	SCHED_SEND_GRAD,
	SCHED_RECV_GRAD,
	SCHED_OPTIM_STEP,
	SCHED_BACKWARD_INPUT,
	SCHED_BACKWARD_WEIGHT,
	SCHED_NOPS
};

struct sched_action {
	enum sched_op op;
	int mb;      /* micro-batch in the segment; -1 for OPTIM_STEP */
	int step;    /* segment step of mb, or the step OPTIM_STEP performs */
	int version; /* FORWARD/BACKWARD: version used; OPTIM_STEP: version made;
			sends/receives: the micro-batch's version */
	int peer;    /* sends/receives: the other stage; -1 otherwise */
	int slot;    /* FORWARD and the backwards: activation slot; -1 otherwise */
	int wbuf;    /* FORWARD and the backwards: weight buffer of `version`;
			OPTIM_STEP: the buffer it writes; -1 otherwise */
	int chunk;   /* the stage's chunk (0..V-1) the action belongs to; 0 for
			OPTIM_STEP, which updates every chunk */
};

/* Per stage: its actions and what executing them needs. */
struct sched_stage {
	struct sched_action *a;
	int n;
	int nslots;     /* activation buffers: peak chunk-micro-batches in
			   flight (forwarded, BACKWARD or W not yet run) */
	int npending;   /* peak micro-batches between their B and their W */
	int nversions;  /* weight buffers: peak versions alive at once */
	int vmin, vmax; /* versions the stage holds: vmin <= 0 from the
			   checkpoint, up to vmax = nupdates */
	int *vbuf;      /* [vmax - vmin + 1] buffer of each version; -1 if the
			   version is never needed */
	int nupdates;   /* OPTIM_STEPs */
	int delay_min;  /* over this stage's updates: step - version of the */
	int delay_max;  /* gradient's micro-batches (-1/-1 with no update)   */
};

struct schedule {
	enum sched_kind kind;
	int S, M, n_steps;
	int V;            /* chunks per stage (1 but for interleaved, zb-v) */
	long first_step;  /* global step the segment starts at */
	int n_mb;         /* micro-batches in the segment */
	int forward_only; /* sched_build_forward's lists */
	struct sched_stage *stage; /* [S] */
};

/* Forward-only lists, for evaluation: n_mb micro-batches, each through
 * every piece of kind's layout (V chunks per stage, 0: the kind's own) in
 * model order. Stage s runs, per micro-batch, its pieces in ascending
 * order: FORWARD (step 0, version 0, slot 0: the newest weights), with
 * RECV_ACT before it when the piece before is another stage's and
 * SEND_ACT after it when the piece after is; a handoff between two pieces
 * of one stage has no message, as in the training lists. A piece waits
 * only for a lower piece of its micro-batch or an earlier micro-batch, so
 * no stage waits on one that waits on it. No backward, no OPTIM_STEP:
 * sched_check is for training lists; sched_check_channel_order holds.
 * NULL and err on a layout kind's builder refuses. */
struct schedule *sched_build_forward(enum sched_kind kind, int S, int V, int n_mb, char *err,
				     size_t errlen);

/* Most micro-batches times stages a schedule may hold (memory bound). */
#define SCHED_MAX_CELLS (1L << 22)

/* Build a segment of n_steps optimizer steps. Returns NULL and writes a
 * message to err on bad arguments (S, M, n_steps >= 1; 2bw needs M >= S). */
struct schedule *sched_build(enum sched_kind kind, int S, int M, int n_steps,
			     char *err, size_t errlen);
/* The same for a segment starting at global step first_step >= 0 (only
 * versions differ: see above). */
struct schedule *sched_build_at(enum sched_kind kind, int S, int M, int n_steps,
				long first_step, char *err, size_t errlen);
/* Either with V chunks per stage: interleaved takes V >= 1, zb-v V = 2 only,
 * the others V = 1; 0 picks the kind's default (2 for zb-v, else 1). */
struct schedule *sched_build_virtual(enum sched_kind kind, int S, int M, int V, int n_steps,
				     long first_step, char *err, size_t errlen);
void sched_free(struct schedule *sc);

/* Stage s's actions; *n gets their number. */
const struct sched_action *sched_actions(const struct schedule *sc, int s, int *n);
const struct sched_stage *sched_stage(const struct schedule *sc, int s);
/* The model piece (0..S*V-1) that chunk c of stage s holds; -1 when out of
 * range. sched_piece_stage/_chunk invert it (-1 out of range). */
int sched_piece(const struct schedule *sc, int s, int c);
int sched_piece_stage(const struct schedule *sc, int p);
int sched_piece_chunk(const struct schedule *sc, int p);
/* The activation slots piece p's worker needs: a chunk's forwards take the
 * lowest slot free among that chunk's (per chunk, so a stage's V pieces
 * together hold about nslots, not V times it). At most its stage's nslots. */
int sched_piece_slots(const struct schedule *sc, int p);
/* The segment step micro-batch mb belongs to. */
int sched_mb_step(const struct schedule *sc, int mb);
/* The weight version micro-batch mb uses on stage s (what the builder
 * assigned; tests compare it with the actions). */
int sched_mb_version(const struct schedule *sc, int s, int mb);
/* The weight buffer of version v on stage s, or -1 when that version is
 * never alive there. */
int sched_version_buffer(const struct schedule *sc, int s, int v);

/* "gpipe", "1f1b", "2bw", "pipedream", "interleaved", "zb-h1", "zb-v",
 * "2bw-zb" <-> kind; -1 for an unknown name.
 * "pipedream-flush" is accepted for 1f1b and "pipedream-2bw" for 2bw. */
int sched_kind_from_name(const char *name);
const char *sched_kind_name(enum sched_kind kind);
const char *sched_op_name(enum sched_op op);
/* Is the kind asynchronous (no flush between steps)? */
int sched_kind_async(enum sched_kind kind);
/* Does the kind split the backward into BACKWARD_INPUT and BACKWARD_WEIGHT? */
int sched_kind_split(enum sched_kind kind);
/* Can `asyncpp train` execute the kind (every kind here can; a kind added
 * to be drawn before it is executed answers 0)? */
int sched_kind_trainable(enum sched_kind kind);

/* Check every invariant (see schedule.c): fields in range; each micro-batch
 * forwarded and backwarded once per stage and chunk (split kinds: B and W
 * once each, W after its B); every receive matched by one send of the peer
 * and placed around the right compute of the right chunk, a local handoff
 * after its earlier compute; weight gradients (BACKWARD, W) in ascending mb
 * per chunk; slots freed by BACKWARD or W;
 * the lists complete under buffered sends (no deadlock); slots consistent;
 * versions exist when used, forward and backward agree, the kind's version
 * formula holds, at most nversions alive and buffer reuse safe; each update's
 * delay is the kind's; stats match. Returns 0, or -1 with the first broken
 * invariant in why (stage and action index named). */
int sched_check(const struct schedule *sc, char *why, size_t len);

/* The nccl transport's matching (nccl.h). NCCL pairs a channel's sends and
 * receives by their order, not by (kind, mb, chunk); there is one channel
 * per kind and direction of each pair of stages that exchange messages:
 * activations a -> b and gradients a -> b (for the fused kinds activations
 * s -> s+1 and gradients s+1 -> s; interleaved adds S-1 -> 0 and 0 -> S-1,
 * zb-v activations s+1 -> s and gradients s -> s+1 for chunk 1). The
 * chunks of a stage share its channels. (A transport with a single channel
 * per direction, activations and gradients together, would need one order
 * for both: interleaved and zb-h1 keep it, zb-v does not: stage 0 sends
 * chunk 0's activation of micro-batch 2 to stage 1 before chunk 1's
 * gradient of micro-batch 0, which stage 1 receives first, so zb-v needs
 * the channels per kind.) Checks that on every channel the
 * sender's order of (micro-batch, chunk) is the receiver's, message for
 * message (and their counts
 * agree), and that the lists run to completion when each channel is a
 * FIFO whose send waits on its channel only, never stopping the stage,
 * while a receive stops its stage until the channel's next message was
 * sent. Returns 0, or -1 with the channel and message, or the stuck
 * action, in why. */
int sched_check_channel_order(const struct schedule *sc, char *why, size_t len);

/* ---- simulation (sched/simulate.c) ---- */

/* Durations in any unit. comm is the latency of one message (sends do not
 * occupy the sender); optim is one OPTIM_STEP. reduce is the sum of the
 * stage's gradients over data-parallel replicas (0: none), sent in buckets
 * (>= 1) as the step's last backward finishes them, one bucket at a time
 * (sched/executor.c): it ends at that backward's start + max(bwd/buckets +
 * reduce, bwd + reduce/buckets), and the stage's OPTIM_STEP waits for it. */
struct sim_times {
	double fwd, bwd, comm, optim;
	double reduce;
	int buckets;
	double wfrac; /* the weight gradient's share W of bwd, the input
			 gradient's B the rest (the fused BACKWARD takes bwd =
			 B + W); 0 means 1/2. fwd and bwd are the whole
			 stage's: a chunk's ops take a V-th of them */
};

/* t's W share of the backward (1/2 when wfrac is 0). */
double sim_wfrac(const struct sim_times *t);

/* When a stage's replica sum ends, from the start of the step's last
 * backward (see struct sim_times); start + bwd when reduce is 0. (The
 * simulator starts it at the step's last weight gradient op of any kind,
 * with that op's time in place of bwd.) */
double sim_reduce_end(const struct sim_times *t, double bwd_start);

struct sim_result {
	int S;
	double makespan;        /* end of the last action on any stage */
	double bubble;          /* sum of idle / (S * makespan) */
	double steady_bubble;   /* idle fraction over [steady_t0, steady_t1]; -1 if none */
	double steady_t0, steady_t1;
	int steady_lo, steady_hi; /* the steps [lo, hi) the window covers */
	double *busy;           /* [S] time in FORWARD, BACKWARD, OPTIM_STEP */
	double *idle;           /* [S] makespan - busy */
	double *stage_bubble;   /* [S] idle / makespan */
	double **start, **end;  /* [S][stage's n] each action's times */
};

/* Simulate with the same times on every stage, or with per_stage[S] times
 * (comm of stage s: its messages' latency). Returns 0, or -1 after error()
 * when the lists deadlock. Free with sim_result_free. */
int sched_simulate(const struct schedule *sc, const struct sim_times *t,
		   struct sim_result *r);
int sched_simulate_stages(const struct schedule *sc, const struct sim_times *per_stage,
			  struct sim_result *r);
void sim_result_free(struct sim_result *r);
/* The event loop under both: fills start[s][i] and end[s][i] (caller
 * allocated, or NULL to only test completion). Returns 0, or -1 with the
 * stuck actions in why (no message printed) when the lists deadlock. */
int sched_run(const struct schedule *sc, const struct sim_times *per_stage,
	      double **start, double **end, char *why, size_t len);

/* The sync bubble formula (S-1)/(M+S-1). */
double sched_bubble_formula(int S, int M);
/* The published bubble of sc's kind with equal F, B and W (fwd = 1,
 * bwd = 2, no messages), and its formula as text in text[len]: gpipe and
 * 1f1b (S-1)/(M+S-1); interleaved (S-1)/(V*M+S-1) (Narayanan et al.);
 * zb-h1 (S-1)/(3M+S-1), a third of 1F1B's idle time (Qi et al.: (S-1)(F+B-W)
 * per stage against (S-1)(F+B+W)). -1 (text "n/a") for the asynchronous
 * kinds and zb-v, whose paper gives no closed form (near zero for M >= 2S). */
double sched_bubble_published(const struct schedule *sc, char *text, size_t len);

/* ---- drawing (sched/timeline.c) ---- */

/* Text timeline, one row per stage, at most width characters per row and
 * max_rows stages (0: all); says what it leaves out. Cells: F<mb>, B<mb>
 * (the fused backward or BACKWARD_INPUT), W<mb> (BACKWARD_WEIGHT), U<step>
 * for OPTIM_STEP, '.' idle, '-' the rest of a long op; with V > 1 chunks a
 * letter after the micro-batch names the chunk (a for 0, b for 1, ...). */
void sched_print_timeline(FILE *fp, const struct schedule *sc,
			  const struct sim_result *r, int width, int max_rows);
/* SVG: a box per op (colour by kind, lighter for later chunks), a row per
 * stage, time axis, legend. Written atomically. Returns 0 or -1 after
 * error() naming the path. */
int sched_write_svg(const char *path, const struct schedule *sc,
		    const struct sim_result *r);

#endif
