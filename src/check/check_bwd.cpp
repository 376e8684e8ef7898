// The backward pass's correctness runner: case list, runner and comparison (check_bwd.h).
//
// Tolerance. The forward's rule (check.cpp) bounds |O - O_ref| by twice the error of a low-precision model of the
// kernel plus about one output ulp. The backward has no host low-precision model, so its bound is the model's error
// measured offline, with margin, relative to each gradient's largest magnitude:
//   err(dX) = max |dX - dX_ref| / max |dX_ref|,  dX in {dQ, dK, dV}, dX_ref from reference::attention_backward (float64)
//   pass iff err(dX) <= 2.5e-3 (fp16) / 2e-2 (bf16) for each of the three.
// The model: the FlashAttention-2/3 backward in float32 on the host -- P = exp(scale q.k - LSE) from the forward's
// float32 LSE, O as the forward writes it (rounded to the dtype), D = rowsum(dO * O) and dP = dO V^T in float32, P
// rounded to the dtype before dV = P^T dO, dS = P * (dP - D) rounded to the dtype before dQ = scale dS K and
// dK = scale dS^T Q, float32 accumulation (GQA: dK, dV summed over the query heads of a KV head in float32), the results
// rounded to the dtype. Run through this runner on every case of the full list up to 4e8 reference multiply-adds (133
// cases; and in PyTorch on 13 shapes up to seqlen 4097), its largest err was 9.6e-3 (bf16) and 8.5e-4 (fp16). The
// final rounding alone is up to 2^-9 = 2.0e-3 (bf16) and 2^-12 = 2.4e-4 (fp16) of the largest element; the largest
// figures come from seqlen 2, where dK and dV are sums of two nearly cancelling terms, each with the dtype's rounding
// of dS. The bounds are 2-3x those figures, as the forward's factor 2 allows a kernel's different but equally valid
// rounding order, and they keep the ratio of the two dtypes' unit roundoffs (8). Bugs put into the same model: a causal
// mask one key off, or dK / dV of one query head per KV group only (GQA), give err 0.15 .. 12; a softmax scale 1% off
// gives 2.2e-2 .. 5.3e-2 in bf16 (every quick case fails) and about 4e-2 in fp16.
// Beyond the bound, as in the forward: every element written (not its NaN poison), finite, and dQ exactly 0 on query
// rows that see no key (causal with seqlen_q > seqlen_k, or a window holding no key, reference::visible_key_range:
// their LSE is -inf, or the sink's logit with sinks, and they contribute nothing).
//
// The variants (ABI 0.6). The same model with the variant (reference::attention_backward_lowp: the window's mask, the
// softcap's tanh at fp16 precision and its derivative folded into dS, the sink in the float32 denominator), run on
// the 36 variant cases of both lists with this runner's inputs (seeds 1 .. 5 on the softcap ones):
// - windows and sinks: largest err 6.4e-3 (bf16) and 1.2e-3 (fp16), within the bounds above with the same margin as
//   the plain cases: they keep them.
// - softcap: the kernel's tanh.approx.f32 has a relative error of 2^-11, which the float64 reference does not share.
//   Each capped score c = softcap * tanh(s / softcap) moves by up to e_s = 2^-11 * max |c|, in the forward's LSE and
//   the backward's P alike; P_ij moves by at most 2 e_s relative (its logit against the row's mean shift), and
//   every gradient inherits a relative error of that order (dS also through cap' = 1 - tanh^2, off by at most
//   2^-10 absolute). The model's err on the fp16 case with inputs * 3 and softcap 30 (max |c| ~ 27, e_s ~ 1.3e-2) was
//   2.9e-3 .. 4.2e-3 over 5 seeds: 1.2 .. 1.7x the fp16 bound, 0.22 .. 0.30 e_s (signs at random, not the worst
//   case). A softcap case's bound is therefore tolerance(dtype) + 0.5 e_s (softcap_tolerance), with max |c| computed
//   from the case's inputs (one pass over the visible scores): 2.2x the model's largest figure there; on plain inputs
//   (max |c| ~ 4.5, e_s ~ 2.2e-3) the term adds 1.1e-3, and the fp16 model's figures (up to 1.9e-3) already fit the
//   plain bound. Not measured on a device in this change.
// - dL/dsinks = -sum_i exp(sinks[h] - LSE_i) rowsum(dO_i * O_i) reads the O the forward stored, rounded to the dtype:
//   its bound is the case's bound relative to max_h |ref| plus one rounding of the stored O per term,
//   eps * max_h sum_i |exp(sinks[h] - LSE_i) rowsum(dO_i * O_i)| (eps = 2^-8 bf16 / 2^-11 fp16, over the O and LSE the
//   library's forward wrote), as tests/gpu/test_backward_variants.cpp's dsinks check. The model (the same sum over
//   attention_lowp()'s O and LSE, seed 1) stays within 0.12 of that bound on every sinks case. dsinks must be written,
//   finite, and (repeats > 1) bit-identical over the runs of either deterministic mode (flashcore.h: one fixed order).
#include "check/check_bwd.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <set>
#include <sstream>

#include "check/check_util.h"
#include "core/dtype.h"
#include "reference/reference.h"

