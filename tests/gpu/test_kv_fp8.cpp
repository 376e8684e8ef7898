// An e4m3 KV cache under 16-bit Q (FLASHCORE_FLAG_KV_FP8_E4M3, ABI 0.9; sm90 rows of configs_kv8.txt): K and V hold
// float8_e4m3fn bytes whose real value is byte * k_descale[b][h] / * v_descale[b][h]. Decode (one query per sequence,
// split into parts) and chunked prefill (17 and packed queries, causal), on dense caches, cache slots
// (kv_batch_idx) and paged caches (pages of 16, 64 and 256 rows), GQA, head dims 64 / 128 / 256, bf16 and fp16.
// Every cache row no sequence may read holds NaN (0x7F), O and LSE are poisoned before the call. Checks:
//   - O and LSE against the float64 reference of the dequantized cache, sequence by sequence, with the suite's rule
//     (2x the error of the low-precision reference, which reads the cache rounded to the 16-bit dtype, plus
//     atol * max(1, |O_ref|));
//   - with power-of-two descales and one query (decode, non-causal), O and LSE bit for bit those of the 16-bit call
//     on the dequantized cache (exact in 16 bits) run on the same tile (kernel_config, the 16-bit split row): the
//     widened tile holds the same values, and the descales scale the scores and O by powers of two. bf16 Q computes
//     in fp16 with Q times 2^e per tile (sm90 convert_kv.cuh q_slice_to_half): there each Q row holds one +-4 and
//     smaller values, so that e = 12 in every tile, and the baseline is the fp16 call with Q times 2^12 and the
//     softmax scale times 2^-12: the same LSE bit for bit, and O within one bf16 ulp of the fp16 call's (O rounded
//     to bf16 once, to fp16 there);
//   - appends (k_new / v_new, 16-bit rows, optionally rotated): the cache afterwards byte for byte the host's
//     quantization (x / descale, rounded to nearest even, saturated; rows no sequence may read untouched), and O
//     against the reference of that cache;
//   - Q far outside fp16's range (N(0, 1) times 2^20 or 2^-20, the softmax scale divided by it) against the float64
//     reference, as above.
// Hopper only (the sm90 kernels); on another GPU the call must refuse the flag, which is checked instead.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <cuda_fp16.h>
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

constexpr uint8_t kE4m3Nan = 0x7F;

float e4m3_value(uint8_t x) {
  const int e = (x >> 3) & 15, m = x & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  const float v = e == 0 ? std::ldexp(m / 8.f, -6) : std::ldexp(1.f + m / 8.f, e - 7);
  return (x & 0x80) ? -v : v;
}
// e4m3 of f as the append stores it: round to nearest even, saturated to +-448, NaN to NaN, the sign kept.
uint8_t e4m3_rne(float f) {
  if (std::isnan(f)) return kE4m3Nan;
  const float a = std::min(std::fabs(f), 448.f);
  int best = 0;
  for (int b = 1; b < 0x7F; ++b) {
    const float d = std::fabs(e4m3_value(static_cast<uint8_t>(b)) - a), db = std::fabs(e4m3_value(static_cast<uint8_t>(best)) - a);
    if (d < db || (d == db && b % 2 == 0)) best = b;
  }
  return static_cast<uint8_t>(best | (std::signbit(f) ? 0x80 : 0));
}
// Nearest e4m3 byte (saturated to +-448).
uint8_t e4m3_of(float f) {
  const float a = std::min(std::fabs(f), 448.f);
  uint8_t best = 0;
  for (int b = 1; b < 0x7F; ++b) {
    if (std::fabs(e4m3_value(static_cast<uint8_t>(b)) - a) < std::fabs(e4m3_value(best) - a)) best = static_cast<uint8_t>(b);
  }
  return static_cast<uint8_t>(best | (f < 0 ? 0x80 : 0));
}

