/* expert_mem.h - what expert parallelism's exchange (comm/experts.h) holds
 * of its own, for a trainer: the memory table of `bench train` and the
 * log of `train` show it beside the weights, gradients and activations. */
#ifndef ASYNCPP_EXPERT_MEM_H
#define ASYNCPP_EXPERT_MEM_H

#include "comm/experts_plan.h"
#include "trainer.h"

/* The most the exchange of model.expert_parallel = P > 1 holds on top of
 * the trainer's arenas between processes, for the pieces of one replica
 * this process runs (replica 0's in threads, as if each stage were a
 * process; a rank's own under MPI or TCP), summed over their stages: each
 * stage's process holds comm/experts_plan.h's ep_owner_mem (with host
 * staging on a device backend over MPI or TCP; none over NCCL). In threads
 * the owners compute in the members' buffers and hold nothing. Zero when
 * P <= 1. */
void trainer_ep_mem(const struct trainer *tr, struct ep_mem *m);

#endif
