/* pieces.h - which process of a pipeline holds each model piece.
 *
 * With V chunks per stage (interleaved, zb-v: schedule.h) the model is cut
 * into P = S*V pieces and stage s holds V of them; between processes a
 * rank runs one stage, so the carriers between processes (transport_p2p,
 * board_p2p, replicas_p2p) address pieces and need each piece's stage (its
 * rank within the replica's pipeline) and its chunk there (which tells two
 * pieces' messages between the same two ranks apart). V = 1: piece s is
 * stage s, chunk 0. The executor fills it from the schedule
 * (sched_piece_stage, sched_piece_chunk); the carriers copy what they keep.
 */
#ifndef ASYNCPP_PIECES_H
#define ASYNCPP_PIECES_H

struct pieces {
	int P, S, V;              /* pieces, stages (ranks per pipeline), chunks per stage */
	const int *stage;         /* [P] the stage holding piece p */
	const int *chunk;         /* [P] its chunk on that stage, 0..V-1 */
};

/* How many pieces stage s holds (V, or 0 for a stage out of range). */
static inline int pieces_on(const struct pieces *pc, int s)
{
	int n = 0;
	for (int p = 0; p < pc->P; p++)
		n += pc->stage[p] == s;
	return n;
}

#endif
