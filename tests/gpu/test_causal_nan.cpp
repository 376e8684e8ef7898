// Non-finite V at causally masked keys (kernels/common/masked_v.cuh): a NaN or Inf in V at a key that a row does not
// see must not reach that row, though the key lies in a block the row's tile multiplies into O (the causal diagonal:
// 0 * NaN is NaN in the P V GEMM). Rows that see the key get a non-finite value in its column and only there.
// Every causal kernel config of each backend (one CTA per tile, persistent, split-KV, the transposed decode rows),
// the default dispatch, Sq = Sk, Sq < Sk (chunked prefill), Sq > Sk (rows with no key), a few decode rows, GQA, and a
// packed (varlen) batch; against the float64 reference of the same inputs with the poisoned values read as 0.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "flashcore/flashcore.h"
#include "gpu/gpu_skip.h"
#include "gpu/serving_test_util.h"
#include "reference/reference.h"

namespace {

using flashcore::reference::bf16_to_float;
using flashcore::reference::float_to_bf16;
using flashcore::reference::float_to_half;
using flashcore::reference::half_to_float;

struct Shape {
  int64_t b, hq, hkv, sq, sk;
  std::vector<int32_t> varlen;  // non-empty: packed sequences of these lengths (Q and K alike; b = its size)
  int64_t page_size = 0;        // > 0: K and V in a paged cache (sk a multiple of it), the pages in reverse order
};

struct Poison {
  int64_t b, hkv, key, col;
  bool nan;  // else +Inf
};

// One problem: inputs, poison, reference; run against any config.
struct Problem {
  Shape s;
  int64_t d;
  flashcore_dtype dt;
  std::vector<int64_t> cu;                // packed: sequence starts (b + 1)
  int64_t rows_q = 0, rows_k = 0;         // rows per batch entry (packed: the totals, one entry; paged: page rows)
  int64_t pages = 0;                      // paged: pages in the pool (b * sk / page_size)
  std::vector<int32_t> table;             // paged: (b, sk / page_size), page of (b, j) = pages - 1 - (b * per + j)
  std::vector<uint16_t> q, k, v, v_ref;  // v_ref: v with the poisoned values as 0
  std::vector<Poison> poison;
  std::vector<double> ref_o, ref_lse;

  uint16_t bits(float x) const { return dt == FLASHCORE_DTYPE_FP16 ? float_to_half(x) : float_to_bf16(x); }
  float value(uint16_t x) const { return dt == FLASHCORE_DTYPE_FP16 ? half_to_float(x) : bf16_to_float(x); }
  bool packed() const { return !s.varlen.empty(); }
  bool paged() const { return s.page_size > 0; }
  int64_t seq_len(int64_t b, bool keys) const { return packed() ? s.varlen[b] : (keys ? s.sk : s.sq); }
  // Element 0 of Q/O row i of sequence b at head h, and of its K/V row for key j at KV head h.
  int64_t q_index(int64_t b, int64_t i, int64_t h) const {
    return (packed() ? (cu[b] + i) * s.hq + h : ((b * s.sq) + i) * s.hq + h) * d;
  }
  int64_t kv_index(int64_t b, int64_t j, int64_t h) const {
    if (packed()) return ((cu[b] + j) * s.hkv + h) * d;
    if (paged()) {
      const int64_t page = table[b * (s.sk / s.page_size) + j / s.page_size];
      return ((page * s.page_size + j % s.page_size) * s.hkv + h) * d;
    }
    return ((b * s.sk + j) * s.hkv + h) * d;
  }
  // LSE: (B, Hq, Sq), or (Hq, total_q) when packed.
  int64_t lse_index(int64_t b, int64_t i, int64_t h) const {
    return packed() ? h * rows_q + cu[b] + i : (b * s.hq + h) * s.sq + i;
  }

