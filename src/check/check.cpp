// The correctness sweep: the case list and the runner shared by the GPU tests and `flashcore check`.
//
// Tolerance rule (per case, over the checked rows of every batch and head):
//   o_err   = max |O_gpu - O_ref|                     O_ref: float64 reference::attention()
//   lowp    = max |O_lowp - O_ref|                    O_lowp: reference::attention_lowp(), i.e. the same
//                                                     problem computed the way a kernel would (fp32
//                                                     scores/softmax, P rounded to dtype, O rounded)
//   pass iff o_err <= 2 * lowp + atol,  atol = 1e-3 (fp16) / 4e-3 (bf16)
//   lse_err = max |LSE_gpu - LSE_ref| / max(1, |LSE_ref|) over finite reference entries, likewise
//   pass iff lse_err <= 2 * lowp_lse_err + 1e-3.
// The factor 2 allows a kernel's different (but equally valid) rounding order; atol is about one
// output ulp near |O| ~ 1-2 (fp16 ulp(1) = 9.8e-4, bf16 ulp(1) = 7.8e-3 / 2), so that cases whose
// yardstick error happens to be tiny are not held to an impossible bound.
// Beyond the tolerances: no output element may keep its NaN poison, O must be finite everywhere and 0
// on fully masked rows, LSE must be finite except exactly -inf on fully masked rows.
#include "check/check.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <sstream>

#include "api/dtype.h"
#include "reference/reference.h"

