// GPU tests of the variants' backward (ABI 0.6): flashcore_attention_forward with a sliding window (local,
// window_size_left / _right), softcap or sinks (writing LSE), then flashcore_attention_backward with the same variant,
// dq / dk / dv (and dsinks, when asked for) against the float64 reference (reference::attention_backward,
// reference::attention_backward_sinks). Every test SKIPs, with the reason, without a GPU the build serves, or when the
// build lacks the case's head dim or dtype. `--gtest_filter=*BackwardVariant*` selects them all.
//
// Suites:
//   BackwardVariant (instantiations Window, Softcap, Sinks): windows (0,0), (1,0), (5,-1), (-1,7), (16,16), larger than
//     the sequence, (5000,0) (the causal mask through the window), causal + left windows (right bound not read);
//     seqlens 1, 17, 113, 300, 1000, Sq < Sk and Sq > Sk (rows that see no key), GQA 8:2, 4:2 and MQA; softcap 30
//     causal and not, and with a window; sinks alone (random in [-2, 2]; dsinks NULL and set), with a window, on rows
//     that see no key (window (0, 0) or causal with Sq > Sk), with GQA / MQA. bf16 and fp16, head dims 64 and 128.
//   BackwardVariantNonFinite: extreme inputs (sinks of +-100, scores far past the softcap, rows without keys and no
//     sinks, everything at once): every output poisoned with NaN before the call, every element finite after.
//   BackwardVariantDeterminism: deterministic = 1 with windows that start past key block 0 (the per-query-block dq
//     counters must start at each query block's first key block), sinks and softcap: dq, dk, dv, dsinks bit-identical
//     over runs; deterministic = 0: dk, dv, dsinks bit-identical.
//   BackwardVariantPacked (sm90 backend: the portable backend's backward takes dense batches only): cu_seqlens_q / _k
//     with a window, softcap, sinks + dsinks, sequences without keys or without queries; deterministic twice.
//   BackwardVariantAbi, BackwardVariantBadArgs: a 0.5-sized struct (FLASHCORE_ATTENTION_PARAMS_V5_SIZE) never writes
//     dsinks, dsinks does not change dq / dk / dv, a host-memory dsinks is refused naming it.
// Backends: every reference-checked case runs on the device's own backend ("native") and again with
// FLASHCORE_BACKEND=sm80 ("portable"; on Hopper, the portable kernels) where the build has it; the portable run skips,
// saying why, where it cannot run or where the native backend is already the portable one.
//
// Tolerance (per tensor t of dq, dk, dv, as tests/gpu/test_backward.cpp):  max |t - t_ref| <= 2 * lowp + atol * scale_t,
// lowp = max |t_lowp - t_ref| the error of reference::attention_backward_lowp() (which models the variants too: the
// window, softcap with fp16-precise tanh, the sink in the float32 denominator), atol = 4e-3 (bf16) / 1e-3 (fp16),
// scale_t = max |t_ref|, at least 1e-2 of the largest reference gradient of the three.
// dsinks (num_heads_q floats), two checks:
//   against the reference: max_h |dsinks - ref| <= 2 * lowp + atol * scale + 1e-6, lowp the error of the same sum over
//     attention_lowp()'s O (rounded to the dtype) and LSE, scale = max_h |ref|, at least 1e-2 of the largest sum of
//     |terms| of a head;
//   against the call's own inputs (the definition in flashcore.h): |dsinks[h] - S_h| <= 1e-4 * A_h + 1e-6, where S_h =
//     -sum_{b, i} exp(sinks[h] - LSE_i) rowsum(dO_i * O_i) over the O and LSE the forward wrote (in float64) and A_h
//     the sum of the |terms| (a row left out, or counted twice, is off by A_h / rows on average: caught up to ~10^4
//     rows a head).
// Besides: every element of dq, dk, dv, dsinks is written and finite; nothing between a padded tensor's rows, nor past
// dsinks' num_heads_q floats, is written; dq of a query row that sees no key, and dk and dv of a key that no row sees,
// are exactly 0; the inputs (O, LSE, dO, sinks) are left as they were; the workspace may hold anything (0xff bytes).
//
// Hangs: every forward and backward call is waited for with a deadline (kHangSeconds). A call still running then is a
// hang (e.g. a deterministic dq counter that never reaches a key block): the test prints what hung and ends the process
// (a hung kernel cannot be cancelled, and every later CUDA call would wait on it).
//
// Seeds: FLASHCORE_SEED=<n> fixes the base seed; otherwise a fresh one is drawn per run (printed). Failure messages
// name the case's seed.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "flashcore/flashcore.h"
#include "gpu/backward_test_util.h"
#include "gpu/gpu_skip.h"
#include "reference/reference.h"

namespace {

using namespace flashcore::test_bwd;

constexpr uint32_t kFloatPoison = ~0u;     // a NaN float32 (dsinks' poison)
constexpr int kDsinksPad = 4;              // floats after dsinks' num_heads_q that must stay poisoned
constexpr int kHangSeconds = 30;           // a call running longer is taken for a hang

uint64_t case_seed(const std::string& name) {
  static const uint64_t base = draw_base_seed("FlashCore backward variant GPU tests");
  return hash_seed(base, 0x84222325cbf29ce4ull, name);
}

// Waits for the work queued on `stream` (nullptr: the legacy default stream), at most kHangSeconds; see the file's
// comment for what happens then.
void wait_or_die(cudaStream_t stream, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kHangSeconds);
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e != cudaErrorNotReady) {
      ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e);
      return;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr,
                   "\nFATAL: %s did not finish within %d s: a hang (a bug: e.g. a deterministic dq counter that never "
                   "reaches its key block). Ending the process: a hung kernel cannot be cancelled.\n",
                   what.c_str(), kHangSeconds);
      std::fflush(stderr);
      std::fflush(stdout);
      std::_Exit(3);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// ------------------------------------------------------------------------------------------------
// Backends
// ------------------------------------------------------------------------------------------------
enum class Backend { Native, Portable };

const char* backend_text(Backend b) { return b == Backend::Native ? "native" : "portable"; }

// FLASHCORE_BACKEND=sm80 for the scope with Backend::Portable (the previous value, or its absence, put back after);
// nothing with Backend::Native.
class ScopedBackend {
 public:
  explicit ScopedBackend(Backend b) {
    if (b != Backend::Portable) return;
    active_ = true;
    if (const char* old = std::getenv("FLASHCORE_BACKEND"); old != nullptr) had_ = true, old_ = old;
    setenv("FLASHCORE_BACKEND", "sm80", 1);
  }
  ~ScopedBackend() {
    if (!active_) return;
    if (had_) {
      setenv("FLASHCORE_BACKEND", old_.c_str(), 1);
    } else {
      unsetenv("FLASHCORE_BACKEND");
    }
  }
  ScopedBackend(const ScopedBackend&) = delete;
  ScopedBackend& operator=(const ScopedBackend&) = delete;

 private:
  bool active_ = false, had_ = false;
  std::string old_;
};

// The backend serving the current device now ("sm90", "sm80"; "" if none).
std::string device_backend() {
  flashcore_capabilities caps;
  flashcore_capabilities_init(&caps);
  if (flashcore_get_capabilities(&caps) != FLASHCORE_SUCCESS) return "";
  return caps.device_backend;
}

// "" when `b` can run on this device; otherwise why not (the test skips with it).
std::string backend_skip_reason(Backend b) {
  if (b == Backend::Native) return "";
  if (device_backend() == "sm80") {
    return "the device is served by the portable (sm80) backend already: the native run covers it";
  }
  ScopedBackend force(b);
  if (device_backend() != "sm80") {
    return "the portable (sm80) backend of this build cannot serve this device (FLASHCORE_BUILD_SM80 / "
           "FLASHCORE_SM80_ARCHS)";
  }
  return "";
}

// ------------------------------------------------------------------------------------------------
// Cases
// ------------------------------------------------------------------------------------------------
struct Case {
  std::string name;  // the case, without the backend (the references are shared by both backends' runs)
  flashcore_dtype dtype = FLASHCORE_DTYPE_BF16;
  int64_t head_dim = 128;
  int64_t batch = 1, seqlen_q = 128, seqlen_k = 128, heads_q = 1, heads_kv = 1;
  bool causal = false;
  bool local = false;
  int32_t left = 0, right = 0;  // window_size_left / _right (with local)
  int32_t chunk = 0;            // attention_chunk
  float softcap = 0.0f;
  bool sinks = false;
  std::vector<float> sink_values;  // with sinks: these (num_heads_q of them), or random in [-2, 2] when empty
  bool dsinks = false;             // with sinks: ask for dL/dsinks
  float qk_scale = 1.0f;           // Q and K are N(0, 1) * qk_scale (V and dO N(0, 1))
  Layout layout = Layout::BSHD;       // Q, K, V, O
  Layout grad_layout = Layout::BSHD;  // dO, dQ, dK, dV
  int32_t deterministic = 0;
  Backend backend = Backend::Native;
};

std::string bound_text(int32_t w) { return w < 0 ? std::string("inf") : std::to_string(w); }

std::string describe(const Case& c) {
  char buf[512];
  std::string variant;
  if (c.local) variant += " window(" + bound_text(c.left) + "," + bound_text(c.right) + ")";
  if (c.chunk > 0) variant += " attention_chunk=" + std::to_string(c.chunk);
  if (c.softcap > 0) variant += " softcap=" + std::to_string(c.softcap);
  if (c.sinks) variant += c.dsinks ? " sinks+dsinks" : " sinks";
  if (c.qk_scale != 1.0f) variant += " qk*" + std::to_string(c.qk_scale);
  std::snprintf(buf, sizeof buf, "%s B=%lld Sq=%lld Sk=%lld Hq=%lld Hkv=%lld D=%lld%s%s %s/%s%s [%s backend]",
                c.dtype == FLASHCORE_DTYPE_FP16 ? "fp16" : "bf16", static_cast<long long>(c.batch),
                static_cast<long long>(c.seqlen_q), static_cast<long long>(c.seqlen_k),
                static_cast<long long>(c.heads_q), static_cast<long long>(c.heads_kv),
                static_cast<long long>(c.head_dim), c.causal ? " causal" : "", variant.c_str(), layout_name(c.layout),
                layout_name(c.grad_layout), c.deterministic ? " deterministic" : "", backend_text(c.backend));
  return buf;
}