  Problem(const Shape& shape, int64_t head_dim, flashcore_dtype dtype, uint64_t seed) : s(shape), d(head_dim), dt(dtype) {
    if (packed()) {
      cu.assign(1, 0);
      for (int32_t n : s.varlen) cu.push_back(cu.back() + n);
      rows_q = rows_k = cu.back();
    } else {
      rows_q = s.sq, rows_k = s.sk;
    }
    if (paged()) {
      const int64_t per = s.sk / s.page_size;
      pages = s.b * per;
      rows_k = s.page_size;
      for (int64_t i = 0; i < pages; ++i) table.push_back(static_cast<int32_t>(pages - 1 - i));
    }
    const int64_t entries = packed() ? 1 : s.b, kv_entries = packed() ? 1 : (paged() ? pages : s.b);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n01(0.f, 1.f);
    auto fill = [&](std::vector<uint16_t>& x, size_t count) {
      x.resize(count);
      for (auto& e : x) e = bits(n01(rng));
    };
    fill(q, entries * rows_q * s.hq * d);
    fill(k, kv_entries * rows_k * s.hkv * d);
    fill(v, kv_entries * rows_k * s.hkv * d);
    v_ref = v;
    // Per (batch, KV head): a NaN and an Inf at keys that some row does not see (key > the first row's last key
    // Sk - Sq), in the diagonal blocks of various tiles.
    const uint16_t nan_bits = dt == FLASHCORE_DTYPE_FP16 ? 0x7e00 : 0x7fc0;
    const uint16_t inf_bits = dt == FLASHCORE_DTYPE_FP16 ? 0x7c00 : 0x7f80;
    for (int64_t b = 0; b < s.b; ++b) {
      const int64_t sq = seq_len(b, false), sk = seq_len(b, true);
      const int64_t lo = sk - sq + 1 > 0 ? sk - sq + 1 : 0;
      if (lo >= sk) continue;  // every key is seen by every row (one query row)
      for (int64_t h = 0; h < s.hkv; ++h) {
        for (bool nan : {true, false}) {
          const int64_t key = lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(sk - lo));
          const int64_t col = static_cast<int64_t>(rng() % static_cast<uint64_t>(d));
          const int64_t at = kv_index(b, key, h) + col;
          v[at] = nan ? nan_bits : inf_bits;
          v_ref[at] = 0;
          poison.push_back({b, h, key, col, nan});
        }
      }
    }
    reference();
  }

  // float64 O and LSE over v_ref, in the layouts of the call's O and LSE.
  void reference() {
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    ref_o.assign(q.size(), 0.0);
    ref_lse.assign(packed() ? s.hq * rows_q : s.b * s.hq * s.sq, 0.0);
    const int64_t group = s.hq / s.hkv;
    for (int64_t b = 0; b < s.b; ++b) {
      const int64_t sq = seq_len(b, false), sk = seq_len(b, true);
      for (int64_t h = 0; h < s.hq; ++h) {
        for (int64_t i = 0; i < sq; ++i) {
          const int64_t limit = std::min<int64_t>(sk, i + 1 + sk - sq);
          const uint16_t* qi = &q[q_index(b, i, h)];
          std::vector<double> sc(limit > 0 ? limit : 0);
          double mx = -INFINITY;
          for (int64_t j = 0; j < limit; ++j) {
            const uint16_t* kj = &k[kv_index(b, j, h / group)];
            double acc = 0;
            for (int64_t c = 0; c < d; ++c) acc += double(value(qi[c])) * double(value(kj[c]));
            sc[j] = acc * scale;
            mx = std::max(mx, sc[j]);
          }
          double sum = 0;
          for (double& x : sc) sum += (x = std::exp(x - mx));
          double* o = &ref_o[q_index(b, i, h)];
          for (int64_t j = 0; j < limit; ++j) {
            const uint16_t* vj = &v_ref[kv_index(b, j, h / group)];
            for (int64_t c = 0; c < d; ++c) o[c] += sc[j] / sum * double(value(vj[c]));
          }
          ref_lse[lse_index(b, i, h)] = limit > 0 ? mx + std::log(sum) : -INFINITY;
        }
      }
    }
  }