// 16-bit values of the call's dtype, as bits.
uint16_t bits16(float f, flashcore_dtype dt) {
  if (dt == FLASHCORE_DTYPE_FP16) {
    const __half h = __float2half_rn(f);
    uint16_t b;
    std::memcpy(&b, &h, 2);
    return b;
  }
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7FC0;
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
float value16(uint16_t b, flashcore_dtype dt) {
  if (dt == FLASHCORE_DTYPE_FP16) {
    __half_raw raw;
    raw.x = b;
    return __half2float(__half(raw));
  }
  const uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Kv8Case {
  flashcore_dtype dtype = FLASHCORE_DTYPE_BF16;
  int head_dim = 128;
  int page_size = 0;     // 0: a dense cache
  bool slots = false;    // kv_batch_idx over 4 slots
  bool varlen_q = false; // packed queries of 1, 17 and 40 rows
  int seqlen_q = 1;      // dense queries per sequence
  bool causal = false;
  bool pow2 = true;      // descales powers of two (else any positive float)
  bool descales = true;  // false: k_descale = v_descale = NULL (1)
  bool small = false;    // a 300-row cache (one part per tile), for the sanitizers
  float q_range = 1.f;   // Q drawn as N(0, 1) times q_range, the softmax scale divided by it
  int append = 0;        // > 0: each sequence's last `append` keys come as 16-bit k_new / v_new rows
  int rotary_dim = 0;    // > 0 (with append): the rotary embedding of the new keys and of Q (non-interleaved)
  bool q8 = false;       // Q in e4m3 with q_descale per (batch, KV head) (dtype FP8_E4M3, out_dtype the 16-bit dtype)

  std::string name() const {
    std::string s = std::string(dtype == FLASHCORE_DTYPE_FP16 ? "fp16" : "bf16") + "_d" + std::to_string(head_dim) +
                    (page_size ? "_page" + std::to_string(page_size) : "_dense") + (slots ? "_slots" : "") +
                    (varlen_q ? "_varlenq" : "_sq" + std::to_string(seqlen_q)) + (causal ? "_causal" : "");
    return s + (!descales ? "_nodescale" : pow2 ? "_pow2" : "_anyscale") + (small ? "_small" : "") +
           (q_range != 1.f ? "_qrange2^" + std::to_string(std::ilogb(q_range)) : "") +
           (append ? "_append" + std::to_string(append) : "") + (rotary_dim ? "_rotary" + std::to_string(rotary_dim) : "") +
           (q8 ? "_q8" : "");
  }
};

// The head dim that column l of the transposed e4m3 decode row's S GEMM holds (decode_swap_kv8.cuh: thread c of a
// quad widens bytes 32 c .. 32 c + 31 of a K row, word k for k-step k, its low pair in columns 2 c, 2 c + 1 and its
// high pair in 2 c + 8, 2 c + 9).
int swap_kv8_dim(int l) {
  const int k = l / 16, col = l % 16, c = (col % 8) / 2, j = col % 2 + (col >= 8 ? 2 : 0);
  return 32 * c + 4 * k + j;
}

// The 16-bit split row of a head dim (configs.txt), for the bit-exact comparison.
const char* split_config16(int head_dim) { return head_dim == 256 ? "64x64x3-split" : "64x128x3-split"; }

void run_kv8_case(const Kv8Case& c, uint64_t seed) {
  SCOPED_TRACE(c.name());
  constexpr int64_t B = 3, Hq = 8, Hkv = 2;
  const int64_t cap = c.small ? 300 : 1100;
  const int64_t D = c.head_dim;
  const flashcore_dtype dt = c.dtype;
  const bool paged = c.page_size > 0;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.f, 1.f);
  const std::vector<int32_t> lengths = c.small ? std::vector<int32_t>{5, 150, 290} : std::vector<int32_t>{5, 517, 1090};
  const std::vector<int32_t> q_counts =
      c.varlen_q ? std::vector<int32_t>{1, 17, 40} : std::vector<int32_t>(B, static_cast<int32_t>(c.seqlen_q));
  const int64_t seqlen_q = *std::max_element(q_counts.begin(), q_counts.end());
  const int64_t total_q = std::accumulate(q_counts.begin(), q_counts.end(), int64_t{0});
  const int64_t q_rows = c.varlen_q ? total_q : B * seqlen_q;
  std::vector<int32_t> cu_q(B + 1, 0);
  for (int64_t b = 0; b < B; ++b) cu_q[b + 1] = cu_q[b] + q_counts[b];

  const int64_t kv_slots = c.slots ? 4 : B;
  const std::vector<int32_t> slot = c.slots ? std::vector<int32_t>{2, 0, 3} : std::vector<int32_t>{0, 1, 2};
  const size_t row_elems = static_cast<size_t>(Hkv * D);
  const int64_t pages_per_slot = paged ? (cap + c.page_size - 1) / c.page_size : 0;
  const int64_t num_pages = paged ? kv_slots * pages_per_slot + 3 : 0;
  std::vector<int32_t> table;
  if (paged) {
    std::vector<int32_t> ids(static_cast<size_t>(num_pages));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    table.assign(ids.begin(), ids.begin() + kv_slots * pages_per_slot);
  }
  const int64_t entries = paged ? num_pages : kv_slots, rows_per_entry = paged ? c.page_size : cap;
  const size_t cache_elems = static_cast<size_t>(entries * rows_per_entry) * row_elems;
  auto where = [&](int64_t s, int64_t pos) -> size_t {  // element offset of row `pos` of slot s, head 0
    if (!paged) return static_cast<size_t>(s * cap + pos) * row_elems;
    const int64_t page = table[static_cast<size_t>(s * pages_per_slot + pos / c.page_size)];
    return static_cast<size_t>(page * c.page_size + pos % c.page_size) * row_elems;
  };

  // Descales per (batch, KV head): powers of two in [1/4, 4], or any value in [0.3, 3].
  std::vector<float> kd(B * Hkv, 1.f), vd(B * Hkv, 1.f);
  if (c.descales) {
    std::uniform_int_distribution<int> e(-2, 2);
    std::uniform_real_distribution<float> any(0.3f, 3.f);
    for (auto* d : {&kd, &vd}) {
      for (float& x : *d) x = c.pow2 ? std::ldexp(1.f, e(rng)) : any(rng);
    }
  }
  auto kv_head_of = [&](size_t e) { return static_cast<int64_t>(e % row_elems) / D; };
  // The cache: NaN everywhere, then each sequence's rows [0, length) of its slot quantized from N(0, 1).
  std::vector<uint8_t> k8(cache_elems, kE4m3Nan), v8(cache_elems, kE4m3Nan);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < lengths[b]; ++j) {
      const size_t at = where(slot[b], j);
      for (size_t e = 0; e < row_elems; ++e) k8[at + e] = e4m3_of(normal(rng)), v8[at + e] = e4m3_of(normal(rng));
    }
  }
  const bool exact_case = (c.pow2 || !c.descales) && !c.causal && !c.varlen_q && c.seqlen_q == 1 &&
                          c.q_range == 1.f && c.append == 0 && !c.q8;
  const bool marked = exact_case && dt == FLASHCORE_DTYPE_BF16;  // rows of one +-4 and smaller values (e = 12)
  std::vector<uint16_t> q(static_cast<size_t>(q_rows * Hq * D));
  for (size_t i = 0; i < q.size(); ++i) {
    float x = normal(rng);
    if (marked) x = i % D == 0 ? (x < 0 ? -4.f : 4.f) : std::fabs(x) < 0x1p-20f ? 0.f : std::clamp(x, -3.5f, 3.5f);
    q[i] = bits16(x * c.q_range, dt);
  }
  // An e4m3 Q: its bytes, the descales of (batch, KV head) (powers of two in [1/4, 4], or any in [0.3, 3]), and its
  // exact values (q_exact) for the float64 reference; q holds them rounded to the 16-bit dtype (the low-precision
  // reference's).
  std::vector<uint8_t> q8(c.q8 ? q.size() : 1);
  std::vector<float> qd(B * Hkv, 1.f), q_exact;
  if (c.q8) {
    std::uniform_int_distribution<int> e(-2, 2);
    std::uniform_real_distribution<float> any(0.3f, 3.f);
    for (float& x : qd) x = c.pow2 ? std::ldexp(1.f, e(rng)) : any(rng);
    q_exact.resize(q.size());
    for (size_t i = 0; i < q.size(); ++i) {
      const int64_t row = static_cast<int64_t>(i) / (Hq * D), h = static_cast<int64_t>(i) / D % Hq;
      int64_t b = row / seqlen_q;  // (packed rows: the sequence whose rows hold it)
      if (c.varlen_q) b = std::upper_bound(cu_q.begin(), cu_q.end(), static_cast<int32_t>(row)) - cu_q.begin() - 1;
      q8[i] = e4m3_rne(normal(rng));
      q_exact[i] = e4m3_value(q8[i]) * qd[static_cast<size_t>(b * Hkv + h / (Hq / Hkv))];
      q[i] = bits16(q_exact[i], dt);
    }
  }
  const float softmax_scale = 1.f / std::sqrt(static_cast<float>(D)) / c.q_range;

  // Appends: sequence b's keys [lengths[b] - n_new, lengths[b]) arrive as 16-bit rows (B, n_new, Hkv, D), rotated at
  // positions from the lengths before the append (as Q's rows: + i when causal); the host cache holds their e4m3 as
  // the library must write them, the device cache NaN there until the call.
  const int64_t n_new = c.append;
  std::vector<int32_t> before = lengths;
  for (auto& x : before) x -= static_cast<int32_t>(n_new);
  std::vector<uint16_t> kn(static_cast<size_t>(std::max<int64_t>(B * n_new, 1)) * row_elems), vn(kn.size());
  std::vector<uint16_t> q_att = q;  // the Q the attention reads (rotated)
  std::vector<uint16_t> cos_t, sin_t;
  std::vector<uint8_t> k8_dev = k8, v8_dev = v8;
  if (n_new > 0) {
    for (auto* t : {&kn, &vn}) for (auto& x : *t) x = bits16(normal(rng), dt);
    const int rd = c.rotary_dim;
    std::uniform_real_distribution<float> angle(0.f, 6.2831853f);
    for (int64_t i = 0; i < cap * rd / 2; ++i) {
      const float a = angle(rng);
      cos_t.push_back(bits16(std::cos(a), dt)), sin_t.push_back(bits16(std::sin(a), dt));
    }
    // (kernels/common/rotary.cuh: x' = x c - y s, y' = x s + y c, products rounded before the fused add.)
    auto rotate = [&](uint16_t* row, int64_t heads, int64_t pos) {
      pos = std::min<int64_t>(pos, cap - 1);
      for (int64_t h = 0; h < heads; ++h) {
        for (int i = 0; i < rd / 2; ++i) {
          uint16_t& x = row[h * D + i];
          uint16_t& y = row[h * D + i + rd / 2];
          const float cs = value16(cos_t[static_cast<size_t>(pos * (rd / 2) + i)], dt);
          const float sn = value16(sin_t[static_cast<size_t>(pos * (rd / 2) + i)], dt);
          const float xf = value16(x, dt), yf = value16(y, dt), ys = yf * sn, yc = yf * cs;
          x = bits16(std::fmaf(xf, cs, -ys), dt), y = bits16(std::fmaf(xf, sn, yc), dt);
        }
      }
    };
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < n_new; ++t) {
        uint16_t* kr = kn.data() + static_cast<size_t>(b * n_new + t) * row_elems;
        std::vector<uint16_t> rot(kr, kr + row_elems);
        if (rd > 0) rotate(rot.data(), Hkv, before[b] + t);
        const size_t at = where(slot[b], before[b] + t);
        for (size_t e = 0; e < row_elems; ++e) {
          const size_t h = static_cast<size_t>(b * Hkv + kv_head_of(e));
          k8[at + e] = e4m3_rne(value16(rot[e], dt) / kd[h]);
          v8[at + e] = e4m3_rne(value16(vn[static_cast<size_t>(b * n_new + t) * row_elems + e], dt) / vd[h]);
          k8_dev[at + e] = v8_dev[at + e] = kE4m3Nan;
        }
      }
      for (int64_t i = 0; i < q_counts[b] && rd > 0; ++i) {
        const int64_t r = c.varlen_q ? cu_q[b] + i : b * seqlen_q + i;
        rotate(q_att.data() + r * Hq * D, Hq, before[b] + (c.causal ? i : 0));
      }
    }
  }
  // The dequantized cache in 16 bits (the bit-exact baseline: exact for power-of-two descales; NaN stays NaN).
  std::vector<uint16_t> k16(cache_elems), v16(cache_elems);
  std::vector<int64_t> owner(static_cast<size_t>(entries * rows_per_entry), -1);  // sequence of each cache row
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < lengths[b]; ++j) owner[where(slot[b], j) / row_elems] = b;
  }
  for (size_t e = 0; e < cache_elems; ++e) {
    const int64_t b = owner[e / row_elems];
    const int64_t h = kv_head_of(e);
    const float ks = b >= 0 ? kd[static_cast<size_t>(b * Hkv + h)] : 1.f, vs = b >= 0 ? vd[static_cast<size_t>(b * Hkv + h)] : 1.f;
    k16[e] = bits16(e4m3_value(k8[e]) * ks, dt), v16[e] = bits16(e4m3_value(v8[e]) * vs, dt);
  }

  const size_t o_elems = static_cast<size_t>(q_rows * Hq * D), lse_n = static_cast<size_t>(q_rows * Hq);
  DeviceBuffer dk8(cache_elems), dv8(cache_elems), dk16(cache_elems * 2), dv16(cache_elems * 2), dq(q.size() * 2);
  DeviceBuffer do_a(o_elems * 2), do_b(o_elems * 2), dlse_a(lse_n * 4), dlse_b(lse_n * 4);
  DeviceBuffer dkd(kd.size() * 4), dvd(vd.size() * 4), dlen(B * 4), dslot(B * 4), dcu_q((B + 1) * 4);
  DeviceBuffer dtable(std::max<size_t>(table.size(), 1) * 4);
  DeviceBuffer dq8(q8.size()), dqd(qd.size() * 4);
  upload(dq8, q8), upload(dqd, qd);
  DeviceBuffer dbefore(B * 4), dkn(kn.size() * 2), dvn(vn.size() * 2), dcos(std::max<size_t>(cos_t.size(), 1) * 2),
      dsin(std::max<size_t>(sin_t.size(), 1) * 2);
  upload(dk8, k8_dev), upload(dv8, v8_dev), upload(dk16, k16), upload(dv16, v16), upload(dq, q), upload(dkd, kd);
  upload(dbefore, before), upload(dkn, kn), upload(dvn, vn);
  if (!cos_t.empty()) upload(dcos, cos_t), upload(dsin, sin_t);
  upload(dvd, vd), upload(dlen, lengths), upload(dslot, slot), upload(dcu_q, cu_q);
  if (paged) upload(dtable, table);
  ASSERT_EQ(cudaMemset(do_a.ptr, 0xff, o_elems * 2), cudaSuccess);  // NaN poison
  ASSERT_EQ(cudaMemset(do_b.ptr, 0xff, o_elems * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(dlse_a.ptr, 0xff, lse_n * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(dlse_b.ptr, 0xff, lse_n * 4), cudaSuccess);
  constexpr size_t kWs = 64 << 20;
  DeviceBuffer ws(kWs);
  ASSERT_EQ(cudaMemset(ws.ptr, 0, kWs), cudaSuccess);

  auto params = [&](void* k, void* v, void* o, float* lse) {
    flashcore_attention_params p;
    flashcore_attention_params_init(&p);
    p.q = dq.ptr, p.k = k, p.v = v, p.o = o, p.lse = lse;
    p.batch = B, p.seqlen_q = seqlen_q, p.seqlen_k = cap, p.num_heads_q = Hq, p.num_heads_kv = Hkv, p.head_dim = D;
    p.dtype = dt;
    p.softmax_scale = softmax_scale;
    p.causal = c.causal ? 1 : 0;
    p.q_strides = {seqlen_q * Hq * D, Hq * D, D, 1};
    if (c.varlen_q) {
      p.q_strides.batch = q_rows * Hq * D;
      p.cu_seqlens_q = static_cast<const int32_t*>(dcu_q.ptr);
      p.total_q = total_q;
    }
    p.o_strides = p.q_strides;
    p.k_strides = {(paged ? c.page_size : cap) * Hkv * D, Hkv * D, D, 1};
    p.v_strides = p.k_strides;
    p.seqused_k = static_cast<const int32_t*>(dlen.ptr);
    if (c.slots) p.kv_batch_idx = static_cast<const int32_t*>(dslot.ptr), p.kv_batch_size = kv_slots;
    p.workspace = ws.ptr, p.workspace_size = kWs;
    if (paged) {
      p.block_table = static_cast<const int32_t*>(dtable.ptr);
      p.block_table_stride = pages_per_slot;
      p.page_size = c.page_size;
      p.num_pages = num_pages;
    }
    return p;
  };
  flashcore_attention_params a = params(dk8.ptr, dv8.ptr, do_a.ptr, static_cast<float*>(dlse_a.ptr));
  a.flags = FLASHCORE_FLAG_KV_FP8_E4M3;
  if (c.q8) {
    a.dtype = FLASHCORE_DTYPE_FP8_E4M3, a.out_dtype = dt, a.q = dq8.ptr;
    a.q_descale = static_cast<const float*>(dqd.ptr);
    uint64_t ws = 0;
    ASSERT_EQ(flashcore_attention_workspace_size(&a, &ws), FLASHCORE_SUCCESS) << flashcore_last_error();
    EXPECT_GE(ws, static_cast<uint64_t>(q_rows * Hq * D * 2)) << "the widened Q lives in the workspace";
  }
  if (c.descales) a.k_descale = static_cast<const float*>(dkd.ptr), a.v_descale = static_cast<const float*>(dvd.ptr);
  if (n_new > 0) {
    a.seqused_k = static_cast<const int32_t*>(dbefore.ptr);
    a.k_new = dkn.ptr, a.v_new = dvn.ptr, a.seqlen_new = n_new;
    a.k_new_strides = {n_new * Hkv * D, Hkv * D, D, 1}, a.v_new_strides = a.k_new_strides;
    if (c.rotary_dim > 0) {
      a.rotary_cos = dcos.ptr, a.rotary_sin = dsin.ptr, a.rotary_seqlen = cap, a.rotary_dim = c.rotary_dim;
    }
  }
  // Decode at head dim 128 (at most 8 query rows after packing the GQA group, dense queries) runs the transposed
  // decode row (decode_swap_kv8.cuh), the other calls a 64-row one.
  char selected[64] = {};
  ASSERT_EQ(flashcore_attention_selected_config(&a, selected, sizeof selected), FLASHCORE_SUCCESS)
      << flashcore_last_error();
  const bool swap_row = std::string(selected).rfind("8x", 0) == 0;
  EXPECT_EQ(swap_row, D == 128 && !c.varlen_q && seqlen_q * (Hq / Hkv) <= 8) << selected;
  ASSERT_EQ(flashcore_attention_forward(&a, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> oa = download<uint16_t>(do_a, o_elems);
  const std::vector<float> la = download<float>(dlse_a, lse_n);
  if (n_new > 0) {  // the whole cache, byte for byte
    EXPECT_TRUE(download<uint8_t>(dk8, cache_elems) == k8) << "K cache differs from the host's quantized append";
    EXPECT_TRUE(download<uint8_t>(dv8, cache_elems) == v8) << "V cache differs from the host's quantized append";
  }

  // Bit for bit the 16-bit call on the same tile (decode, non-causal, power-of-two descales); under bf16 Q, the fp16
  // call with Q times 2^12 and the softmax scale times 2^-12. The transposed row's 16-bit twin takes Q and K with their
  // head dims in the order the e4m3 row's S GEMM sums them (swap_kv8_dim).
  if (exact_case) {
    flashcore_attention_params b = params(dk16.ptr, dv16.ptr, do_b.ptr, static_cast<float*>(dlse_b.ptr));
    b.kernel_config = swap_row ? "8x128x3-split" : split_config16(c.head_dim);
    const auto column = [&](size_t e) {  // the element of the 16-bit call's row that e's row holds at e's column
      return swap_row ? e - e % D + static_cast<size_t>(swap_kv8_dim(static_cast<int>(e % D))) : e;
    };
    const flashcore_dtype dt_b = marked ? FLASHCORE_DTYPE_FP16 : dt;
    const float q_factor = marked ? 4096.f : 1.f;
    if (marked || swap_row) {
      std::vector<uint16_t> qh(q.size()), kh(cache_elems), vh(cache_elems);
      for (size_t i = 0; i < q.size(); ++i) qh[i] = bits16(value16(q[column(i)], dt) * q_factor, dt_b);
      for (size_t e = 0; e < cache_elems; ++e) {
        kh[e] = bits16(value16(k16[column(e)], dt), dt_b), vh[e] = bits16(value16(v16[e], dt), dt_b);
      }
      upload(dq, qh), upload(dk16, kh), upload(dv16, vh);
      b.dtype = dt_b, b.softmax_scale = softmax_scale / q_factor;
    }
    const flashcore_status st = flashcore_attention_forward(&b, nullptr);
    if (marked || swap_row) upload(dq, q);  // (the reference below reads the host copies)
    if (st == FLASHCORE_SUCCESS) {
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<uint16_t> ob = download<uint16_t>(do_b, o_elems);
      if (marked) {
        size_t off = 0;
        for (size_t i = 0; i < o_elems; ++i) {
          const float x = value16(oa[i], dt), y = value16(ob[i], FLASHCORE_DTYPE_FP16);
          const float ulp = y == 0.f ? 0x1p-133f : std::ldexp(1.f, std::ilogb(y) - 7);
          off += !(std::fabs(x - y) <= ulp);
        }
        EXPECT_EQ(off, 0u) << "O elements more than one bf16 ulp from the fp16 call on the scaled Q";
      } else {
        EXPECT_TRUE(ob == oa) << "O differs from the 16-bit call on the dequantized cache";
      }
      const std::vector<float> lb = download<float>(dlse_b, lse_n);
      EXPECT_TRUE(std::memcmp(la.data(), lb.data(), lse_n * 4) == 0) << "LSE differs from the 16-bit call";
    } else {
      ADD_FAILURE() << "the 16-bit baseline " << split_config16(c.head_dim) << " failed: " << flashcore_last_error();
    }
  }

  // Against the float64 reference of the dequantized keys, sequence by sequence.
  int64_t checked = 0;
  for (int64_t s = 0; s < B; ++s) {
    const int64_t nq = q_counts[s], nk = lengths[s];
    const int64_t q0 = c.varlen_q ? cu_q[s] : s * seqlen_q;
    std::vector<float> qf(static_cast<size_t>(nq * Hq * D)), kf(static_cast<size_t>(nk) * row_elems), vf(kf.size());
    std::vector<uint16_t> q16(qf.size()), kr(kf.size()), vr(kf.size());
    for (size_t e = 0; e < qf.size(); ++e) {
      q16[e] = q_att[static_cast<size_t>(q0 * Hq * D) + e], qf[e] = value16(q16[e], dt);
      if (c.q8) qf[e] = q_exact[static_cast<size_t>(q0 * Hq * D) + e];
    }
    for (int64_t j = 0; j < nk; ++j) {
      const size_t at = where(slot[s], j);
      for (size_t e = 0; e < row_elems; ++e) {
        const size_t i = static_cast<size_t>(j) * row_elems + e;
        const size_t h = static_cast<size_t>(s * Hkv + kv_head_of(e));
        kf[i] = e4m3_value(k8[at + e]) * kd[h], vf[i] = e4m3_value(v8[at + e]) * vd[h];
        kr[i] = bits16(kf[i], dt), vr[i] = bits16(vf[i], dt);
      }
    }
    flashcore_attention_params hp;
    flashcore_attention_params_init(&hp);
    hp.batch = 1, hp.seqlen_q = nq, hp.seqlen_k = nk, hp.num_heads_q = Hq, hp.num_heads_kv = Hkv, hp.head_dim = D;
    hp.causal = c.causal ? 1 : 0;
    hp.softmax_scale = softmax_scale;
    hp.q_strides = {nq * Hq * D, Hq * D, D, 1};
    hp.k_strides = {nk * Hkv * D, Hkv * D, D, 1};
    hp.v_strides = hp.k_strides;
    flashcore_attention_params h64 = hp, hlow = hp;
    h64.dtype = FLASHCORE_DTYPE_FP32, h64.q = qf.data(), h64.k = kf.data(), h64.v = vf.data();
    hlow.dtype = dt, hlow.q = q16.data(), hlow.k = kr.data(), hlow.v = vr.data();
    const auto ref = flashcore::reference::attention(h64);
    const auto low = flashcore::reference::attention_lowp(hlow);
    double lowp = 0;
    for (size_t i = 0; i < ref.o.size(); ++i) lowp = std::max(lowp, std::fabs(low.o[i] - ref.o[i]));
    for (int64_t i = 0; i < nq; ++i) {
      for (int64_t h = 0; h < Hq; ++h) {
        for (int64_t d = 0; d < D; ++d) {
          const double want = ref.o[static_cast<size_t>((i * Hq + h) * D + d)];
          const double got = value16(oa[static_cast<size_t>(((q0 + i) * Hq + h) * D + d)], dt);
          const double tol = 2 * lowp + 4e-3 * std::max(1.0, std::fabs(want));
          ASSERT_LE(std::fabs(got - want), tol) << "sequence " << s << " row " << i << " head " << h << " col " << d;
          ++checked;
        }
        const size_t li = c.varlen_q ? static_cast<size_t>(h * total_q + q0 + i)
                                     : static_cast<size_t>((s * Hq + h) * seqlen_q + i);
        const double want_lse = ref.lse[static_cast<size_t>(h * nq + i)];
        if (std::isinf(want_lse)) {  // a row that sees no key (causal, more queries than keys): -inf exactly
          EXPECT_EQ(la[li], want_lse) << "sequence " << s << " row " << i;
        } else {
          EXPECT_NEAR(la[li], want_lse, 1e-3 * std::max(1.0, std::fabs(want_lse))) << "sequence " << s << " row " << i;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// Whether the sm90 kernels serve this process: a Hopper GPU, FLASHCORE_BACKEND not naming the portable backend.
bool on_hopper() {
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  const char* forced = std::getenv("FLASHCORE_BACKEND");
  return major == 9 && (forced == nullptr || std::string(forced) != "sm80");
}

uint64_t g_seed = 9090;

TEST(KvFp8, DecodeOnDenseCachesEveryHeadDim) {
  FLASHCORE_REQUIRE_GPU();
  if (!on_hopper()) GTEST_SKIP() << "the e4m3 KV cache runs on the sm90 kernels (Hopper) in this version";
  for (int hd : {64, 128, 256}) {
    for (bool causal : {false, true}) {
      Kv8Case c;
      c.head_dim = hd, c.causal = causal;
      run_kv8_case(c, g_seed++);
    }
  }
  Kv8Case fp16;
  fp16.dtype = FLASHCORE_DTYPE_FP16;
  run_kv8_case(fp16, g_seed++);
  Kv8Case any;  // descales that are not powers of two; and none
  any.pow2 = false;
  run_kv8_case(any, g_seed++);
  any.descales = false;
  run_kv8_case(any, g_seed++);
  for (float range : {0x1p20f, 0x1p-20f}) {  // Q beyond fp16's range both ways (bf16 Q computes in fp16)
    Kv8Case wide;
    wide.q_range = range;
    run_kv8_case(wide, g_seed++);
    wide.causal = true, wide.seqlen_q = 17, wide.head_dim = 64;
    run_kv8_case(wide, g_seed++);
  }
}

TEST(KvFp8, DecodeOnPagedCachesAndSlots) {
  FLASHCORE_REQUIRE_GPU();
  if (!on_hopper()) GTEST_SKIP() << "the e4m3 KV cache runs on the sm90 kernels (Hopper) in this version";
  for (int page : {16, 64, 256}) {
    Kv8Case c;
    c.page_size = page;
    run_kv8_case(c, g_seed++);
  }
  Kv8Case slots;
  slots.slots = true;
  run_kv8_case(slots, g_seed++);
  slots.page_size = 64, slots.head_dim = 64;
  run_kv8_case(slots, g_seed++);
  Kv8Case d256;
  d256.page_size = 64, d256.head_dim = 256, d256.causal = true;
  run_kv8_case(d256, g_seed++);
}

TEST(KvFp8, ChunkedPrefillOnACache) {
  FLASHCORE_REQUIRE_GPU();
  if (!on_hopper()) GTEST_SKIP() << "the e4m3 KV cache runs on the sm90 kernels (Hopper) in this version";
  for (int page : {0, 16}) {
    Kv8Case c;
    c.page_size = page, c.seqlen_q = 17, c.causal = true, c.pow2 = false;
    run_kv8_case(c, g_seed++);
    c.varlen_q = true;
    run_kv8_case(c, g_seed++);
    c.causal = false, c.head_dim = 64, c.dtype = FLASHCORE_DTYPE_FP16;
    run_kv8_case(c, g_seed++);
  }
}

// Appends into the e4m3 cache (16-bit rows quantized by the library), with and without the rotary embedding: decode
// on dense, paged and slotted caches, chunked prefill (17 causal queries) on a paged one.
TEST(KvFp8, AppendsQuantizeIntoTheCache) {
  FLASHCORE_REQUIRE_GPU();
  if (!on_hopper()) GTEST_SKIP() << "the e4m3 KV cache runs on the sm90 kernels (Hopper) in this version";
  Kv8Case c;
  c.append = 3, c.pow2 = false;
  run_kv8_case(c, g_seed++);
  c.page_size = 16, c.rotary_dim = 64;
  run_kv8_case(c, g_seed++);
  c.dtype = FLASHCORE_DTYPE_FP16, c.head_dim = 64, c.slots = true, c.page_size = 0;
  run_kv8_case(c, g_seed++);
  Kv8Case prefill;
  prefill.append = 5, prefill.seqlen_q = 17, prefill.causal = true, prefill.page_size = 64, prefill.rotary_dim = 128;
  run_kv8_case(prefill, g_seed++);
  prefill.descales = false, prefill.rotary_dim = 0, prefill.small = true;
  run_kv8_case(prefill, g_seed++);
}

// An e4m3 Q (FA3's FP8 KV-cache call: Q, K and V in e4m3 with q_descale, k_descale, v_descale), widened into the
// workspace by the library: decode on dense and paged caches, chunked prefill, bf16 and fp16 O.
TEST(KvFp8, E4m3QueriesOnTheCache) {
  FLASHCORE_REQUIRE_GPU();
  if (!on_hopper()) GTEST_SKIP() << "the e4m3 KV cache runs on the sm90 kernels (Hopper) in this version";
  Kv8Case c;
  c.q8 = true, c.pow2 = false;
  run_kv8_case(c, g_seed++);
  c.page_size = 64, c.dtype = FLASHCORE_DTYPE_FP16, c.head_dim = 64;
  run_kv8_case(c, g_seed++);
  Kv8Case prefill;
  prefill.q8 = true, prefill.seqlen_q = 17, prefill.causal = true, prefill.varlen_q = true, prefill.head_dim = 256;
  run_kv8_case(prefill, g_seed++);
}

// Small caches (300 rows), for the sanitizers: decode on a paged cache, chunked prefill on a dense one, without and
// with an append.
TEST(KvFp8, SmallCachesForTheSanitizers) {
  FLASHCORE_REQUIRE_GPU();
  if (!on_hopper()) GTEST_SKIP() << "the e4m3 KV cache runs on the sm90 kernels (Hopper) in this version";
  Kv8Case c;
  c.small = true, c.page_size = 16;
  run_kv8_case(c, g_seed++);
  c.page_size = 0, c.seqlen_q = 17, c.causal = true;
  run_kv8_case(c, g_seed++);
  c.append = 3, c.rotary_dim = 64;  // an append on the same cache
  run_kv8_case(c, g_seed++);
}

// A one-query call on a 64-row e4m3 cache (the refusals' call; its buffers hold garbage and are never read).
struct TinyCall {
  static constexpr int64_t B = 1, S = 64, H = 2, D = 128;
  DeviceBuffer q{B * H * D * 2}, k{B * S * H * D}, v{B * S * H * D}, o{B * H * D * 2};
  flashcore_attention_params params() const {
    flashcore_attention_params p;
    flashcore_attention_params_init(&p);
    p.q = q.ptr, p.k = k.ptr, p.v = v.ptr, p.o = o.ptr;
    p.batch = B, p.seqlen_q = 1, p.seqlen_k = S, p.num_heads_q = H, p.num_heads_kv = H, p.head_dim = D;
    p.dtype = FLASHCORE_DTYPE_BF16, p.flags = FLASHCORE_FLAG_KV_FP8_E4M3;
    p.q_strides = {H * D, H * D, D, 1}, p.o_strides = p.q_strides;
    p.k_strides = {S * H * D, H * D, D, 1}, p.v_strides = p.k_strides;
    return p;
  }
};

TEST(KvFp8, RefusedWhereItDoesNotRun) {
  FLASHCORE_REQUIRE_GPU();
  // Off Hopper (or on the portable backend), the flag is refused by the plan, naming it.
  if (on_hopper()) GTEST_SKIP() << "Hopper on the sm90 backend runs the flag (the other tests)";
  const TinyCall call;
  flashcore_attention_params p = call.params();
  EXPECT_EQ(flashcore_attention_forward(&p, nullptr), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("FLASHCORE_FLAG_KV_FP8_E4M3"), std::string::npos)
      << flashcore_last_error();
}

}  // namespace
