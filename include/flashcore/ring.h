/*
 * FlashCore ring attention: context parallelism over NCCL (forward pass).
 *
 * One sequence is sharded along its length over the world_size ranks of an NCCL communicator. Each rank keeps its
 * query shard; the key/value shards travel around the ring (rank r sends to r + 1 and receives from r - 1) on a
 * stream of their own while the attention of the current step runs on the caller's stream, and each step's partial
 * (O, LSE) is folded into a float32 state with flashcore_attention_merge. Only KV heads travel (GQA).
 *
 * Shard layouts (FLASHCORE_RING_*), for a sequence of seqlen_global rows:
 *   CONTIGUOUS: rank r holds rows [start_r, start_r + len_r), the sequence cut into world_size near-equal parts.
 *   ZIGZAG:     the sequence is cut into 2 * world_size near-equal chunks c_0 .. c_{2W-1} (the first
 *               seqlen_global % (2W) chunks one row longer); rank r holds c_r followed by c_{2W-1-r}. With causal
 *               masking every rank then does the same work (half of a step's blocks after the first). The default.
 * flashcore_ring_shard() gives a rank's rows. The local tensors are those rows, in that order.
 *
 * NCCL is loaded at run time (dlopen of $FLASHCORE_NCCL_LIBRARY, else libnccl.so.2): FlashCore has no link
 * dependency on it. The caller creates the communicator (ncclCommInitRank, one rank per GPU) and passes it as
 * void*; every rank of it must call flashcore_ring_attention_forward with the same shapes, layout and causal flag,
 * as for any NCCL collective.
 *
 * flashcore_ring_attention_simulate runs the same algorithm for all ranks in one process on the current GPU: the
 * same steps in the same order, the same merge, with device copies in place of the NCCL transfers.
 */
#ifndef FLASHCORE_RING_H_
#define FLASHCORE_RING_H_

#include "flashcore/flashcore.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum flashcore_ring_layout {
  FLASHCORE_RING_ZIGZAG = 0,
  FLASHCORE_RING_CONTIGUOUS = 1
} flashcore_ring_layout;

typedef struct flashcore_ring_params {
  uint32_t struct_size;         /* = sizeof(flashcore_ring_params); set by flashcore_ring_params_init */
  int32_t world_size;           /* ranks in the ring, >= 1 [0: the communicator's size] */
  int32_t rank;                 /* this rank [-1: the communicator's rank]; ignored by _simulate */
  flashcore_ring_layout layout; /* [FLASHCORE_RING_ZIGZAG] */
  int64_t seqlen_global;        /* rows of the whole sequence; each rank's shard follows from the layout */
  void* nccl_comm;              /* ncclComm_t of the ring (forward only; NULL for _simulate and _workspace_size) */
  void* workspace;              /* device memory of flashcore_ring_workspace_size() bytes, 256-byte aligned,
                                   zero-filled before its first use (as flashcore_attention_forward's) */
  uint64_t workspace_size;
  uint32_t flags;               /* FLASHCORE_RING_* bits [0] */
} flashcore_ring_params;

/* flashcore_ring_params::flags. SERIALIZE: each step's transfer starts after the step's attention and the next step
 * waits for it (no overlap of communication and compute; same results): for measuring what the overlap hides. */
#define FLASHCORE_RING_SERIALIZE 1u
#define FLASHCORE_RING_FLAGS_ALL 1u

/* Zero params; set struct_size, rank = -1, layout = FLASHCORE_RING_ZIGZAG. */
FLASHCORE_API void flashcore_ring_params_init(flashcore_ring_params* params);

/* The global rows of `rank`'s shard: [start0, start0 + len0) then [start1, start1 + len1) (len1 = 0 for
 * CONTIGUOUS). Pointers may not be NULL. */
FLASHCORE_API flashcore_status flashcore_ring_shard(const flashcore_ring_params* ring, int32_t rank, int64_t* start0,
                                                    int64_t* len0, int64_t* start1, int64_t* len1);

/* Workspace bytes per rank for ring attention with these local params (sizes as for one rank: seqlen_q and
 * seqlen_k are ignored and follow from ring->seqlen_global). For _simulate, the workspace holds world_size of these
 * (world_size times this size). */
FLASHCORE_API flashcore_status flashcore_ring_workspace_size(const flashcore_attention_params* local,
                                                             const flashcore_ring_params* ring, uint64_t* bytes);

/* Ring attention forward for this rank. `local` describes the rank's shard: q, k, v, o (and lse) are its rows
 * (seqlen_q = seqlen_k = the rank's shard length), batch/heads/head_dim/dtype/scale as usual; causal is the global
 * causal mask. Not with the serving fields (cu_seqlens, block_table, seqused_k, append) or a kernel_config.
 * Enqueued on `stream`; the transfers run on an internal stream ordered against it with events. */
FLASHCORE_API flashcore_status flashcore_ring_attention_forward(const flashcore_attention_params* local,
                                                                const flashcore_ring_params* ring,
                                                                flashcore_stream_t stream);

/* All ranks in one process on the current GPU: local[r] is rank r's shard (r = 0 .. ring->world_size - 1). The
 * workspace holds world_size per-rank workspaces. */
FLASHCORE_API flashcore_status flashcore_ring_attention_simulate(const flashcore_attention_params* const* local,
                                                                 const flashcore_ring_params* ring,
                                                                 flashcore_stream_t stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHCORE_RING_H_ */
