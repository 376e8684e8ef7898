// GPU fuzz test: random valid small problems (sizes, GQA/MQA, causal, bshd/bhsd, padded strides, offset base
// pointers, with and without LSE) run on the GPU and compared with the float64 reference; random invalid ones
// must return an error, leave the poisoned O (and LSE) untouched and leave no CUDA error behind.
// Bounded: stops drawing cases after kTimeBudget seconds. Skips visibly without an sm_90 GPU.
//
// FLASHCORE_FUZZ_SEED in the environment changes the (fixed by default) seed.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "flashcore/flashcore.h"
#include "gpu_skip.h"
#include "reference/reference.h"

namespace ref = flashcore::reference;

namespace {

constexpr double kTimeBudget = 45.0;  // seconds for the valid and the invalid cases together
constexpr int kValidCases = 120, kInvalidCases = 400;
constexpr int kHeadDims[] = {64, 128, 256};

uint64_t fuzz_seed() {
  const char* env = std::getenv("FLASHCORE_FUZZ_SEED");
  return env != nullptr && *env ? std::strtoull(env, nullptr, 0) : 0x5eed0f0f;
}

// A device allocation freed on scope exit.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&ptr, bytes) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  unsigned char* bytes() const { return static_cast<unsigned char*>(ptr); }
};

struct Problem {
  flashcore_dtype dtype = FLASHCORE_DTYPE_BF16;
  int64_t b = 1, sq = 1, sk = 1, hq = 1, hkv = 1, d = 64;
  bool causal = false, bhsd = false, with_lse = true;
  float scale = 0.0f;
  int64_t pad_q = 0, pad_kv = 0, pad_o = 0;  // extra elements per row (multiples of 8)
  int64_t off_q = 0, off_kv = 0, off_o = 0;  // element offsets of the base pointers (multiples of 8)
};

std::string describe(const Problem& p) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s B=%lld Hq=%lld Hkv=%lld Sq=%lld Sk=%lld D=%lld %s %s pad(%lld,%lld,%lld) off(%lld,%lld,%lld)%s scale=%g",
                p.dtype == FLASHCORE_DTYPE_FP16 ? "fp16" : "bf16", (long long)p.b, (long long)p.hq, (long long)p.hkv,
                (long long)p.sq, (long long)p.sk, (long long)p.d, p.causal ? "causal" : "full", p.bhsd ? "bhsd" : "bshd",
                (long long)p.pad_q, (long long)p.pad_kv, (long long)p.pad_o, (long long)p.off_q, (long long)p.off_kv,
                (long long)p.off_o, p.with_lse ? " lse" : "", p.scale);
  return buf;
}

// Strides of a (B, S, H, D) tensor in `bhsd` or `bshd` storage order with `pad` extra elements per row of D.
flashcore_tensor_strides strides(int64_t s, int64_t h, int64_t d, bool bhsd, int64_t pad) {
  const int64_t row = d + pad;
  if (bhsd) return {h * s * row, row, s * row, 1};
  return {s * h * row, h * row, row, 1};
}

int64_t elements(const flashcore_tensor_strides& st, int64_t b, int64_t s, int64_t h, int64_t d) {
  return (b - 1) * st.batch + (s - 1) * st.seq + (h - 1) * st.head + d;
}

uint16_t to_bits(float x, flashcore_dtype dt) {
  return dt == FLASHCORE_DTYPE_FP16 ? ref::float_to_half(x) : ref::float_to_bf16(x);
}
float from_bits(uint16_t x, flashcore_dtype dt) {
  return dt == FLASHCORE_DTYPE_FP16 ? ref::half_to_float(x) : ref::bf16_to_float(x);
}

