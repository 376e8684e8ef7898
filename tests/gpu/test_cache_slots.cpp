// What serving engines pass since ABI 0.8 (flashcore_attention_params::kv_batch_idx, leftpad_k, cu_seqlens_k_new,
// seqused_q, rotary_cos / rotary_sin; page sizes that are not a multiple of 16), on dense and paged caches, dense or
// packed (varlen) queries, with and without an append, causal or not, with a window.
// Each call is checked three ways:
//   - the cache after the call holds exactly the expected rows (the append at seqused_k[b] of the sequence's slot,
//     nothing else written; a slot outside [0, kv_batch_size) gets nothing);
//   - O and LSE equal, bit for bit, a call without those fields on a cache the host laid out the same way (gathered
//     per slot, shifted left by the padding, appended), i.e. the layout the earlier tests cover;
//   - O against the float64 reference (reference::attention) sequence by sequence, with the suite's tolerance rule
//     (check.h: 2x the error of the low-precision reference plus atol * max(1, |O_ref|)).
// Run on both backends (FLASHCORE_BACKEND=sm80 for the portable one).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "flashcore/flashcore.h"
#include "gpu/device_buffer.h"
#include "gpu/gpu_skip.h"
#include "reference/reference.h"

namespace {

using DeviceBuffer = flashcore::test::DeviceBuffer;

template <class T>
void upload(DeviceBuffer& d, const std::vector<T>& h) {
  ASSERT_EQ(cudaMemcpy(d.ptr, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}
template <class T>
std::vector<T> download(const DeviceBuffer& d, size_t count) {
  std::vector<T> h(count);
  EXPECT_EQ(cudaMemcpy(h.data(), d.ptr, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) {
    const float f = dist(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    x = static_cast<uint16_t>(bits >> 16);
  }
  return v;
}
float bf16_value(uint16_t x) {
  const uint32_t bits = uint32_t{x} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint16_t bf16_bits(float f) {  // round to nearest even (finite values)
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// The rotary embedding as the library computes it (kernels/common/rotary.cuh): head rows of `dim` columns at `row`,
// the first rot_dim rotated by table row `pos` (x' = x c - y s, y' = x s + y c, products rounded before the fused add).
void rotate_rows(uint16_t* row, int64_t heads, int64_t dim, int rot_dim, bool interleaved, const uint16_t* cos_t,
                 const uint16_t* sin_t, int64_t pos) {
  for (int64_t h = 0; h < heads; ++h) {
    uint16_t* x = row + h * dim;
    for (int i = 0; i < rot_dim / 2; ++i) {
      const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + rot_dim / 2;
      const float c = bf16_value(cos_t[pos * (rot_dim / 2) + i]), s = bf16_value(sin_t[pos * (rot_dim / 2) + i]);
      const float xf = bf16_value(x[a]), yf = bf16_value(x[b]);
      const float ys = yf * s, yc = yf * c;
      x[a] = bf16_bits(std::fmaf(xf, c, -ys));
      x[b] = bf16_bits(std::fmaf(xf, s, yc));
    }
  }
}

enum class Append { kNone, kDense, kPacked };

struct SlotCase {
  int head_dim = 128;
  int page_size = 0;  // 0: a dense cache
  bool slots = false;
  bool leftpad = false;
  Append append = Append::kNone;
  bool varlen_q = false;
  bool causal = false;
  int window_left = -1;  // >= 0: local = 1 with (window_left, 0)
  bool bad_slot = false; // sequence 1's slot is outside [0, kv_batch_size)
  bool seqused_q = false; // with varlen_q: sequences use 1, 10 and 50 of their 1, 17 and 64 query rows
  int rotary_dim = 0;     // > 0 (with an append): rotary embedding of the new keys and Q
  bool rotary_interleaved = false;
  bool rotary_seqlens = false;  // positions from rotary_seqlens (the lengths halved) instead of seqused_k

  std::string name() const {
    std::string s = "d" + std::to_string(head_dim) + (page_size ? "_page" + std::to_string(page_size) : "_dense");
    if (slots) s += bad_slot ? "_badslot" : "_slots";
    if (leftpad) s += "_leftpad";
    if (append != Append::kNone) s += append == Append::kDense ? "_append" : "_packedappend";
    if (varlen_q) s += seqused_q ? "_varlenq_sequsedq" : "_varlenq";
    if (causal) s += "_causal";
    if (window_left >= 0) s += "_window" + std::to_string(window_left);
    if (rotary_dim > 0) {
      s += "_rotary" + std::to_string(rotary_dim) + (rotary_interleaved ? "i" : "h") + (rotary_seqlens ? "_pos" : "");
    }
    return s;
  }
};

void run_slot_case(const SlotCase& sc, uint64_t seed) {
  SCOPED_TRACE(sc.name());
  constexpr int64_t B = 3, Hq = 8, Hkv = 2, cap = 512;
  const int64_t D = sc.head_dim;
  const bool paged = sc.page_size > 0;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const std::vector<int32_t> lengths = {37, 300, 470};  // before the append
  const std::vector<int32_t> pads = sc.leftpad ? std::vector<int32_t>{5, 129, 300} : std::vector<int32_t>{0, 0, 0};
  // Queries per sequence (dense Q: 17 for every sequence) and appended rows per sequence.
  const std::vector<int32_t> q_counts = sc.varlen_q ? std::vector<int32_t>{1, 17, 64} : std::vector<int32_t>{17, 17, 17};
  const std::vector<int32_t> q_used = sc.seqused_q ? std::vector<int32_t>{1, 10, 50} : q_counts;
  std::vector<int32_t> new_counts(B, 0);
  if (sc.append == Append::kDense) new_counts = {4, 4, 4};
  if (sc.append == Append::kPacked) new_counts = {2, 0, 5};
  const int64_t seqlen_q = *std::max_element(q_counts.begin(), q_counts.end());
  const int64_t total_q = std::accumulate(q_counts.begin(), q_counts.end(), int64_t{0});
  const int64_t q_rows = sc.varlen_q ? total_q : B * seqlen_q;  // rows of Q / O, all heads
  const int64_t total_new = std::accumulate(new_counts.begin(), new_counts.end(), int64_t{0});
  const int64_t seqlen_new = sc.append == Append::kDense ? 4 : 0;
  auto first_new_of = [&](int64_t b) { return std::accumulate(new_counts.begin(), new_counts.begin() + b, int64_t{0}); };
  auto cu_q_of = [&](int64_t b) { return std::accumulate(q_counts.begin(), q_counts.begin() + b, int64_t{0}); };

  // Cache slots: the sequences use slots `slot[b]` of kv_batch_size = 5 (2 unused); dense: B entries in order.
  const int64_t kv_slots = sc.slots ? 5 : B;
  std::vector<int32_t> slot = sc.slots ? std::vector<int32_t>{3, 0, 4} : std::vector<int32_t>{0, 1, 2};
  if (sc.bad_slot) slot[1] = 7;  // outside [0, 5): no key, no append
  const size_t row_elems = static_cast<size_t>(Hkv * D);
  const int64_t pages_per_slot = paged ? (cap + sc.page_size - 1) / sc.page_size : 0;
  const int64_t num_pages = paged ? kv_slots * pages_per_slot + 2 : 0;
  std::vector<int32_t> table;  // (kv_slots, pages_per_slot), a shuffled pool
  if (paged) {
    std::vector<int32_t> ids(static_cast<size_t>(num_pages));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    table.assign(ids.begin(), ids.begin() + kv_slots * pages_per_slot);
  }
  const int64_t entries = paged ? num_pages : kv_slots, rows_per_entry = paged ? sc.page_size : cap;
  const size_t cache_elems = static_cast<size_t>(entries * rows_per_entry) * row_elems;
  auto where = [&](int64_t s, int64_t pos) -> size_t {  // element offset of row `pos` of slot s, head 0
    if (!paged) return static_cast<size_t>(s * cap + pos) * row_elems;
    const int64_t page = table[static_cast<size_t>(s * pages_per_slot + pos / sc.page_size)];
    return static_cast<size_t>(page * sc.page_size + pos % sc.page_size) * row_elems;
  };
  const bool slot_ok[B] = {slot[0] >= 0 && slot[0] < kv_slots, slot[1] >= 0 && slot[1] < kv_slots,
                           slot[2] >= 0 && slot[2] < kv_slots};

  const std::vector<uint16_t> k0 = random_bf16(cache_elems, rng), v0 = random_bf16(cache_elems, rng);
  const size_t new_elems = static_cast<size_t>(std::max<int64_t>(total_new, 1)) * row_elems;
  const std::vector<uint16_t> kn = random_bf16(new_elems, rng), vn = random_bf16(new_elems, rng);
  const std::vector<uint16_t> q = random_bf16(static_cast<size_t>(q_rows * Hq * D), rng);
  // Rotary tables (cap rows of rotary_dim / 2 angles), positions from the lengths before the append (or their halves).
  const int rd = sc.rotary_dim;
  std::vector<uint16_t> cos_t, sin_t;
  std::vector<int32_t> rot_base = lengths;
  if (sc.rotary_seqlens) for (auto& x : rot_base) x /= 2;
  if (rd > 0) {
    std::uniform_real_distribution<float> angle(0.f, 6.2831853f);
    for (int64_t i = 0; i < cap * rd / 2; ++i) {
      const float a = angle(rng);
      cos_t.push_back(bf16_bits(std::cos(a)));
      sin_t.push_back(bf16_bits(std::sin(a)));
    }
  }
  auto rot_pos = [&](int64_t b, int64_t t) { return std::min<int64_t>(std::max<int64_t>(rot_base[b] + t, 0), cap - 1); };
  std::vector<uint16_t> kn_rot = kn, q_rot = q;  // what the cache receives, and the Q the attention reads
  if (rd > 0) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < new_counts[b]; ++t) {
        const int64_t r = sc.append == Append::kDense ? b * seqlen_new + t : first_new_of(b) + t;
        rotate_rows(kn_rot.data() + r * static_cast<int64_t>(row_elems), Hkv, D, rd, sc.rotary_interleaved, cos_t.data(),
                    sin_t.data(), rot_pos(b, t));
      }
      for (int64_t i = 0; i < q_counts[b]; ++i) {
        const int64_t r = sc.varlen_q ? cu_q_of(b) + i : b * seqlen_q + i;
        rotate_rows(q_rot.data() + r * Hq * D, Hq, D, rd, sc.rotary_interleaved, cos_t.data(), sin_t.data(),
                    rot_pos(b, sc.causal || sc.window_left >= 0 ? i : 0));
      }
    }
  }

  // The expected cache after the call, and each sequence's keys [pad, used) in it.
  std::vector<uint16_t> k1 = k0, v1 = v0;
  std::vector<int32_t> used(B), first_new(B + 1, 0);
  for (int64_t b = 0; b < B; ++b) first_new[b + 1] = first_new[b] + new_counts[b];
  for (int64_t b = 0; b < B; ++b) {
    used[b] = slot_ok[b] ? static_cast<int32_t>(std::min<int64_t>(lengths[b] + new_counts[b], cap)) : 0;
    if (!slot_ok[b]) continue;
    for (int64_t t = 0; t < new_counts[b] && lengths[b] + t < cap; ++t) {
      const size_t src = static_cast<size_t>(sc.append == Append::kDense ? b * seqlen_new + t : first_new[b] + t) *
                         row_elems;
      std::copy_n(kn_rot.begin() + src, row_elems, k1.begin() + where(slot[b], lengths[b] + t));
      std::copy_n(vn.begin() + src, row_elems, v1.begin() + where(slot[b], lengths[b] + t));
    }
  }
  // The baseline's cache: sequence b's keys [pad, used) of its slot moved to entry b (dense: rows from 0; paged: the
  // slot's table row as row b, the pool as after the append, no padding there) and its lengths.
  std::vector<uint16_t> kb, vb;
  std::vector<int32_t> base_table, base_used(B);
  if (paged) {
    kb = k1, vb = v1;
    base_table.assign(static_cast<size_t>(B * pages_per_slot), -1);
    for (int64_t b = 0; b < B; ++b) {
      base_used[b] = used[b];
      if (slot_ok[b]) std::copy_n(table.begin() + slot[b] * pages_per_slot, pages_per_slot, base_table.begin() + b * pages_per_slot);
    }
  } else {
    kb = random_bf16(static_cast<size_t>(B * cap) * row_elems, rng);
    vb = random_bf16(kb.size(), rng);
    for (int64_t b = 0; b < B; ++b) {
      base_used[b] = std::max(used[b] - (slot_ok[b] ? pads[b] : 0), 0);
      for (int64_t j = 0; j < base_used[b]; ++j) {
        std::copy_n(k1.begin() + where(slot[b], pads[b] + j), row_elems, kb.begin() + static_cast<size_t>(b * cap + j) * row_elems);
        std::copy_n(v1.begin() + where(slot[b], pads[b] + j), row_elems, vb.begin() + static_cast<size_t>(b * cap + j) * row_elems);
      }
    }
  }

  std::vector<int32_t> cu_q(B + 1, 0);
  for (int64_t b = 0; b < B; ++b) cu_q[b + 1] = cu_q[b] + q_counts[b];
  const size_t o_elems = static_cast<size_t>(q_rows * Hq * D), lse_n = static_cast<size_t>(q_rows * Hq);
  DeviceBuffer dk(cache_elems * 2), dv(cache_elems * 2), dkb(kb.size() * 2), dvb(vb.size() * 2);
  DeviceBuffer dkn(new_elems * 2), dvn(new_elems * 2), dq(q.size() * 2), do_a(o_elems * 2), do_b(o_elems * 2);
  DeviceBuffer dq_rot(q.size() * 2), dcos(std::max<size_t>(cos_t.size(), 1) * 2), dsin(std::max<size_t>(sin_t.size(), 1) * 2);
  DeviceBuffer drot_base(B * 4);
  DeviceBuffer dq_used(B * 4), dlen(B * 4), dbase_used(B * 4), dpads(B * 4), dslot(B * 4), dcu_q((B + 1) * 4), dcu_new((B + 1) * 4);
  DeviceBuffer dtable(std::max<size_t>(table.size(), 1) * 4), dbase_table(std::max<size_t>(base_table.size(), 1) * 4);
  DeviceBuffer dlse_a(lse_n * 4), dlse_b(lse_n * 4);
  upload(dk, k0), upload(dv, v0), upload(dkb, kb), upload(dvb, vb), upload(dkn, kn), upload(dvn, vn), upload(dq, q);
  upload(dq_rot, q_rot), upload(drot_base, rot_base);
  if (rd > 0) upload(dcos, cos_t), upload(dsin, sin_t);
  upload(dlen, lengths), upload(dbase_used, base_used), upload(dpads, pads), upload(dslot, slot), upload(dcu_q, cu_q);
  upload(dcu_new, first_new), upload(dq_used, q_used);
  if (paged) upload(dtable, table), upload(dbase_table, base_table);
  ASSERT_EQ(cudaMemset(do_a.ptr, 0xff, o_elems * 2), cudaSuccess);  // NaN poison
  ASSERT_EQ(cudaMemset(do_b.ptr, 0xff, o_elems * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(dlse_a.ptr, 0xff, lse_n * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(dlse_b.ptr, 0xff, lse_n * 4), cudaSuccess);
  DeviceBuffer ws(64 << 20);
  ASSERT_EQ(cudaMemset(ws.ptr, 0, 64 << 20), cudaSuccess);

  auto params = [&](const void* qp, void* k, void* v, void* o, float* lse, const void* used_k, const void* tab) {
    flashcore_attention_params p;
    flashcore_attention_params_init(&p);
    p.q = qp, p.k = k, p.v = v, p.o = o, p.lse = lse;
    p.batch = B, p.seqlen_q = seqlen_q, p.seqlen_k = cap, p.num_heads_q = Hq, p.num_heads_kv = Hkv, p.head_dim = D;
    p.dtype = FLASHCORE_DTYPE_BF16;
    p.causal = sc.causal ? 1 : 0;
    if (sc.window_left >= 0) p.local = 1, p.window_size_left = sc.window_left, p.window_size_right = 0;
    p.q_strides = {seqlen_q * Hq * D, Hq * D, D, 1};
    if (sc.varlen_q) {
      p.q_strides.batch = q_rows * Hq * D;
      p.cu_seqlens_q = static_cast<const int32_t*>(dcu_q.ptr);
      p.total_q = total_q;
      if (sc.seqused_q) p.seqused_q = static_cast<const int32_t*>(dq_used.ptr);
    }
    p.o_strides = p.q_strides;
    p.k_strides = {(paged ? sc.page_size : cap) * Hkv * D, Hkv * D, D, 1};
    p.v_strides = p.k_strides;
    p.seqused_k = static_cast<const int32_t*>(used_k);
    p.workspace = ws.ptr, p.workspace_size = 64 << 20;
    if (paged) {
      p.block_table = static_cast<const int32_t*>(tab);
      p.block_table_stride = pages_per_slot;
      p.page_size = sc.page_size;
      p.num_pages = num_pages;
    }
    return p;
  };
  flashcore_attention_params a = params(dq.ptr, dk.ptr, dv.ptr, do_a.ptr, static_cast<float*>(dlse_a.ptr), dlen.ptr, dtable.ptr);
  if (sc.slots) a.kv_batch_idx = static_cast<const int32_t*>(dslot.ptr), a.kv_batch_size = kv_slots;
  if (sc.leftpad) a.leftpad_k = static_cast<const int32_t*>(dpads.ptr);
  if (sc.append != Append::kNone) {
    a.k_new = dkn.ptr, a.v_new = dvn.ptr;
    if (sc.append == Append::kDense) {
      a.seqlen_new = seqlen_new;
      a.k_new_strides = {seqlen_new * Hkv * D, Hkv * D, D, 1};
    } else {
      a.cu_seqlens_k_new = static_cast<const int32_t*>(dcu_new.ptr);
      a.total_k_new = total_new;
      a.k_new_strides = {0, Hkv * D, D, 1};
    }
    a.v_new_strides = a.k_new_strides;
    if (rd > 0) {
      a.rotary_cos = dcos.ptr, a.rotary_sin = dsin.ptr, a.rotary_seqlen = cap, a.rotary_dim = rd;
      a.rotary_interleaved = sc.rotary_interleaved ? 1 : 0;
      if (sc.rotary_seqlens) a.rotary_seqlens = static_cast<const int32_t*>(drot_base.ptr);
    }
  }
  ASSERT_EQ(flashcore_attention_forward(&a, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The workspace's head is zero again after the call (flashcore.h), also with the rotated Q in the workspace: the next
  // call's dynamic tile counter or split counters start from it.
  const std::vector<uint8_t> head = download<uint8_t>(ws, 256);
  EXPECT_TRUE(std::all_of(head.begin(), head.end(), [](uint8_t x) { return x == 0; }))
      << "the workspace's first 256 bytes are not zero after the call";
  flashcore_attention_params b = params(dq_rot.ptr, dkb.ptr, dvb.ptr, do_b.ptr, static_cast<float*>(dlse_b.ptr), dbase_used.ptr,
                                        dbase_table.ptr);
  ASSERT_EQ(flashcore_attention_forward(&b, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  EXPECT_TRUE(download<uint16_t>(dk, cache_elems) == k1) << "K cache after the call";
  EXPECT_TRUE(download<uint16_t>(dv, cache_elems) == v1) << "V cache after the call";
  const std::vector<uint16_t> oa = download<uint16_t>(do_a, o_elems), ob = download<uint16_t>(do_b, o_elems);
  const std::vector<float> la = download<float>(dlse_a, lse_n), lb = download<float>(dlse_b, lse_n);
  // Rows of a dense Q past nothing: every row is a real query here (dense Q: 17 per sequence).
  EXPECT_TRUE(oa == ob) << "O differs from the call on the host-laid-out cache";
  EXPECT_TRUE(std::memcmp(la.data(), lb.data(), lse_n * 4) == 0) << "LSE differs from the call on the host-laid-out cache";

  // Against the float64 reference, sequence by sequence: Q rows of sequence b, its keys [pad, used) of its slot.
  int64_t checked = 0;
  for (int64_t s = 0; s < B; ++s) {
    const int64_t nq = q_used[s], nk = base_used[s];
    for (int64_t i = nq; i < q_counts[s]; ++i) {  // rows past seqused_q: not written
      const int64_t r = sc.varlen_q ? cu_q[s] + i : s * seqlen_q + i;
      for (int64_t e = 0; e < Hq * D; ++e) {
        ASSERT_EQ(oa[static_cast<size_t>(r * Hq * D + e)], 0xffff) << "sequence " << s << " row " << i << " written";
      }
    }
    const int64_t q0 = sc.varlen_q ? cu_q[s] : s * seqlen_q;  // first Q row of the sequence
    std::vector<uint16_t> hk(static_cast<size_t>(std::max<int64_t>(nk, 1)) * row_elems, 0), hv = hk;
    for (int64_t j = 0; j < nk; ++j) {
      std::copy_n(k1.begin() + where(slot[s], pads[s] + j), row_elems, hk.begin() + static_cast<size_t>(j) * row_elems);
      std::copy_n(v1.begin() + where(slot[s], pads[s] + j), row_elems, hv.begin() + static_cast<size_t>(j) * row_elems);
    }
    const int32_t keys = static_cast<int32_t>(nk);
    flashcore_attention_params hp;
    flashcore_attention_params_init(&hp);
    hp.q = q_rot.data() + static_cast<size_t>(q0 * Hq * D), hp.k = hk.data(), hp.v = hv.data();
    hp.batch = 1, hp.seqlen_q = nq, hp.seqlen_k = std::max<int64_t>(nk, 1), hp.num_heads_q = Hq, hp.num_heads_kv = Hkv;
    hp.head_dim = D, hp.dtype = FLASHCORE_DTYPE_BF16, hp.causal = sc.causal ? 1 : 0;
    if (sc.window_left >= 0) hp.local = 1, hp.window_size_left = sc.window_left, hp.window_size_right = 0;
    hp.q_strides = {nq * Hq * D, Hq * D, D, 1};
    hp.k_strides = {hp.seqlen_k * Hkv * D, Hkv * D, D, 1};
    hp.v_strides = hp.k_strides;
    hp.seqused_k = &keys;
    const auto ref = flashcore::reference::attention(hp);
    const auto low = flashcore::reference::attention_lowp(hp);
    double lowp = 0;
    for (size_t i = 0; i < ref.o.size(); ++i) lowp = std::max(lowp, std::fabs(low.o[i] - ref.o[i]));
    for (int64_t i = 0; i < nq; ++i) {
      for (int64_t h = 0; h < Hq; ++h) {
        for (int64_t d = 0; d < D; ++d) {
          const double want = ref.o[static_cast<size_t>((i * Hq + h) * D + d)];
          const double got = bf16_value(oa[static_cast<size_t>(((q0 + i) * Hq + h) * D + d)]);
          const double tol = 2 * lowp + 4e-3 * std::max(1.0, std::fabs(want));
          ASSERT_LE(std::fabs(got - want), tol) << "sequence " << s << " row " << i << " head " << h << " col " << d;
          ++checked;
        }
        // LSE: (B, Hq, Sq) dense, (Hq, total_q) packed.
        const size_t li = sc.varlen_q ? static_cast<size_t>(h * total_q + q0 + i)
                                      : static_cast<size_t>((s * Hq + h) * seqlen_q + i);
        const double want_lse = ref.lse[static_cast<size_t>(h * nq + i)];
        if (std::isinf(want_lse)) {
          EXPECT_TRUE(std::isinf(la[li]) && la[li] < 0) << "sequence " << s << " row " << i << ": LSE " << la[li];
        } else {
          EXPECT_NEAR(la[li], want_lse, 1e-3 * std::max(1.0, std::fabs(want_lse))) << "sequence " << s << " row " << i;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

uint64_t g_seed = 8080;

TEST(CacheSlots, SlotsOnDenseAndPagedCaches) {
  FLASHCORE_REQUIRE_GPU();
  for (int page : {0, 16, 64}) {
    for (bool causal : {false, true}) {
      SlotCase c;
      c.page_size = page, c.slots = true, c.causal = causal;
      run_slot_case(c, g_seed++);
      c.append = Append::kDense;
      run_slot_case(c, g_seed++);
    }
  }
  SlotCase d64;
  d64.head_dim = 64, d64.slots = true, d64.causal = true, d64.append = Append::kDense;
  run_slot_case(d64, g_seed++);
}

TEST(CacheSlots, LeftPaddingOnDenseCaches) {
  FLASHCORE_REQUIRE_GPU();
  for (bool causal : {false, true}) {
    for (Append ap : {Append::kNone, Append::kDense, Append::kPacked}) {
      SlotCase c;
      c.leftpad = true, c.causal = causal, c.append = ap;
      run_slot_case(c, g_seed++);
    }
  }
  SlotCase both;  // slots and padding together, a window counted from the padding
  both.leftpad = true, both.slots = true, both.causal = true, both.window_left = 40, both.append = Append::kDense;
  run_slot_case(both, g_seed++);
}

TEST(CacheSlots, PackedAppendsAndVarlenQueriesOnACache) {
  FLASHCORE_REQUIRE_GPU();
  for (int page : {0, 16, 64}) {
    for (bool causal : {false, true}) {
      SlotCase c;
      c.page_size = page, c.causal = causal, c.varlen_q = true, c.append = Append::kPacked;
      run_slot_case(c, g_seed++);
      c.slots = true;
      run_slot_case(c, g_seed++);
    }
  }
  SlotCase used_q;  // packed queries, some rows of each unused (seqused_q)
  used_q.varlen_q = true, used_q.seqused_q = true, used_q.causal = true, used_q.append = Append::kPacked;
  run_slot_case(used_q, g_seed++);
  used_q.causal = false, used_q.page_size = 16, used_q.slots = true;
  run_slot_case(used_q, g_seed++);
  SlotCase dense_new;  // packed queries with (batch, seqlen_new) new rows
  dense_new.varlen_q = true, dense_new.append = Append::kDense, dense_new.causal = true, dense_new.page_size = 64;
  run_slot_case(dense_new, g_seed++);
}

TEST(CacheSlots, RotaryEmbeddingOnAppend) {
  FLASHCORE_REQUIRE_GPU();
  for (bool interleaved : {false, true}) {
    for (int rd : {32, 128}) {
      for (bool causal : {false, true}) {
        SlotCase c;
        c.append = Append::kDense, c.rotary_dim = rd, c.rotary_interleaved = interleaved, c.causal = causal;
        run_slot_case(c, g_seed++);
      }
    }
  }
  SlotCase paged;  // paged, packed queries and appends, positions from rotary_seqlens, slots
  paged.page_size = 64, paged.varlen_q = true, paged.append = Append::kPacked, paged.rotary_dim = 64;
  paged.rotary_seqlens = true, paged.causal = true, paged.slots = true;
  run_slot_case(paged, g_seed++);
  SlotCase window;  // a window: queries at their own positions; left padding
  window.append = Append::kDense, window.rotary_dim = 64, window.rotary_interleaved = true, window.window_left = 24;
  window.leftpad = true;
  run_slot_case(window, g_seed++);
  SlotCase d64;
  d64.head_dim = 64, d64.append = Append::kDense, d64.rotary_dim = 64, d64.causal = true;
  run_slot_case(d64, g_seed++);
}

// Pages of any size (since 0.8): on Hopper those that are not a multiple of 16 rows run on the portable kernels.
TEST(CacheSlots, AnyPageSize) {
  FLASHCORE_REQUIRE_GPU();
  for (int page : {1, 4, 8, 24, 100}) {
    SlotCase c;
    c.page_size = page, c.causal = page % 2 == 0, c.append = Append::kDense, c.slots = page != 8;
    run_slot_case(c, g_seed++);
    SlotCase v = c;
    v.varlen_q = true, v.append = Append::kPacked, v.rotary_dim = page == 4 ? 64 : 0;
    run_slot_case(v, g_seed++);
  }
  SlotCase d64;
  d64.head_dim = 64, d64.page_size = 1, d64.append = Append::kDense, d64.causal = true;
  run_slot_case(d64, g_seed++);
}

TEST(CacheSlots, SlotOutsideTheCacheGivesNoKeyAndNoAppend) {
  FLASHCORE_REQUIRE_GPU();
  for (int page : {0, 64}) {
    SlotCase c;
    c.page_size = page, c.slots = true, c.bad_slot = true, c.append = Append::kDense, c.causal = true;
    run_slot_case(c, g_seed++);
  }
}

TEST(CacheSlots, ArgumentErrorsNameTheField) {
  FLASHCORE_REQUIRE_GPU();
  DeviceBuffer q(4096), k(65536), v(65536), o(4096), kn(4096), vn(4096), used(64), idx(64), cu(64);
  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.q = q.ptr, p.k = k.ptr, p.v = v.ptr, p.o = o.ptr;
  p.batch = 1, p.seqlen_q = 1, p.seqlen_k = 64, p.num_heads_q = 1, p.num_heads_kv = 1, p.head_dim = 64;
  p.dtype = FLASHCORE_DTYPE_BF16;
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS);
  ASSERT_EQ(cudaMemset(used.ptr, 0, 64), cudaSuccess);
  ASSERT_EQ(cudaMemset(idx.ptr, 0, 64), cudaSuccess);
  auto expect_error = [&](flashcore_status want, const char* field) {
    EXPECT_EQ(flashcore_attention_forward(&p, nullptr), want) << flashcore_last_error();
    EXPECT_NE(std::string(flashcore_last_error()).find(field), std::string::npos) << flashcore_last_error();
  };
  p.kv_batch_idx = static_cast<const int32_t*>(idx.ptr);
  p.kv_batch_size = 1;
  expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, "seqused_k");  // a slot needs a cache's lengths
  p.seqused_k = static_cast<const int32_t*>(used.ptr);
  p.kv_batch_size = 0;
  expect_error(FLASHCORE_ERROR_INVALID_SIZE, "kv_batch_size");
  p.kv_batch_size = 1;
  EXPECT_EQ(flashcore_attention_forward(&p, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  p.kv_batch_idx = reinterpret_cast<const int32_t*>(static_cast<char*>(idx.ptr) + 2);
  expect_error(FLASHCORE_ERROR_MISALIGNED_POINTER, "kv_batch_idx");
  p.kv_batch_idx = nullptr;
  expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, "kv_batch_size");
  p.kv_batch_size = 0;
  p.k_new = kn.ptr, p.v_new = vn.ptr, p.seqlen_new = 1;
  p.k_new_strides = {64, 64, 64, 1};
  p.v_new_strides = p.k_new_strides;
  p.cu_seqlens_k_new = static_cast<const int32_t*>(cu.ptr);
  p.total_k_new = 1;
  expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, "seqlen_new");  // packed rows are counted by cu_seqlens_k_new
  p.seqlen_new = 0;
  p.total_k_new = 0;
  expect_error(FLASHCORE_ERROR_INVALID_SIZE, "total_k_new");
  p.total_k_new = 1;
  ASSERT_EQ(cudaMemset(cu.ptr, 0, 64), cudaSuccess);
  EXPECT_EQ(flashcore_attention_forward(&p, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  p.k_new = p.v_new = nullptr;
  expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, "cu_seqlens_k_new");
  p.cu_seqlens_k_new = nullptr, p.total_k_new = 0;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