  // Whether O(b, i, h, c) must be non-finite: a poisoned (key, c) of its KV head that row i sees.
  bool sees_poison(int64_t b, int64_t i, int64_t h, int64_t c) const {
    const int64_t sq = seq_len(b, false), sk = seq_len(b, true);
    for (const Poison& x : poison) {
      if (x.b == b && x.hkv == h / (s.hq / s.hkv) && x.col == c && x.key <= i + sk - sq) return true;
    }
    return false;
  }
};

struct DevBuf {
  void* ptr = nullptr;
  bool alloc(size_t bytes) { return cudaMalloc(&ptr, bytes > 0 ? bytes : 1) == cudaSuccess; }
  ~DevBuf() { cudaFree(ptr); }
};

// Runs `pr` with `config` (nullptr: the library's choice) and compares; "" when it passes, else what failed.
std::string run(const Problem& pr, const char* config, int num_splits) {
  const Shape& s = pr.s;
  DevBuf q, k, v, o, lse, cu, table, ws;
  const size_t q_bytes = pr.q.size() * 2, kv_bytes = pr.k.size() * 2;
  if (!q.alloc(q_bytes) || !k.alloc(kv_bytes) || !v.alloc(kv_bytes) || !o.alloc(q_bytes) ||
      !lse.alloc(pr.ref_lse.size() * 4) || !cu.alloc(pr.cu.size() * 4) || !table.alloc(pr.table.size() * 4)) {
    return "cudaMalloc failed";
  }
  cudaMemcpy(q.ptr, pr.q.data(), q_bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(k.ptr, pr.k.data(), kv_bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(v.ptr, pr.v.data(), kv_bytes, cudaMemcpyHostToDevice);
  cudaMemset(o.ptr, 0xff, q_bytes);  // NaN poison: an unwritten element fails below
  cudaMemset(lse.ptr, 0xff, pr.ref_lse.size() * 4);
  std::vector<int32_t> cu32(pr.cu.begin(), pr.cu.end());
  if (pr.packed()) cudaMemcpy(cu.ptr, cu32.data(), cu32.size() * 4, cudaMemcpyHostToDevice);
  if (pr.paged()) cudaMemcpy(table.ptr, pr.table.data(), pr.table.size() * 4, cudaMemcpyHostToDevice);

  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.q = q.ptr, p.k = k.ptr, p.v = v.ptr, p.o = o.ptr, p.lse = static_cast<float*>(lse.ptr);
  p.batch = s.b, p.num_heads_q = s.hq, p.num_heads_kv = s.hkv, p.head_dim = pr.d, p.dtype = pr.dt, p.causal = 1;
  if (pr.packed()) {
    p.seqlen_q = p.seqlen_k = flashcore::test::max_of(s.varlen);
    p.cu_seqlens_q = p.cu_seqlens_k = static_cast<const int32_t*>(cu.ptr);
    p.total_q = p.total_k = pr.rows_q;
  } else {
    p.seqlen_q = s.sq, p.seqlen_k = s.sk;
  }
  flashcore_attention_params_set_contiguous(&p, 0);
  if (pr.packed() || pr.paged()) p.k_strides.batch = p.v_strides.batch = pr.rows_k * s.hkv * pr.d;
  if (pr.packed()) p.q_strides.batch = p.o_strides.batch = pr.rows_q * s.hq * pr.d;
  if (pr.paged()) {
    p.block_table = static_cast<const int32_t*>(table.ptr);
    p.page_size = s.page_size;
    p.num_pages = pr.pages;
  }
  p.kernel_config = config;
  p.num_splits = num_splits;
  uint64_t ws_bytes = 0;
  if (flashcore_attention_workspace_size(&p, &ws_bytes) != FLASHCORE_SUCCESS) {
    return std::string("workspace_size: ") + flashcore_last_error();
  }
  if (ws_bytes > 0) {
    if (!ws.alloc(ws_bytes)) return "cudaMalloc(workspace) failed";
    cudaMemset(ws.ptr, 0, ws_bytes);
    p.workspace = ws.ptr, p.workspace_size = ws_bytes;
  }
  if (flashcore_attention_forward(&p, nullptr) != FLASHCORE_SUCCESS) return std::string("forward: ") + flashcore_last_error();
  if (cudaDeviceSynchronize() != cudaSuccess) return "kernel failed";
  std::vector<uint16_t> got(pr.q.size());
  std::vector<float> got_lse(pr.ref_lse.size());
  cudaMemcpy(got.data(), o.ptr, q_bytes, cudaMemcpyDeviceToHost);
  cudaMemcpy(got_lse.data(), lse.ptr, got_lse.size() * 4, cudaMemcpyDeviceToHost);

  int64_t leaked = 0, lost = 0, wrong = 0, bad_lse = 0;
  std::string first;
  for (int64_t b = 0; b < s.b; ++b) {
    for (int64_t i = 0; i < pr.seq_len(b, false); ++i) {
      for (int64_t h = 0; h < s.hq; ++h) {
        const int64_t base = pr.q_index(b, i, h);
        for (int64_t c = 0; c < pr.d; ++c) {
          const float x = pr.value(got[base + c]);
          const double want = pr.ref_o[base + c];
          const bool must = pr.sees_poison(b, i, h, c);
          if (must) {
            lost += std::isfinite(x) ? 1 : 0;
          } else if (!std::isfinite(x)) {
            if (leaked++ == 0) first = "O(b " + std::to_string(b) + ", row " + std::to_string(i) + ", head " +
                                       std::to_string(h) + ", col " + std::to_string(c) + ") is non-finite";
          } else if (std::fabs(x - want) > 0.05 + 0.02 * std::fabs(want)) {
            if (wrong++ == 0 && first.empty()) {
              first = "O(b " + std::to_string(b) + ", row " + std::to_string(i) + ", head " + std::to_string(h) +
                      ", col " + std::to_string(c) + ") = " + std::to_string(x) + ", want " + std::to_string(want);
            }
          }
        }
        const int64_t l = pr.lse_index(b, i, h);
        const double want_lse = pr.ref_lse[l];
        const bool lse_ok = std::isinf(want_lse) ? got_lse[l] == -INFINITY : std::fabs(got_lse[l] - want_lse) < 1e-2;
        bad_lse += lse_ok ? 0 : 1;
      }
    }
  }
  if (leaked + lost + wrong + bad_lse == 0) return "";
  return std::to_string(leaked) + " leaked, " + std::to_string(lost) + " lost (finite where a seen key is poisoned), " +
         std::to_string(wrong) + " wrong, " + std::to_string(bad_lse) + " bad LSE; first: " + first;
}

const std::vector<Shape>& shapes() {
  static const std::vector<Shape> list = {
      {2, 4, 2, 300, 300, {}},  // GQA, odd length, several tiles
      {1, 2, 1, 113, 700, {}},  // chunked prefill: Sq < Sk
      {1, 2, 2, 200, 77, {}},   // Sq > Sk: the first rows see no key
      {2, 8, 2, 5, 1500, {}},   // a few decode rows
  };
  return list;
}

std::string describe(const Shape& s, int64_t d, flashcore_dtype dt, const char* config, int splits) {
  std::string t = std::string(flashcore::test::dtype_text(dt)) + " d" + std::to_string(d) + " B" + std::to_string(s.b) +
                  " H" + std::to_string(s.hq) + "/" + std::to_string(s.hkv) + " Sq" + std::to_string(s.sq) + " Sk" +
                  std::to_string(s.sk) + (s.varlen.empty() ? "" : " packed") +
                  (s.page_size > 0 ? " page " + std::to_string(s.page_size) : "") + " config " +
                  (config != nullptr ? config : "(default)");
  return splits > 0 ? t + " num_splits " + std::to_string(splits) : t;
}

// Every causal config of the device's backend on every shape (all_configs; else the default dispatch only), and the
// default dispatch with and without splits.
void sweep_configs(const std::vector<flashcore_dtype>& dtypes, bool all_configs) {
  int ran = 0;
  for (flashcore_dtype dt : dtypes) {
    for (int d : {64, 128, 256}) {
      std::vector<std::string> configs;
      if (flashcore::test::kernel_configs(dt, d, true, configs) != FLASHCORE_SUCCESS || configs.empty()) continue;
      for (const Shape& s : shapes()) {
        const Problem pr(s, d, dt, flashcore::test::case_seed(describe(s, d, dt, nullptr, 0), 0x5eed));
        for (int splits : {0, 1, 3}) {
          const std::string err = run(pr, nullptr, splits);
          EXPECT_EQ(err, "") << describe(s, d, dt, nullptr, splits);
          ++ran;
        }
        for (const std::string& c : configs) {
          if (!all_configs) break;
          if (flashcore::test::not_a_serving_config(c)) continue;  // test_variants.cpp's deliberately broken one
          const std::string err = run(pr, c.c_str(), 0);
          EXPECT_EQ(err, "") << describe(s, d, dt, c.c_str(), 0);
          ++ran;
        }
      }
      // A packed batch (its own sequences' diagonals; rows of the next sequence follow in the tensor), and paged
      // caches for chunked prefill and decode rows, with and without splits.
      const Shape serving[] = {{3, 4, 2, 0, 0, {130, 7, 261}}, {2, 4, 1, 113, 704, {}, 16}, {2, 8, 2, 5, 1024, {}, 64}};
      for (const Shape& s : serving) {
        const Problem pr(s, d, dt, flashcore::test::case_seed(describe(s, d, dt, nullptr, 0), 0x5eed));
        for (int splits : {0, 1}) {
          if (splits == 1 && pr.packed()) continue;  // (num_splits is not for packed Q)
          EXPECT_EQ(run(pr, nullptr, splits), "") << describe(s, d, dt, nullptr, splits);
          ++ran;
        }
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << "no causal kernel config compiled in";
}

TEST(CausalNaN, MaskedNonFiniteVReachesOnlyTheRowsThatSeeIt) {
  FLASHCORE_REQUIRE_GPU();
  sweep_configs({FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16}, /*all_configs=*/true);
}

// The default dispatch alone (bf16): small enough to run under compute-sanitizer.
TEST(CausalNaN, DefaultDispatchBf16) {
  FLASHCORE_REQUIRE_GPU();
  sweep_configs({FLASHCORE_DTYPE_BF16}, /*all_configs=*/false);
}

// The portable backend's causal rows (FLASHCORE_BACKEND=sm80 on this device), where it can run here.
TEST(CausalNaN, PortableBackendToo) {
  FLASHCORE_REQUIRE_GPU();
  const char* old = std::getenv("FLASHCORE_BACKEND");
  const std::string saved = old != nullptr ? old : "";
  setenv("FLASHCORE_BACKEND", "sm80", 1);
  flashcore_capabilities caps;
  flashcore_capabilities_init(&caps);
  const bool portable = flashcore_get_capabilities(&caps) == FLASHCORE_SUCCESS && std::string(caps.device_backend) == "sm80";
  if (portable) sweep_configs({FLASHCORE_DTYPE_BF16}, /*all_configs=*/true);
  if (old != nullptr) {
    setenv("FLASHCORE_BACKEND", saved.c_str(), 1);
  } else {
    unsetenv("FLASHCORE_BACKEND");
  }
  if (!portable) GTEST_SKIP() << "the portable (sm80) backend cannot serve this device in this build";
}

}  // namespace