// One problem on the device: inputs filled with N(0,1) (padding too), O and LSE poisoned with 0xFF bytes.
class Instance {
 public:
  Instance(const Problem& p, std::mt19937_64& rng)
      : pr(p),
        qs(strides(p.sq, p.hq, p.d, p.bhsd, p.pad_q)),
        ks(strides(p.sk, p.hkv, p.d, p.bhsd, p.pad_kv)),
        os(strides(p.sq, p.hq, p.d, p.bhsd, p.pad_o)),
        nq(p.off_q + elements(qs, p.b, p.sq, p.hq, p.d)),
        nk(p.off_kv + elements(ks, p.b, p.sk, p.hkv, p.d)),
        no(p.off_o + elements(os, p.b, p.sq, p.hq, p.d)),
        nlse(p.b * p.hq * p.sq),
        hq(static_cast<size_t>(nq)),
        hk(static_cast<size_t>(nk)),
        hv(static_cast<size_t>(nk)),
        dq(hq.size() * 2),
        dk(hk.size() * 2),
        dv(hv.size() * 2),
        dout(static_cast<size_t>(no) * 2),
        dlse(static_cast<size_t>(nlse) * 4) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto* h : {&hq, &hk, &hv})
      for (uint16_t& x : *h) x = to_bits(normal(rng), p.dtype);
  }

  bool allocated() const { return dq.ptr && dk.ptr && dv.ptr && dout.ptr && dlse.ptr; }

  // Uploads the inputs and poisons the outputs; false on a CUDA error.
  bool prepare() {
    return cudaMemcpy(dq.ptr, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess &&
           cudaMemcpy(dk.ptr, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess &&
           cudaMemcpy(dv.ptr, hv.data(), hv.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess &&
           cudaMemset(dout.ptr, 0xff, static_cast<size_t>(no) * 2) == cudaSuccess &&
           cudaMemset(dlse.ptr, 0xff, static_cast<size_t>(nlse) * 4) == cudaSuccess;
  }

  flashcore_attention_params params() const {
    flashcore_attention_params p;
    flashcore_attention_params_init(&p);
    p.out_dtype = FLASHCORE_DTYPE_SAME;
    p.q = dq.bytes() + pr.off_q * 2;
    p.k = dk.bytes() + pr.off_kv * 2;
    p.v = dv.bytes() + pr.off_kv * 2;
    p.o = dout.bytes() + pr.off_o * 2;
    p.lse = pr.with_lse ? static_cast<float*>(dlse.ptr) : nullptr;
    p.q_strides = qs, p.k_strides = p.v_strides = ks, p.o_strides = os;
    p.batch = pr.b, p.seqlen_q = pr.sq, p.seqlen_k = pr.sk, p.num_heads_q = pr.hq, p.num_heads_kv = pr.hkv;
    p.head_dim = pr.d, p.dtype = pr.dtype, p.causal = pr.causal ? 1 : 0, p.softmax_scale = pr.scale;
    return p;
  }

  // The same problem over the host copies, for the reference.
  flashcore_attention_params host_params() const {
    flashcore_attention_params p = params();
    p.q = hq.data() + pr.off_q;
    p.k = hk.data() + pr.off_kv;
    p.v = hv.data() + pr.off_kv;
    p.o = nullptr, p.lse = nullptr;
    return p;
  }

  // O (whole allocation, padding included) and LSE back on the host.
  bool download(std::vector<uint16_t>& o, std::vector<float>& lse) const {
    o.resize(static_cast<size_t>(no));
    lse.resize(static_cast<size_t>(nlse));
    return cudaMemcpy(o.data(), dout.ptr, o.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess &&
           cudaMemcpy(lse.data(), dlse.ptr, lse.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
  }

  Problem pr;
  flashcore_tensor_strides qs, ks, os;
  int64_t nq, nk, no, nlse;
  std::vector<uint16_t> hq, hk, hv;
  DeviceBuffer dq, dk, dv, dout, dlse;
};

Problem random_problem(std::mt19937_64& rng, const std::vector<std::pair<flashcore_dtype, int>>& compiled) {
  auto uni = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Problem p;
  const auto& [dtype, d] = compiled[static_cast<size_t>(uni(0, static_cast<int64_t>(compiled.size()) - 1))];
  p.dtype = dtype, p.d = d;
  p.b = uni(1, 3);
  p.hkv = uni(1, 3);
  p.hq = p.hkv * uni(1, 4);
  p.sq = uni(0, 3) == 0 ? uni(1, 8) : uni(1, 300);
  p.sk = uni(0, 3) == 0 ? uni(1, 8) : uni(1, 300);
  p.causal = uni(0, 1) == 1;
  p.bhsd = uni(0, 1) == 1;
  p.with_lse = uni(0, 3) != 0;
  p.scale = uni(0, 1) ? 0.0f : static_cast<float>(uni(8, 512)) / 1024.0f;
  p.pad_q = 8 * uni(0, 2), p.pad_kv = 8 * uni(0, 2), p.pad_o = 8 * uni(0, 2);
  p.off_q = 8 * uni(0, 3), p.off_kv = 8 * uni(0, 3), p.off_o = 8 * uni(0, 3);
  return p;
}

std::vector<std::pair<flashcore_dtype, int>> compiled_pairs() {
  std::vector<std::pair<flashcore_dtype, int>> out;
  flashcore_capabilities caps{};
  caps.struct_size = sizeof(caps);
  if (flashcore_get_capabilities(&caps) != FLASHCORE_SUCCESS) return out;
  for (int i = 0; i < caps.num_dtypes; ++i)
    for (int hd : kHeadDims) {
      // 16-bit inputs only: this generator makes fp16/bf16 data (the 8-bit path has tests/gpu/test_fp8.cpp).
      if (caps.dtypes[i] != FLASHCORE_DTYPE_FP16 && caps.dtypes[i] != FLASHCORE_DTYPE_BF16) continue;
      flashcore_attention_params p;
      flashcore_attention_params_init(&p);
      p.out_dtype = FLASHCORE_DTYPE_SAME;
      p.q = p.k = p.v = reinterpret_cast<void*>(uintptr_t{1} << 40);
      p.o = reinterpret_cast<void*>(uintptr_t{1} << 41);
      p.batch = p.seqlen_q = p.seqlen_k = p.num_heads_q = p.num_heads_kv = 1;
      p.head_dim = hd;
      p.dtype = caps.dtypes[i];
      flashcore_attention_params_set_contiguous(&p, 0);
      if (flashcore_attention_validate(&p) == FLASHCORE_SUCCESS) out.push_back({caps.dtypes[i], hd});
    }
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Max |O - ref| over the logical elements, and whether every byte outside them kept its poison.
struct Compared {
  double o_err = 0, lse_err = 0;
  bool nonfinite = false, padding_written = false, lse_mismatch_inf = false;
};

Compared compare(const Instance& in, const std::vector<uint16_t>& o, const std::vector<float>& lse,
                 const ref::Output& want) {
  const Problem& p = in.pr;
  Compared c;
  std::vector<char> logical(o.size(), 0);
  for (int64_t b = 0; b < p.b; ++b)
    for (int64_t i = 0; i < p.sq; ++i)
      for (int64_t h = 0; h < p.hq; ++h)
        for (int64_t d = 0; d < p.d; ++d) {
          const int64_t at = p.off_o + b * in.os.batch + i * in.os.seq + h * in.os.head + d;
          logical[static_cast<size_t>(at)] = 1;
          const float x = from_bits(o[static_cast<size_t>(at)], p.dtype);
          if (!std::isfinite(x)) {
            c.nonfinite = true;
            continue;
          }
          const double r = want.o[static_cast<size_t>(((b * p.sq + i) * p.hq + h) * p.d + d)];
          c.o_err = std::max(c.o_err, std::fabs(x - r));
        }
  for (size_t i = 0; i < o.size(); ++i)
    if (!logical[i] && o[i] != 0xffff) c.padding_written = true;
  if (p.with_lse) {
    for (size_t i = 0; i < lse.size(); ++i) {
      const double r = want.lse[i];
      if (std::isinf(r) || std::isinf(lse[i])) {
        if (!(std::isinf(r) && std::isinf(lse[i]) && lse[i] < 0)) c.lse_mismatch_inf = true;
        continue;
      }
      c.lse_err = std::max(c.lse_err, std::fabs(lse[i] - r) / std::max(1.0, std::fabs(r)));
    }
  }
  return c;
}

TEST(FuzzGpu, RandomValidProblemsMatchTheReference) {
  FLASHCORE_REQUIRE_GPU();
  const auto compiled = compiled_pairs();
  ASSERT_FALSE(compiled.empty());
  const uint64_t seed = fuzz_seed();
  std::mt19937_64 rng(seed);
  const auto t0 = std::chrono::steady_clock::now();
  int run = 0, passed = 0;
  for (int n = 0; n < kValidCases && seconds_since(t0) < kTimeBudget / 2; ++n) {
    const Problem p = random_problem(rng, compiled);
    SCOPED_TRACE("case " + std::to_string(n) + " (seed " + std::to_string(seed) + "): " + describe(p));
    Instance in(p, rng);
    ASSERT_TRUE(in.allocated());
    ASSERT_TRUE(in.prepare());
    const flashcore_attention_params params = in.params();
    ASSERT_EQ(flashcore_attention_forward(&params, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint16_t> o;
    std::vector<float> lse;
    ASSERT_TRUE(in.download(o, lse));
    const flashcore_attention_params host = in.host_params();
    const ref::Output want = ref::attention(host);
    const ref::Output lowp = ref::attention_lowp(host);
    double lowp_o = 0, lowp_lse = 0;
    for (size_t i = 0; i < want.o.size(); ++i) lowp_o = std::max(lowp_o, std::fabs(lowp.o[i] - want.o[i]));
    for (size_t i = 0; i < want.lse.size(); ++i)
      if (std::isfinite(want.lse[i]))
        lowp_lse = std::max(lowp_lse, std::fabs(lowp.lse[i] - want.lse[i]) / std::max(1.0, std::fabs(want.lse[i])));
    const double o_tol = 2 * lowp_o + (p.dtype == FLASHCORE_DTYPE_FP16 ? 1e-3 : 4e-3);
    const double lse_tol = 2 * lowp_lse + 1e-3;
    const Compared c = compare(in, o, lse, want);
    ++run;
    const bool ok = !c.nonfinite && !c.padding_written && !c.lse_mismatch_inf && c.o_err <= o_tol && c.lse_err <= lse_tol;
    passed += ok;
    EXPECT_TRUE(ok) << "O err " << c.o_err << " (tol " << o_tol << "), LSE err " << c.lse_err << " (tol " << lse_tol
                    << "), non-finite O " << c.nonfinite << ", padding written " << c.padding_written
                    << ", LSE inf mismatch " << c.lse_mismatch_inf;
  }
  std::printf("fuzz gpu (valid): seed %llu, %d cases run, %d passed, %.1f s\n", static_cast<unsigned long long>(seed),
              run, passed, seconds_since(t0));
  EXPECT_GT(run, 0);
}

// An invalid variant of a valid problem: the expected status, what was changed.
struct Breakage {
  const char* what;
  flashcore_status status;
};

TEST(FuzzGpu, RandomInvalidProblemsFailCleanly) {
  FLASHCORE_REQUIRE_GPU();
  const auto compiled = compiled_pairs();
  ASSERT_FALSE(compiled.empty());
  const uint64_t seed = fuzz_seed() ^ 0xbadull;
  std::mt19937_64 rng(seed);
  auto uni = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  std::vector<uint16_t> host_memory(1 << 20);
  const auto t0 = std::chrono::steady_clock::now();
  std::map<std::string, int> by_kind;
  int run = 0;
  for (int n = 0; n < kInvalidCases && seconds_since(t0) < kTimeBudget / 2; ++n) {
    Problem pr = random_problem(rng, compiled);
    pr.sq = std::min<int64_t>(pr.sq, 64), pr.sk = std::min<int64_t>(pr.sk, 64);  // the kernel never runs
    Instance in(pr, rng);
    ASSERT_TRUE(in.allocated());
    ASSERT_TRUE(in.prepare());
    flashcore_attention_params p = in.params();
    Breakage br{};
    switch (uni(0, 11)) {
      case 0: p.k = nullptr, br = {"k NULL", FLASHCORE_ERROR_NULL_POINTER}; break;
      case 1: p.q = static_cast<const unsigned char*>(p.q) + 2 * uni(1, 7), br = {"q misaligned", FLASHCORE_ERROR_MISALIGNED_POINTER}; break;
      case 2: p.v_strides.seq += uni(1, 7), br = {"v_strides.seq not 16-byte", FLASHCORE_ERROR_INVALID_STRIDE}; break;
      case 3: p.num_heads_kv = p.num_heads_q + 1, br = {"head ratio", FLASHCORE_ERROR_INVALID_HEAD_RATIO}; break;
      case 4: p.softmax_scale = -1.0f, br = {"negative scale", FLASHCORE_ERROR_INVALID_ARGUMENT}; break;
      case 5: p.k = host_memory.data(), br = {"k in host memory", FLASHCORE_ERROR_INVALID_ARGUMENT}; break;
      case 6: p.reserved = 1, br = {"reserved != 0", FLASHCORE_ERROR_INVALID_ARGUMENT}; break;
      case 7: p.o = const_cast<void*>(p.q), br = {"O over Q", FLASHCORE_ERROR_OVERLAPPING_OUTPUT}; break;
      case 8: p.head_dim = 80, br = {"head_dim 80", FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM}; break;
      case 9:
        p.lse = static_cast<float*>(in.dlse.ptr);
        p.lse_capacity = in.nlse - 1;
        br = {"lse_capacity short", FLASHCORE_ERROR_INVALID_SIZE};
        break;
      case 10: p.seqlen_q = 0, br = {"seqlen_q 0", FLASHCORE_ERROR_INVALID_SIZE}; break;
      default: p.causal = 2, br = {"causal 2", FLASHCORE_ERROR_INVALID_ARGUMENT}; break;
    }
    SCOPED_TRACE(std::string("case ") + std::to_string(n) + " (seed " + std::to_string(seed) + "): " + br.what + " on " +
                 describe(pr));
    const flashcore_status got = flashcore_attention_forward(&p, nullptr);
    EXPECT_EQ(got, br.status) << flashcore_last_error();
    EXPECT_STRNE(flashcore_last_error(), "");
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a failing call left a CUDA error behind";
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint16_t> o;
    std::vector<float> lse;
    ASSERT_TRUE(in.download(o, lse));
    EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](uint16_t x) { return x == 0xffff; })) << "O was written";
    uint32_t poison = 0xffffffffu;
    float poison_f;
    std::memcpy(&poison_f, &poison, 4);
    EXPECT_EQ(std::memcmp(lse.data(), std::vector<float>(lse.size(), poison_f).data(), lse.size() * 4), 0)
        << "LSE was written";
    ++by_kind[br.what];
    ++run;
  }
  std::printf("fuzz gpu (invalid): seed %llu, %d cases run in %.1f s:\n", static_cast<unsigned long long>(seed), run,
              seconds_since(t0));
  for (const auto& [kind, count] : by_kind) std::printf("  %-28s %d\n", kind.c_str(), count);
  EXPECT_GT(run, 0);
}

}  // namespace
