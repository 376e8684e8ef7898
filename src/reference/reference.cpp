// CPU reference attention: float64 (attention, attention_backward) and GPU-like low precision (attention_lowp,
// attention_backward_lowp).
#include "reference/reference.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>

namespace flashcore::reference {

// ---------------------------------------------------------------------------------------------
// dtype conversions (round-to-nearest-even; NaN stays a quiet NaN, overflow goes to +-inf)
// ---------------------------------------------------------------------------------------------
static uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
static float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7e00u;          // NaN -> quiet NaN
  if (u >= (143u << 23)) return sign | 0x7c00u;        // >= 2^16 (or inf): inf
  if (u < (113u << 23)) {                              // below 2^-14: half subnormal or zero
    // Adding 0.5f puts the value's multiple of 2^-24 into the low mantissa bits, rounded (RNE)
    // by the float adder itself.
    const float r = bits_float(u) + 0.5f;
    return sign | static_cast<uint16_t>(float_bits(r) - float_bits(0.5f));
  }
  const uint32_t mant_odd = (u >> 13) & 1u;
  u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + mant_odd;  // rebias, round half to even
  return sign | static_cast<uint16_t>(u >> 13);        // carries into the exponent (up to inf) are right
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return bits_float(float_bits(v) | sign);
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float bf16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

float load_element(const void* base, flashcore_dtype dtype, int64_t index) {
  switch (dtype) {
    case FLASHCORE_DTYPE_FP16: return half_to_float(static_cast<const uint16_t*>(base)[index]);
    case FLASHCORE_DTYPE_BF16: return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
    case FLASHCORE_DTYPE_FP32: return static_cast<const float*>(base)[index];
    default: throw std::invalid_argument("reference: unsupported dtype " + std::to_string(dtype));
  }
}

float round_to_dtype(float x, flashcore_dtype dtype) {
  switch (dtype) {
    case FLASHCORE_DTYPE_FP16: return half_to_float(float_to_half(x));
    case FLASHCORE_DTYPE_BF16: return bf16_to_float(float_to_bf16(x));
    default: return x;
  }
}

void parallel_for(int64_t n, int threads, const std::function<void(int64_t)>& fn) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t workers = std::min<int64_t>(threads, n);
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  auto body = [&] {
    for (int64_t i = next++; i < n; i = next++) fn(i);
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(workers - 1));
  for (int64_t t = 1; t < workers; ++t) pool.emplace_back(body);
  body();
  for (auto& t : pool) t.join();
}