namespace flashcore::check::bwd {

namespace ref = flashcore::reference;

double tolerance(flashcore_dtype dtype) { return dtype == FLASHCORE_DTYPE_FP16 ? 2.5e-3 : 2e-2; }

double dsinks_o_rounding(flashcore_dtype dtype) { return std::ldexp(1.0, dtype == FLASHCORE_DTYPE_FP16 ? -11 : -8); }

double softcap_tolerance(flashcore_dtype dtype, double max_capped_score) {
  return tolerance(dtype) + 0.5 * std::ldexp(max_capped_score, -11);
}

// ------------------------------------------------------------------------------------------------
// The case list
// ------------------------------------------------------------------------------------------------
namespace {

using flashcore::dtype_name;

std::string format_float(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

std::string case_name(const Case& c) {
  std::string n = std::string("bwd_") + dtype_name(c.dtype) + "_d" + std::to_string(c.head_dim) +
                  (c.head_dim_v != 0 && c.head_dim_v != c.head_dim ? "v" + std::to_string(c.head_dim_v) : "") + "_b" +
                  std::to_string(c.batch) + "_h" + std::to_string(c.heads_q) + "x" + std::to_string(c.heads_kv) +
                  "_q" + std::to_string(c.seqlen_q) + "_k" + std::to_string(c.seqlen_k) +
                  (c.causal ? "_causal" : "_full") + (c.layout == Layout::BHSD ? "_bhsd" : "_bshd");
  if (c.input_scale != 1.0f) n += "_x" + format_float(c.input_scale);
  if (c.softmax_scale != 0.0f) n += "_scale" + format_float(c.softmax_scale);
  // The variants: the forward's suffixes (check.cpp), so that --filter _win / _cap / _sinks select the same variants.
  auto bound = [](int32_t w) { return w < 0 ? std::string("inf") : std::to_string(w); };
  if (c.local) n += "_win" + bound(c.window_left) + "x" + (c.causal ? std::string("0") : bound(c.window_right));
  if (c.softcap != 0.0f) n += "_cap" + format_float(c.softcap);
  if (!c.sinks.empty()) n += "_sinks";
  if (c.attention_chunk != 0) n += "_chunk" + std::to_string(c.attention_chunk);
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_') ch = 'p';
  return n;
}

struct CaseList {
  std::vector<Case> list;
  Case& add(flashcore_dtype dt, int64_t D, bool causal, int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Sk,
            Layout layout = Layout::BSHD) {
    Case c;
    c.dtype = dt, c.head_dim = D, c.causal = causal, c.batch = B, c.heads_q = Hq, c.heads_kv = Hkv;
    c.seqlen_q = Sq, c.seqlen_k = Sk, c.layout = layout;
    list.push_back(c);
    return list.back();
  }
  std::vector<Case> finish() {
    std::set<std::string> names;
    for (auto& c : list) {
      std::string n = case_name(c), base = n;
      for (int k = 2; !names.insert(n).second; ++k) n = base + "_" + std::to_string(k);
      c.name = n;
    }
    return list;
  }
};

const flashcore_dtype kDtypes[] = {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16};
const int64_t kHeadDims[] = {64, 128};  // the backward's head dims of both backends (256: add_wide_cases)

using detail::sink_logits;
using detail::with_window;

// The attention variants of the backward (ABI 0.6): sliding windows, softcap, sinks (with dL/dsinks), attention_chunk
// (0.6.1), alone and together. Dense tensors only (the backward's packed batches are tests/gpu/test_backward_variants.cpp's).
void add_variant_cases(CaseList& L, bool quick) {
  const flashcore_dtype F16 = FLASHCORE_DTYPE_FP16, BF16 = FLASHCORE_DTYPE_BF16;
  if (quick) {
    // Four small ones (B * Hq * Sq * Sk <= 64K): a window with both bounds; softcap 30 on inputs * 3 (scores up to
    // ~40: tanh well past linear); sinks with rows that see no key (causal, Sq > Sk); a window (8, 4) with softcap 5
    // and sinks, Sq > Sk (rows 0 .. 59 see no key), GQA 2.
    with_window(L.add(F16, 64, false, 1, 4, 2, 113, 113, Layout::BHSD), 16, 8);
    {
      Case& c = L.add(BF16, 128, true, 2, 2, 2, 65, 65);
      c.input_scale = 3.0f, c.softcap = 30.0f;
    }
    L.add(F16, 128, true, 1, 4, 2, 95, 33, Layout::BHSD).sinks = sink_logits(4);
    {
      Case& c = L.add(BF16, 64, false, 1, 4, 2, 129, 65);
      with_window(c, 8, 4).softcap = 5.0f;
      c.sinks = sink_logits(4);
    }
    return;
  }

  // 7a. Windows (FlashAttention's window_size): the diagonal alone, one key back, left-only, right-only, both, and a
  //     left bound past every key; causal (the right bound is then 0: causal + left) and not; shapes cycling through
  //     square, Sq < Sk, Sq > Sk (rows that see no key under (0, 0), (1, 0) and the causal ones), small and decode;
  //     both dtypes and head dims, GQA 2.
  const std::pair<int32_t, int32_t> windows[] = {{0, 0}, {1, 0}, {16, -1}, {-1, 16}, {100, 7}, {5000, 3}};
  const struct { int64_t sq, sk; } shapes[] = {{300, 300}, {113, 400}, {400, 113}, {17, 17}, {1, 1000}, {257, 257}};
  int n = 0;
  for (const auto& [left, right] : windows)
    for (bool causal : {false, true}) {
      const auto sh = shapes[static_cast<size_t>(n) % std::size(shapes)];
      const int64_t B = sh.sq * sh.sk <= 65536 ? 2 : 1;
      with_window(L.add(kDtypes[n % 2], kHeadDims[(n / 2) % 2], causal, B, 4, 2, sh.sq, sh.sk,
                        n % 4 == 3 ? Layout::BHSD : Layout::BSHD),
                  left, right);
      ++n;
    }
  // (0, 0) with Sq > Sk both ways of causal (the first Sq - Sk rows see no key), at the other dtype / head dim.
  with_window(L.add(BF16, 64, false, 1, 2, 2, 200, 65, Layout::BHSD), 0, 0);
  with_window(L.add(F16, 128, true, 1, 2, 2, 200, 65), 0, 0);
  // GQA 8:2 causal with a left window; MQA non-causal with both bounds.
  with_window(L.add(BF16, 128, true, 1, 8, 2, 512, 512), 64, 0);
  with_window(L.add(F16, 64, false, 2, 8, 1, 129, 300, Layout::BHSD), 32, 16);

  // 7b. softcap 30: alone on inputs * 3 (scores up to ~40, past tanh's linear range), causal and not; on plain inputs
  //     (scores O(1): nearly linear); with a window; softcap 5 on plain inputs (GQA, Sq < Sk).
  {
    Case& c = L.add(BF16, 128, false, 2, 2, 2, 129, 129);
    c.input_scale = 3.0f, c.softcap = 30.0f;
  }
  {
    Case& c = L.add(F16, 64, true, 1, 4, 4, 300, 300, Layout::BHSD);
    c.input_scale = 3.0f, c.softcap = 30.0f;
  }
  L.add(F16, 128, false, 1, 2, 2, 255, 255).softcap = 30.0f;
  with_window(L.add(BF16, 64, true, 1, 4, 2, 500, 500), 64, 0).softcap = 30.0f;
  with_window(L.add(F16, 128, false, 1, 2, 2, 300, 300, Layout::BHSD), 32, 16).softcap = 30.0f;
  L.add(BF16, 64, false, 2, 4, 2, 113, 255).softcap = 5.0f;

  // 7c. sinks (dL/dsinks): alone, causal and not; with rows that see no key (causal Sq > Sk, and window (0, 0) with
  //     Sq > Sk); with a window; with GQA 8:2; batch 3 (dL/dsinks sums over the batch).
  L.add(BF16, 64, false, 2, 4, 4, 129, 129).sinks = sink_logits(4);
  L.add(F16, 128, true, 1, 4, 4, 255, 255, Layout::BHSD).sinks = sink_logits(4);
  L.add(F16, 64, true, 1, 4, 2, 300, 100, Layout::BHSD).sinks = sink_logits(4);
  with_window(L.add(BF16, 128, false, 1, 4, 2, 200, 65), 0, 0).sinks = sink_logits(4);
  with_window(L.add(F16, 64, true, 1, 4, 2, 200, 65), 0, 0).sinks = sink_logits(4);
  with_window(L.add(BF16, 128, false, 1, 2, 2, 500, 500), 32, 32).sinks = sink_logits(2);
  with_window(L.add(F16, 128, true, 1, 8, 2, 512, 512), 128, 0).sinks = sink_logits(8);
  L.add(BF16, 64, true, 3, 5, 5, 65, 200).sinks = sink_logits(5);

  // 7d. Everything at once: window + softcap + sinks, non-causal (Sq < Sk) and causal (Sq > Sk: rows without keys).
  {
    Case& c = L.add(F16, 128, false, 2, 4, 2, 333, 777);
    with_window(c, 200, 50).softcap = 20.0f;
    c.sinks = sink_logits(4);
  }
  {
    Case& c = L.add(BF16, 64, true, 1, 4, 2, 300, 200, Layout::BHSD);
    with_window(c, 16, 0).softcap = 30.0f;
    c.input_scale = 3.0f, c.sinks = sink_logits(4);
  }

  // 7e. attention_chunk (Llama 4): causal and not, chunks of 1, 64, 100 and past every key, Sq = Sk, Sq < Sk and
  //     Sq > Sk (rows whose diagonal position is negative see no key); with a window and with softcap + sinks.
  L.add(BF16, 128, true, 1, 4, 2, 300, 300).attention_chunk = 64;
  L.add(F16, 64, false, 1, 4, 2, 113, 400, Layout::BHSD).attention_chunk = 100;
  // Head dims 96, 192, (192, 128) and 256 (the sm90 backend's): a causal window with softcap, sinks with a window,
  // softcap alone.
  with_window(L.add(BF16, 96, true, 1, 4, 2, 300, 300, Layout::BHSD), 64, 0).softcap = 20.0f;
  L.add(F16, 96, false, 1, 4, 2, 129, 300).sinks = sink_logits(4);
  with_window(L.add(F16, 192, true, 1, 4, 2, 257, 257), 48, 0).softcap = 20.0f;
  {
    Case& c = L.add(BF16, 192, false, 1, 4, 2, 200, 300, Layout::BHSD);
    with_window(c, 32, 16).sinks = sink_logits(4);
    c.head_dim_v = 128;
  }
  L.add(BF16, 256, false, 1, 2, 2, 129, 129).softcap = 30.0f;
  with_window(L.add(F16, 256, true, 1, 4, 2, 300, 113), 40, 0).sinks = sink_logits(4);
  L.add(BF16, 64, false, 1, 4, 4, 400, 113).attention_chunk = 1;
  L.add(F16, 128, true, 2, 2, 2, 129, 129).attention_chunk = 5000;
  with_window(L.add(BF16, 128, false, 1, 4, 2, 500, 500), 40, 20).attention_chunk = 96;
  {
    Case& c = L.add(F16, 128, true, 1, 4, 2, 300, 200);
    c.attention_chunk = 48, c.softcap = 30.0f, c.sinks = sink_logits(4);
  }
}

// Head dim 256 (0.9: the sm90 backend's wide kernel; on the portable backend these cases skip): odd lengths both
// ways, GQA, causal and not; the full list adds MQA, a longer sequence and a 3x input scale.
void add_wide_cases(CaseList& L, bool quick) {
  int n = 0;
  for (auto dt : kDtypes)
    for (bool causal : {false, true}) {
      const bool long_q = n++ % 2 == 1;
      L.add(dt, 256, causal, 1, 4, 2, long_q ? 130 : 33, long_q ? 33 : 95, long_q ? Layout::BHSD : Layout::BSHD);
    }
  // The sm90 backend's other head dims: 96, 192 and (192, 128), causal and not, GQA 2, odd lengths both ways.
  n = 0;
  for (int64_t pair : {96, 192, 192128})
    for (bool causal : {false, true}) {
      const bool long_q = n % 2 == 1;
      Case& c = L.add(kDtypes[n++ % 2], pair == 192128 ? 192 : pair, causal, 1, 4, 2, long_q ? 130 : 33,
                      long_q ? 33 : 95, long_q ? Layout::BHSD : Layout::BSHD);
      if (pair == 192128) c.head_dim_v = 128;
    }
  if (quick) return;
  L.add(FLASHCORE_DTYPE_BF16, 256, true, 2, 8, 1, 300, 300);
  L.add(FLASHCORE_DTYPE_FP16, 256, false, 1, 2, 2, 700, 700, Layout::BHSD);
  L.add(FLASHCORE_DTYPE_BF16, 256, false, 1, 2, 2, 300, 300).input_scale = 3.0f;
  L.add(FLASHCORE_DTYPE_FP16, 96, true, 2, 8, 1, 300, 300);
  L.add(FLASHCORE_DTYPE_BF16, 192, false, 1, 2, 2, 500, 500, Layout::BHSD);
  L.add(FLASHCORE_DTYPE_BF16, 192, true, 1, 8, 2, 257, 513).head_dim_v = 128;
  L.add(FLASHCORE_DTYPE_FP16, 192, false, 1, 4, 4, 300, 300).head_dim_v = 128;
}

}  // namespace

std::vector<Case> cases(bool quick) {
  CaseList L;
  if (quick) {
    // 16 small cases: dtype x head dim x causal, twice: square odd seqlen, and seqlen_q != seqlen_k with GQA 2 in the
    // BHSD layout (causal with Sq > Sk, fp16: rows that see no key; Sq < Sk for bf16).
    for (auto dt : kDtypes)
      for (int64_t D : kHeadDims)
        for (bool causal : {false, true}) {
          const int64_t S = D == 64 ? 113 : 65;
          L.add(dt, D, causal, 2, 2, 2, S, S);
          const bool long_q = dt == FLASHCORE_DTYPE_FP16;
          L.add(dt, D, causal, 1, 4, 2, long_q ? 95 : 33, long_q ? 33 : 95, Layout::BHSD);
        }
    add_wide_cases(L, true);
    add_variant_cases(L, true);
    return L.finish();
  }

  // 1. Grid: dtype x head dim x causal x square seqlen, alternating layouts over the seqlens. Fewer heads on the long
  //    ones: the float64 reference does every (query, key) pair of every head.
  const int64_t seqlens[] = {1, 2, 17, 63, 64, 65, 113, 128, 129, 255, 256, 1000, 2048};
  for (auto dt : kDtypes)
    for (int64_t D : kHeadDims)
      for (bool causal : {false, true})
        for (size_t i = 0; i < std::size(seqlens); ++i) {
          const int64_t S = seqlens[i];
          const int64_t B = S <= 129 ? 2 : 1, H = S <= 256 ? 3 : S < 2048 ? 2 : 1;
          L.add(dt, D, causal, B, H, H, S, S, i % 2 ? Layout::BHSD : Layout::BSHD);
        }

  // 2. seqlen_q != seqlen_k both ways, causal and not (Sq > Sk causal: the leading rows see no key, their dQ is 0).
  const int64_t pairs[][2] = {{1, 128},  {1, 1000}, {17, 1000}, {113, 300}, {64, 65},  {65, 64},   {63, 129},
                              {129, 63}, {128, 1},  {1000, 17}, {300, 113}, {255, 2048}, {2048, 255}};
  int n = 0;
  for (auto& pr : pairs)
    for (bool causal : {false, true}) {
      const int64_t B = pr[0] * pr[1] <= 65536 ? 2 : 1;
      L.add(kDtypes[n % 2], kHeadDims[(n / 2) % 2], causal, B, 2, 2, pr[0], pr[1],
            n % 3 == 2 ? Layout::BHSD : Layout::BSHD);
      ++n;
    }

  // 3. GQA ratios 2 and 8, MQA: dK and dV summed over the query heads of a KV head. Every head dim, causal and not.
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
  L.add(FLASHCORE_DTYPE_BF16, 128, true, 1, 32, 4, 512, 512);                // Llama-like heads
  L.add(FLASHCORE_DTYPE_FP16, 64, false, 2, 6, 1, 300, 300, Layout::BHSD);   // MQA, 6 query heads

  // 4. Batch 7.
  n = 0;
  for (int64_t D : kHeadDims)
    for (bool causal : {false, true}) {
      L.add(kDtypes[n % 2], D, causal, 7, 4, 2, causal ? 200 : 65, causal ? 200 : 513,
            n % 2 ? Layout::BHSD : Layout::BSHD);
      ++n;
    }

  // 5. Inputs scaled by 3 (scores up to ~100: peaked softmax rows, large dS).
  n = 0;
  for (auto dt : kDtypes)
    for (bool causal : {false, true}) {
      L.add(dt, kHeadDims[n % 2], causal, 1, 2, 2, 300, 300, n % 2 ? Layout::BHSD : Layout::BSHD).input_scale = 3.0f;
      ++n;
    }

  add_wide_cases(L, false);

  // 6. Non-default softmax scales (dQ and dK carry the scale).
  L.add(FLASHCORE_DTYPE_FP16, 64, false, 2, 2, 2, 129, 129).softmax_scale = 0.5f;
  L.add(FLASHCORE_DTYPE_BF16, 128, true, 1, 4, 2, 200, 255, Layout::BHSD).softmax_scale = 0.03f;
  L.add(FLASHCORE_DTYPE_FP16, 128, true, 1, 2, 2, 1000, 1000).softmax_scale = 0.3f;

  // 7. The attention variants: windows, softcap, sinks, attention_chunk.
  add_variant_cases(L, false);

  return L.finish();
}

double reference_macs(const Case& c) {
  // The reference reads only the keys a row sees: count them under a window (causal alone, as always, counts every
  // key: the figure stays what it was for the cases without a variant).
  double pairs = static_cast<double>(c.seqlen_q) * static_cast<double>(c.seqlen_k);
  if (c.local || c.attention_chunk != 0) {
    const flashcore_attention_params p = mask_of(c);
    pairs = 0;
    for (int64_t i = 0; i < c.seqlen_q; ++i) {
      const ref::KeyRange r = ref::visible_key_range(p, c.seqlen_q, c.seqlen_k, i);
      pairs += static_cast<double>(r.end - r.begin);
    }
  }
  // + attention_backward_sinks' forward; + the softcap tolerance's pass over the scores
  const double per_pair = 5.0 + (c.sinks.empty() ? 0.0 : 2.0) + (c.softcap > 0.0f ? 1.0 : 0.0);
  return per_pair * static_cast<double>(c.batch) * static_cast<double>(c.heads_q) * pairs *
         static_cast<double>(c.head_dim);
}

// ------------------------------------------------------------------------------------------------
// The runner
// ------------------------------------------------------------------------------------------------
namespace {

using detail::DeviceBuffer;
using detail::OwnedStream;
using detail::splitmix;

void append(std::string& msg, const std::string& part) { msg += (msg.empty() ? "" : "; ") + part; }

bool cuda_ok(cudaError_t e, const char* what, Result& r) {
  if (e == cudaSuccess) return true;
  r.passed = false;
  append(r.message, std::string(what) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
  return false;
}

bool lib_ok(flashcore_status s, const char* what, Result& r) {
  if (s == FLASHCORE_SUCCESS) return true;
  r.passed = false;
  append(r.message, std::string(what) + ": " + flashcore_status_string(s) + ": " + flashcore_last_error());
  return false;
}

// Counter-based N(0,1) * scale in `dt` (the forward runner's generator; `tensor` keeps the tensors apart).
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

// One gradient's comparison with its float64 reference, over every run of the case.
struct GradTally {
  explicit GradTally(const char* n) : name(n) {}
  const char* name;
  double abs_err = 0;    // max |got - want| over finite elements
  double ref_max = 0;    // max |want|
  int64_t unwritten = 0, nonfinite = 0, masked_bad = 0;
  std::string worst, first_bad;

  // got: the device image (strides s), want: dense (B, S, H, D); masked(b, i): row i of batch b sees no key (dQ).
  template <class Masked>
  void compare(const std::vector<uint16_t>& got, const flashcore_tensor_strides& s, const std::vector<double>& want,
               int64_t B, int64_t S, int64_t H, int64_t D, flashcore_dtype dt, Masked masked, const char* run) {
    auto where = [&](int64_t b, int64_t i, int64_t h, int64_t d) {
      return std::string(run) + " b=" + std::to_string(b) + " pos=" + std::to_string(i) + " h=" + std::to_string(h) +
             " d=" + std::to_string(d);
    };
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < S; ++i) {
        const bool row_masked = masked(b, i);
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < D; ++d) {
            const uint16_t bits = got[static_cast<size_t>(b * s.batch + i * s.seq + h * s.head + d)];
            const double w = want[static_cast<size_t>(((b * S + i) * H + h) * D + d)];
            ref_max = std::max(ref_max, std::fabs(w));
            const double x = dt == FLASHCORE_DTYPE_FP16 ? ref::half_to_float(bits) : ref::bf16_to_float(bits);
            const char* bad = bits == 0xffff ? "unwritten (NaN poison)"
                              : !std::isfinite(x) ? "non-finite"
                              : row_masked && x != 0 ? "nonzero on a row that sees no key"
                                                     : nullptr;
            if (bad) {
              (bits == 0xffff ? unwritten : !std::isfinite(x) ? nonfinite : masked_bad)++;
              if (first_bad.empty()) first_bad = std::string(name) + " " + bad + " at " + where(b, i, h, d);
              if (!std::isfinite(x)) continue;
            }
            const double e = std::fabs(x - w);
            if (e > abs_err || worst.empty()) {
              if (e > abs_err) abs_err = e;
              worst = where(b, i, h, d) + ": got " + format_float(x) + ", want " + format_float(w);
            }
          }
      }
  }
  double relative() const { return abs_err / (ref_max > 0 ? ref_max : 1.0); }
};

// max |softcap * tanh(scale * q.k / softcap)| over the (query, key) pairs the case's rows see, in float64 from the host
// inputs (the softcap term of the tolerance).
double max_capped_score(const Case& c, const flashcore_attention_params& host, const std::vector<uint16_t>& hq,
                        const std::vector<uint16_t>& hk) {
  const int64_t B = c.batch, Sq = c.seqlen_q, Sk = c.seqlen_k, Hq = c.heads_q, Hkv = c.heads_kv, D = c.head_dim;
  const double scale = ref::resolved_softmax_scale(host), cap = c.softcap;
  std::vector<double> worst(static_cast<size_t>(B * Hq), 0.0);
  ref::parallel_for(B * Hq, 0, [&](int64_t bh) {
    const int64_t b = bh / Hq, h = bh % Hq, g = h / (Hq / Hkv);
    std::vector<double> q(static_cast<size_t>(D));
    double m = 0;
    for (int64_t i = 0; i < Sq; ++i) {
      for (int64_t d = 0; d < D; ++d)
        q[static_cast<size_t>(d)] = ref::load_element(
            hq.data(), c.dtype, b * host.q_strides.batch + i * host.q_strides.seq + h * host.q_strides.head + d);
      const ref::KeyRange keys = ref::visible_key_range(host, Sq, Sk, i);
      for (int64_t j = keys.begin; j < keys.end; ++j) {
        double dot = 0;
        const int64_t at = b * host.k_strides.batch + j * host.k_strides.seq + g * host.k_strides.head;
        for (int64_t d = 0; d < D; ++d) dot += q[static_cast<size_t>(d)] * ref::load_element(hk.data(), c.dtype, at + d);
        m = std::max(m, std::fabs(cap * std::tanh(scale * dot / cap)));
      }
    }
    worst[static_cast<size_t>(bh)] = m;
  });
  return *std::max_element(worst.begin(), worst.end());
}

// One device tensor of 16-bit elements and its host image.
struct Grad {
  DeviceBuffer dev;
  std::vector<uint16_t> host, first;
  size_t bytes() const { return host.size() * 2; }
};

}  // namespace

Result run_case(const Case& c, uint64_t seed, int repeats) {
  Result r;
  r.seed = seed;
  if (std::string why = device_skip_reason(); !why.empty()) {
    r.skipped = true, r.message = why;
    return r;
  }
  OwnedStream s;
  if (!cuda_ok(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", r)) return r;
  return bwd::run_case_on_stream(c, seed, repeats, reinterpret_cast<flashcore_stream_t>(s.stream));
}

Result run_case_on_stream(const Case& c, uint64_t seed, int repeats, flashcore_stream_t fstream) {
  Result r;
  r.seed = seed;
  r.tol = tolerance(c.dtype);
  if (std::string why = device_skip_reason(); !why.empty()) {
    r.skipped = true, r.message = why;
    return r;
  }
  const cudaStream_t stream = reinterpret_cast<cudaStream_t>(fstream);
  const int64_t B = c.batch, Sq = c.seqlen_q, Sk = c.seqlen_k, Hq = c.heads_q, Hkv = c.heads_kv, D = c.head_dim;
  const int64_t Dv = c.head_dim_v != 0 ? c.head_dim_v : D;  // V's, O's, dO's and dV's columns
  if (B <= 0 || Sq <= 0 || Sk <= 0 || Hq <= 0 || Hkv <= 0 || D <= 0 || Dv <= 0 || Hq % Hkv != 0) {
    r.message = "invalid case: " + describe(c);
    return r;
  }
  // (The variants go to the library as they are: a field it refuses fails the case with its message; a case must
  // never run without a field it names.)
  if (is_serving(c) || c.ring_world > 0 || !c.seqused_k.empty() || !c.with_lse || c.kernel_config != nullptr ||
      c.num_splits != 0) {
    r.message = "invalid case for the backward (dense tensors with LSE; no serving, ring, kernel_config or "
                "num_splits fields): " + describe(c);
    return r;
  }
  if (!c.sinks.empty() && static_cast<int64_t>(c.sinks.size()) != Hq) {
    r.message = "invalid case: sinks has " + std::to_string(c.sinks.size()) + " entries for heads_q " +
                std::to_string(Hq) + ": " + describe(c);
    return r;
  }
  if (c.dtype != FLASHCORE_DTYPE_FP16 && c.dtype != FLASHCORE_DTYPE_BF16) {
    r.skipped = true;
    r.message = std::string("the backward takes fp16 and bf16 inputs; not ") + dtype_name(c.dtype);
    return r;
  }
  // q, dq: nq; o, dout: nqv; k, dk: nkv; v, dv: nkvv elements.
  const int64_t nq = B * Sq * Hq * D, nkv = B * Sk * Hkv * D, nlse = B * Hq * Sq;
  const int64_t nqv = B * Sq * Hq * Dv, nkvv = B * Sk * Hkv * Dv;
  const bool with_sinks = !c.sinks.empty();
  const size_t sink_bytes = c.sinks.size() * sizeof(float);

  DeviceBuffer dq_in, dk_in, dv_in, d_o, d_lse, d_dout, d_sinks, d_dsinks;
  Grad gq, gk, gv;
  gq.host.resize(static_cast<size_t>(nq)), gk.host.resize(static_cast<size_t>(nkv)),
      gv.host.resize(static_cast<size_t>(nkvv));
  if (!cuda_ok(cudaMalloc(&dq_in.ptr, static_cast<size_t>(nq) * 2), "cudaMalloc(q)", r) ||
      !cuda_ok(cudaMalloc(&dk_in.ptr, static_cast<size_t>(nkv) * 2), "cudaMalloc(k)", r) ||
      !cuda_ok(cudaMalloc(&dv_in.ptr, static_cast<size_t>(nkvv) * 2), "cudaMalloc(v)", r) ||
      !cuda_ok(cudaMalloc(&d_o.ptr, static_cast<size_t>(nqv) * 2), "cudaMalloc(o)", r) ||
      !cuda_ok(cudaMalloc(&d_lse.ptr, static_cast<size_t>(nlse) * sizeof(float)), "cudaMalloc(lse)", r) ||
      !cuda_ok(cudaMalloc(&d_dout.ptr, static_cast<size_t>(nqv) * 2), "cudaMalloc(dout)", r) ||
      !cuda_ok(cudaMalloc(&gq.dev.ptr, gq.bytes()), "cudaMalloc(dq)", r) ||
      !cuda_ok(cudaMalloc(&gk.dev.ptr, gk.bytes()), "cudaMalloc(dk)", r) ||
      !cuda_ok(cudaMalloc(&gv.dev.ptr, gv.bytes()), "cudaMalloc(dv)", r))
    return r;
  if (with_sinks && (!cuda_ok(cudaMalloc(&d_sinks.ptr, sink_bytes), "cudaMalloc(sinks)", r) ||
                     !cuda_ok(cudaMemcpy(d_sinks.ptr, c.sinks.data(), sink_bytes, cudaMemcpyHostToDevice),
                              "cudaMemcpy(sinks)", r) ||
                     !cuda_ok(cudaMalloc(&d_dsinks.ptr, sink_bytes), "cudaMalloc(dsinks)", r)))
    return r;

  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.q = dq_in.ptr, p.k = dk_in.ptr, p.v = dv_in.ptr, p.o = d_o.ptr, p.lse = static_cast<float*>(d_lse.ptr);
  p.q_strides = layout_strides(c.layout, Sq, Hq, D);
  p.o_strides = layout_strides(c.layout, Sq, Hq, Dv);
  p.k_strides = layout_strides(c.layout, Sk, Hkv, D);
  p.v_strides = layout_strides(c.layout, Sk, Hkv, Dv);
  p.batch = B, p.seqlen_q = Sq, p.seqlen_k = Sk, p.num_heads_q = Hq, p.num_heads_kv = Hkv, p.head_dim = D;
  p.head_dim_v = Dv != D ? Dv : 0;
  p.dtype = c.dtype, p.causal = c.causal ? 1 : 0, p.softmax_scale = c.softmax_scale;
  p.dout = d_dout.ptr, p.dq = gq.dev.ptr, p.dk = gk.dev.ptr, p.dv = gv.dev.ptr;
  p.dq_strides = p.q_strides, p.dout_strides = p.o_strides;
  p.dk_strides = p.k_strides, p.dv_strides = p.v_strides;
  // The variant, for the forward (O and LSE are the variant's) and, through pb = p, the backward.
  p.local = c.local ? 1 : 0;
  p.window_size_left = c.window_left, p.window_size_right = c.window_right;
  p.softcap = c.softcap;
  p.sinks = with_sinks ? static_cast<const float*>(d_sinks.ptr) : nullptr;
  p.attention_chunk = c.attention_chunk;

  // The forward (its own zero-filled workspace) and the backward (a workspace of any contents) take separate structs:
  // the workspace fields differ.
  uint64_t fwd_ws = 0;
  if (!detail::validate_and_size(p, fwd_ws, r)) return r;
  flashcore_attention_params pb = p;
  pb.dsinks = with_sinks ? static_cast<float*>(d_dsinks.ptr) : nullptr;  // (the forward's p leaves it NULL)
  uint64_t bwd_ws = 0;
  if (const flashcore_status st = flashcore_attention_backward_workspace_size(&pb, &bwd_ws); st != FLASHCORE_SUCCESS) {
    // Not compiled for the case, or (UNSUPPORTED_ARCH) the device's backend has no backward: skipped.
    if (st == FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM || st == FLASHCORE_ERROR_UNSUPPORTED_DTYPE ||
        st == FLASHCORE_ERROR_UNSUPPORTED_ARCH) {
      r.skipped = true;
      r.message = std::string("backward: ") + flashcore_status_string(st) + ": " + flashcore_last_error();
    } else {
      lib_ok(st, "flashcore_attention_backward_workspace_size", r);
    }
    return r;
  }
  r.workspace_bytes = bwd_ws;
  DeviceBuffer d_fws, d_bws;
  if (fwd_ws > 0) {
    if (!cuda_ok(cudaMalloc(&d_fws.ptr, fwd_ws), "cudaMalloc(forward workspace)", r) ||
        !cuda_ok(cudaMemset(d_fws.ptr, 0, fwd_ws), "cudaMemset(forward workspace)", r))
      return r;
    p.workspace = d_fws.ptr, p.workspace_size = fwd_ws;
  }
  if (bwd_ws > 0) {
    if (!cuda_ok(cudaMalloc(&d_bws.ptr, bwd_ws), "cudaMalloc(backward workspace)", r)) return r;
    pb.workspace = d_bws.ptr, pb.workspace_size = bwd_ws;
  }

  // Inputs: N(0,1) * input_scale for Q, K, V; dO ~ N(0,1). Dense in the case's layout.
  std::vector<uint16_t> hq(static_cast<size_t>(nq)), hk(static_cast<size_t>(nkv)), hv(static_cast<size_t>(nkvv)),
      hdo(static_cast<size_t>(nqv));
  fill_normal(hq, c.dtype, seed, 0, c.input_scale);
  fill_normal(hk, c.dtype, seed, 1, c.input_scale);
  fill_normal(hv, c.dtype, seed, 2, c.input_scale);
  fill_normal(hdo, c.dtype, seed, 3, 1.0f);
  if (!cuda_ok(cudaMemcpy(dq_in.ptr, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy(q)", r) ||
      !cuda_ok(cudaMemcpy(dk_in.ptr, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy(k)", r) ||
      !cuda_ok(cudaMemcpy(dv_in.ptr, hv.data(), hv.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy(v)", r) ||
      !cuda_ok(cudaMemcpy(d_dout.ptr, hdo.data(), hdo.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy(dout)", r))
    return r;

  // The forward, once: O and LSE (poisoned first, so that an unwritten LSE shows in the gradients).
  if (!cuda_ok(cudaMemsetAsync(d_o.ptr, 0xff, static_cast<size_t>(nqv) * 2, stream), "cudaMemsetAsync(o)", r) ||
      !cuda_ok(cudaMemsetAsync(d_lse.ptr, 0xff, static_cast<size_t>(nlse) * 4, stream), "cudaMemsetAsync(lse)", r) ||
      !lib_ok(flashcore_attention_forward(&p, fstream), "flashcore_attention_forward", r) ||
      !cuda_ok(cudaGetLastError(), "forward launch", r) ||
      !cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize (forward)", r))
    return r;

  // The float64 reference, from the same host inputs (and the case's sinks on the host).
  flashcore_attention_params host = p;
  host.q = hq.data(), host.k = hk.data(), host.v = hv.data(), host.o = nullptr, host.lse = nullptr;
  host.dout = hdo.data(), host.dq = nullptr, host.dk = nullptr, host.dv = nullptr, host.dsinks = nullptr;
  host.sinks = with_sinks ? c.sinks.data() : nullptr;
  host.workspace = nullptr, host.workspace_size = 0;
  const ref::Gradients want = ref::attention_backward(host, hdo.data());
  if (c.softcap > 0.0f) r.tol = softcap_tolerance(c.dtype, max_capped_score(c, host, hq, hk));
  if (want.dq.size() != static_cast<size_t>(nq) || want.dk.size() != static_cast<size_t>(nkv) ||
      want.dv.size() != static_cast<size_t>(nkvv)) {
    r.message = "reference::attention_backward returned gradients of unexpected sizes";
    return r;
  }

  // dL/dsinks: the float64 reference, and the bound's extra term from the O and LSE the forward wrote: per head,
  // A_h = sum over its rows of |exp(sinks[h] - LSE_i) * rowsum(dO_i * O_i)| (one rounding of the stored O per term).
  std::vector<double> want_dsinks;
  double sink_terms = 0;  // max_h A_h
  if (with_sinks) {
    r.with_dsinks = true;
    want_dsinks = ref::attention_backward_sinks(host, hdo.data());
    std::vector<uint16_t> ho(static_cast<size_t>(nqv));
    std::vector<float> hlse(static_cast<size_t>(nlse));
    if (!cuda_ok(cudaMemcpy(ho.data(), d_o.ptr, ho.size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy(o)", r) ||
        !cuda_ok(cudaMemcpy(hlse.data(), d_lse.ptr, hlse.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy(lse)", r))
      return r;
    auto value = [&](const std::vector<uint16_t>& t, int64_t b, int64_t i, int64_t h, int64_t d) {
      const uint16_t bits = t[static_cast<size_t>(b * p.o_strides.batch + i * p.o_strides.seq + h * p.o_strides.head + d)];
      return static_cast<double>(c.dtype == FLASHCORE_DTYPE_FP16 ? ref::half_to_float(bits) : ref::bf16_to_float(bits));
    };
    for (int64_t h = 0; h < Hq; ++h) {
      double a = 0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < Sq; ++i) {
          double delta = 0;
          for (int64_t d = 0; d < Dv; ++d) delta += value(hdo, b, i, h, d) * value(ho, b, i, h, d);
          if (delta == 0.0 || !std::isfinite(delta)) continue;  // (a row without keys: O = 0)
          const double lse = hlse[static_cast<size_t>((b * Hq + h) * Sq + i)];
          const double term = std::exp(static_cast<double>(c.sinks[static_cast<size_t>(h)]) - lse) * delta;
          if (std::isfinite(term)) a += std::fabs(term);
        }
      sink_terms = std::max(sink_terms, a);
    }
  }
  std::vector<float> got_dsinks(c.sinks.size()), first_dsinks;
  double dsinks_abs_err = 0, dsinks_ref_max = 0;
  int64_t dsinks_unwritten = 0, dsinks_nonfinite = 0;
  std::string dsinks_worst, dsinks_first_bad;
  for (double w : want_dsinks) dsinks_ref_max = std::max(dsinks_ref_max, std::fabs(w));

  // The query rows that see no key (causal, the window): their dQ must be exactly 0.
  std::vector<char> row_sees_no_key(static_cast<size_t>(Sq));
  for (int64_t i = 0; i < Sq; ++i) row_sees_no_key[static_cast<size_t>(i)] = ref::visible_key_range(p, Sq, Sk, i).empty();

  // The backward: `repeats` runs with deterministic = 1, then `repeats` with deterministic = 0.
  repeats = std::max(1, repeats);
  r.runs = repeats;
  GradTally tq("dQ"), tk("dK"), tv("dV");
  auto masked = [&](int64_t, int64_t i) { return row_sees_no_key[static_cast<size_t>(i)] != 0; };
  auto never = [](int64_t, int64_t) { return false; };
  for (int det : {1, 0}) {
    pb.deterministic = det;
    for (int rep = 0; rep < repeats; ++rep) {
      const std::string run = "deterministic=" + std::to_string(det) + (repeats > 1 ? " run " + std::to_string(rep) : "");
      for (Grad* g : {&gq, &gk, &gv})
        if (!cuda_ok(cudaMemsetAsync(g->dev.ptr, 0xff, g->bytes(), stream), "cudaMemsetAsync(gradient)", r)) return r;
      if (bwd_ws > 0 && !cuda_ok(cudaMemsetAsync(d_bws.ptr, 0xff, bwd_ws, stream), "cudaMemsetAsync(workspace)", r))
        return r;
      if (with_sinks && !cuda_ok(cudaMemsetAsync(d_dsinks.ptr, 0xff, sink_bytes, stream), "cudaMemsetAsync(dsinks)", r))
        return r;
      if (!lib_ok(flashcore_attention_backward(&pb, fstream), "flashcore_attention_backward", r) ||
          !cuda_ok(cudaGetLastError(), "backward launch", r))
        return r;
      for (Grad* g : {&gq, &gk, &gv})
        if (!cuda_ok(cudaMemcpyAsync(g->host.data(), g->dev.ptr, g->bytes(), cudaMemcpyDeviceToHost, stream),
                     "cudaMemcpyAsync(gradient)", r))
          return r;
      if (with_sinks && !cuda_ok(cudaMemcpyAsync(got_dsinks.data(), d_dsinks.ptr, sink_bytes, cudaMemcpyDeviceToHost,
                                                 stream),
                                 "cudaMemcpyAsync(dsinks)", r))
        return r;
      if (!cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize (backward)", r)) return r;

      tq.compare(gq.host, pb.dq_strides, want.dq, B, Sq, Hq, D, c.dtype, masked, run.c_str());
      tk.compare(gk.host, pb.dk_strides, want.dk, B, Sk, Hkv, D, c.dtype, never, run.c_str());
      tv.compare(gv.host, pb.dv_strides, want.dv, B, Sk, Hkv, Dv, c.dtype, never, run.c_str());
      for (int64_t h = 0; h < static_cast<int64_t>(got_dsinks.size()); ++h) {
        const float x = got_dsinks[static_cast<size_t>(h)];
        uint32_t bits;
        std::memcpy(&bits, &x, sizeof bits);
        if (!std::isfinite(x)) {
          (bits == 0xffffffffu ? dsinks_unwritten : dsinks_nonfinite)++;
          if (dsinks_first_bad.empty())
            dsinks_first_bad = std::string("dsinks ") + (bits == 0xffffffffu ? "unwritten (NaN poison)" : "non-finite") +
                               " at " + run + " h=" + std::to_string(h);
          continue;
        }
        const double w = want_dsinks[static_cast<size_t>(h)], e = std::fabs(static_cast<double>(x) - w);
        if (e > dsinks_abs_err || dsinks_worst.empty()) {
          if (e > dsinks_abs_err) dsinks_abs_err = e;
          dsinks_worst = run + " h=" + std::to_string(h) + ": got " + format_float(x) + ", want " + format_float(w);
        }
      }
      if (rep == 0) {
        for (Grad* g : {&gq, &gk, &gv}) g->first = g->host;
        first_dsinks = got_dsinks;
        continue;
      }
      // (dsinks compared as bits: NaN != NaN would call an unwritten, already reported, dsinks nondeterministic)
      const bool same_q = gq.host == gq.first, same_kv = gk.host == gk.first && gv.host == gv.first;
      const bool same_s = got_dsinks.empty() ||
                          std::memcmp(got_dsinks.data(), first_dsinks.data(), got_dsinks.size() * sizeof(float)) == 0;
      if (det == 1 && !(same_q && same_kv && same_s)) {
        if (r.deterministic)
          append(r.message, "deterministic=1: run " + std::to_string(rep) + " of " + std::to_string(repeats) +
                                " is not bit-identical to run 0 in" + (same_q ? "" : " dQ") +
                                (gk.host == gk.first ? "" : " dK") + (gv.host == gv.first ? "" : " dV") +
                                (same_s ? "" : " dsinks"));
        r.deterministic = false;
      }
      if (det == 0 && !(same_kv && same_s)) {
        if (r.dkdv_deterministic)
          append(r.message, "deterministic=0: dK / dV / dsinks of run " + std::to_string(rep) + " of " +
                                std::to_string(repeats) + " are not bit-identical to run 0 (they must be in either mode)");
        r.dkdv_deterministic = false;
      }
    }
  }

  r.dq_err = tq.relative(), r.dk_err = tk.relative(), r.dv_err = tv.relative();
  r.dq_max = tq.ref_max, r.dk_max = tk.ref_max, r.dv_max = tv.ref_max;
  bool within = true;
  for (const GradTally* t : {&tq, &tk, &tv}) {
    r.unwritten |= t->unwritten > 0, r.nonfinite |= t->nonfinite > 0, r.masked_bad |= t->masked_bad > 0;
    if (t->unwritten) append(r.message, std::string(t->name) + ": " + std::to_string(t->unwritten) + " elements kept the NaN poison");
    if (t->nonfinite) append(r.message, std::string(t->name) + ": " + std::to_string(t->nonfinite) + " elements are NaN/Inf");
    if (t->masked_bad) append(r.message, std::string(t->name) + ": " + std::to_string(t->masked_bad) + " elements of rows that see no key are not 0");
    if (!t->first_bad.empty()) append(r.message, "first: " + t->first_bad);
    if (!(t->relative() <= r.tol)) {
      within = false;
      append(r.message, std::string(t->name) + " error " + format_float(t->relative()) + " of max |ref| " +
                            format_float(t->ref_max) + " > tolerance " + format_float(r.tol) + " (worst at " + t->worst + ")");
    }
  }
  if (with_sinks) {
    const double scale = dsinks_ref_max > 0 ? dsinks_ref_max : 1.0;
    r.dsinks_max = dsinks_ref_max;
    r.dsinks_err = dsinks_abs_err / scale;
    r.dsinks_tol = r.tol + dsinks_o_rounding(c.dtype) * sink_terms / scale;
    r.unwritten |= dsinks_unwritten > 0, r.nonfinite |= dsinks_nonfinite > 0;
    if (dsinks_unwritten) append(r.message, "dsinks: " + std::to_string(dsinks_unwritten) + " entries kept the NaN poison");
    if (dsinks_nonfinite) append(r.message, "dsinks: " + std::to_string(dsinks_nonfinite) + " entries are NaN/Inf");
    if (!dsinks_first_bad.empty()) append(r.message, "first: " + dsinks_first_bad);
    if (!(r.dsinks_err <= r.dsinks_tol)) {
      within = false;
      append(r.message, "dsinks error " + format_float(r.dsinks_err) + " of max |ref| " + format_float(dsinks_ref_max) +
                            " > tolerance " + format_float(r.dsinks_tol) + " (worst at " + dsinks_worst + ")");
    }
  }
  r.passed = within && !r.unwritten && !r.nonfinite && !r.masked_bad && r.deterministic && r.dkdv_deterministic;
  return r;
}

}  // namespace flashcore::check::bwd
