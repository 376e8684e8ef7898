// Ring attention (include/flashcore/ring.h): argument checks, each rank's workspace, and the step loop, whose
// transfers are NCCL send/recv on an internal stream (forward) or device copies (simulate). The plan (which rows,
// which block at each step) is ring_plan.h; the attention of a step is flashcore_attention_forward, and its partial
// is folded into a float32 state by the merge kernel (api/merge.h).
#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <cuda_runtime_api.h>

#include "api/backend.h"
#include "core/dtype.h"
#include "api/error.h"
#include "core/launch_util.h"
#include "core/variants.h"
#include "api/merge.h"
#include "api/params.h"
#include "api/validate.h"
#include "dist/nccl.h"
#include "dist/ring_plan.h"
#include "flashcore/ring.h"
#include "kernels/common/merge_launch.h"

namespace flashcore::dist {

namespace {

using api::set_error;

constexpr uint64_t kWorkspaceAlign = 256;
uint64_t round_up(uint64_t x) { return (x + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

// What every rank shares: the ring and the local tensors' shapes.
struct Geometry {
  flashcore_ring_layout layout = FLASHCORE_RING_ZIGZAG;
  bool causal = false;
  int64_t seqlen = 0;  // global
  int world = 1;
  int64_t max_len = 0;  // the longest shard
  int64_t batch = 0, hq = 0, hkv = 0, d = 0;
  flashcore_dtype dtype = FLASHCORE_DTYPE_BF16, out_dtype = FLASHCORE_DTYPE_BF16;
  int64_t esize = 2, osize = 2;
  int device = 0, cc = 0;  // the current device and its compute capability
  // The kernel config of each block shape (q_len, k_len, causal) of the ring (ring_config; nullptr: the library's
  // choice), chosen once by forward_workspace, which sizes the workspace for exactly these.
  std::map<std::tuple<int64_t, int64_t, bool>, const char*> configs;

  int64_t kv_elems(int64_t len) const { return batch * len * hkv * d; }  // one of K, V of a shard
};

// A rank's buffers: byte offsets in its workspace.
struct Layout {
  uint64_t fwd_bytes = 0;  // the forward's workspace, at offset 0 (its first bytes stay zero-filled)
  uint64_t kv[2] = {};     // K then V of the shard in flight, each (batch, len, heads_kv, head_dim), tight
  uint64_t o_acc = 0, lse_acc = 0, o_part = 0, lse_part = 0, total = 0;
};

Layout layout_of(const Geometry& g, uint64_t fwd_bytes) {
  Layout l;
  l.fwd_bytes = round_up(fwd_bytes);
  uint64_t at = l.fwd_bytes;
  auto take = [&](uint64_t bytes) {
    const uint64_t here = at;
    at += round_up(bytes);
    return here;
  };
  const uint64_t rows = static_cast<uint64_t>(g.batch * g.max_len * g.hq);
  l.kv[0] = take(2 * g.kv_elems(g.max_len) * g.esize);
  l.kv[1] = take(2 * g.kv_elems(g.max_len) * g.esize);
  l.o_acc = take(rows * g.d * 4);
  l.lse_acc = take(rows * 4);
  l.o_part = take(rows * g.d * g.osize);
  l.lse_part = take(rows * 4);
  l.total = at;
  return l;
}

bool has_serving_fields(const flashcore_attention_params& p, std::string& which) {
  const std::pair<const char*, bool> fields[] = {
      {"seqused_k", p.seqused_k != nullptr},      {"cu_seqlens_q", p.cu_seqlens_q != nullptr},
      {"cu_seqlens_k", p.cu_seqlens_k != nullptr}, {"block_table", p.block_table != nullptr},
      {"k_new", p.k_new != nullptr},              {"v_new", p.v_new != nullptr},
      {"kernel_config", p.kernel_config != nullptr}, {"num_splits", p.num_splits != 0}};
  for (const auto& [name, set] : fields) {
    if (set) {
      which = name;
      return true;
    }
  }
  return false;
}

// ring's own fields. `world` and `rank` come from the struct (forward fills them from the communicator first).
flashcore_status check_ring(const flashcore_ring_params* ring, std::string& message) {
  if (ring == nullptr) {
    message = "ring is NULL";
    return FLASHCORE_ERROR_NULL_POINTER;
  }
  if (ring->struct_size != sizeof(flashcore_ring_params)) {
    message = "ring->struct_size = " + std::to_string(ring->struct_size) + " is not sizeof(flashcore_ring_params) = " +
              std::to_string(sizeof(flashcore_ring_params)) + " (use flashcore_ring_params_init)";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (ring->layout != FLASHCORE_RING_ZIGZAG && ring->layout != FLASHCORE_RING_CONTIGUOUS) {
    message = "ring->layout = " + std::to_string(static_cast<int>(ring->layout)) +
              " is not FLASHCORE_RING_ZIGZAG (0) or FLASHCORE_RING_CONTIGUOUS (1)";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if ((ring->flags & ~FLASHCORE_RING_FLAGS_ALL) != 0) {
    message = "ring->flags = " + std::to_string(ring->flags) + " has bits no FLASHCORE_RING_* flag defines";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (ring->world_size <= 0 || ring->world_size > 4096) {
    message = "ring->world_size = " + std::to_string(ring->world_size) + " is not in [1, 4096]";
    return FLASHCORE_ERROR_INVALID_SIZE;
  }
  const int64_t shortest = min_seqlen(ring->layout, ring->world_size);
  if (ring->seqlen_global < shortest) {
    message = "ring->seqlen_global = " + std::to_string(ring->seqlen_global) + " is below " +
              std::to_string(shortest) + (ring->layout == FLASHCORE_RING_ZIGZAG ? " = 2 * world_size (ZIGZAG" : " = world_size (CONTIGUOUS") +
              " gives every rank at least one row per chunk)";
    return FLASHCORE_ERROR_INVALID_SIZE;
  }
  if (ring->seqlen_global > api::kMaxSeqlen) {
    message = "ring->seqlen_global = " + std::to_string(ring->seqlen_global) + " exceeds " + std::to_string(api::kMaxSeqlen);
    return FLASHCORE_ERROR_SIZE_OVERFLOW;
  }
  return FLASHCORE_SUCCESS;
}

// Rank `rank`'s local params, upgraded into `p`: the usual checks, plus the ring's (shard length, no serving field).
// check_len = false (the workspace size query): any rank's shard, or none, will do.
flashcore_status check_local(const flashcore_attention_params* user, const flashcore_ring_params& ring, int rank,
                             bool check_len, flashcore_attention_params& p, int& cc, std::string& message) {
  const std::string who = "local[" + std::to_string(rank) + "]";
  if (user == nullptr) {
    message = who + " is NULL";
    return FLASHCORE_ERROR_NULL_POINTER;
  }
  if (flashcore_status s = api::upgrade_params(user, p, message); s != FLASHCORE_SUCCESS) return s;
  std::string field;
  if (has_serving_fields(p, field)) {
    message = who + "." + field + " is set; ring attention takes dense shards only (no serving fields, no kernel_config)";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  const int64_t len = shard_of(ring.layout, ring.seqlen_global, ring.world_size, rank).len();
  if (check_len && (p.seqlen_q != len || p.seqlen_k != len)) {
    message = who + ".seqlen_q = " + std::to_string(p.seqlen_q) + ", seqlen_k = " + std::to_string(p.seqlen_k) +
              ": rank " + std::to_string(rank) + "'s shard has " + std::to_string(len) +
              " rows (flashcore_ring_shard; seqlen_global = " + std::to_string(ring.seqlen_global) + ")";
    return FLASHCORE_ERROR_INVALID_SIZE;
  }
  p.workspace = nullptr;  // the forward's workspace is part of ring->workspace
  p.workspace_size = 0;
  if (flashcore_status s = api::validate_arguments(&p, message); s != FLASHCORE_SUCCESS) {
    message = who + ": " + message;
    return s;
  }
  // The ring's shards and merges have one head dim for K, V and O, one its merge kernel takes.
  if (core::split_head_dims(p) || !api::merge_takes_head_dim(p.head_dim)) {
    message = who + ".head_dim = " + std::to_string(p.head_dim) +
              (core::split_head_dims(p) ? ", head_dim_v = " + std::to_string(p.head_dim_v) : std::string()) +
              ": ring attention takes head dims 64, 128 and 256, with V of the same head dim";
    return FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
  }
  int device = 0;
  if (flashcore_status s = api::validate_device(p, device, cc, message); s != FLASHCORE_SUCCESS) {
    message = who + ": " + message;
    return s;
  }
  return FLASHCORE_SUCCESS;
}

Geometry geometry_of(const flashcore_attention_params& p, const flashcore_ring_params& ring) {
  Geometry g;
  g.layout = ring.layout;
  g.causal = p.causal != 0;
  g.seqlen = ring.seqlen_global;
  g.world = ring.world_size;
  g.max_len = max_shard_len(ring.layout, ring.seqlen_global, ring.world_size);
  g.batch = p.batch;
  g.hq = p.num_heads_q;
  g.hkv = p.num_heads_kv;
  g.d = p.head_dim;
  g.dtype = p.dtype;
  g.out_dtype = p.out_dtype == FLASHCORE_DTYPE_SAME ? p.dtype : p.out_dtype;
  g.esize = dtype_size(g.dtype);
  g.osize = dtype_size(g.out_dtype);
  return g;
}

// The attention params of one block: queries of the local shard against the K/V shard in flight (kv_len rows).
flashcore_attention_params piece_params(const Geometry& g, const flashcore_attention_params& local, char* ws,
                                        const Layout& l, int buffer, int64_t kv_len, const Piece& pc) {
  flashcore_attention_params p = local;
  p.q = static_cast<const char*>(local.q) + pc.q_begin * local.q_strides.seq * g.esize;
  const flashcore_tensor_strides kv_strides{kv_len * g.hkv * g.d, g.hkv * g.d, g.d, 1};
  char* kv = ws + l.kv[buffer];
  p.k = kv + pc.k_begin * kv_strides.seq * g.esize;
  p.v = kv + (g.kv_elems(kv_len) + pc.k_begin * kv_strides.seq) * g.esize;
  p.k_strides = p.v_strides = kv_strides;
  p.o_strides = {g.max_len * g.hq * g.d, g.hq * g.d, g.d, 1};
  p.o = ws + l.o_part + pc.q_begin * p.o_strides.seq * g.osize;
  p.lse = reinterpret_cast<float*>(ws + l.lse_part);
  p.lse_capacity = g.batch * g.hq * pc.q_len;
  p.seqlen_q = pc.q_len;
  p.seqlen_k = pc.k_len;
  p.causal = pc.causal ? 1 : 0;
  p.workspace = l.fwd_bytes > 0 ? ws : nullptr;
  p.workspace_size = l.fwd_bytes;
  return p;
}

// The kernel config of a ring block. A statically scheduled persistent grid (one CTA per SM, each with a fixed share
// of the tiles) runs as long as its latest CTA: the transfer's NCCL kernel, which holds a few SMs at the start of each
// step, would delay every CTA it displaces by the whole transfer. So a block whose config would be "-static" runs
// the same tile shape with the dynamic scheduler (CTAs take tiles from a counter: a late CTA takes fewer), or one
// CTA per tile, when such a row is compiled; otherwise the library's choice. nullptr: the library's choice.
const char* ring_config(const flashcore_attention_params& piece, int device, int cc) {
  const char* selected = nullptr;
  std::string ignored;
  if (backend::selected_config(piece, device, cc, selected, ignored) != FLASHCORE_SUCCESS || selected == nullptr) {
    return nullptr;
  }
  const std::string name = selected;
  const std::string suffix = "-static";
  if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return nullptr;
  }
  const char* names[64];
  int32_t count = 0;
  if (flashcore_list_kernel_configs(piece.dtype, static_cast<int32_t>(piece.head_dim), piece.causal, names, 64,
                                    &count) != FLASHCORE_SUCCESS) {
    return nullptr;
  }
  const std::string stem = name.substr(0, name.size() - suffix.size());
  for (const char* sched : {"-dynamic", "-onecta"}) {
    for (int i = 0; i < std::min(count, 64); ++i) {
      if (stem + sched == names[i]) return names[i];
    }
  }
  return nullptr;
}

// The config of every block shape of the ring (into g.configs) and the forward workspace they need (the largest).
flashcore_status forward_workspace(Geometry& g, const flashcore_attention_params& local, uint64_t& bytes,
                                   std::string& message) {
  g.configs.clear();
  for (int r = 0; r < g.world; ++r) {
    for (int s = 0; s < g.world; ++s) {
      Piece pc;
      if (step_piece(g.layout, g.causal, g.seqlen, g.world, r, s, pc)) g.configs.emplace(std::make_tuple(pc.q_len, pc.k_len, pc.causal), nullptr);
    }
  }
  bytes = 0;
  for (auto& [shape, config] : g.configs) {
    flashcore_attention_params p = local;
    p.seqlen_q = std::get<0>(shape);
    p.seqlen_k = std::get<1>(shape);
    p.causal = std::get<2>(shape) ? 1 : 0;
    p.workspace = nullptr;
    p.workspace_size = 0;
    config = p.kernel_config = ring_config(p, g.device, g.cc);
    size_t size = 0;
    if (flashcore_status s = backend::workspace_size(p, g.cc, size, message); s != FLASHCORE_SUCCESS) return s;
    bytes = std::max<uint64_t>(bytes, size);
  }
  return FLASHCORE_SUCCESS;
}

flashcore_status cuda_status(const char* what, cudaError_t err, std::string& message) {
  if (err == cudaSuccess) return FLASHCORE_SUCCESS;
  message = core::cuda_message(what, err);
  return FLASHCORE_ERROR_CUDA;
}

// The merge of a step, through the public checks (a wrong internal layout is an error, never a stray write).
flashcore_status merge(const flashcore_merge_params& m, cudaStream_t stream, std::string& message) {
  flashcore_merge_params checked;
  if (flashcore_status s = api::validate_merge(&m, checked, message); s != FLASHCORE_SUCCESS) {
    message = "ring merge: " + message;
    return FLASHCORE_ERROR_INTERNAL;
  }
  return api::launch_merge_checked(checked, stream, message);
}

// One rank of the ring: its shard, its workspace, the state it folds each step into.
struct Rank {
  const flashcore_attention_params* local = nullptr;  // checked, current layout
  int rank = 0;
  char* ws = nullptr;
  float* lse_state = nullptr;  // the caller's lse when given (it is the state's LSE), else the workspace's
  int64_t lse_len = 0;         // its seq extent

  // Pack the local K and V into transfer buffer 0.
  flashcore_status pack(const Geometry& g, const Layout& l, cudaStream_t stream, std::string& message) const {
    const int64_t len = local->seqlen_k;
    const void* src[2] = {local->k, local->v};
    const flashcore_tensor_strides* ss[2] = {&local->k_strides, &local->v_strides};
    for (int t = 0; t < 2; ++t) {
      kernels::CopyRowsParams c{};
      c.src = static_cast<const unsigned char*>(src[t]);
      c.dst = reinterpret_cast<unsigned char*>(ws + l.kv[0] + t * g.kv_elems(len) * g.esize);
      c.src_stride[0] = ss[t]->batch * g.esize;
      c.src_stride[1] = ss[t]->seq * g.esize;
      c.src_stride[2] = ss[t]->head * g.esize;
      c.dst_stride[0] = len * g.hkv * g.d * g.esize;
      c.dst_stride[1] = g.hkv * g.d * g.esize;
      c.dst_stride[2] = g.d * g.esize;
      c.seqlen = len;
      c.heads = g.hkv;
      c.rows = g.batch * len * g.hkv;
      c.row_units = static_cast<int>(g.d * g.esize / 16);
      if (flashcore_status s = cuda_status("ring: packing K/V", kernels::launch_copy_rows(c, stream), message);
          s != FLASHCORE_SUCCESS) {
        return s;
      }
    }
    return FLASHCORE_SUCCESS;
  }

  flashcore_merge_params merge_params(const Geometry& g, const Layout& l, int64_t q_begin, int64_t q_len) const {
    flashcore_merge_params m;
    flashcore_merge_params_init(&m);
    m.batch = g.batch;
    m.seqlen = q_len;
    m.num_heads = g.hq;
    m.head_dim = g.d;
    m.part_dtype = g.out_dtype;
    const flashcore_tensor_strides state{g.max_len * g.hq * g.d, g.hq * g.d, g.d, 1};
    m.o_part = ws + l.o_part + q_begin * state.seq * g.osize;
    m.o_part_strides = state;
    m.lse_part = reinterpret_cast<const float*>(ws + l.lse_part);
    m.lse_part_strides = {g.hq * q_len, q_len, 1};
    m.o_acc = reinterpret_cast<float*>(ws + l.o_acc) + q_begin * state.seq;
    m.o_acc_strides = state;
    m.lse_acc = lse_state + q_begin;
    m.lse_acc_strides = {g.hq * lse_len, lse_len, 1};
    m.out_dtype = g.out_dtype;
    return m;
  }

  void set_output(const Geometry& g, flashcore_merge_params& m, int64_t q_begin) const {
    m.o_out = static_cast<char*>(local->o) + q_begin * local->o_strides.seq * g.osize;
    m.o_out_strides = local->o_strides;
  }

  // Step `step`: the block against the K/V in `buffer` (kv_len rows), folded into the state; at the last step
  // the state is written to O.
  flashcore_status compute(const Geometry& g, const Layout& l, int step, int buffer, cudaStream_t stream,
                           std::string& message) const {
    const int64_t kv_len = shard_of(g.layout, g.seqlen, g.world, kv_source(g.world, rank, step)).len();
    const bool last = step == g.world - 1;
    Piece pc;
    bool wrote_all = false;
    if (step_piece(g.layout, g.causal, g.seqlen, g.world, rank, step, pc)) {
      flashcore_attention_params p = piece_params(g, *local, ws, l, buffer, kv_len, pc);
      p.kernel_config = g.configs.at(std::make_tuple(pc.q_len, pc.k_len, pc.causal));
      if (flashcore_status s = flashcore_attention_forward(&p, reinterpret_cast<flashcore_stream_t>(stream));
          s != FLASHCORE_SUCCESS) {
        message = "ring step " + std::to_string(step) + ": " + flashcore_last_error();
        return s;
      }
      flashcore_merge_params m = merge_params(g, l, pc.q_begin, pc.q_len);
      m.init = step == 0 ? 1 : 0;
      wrote_all = last && pc.q_begin == 0 && pc.q_len == local->seqlen_q;
      if (wrote_all) set_output(g, m, 0);
      if (flashcore_status s = merge(m, stream, message); s != FLASHCORE_SUCCESS) return s;
    }
    if (last && !wrote_all) {  // the last block covered part of the rows (or none): write O from the state
      flashcore_merge_params m = merge_params(g, l, 0, local->seqlen_q);
      m.o_part = nullptr;
      m.lse_part = nullptr;
      set_output(g, m, 0);
      if (flashcore_status s = merge(m, stream, message); s != FLASHCORE_SUCCESS) return s;
    }
    return FLASHCORE_SUCCESS;
  }
};

Rank make_rank(const Geometry& g, const Layout& l, const flashcore_attention_params& p, int rank, char* ws) {
  Rank r;
  r.local = &p;
  r.rank = rank;
  r.ws = ws;
  if (p.lse != nullptr) {
    r.lse_state = p.lse;
    r.lse_len = p.seqlen_q;
  } else {
    r.lse_state = reinterpret_cast<float*>(ws + l.lse_acc);
    r.lse_len = g.max_len;
  }
  return r;
}

flashcore_status check_workspace(const flashcore_ring_params& ring, uint64_t needed, std::string& message) {
  if (needed == 0) return FLASHCORE_SUCCESS;
  if (ring.workspace == nullptr || ring.workspace_size < needed) {
    message = "ring->workspace_size = " + std::to_string(ring.workspace_size) +
              (ring.workspace == nullptr ? " with a NULL workspace" : "") + ": " + std::to_string(needed) +
              " bytes are needed (flashcore_ring_workspace_size)";
    return ring.workspace == nullptr ? FLASHCORE_ERROR_NULL_POINTER : FLASHCORE_ERROR_INVALID_SIZE;
  }
  if (reinterpret_cast<uintptr_t>(ring.workspace) % kWorkspaceAlign != 0) {
    message = "ring->workspace is not 256-byte aligned";
    return FLASHCORE_ERROR_MISALIGNED_POINTER;
  }
  return FLASHCORE_SUCCESS;
}

// Checks shared by the three entries: ring, then the local params of `ranks` (rank numbers), all of one geometry.
// `locals` receives the upgraded params; `layout` the per-rank workspace layout.
flashcore_status prepare(const flashcore_attention_params* const* users, const std::vector<int>& ranks,
                         const flashcore_ring_params& ring, bool check_len, std::vector<flashcore_attention_params>& locals,
                         Geometry& g, Layout& layout, std::string& message) {
  if (flashcore_status s = check_ring(&ring, message); s != FLASHCORE_SUCCESS) return s;
  locals.resize(ranks.size());
  int cc = 0;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (flashcore_status s = check_local(users[i], ring, ranks[i], check_len, locals[i], cc, message); s != FLASHCORE_SUCCESS) {
      return s;
    }
    const flashcore_attention_params& a = locals[0];
    const flashcore_attention_params& b = locals[i];
    const char* differs = a.batch != b.batch                 ? "batch"
                          : a.num_heads_q != b.num_heads_q   ? "num_heads_q"
                          : a.num_heads_kv != b.num_heads_kv ? "num_heads_kv"
                          : a.head_dim != b.head_dim         ? "head_dim"
                          : a.dtype != b.dtype               ? "dtype"
                          : a.out_dtype != b.out_dtype       ? "out_dtype"
                          : a.causal != b.causal             ? "causal"
                          : a.softmax_scale != b.softmax_scale ? "softmax_scale"
                                                             : nullptr;
    if (differs != nullptr) {
      message = "local[" + std::to_string(ranks[i]) + "]." + differs + " differs from local[0]'s: every rank has the same shapes";
      return FLASHCORE_ERROR_INVALID_ARGUMENT;
    }
  }
  g = geometry_of(locals[0], ring);
  g.cc = cc;
  if (cudaGetDevice(&g.device) != cudaSuccess) (void)cudaGetLastError();
  uint64_t fwd = 0;
  if (flashcore_status s = forward_workspace(g, locals[0], fwd, message); s != FLASHCORE_SUCCESS) return s;
  layout = layout_of(g, fwd);
  return FLASHCORE_SUCCESS;
}

// The communicator's size, rank and device, against ring's and the current device.
flashcore_status check_comm(const NcclApi& nccl, flashcore_ring_params& ring, std::string& message) {
  if (ring.nccl_comm == nullptr) {
    message = "ring->nccl_comm is NULL (flashcore_ring_attention_simulate runs without one)";
    return FLASHCORE_ERROR_NULL_POINTER;
  }
  int count = 0, rank = 0, device = 0, current = 0;
  NcclApi::Result r = nccl.comm_count(ring.nccl_comm, &count);
  if (r == 0) r = nccl.comm_user_rank(ring.nccl_comm, &rank);
  if (r == 0) r = nccl.comm_cu_device(ring.nccl_comm, &device);
  if (r != 0) {
    message = nccl_message(nccl, "querying ring->nccl_comm", r);
    return FLASHCORE_ERROR_NCCL;
  }
  if (ring.world_size == 0) ring.world_size = count;
  if (ring.rank < 0) ring.rank = rank;
  if (ring.world_size != count || ring.rank != rank) {
    message = "ring->world_size = " + std::to_string(ring.world_size) + ", rank = " + std::to_string(ring.rank) +
              " but the communicator has " + std::to_string(count) + " ranks and this is rank " + std::to_string(rank);
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (cudaGetDevice(&current) == cudaSuccess && current != device) {
    message = "ring->nccl_comm belongs to device " + std::to_string(device) + ", the current device is " +
              std::to_string(current);
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  return FLASHCORE_SUCCESS;
}

// Streams and events of one forward call, released on every path (CUDA defers the release past pending work).
struct CommResources {
  cudaStream_t comm = nullptr;
  cudaEvent_t ready = nullptr, received = nullptr;
  ~CommResources() {
    if (ready != nullptr) cudaEventDestroy(ready);
    if (received != nullptr) cudaEventDestroy(received);
    if (comm != nullptr) cudaStreamDestroy(comm);
  }
  cudaError_t create() {
    // The highest priority: when a step's transfer and attention become ready together, the transfer's NCCL kernel
    // is dispatched first (a persistent attention grid would otherwise hold every SM until it ends).
    int least = 0, greatest = 0;
    cudaError_t err = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (err == cudaSuccess) err = cudaStreamCreateWithPriority(&comm, cudaStreamNonBlocking, greatest);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&received, cudaEventDisableTiming);
    return err;
  }
};

flashcore_status run_nccl(const NcclApi& nccl, const flashcore_ring_params& ring, const Geometry& g, const Layout& l,
                          const Rank& me, cudaStream_t stream, std::string& message) {
  CommResources res;
  if (flashcore_status s = cuda_status("ring: creating the transfer stream", res.create(), message); s != FLASHCORE_SUCCESS) {
    return s;
  }
  if (flashcore_status s = me.pack(g, l, stream, message); s != FLASHCORE_SUCCESS) return s;
  const int next = (me.rank + 1) % g.world, prev = (me.rank + g.world - 1) % g.world;
  const bool serialize = (ring.flags & FLASHCORE_RING_SERIALIZE) != 0;
  for (int step = 0; step < g.world; ++step) {
    const int cur = step % 2;
    if (serialize) {  // the step's attention first, then its transfer
      if (flashcore_status s = me.compute(g, l, step, cur, stream, message); s != FLASHCORE_SUCCESS) return s;
    }
    if (step + 1 < g.world) {
      // Send the K/V in `cur` on, receive the next into the other buffer, which the previous step's block read.
      const int64_t send_len = shard_of(g.layout, g.seqlen, g.world, kv_source(g.world, me.rank, step)).len();
      const int64_t recv_len = shard_of(g.layout, g.seqlen, g.world, kv_source(g.world, me.rank, step + 1)).len();
      flashcore_status s = cuda_status("ring: cudaEventRecord", cudaEventRecord(res.ready, stream), message);
      if (s == FLASHCORE_SUCCESS) s = cuda_status("ring: cudaStreamWaitEvent", cudaStreamWaitEvent(res.comm, res.ready, 0), message);
      if (s != FLASHCORE_SUCCESS) return s;
      NcclApi::Result r = nccl.group_start();
      if (r == 0) {
        r = nccl.send(me.ws + l.kv[cur], static_cast<size_t>(2 * g.kv_elems(send_len) * g.esize), NcclApi::kUint8,
                      next, ring.nccl_comm, res.comm);
        const NcclApi::Result r2 = nccl.recv(me.ws + l.kv[1 - cur], static_cast<size_t>(2 * g.kv_elems(recv_len) * g.esize),
                                             NcclApi::kUint8, prev, ring.nccl_comm, res.comm);
        const NcclApi::Result r3 = nccl.group_end();
        r = r != 0 ? r : r2 != 0 ? r2 : r3;
      }
      if (r != 0) {
        message = nccl_message(nccl, ("ring step " + std::to_string(step) + ": send/recv").c_str(), r);
        return FLASHCORE_ERROR_NCCL;
      }
      if (flashcore_status s2 = cuda_status("ring: cudaEventRecord", cudaEventRecord(res.received, res.comm), message);
          s2 != FLASHCORE_SUCCESS) {
        return s2;
      }
    }
    if (!serialize) {
      if (flashcore_status s = me.compute(g, l, step, cur, stream, message); s != FLASHCORE_SUCCESS) return s;
    }
    if (step + 1 < g.world) {
      if (flashcore_status s = cuda_status("ring: cudaStreamWaitEvent", cudaStreamWaitEvent(stream, res.received, 0), message);
          s != FLASHCORE_SUCCESS) {
        return s;
      }
    }
  }
  return FLASHCORE_SUCCESS;
}

flashcore_status run_simulated(const Geometry& g, const Layout& l, const std::vector<Rank>& ranks, cudaStream_t stream,
                               std::string& message) {
  for (const Rank& r : ranks) {
    if (flashcore_status s = r.pack(g, l, stream, message); s != FLASHCORE_SUCCESS) return s;
  }
  for (int step = 0; step < g.world; ++step) {
    const int cur = step % 2;
    for (const Rank& r : ranks) {
      if (flashcore_status s = r.compute(g, l, step, cur, stream, message); s != FLASHCORE_SUCCESS) return s;
    }
    if (step + 1 == g.world) break;
    for (const Rank& r : ranks) {  // what rank r receives: rank r - 1's buffer `cur`
      const Rank& from = ranks[(r.rank + g.world - 1) % g.world];
      const int64_t len = shard_of(g.layout, g.seqlen, g.world, kv_source(g.world, r.rank, step + 1)).len();
      const cudaError_t err = cudaMemcpyAsync(r.ws + l.kv[1 - cur], from.ws + l.kv[cur],
                                              static_cast<size_t>(2 * g.kv_elems(len) * g.esize),
                                              cudaMemcpyDeviceToDevice, stream);
      if (flashcore_status s = cuda_status("ring (simulated): transfer copy", err, message); s != FLASHCORE_SUCCESS) return s;
    }
  }
  return FLASHCORE_SUCCESS;
}

// world_size 1: the plain forward, with ring's workspace as its own.
flashcore_status run_single(const flashcore_attention_params& local, const Layout& l, const flashcore_ring_params& ring,
                            cudaStream_t stream, std::string& message) {
  if (flashcore_status s = check_workspace(ring, l.fwd_bytes, message); s != FLASHCORE_SUCCESS) return s;
  flashcore_attention_params p = local;
  p.workspace = l.fwd_bytes > 0 ? ring.workspace : nullptr;
  p.workspace_size = l.fwd_bytes;
  if (flashcore_status s = flashcore_attention_forward(&p, reinterpret_cast<flashcore_stream_t>(stream));
      s != FLASHCORE_SUCCESS) {
    message = flashcore_last_error();
    return s;
  }
  return FLASHCORE_SUCCESS;
}

}  // namespace

}  // namespace flashcore::dist

using flashcore::api::guarded;
using flashcore::api::set_error;
namespace dist = flashcore::dist;

extern "C" {

void flashcore_ring_params_init(flashcore_ring_params* params) {
  flashcore::api::clear_error();
  if (params == nullptr) {
    set_error(FLASHCORE_ERROR_NULL_POINTER, "flashcore_ring_params_init: params is NULL");
    return;
  }
  std::memset(params, 0, sizeof(*params));
  params->struct_size = sizeof(*params);
  params->rank = -1;
  params->layout = FLASHCORE_RING_ZIGZAG;
}

flashcore_status flashcore_ring_shard(const flashcore_ring_params* ring, int32_t rank, int64_t* start0, int64_t* len0,
                                      int64_t* start1, int64_t* len1) {
  return guarded("flashcore_ring_shard", [&]() -> flashcore_status {
    std::string message;
    if (start0 == nullptr || len0 == nullptr || start1 == nullptr || len1 == nullptr) {
      return set_error(FLASHCORE_ERROR_NULL_POINTER, "flashcore_ring_shard: an output pointer is NULL");
    }
    if (flashcore_status s = dist::check_ring(ring, message); s != FLASHCORE_SUCCESS) {
      return set_error(s, "flashcore_ring_shard: " + message);
    }
    if (rank < 0 || rank >= ring->world_size) {
      return set_error(FLASHCORE_ERROR_INVALID_ARGUMENT, "flashcore_ring_shard: rank = " + std::to_string(rank) +
                                                             " is not in [0, world_size = " +
                                                             std::to_string(ring->world_size) + ")");
    }
    const dist::Shard s = dist::shard_of(ring->layout, ring->seqlen_global, ring->world_size, rank);
    *start0 = s.first.start;
    *len0 = s.first.len;
    *start1 = s.second.start;
    *len1 = s.second.len;
    return FLASHCORE_SUCCESS;
  });
}

flashcore_status flashcore_ring_workspace_size(const flashcore_attention_params* local,
                                               const flashcore_ring_params* ring, uint64_t* bytes) {
  return guarded("flashcore_ring_workspace_size", [&]() -> flashcore_status {
    if (bytes == nullptr) return set_error(FLASHCORE_ERROR_NULL_POINTER, "flashcore_ring_workspace_size: bytes is NULL");
    *bytes = 0;
    std::string message;
    if (flashcore_status s = dist::check_ring(ring, message); s != FLASHCORE_SUCCESS) {
      return set_error(s, "flashcore_ring_workspace_size: " + message);
    }
    if (local == nullptr) return set_error(FLASHCORE_ERROR_NULL_POINTER, "flashcore_ring_workspace_size: local is NULL");
    // Any rank's local params will do: the sizes follow from the ring (the longest shard counts).
    const flashcore_attention_params* users[] = {local};
    std::vector<flashcore_attention_params> locals;
    dist::Geometry g;
    dist::Layout layout;
    if (flashcore_status s = dist::prepare(users, {0}, *ring, /*check_len=*/false, locals, g, layout, message);
        s != FLASHCORE_SUCCESS) {
      return set_error(s, "flashcore_ring_workspace_size: " + message);
    }
    *bytes = ring->world_size == 1 ? layout.fwd_bytes : layout.total;
    return FLASHCORE_SUCCESS;
  });
}

flashcore_status flashcore_ring_attention_forward(const flashcore_attention_params* local,
                                                  const flashcore_ring_params* ring_in, flashcore_stream_t stream) {
  return guarded("flashcore_ring_attention_forward", [&]() -> flashcore_status {
    std::string message;
    auto fail = [&](flashcore_status s) { return set_error(s, "flashcore_ring_attention_forward: " + message); };
    if (ring_in == nullptr) {
      message = "ring is NULL";
      return fail(FLASHCORE_ERROR_NULL_POINTER);
    }
    flashcore_ring_params ring = *ring_in;
    if (ring.struct_size != sizeof(flashcore_ring_params)) {
      message = "ring->struct_size = " + std::to_string(ring.struct_size) + " is not sizeof(flashcore_ring_params)";
      return fail(FLASHCORE_ERROR_INVALID_ARGUMENT);
    }
    const dist::NcclApi* nccl = dist::nccl(message);
    if (nccl == nullptr) return fail(FLASHCORE_ERROR_NCCL);
    if (flashcore_status s = dist::check_comm(*nccl, ring, message); s != FLASHCORE_SUCCESS) return fail(s);
    std::vector<flashcore_attention_params> locals;
    dist::Geometry g;
    dist::Layout layout;
    const flashcore_attention_params* users[] = {local};
    if (flashcore_status s = dist::prepare(users, {ring.rank}, ring, /*check_len=*/true, locals, g, layout, message); s != FLASHCORE_SUCCESS) {
      return fail(s);
    }
    const auto cuda_stream = reinterpret_cast<cudaStream_t>(stream);
    if (g.world == 1) {
      const flashcore_status s = dist::run_single(locals[0], layout, ring, cuda_stream, message);
      return s == FLASHCORE_SUCCESS ? s : fail(s);
    }
    if (flashcore_status s = dist::check_workspace(ring, layout.total, message); s != FLASHCORE_SUCCESS) return fail(s);
    const dist::Rank me = dist::make_rank(g, layout, locals[0], ring.rank, static_cast<char*>(ring.workspace));
    if (flashcore_status s = dist::run_nccl(*nccl, ring, g, layout, me, cuda_stream, message); s != FLASHCORE_SUCCESS) {
      return fail(s);
    }
    return FLASHCORE_SUCCESS;
  });
}

flashcore_status flashcore_ring_attention_simulate(const flashcore_attention_params* const* local,
                                                   const flashcore_ring_params* ring, flashcore_stream_t stream) {
  return guarded("flashcore_ring_attention_simulate", [&]() -> flashcore_status {
    std::string message;
    auto fail = [&](flashcore_status s) { return set_error(s, "flashcore_ring_attention_simulate: " + message); };
    if (local == nullptr) {
      message = "local is NULL";
      return fail(FLASHCORE_ERROR_NULL_POINTER);
    }
    if (flashcore_status s = dist::check_ring(ring, message); s != FLASHCORE_SUCCESS) return fail(s);
    std::vector<int> ranks(static_cast<size_t>(ring->world_size));
    for (int r = 0; r < ring->world_size; ++r) ranks[static_cast<size_t>(r)] = r;
    std::vector<flashcore_attention_params> locals;
    dist::Geometry g;
    dist::Layout layout;
    if (flashcore_status s = dist::prepare(local, ranks, *ring, /*check_len=*/true, locals, g, layout, message); s != FLASHCORE_SUCCESS) {
      return fail(s);
    }
    const auto cuda_stream = reinterpret_cast<cudaStream_t>(stream);
    if (g.world == 1) {
      const flashcore_status s = dist::run_single(locals[0], layout, *ring, cuda_stream, message);
      return s == FLASHCORE_SUCCESS ? s : fail(s);
    }
    const uint64_t per_rank = layout.total;
    if (flashcore_status s = dist::check_workspace(*ring, per_rank * static_cast<uint64_t>(g.world), message);
        s != FLASHCORE_SUCCESS) {
      return fail(s);
    }
    std::vector<dist::Rank> rs;
    for (int r = 0; r < g.world; ++r) {
      rs.push_back(dist::make_rank(g, layout, locals[static_cast<size_t>(r)], r,
                                   static_cast<char*>(ring->workspace) + per_rank * static_cast<uint64_t>(r)));
    }
    if (flashcore_status s = dist::run_simulated(g, layout, rs, cuda_stream, message); s != FLASHCORE_SUCCESS) {
      return fail(s);
    }
    return FLASHCORE_SUCCESS;
  });
}

}  // extern "C"