// GoogleTest prints parameters with this instead of a byte dump.
void PrintTo(const Case& c, std::ostream* os) { *os << describe(c); }

std::string param_name(const testing::TestParamInfo<Case>& info) {
  return identifier(info.param.name + "_" + backend_text(info.param.backend));
}

const flashcore_dtype kDtypes[] = {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16};
const int64_t kHeadDims[] = {64, 128};

struct Shape {
  int64_t b, sq, sk, hq, hkv;
};

Case make_case(flashcore_dtype dt, int64_t d, bool causal, const Shape& s, const std::string& what) {
  Case c;
  c.dtype = dt, c.head_dim = d, c.causal = causal;
  c.batch = s.b, c.seqlen_q = s.sq, c.seqlen_k = s.sk, c.heads_q = s.hq, c.heads_kv = s.hkv;
  c.name = std::string(dt == FLASHCORE_DTYPE_FP16 ? "fp16" : "bf16") + "_d" + std::to_string(d) +
           (causal ? "_causal" : "_full") + "_" + what + "_b" + std::to_string(s.b) + "_q" + std::to_string(s.sq) +
           "_k" + std::to_string(s.sk) + "_h" + std::to_string(s.hq) + "x" + std::to_string(s.hkv);
  return c;
}

Case& with_window(Case& c, int32_t left, int32_t right) {
  c.local = true, c.left = left, c.right = right;
  return c;
}

Case& with_sinks(Case& c, bool dsinks) {
  c.sinks = true, c.dsinks = dsinks;
  return c;
}

// Each case on the native backend and then the portable one (adjacent, so that the second reuses the references).
std::vector<Case> on_both_backends(const std::vector<Case>& cases) {
  std::vector<Case> out;
  for (const Case& c : cases) {
    for (Backend b : {Backend::Native, Backend::Portable}) {
      out.push_back(c);
      out.back().backend = b;
    }
  }
  return out;
}

// The four (dtype, head dim) combinations, in the order the grids' per-combination shapes follow.
template <typename F>
void for_each_combo(F&& f) {
  int n = 0;
  for (flashcore_dtype dt : kDtypes)
    for (int64_t d : kHeadDims) f(dt, d, n++);
}

// Windows: per window, one shape per (dtype, head dim) combination (B, Sq, Sk, Hq, Hkv); causal + local is the window
// (left, 0) whatever window_size_right says (given as 9 or -1 here: it must not be read).
std::vector<Case> window_cases() {
  struct W {
    int32_t left, right;
    bool causal;
    Shape shapes[4];
  };
  const W windows[] = {
      {0, 0, false, {{1, 300, 113, 4, 2}, {2, 113, 113, 8, 2}, {2, 1, 1, 2, 2}, {1, 1000, 1000, 8, 1}}},
      {1, 0, false, {{2, 113, 113, 4, 4}, {1, 17, 17, 8, 2}, {1, 1000, 1000, 4, 2}, {1, 113, 300, 8, 1}}},
      {5, -1, false, {{1, 300, 300, 8, 2}, {1, 113, 300, 4, 1}, {1, 300, 113, 4, 2}, {2, 17, 17, 2, 2}}},
      {5, -1, true, {{1, 1000, 1000, 8, 2}, {1, 300, 113, 4, 2}, {2, 113, 113, 4, 4}, {1, 1, 300, 8, 1}}},
      {-1, 7, false, {{1, 300, 300, 4, 2}, {1, 300, 113, 8, 2}, {1, 113, 300, 4, 4}, {1, 17, 17, 8, 1}}},
      {16, 16, false, {{1, 1000, 1000, 8, 2}, {2, 113, 113, 8, 2}, {1, 300, 1000, 4, 2}, {1, 1000, 300, 4, 1}}},
      {5000, 5000, false, {{1, 113, 113, 4, 2}, {1, 300, 113, 4, 4}, {1, 17, 300, 8, 2}, {2, 1, 1, 2, 1}}},
      {5000, 0, false, {{1, 300, 300, 4, 2}, {1, 113, 300, 8, 1}, {1, 300, 113, 4, 2}, {2, 17, 17, 4, 4}}},
      {32, 9, true, {{1, 1000, 1000, 8, 2}, {1, 300, 1000, 4, 1}, {1, 1000, 300, 8, 2}, {2, 113, 113, 4, 2}}},
  };
  std::vector<Case> out;
  int k = 0;
  for (const W& w : windows) {
    for_each_combo([&](flashcore_dtype dt, int64_t d, int n) {
      const int32_t right = (w.causal && n % 2 == 1) ? -1 : w.right;
      Case c = make_case(dt, d, w.causal, w.shapes[n], "win" + bound_text(w.left) + "x" + bound_text(right));
      with_window(c, w.left, right);
      if (k % 7 == 3) {
        c.layout = c.grad_layout = Layout::BHSD;
        c.name += "_bhsd";
      }
      if (k % 11 == 5) {
        c.grad_layout = Layout::Padded;
        c.name += "_padded_grads";
      }
      out.push_back(c);
      ++k;
    });
  }
  return on_both_backends(out);
}

// softcap 30: alone non-causal and causal, and with a window ((64, 16), or causal with left 64).
std::vector<Case> softcap_cases() {
  const Shape full[4] = {{1, 300, 300, 4, 2}, {2, 113, 113, 4, 4}, {1, 113, 300, 8, 2}, {1, 300, 113, 4, 1}};
  const Shape causal[4] = {{1, 113, 300, 8, 2}, {1, 300, 300, 4, 2}, {1, 300, 113, 4, 2}, {2, 113, 113, 8, 1}};
  const Shape windowed[4] = {{1, 1000, 1000, 4, 2}, {1, 1000, 1000, 8, 2}, {1, 300, 1000, 4, 1}, {1, 1000, 300, 4, 2}};
  std::vector<Case> out;
  for_each_combo([&](flashcore_dtype dt, int64_t d, int n) {
    Case a = make_case(dt, d, false, full[n], "cap30");
    a.softcap = 30.0f;
    out.push_back(a);
    Case b = make_case(dt, d, true, causal[n], "cap30");
    b.softcap = 30.0f;
    out.push_back(b);
    const bool is_causal = n % 2 == 1;
    Case w = make_case(dt, d, is_causal, windowed[n], is_causal ? "cap30_win64" : "cap30_win64x16");
    with_window(w, 64, is_causal ? 0 : 16).softcap = 30.0f;
    out.push_back(w);
  });
  return on_both_backends(out);
}

// Sinks (random in [-2, 2]): alone without dsinks (NULL: not computed) and with it; with a window and GQA 8:2; on rows
// that see no key (window (0, 0) with Sq > Sk, or causal with Sq > Sk), where LSE = sinks[h]; with GQA 8:2 or MQA 8:1.
std::vector<Case> sinks_cases() {
  const Shape alone[4] = {{2, 113, 113, 4, 4}, {1, 300, 300, 4, 2}, {2, 17, 17, 4, 4}, {1, 113, 300, 4, 4}};
  const Shape causal[4] = {{1, 300, 300, 4, 4}, {1, 113, 300, 4, 2}, {2, 113, 113, 4, 4}, {1, 1, 300, 4, 4}};
  const Shape windowed[4] = {{1, 1000, 1000, 8, 2}, {1, 300, 300, 8, 2}, {1, 300, 1000, 8, 2}, {1, 1000, 1000, 8, 2}};
  const Shape empty_rows[4] = {{1, 300, 113, 4, 2}, {1, 300, 113, 4, 2}, {1, 1000, 300, 4, 2}, {2, 113, 17, 4, 2}};
  std::vector<Case> out;
  for_each_combo([&](flashcore_dtype dt, int64_t d, int n) {
    Case a = make_case(dt, d, false, alone[n], "sinks_no_dsinks");
    out.push_back(with_sinks(a, false));
    Case b = make_case(dt, d, true, causal[n], "sinks");
    out.push_back(with_sinks(b, true));
    const bool even = n % 2 == 0;
    Case w = make_case(dt, d, !even, windowed[n], even ? "sinks_win32x8" : "sinks_win64");
    with_window(w, even ? 32 : 64, even ? 8 : 0);
    out.push_back(with_sinks(w, true));
    Case e = make_case(dt, d, !even, empty_rows[n], even ? "sinks_win0x0_rows_without_keys" : "sinks_rows_without_keys");
    if (even) with_window(e, 0, 0);
    out.push_back(with_sinks(e, true));
    Case g = make_case(dt, d, false, even ? Shape{2, 113, 300, 8, 2} : Shape{1, 300, 113, 8, 1},
                       even ? "sinks_gqa" : "sinks_mqa");
    if (n == 3) {
      g.grad_layout = Layout::Padded;
      g.name += "_padded_grads";
    }
    out.push_back(with_sinks(g, true));
  });
  return on_both_backends(out);
}