// ---------------------------------------------------------------------------------------------
// attention
// ---------------------------------------------------------------------------------------------
namespace {

void validate(const flashcore_attention_params& p) {
  auto fail = [](const std::string& m) { throw std::invalid_argument("reference: " + m); };
  if (!p.q || !p.k || !p.v) fail("q, k and v must be non-null host pointers");
  if (p.batch <= 0 || p.seqlen_q <= 0 || p.seqlen_k <= 0 || p.num_heads_q <= 0 || p.num_heads_kv <= 0 ||
      p.head_dim <= 0)
    fail("sizes must be positive");
  if (p.num_heads_q % p.num_heads_kv != 0) fail("num_heads_q must be a multiple of num_heads_kv");
  if (p.head_dim_v < 0) fail("head_dim_v must be >= 0 (0: head_dim)");
  if (p.dtype != FLASHCORE_DTYPE_FP16 && p.dtype != FLASHCORE_DTYPE_BF16 && p.dtype != FLASHCORE_DTYPE_FP32)
    fail("dtype must be fp16, bf16 or fp32");
  if (!(p.softmax_scale >= 0.0f) || std::isinf(p.softmax_scale)) fail("softmax_scale must be finite and >= 0");
  // The variant fields (ABI 0.5), by the library's rules (api/validate.cpp check_variant_fields).
  if (p.local != 0 && p.local != 1) fail("local must be 0 or 1");
  if (p.local == 1 && (p.window_size_left < -1 || (!p.causal && p.window_size_right < -1)))
    fail("window_size_left / window_size_right must be -1 (unbounded) or >= 0");
  if (!(p.softcap >= 0.0f) || std::isinf(p.softcap)) fail("softcap must be finite and >= 0");
  if (p.attention_chunk < 0) fail("attention_chunk must be >= 0");
  if (p.sinks != nullptr)
    for (int64_t h = 0; h < p.num_heads_q; ++h)
      // -inf is a sink that takes nothing (exp(-inf) = 0); NaN and +inf have no meaning.
      if (std::isnan(p.sinks[h]) || p.sinks[h] == std::numeric_limits<float>::infinity())
        fail("sinks[" + std::to_string(h) + "] must be finite or -inf");
}

int64_t element_index(const flashcore_tensor_strides& s, int64_t b, int64_t pos, int64_t h, int64_t d) {
  return b * s.batch + pos * s.seq + h * s.head + d * s.dim;
}

// Keys of sequence b: seqlen_k, or seqused_k[b] (a host array here) clamped to [0, seqlen_k].
int64_t sequence_keys(const flashcore_attention_params& p, int64_t b) {
  if (p.seqused_k == nullptr) return p.seqlen_k;
  return std::clamp<int64_t>(p.seqused_k[b], 0, p.seqlen_k);
}

// The keys query row i of dense sequence b sees.
KeyRange visible_keys(const flashcore_attention_params& p, int64_t b, int64_t i) {
  return visible_key_range(p, p.seqlen_q, sequence_keys(p, b), i);
}

// The sink logit of query head h as T: -inf without sinks, which adds exp(-inf) = 0 to the denominator and makes
// the LSE of a row without keys -inf: the formulas with a sink are the ones without it.
template <typename T>
T sink_of(const flashcore_attention_params& p, int64_t h) {
  return p.sinks != nullptr ? static_cast<T>(p.sinks[h]) : -std::numeric_limits<T>::infinity();
}

// One query row. q: D values; K: dense (seqlen_k, D); V: dense (seqlen_k, DV); keys: the ones the row sees; sink:
// the head's sink logit (-inf: none); o: DV outputs (DV = head_dim_v, or D).
// T = double: the exact reference (no rounding). T = float: the low-precision model, where P is rounded to
// `dtype` before the P*V product and O to `dtype` at the end (l sums the unrounded P, as kernels do).
template <typename T>
struct Row {
  T scale;
  flashcore_dtype dtype;
  T softcap = 0;  // > 0: scores pass through softcap * tanh(s / softcap)

