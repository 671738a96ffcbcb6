/* cudnn_sdpa_graph.h - private to cudnn_sdpa.c and cudnn_sdpa_graph.c: the
 * cuDNN entry points resolved with dlsym, and the graph builder that turns an
 * sdpa_key into the backend descriptors of the forward or backward graph.
 * Needs cuDNN's headers (cudnn_graph.h), for types and enum values only. */
#ifndef ASYNCPP_CUDNN_SDPA_GRAPH_H
#define ASYNCPP_CUDNN_SDPA_GRAPH_H

#include <cudnn_graph.h>

#include "cudnn_sdpa.h"

/* the entry points used, resolved with dlsym */
#define SDPA_FUNCS(X)                                                                    \
	X(cudnnGetVersion, size_t, (void))                                               \
	X(cudnnGetErrorString, const char *, (cudnnStatus_t))                            \
	X(cudnnCreate, cudnnStatus_t, (cudnnHandle_t *))                                 \
	X(cudnnDestroy, cudnnStatus_t, (cudnnHandle_t))                                  \
	X(cudnnSetStream, cudnnStatus_t, (cudnnHandle_t, cudaStream_t))                  \
	X(cudnnBackendCreateDescriptor, cudnnStatus_t,                                   \
	  (cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *))                    \
	X(cudnnBackendDestroyDescriptor, cudnnStatus_t, (cudnnBackendDescriptor_t))      \
	X(cudnnBackendFinalize, cudnnStatus_t, (cudnnBackendDescriptor_t))               \
	X(cudnnBackendSetAttribute, cudnnStatus_t,                                       \
	  (cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,                        \
	   cudnnBackendAttributeType_t, int64_t, const void *))                          \
	X(cudnnBackendGetAttribute, cudnnStatus_t,                                       \
	  (cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,                  \
	   cudnnBackendAttributeType_t, int64_t, int64_t *, void *))                     \
	X(cudnnBackendExecute, cudnnStatus_t,                                            \
	  (cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t))

struct sdpa_api {
#define X(name, ret, args) ret(*name) args;
	SDPA_FUNCS(X)
#undef X
};

#define MAX_DESCS 192 /* descriptors of one graph and its engine choice */
#define MAX_OPS 40

/* Graph building: every call checks the status; the first failure is kept
 * (its call named in why) and later calls do nothing, so a builder reads as
 * the list of what it makes. */
struct gb {
	const struct sdpa_api *api;
	long *created; /* counts every descriptor created (the cache test) */
	cudnnBackendDescriptor_t desc[MAX_DESCS];
	int ndesc;
	cudnnBackendDescriptor_t ops[MAX_OPS];
	int nops;
	int64_t next_uid; /* virtual tensors */
	int failed;
	char why[256];
};

void sdpa_gb_fail(struct gb *g, const char *what, cudnnStatus_t st);
/* a new descriptor of type, kept in g->desc (NULL after a failure) */
cudnnBackendDescriptor_t sdpa_gb_new(struct gb *g, cudnnBackendDescriptorType_t type);
void sdpa_gb_set(struct gb *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
	    cudnnBackendAttributeType_t type, int64_t n, const void *v);
void sdpa_gb_finalize(struct gb *g, cudnnBackendDescriptor_t d, const char *what);
void sdpa_gb_destroy_all(struct gb *g);

/* k's operations into g->ops (the tensors' uids: cudnn_sdpa.h) */
void sdpa_build_forward(struct gb *g, const struct sdpa_key *k);
void sdpa_build_backward(struct gb *g, const struct sdpa_key *k);

#endif