// Extreme inputs, for the NaN / Inf check (and the reference): sinks far above and below the scores (exp(100)
// overflows float32), scores far past the softcap (Q and K * 6: scores of about +-36 under a cap of 30), rows that see
// no key without sinks (LSE = -inf), and everything at once (with (B, H, S, D) inputs and padded gradients).
std::vector<Case> nonfinite_cases() {
  std::vector<Case> out;
  for_each_combo([&](flashcore_dtype dt, int64_t d, int n) {
    if (n == 0 || n == 3) {
      Case s = make_case(dt, d, true, {1, 200, 300, 4, 2}, "extreme_sinks");
      with_sinks(s, true).sink_values = {100.0f, -100.0f, 60.0f, 0.0f};
      out.push_back(s);
      Case r = make_case(dt, d, false, {1, 300, 113, 4, 2}, "win0x0_cap5_rows_without_keys_no_sinks");
      with_window(r, 0, 0).softcap = 5.0f;
      out.push_back(r);
    }
    if (n == 1 || n == 2) {
      Case c = make_case(dt, d, false, {1, 300, 300, 4, 2}, "cap30_qk6_win64x64");
      with_window(c, 64, 64).softcap = 30.0f;
      c.qk_scale = 6.0f;
      out.push_back(c);
      Case r = make_case(dt, d, true, {2, 300, 113, 4, 1}, "causal_win3_rows_without_keys_no_sinks");
      with_window(r, 3, -1);
      out.push_back(r);
    }
    Case all = make_case(dt, d, n % 2 == 1, {2, 333, 777, 8, 2}, "win200x50_cap20_sinks");
    with_window(all, 200, 50).softcap = 20.0f;
    with_sinks(all, true);
    all.layout = Layout::BHSD, all.grad_layout = Layout::Padded;
    out.push_back(all);
  });
  return on_both_backends(out);
}

// attention_chunk: chunks of 1, 16, 64, 100, 128 and 5000 keys (smaller than, equal to and across the key and query
// blocks of both backends, and past every key), causal and not, alone and with a window, softcap and sinks; one
// shape per (dtype, head dim) combination, Sq = Sk, Sq < Sk and Sq > Sk (rows whose diagonal position is negative see
// no key, also without causal).
std::vector<Case> chunk_cases() {
  struct C {
    int32_t chunk;
    bool causal;
    Shape shapes[4];
  };
  const C chunks[] = {
      {1, true, {{1, 113, 113, 4, 2}, {1, 17, 17, 8, 2}, {1, 300, 113, 4, 4}, {2, 113, 300, 4, 1}}},
      {16, false, {{1, 300, 300, 8, 2}, {1, 113, 300, 4, 1}, {1, 300, 113, 4, 2}, {2, 17, 17, 2, 2}}},
      {64, true, {{1, 1000, 1000, 8, 2}, {1, 300, 113, 4, 2}, {2, 113, 113, 4, 4}, {1, 1, 300, 8, 1}}},
      {100, false, {{1, 300, 300, 4, 2}, {1, 300, 1000, 8, 2}, {1, 113, 300, 4, 4}, {1, 1000, 300, 8, 1}}},
      {128, true, {{1, 1000, 1000, 8, 2}, {2, 113, 113, 8, 2}, {1, 300, 1000, 4, 2}, {1, 1000, 300, 4, 1}}},
      {5000, false, {{1, 113, 113, 4, 2}, {1, 300, 113, 4, 4}, {1, 17, 300, 8, 2}, {2, 1, 1, 2, 1}}},
  };
  std::vector<Case> out;
  int k = 0;
  for (const C& ch : chunks) {
    for_each_combo([&](flashcore_dtype dt, int64_t d, int n) {
      std::string what = "chunk" + std::to_string(ch.chunk);
      if (k % 4 == 1) what += ch.causal ? "_win40" : "_win40x20";
      if (k % 5 == 2) what += "_cap30";
      if (k % 3 == 0) what += "_sinks";
      Case c = make_case(dt, d, ch.causal, ch.shapes[n], what);
      c.chunk = ch.chunk;
      if (k % 4 == 1) with_window(c, 40, ch.causal ? 0 : 20);
      if (k % 5 == 2) c.softcap = 30.0f;
      if (k % 3 == 0) with_sinks(c, true);
      if (k % 7 == 3) {
        c.layout = c.grad_layout = Layout::BHSD;
        c.name += "_bhsd";
      }
      out.push_back(c);
      ++k;
    });
  }
  return on_both_backends(out);
}

// The sm90 backend's other head dims (96: the 128-key kernel with 64-byte rows; 192 and 256: the wide kernel), both
// dtypes: a two-sided window, a causal window, softcap alone and with a causal window, sinks with a window, chunks with
// softcap. The portable backend has no backward at these head dims: its runs skip, quoting the library.
std::vector<Case> head_dim_cases() {
  std::vector<Case> out;
  int n = 0;
  for (int64_t d : {96, 192, 256}) {
    for (flashcore_dtype dt : kDtypes) {
      const bool odd = n++ % 2 == 1;
      Case a = make_case(dt, d, false, odd ? Shape{1, 300, 113, 4, 2} : Shape{1, 300, 300, 4, 2}, "win16x16");
      out.push_back(with_window(a, 16, 16));
      Case b = make_case(dt, d, true, odd ? Shape{2, 113, 113, 4, 4} : Shape{1, 300, 1000, 4, 2}, "win32");
      out.push_back(with_window(b, 32, 0));
      Case c = make_case(dt, d, false, {2, 113, 113, 4, 2}, "cap30");
      c.softcap = 30.0f;
      out.push_back(c);
      Case w = make_case(dt, d, true, {1, 300, 300, 8, 2}, "cap30_win64");
      with_window(w, 64, 0).softcap = 30.0f;
      out.push_back(w);
      Case s = make_case(dt, d, !odd, {1, 300, 300, 4, 2}, odd ? "sinks_win32x8" : "sinks_win64");
      with_window(s, odd ? 32 : 64, odd ? 8 : 0);
      out.push_back(with_sinks(s, true));
      Case k = make_case(dt, d, odd, {1, 300, 300, 4, 2}, "chunk100_cap30");
      k.chunk = 100, k.softcap = 30.0f;
      if (odd) {
        k.layout = k.grad_layout = Layout::BHSD;
        k.name += "_bhsd";
      }
      out.push_back(k);
    }
  }
  return on_both_backends(out);
}

// deterministic = 1 with windows whose query blocks start past key block 0, sinks + dsinks and softcap.
std::vector<Case> determinism_cases() {
  std::vector<Case> out;
  {
    Case c = make_case(FLASHCORE_DTYPE_BF16, 64, true, {1, 1000, 1000, 8, 2}, "win32");
    with_window(c, 32, 0);
    out.push_back(c);
  }
  {
    Case c = make_case(FLASHCORE_DTYPE_FP16, 128, false, {2, 300, 1000, 4, 1}, "win100x50");
    with_window(c, 100, 50);
    out.push_back(c);
  }
  {
    Case c = make_case(FLASHCORE_DTYPE_BF16, 128, false, {1, 1000, 300, 4, 2}, "win5xinf_sinks");
    with_window(c, 5, -1);
    out.push_back(with_sinks(c, true));
  }
  {
    Case c = make_case(FLASHCORE_DTYPE_FP16, 64, false, {1, 300, 113, 4, 1}, "win0x0_cap30_sinks");
    with_window(c, 0, 0).softcap = 30.0f;
    out.push_back(with_sinks(c, true));
  }
  {
    Case c = make_case(FLASHCORE_DTYPE_BF16, 128, true, {2, 700, 700, 4, 2}, "win128_cap30_sinks");
    with_window(c, 128, 0).softcap = 30.0f;
    out.push_back(with_sinks(c, true));
  }
  {
    // Chunks that start past key block 0 and query blocks that span two chunks.
    Case c = make_case(FLASHCORE_DTYPE_BF16, 128, true, {2, 1000, 1000, 4, 2}, "chunk200");
    c.chunk = 200;
    out.push_back(c);
  }
  {
    Case c = make_case(FLASHCORE_DTYPE_FP16, 64, false, {1, 300, 1000, 4, 1}, "chunk96_win100x50_sinks");
    with_window(c, 100, 50).chunk = 96;
    out.push_back(with_sinks(c, true));
  }
  for (int64_t d : {96, 192, 256}) {  // (the sm90 backend's other head dims)
    Case c = make_case(d == 192 ? FLASHCORE_DTYPE_FP16 : FLASHCORE_DTYPE_BF16, d, true, {1, 700, 700, 4, 2},
                       "win128_cap30_sinks");
    with_window(c, 128, 0).softcap = 30.0f;
    out.push_back(with_sinks(c, true));
  }
  for (Case& c : out) c.deterministic = 1;
  return on_both_backends(out);
}

// ------------------------------------------------------------------------------------------------
// Device problems
// ------------------------------------------------------------------------------------------------
struct Problem : DenseProblem {
  Case c;
  std::vector<float> sinks;  // host copy (empty without sinks)
  std::unique_ptr<DeviceBuffer> sinks_dev, dsinks_dev;

  size_t dsinks_bytes() const { return static_cast<size_t>(c.heads_q + kDsinksPad) * sizeof(float); }
  // The call's problem with host pointers, for the reference.
  flashcore_attention_params host_problem() const {
    flashcore_attention_params h = host_call();
    h.sinks = sinks.empty() ? nullptr : sinks.data();
    h.dsinks = nullptr;
    return h;
  }
};