namespace flashcore::check {

namespace ref = flashcore::reference;

// ------------------------------------------------------------------------------------------------
// Names, descriptions, shapes
// ------------------------------------------------------------------------------------------------
namespace {

using flashcore::dtype_name;

std::string format_float(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// A readable identifier made of [A-Za-z0-9_] only.
std::string case_name(const Case& c) {
  std::string n = std::string(dtype_name(c.dtype)) + "_d" + std::to_string(c.head_dim) + "_b" +
                  std::to_string(c.batch) + "_h" + std::to_string(c.heads_q) + "x" + std::to_string(c.heads_kv) +
                  "_q" + std::to_string(c.seqlen_q) + "_k" + std::to_string(c.seqlen_k) +
                  (c.causal ? "_causal" : "_full") + (c.layout == Layout::BHSD ? "_bhsd" : "_bshd");
  if (c.input_scale != 1.0f) n += "_x" + format_float(c.input_scale);
  if (c.softmax_scale != 0.0f) n += "_scale" + format_float(c.softmax_scale);
  if (!c.with_lse) n += "_nolse";
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_') ch = 'p';
  return n;
}

}  // namespace

std::string describe(const Case& c) {
  std::ostringstream s;
  s << dtype_name(c.dtype) << " B=" << c.batch << " Hq=" << c.heads_q << " Hkv=" << c.heads_kv
    << " Sq=" << c.seqlen_q << " Sk=" << c.seqlen_k << " D=" << c.head_dim << (c.causal ? " causal" : "")
    << (c.layout == Layout::BHSD ? " bhsd" : " bshd");
  if (c.input_scale != 1.0f) s << " inputs*" << format_float(c.input_scale);
  if (c.softmax_scale != 0.0f) s << " softmax_scale=" << format_float(c.softmax_scale);
  if (!c.with_lse) s << " no-lse";
  if (!c.seqused_k.empty()) {
    s << " seqused_k=";
    for (size_t b = 0; b < c.seqused_k.size(); ++b) s << (b ? "," : "") << c.seqused_k[b];
    s << " (NaN past them)";
  }
  return s.str();
}

bool parse_shape(const std::string& text, Case& out, std::string& err) {
  std::vector<int64_t> v;
  size_t pos = 0;
  while (true) {
    const size_t comma = text.find(',', pos);
    const std::string field = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t used = 0;
    long long x = 0;
    try {
      x = std::stoll(field, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (field.empty() || used != field.size() || x <= 0 || x > (int64_t{1} << 31)) {
      err = "bad shape '" + text + "': field '" + field + "' is not a positive integer (expected B,H,S,D[,Hkv[,Sk]])";
      return false;
    }
    v.push_back(x);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (v.size() < 4 || v.size() > 6) {
    err = "bad shape '" + text + "': expected 4 to 6 comma-separated fields B,H,S,D[,Hkv[,Sk]]";
    return false;
  }
  Case c = out;
  c.batch = v[0], c.heads_q = v[1], c.seqlen_q = v[2], c.head_dim = v[3];
  c.heads_kv = v.size() > 4 ? v[4] : v[1];
  c.seqlen_k = v.size() > 5 ? v[5] : v[2];
  if (c.heads_q % c.heads_kv != 0) {
    err = "bad shape '" + text + "': H=" + std::to_string(c.heads_q) + " is not a multiple of Hkv=" +
          std::to_string(c.heads_kv);
    return false;
  }
  c.name = case_name(c);
  out = c;
  return true;
}

// ------------------------------------------------------------------------------------------------
// The case list
// ------------------------------------------------------------------------------------------------
namespace {

struct CaseList {
  std::vector<Case> list;
  std::set<std::string> names;
  Case& add(flashcore_dtype dt, int64_t D, bool causal, int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Sk,
            Layout layout = Layout::BSHD) {
    Case c;
    c.dtype = dt, c.head_dim = D, c.causal = causal, c.batch = B, c.heads_q = Hq, c.heads_kv = Hkv;
    c.seqlen_q = Sq, c.seqlen_k = Sk, c.layout = layout;
    list.push_back(c);
    return list.back();
  }
  std::vector<Case> finish() {
    for (auto& c : list) {
      std::string n = case_name(c), base = n;
      for (int k = 2; !names.insert(n).second; ++k) n = base + "_" + std::to_string(k);
      c.name = n;
    }
    return list;
  }
};

const flashcore_dtype kDtypes[] = {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16};
const int64_t kHeadDims[] = {64, 128, 256};

}  // namespace

std::vector<Case> cases(bool quick) {
  CaseList L;
  if (quick) {
    // 24 small cases: every dtype x head dim x causal, twice: square odd seqlen, and Sq != Sk with
    // GQA in the BHSD layout (causal with Sq > Sk has fully masked rows for fp16, Sq < Sk for bf16).
    const int64_t square[] = {17, 113, 65};
    for (auto dt : kDtypes)
      for (int di = 0; di < 3; ++di)
        for (bool causal : {false, true}) {
          const int64_t D = kHeadDims[di];
          L.add(dt, D, causal, 2, 2, 2, square[di], square[di]);
          const bool long_q = dt == FLASHCORE_DTYPE_FP16;
          L.add(dt, D, causal, 1, 4, 2, long_q ? 95 : 33, long_q ? 33 : 95, Layout::BHSD);
        }
    return L.finish();
  }

  // 1. Grid: head dim x dtype x causal x seqlen (square), alternating layouts over the seqlens.
  const int64_t seqlens[] = {1, 2, 17, 63, 64, 65, 113, 127, 128, 129, 255, 1000, 2048, 4097};
  for (auto dt : kDtypes)
    for (int64_t D : kHeadDims)
      for (bool causal : {false, true})
        for (size_t i = 0; i < std::size(seqlens); ++i) {
          const int64_t S = seqlens[i];
          const int64_t B = S <= 129 ? 2 : 1, H = S <= 255 ? 3 : 2;
          L.add(dt, D, causal, B, H, H, S, S, i % 2 ? Layout::BHSD : Layout::BSHD);
        }

  // 2. seqlen_q != seqlen_k both ways, causal and not (Sq > Sk causal: leading rows see no key).
  const int64_t pairs[][2] = {{1, 128},  {1, 4097},  {17, 1000},  {113, 4097}, {64, 65},   {65, 64},   {63, 129},
                              {129, 63}, {128, 1},   {1000, 17},  {4097, 113}, {2048, 127}, {255, 2048}};
  int n = 0;
  for (auto& pr : pairs)
    for (bool causal : {false, true}) {
      const int64_t B = pr[0] * pr[1] <= 65536 ? 2 : 1;
      L.add(kDtypes[n % 2], kHeadDims[(n / 2) % 3], causal, B, 2, 2, pr[0], pr[1], n % 3 == 2 ? Layout::BHSD : Layout::BSHD);
      ++n;
    }

  // 3. GQA ratios 2 and 8, MQA (Hkv = 1): every head dim, causal and not, both layouts.
  const int64_t heads[][2] = {{8, 4}, {16, 2}, {8, 1}};
  n = 0;
  for (auto& h : heads)
    for (int64_t D : kHeadDims)
      for (bool causal : {false, true}) {
        const bool cross = n % 2 == 1;
        L.add(kDtypes[n % 2], D, causal, 1, h[0], h[1], cross ? 65 : 129, cross ? 300 : 129,
              n % 4 < 2 ? Layout::BHSD : Layout::BSHD);
        ++n;
      }
  L.add(FLASHCORE_DTYPE_BF16, 128, true, 1, 32, 4, 2048, 2048);                   // Llama-like
  L.add(FLASHCORE_DTYPE_FP16, 128, false, 2, 6, 1, 1000, 1000, Layout::BHSD);     // MQA, longer

  // 4. Batch 7.
  n = 0;
  for (int64_t D : kHeadDims)
    for (bool causal : {false, true}) {
      L.add(kDtypes[n % 2], D, causal, 7, 4, 2, causal ? 200 : 65, causal ? 200 : 513,
            n % 2 ? Layout::BHSD : Layout::BSHD);
      ++n;
    }

  // 5. Large-magnitude inputs (scores in the hundreds: the softmax is nearly one-hot).
  n = 0;
  for (auto dt : kDtypes)
    for (bool causal : {false, true}) {
      L.add(dt, kHeadDims[n % 3], causal, 1, 2, 2, 300, 300).input_scale = 30.0f;
      ++n;
    }
  L.add(FLASHCORE_DTYPE_BF16, 256, true, 1, 2, 1, 1000, 1000, Layout::BHSD).input_scale = 30.0f;

  // 6. Non-default softmax scales.
  L.add(FLASHCORE_DTYPE_FP16, 64, false, 2, 2, 2, 129, 129).softmax_scale = 0.5f;
  L.add(FLASHCORE_DTYPE_BF16, 128, true, 1, 4, 2, 200, 255, Layout::BHSD).softmax_scale = 0.03f;
  L.add(FLASHCORE_DTYPE_FP16, 256, true, 1, 2, 2, 1000, 1000).softmax_scale = 0.3f;

  // 7. Without LSE output.
  L.add(FLASHCORE_DTYPE_FP16, 128, true, 2, 2, 2, 129, 129).with_lse = false;
  L.add(FLASHCORE_DTYPE_BF16, 64, false, 1, 4, 1, 1000, 2048, Layout::BHSD).with_lse = false;

  return L.finish();
}

// ------------------------------------------------------------------------------------------------
// The runner
// ------------------------------------------------------------------------------------------------
namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Counter-based N(0,1) (Box-Muller), so that tensors are filled in parallel yet reproducibly.
void fill_normal(std::vector<uint16_t>& dst, flashcore_dtype dt, uint64_t seed, uint64_t tensor, float scale) {
  const int64_t n = static_cast<int64_t>(dst.size()), chunk = 1 << 16;
  const uint64_t key = splitmix(seed ^ splitmix(tensor + 1));
  ref::parallel_for((n + chunk - 1) / chunk, 0, [&](int64_t c) {
    for (int64_t i = c * chunk; i < std::min(n, (c + 1) * chunk); ++i) {
      const uint64_t h1 = splitmix(key + static_cast<uint64_t>(i)), h2 = splitmix(h1);
      const double u1 = (static_cast<double>(h1 >> 11) + 1.0) * 0x1.0p-53, u2 = static_cast<double>(h2 >> 11) * 0x1.0p-53;
      const float x = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2)) * scale;
      dst[static_cast<size_t>(i)] = dt == FLASHCORE_DTYPE_FP16 ? ref::float_to_half(x) : ref::float_to_bf16(x);
    }
  });
}

flashcore_tensor_strides layout_strides(Layout layout, int64_t S, int64_t H, int64_t D) {
  if (layout == Layout::BHSD) return {H * S * D, D, S * D, 1};
  return {S * H * D, H * D, D, 1};
}

}  // namespace

std::vector<int64_t> checked_rows(const Case& c, uint64_t seed) {
  const int64_t Sq = c.seqlen_q, Sk = c.seqlen_k;
  std::vector<int64_t> all;
  if (Sq * Sk <= 256 * 256 || Sq <= 64) return all;  // empty = every row
  std::set<int64_t> rows;
  auto add = [&](int64_t r) {
    if (r >= 0 && r < Sq) rows.insert(r);
  };
  for (int64_t r : {int64_t{0}, int64_t{1}, Sq - 2, Sq - 1}) add(r);
  for (int64_t edge : {64, 128, 192, 256}) add(edge - 1), add(edge);
  const int64_t last_tile = Sq - Sq % 64;
  add(last_tile - 1), add(last_tile);
  if (c.causal && Sq > Sk) add(Sq - Sk - 1), add(Sq - Sk), add(Sq - Sk + 1);  // first row seeing a key
  std::mt19937_64 rng(splitmix(seed ^ 0x5eed));
  std::uniform_int_distribution<int64_t> pick(0, Sq - 1);
  while (static_cast<int64_t>(rows.size()) < std::min<int64_t>(64, Sq)) rows.insert(pick(rng));
  return {rows.begin(), rows.end()};
}

namespace {

struct DeviceBuffer {
  void* ptr = nullptr;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
};

struct OwnedStream {
  cudaStream_t stream = nullptr;
  OwnedStream() = default;
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  ~OwnedStream() {
    if (stream) cudaStreamDestroy(stream);
  }
};

bool cuda_ok(cudaError_t e, const char* what, Result& r) {
  if (e == cudaSuccess) return true;
  r.passed = false;
  r.message += std::string(r.message.empty() ? "" : "; ") + what + " failed: " + cudaGetErrorName(e) + " (" +
               cudaGetErrorString(e) + ")";
  return false;
}

void append(std::string& msg, const std::string& part) { msg += (msg.empty() ? "" : "; ") + part; }

std::string skip_reason_for_device() {
  // The library's own device checks (driver, device, backend table), as any caller would see them.
  int32_t count = 0;
  if (flashcore_list_kernel_configs(FLASHCORE_DTYPE_BF16, 128, 0, nullptr, 0, &count) != FLASHCORE_SUCCESS)
    return flashcore_last_error();
  return "";
}

}  // namespace

std::string device_skip_reason() { return skip_reason_for_device(); }

Result run_case(const Case& c, uint64_t seed, int repeats) {
  Result r;
  if (std::string why = skip_reason_for_device(); !why.empty()) {
    r.skipped = true, r.message = why;
    return r;
  }
  OwnedStream s;
  if (!cuda_ok(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", r)) return r;
  return run_case_on_stream(c, seed, repeats, reinterpret_cast<flashcore_stream_t>(s.stream));
}

Result run_case_on_stream(const Case& c, uint64_t seed, int repeats, flashcore_stream_t fstream) {
  Result r;
  r.seed = seed;
  if (std::string why = skip_reason_for_device(); !why.empty()) {
    r.skipped = true, r.message = why;
    return r;
  }
  const cudaStream_t stream = reinterpret_cast<cudaStream_t>(fstream);
  const int64_t B = c.batch, Sq = c.seqlen_q, Sk = c.seqlen_k, Hq = c.heads_q, Hkv = c.heads_kv, D = c.head_dim;
  if (B <= 0 || Sq <= 0 || Sk <= 0 || Hq <= 0 || Hkv <= 0 || D <= 0 || Hq % Hkv != 0) {
    r.message = "invalid case: " + describe(c);
    return r;
  }
  const size_t esize = static_cast<size_t>(flashcore::dtype_size(c.dtype));
  const int64_t nq = B * Sq * Hq * D, nkv = B * Sk * Hkv * D, nlse = B * Hq * Sq;

  DeviceBuffer dq, dk, dv, dout, dlse;
  if (!cuda_ok(cudaMalloc(&dq.ptr, static_cast<size_t>(nq) * esize), "cudaMalloc(q)", r) ||
      !cuda_ok(cudaMalloc(&dk.ptr, static_cast<size_t>(nkv) * esize), "cudaMalloc(k)", r) ||
      !cuda_ok(cudaMalloc(&dv.ptr, static_cast<size_t>(nkv) * esize), "cudaMalloc(v)", r) ||
      !cuda_ok(cudaMalloc(&dout.ptr, static_cast<size_t>(nq) * esize), "cudaMalloc(o)", r) ||
      (c.with_lse && !cuda_ok(cudaMalloc(&dlse.ptr, static_cast<size_t>(nlse) * sizeof(float)), "cudaMalloc(lse)", r)))
    return r;

  DeviceBuffer dused;
  if (!c.seqused_k.empty()) {
    if (static_cast<int64_t>(c.seqused_k.size()) != B) {
      r.message = "invalid case: seqused_k has " + std::to_string(c.seqused_k.size()) + " entries for batch " +
                  std::to_string(B);
      return r;
    }
    const size_t bytes = c.seqused_k.size() * sizeof(int32_t);
    if (!cuda_ok(cudaMalloc(&dused.ptr, bytes), "cudaMalloc(seqused_k)", r) ||
        !cuda_ok(cudaMemcpy(dused.ptr, c.seqused_k.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy(seqused_k)", r))
      return r;
  }

  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.q = dq.ptr, p.k = dk.ptr, p.v = dv.ptr, p.o = dout.ptr, p.lse = static_cast<float*>(dlse.ptr);
  p.seqused_k = static_cast<const int32_t*>(dused.ptr);
  p.q_strides = p.o_strides = layout_strides(c.layout, Sq, Hq, D);
  p.k_strides = p.v_strides = layout_strides(c.layout, Sk, Hkv, D);
  p.batch = B, p.seqlen_q = Sq, p.seqlen_k = Sk, p.num_heads_q = Hq, p.num_heads_kv = Hkv, p.head_dim = D;
  p.dtype = c.dtype, p.causal = c.causal ? 1 : 0, p.softmax_scale = c.softmax_scale;
  p.kernel_config = c.kernel_config;

  const flashcore_status vs = flashcore_attention_validate(&p);
  if (vs == FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM || vs == FLASHCORE_ERROR_UNSUPPORTED_DTYPE) {
    r.skipped = true;
    r.message = std::string(flashcore_status_string(vs)) + ": " + flashcore_last_error();
    return r;
  }
  if (vs != FLASHCORE_SUCCESS) {
    r.message = std::string("flashcore_attention_validate: ") + flashcore_status_string(vs) + ": " + flashcore_last_error();
    return r;
  }
  if (c.dtype != FLASHCORE_DTYPE_FP16 && c.dtype != FLASHCORE_DTYPE_BF16) {
    r.message = std::string("check: the harness has no input generator for dtype ") + dtype_name(c.dtype);
    return r;
  }

  // The config's workspace (the dynamic scheduler's tile counter), zero-filled as the ABI requires.
  DeviceBuffer dws;
  uint64_t ws_bytes = 0;
  const flashcore_status ws = flashcore_attention_workspace_size(&p, &ws_bytes);
  if (ws != FLASHCORE_SUCCESS) {
    r.message = std::string("flashcore_attention_workspace_size: ") + flashcore_status_string(ws) + ": " +
                flashcore_last_error();
    return r;
  }
  if (ws_bytes > 0) {
    if (!cuda_ok(cudaMalloc(&dws.ptr, ws_bytes), "cudaMalloc(workspace)", r) ||
        !cuda_ok(cudaMemset(dws.ptr, 0, ws_bytes), "cudaMemset(workspace)", r))
      return r;
    p.workspace = dws.ptr;
    p.workspace_size = ws_bytes;
  }

  // Inputs: fresh N(0,1) * input_scale, stored in the case's layout (dense in storage order).
  std::vector<uint16_t> hq(static_cast<size_t>(nq)), hk(static_cast<size_t>(nkv)), hv(static_cast<size_t>(nkv));
  fill_normal(hq, c.dtype, seed, 0, c.input_scale);
  fill_normal(hk, c.dtype, seed, 1, c.input_scale);
  fill_normal(hv, c.dtype, seed, 2, c.input_scale);
  // Past each sequence's length (a KV cache's unused slots): NaN, which a correct kernel never lets into O or LSE.
  auto keys_of = [&](int64_t b) -> int64_t {
    return c.seqused_k.empty() ? Sk : std::clamp<int64_t>(c.seqused_k[static_cast<size_t>(b)], 0, Sk);
  };
  if (!c.seqused_k.empty()) {
    const uint16_t nan_bits = c.dtype == FLASHCORE_DTYPE_FP16 ? 0x7e00 : 0x7fc0;
    const flashcore_tensor_strides ks = p.k_strides;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = keys_of(b); j < Sk; ++j)
        for (int64_t h = 0; h < Hkv; ++h)
          for (int64_t d = 0; d < D; ++d) {
            const size_t at = static_cast<size_t>(b * ks.batch + j * ks.seq + h * ks.head + d);
            hk[at] = nan_bits, hv[at] = nan_bits;
          }
  }
  if (!cuda_ok(cudaMemcpy(dq.ptr, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy(q)", r) ||
      !cuda_ok(cudaMemcpy(dk.ptr, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy(k)", r) ||
      !cuda_ok(cudaMemcpy(dv.ptr, hv.data(), hv.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy(v)", r))
    return r;

  // Run (repeats times, poisoning O and LSE with all-ones NaN patterns before every call).
  std::vector<uint16_t> ho(static_cast<size_t>(nq)), first_o;
  std::vector<float> hlse(c.with_lse ? static_cast<size_t>(nlse) : 0), first_lse;
  repeats = std::max(1, repeats);
  for (int rep = 0; rep < repeats; ++rep) {
    if (!cuda_ok(cudaMemsetAsync(dout.ptr, 0xff, ho.size() * 2, stream), "cudaMemsetAsync(o)", r) ||
        (c.with_lse && !cuda_ok(cudaMemsetAsync(dlse.ptr, 0xff, hlse.size() * 4, stream), "cudaMemsetAsync(lse)", r)))
      return r;
    const flashcore_status fs = flashcore_attention_forward(&p, fstream);
    if (fs != FLASHCORE_SUCCESS) {
      r.message = std::string("flashcore_attention_forward: ") + flashcore_status_string(fs) + ": " + flashcore_last_error();
      return r;
    }
    if (!cuda_ok(cudaGetLastError(), "kernel launch", r) ||
        !cuda_ok(cudaMemcpyAsync(ho.data(), dout.ptr, ho.size() * 2, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync(o)", r) ||
        (c.with_lse &&
         !cuda_ok(cudaMemcpyAsync(hlse.data(), dlse.ptr, hlse.size() * 4, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync(lse)", r)) ||
        !cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize (kernel execution)", r))
      return r;
    if (rep == 0) {
      first_o = ho, first_lse = hlse;
    } else if (std::memcmp(first_o.data(), ho.data(), ho.size() * 2) != 0 ||
               std::memcmp(first_lse.data(), hlse.data(), hlse.size() * 4) != 0) {
      if (r.deterministic) append(r.message, "run " + std::to_string(rep) + " of " + std::to_string(repeats) +
                                                 " is not bit-identical to run 0");
      r.deterministic = false;
    }
  }

  // Whole-buffer checks that need no reference.
  const auto& os = p.o_strides;
  auto o_at = [&](int64_t b, int64_t i, int64_t h, int64_t d) -> uint16_t {
    return first_o[static_cast<size_t>(b * os.batch + i * os.seq + h * os.head + d)];
  };
  auto to_float = [&](uint16_t x) { return c.dtype == FLASHCORE_DTYPE_FP16 ? ref::half_to_float(x) : ref::bf16_to_float(x); };
  auto fully_masked = [&](int64_t b, int64_t i) { return keys_of(b) == 0 || (c.causal && i + keys_of(b) - Sq < 0); };
  int64_t n_unwritten = 0, n_nonfinite = 0, n_masked_bad = 0;
  std::string first_bad;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Sq; ++i)
      for (int64_t h = 0; h < Hq; ++h) {
        for (int64_t d = 0; d < D; ++d) {
          const uint16_t bits = o_at(b, i, h, d);
          const float x = to_float(bits);
          const char* what = bits == 0xffff ? "unwritten" : !std::isfinite(x) ? "non-finite" : fully_masked(b, i) && x != 0 ? "nonzero on a fully masked row" : nullptr;
          if (!what) continue;
          (bits == 0xffff ? n_unwritten : !std::isfinite(x) ? n_nonfinite : n_masked_bad)++;
          if (first_bad.empty())
            first_bad = std::string("O ") + what + " at b=" + std::to_string(b) + " row=" + std::to_string(i) +
                        " h=" + std::to_string(h) + " d=" + std::to_string(d);
        }
        if (!c.with_lse) continue;
        const float l = first_lse[static_cast<size_t>((b * Hq + h) * Sq + i)];
        uint32_t lbits;
        std::memcpy(&lbits, &l, 4);
        const bool want_minus_inf = fully_masked(b, i);
        const char* what = lbits == 0xffffffffu                    ? "unwritten"
                           : want_minus_inf && l != -INFINITY      ? "not -inf on a fully masked row"
                           : !want_minus_inf && !std::isfinite(l) ? "non-finite"
                                                                   : nullptr;
        if (!what) continue;
        (lbits == 0xffffffffu ? n_unwritten : want_minus_inf ? n_masked_bad : n_nonfinite)++;
        if (first_bad.empty())
          first_bad = std::string("LSE ") + what + " at b=" + std::to_string(b) + " h=" + std::to_string(h) +
                      " row=" + std::to_string(i) + " (value " + format_float(l) + ")";
      }
  r.unwritten = n_unwritten > 0, r.nonfinite = n_nonfinite > 0;
  if (n_unwritten) append(r.message, std::to_string(n_unwritten) + " output elements kept the NaN poison (unwritten)");
  if (n_nonfinite) append(r.message, std::to_string(n_nonfinite) + " output elements are NaN/Inf where the reference is finite");
  if (n_masked_bad) append(r.message, std::to_string(n_masked_bad) + " outputs of fully masked rows are not O=0 / LSE=-inf");
  if (!first_bad.empty()) append(r.message, "first: " + first_bad);

  // Reference comparison on the selected rows.
  flashcore_attention_params host = p;
  host.q = hq.data(), host.k = hk.data(), host.v = hv.data(), host.o = nullptr, host.lse = nullptr;
  host.seqused_k = c.seqused_k.empty() ? nullptr : c.seqused_k.data();
  std::vector<int64_t> rows = checked_rows(c, seed);
  const ref::Output exact = ref::attention(host, rows), lowp = ref::attention_lowp(host, rows);
  if (rows.empty()) {
    rows.resize(static_cast<size_t>(Sq));
    for (int64_t i = 0; i < Sq; ++i) rows[static_cast<size_t>(i)] = i;
  }
  r.rows_checked = static_cast<int64_t>(rows.size());
  double lowp_lse_err = 0;
  std::string worst;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i : rows) {
        for (int64_t d = 0; d < D; ++d) {
          const double want = exact.o[static_cast<size_t>(((b * Sq + i) * Hq + h) * D + d)];
          const double got = to_float(o_at(b, i, h, d));
          r.lowp_o_err = std::max(r.lowp_o_err, std::fabs(lowp.o[static_cast<size_t>(((b * Sq + i) * Hq + h) * D + d)] - want));
          const double e = std::fabs(got - want);
          if (std::isfinite(got) && e > r.o_err) {
            r.o_err = e;
            worst = "b=" + std::to_string(b) + " h=" + std::to_string(h) + " row=" + std::to_string(i) + " d=" +
                    std::to_string(d) + ": got " + format_float(got) + ", want " + format_float(want);
          }
        }
        if (!c.with_lse) continue;
        const size_t li = static_cast<size_t>((b * Hq + h) * Sq + i);
        const double want = exact.lse[li];
        if (!std::isfinite(want)) continue;  // -inf rows are checked exactly above
        const double denom = std::max(1.0, std::fabs(want));
        lowp_lse_err = std::max(lowp_lse_err, std::fabs(lowp.lse[li] - want) / denom);
        const double got = first_lse[li];
        if (std::isfinite(got)) r.lse_err = std::max(r.lse_err, std::fabs(got - want) / denom);
      }
  r.lowp_lse_err = lowp_lse_err;
  const double atol = c.dtype == FLASHCORE_DTYPE_FP16 ? 1e-3 : 4e-3;
  r.o_tol = 2 * r.lowp_o_err + atol;
  r.lse_tol = c.with_lse ? 2 * lowp_lse_err + 1e-3 : 0;
  const bool o_ok = r.o_err <= r.o_tol, lse_ok = r.lse_err <= r.lse_tol;
  if (!o_ok) append(r.message, "O error " + format_float(r.o_err) + " > tolerance " + format_float(r.o_tol) + " (worst at " + worst + ")");
  if (!lse_ok) append(r.message, "LSE relative error " + format_float(r.lse_err) + " > tolerance " + format_float(r.lse_tol));
  r.passed = o_ok && lse_ok && !r.unwritten && !r.nonfinite && n_masked_bad == 0 && r.deterministic;
  return r;
}

}  // namespace flashcore::check