  T round(T x) const {
    if constexpr (std::is_same_v<T, double>) return x;
    else return round_to_dtype(x, dtype);
  }
  // The score of q against k: scale * q.k, capped. Summed in order, so that the backward's recomputed scores are
  // the forward's to the last bit (P = exp(s - LSE) is then exactly 1 for a row that sees one key).
  T score(const T* q, const T* k, int64_t D) const {
    T dot = 0;
    for (int64_t d = 0; d < D; ++d) dot += q[d] * k[d];
    const T s = dot * scale;
    if (softcap <= 0) return s;
    T t = std::tanh(s / softcap);
    if constexpr (!std::is_same_v<T, double>) {
      // Kernels take tanh from the hardware (tanh.approx.f32: relative error up to 2^-11, fp16's precision), whose
      // error on saturated scores (softcap * 2^-11 each) is felt in O. The model rounds tanh to fp16 so that its
      // own error, the kernels' yardstick, includes one of that size. fp32 problems keep exact rounding, as everywhere.
      if (dtype != FLASHCORE_DTYPE_FP32) t = round_to_dtype(t, FLASHCORE_DTYPE_FP16);
    }
    return softcap * t;
  }
  // d(score) / d(scale * q.k) at the capped score s: tanh' = 1 - tanh^2, with tanh = s / softcap.
  T score_slope(T s) const {
    if (softcap <= 0) return 1;
    const T t = s / softcap;
    return 1 - t * t;
  }
  void operator()(const T* q, const T* K, const T* V, KeyRange keys, T sink, int64_t D, int64_t DV, double* o,
                  double* lse, std::vector<T>& s) const {
    if (keys.empty()) {
      // No key: nothing to average (O = 0); the denominator holds the sink alone (LSE = sink, -inf without one).
      std::fill(o, o + DV, 0.0);
      *lse = static_cast<double>(sink);
      return;
    }
    // The maximum includes the sink, so that neither exp(s - m) nor exp(sink - m) can overflow.
    T m = sink;
    for (int64_t j = keys.begin; j < keys.end; ++j) {
      T& sj = s[static_cast<size_t>(j - keys.begin)];
      sj = score(q, K + j * D, D);
      m = std::max(m, sj);
    }
    std::vector<T> acc(static_cast<size_t>(DV), T(0));
    T l = 0;
    for (int64_t j = keys.begin; j < keys.end; ++j) {
      const T pj = std::exp(s[static_cast<size_t>(j - keys.begin)] - m);
      l += pj;
      const T pr = round(pj);
      const T* v = V + j * DV;
      for (int64_t d = 0; d < DV; ++d) acc[static_cast<size_t>(d)] += pr * v[d];
    }
    l += std::exp(sink - m);  // the sink joins the denominator only (0 without one)
    for (int64_t d = 0; d < DV; ++d) o[d] = static_cast<double>(round(acc[static_cast<size_t>(d)] / l));
    *lse = static_cast<double>(m + std::log(l));
  }
};

template <typename T>
Output run(const flashcore_attention_params& p, const std::vector<int64_t>& rows_in, int threads, const Row<T>& row) {
  validate(p);
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t B = p.batch, Sq = p.seqlen_q, Sk = p.seqlen_k, Hq = p.num_heads_q, Hkv = p.num_heads_kv,
                D = p.head_dim, DV = p.head_dim_v != 0 ? p.head_dim_v : D, group = Hq / Hkv;

  std::vector<int64_t> rows = rows_in;
  if (rows.empty()) {
    rows.resize(static_cast<size_t>(Sq));
    for (int64_t i = 0; i < Sq; ++i) rows[static_cast<size_t>(i)] = i;
  }
  for (int64_t r : rows)
    if (r < 0 || r >= Sq) throw std::invalid_argument("reference: row " + std::to_string(r) + " out of range");

  Output out;
  out.o.assign(static_cast<size_t>(B * Sq * Hq * DV), 0.0);
  out.lse.assign(static_cast<size_t>(B * Hq * Sq), 0.0);

  const int64_t nrows = static_cast<int64_t>(rows.size());
  const int64_t chunk = std::max<int64_t>(1, (nrows * group + 4 * threads - 1) / (4 * threads));
  const int64_t chunks_per_head = (nrows + chunk - 1) / chunk;
  std::vector<T> K(static_cast<size_t>(Sk * D)), V(static_cast<size_t>(Sk * DV));

  for (int64_t b = 0; b < B; ++b) {
    for (int64_t hkv = 0; hkv < Hkv; ++hkv) {
      // Densify this KV head once; the query heads of its group share it.
      const int64_t key_chunk = 256;
      parallel_for((Sk + key_chunk - 1) / key_chunk, threads, [&](int64_t c) {
        for (int64_t j = c * key_chunk; j < std::min(Sk, (c + 1) * key_chunk); ++j) {
          for (int64_t d = 0; d < D; ++d) {
            K[static_cast<size_t>(j * D + d)] = load_element(p.k, p.dtype, element_index(p.k_strides, b, j, hkv, d));
          }
          for (int64_t d = 0; d < DV; ++d) {
            V[static_cast<size_t>(j * DV + d)] = load_element(p.v, p.dtype, element_index(p.v_strides, b, j, hkv, d));
          }
        }
      });
      parallel_for(group * chunks_per_head, threads, [&](int64_t task) {
        const int64_t h = hkv * group + task / chunks_per_head;
        const int64_t first = (task % chunks_per_head) * chunk, last = std::min(nrows, first + chunk);
        std::vector<T> q(static_cast<size_t>(D)), s(static_cast<size_t>(Sk));
        for (int64_t r = first; r < last; ++r) {
          const int64_t i = rows[static_cast<size_t>(r)];
          for (int64_t d = 0; d < D; ++d)
            q[static_cast<size_t>(d)] = load_element(p.q, p.dtype, element_index(p.q_strides, b, i, h, d));
          double* o = &out.o[static_cast<size_t>(((b * Sq + i) * Hq + h) * DV)];
          double* lse = &out.lse[static_cast<size_t>((b * Hq + h) * Sq + i)];
          row(q.data(), K.data(), V.data(), visible_keys(p, b, i), sink_of<T>(p, h), D, DV, o, lse, s);
        }
      });
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// attention_backward
// ---------------------------------------------------------------------------------------------

// a . b over n elements, summed in order as Row sums its scores: dO . v_j here equals dO . O for a row that sees one
// key.
template <typename T>
T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

// The gradients, FlashAttention-style: per (batch, KV head), with K, V and the group's Q and dO made dense,
//   pass 1 (rows):  LSE_i and O_i through the forward's Row (so the probabilities are the forward's), D_i = dO_i . O_i;
//   pass 2 (keys):  dV_j = sum_i P_ij dO_i, dK_j = scale * sum_i dS_ij q_i over the group's heads and the rows that
//                   see key j, with P_ij = exp(s_ij - LSE_i), dS_ij = P_ij (dO_i . v_j - D_i) * slope(s_ij);
//   pass 3 (rows):  dQ_i = scale * sum_j dS_ij k_j over the keys row i sees.
// Q, K, dQ and dK have head_dim (D) columns; V, O, dO and dV have head_dim_v (DV, D when it is 0): s_ij is over D
// columns, dO_i . v_j, D_i and dV over DV.
// s_ij is Row::score (softcap included) and slope its derivative (1 - tanh^2 with a softcap, else 1). A sink needs
// nothing more: it is in LSE_i, so P_ij is the probability the forward used, and O_i = sum_j P_ij v_j still holds,
// so D_i = dO_i . O_i = sum_j P_ij dP_ij as without one.
// P and dS are recomputed in passes 2 and 3, so every output element is a sum in a fixed order, whatever the thread
// count, with no partial buffers to reduce. T and row.round() as in Row: exact (double) or the low-precision model.
template <typename T>
Gradients run_backward(const flashcore_attention_params& p, const void* dout, int threads, const Row<T>& row) {
  validate(p);
  if (dout == nullptr) throw std::invalid_argument("reference: host_dout must be a non-null host pointer");
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t B = p.batch, Sq = p.seqlen_q, Sk = p.seqlen_k, Hq = p.num_heads_q, Hkv = p.num_heads_kv,
                D = p.head_dim, DV = p.head_dim_v != 0 ? p.head_dim_v : D, group = Hq / Hkv;
  const T scale = row.scale;
  auto at = [](std::vector<T>& v, int64_t i) -> T& { return v[static_cast<size_t>(i)]; };

  Gradients out;
  out.dq.assign(static_cast<size_t>(B * Sq * Hq * D), 0.0);
  out.dk.assign(static_cast<size_t>(B * Sk * Hkv * D), 0.0);
  out.dv.assign(static_cast<size_t>(B * Sk * Hkv * DV), 0.0);

  // Tasks of about a quarter of a thread's share: rows (of all the group's heads) for passes 1 and 3, keys for 2.
  const int64_t rows = group * Sq;
  const int64_t row_chunk = std::max<int64_t>(1, (rows + 4 * threads - 1) / (4 * threads));
  const int64_t row_tasks = (rows + row_chunk - 1) / row_chunk;
  const int64_t key_chunk = std::max<int64_t>(1, (Sk + 4 * threads - 1) / (4 * threads));
  const int64_t key_tasks = (Sk + key_chunk - 1) / key_chunk;

  std::vector<T> K(static_cast<size_t>(Sk * D)), V(static_cast<size_t>(Sk * DV));
  std::vector<T> Q(static_cast<size_t>(rows * D)), dO(static_cast<size_t>(rows * DV));
  std::vector<T> lse(static_cast<size_t>(rows)), delta(static_cast<size_t>(rows));
  std::vector<KeyRange> visible(static_cast<size_t>(Sq));

  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < Sq; ++i) visible[static_cast<size_t>(i)] = visible_keys(p, b, i);
    for (int64_t hkv = 0; hkv < Hkv; ++hkv) {
      parallel_for(key_tasks, threads, [&](int64_t c) {
        for (int64_t j = c * key_chunk; j < std::min(Sk, (c + 1) * key_chunk); ++j) {
          for (int64_t d = 0; d < D; ++d)
            at(K, j * D + d) = load_element(p.k, p.dtype, element_index(p.k_strides, b, j, hkv, d));
          for (int64_t d = 0; d < DV; ++d)
            at(V, j * DV + d) = load_element(p.v, p.dtype, element_index(p.v_strides, b, j, hkv, d));
        }
      });
      // Row r = g * Sq + i: query row i of head hkv * group + g.
      parallel_for(row_tasks, threads, [&](int64_t c) {
        std::vector<double> o(static_cast<size_t>(DV));
        std::vector<T> s(static_cast<size_t>(Sk)), o_t(static_cast<size_t>(DV));  // o_t: O in T (exact: Row's are T)
        for (int64_t r = c * row_chunk; r < std::min(rows, (c + 1) * row_chunk); ++r) {
          const int64_t h = hkv * group + r / Sq, i = r % Sq;
          for (int64_t d = 0; d < D; ++d)
            at(Q, r * D + d) = load_element(p.q, p.dtype, element_index(p.q_strides, b, i, h, d));
          for (int64_t d = 0; d < DV; ++d)
            at(dO, r * DV + d) = load_element(dout, p.dtype, element_index(p.dout_strides, b, i, h, d));
          const KeyRange keys = visible[static_cast<size_t>(i)];
          double row_lse = 0;
          row(&at(Q, r * D), K.data(), V.data(), keys, sink_of<T>(p, h), D, DV, o.data(), &row_lse, s);
          at(lse, r) = static_cast<T>(row_lse);
          for (int64_t d = 0; d < DV; ++d) o_t[static_cast<size_t>(d)] = static_cast<T>(o[static_cast<size_t>(d)]);
          at(delta, r) = keys.empty() ? T(0) : dot(&at(dO, r * DV), o_t.data(), DV);
        }
      });
      // P_ij and dS_ij of row r and key j (the row sees the key); dS_ij is the gradient of the uncapped score.
      auto p_and_ds = [&](int64_t r, int64_t j, T& pij, T& ds) {
        const T sij = row.score(&Q[static_cast<size_t>(r * D)], &K[static_cast<size_t>(j * D)], D);
        pij = std::exp(sij - lse[static_cast<size_t>(r)]);
        ds = pij * (dot(&dO[static_cast<size_t>(r * DV)], &V[static_cast<size_t>(j * DV)], DV) -
                    delta[static_cast<size_t>(r)]) *
             row.score_slope(sij);
      };
      parallel_for(key_tasks, threads, [&](int64_t c) {
        std::vector<T> dk(static_cast<size_t>(D)), dv(static_cast<size_t>(DV));
        for (int64_t j = c * key_chunk; j < std::min(Sk, (c + 1) * key_chunk); ++j) {
          std::fill(dk.begin(), dk.end(), T(0));
          std::fill(dv.begin(), dv.end(), T(0));
          for (int64_t r = 0; r < rows; ++r) {
            if (!visible[static_cast<size_t>(r % Sq)].contains(j)) continue;
            T pij, ds;
            p_and_ds(r, j, pij, ds);
            const T pr = row.round(pij), dsr = row.round(ds);
            const T* q = &Q[static_cast<size_t>(r * D)];
            const T* g = &dO[static_cast<size_t>(r * DV)];
            for (int64_t d = 0; d < DV; ++d) dv[static_cast<size_t>(d)] += pr * g[d];
            for (int64_t d = 0; d < D; ++d) dk[static_cast<size_t>(d)] += dsr * q[d];
          }
          const size_t base_k = static_cast<size_t>(((b * Sk + j) * Hkv + hkv) * D);
          const size_t base_v = static_cast<size_t>(((b * Sk + j) * Hkv + hkv) * DV);
          for (int64_t d = 0; d < D; ++d) {
            const T dk_d = dk[static_cast<size_t>(d)] * scale;
            out.dk[base_k + static_cast<size_t>(d)] = static_cast<double>(row.round(dk_d));
          }
          for (int64_t d = 0; d < DV; ++d)
            out.dv[base_v + static_cast<size_t>(d)] = static_cast<double>(row.round(dv[static_cast<size_t>(d)]));
        }
      });
      parallel_for(row_tasks, threads, [&](int64_t c) {
        std::vector<T> dq(static_cast<size_t>(D));
        for (int64_t r = c * row_chunk; r < std::min(rows, (c + 1) * row_chunk); ++r) {
          const int64_t h = hkv * group + r / Sq, i = r % Sq;
          std::fill(dq.begin(), dq.end(), T(0));
          const KeyRange keys = visible[static_cast<size_t>(i)];
          for (int64_t j = keys.begin; j < keys.end; ++j) {
            T pij, ds;
            p_and_ds(r, j, pij, ds);
            const T dsr = row.round(ds);
            const T* k = &K[static_cast<size_t>(j * D)];
            for (int64_t d = 0; d < D; ++d) dq[static_cast<size_t>(d)] += dsr * k[d];
          }
          const size_t base = static_cast<size_t>(((b * Sq + i) * Hq + h) * D);
          for (int64_t d = 0; d < D; ++d)
            out.dq[base + static_cast<size_t>(d)] = static_cast<double>(row.round(dq[static_cast<size_t>(d)] * scale));
        }
      });
    }
  }
  return out;
}

}  // namespace

double resolved_softmax_scale(const flashcore_attention_params& p) {
  return p.softmax_scale != 0.0f ? static_cast<double>(p.softmax_scale) : 1.0 / std::sqrt(static_cast<double>(p.head_dim));
}

KeyRange visible_key_range(const flashcore_attention_params& p, int64_t seqlen_q, int64_t keys, int64_t i) {
  // Every rule bounds j to an interval around the row's diagonal key i + d (bottom-right alignment), so the visible
  // keys are the intersection of intervals: one interval.
  const int64_t diagonal = i + keys - seqlen_q;
  KeyRange r{0, keys};
  if (p.causal) r.end = std::min(r.end, diagonal + 1);
  if (p.local == 1) {
    if (p.window_size_left >= 0) r.begin = std::max<int64_t>(r.begin, diagonal - p.window_size_left);
    // With causal the right bound is the diagonal itself, whatever window_size_right says.
    if (!p.causal && p.window_size_right >= 0) r.end = std::min<int64_t>(r.end, diagonal + p.window_size_right + 1);
  }
  if (p.attention_chunk > 0) {
    // The chunk of the diagonal key: floor division, also for a negative diagonal (rows above the first key).
    const int64_t c = p.attention_chunk;
    const int64_t chunk = diagonal >= 0 ? diagonal / c : -((-diagonal + c - 1) / c);
    r.begin = std::max(r.begin, chunk * c);
    r.end = std::min(r.end, chunk * c + c);
  }
  if (r.end < r.begin) r.end = r.begin;
  return r;
}

namespace {

template <typename T>
Row<T> row_of(const flashcore_attention_params& p) {
  return Row<T>{static_cast<T>(resolved_softmax_scale(p)), p.dtype, static_cast<T>(p.softcap)};
}

}  // namespace

Output attention(const flashcore_attention_params& host_problem, const std::vector<int64_t>& rows, int threads) {
  return run(host_problem, rows, threads, row_of<double>(host_problem));
}

Output attention_lowp(const flashcore_attention_params& host_problem, const std::vector<int64_t>& rows,
                      int threads) {
  return run(host_problem, rows, threads, row_of<float>(host_problem));
}

Gradients attention_backward(const flashcore_attention_params& host_problem, const void* host_dout, int threads) {
  return run_backward(host_problem, host_dout, threads, row_of<double>(host_problem));
}

Gradients attention_backward_lowp(const flashcore_attention_params& host_problem, const void* host_dout,
                                  int threads) {
  return run_backward(host_problem, host_dout, threads, row_of<float>(host_problem));
}

std::vector<double> attention_backward_sinks(const flashcore_attention_params& host_problem, const void* host_dout,
                                             int threads) {
  if (host_dout == nullptr) throw std::invalid_argument("reference: host_dout must be a non-null host pointer");
  const flashcore_attention_params& p = host_problem;
  std::vector<double> dsinks(static_cast<size_t>(std::max<int64_t>(p.num_heads_q, 0)), 0.0);
  const Output out = attention(p, {}, threads);  // validates the problem
  if (p.sinks == nullptr) return dsinks;
  // O_i = sum_j exp(s_ij) v_j / Z_i with Z_i = sum_j exp(s_ij) + exp(sink_h), and dZ_i / dsink_h = exp(sink_h), so
  // dO_i / dsink_h = -P_sink,i O_i, where P_sink,i = exp(sink_h - LSE_i) is the sink's share of Z_i. Hence
  // dL / dsink_h = -sum over the head's rows of P_sink,i D_i, with D_i = dO_i . O_i.
  // O and dO have head_dim_v columns (head_dim when it is 0).
  const int64_t B = p.batch, Sq = p.seqlen_q, Hq = p.num_heads_q, DV = p.head_dim_v != 0 ? p.head_dim_v : p.head_dim;
  for (int64_t h = 0; h < Hq; ++h) {
    // A -inf sink takes no share of any row (and exp(-inf - LSE) would be NaN on a row without keys).
    if (std::isinf(p.sinks[h])) continue;
    double sum = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < Sq; ++i) {
        double delta = 0;
        for (int64_t d = 0; d < DV; ++d)
          delta += static_cast<double>(load_element(host_dout, p.dtype, element_index(p.dout_strides, b, i, h, d))) *
                   out.o[static_cast<size_t>(((b * Sq + i) * Hq + h) * DV + d)];
        sum += std::exp(static_cast<double>(p.sinks[h]) - out.lse[static_cast<size_t>((b * Hq + h) * Sq + i)]) * delta;
      }
    dsinks[static_cast<size_t>(h)] = -sum;
  }
  return dsinks;
}

}  // namespace flashcore::reference