// Sets `pr` up for pr.c (fresh inputs from pr.seed, NaN between a padded tensor's rows) and runs the forward with LSE
// and the case's variant. Sets pr.skip when this build lacks the case.
void prepare(Problem& pr) {
  const Case& c = pr.c;
  pr.make_tensors(c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv, c.head_dim, c.layout, c.grad_layout);
  std::mt19937_64 rng(pr.seed);
  pr.fill_inputs(rng, c.dtype, c.qk_scale);
  if (::testing::Test::HasFatalFailure()) return;
  if (c.sinks) {
    if (!c.sink_values.empty()) {
      ASSERT_EQ(static_cast<int64_t>(c.sink_values.size()), c.heads_q) << "the case's sink_values";
      pr.sinks = c.sink_values;
    } else {
      std::uniform_real_distribution<float> u(-2.0f, 2.0f);
      pr.sinks.resize(static_cast<size_t>(c.heads_q));
      for (float& s : pr.sinks) s = u(rng);
    }
    pr.sinks_dev = std::make_unique<DeviceBuffer>(pr.sinks.size() * sizeof(float));
    ASSERT_EQ(cudaMemcpy(pr.sinks_dev->ptr, pr.sinks.data(), pr.sinks.size() * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
    if (c.dsinks) pr.dsinks_dev = std::make_unique<DeviceBuffer>(pr.dsinks_bytes());
  }

  pr.init_call();
  flashcore_attention_params& p = pr.p;
  p.dtype = c.dtype, p.causal = c.causal ? 1 : 0;
  p.local = c.local ? 1 : 0, p.window_size_left = c.left, p.window_size_right = c.right;
  p.attention_chunk = c.chunk;
  p.softcap = c.softcap;
  p.sinks = pr.sinks_dev ? static_cast<const float*>(pr.sinks_dev->ptr) : nullptr;
  p.dsinks = pr.dsinks_dev ? static_cast<float*>(pr.dsinks_dev->ptr) : nullptr;
  p.deterministic = c.deterministic;

  validate_forward(pr);
  if (::testing::Test::HasFatalFailure() || !pr.skip.empty()) return;
  run_forward(pr, describe(c), [&] { wait_or_die(nullptr, "the forward of " + describe(c)); });
  if (::testing::Test::HasFatalFailure()) return;
  make_workspace(pr, describe(c));
}

// One backward call of `params` (default: pr.p) on the legacy default stream, with dq, dk, dv and dsinks poisoned and
// the workspace filled with 0xff bytes before it; the outputs downloaded whole.
void run_backward(Problem& pr, Grads& out, const flashcore_attention_params* params = nullptr) {
  poison_for_backward(pr);
  if (::testing::Test::HasFatalFailure()) return;
  if (pr.dsinks_dev) {
    ASSERT_EQ(cudaMemset(pr.dsinks_dev->ptr, 0xff, pr.dsinks_bytes()), cudaSuccess);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(flashcore_attention_backward(params != nullptr ? params : &pr.p, nullptr), FLASHCORE_SUCCESS)
      << describe(pr.c) << ": " << flashcore_last_error();
  wait_or_die(nullptr, "the backward of " + describe(pr.c));
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << describe(pr.c);
  download_grads(pr, out);
  out.dsinks.clear();
  if (pr.dsinks_dev) {
    out.dsinks.resize(static_cast<size_t>(pr.c.heads_q + kDsinksPad));
    ASSERT_EQ(cudaMemcpy(out.dsinks.data(), pr.dsinks_dev->ptr, pr.dsinks_bytes(), cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
}

// The backward's inputs O, LSE, dO and sinks are as they were.
void expect_inputs_unchanged(const Problem& pr) {
  flashcore::test_bwd::expect_inputs_unchanged(pr);
  if (::testing::Test::HasFatalFailure()) return;
  if (pr.sinks_dev) {
    std::vector<float> sinks(pr.sinks.size());
    ASSERT_EQ(cudaMemcpy(sinks.data(), pr.sinks_dev->ptr, sinks.size() * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_TRUE(same_bits(sinks, pr.sinks)) << "the backward wrote to sinks";
  }
}

// ------------------------------------------------------------------------------------------------
// References and checks
// ------------------------------------------------------------------------------------------------

// dL/dsinks from given O and LSE: per query head h, sum = -sum_{b, i} exp(sinks[h] - LSE) * (dO . O) and abs = the sum
// of the |terms|, in float64. o(b, i, h, d), lse(b, h, i) and dout(b, i, h, d) read the values.
struct SinkSums {
  std::vector<double> sum, abs;
};
template <typename O, typename L, typename G>
SinkSums sink_sums(const std::vector<float>& sinks, int64_t B, int64_t Sq, int64_t Hq, int64_t D, O&& o, L&& lse,
                   G&& dout) {
  SinkSums r;
  r.sum.assign(static_cast<size_t>(Hq), 0.0);
  r.abs.assign(static_cast<size_t>(Hq), 0.0);
  for (int64_t h = 0; h < Hq; ++h)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < Sq; ++i) {
        double delta = 0;
        for (int64_t d = 0; d < D; ++d) delta += dout(b, i, h, d) * o(b, i, h, d);
        if (delta == 0.0) continue;  // (a row without keys: O = 0; its LSE may be -inf)
        const double term = std::exp(static_cast<double>(sinks[static_cast<size_t>(h)]) - lse(b, h, i)) * delta;
        r.sum[static_cast<size_t>(h)] -= term;
        r.abs[static_cast<size_t>(h)] += std::fabs(term);
      }
  return r;
}

struct References {
  ref::Gradients exact, lowp;
  std::vector<double> dsinks_exact;  // empty without dsinks
  SinkSums dsinks_lowp;              // over attention_lowp()'s O and LSE
};

References compute_references(const Problem& pr) {
  const flashcore_attention_params host = pr.host_problem();
  References r;
  r.exact = ref::attention_backward(host, pr.dout.host.data());
  r.lowp = ref::attention_backward_lowp(host, pr.dout.host.data());
  if (pr.c.dsinks) {
    r.dsinks_exact = ref::attention_backward_sinks(host, pr.dout.host.data());
    const ref::Output low = ref::attention_lowp(host);
    const Case& c = pr.c;
    const int64_t Sq = c.seqlen_q, Hq = c.heads_q, D = c.head_dim;
    r.dsinks_lowp = sink_sums(
        pr.sinks, c.batch, Sq, Hq, D,
        [&](int64_t b, int64_t i, int64_t h, int64_t d) { return low.o[static_cast<size_t>(((b * Sq + i) * Hq + h) * D + d)]; },
        [&](int64_t b, int64_t h, int64_t i) { return low.lse[static_cast<size_t>((b * Hq + h) * Sq + i)]; },
        [&](int64_t b, int64_t i, int64_t h, int64_t d) {
          return static_cast<double>(to_float(pr.dout.host[static_cast<size_t>(pr.dout.at(b, i, h, d))], c.dtype));
        });
  }
  return r;
}

// The references of pr's case, computed once for the case's name and seed: the native and the portable runs of a
// case (adjacent in the lists) share them.
const References& references(const Problem& pr) {
  static std::string key;
  static std::unique_ptr<References> cached;
  const std::string k = pr.c.name + "#" + std::to_string(pr.seed);
  if (!cached || key != k) {
    cached.reset();
    cached = std::make_unique<References>(compute_references(pr));
    key = k;
  }
  return *cached;
}

// dq, dk, dv of `g` against the references; dq of a query row that sees no key, and dk and dv of a key that no row
// sees, must be exactly 0.
std::string check_grads(const Problem& pr, const Grads& g, const References& r) {
  std::string log = check_dq_dk_dv(pr, describe(pr.c), g, r.exact, r.lowp);
  const Case& c = pr.c;
  const flashcore_attention_params host = pr.host_problem();
  std::vector<char> seen(static_cast<size_t>(c.seqlen_k), 0);
  int64_t rows_without_keys = 0, nonzero_dq = 0;
  for (int64_t i = 0; i < c.seqlen_q; ++i) {
    const ref::KeyRange keys = ref::visible_key_range(host, c.seqlen_q, c.seqlen_k, i);
    for (int64_t j = keys.begin; j < keys.end; ++j) seen[static_cast<size_t>(j)] = 1;
    if (!keys.empty()) continue;
    ++rows_without_keys;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.heads_q; ++h)
        for (int64_t d = 0; d < c.head_dim; ++d)
          nonzero_dq += to_float(g.dq[static_cast<size_t>(pr.dq.at(b, i, h, d))], c.dtype) != 0.0f;
  }
  EXPECT_EQ(nonzero_dq, 0) << describe(c) << ": dq of the " << rows_without_keys << " rows that see no key must be 0";
  int64_t unseen_keys = 0, nonzero_dkdv = 0;
  for (int64_t j = 0; j < c.seqlen_k; ++j) {
    if (seen[static_cast<size_t>(j)]) continue;
    ++unseen_keys;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.heads_kv; ++h)
        for (int64_t d = 0; d < c.head_dim; ++d) {
          nonzero_dkdv += to_float(g.dk[static_cast<size_t>(pr.dk.at(b, j, h, d))], c.dtype) != 0.0f;
          nonzero_dkdv += to_float(g.dv[static_cast<size_t>(pr.dv.at(b, j, h, d))], c.dtype) != 0.0f;
        }
  }
  EXPECT_EQ(nonzero_dkdv, 0) << describe(c) << ": dk and dv of the " << unseen_keys << " keys no row sees must be 0";
  if (rows_without_keys > 0) log += ", " + std::to_string(rows_without_keys) + " rows without keys";
  if (unseen_keys > 0) log += ", " + std::to_string(unseen_keys) + " keys unseen";
  return log;
}

// dsinks against the reference and against the call's own O and LSE (see the file's comment). `from_call` is
// sink_sums() over the O and LSE the forward wrote.
std::string check_dsinks_values(const Case& c, uint64_t seed, const std::vector<float>& got,
                                const std::vector<double>& exact, const SinkSums& lowp, const SinkSums& from_call) {
  const int64_t Hq = c.heads_q;
  if (static_cast<int64_t>(got.size()) != Hq + kDsinksPad) {
    ADD_FAILURE() << describe(c) << ": dsinks not downloaded";
    return "";
  }
  int64_t nonfinite = 0, written_past = 0;
  for (int64_t h = 0; h < Hq + kDsinksPad; ++h) {
    const float x = got[static_cast<size_t>(h)];
    if (h < Hq) {
      nonfinite += !std::isfinite(x);
    } else {
      uint32_t bits;
      std::memcpy(&bits, &x, sizeof bits);
      written_past += bits != kFloatPoison;
    }
  }
  EXPECT_EQ(nonfinite, 0) << describe(c) << " [seed " << seed << "]: " << nonfinite
                          << " entries of dsinks are NaN/Inf (unwritten: the poison is NaN)";
  EXPECT_EQ(written_past, 0) << describe(c) << ": " << written_past << " floats past dsinks' num_heads_q were written";
  double err = 0, lowp_err = 0, scale = 0, abs_max = 0;
  int64_t worst = 0;
  for (int64_t h = 0; h < Hq; ++h) {
    const size_t i = static_cast<size_t>(h);
    if (std::isfinite(got[i]) && std::fabs(got[i] - exact[i]) > err) err = std::fabs(got[i] - exact[i]), worst = h;
    lowp_err = std::max(lowp_err, std::fabs(lowp.sum[i] - exact[i]));
    scale = std::max(scale, std::fabs(exact[i]));
    abs_max = std::max(abs_max, lowp.abs[i]);
  }
  scale = std::max(scale, 1e-2 * abs_max);
  // + one rounding of O per term: dsinks reads the O the forward stored in the dtype, whose own error (within the
  // forward's tolerance, from its accumulation order) the low-precision model does not share; with extreme sinks the
  // terms barely cancel and that error shows (H100: 3.1e-4 against a tolerance of 2.4e-4 without this term).
  double o_term = 0;
  for (int64_t h = 0; h < Hq; ++h) {
    o_term = std::max(o_term, std::ldexp(1.0, c.dtype == FLASHCORE_DTYPE_BF16 ? -8 : -11) * from_call.abs[static_cast<size_t>(h)]);
  }
  const double tol = grad_tolerance(lowp_err, scale, c.dtype) + o_term + 1e-6;
  if (err > tol) {
    ADD_FAILURE() << describe(c) << " [seed " << seed << "]: dsinks err " << err << " > tol " << tol << " (lowp "
                  << lowp_err << ", max|ref| " << scale << "); worst at head " << worst << ": got "
                  << got[static_cast<size_t>(worst)] << ", want " << exact[static_cast<size_t>(worst)] << ", lowp "
                  << lowp.sum[static_cast<size_t>(worst)];
  }
  double self_err = 0;  // relative to each head's own bound
  for (int64_t h = 0; h < Hq; ++h) {
    const size_t i = static_cast<size_t>(h);
    const double bound = 1e-4 * from_call.abs[i] + 1e-6;
    const double e = std::fabs(got[i] - from_call.sum[i]);
    self_err = std::max(self_err, e / bound);
    EXPECT_LE(e, bound) << describe(c) << " [seed " << seed << "]: dsinks[" << h << "] = " << got[i]
                        << ", but -sum exp(sinks[h] - LSE) rowsum(dO * O) over the call's own O and LSE is "
                        << from_call.sum[i] << " (sum of |terms| " << from_call.abs[i]
                        << "): a row left out, counted twice or weighted wrongly?";
  }
  char line[256];
  std::snprintf(line, sizeof line, "dsinks err %.3g (tol %.3g, lowp %.3g, max|ref| %.3g; vs own O/LSE %.2g of bound)",
                err, tol, lowp_err, scale, self_err);
  return line;
}

std::string check_dsinks(const Problem& pr, const Grads& g, const References& r) {
  const Case& c = pr.c;
  const int64_t Sq = c.seqlen_q, Hq = c.heads_q;
  const SinkSums from_call = sink_sums(
      pr.sinks, c.batch, Sq, Hq, c.head_dim,
      [&](int64_t b, int64_t i, int64_t h, int64_t d) {
        return static_cast<double>(to_float(pr.o_after_forward[static_cast<size_t>(pr.o.at(b, i, h, d))], c.dtype));
      },
      [&](int64_t b, int64_t h, int64_t i) {
        return static_cast<double>(pr.lse_after_forward[static_cast<size_t>((b * Hq + h) * Sq + i)]);
      },
      [&](int64_t b, int64_t i, int64_t h, int64_t d) {
        return static_cast<double>(to_float(pr.dout.host[static_cast<size_t>(pr.dout.at(b, i, h, d))], c.dtype));
      });
  return check_dsinks_values(c, pr.seed, g.dsinks, r.dsinks_exact, r.dsinks_lowp, from_call);
}

std::string check_all(const Problem& pr, const Grads& g, const References& r) {
  std::string log = check_grads(pr, g, r);
  if (pr.c.dsinks) log += ", " + check_dsinks(pr, g, r);
  return log;
}

// Sets up pr for `c` (seeded by its name) under the current backend. False when the test must stop: a fatal failure, or
// a skip (GTEST_SKIP'ed by the caller with pr.skip).
bool set_up(Problem& pr, const Case& c) {
  pr.c = c;
  pr.seed = case_seed(c.name);
  prepare(pr);
  return !::testing::Test::HasFatalFailure() && pr.skip.empty();
}

// The start of the reference-checked suites' tests: the case skips, saying why, where its backend cannot run here;
// otherwise pr is set up for it under that backend (FLASHCORE_BACKEND kept for the whole test), or the case skips where
// the build lacks it.
class VariantCaseTest : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    FLASHCORE_REQUIRE_GPU();
    const Case& c = GetParam();
    if (const std::string why = backend_skip_reason(c.backend); !why.empty()) GTEST_SKIP() << why;
    backend_ = std::make_unique<ScopedBackend>(c.backend);
    if (!set_up(pr, c) && !pr.skip.empty()) GTEST_SKIP() << describe(c) << ": " << pr.skip;
  }

  std::unique_ptr<ScopedBackend> backend_;  // declared before pr: it outlives pr
  Problem pr;
};

// ------------------------------------------------------------------------------------------------
// Windows, softcap and sinks against the reference
// ------------------------------------------------------------------------------------------------
class BackwardVariant : public VariantCaseTest {};

TEST_P(BackwardVariant, MatchesReference) {
  const Case& c = GetParam();
  Grads g;
  run_backward(pr, g);
  if (HasFatalFailure()) return;
  expect_inputs_unchanged(pr);
  const References& r = references(pr);
  std::printf("  %s [seed %llu]: %s\n", describe(c).c_str(), static_cast<unsigned long long>(pr.seed),
              check_all(pr, g, r).c_str());
}

INSTANTIATE_TEST_SUITE_P(Window, BackwardVariant, testing::ValuesIn(window_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Softcap, BackwardVariant, testing::ValuesIn(softcap_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Sinks, BackwardVariant, testing::ValuesIn(sinks_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Chunk, BackwardVariant, testing::ValuesIn(chunk_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(HeadDims, BackwardVariant, testing::ValuesIn(head_dim_cases()), param_name);

// ------------------------------------------------------------------------------------------------
// NaN / Inf: outputs poisoned with NaN before the call, every element finite after, on extreme inputs
// ------------------------------------------------------------------------------------------------
class BackwardVariantNonFinite : public VariantCaseTest {};

TEST_P(BackwardVariantNonFinite, EveryOutputIsWrittenAndFinite) {
  const Case& c = GetParam();
  Grads g;
  run_backward(pr, g);
  if (HasFatalFailure()) return;
  // Every element of dq, dk, dv (the logical ones) and of dsinks' num_heads_q floats is finite: the NaN poison was
  // overwritten, and nothing overflowed.
  int64_t nonfinite[4] = {0, 0, 0, 0};
  const Tensor* tensors[3] = {&pr.dq, &pr.dk, &pr.dv};
  const std::vector<uint16_t>* got[3] = {&g.dq, &g.dk, &g.dv};
  for (int t = 0; t < 3; ++t)
    for (int64_t i = 0; i < tensors[t]->elements(); ++i)
      nonfinite[t] += !std::isfinite(to_float((*got[t])[static_cast<size_t>(tensors[t]->at_dense(i))], c.dtype));
  for (int64_t h = 0; h < (c.dsinks ? c.heads_q : 0); ++h) nonfinite[3] += !std::isfinite(g.dsinks[static_cast<size_t>(h)]);
  EXPECT_EQ(nonfinite[0], 0) << describe(c) << " [seed " << pr.seed << "]: NaN/Inf in dq";
  EXPECT_EQ(nonfinite[1], 0) << describe(c) << " [seed " << pr.seed << "]: NaN/Inf in dk";
  EXPECT_EQ(nonfinite[2], 0) << describe(c) << " [seed " << pr.seed << "]: NaN/Inf in dv";
  EXPECT_EQ(nonfinite[3], 0) << describe(c) << " [seed " << pr.seed << "]: NaN/Inf in dsinks";
  expect_inputs_unchanged(pr);
  std::printf("  %s [seed %llu]: %s\n", describe(c).c_str(), static_cast<unsigned long long>(pr.seed),
              check_all(pr, g, references(pr)).c_str());
}

INSTANTIATE_TEST_SUITE_P(Extremes, BackwardVariantNonFinite, testing::ValuesIn(nonfinite_cases()), param_name);

// ------------------------------------------------------------------------------------------------
// Determinism: deterministic = 1 gives bit-identical dq, dk, dv and dsinks; deterministic = 0 bit-identical dk, dv and
// dsinks (flashcore.h: dk, dv and dsinks always are); every run within the tolerance; none hangs.
// ------------------------------------------------------------------------------------------------
class BackwardVariantDeterminism : public VariantCaseTest {};

TEST_P(BackwardVariantDeterminism, RepeatedRunsAreBitIdentical) {
  constexpr int kRuns = 3;
  const References& r = references(pr);
  for (int32_t det : {1, 0}) {
    SCOPED_TRACE(det ? "deterministic = 1" : "deterministic = 0");
    pr.p.deterministic = det;
    pr.c.deterministic = det;
    Grads first;
    run_backward(pr, first);
    if (HasFatalFailure()) return;
    std::printf("  %s [seed %llu]: %s\n", describe(pr.c).c_str(), static_cast<unsigned long long>(pr.seed),
                check_all(pr, first, r).c_str());
    for (int run = 1; run < kRuns; ++run) {
      SCOPED_TRACE("run " + std::to_string(run));
      Grads again;
      run_backward(pr, again);
      if (HasFatalFailure()) return;
      expect_same_as_first_run(describe(pr.c), det != 0, first, again);
      if (!det) check_all(pr, again, r);
    }
  }
  expect_inputs_unchanged(pr);
}

INSTANTIATE_TEST_SUITE_P(Repeat, BackwardVariantDeterminism, testing::ValuesIn(determinism_cases()), param_name);

// ------------------------------------------------------------------------------------------------
// Packed (varlen) batches with the variants: cu_seqlens_q / _k, each sequence against its own reference (sm90 backend)
// ------------------------------------------------------------------------------------------------

struct PackedCase {
  std::string name;
  flashcore_dtype dtype = FLASHCORE_DTYPE_BF16;
  int64_t head_dim = 64;
  bool causal = false;
  bool local = false;
  int32_t left = 0, right = 0;
  int32_t chunk = 0;  // attention_chunk
  float softcap = 0.0f;
  bool sinks = false;  // random in [-2, 2], with dsinks
  std::vector<int32_t> len_q, len_k;
  int64_t heads_q = 4, heads_kv = 2;
};

void PrintTo(const PackedCase& c, std::ostream* os) { *os << c.name; }

std::vector<PackedCase> packed_cases() {
  // Lengths that cross and end inside blocks, one row, Sq < Sk and Sq > Sk (rows without keys under a window).
  const std::vector<int32_t> lq = {17, 64, 1, 200, 150, 130}, lk = {33, 64, 5, 200, 40, 257};
  // Sequences with queries and no key, keys and no query, and an empty one.
  const std::vector<int32_t> eq = {9, 0, 50, 0, 20}, ek = {0, 30, 70, 0, 20};
  std::vector<PackedCase> out;
  for (flashcore_dtype dt : kDtypes)
    for (int64_t d : kHeadDims) {
      const std::string base = std::string(dt == FLASHCORE_DTYPE_FP16 ? "fp16" : "bf16") + "_d" + std::to_string(d);
      PackedCase c;
      c.dtype = dt, c.head_dim = d, c.len_q = lq, c.len_k = lk;
      {
        PackedCase x = c;
        x.name = base + "_causal_win32", x.causal = true, x.local = true, x.left = 32, x.right = 0;
        out.push_back(x);
      }
      {
        PackedCase x = c;
        x.name = base + "_full_win16x8", x.local = true, x.left = 16, x.right = 8;
        out.push_back(x);
      }
      {
        PackedCase x = c;
        x.name = base + "_full_cap30", x.softcap = 30.0f;
        out.push_back(x);
      }
      {
        PackedCase x = c;
        x.name = base + "_causal_win48_cap30_sinks", x.causal = true, x.local = true, x.left = 48;
        x.softcap = 30.0f, x.sinks = true, x.heads_q = 8;
        out.push_back(x);
      }
      {
        PackedCase x = c;
        x.name = base + "_causal_chunk48_sinks", x.causal = true, x.chunk = 48, x.sinks = true;
        out.push_back(x);
      }
      {
        PackedCase x = c;
        x.name = base + "_full_chunk100_win30x30", x.chunk = 100, x.local = true, x.left = 30, x.right = 30;
        out.push_back(x);
      }
      {
        PackedCase x = c;
        x.name = base + "_full_win16x16_sinks_empty_sequences", x.local = true, x.left = 16, x.right = 16;
        x.sinks = true, x.len_q = eq, x.len_k = ek;
        out.push_back(x);
      }
    }
  return out;
}

// A packed problem's host side: lengths, cu_seqlens, inputs (packed (total, heads, head_dim)), sinks.
struct PackedProblem {
  PackedCase c;
  uint64_t seed = 0;
  int64_t B = 0, D = 0, Hq = 0, Hkv = 0, total_q = 0, total_k = 0, max_q = 0, max_k = 0;
  std::vector<int32_t> cu_q{0}, cu_k{0};
  std::vector<uint16_t> q, k, v, dout;
  std::vector<float> sinks;  // empty without sinks
};

PackedProblem make_packed_problem(const PackedCase& c) {
  PackedProblem pp;
  pp.c = c;
  pp.seed = case_seed("packed_" + c.name);
  pp.B = static_cast<int64_t>(c.len_q.size()), pp.D = c.head_dim, pp.Hq = c.heads_q, pp.Hkv = c.heads_kv;
  for (size_t b = 0; b < c.len_q.size(); ++b) {
    pp.cu_q.push_back(pp.cu_q.back() + c.len_q[b]);
    pp.cu_k.push_back(pp.cu_k.back() + c.len_k[b]);
  }
  pp.total_q = pp.cu_q.back(), pp.total_k = pp.cu_k.back();
  pp.max_q = *std::max_element(c.len_q.begin(), c.len_q.end());
  pp.max_k = *std::max_element(c.len_k.begin(), c.len_k.end());
  std::mt19937_64 rng(pp.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto random = [&](int64_t n) {
    std::vector<uint16_t> x(static_cast<size_t>(n));
    for (auto& e : x) e = to_bits(normal(rng), c.dtype);
    return x;
  };
  pp.q = random(pp.total_q * pp.Hq * pp.D);
  pp.k = random(pp.total_k * pp.Hkv * pp.D);
  pp.v = random(pp.total_k * pp.Hkv * pp.D);
  pp.dout = random(pp.total_q * pp.Hq * pp.D);
  if (c.sinks) {
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    for (int64_t h = 0; h < pp.Hq; ++h) pp.sinks.push_back(u(rng));
  }
  return pp;
}

// Sequence b of the packed problem as a one-sequence host problem pointing into the packed host arrays (batch 1).
flashcore_attention_params packed_sequence(const PackedProblem& pp, int64_t b) {
  const PackedCase& c = pp.c;
  const int64_t D = pp.D, Hq = pp.Hq, Hkv = pp.Hkv;
  flashcore_attention_params h;
  flashcore_attention_params_init(&h);
  h.batch = 1, h.seqlen_q = c.len_q[static_cast<size_t>(b)], h.seqlen_k = c.len_k[static_cast<size_t>(b)];
  h.num_heads_q = Hq, h.num_heads_kv = Hkv, h.head_dim = D;
  h.dtype = c.dtype, h.causal = c.causal ? 1 : 0;
  h.local = c.local ? 1 : 0, h.window_size_left = c.left, h.window_size_right = c.right, h.softcap = c.softcap;
  h.attention_chunk = c.chunk;
  h.sinks = c.sinks ? pp.sinks.data() : nullptr;
  h.q = pp.q.data() + pp.cu_q[static_cast<size_t>(b)] * Hq * D;
  h.k = pp.k.data() + pp.cu_k[static_cast<size_t>(b)] * Hkv * D;
  h.v = pp.v.data() + pp.cu_k[static_cast<size_t>(b)] * Hkv * D;
  h.q_strides = h.o_strides = h.dout_strides = flashcore_tensor_strides{pp.total_q * Hq * D, Hq * D, D, 1};
  h.k_strides = h.v_strides = flashcore_tensor_strides{pp.total_k * Hkv * D, Hkv * D, D, 1};
  return h;
}

// The outputs of one packed backward call, downloaded whole.
struct PackedRun {
  std::vector<uint16_t> dq, dk, dv;  // packed, as the tensors
  std::vector<float> dsinks;         // num_heads_q + kDsinksPad floats (empty without sinks)
};

// Runs `label`'s outputs against each sequence's reference (see the test's comment). o and lse: what the forward wrote
// (packed O, LSE (num_heads_q, total_q)).
void check_packed_run(const PackedProblem& pp, const PackedRun& got, const std::string& label,
                      const std::vector<uint16_t>& o, const std::vector<float>& lse) {
  const PackedCase& c = pp.c;
  const int64_t D = pp.D, Hq = pp.Hq, Hkv = pp.Hkv;
  auto value = [&](const std::vector<uint16_t>& t, int64_t row, int64_t heads, int64_t h, int64_t d) {
    return static_cast<double>(to_float(t[static_cast<size_t>((row * heads + h) * D + d)], c.dtype));
  };
  std::vector<double> dsinks_exact(static_cast<size_t>(Hq), 0.0);
  SinkSums dsinks_lowp{std::vector<double>(static_cast<size_t>(Hq), 0.0), std::vector<double>(static_cast<size_t>(Hq), 0.0)};
  SinkSums from_call = dsinks_lowp;
  std::string log;
  for (int64_t b = 0; b < pp.B; ++b) {
    SCOPED_TRACE(label + ", sequence " + std::to_string(b) + " [seed " + std::to_string(pp.seed) + "]");
    const int64_t lq = c.len_q[static_cast<size_t>(b)], lk = c.len_k[static_cast<size_t>(b)];
    const int64_t q0 = pp.cu_q[static_cast<size_t>(b)], k0 = pp.cu_k[static_cast<size_t>(b)];
    if (lq == 0 || lk == 0) {
      // No query or no key: every gradient of the sequence is exactly 0 (so written, and finite).
      int64_t nonzero = 0;
      for (int64_t i = 0; i < lq; ++i)
        for (int64_t h = 0; h < Hq; ++h)
          for (int64_t d = 0; d < D; ++d) nonzero += value(got.dq, q0 + i, Hq, h, d) != 0.0;
      for (int64_t j = 0; j < lk; ++j)
        for (int64_t h = 0; h < Hkv; ++h)
          for (int64_t d = 0; d < D; ++d) {
            nonzero += value(got.dk, k0 + j, Hkv, h, d) != 0.0;
            nonzero += value(got.dv, k0 + j, Hkv, h, d) != 0.0;
          }
      EXPECT_EQ(nonzero, 0) << c.name << ": a sequence of " << lq << " queries and " << lk
                            << " keys must get zero gradients";
      continue;
    }
    const flashcore_attention_params h = packed_sequence(pp, b);
    const uint16_t* dout_seq = pp.dout.data() + q0 * Hq * D;
    const ref::Gradients exact = ref::attention_backward(h, dout_seq);
    const ref::Gradients lowp = ref::attention_backward_lowp(h, dout_seq);
    const double floor_scale = 1e-2 * std::max({max_abs(exact.dq), max_abs(exact.dk), max_abs(exact.dv)});
    const std::vector<double>* want[3] = {&exact.dq, &exact.dk, &exact.dv};
    const std::vector<double>* low[3] = {&lowp.dq, &lowp.dk, &lowp.dv};
    const std::vector<uint16_t>* mine[3] = {&got.dq, &got.dk, &got.dv};
    const int64_t start[3] = {q0 * Hq * D, k0 * Hkv * D, k0 * Hkv * D};
    const char* names[3] = {"dq", "dk", "dv"};
    for (int t = 0; t < 3; ++t) {
      double err = 0, lowp_err = 0, scale = 0;
      int64_t nonfinite = 0;
      for (size_t e = 0; e < want[t]->size(); ++e) {
        const double x = to_float((*mine[t])[static_cast<size_t>(start[t]) + e], c.dtype), w = (*want[t])[e];
        if (!std::isfinite(x)) {
          ++nonfinite;
          continue;
        }
        err = std::max(err, std::fabs(x - w));
        lowp_err = std::max(lowp_err, std::fabs((*low[t])[e] - w));
        scale = std::max(scale, std::fabs(w));
      }
      const double tol = grad_tolerance(lowp_err, std::max(scale, floor_scale), c.dtype);
      EXPECT_EQ(nonfinite, 0) << c.name << ": NaN/Inf in " << names[t];
      EXPECT_LE(err, tol) << c.name << " " << names[t] << " (lowp " << lowp_err << ", max|ref| " << scale << ")";
    }
    // Rows that see no key: dq exactly 0; keys no row sees: dk, dv exactly 0.
    std::vector<char> seen(static_cast<size_t>(lk), 0);
    int64_t nonzero = 0;
    for (int64_t i = 0; i < lq; ++i) {
      const ref::KeyRange keys = ref::visible_key_range(h, lq, lk, i);
      for (int64_t j = keys.begin; j < keys.end; ++j) seen[static_cast<size_t>(j)] = 1;
      if (keys.empty())
        for (int64_t hh = 0; hh < Hq; ++hh)
          for (int64_t d = 0; d < D; ++d) nonzero += value(got.dq, q0 + i, Hq, hh, d) != 0.0;
    }
    for (int64_t j = 0; j < lk; ++j)
      if (!seen[static_cast<size_t>(j)])
        for (int64_t hh = 0; hh < Hkv; ++hh)
          for (int64_t d = 0; d < D; ++d)
            nonzero += (value(got.dk, k0 + j, Hkv, hh, d) != 0.0) + (value(got.dv, k0 + j, Hkv, hh, d) != 0.0);
    EXPECT_EQ(nonzero, 0) << c.name << ": dq of rows without keys, or dk / dv of keys no row sees, not 0";

    if (c.sinks) {  // the sinks' gradient: summed over the sequences
      const std::vector<double> e = ref::attention_backward_sinks(h, dout_seq);
      const ref::Output lo = ref::attention_lowp(h);
      auto dout_at = [&](int64_t, int64_t i, int64_t hh, int64_t d) { return value(pp.dout, q0 + i, Hq, hh, d); };
      const SinkSums l = sink_sums(
          pp.sinks, 1, lq, Hq, D,
          [&](int64_t, int64_t i, int64_t hh, int64_t d) { return lo.o[static_cast<size_t>((i * Hq + hh) * D + d)]; },
          [&](int64_t, int64_t hh, int64_t i) { return lo.lse[static_cast<size_t>(hh * lq + i)]; }, dout_at);
      const SinkSums own = sink_sums(
          pp.sinks, 1, lq, Hq, D, [&](int64_t, int64_t i, int64_t hh, int64_t d) { return value(o, q0 + i, Hq, hh, d); },
          [&](int64_t, int64_t hh, int64_t i) {
            return static_cast<double>(lse[static_cast<size_t>(hh * pp.total_q + q0 + i)]);
          },
          dout_at);
      for (int64_t hh = 0; hh < Hq; ++hh) {
        const size_t x = static_cast<size_t>(hh);
        dsinks_exact[x] += e[x];
        dsinks_lowp.sum[x] += l.sum[x], dsinks_lowp.abs[x] += l.abs[x];
        from_call.sum[x] += own.sum[x], from_call.abs[x] += own.abs[x];
      }
    }
  }
  if (c.sinks) {
    Case as_case;  // for the messages
    as_case.name = c.name, as_case.dtype = c.dtype, as_case.head_dim = D, as_case.heads_q = Hq, as_case.heads_kv = Hkv;
    as_case.batch = pp.B, as_case.seqlen_q = pp.max_q, as_case.seqlen_k = pp.max_k, as_case.causal = c.causal;
    as_case.local = c.local, as_case.left = c.left, as_case.right = c.right, as_case.softcap = c.softcap;
    as_case.chunk = c.chunk;
    as_case.sinks = as_case.dsinks = true;
    SCOPED_TRACE(label + ": dsinks");
    log = check_dsinks_values(as_case, pp.seed, got.dsinks, dsinks_exact, dsinks_lowp, from_call);
  }
  std::printf("  packed %s, %s [seed %llu]: %lld sequences checked%s%s\n", c.name.c_str(), label.c_str(),
              static_cast<unsigned long long>(pp.seed), static_cast<long long>(pp.B), log.empty() ? "" : ", ",
              log.c_str());
}

// Packed Q, K, V, O, dO, dQ, dK, dV (total, heads, head_dim), LSE (heads, total_q): the forward with the variant, then
// the backward with deterministic = 0 and twice with deterministic = 1 (bit-identical; dk, dv and dsinks identical in
// all three); each run's gradients per sequence against that sequence's reference (the dense tests' tolerance), dq of
// rows without keys and dk / dv of keys no row sees exactly 0, sequences without queries or keys all 0, dsinks summed
// over the sequences.
class BackwardVariantPacked : public testing::TestWithParam<PackedCase> {};

TEST_P(BackwardVariantPacked, EachSequenceMatchesItsReference) {
  FLASHCORE_REQUIRE_GPU();
  const PackedCase& c = GetParam();
  if (device_backend() != "sm90") {
    GTEST_SKIP() << "the " << device_backend() << " backend's backward takes dense batches only (packed: sm90)";
  }
  const PackedProblem pp = make_packed_problem(c);
  const int64_t D = pp.D, Hq = pp.Hq, Hkv = pp.Hkv;
  const size_t qb = pp.q.size() * 2, kb = pp.k.size() * 2, lse_bytes = static_cast<size_t>(pp.total_q * Hq) * 4;
  const size_t dsinks_bytes = static_cast<size_t>(Hq + kDsinksPad) * 4;
  DeviceBuffer q_(qb), k_(kb), v_(kb), o_(qb), dout_(qb), dq_(qb), dk_(kb), dv_(kb), lse_(lse_bytes),
      cuq_(pp.cu_q.size() * 4), cuk_(pp.cu_k.size() * 4), sinks_(static_cast<size_t>(Hq) * 4), dsinks_(dsinks_bytes);
  ASSERT_EQ(cudaMemcpy(q_.ptr, pp.q.data(), qb, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(k_.ptr, pp.k.data(), kb, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(v_.ptr, pp.v.data(), kb, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dout_.ptr, pp.dout.data(), qb, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(cuq_.ptr, pp.cu_q.data(), pp.cu_q.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(cuk_.ptr, pp.cu_k.data(), pp.cu_k.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  if (c.sinks) {
    ASSERT_EQ(cudaMemcpy(sinks_.ptr, pp.sinks.data(), pp.sinks.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  }

  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.batch = pp.B, p.seqlen_q = pp.max_q, p.seqlen_k = pp.max_k, p.num_heads_q = Hq, p.num_heads_kv = Hkv;
  p.head_dim = D, p.dtype = c.dtype, p.causal = c.causal ? 1 : 0;
  p.local = c.local ? 1 : 0, p.window_size_left = c.left, p.window_size_right = c.right, p.softcap = c.softcap;
  p.attention_chunk = c.chunk;
  p.sinks = c.sinks ? static_cast<const float*>(sinks_.ptr) : nullptr;
  p.cu_seqlens_q = static_cast<const int32_t*>(cuq_.ptr);
  p.cu_seqlens_k = static_cast<const int32_t*>(cuk_.ptr);
  p.total_q = pp.total_q, p.total_k = pp.total_k;
  const flashcore_tensor_strides qs{0, Hq * D, D, 1}, ks{0, Hkv * D, D, 1};
  p.q = q_.ptr, p.k = k_.ptr, p.v = v_.ptr, p.o = o_.ptr;
  p.lse = static_cast<float*>(lse_.ptr);
  p.q_strides = p.o_strides = p.dout_strides = p.dq_strides = qs;
  p.k_strides = p.v_strides = p.dk_strides = p.dv_strides = ks;
  const flashcore_status vs = flashcore_attention_validate(&p);
  if (vs == FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM || vs == FLASHCORE_ERROR_UNSUPPORTED_DTYPE) {
    GTEST_SKIP() << c.name << ": forward: " << flashcore_last_error();
  }
  ASSERT_EQ(vs, FLASHCORE_SUCCESS) << flashcore_last_error();
  ASSERT_EQ(cudaMemset(o_.ptr, 0xff, qb), cudaSuccess);
  ASSERT_EQ(cudaMemset(lse_.ptr, 0xff, lse_bytes), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(flashcore_attention_forward(&p, nullptr), FLASHCORE_SUCCESS) << c.name << ": " << flashcore_last_error();
  wait_or_die(nullptr, "the packed forward of " + c.name);
  if (HasFatalFailure()) return;
  std::vector<uint16_t> o_host(pp.q.size());
  std::vector<float> lse_host(static_cast<size_t>(pp.total_q * Hq));
  ASSERT_EQ(cudaMemcpy(o_host.data(), o_.ptr, qb, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(lse_host.data(), lse_.ptr, lse_bytes, cudaMemcpyDeviceToHost), cudaSuccess);

  p.dout = dout_.ptr, p.dq = dq_.ptr, p.dk = dk_.ptr, p.dv = dv_.ptr;
  p.dsinks = c.sinks ? static_cast<float*>(dsinks_.ptr) : nullptr;
  uint64_t ws_bytes = 0;
  const flashcore_status size_status = flashcore_attention_backward_workspace_size(&p, &ws_bytes);
  if (size_status == FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM || size_status == FLASHCORE_ERROR_UNSUPPORTED_DTYPE ||
      size_status == FLASHCORE_ERROR_UNSUPPORTED_ARCH) {
    GTEST_SKIP() << c.name << ": backward: " << flashcore_last_error();
  }
  ASSERT_EQ(size_status, FLASHCORE_SUCCESS) << c.name << ": " << flashcore_last_error();
  DeviceBuffer ws(std::max<uint64_t>(ws_bytes, 1));
  p.workspace = ws.ptr, p.workspace_size = ws_bytes;

  PackedRun runs[3];  // deterministic = 0, then deterministic = 1 twice
  for (int run = 0; run < 3; ++run) {
    p.deterministic = run == 0 ? 0 : 1;
    ASSERT_EQ(cudaMemset(dq_.ptr, 0xff, qb), cudaSuccess);
    ASSERT_EQ(cudaMemset(dk_.ptr, 0xff, kb), cudaSuccess);
    ASSERT_EQ(cudaMemset(dv_.ptr, 0xff, kb), cudaSuccess);
    ASSERT_EQ(cudaMemset(dsinks_.ptr, 0xff, dsinks_bytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(ws.ptr, 0xff, ws_bytes), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(flashcore_attention_backward(&p, nullptr), FLASHCORE_SUCCESS) << c.name << ": " << flashcore_last_error();
    wait_or_die(nullptr, "the packed backward of " + c.name + (p.deterministic ? " (deterministic)" : ""));
    if (HasFatalFailure()) return;
    PackedRun& r = runs[run];
    r.dq.resize(pp.q.size()), r.dk.resize(pp.k.size()), r.dv.resize(pp.k.size());
    ASSERT_EQ(cudaMemcpy(r.dq.data(), dq_.ptr, qb, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(r.dk.data(), dk_.ptr, kb, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(r.dv.data(), dv_.ptr, kb, cudaMemcpyDeviceToHost), cudaSuccess);
    if (c.sinks) {
      r.dsinks.resize(static_cast<size_t>(Hq + kDsinksPad));
      ASSERT_EQ(cudaMemcpy(r.dsinks.data(), dsinks_.ptr, dsinks_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    }
  }
  EXPECT_TRUE(runs[2].dq == runs[1].dq) << c.name << ": deterministic reruns differ in dq";
  EXPECT_TRUE(runs[2].dk == runs[1].dk && runs[1].dk == runs[0].dk) << c.name << ": dk differs between runs";
  EXPECT_TRUE(runs[2].dv == runs[1].dv && runs[1].dv == runs[0].dv) << c.name << ": dv differs between runs";
  EXPECT_TRUE(same_bits(runs[2].dsinks, runs[1].dsinks) && same_bits(runs[1].dsinks, runs[0].dsinks))
      << c.name << ": dsinks differs between runs";
  check_packed_run(pp, runs[0], "deterministic = 0", o_host, lse_host);
  check_packed_run(pp, runs[1], "deterministic = 1", o_host, lse_host);
}

INSTANTIATE_TEST_SUITE_P(Packed, BackwardVariantPacked, testing::ValuesIn(packed_cases()),
                         [](const testing::TestParamInfo<PackedCase>& info) { return info.param.name; });

// ------------------------------------------------------------------------------------------------
// The 0.5 struct layout, dsinks on its own, and a host-memory dsinks
// ------------------------------------------------------------------------------------------------

// A small windowed problem with sinks for a compiled (dtype, head dim) the backward takes, deterministic = 1 and dsinks
// set; "" or why not (then the test skips).
std::string small_sinks_problem(Problem& pr) {
  flashcore_capabilities caps;
  flashcore_capabilities_init(&caps);
  if (flashcore_get_capabilities(&caps) != FLASHCORE_SUCCESS) return flashcore_last_error();
  for (int i = 0; i < caps.num_dtypes; ++i) {
    const flashcore_dtype dt = caps.dtypes[i];
    if (dt != FLASHCORE_DTYPE_BF16 && dt != FLASHCORE_DTYPE_FP16) continue;
    for (int j = 0; j < caps.num_head_dims; ++j) {
      if (caps.head_dims[j] != 64 && caps.head_dims[j] != 128) continue;
      Case c = make_case(dt, caps.head_dims[j], true, {2, 200, 300, 4, 2}, "small_sinks_win40");
      with_window(c, 40, 0);
      with_sinks(c, true).deterministic = 1;
      if (!set_up(pr, c)) return pr.skip.empty() ? "set-up failed" : pr.skip;
      return "";
    }
  }
  return "no fp16 / bf16 kernel of head_dim 64 or 128 in this build";
}

// A 0.5 caller (struct_size FLASHCORE_ATTENTION_PARAMS_V5_SIZE) gets the backward of its window and sinks, and never
// dsinks, whatever its memory holds past 680 bytes (here a valid device pointer): dq, dk and dv are those of the
// current struct's call, bit for bit (deterministic = 1), and the buffer there keeps its poison. Asking for dsinks, or
// not, does not change dq, dk and dv either.
TEST(BackwardVariantAbi, V5SizedStructNeverWritesDsinks) {
  FLASHCORE_REQUIRE_GPU();
  Problem pr;
  if (const std::string why = small_sinks_problem(pr); !why.empty()) {
    if (HasFatalFailure()) return;
    GTEST_SKIP() << why;
  }
  Grads with_dsinks, without_dsinks, v5_call;
  run_backward(pr, with_dsinks);
  if (HasFatalFailure()) return;
  check_all(pr, with_dsinks, references(pr));

  flashcore_attention_params no_dsinks = pr.p;
  no_dsinks.dsinks = nullptr;
  run_backward(pr, without_dsinks, &no_dsinks);
  if (HasFatalFailure()) return;
  EXPECT_TRUE(without_dsinks.dq == with_dsinks.dq && without_dsinks.dk == with_dsinks.dk &&
              without_dsinks.dv == with_dsinks.dv)
      << "asking for dsinks changed dq, dk or dv";
  for (int64_t h = 0; h < pr.c.heads_q + kDsinksPad; ++h) {
    uint32_t bits;
    std::memcpy(&bits, &without_dsinks.dsinks[static_cast<size_t>(h)], sizeof bits);
    EXPECT_EQ(bits, kFloatPoison) << "dsinks[" << h << "] written by a call with dsinks = NULL";
  }

  std::vector<unsigned char> buf(sizeof(flashcore_attention_params));
  std::memcpy(buf.data(), &pr.p, sizeof(pr.p));  // bytes 680.. hold pr.p.dsinks, a device buffer
  auto* v5 = reinterpret_cast<flashcore_attention_params*>(buf.data());
  v5->struct_size = FLASHCORE_ATTENTION_PARAMS_V5_SIZE;
  run_backward(pr, v5_call, v5);
  if (HasFatalFailure()) return;
  EXPECT_TRUE(v5_call.dq == with_dsinks.dq && v5_call.dk == with_dsinks.dk && v5_call.dv == with_dsinks.dv)
      << "a 0.5-sized struct's backward differs from the current struct's";
  for (int64_t h = 0; h < pr.c.heads_q + kDsinksPad; ++h) {
    uint32_t bits;
    std::memcpy(&bits, &v5_call.dsinks[static_cast<size_t>(h)], sizeof bits);
    EXPECT_EQ(bits, kFloatPoison) << "dsinks[" << h << "] written through a 0.5-sized struct (its bytes past 680)";
  }
}

// dsinks in host memory: refused before any device work, naming dsinks; nothing written.
TEST(BackwardVariantBadArgs, HostMemoryDsinks) {
  FLASHCORE_REQUIRE_GPU();
  Problem pr;
  if (const std::string why = small_sinks_problem(pr); !why.empty()) {
    if (HasFatalFailure()) return;
    GTEST_SKIP() << why;
  }
  std::vector<float> host(static_cast<size_t>(pr.c.heads_q), -7.0f);
  flashcore_attention_params p = pr.p;
  p.dsinks = host.data();
  poison_grads(pr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const flashcore_status st = flashcore_attention_backward(&p, nullptr);
  const std::string message = flashcore_last_error();
  EXPECT_EQ(st, FLASHCORE_ERROR_INVALID_ARGUMENT) << flashcore_status_string(st) << ": " << message;
  EXPECT_NE(message.find("dsinks"), std::string::npos) << message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (float x : host) EXPECT_EQ(x, -7.0f) << "dsinks (host memory) written";
  expect_grads_poisoned(pr);
}

}  // namespace
