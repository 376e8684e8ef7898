// The correctness sweep: the case list and the runner shared by the GPU tests and `flashcore check`.
//
// Tolerance rule (per case, over the checked rows of every batch and head):
//   o_err   = max |O_gpu - O_ref|                     O_ref: float64 reference::attention()
//   lowp    = max |O_lowp - O_ref|                    O_lowp: reference::attention_lowp(), i.e. the same
//                                                     problem computed the way a kernel would (fp32
//                                                     scores/softmax, P rounded to dtype, O rounded)
//   pass iff |O_gpu - O_ref| <= 2 * lowp + atol * max(1, |O_ref|) at every element,
//            atol = 1e-3 (fp16) / 4e-3 (bf16)
//   lse_err = max |LSE_gpu - LSE_ref| / max(1, |LSE_ref|) over finite reference entries, likewise
//   pass iff lse_err <= 2 * lowp_lse_err + 1e-3.
// The factor 2 allows a kernel's different (but equally valid) rounding order; atol is about one
// output ulp near |O| ~ 1-2 (fp16 ulp(1) = 9.8e-4, bf16 ulp(1) = 7.8e-3 / 2), so that cases whose
// yardstick error happens to be tiny are not held to an impossible bound, and it grows with |O_ref| so that
// it stays about one output ulp where |O| is large (inputs*30 cases: |O| ~ 100, bf16 ulp 0.5; one seed of
// bf16 d256 300 x 300 gave -92.5 for -92.947, one ulp off, against a yardstick error of 0.195:
// docs/decisions.md#check-tolerance). Beyond the tolerances: no output element may keep its NaN poison, O must be
// finite everywhere and 0 on fully masked rows, LSE must be finite except exactly -inf on fully masked rows.
#include "check/check.h"
#include "check/check_util.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <sstream>

#include "core/dtype.h"
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
  std::string n = std::string(dtype_name(c.dtype)) + "_d" + std::to_string(c.head_dim) +
                  (c.head_dim_v != 0 && c.head_dim_v != c.head_dim ? "v" + std::to_string(c.head_dim_v) : "") + "_b" +
                  std::to_string(c.batch) + "_h" + std::to_string(c.heads_q) + "x" + std::to_string(c.heads_kv) +
                  "_q" + std::to_string(c.seqlen_q) + "_k" + std::to_string(c.seqlen_k) +
                  (c.causal ? "_causal" : "_full") + (c.layout == Layout::BHSD ? "_bhsd" : "_bshd");
  if (c.input_scale != 1.0f) n += "_x" + format_float(c.input_scale);
  if (c.softmax_scale != 0.0f) n += "_scale" + format_float(c.softmax_scale);
  if (!c.with_lse) n += "_nolse";
  if (!c.varlen_q.empty()) n += "_varq";
  if (!c.varlen_k.empty()) n += "_vark";
  if (c.page_size > 0) n += "_page" + std::to_string(c.page_size);
  if (c.block_table_stride > 0) n += "_stride" + std::to_string(c.block_table_stride);
  if (!c.seqused_k.empty()) n += "_used";
  if (c.num_splits != 0) n += "_splits" + std::to_string(c.num_splits);
  if (c.ring_world > 0) n += std::string(c.ring_layout == FLASHCORE_RING_ZIGZAG ? "_zigzag" : "_contig") + std::to_string(c.ring_world);
  auto bound = [](int32_t w) { return w < 0 ? std::string("inf") : std::to_string(w); };
  if (c.local) n += "_win" + bound(c.window_left) + "x" + (c.causal ? std::string("0") : bound(c.window_right));
  if (c.softcap != 0.0f) n += "_cap" + format_float(c.softcap);
  if (!c.sinks.empty()) n += "_sinks";
  if (c.attention_chunk != 0) n += "_chunk" + std::to_string(c.attention_chunk);
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_') ch = 'p';
  return n;
}

// "1,17,0" for short lists; "32 seqs, min 64, max 1020, sum 17012" for long ones.
std::string lengths_text(const std::vector<int32_t>& v) {
  std::ostringstream s;
  if (v.size() <= 8) {
    for (size_t b = 0; b < v.size(); ++b) s << (b ? "," : "") << v[b];
    return s.str();
  }
  int64_t sum = 0;
  for (int32_t x : v) sum += x;
  s << v.size() << " seqs, min " << *std::min_element(v.begin(), v.end()) << ", max "
    << *std::max_element(v.begin(), v.end()) << ", sum " << sum;
  return s.str();
}

}  // namespace

bool is_serving(const Case& c) { return !c.varlen_q.empty() || !c.varlen_k.empty() || c.page_size > 0; }

bool has_variant(const Case& c) {
  return c.local || c.softcap != 0.0f || !c.sinks.empty() || c.attention_chunk != 0;
}

std::string describe(const Case& c) {
  std::ostringstream s;
  s << dtype_name(c.dtype) << " B=" << c.batch << " Hq=" << c.heads_q << " Hkv=" << c.heads_kv
    << " Sq=" << c.seqlen_q << " Sk=" << c.seqlen_k << " D=" << c.head_dim
    << (c.head_dim_v != 0 && c.head_dim_v != c.head_dim ? " Dv=" + std::to_string(c.head_dim_v) : std::string())
    << (c.causal ? " causal" : "")
    << (c.layout == Layout::BHSD ? " bhsd" : " bshd");
  if (c.input_scale != 1.0f) s << " inputs*" << format_float(c.input_scale);
  if (c.softmax_scale != 0.0f) s << " softmax_scale=" << format_float(c.softmax_scale);
  if (!c.with_lse) s << " no-lse";
  if (!c.varlen_q.empty()) s << " varlen_q=[" << lengths_text(c.varlen_q) << "]";
  if (!c.varlen_k.empty()) s << " varlen_k=[" << lengths_text(c.varlen_k) << "]";
  if (c.page_size > 0) {
    s << " paged page_size=" << c.page_size;
    if (c.block_table_stride > 0) s << " block_table_stride=" << c.block_table_stride;
  }
  if (!c.seqused_k.empty()) s << " seqused_k=" << lengths_text(c.seqused_k) << " (NaN past them)";
  if (c.num_splits != 0) s << " num_splits=" << c.num_splits;
  if (c.ring_world > 0) {
    s << " ring=" << c.ring_world << (c.ring_layout == FLASHCORE_RING_ZIGZAG ? " zigzag" : " contiguous")
      << " (simulated)";
  }
  if (c.local) s << " window=(" << c.window_left << "," << (c.causal ? 0 : c.window_right) << ")";
  if (c.softcap != 0.0f) s << " softcap=" << format_float(c.softcap);
  if (!c.sinks.empty()) s << " sinks";
  if (c.attention_chunk != 0) s << " attention_chunk=" << c.attention_chunk;
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

int32_t max_of(const std::vector<int32_t>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

// Packed variable-length Q (lengths lq) against packed K/V (lengths lk) or, with lk empty, a dense K/V of dense_sk
// rows per sequence. seqlen_q / seqlen_k: the tight bounds (the longest sequence, at least 1).
Case& add_varlen(CaseList& L, flashcore_dtype dt, int64_t D, bool causal, int64_t Hq, int64_t Hkv,
                 std::vector<int32_t> lq, std::vector<int32_t> lk, int64_t dense_sk = 0, Layout layout = Layout::BSHD) {
  const int64_t B = static_cast<int64_t>(lq.size());
  const int64_t sq = std::max(1, max_of(lq)), sk = lk.empty() ? dense_sk : std::max(1, max_of(lk));
  Case& c = L.add(dt, D, causal, B, Hq, Hkv, sq, sk, layout);
  c.varlen_q = std::move(lq);
  c.varlen_k = std::move(lk);
  return c;
}

// A paged KV cache of `page` rows per page holding `used` keys per sequence (seqlen_k = the longest, at least 1),
// queried by a dense Q of sq rows per sequence, or by a packed Q of lengths lq when lq is not empty.
Case& add_paged(CaseList& L, flashcore_dtype dt, int64_t D, bool causal, int64_t Hq, int64_t Hkv, int64_t sq, int page,
                std::vector<int32_t> used, std::vector<int32_t> lq = {}, Layout layout = Layout::BSHD) {
  const int64_t B = static_cast<int64_t>(used.size());
  if (!lq.empty()) sq = std::max(1, max_of(lq));
  Case& c = L.add(dt, D, causal, B, Hq, Hkv, sq, std::max(1, max_of(used)), layout);
  c.page_size = page;
  c.seqused_k = std::move(used);
  c.varlen_q = std::move(lq);
  return c;
}

int64_t table_width(int64_t seqlen_k, int page) { return (seqlen_k + page - 1) / page; }

// Serving cases: packed variable-length batches (cu_seqlens), paged KV caches (block_table), num_splits.
void add_serving_cases(CaseList& L, bool quick) {
  const flashcore_dtype F16 = FLASHCORE_DTYPE_FP16, BF16 = FLASHCORE_DTYPE_BF16;
  if (quick) {
    // Six small ones (every B * Hq * Sq * Sk <= 64K): varlen q+k with empty sequences; varlen q against a dense
    // K with lengths; paged decode (GQA 4, page 16); paged chunked prefill (page 32); paged + varlen q with a wide
    // block table (page 64); decode with GQA 8 and num_splits = 3 (page 128).
    add_varlen(L, BF16, 128, true, 4, 2, {1, 17, 0, 40, 30}, {20, 17, 5, 40, 64});
    add_varlen(L, F16, 64, false, 2, 1, {3, 0, 50, 17}, {}, 33).seqused_k = {33, 0, 20, 7};
    add_paged(L, BF16, 256, false, 8, 2, 1, 16, {0, 1, 17, 113, 300});
    add_paged(L, F16, 128, true, 4, 1, 4, 32, {0, 5, 200});
    add_paged(L, BF16, 64, true, 2, 2, 0, 64, {0, 100, 65}, {1, 17, 0}).block_table_stride = table_width(100, 64) + 3;
    add_paged(L, F16, 128, false, 16, 2, 1, 128, {1000, 77}).num_splits = 3;
    return;
  }

  // Kept cheap for the reference (tests/cpu/test_check_cases.cpp holds the whole list to a budget): few heads, and
  // the long caches mostly in decode rows. tests/gpu/test_varlen.cpp and test_paged_kv.cpp cover more.
  const std::vector<int32_t> lq5 = {1, 17, 0, 113, 300};
  const std::vector<int32_t> lk5 = {5, 0, 40, 113, 333};       // sequence 1: 17 queries and no key
  const std::vector<int32_t> lk5_long = {64, 17, 200, 113, 400};
  const std::vector<int32_t> used5 = {0, 20, 150, 113, 399};   // 20 > 17: sequence 1 uses its 17 keys
  const std::vector<int32_t> cache5 = {0, 1, 17, 113, 4097};    // KV cache lengths, mixed in one batch
  const std::vector<int32_t> cache5_short = {0, 1, 17, 113, 600};

  // 8a. Varlen grid: dtype x head dim x causal, cycling through varlen q alone (dense K/V), varlen q + k, and
  // varlen q + k + seqused_k; MHA and GQA 2; a few in the head-major (BHSD-like) packed layout.
  int n = 0;
  for (auto dt : kDtypes)
    for (int64_t D : kHeadDims)
      for (bool causal : {false, true}) {
        const int64_t hq = 2, hkv = n % 2 ? 1 : 2;
        const Layout layout = n % 4 == 3 ? Layout::BHSD : Layout::BSHD;
        if (n % 3 == 0) add_varlen(L, dt, D, causal, hq, hkv, lq5, {}, 257, layout);
        else if (n % 3 == 1) add_varlen(L, dt, D, causal, hq, hkv, lq5, lk5, 0, layout);
        else add_varlen(L, dt, D, causal, hq, hkv, lq5, lk5_long, 0, layout).seqused_k = used5;
        ++n;
      }

  // 8b. 32 sequences of random lengths 64..1024 (a fixed draw), self-attention prefill (causal, q = k lengths).
  std::mt19937 rng(20261124);
  std::uniform_int_distribution<int32_t> len(64, 1024);
  std::vector<int32_t> l32(32);
  for (int32_t& x : l32) x = len(rng);
  add_varlen(L, BF16, 64, true, 2, 1, l32, l32);

  // 8c. Loose bounds: params.seqlen_q / seqlen_k larger than every sequence.
  {
    Case& c = add_varlen(L, F16, 64, true, 4, 2, lq5, lk5);
    c.seqlen_q = 400, c.seqlen_k = 500;
  }
  add_varlen(L, BF16, 128, false, 2, 1, lq5, {}, 300).seqlen_q = 512;

  // 8d. Leading empty sequences; one long sequence through the varlen path.
  add_varlen(L, BF16, 128, true, 4, 2, {0, 0, 64}, {10, 0, 64});
  add_varlen(L, F16, 128, true, 2, 2, {4097}, {4097});

  // 8e. Paged grid: page sizes 16..256 x (decode GQA 4, decode GQA 8: caches of 0, 1, 17, 113 and 4097 keys in one
  // batch; chunked prefill of 4 and 17 rows: caches up to 600 keys); dtype, head dim and causal cycling; some wider
  // block tables and a head-major pool.
  const struct { int64_t sq, hq, hkv; } paged_shapes[] = {{1, 8, 2}, {1, 16, 2}, {4, 4, 2}, {17, 2, 1}};
  n = 0;
  for (int page : {16, 32, 64, 128, 256})
    for (const auto& sh : paged_shapes) {
      Case& c = add_paged(L, kDtypes[n % 2], kHeadDims[n % 3], (n / 2) % 2 == 1, sh.hq, sh.hkv, sh.sq, page,
                          sh.sq == 1 ? cache5 : cache5_short, {}, n % 7 == 6 ? Layout::BHSD : Layout::BSHD);
      if (n % 5 == 2) c.block_table_stride = table_width(c.seqlen_k, page) + 3;
      ++n;
    }

  // 8f. Paged + varlen q (chunked prefill against a paged cache): a sequence with queries and no key, one with
  // keys and no query.
  const std::vector<int32_t> chunk_q = {4, 17, 1, 0, 33}, chunk_used = {0, 17, 1, 113, 1500};
  add_paged(L, BF16, 128, true, 2, 1, 0, 16, chunk_used, chunk_q);
  add_paged(L, F16, 64, false, 2, 2, 0, 64, {0, 17, 1, 113, 4097}, chunk_q);
  add_paged(L, BF16, 256, true, 2, 1, 0, 256, chunk_used, chunk_q).block_table_stride = table_width(1500, 256) + 2;
  add_paged(L, F16, 128, true, 2, 2, 0, 32, chunk_used, chunk_q, Layout::BHSD);

  // 8g. num_splits on decode: paged and dense, 1 (never split) and 3.
  add_paged(L, BF16, 128, false, 8, 2, 1, 64, cache5).num_splits = 3;
  add_paged(L, BF16, 128, true, 8, 2, 1, 64, cache5).num_splits = 1;
  add_paged(L, F16, 64, true, 16, 2, 1, 128, cache5).num_splits = 3;
  L.add(BF16, 128, false, 2, 32, 8, 1, 4097).num_splits = 3;
  L.add(BF16, 128, true, 2, 32, 8, 1, 4097).num_splits = 1;
  {
    Case& c = L.add(F16, 256, true, 4, 8, 2, 1, 4097);
    c.seqused_k = {0, 1, 17, 4097};
    c.num_splits = 3;
  }
}

}  // namespace

namespace {

void add_ring_cases(CaseList& L, bool quick) {
  struct R {
    int world;
    flashcore_ring_layout layout;
    int64_t seqlen, hq, hkv, batch;
  };
  if (quick) {  // one small case: 3 ranks, causal, GQA, a length not divisible by the 6 chunks
    Case& c = L.add(FLASHCORE_DTYPE_BF16, 128, true, 1, 2, 1, 61, 61);
    c.ring_world = 3;
    return;
  }
  const R rings[] = {{2, FLASHCORE_RING_ZIGZAG, 113, 4, 2, 2},     {3, FLASHCORE_RING_ZIGZAG, 1000, 4, 2, 1},
                     {4, FLASHCORE_RING_CONTIGUOUS, 1025, 2, 2, 1}, {8, FLASHCORE_RING_ZIGZAG, 777, 2, 1, 1},
                     {1, FLASHCORE_RING_ZIGZAG, 129, 2, 2, 1},      {5, FLASHCORE_RING_CONTIGUOUS, 333, 4, 4, 2}};
  int n = 0;
  for (const R& r : rings) {
    for (bool causal : {false, true}) {
      Case& c = L.add(kDtypes[n % 2], kHeadDims[n % 3], causal, r.batch, r.hq, r.hkv, r.seqlen, r.seqlen,
                      n % 4 == 3 ? Layout::BHSD : Layout::BSHD);
      c.ring_world = r.world;
      c.ring_layout = r.layout;
      ++n;
    }
  }
}

using detail::sink_logits;
using detail::with_window;

// The attention variants (ABI 0.5; attention_chunk since 0.6.1): sliding windows, softcap, sinks, attention_chunk,
// alone and together, dense and serving. tests/gpu/test_attention_variants.cpp covers more.
void add_variant_cases(CaseList& L, bool quick) {
  const flashcore_dtype F16 = FLASHCORE_DTYPE_FP16, BF16 = FLASHCORE_DTYPE_BF16;
  if (quick) {
    // Four small ones (B * Hq * Sq * Sk <= 64K): a causal window; softcap with sinks and rows without keys; a
    // narrow window at d256; a packed batch with a window and sinks.
    with_window(L.add(BF16, 128, true, 2, 2, 2, 113, 113), 16, -1);
    {
      Case& c = L.add(F16, 64, true, 1, 4, 2, 95, 33, Layout::BHSD);
      c.softcap = 5.0f, c.sinks = sink_logits(4);
    }
    with_window(L.add(BF16, 256, true, 1, 2, 1, 65, 65), 20, 0);
    {
      Case& c = add_varlen(L, F16, 128, false, 2, 1, {1, 17, 0, 40}, {20, 17, 5, 64});
      with_window(c, 8, 2).sinks = sink_logits(2);
    }
    return;
  }

  // 10a. Windows (FlashAttention's window_size): the diagonal alone, one key back, left-only, right-only, both, and a
  // left bound past every key; causal and not; shapes cycling through square, Sq < Sk, Sq > Sk and decode.
  const std::pair<int32_t, int32_t> windows[] = {{0, 0}, {1, 0}, {16, -1}, {-1, 16}, {100, 7}, {5000, 3}};
  const struct { int64_t sq, sk; } shapes[] = {{1000, 1000}, {113, 400}, {400, 113}, {17, 17}, {1, 4097}, {257, 257}};
  int n = 0;
  for (const auto& [left, right] : windows)
    for (bool causal : {false, true}) {
      const auto sh = shapes[static_cast<size_t>(n) % std::size(shapes)];
      const int64_t B = sh.sq * sh.sk <= 65536 ? 2 : 1;
      with_window(L.add(kDtypes[n % 2], kHeadDims[n % 3], causal, B, 4, 2, sh.sq, sh.sk,
                        n % 4 == 3 ? Layout::BHSD : Layout::BSHD),
                  left, right);
      ++n;
    }
  // GQA 8:2 with a window; MQA decode against a long cache with a left window.
  with_window(L.add(BF16, 128, true, 1, 8, 2, 1000, 1000), 256, 0);
  with_window(L.add(F16, 64, false, 2, 8, 1, 1, 4097), 512, -1);

  // 10b. softcap: 30 on inputs * 30 (scores in the hundreds, all capped), 5 on plain inputs, and with a window.
  {
    Case& c = L.add(BF16, 128, true, 1, 2, 2, 300, 300);
    c.input_scale = 30.0f, c.softcap = 30.0f;
  }
  L.add(F16, 64, false, 2, 4, 2, 113, 255).softcap = 5.0f;
  with_window(L.add(F16, 256, true, 1, 2, 1, 1000, 1000), 64, 0).softcap = 30.0f;

  // 10c. sinks: alone, with rows that see no key (causal, Sq > Sk), with a window, with GQA.
  L.add(BF16, 64, false, 2, 4, 4, 129, 129).sinks = sink_logits(4);
  L.add(F16, 128, true, 1, 4, 2, 300, 100, Layout::BHSD).sinks = sink_logits(4);
  with_window(L.add(BF16, 256, false, 1, 2, 2, 500, 500), 32, 32).sinks = sink_logits(2);
  with_window(L.add(F16, 64, true, 1, 8, 2, 1000, 1000), 128, 0).sinks = sink_logits(8);

  // 10d. Serving layouts: packed sequences with a window and sinks, a dense KV cache (seqused_k) with a window, paged
  // decode with a window and softcap.
  {
    Case& c = add_varlen(L, BF16, 128, true, 4, 2, {1, 17, 0, 113, 300}, {5, 0, 40, 113, 333});
    with_window(c, 32, 0).sinks = sink_logits(4);
  }
  {
    Case& c = L.add(F16, 64, true, 3, 4, 2, 64, 1000);
    c.seqused_k = {1000, 100, 0};
    with_window(c, 128, 0);
  }
  {
    Case& c = add_paged(L, BF16, 128, true, 8, 2, 1, 64, {0, 1, 17, 113, 4097});
    with_window(c, 256, 0).softcap = 30.0f;
  }

  // 10e. Everything at once.
  {
    Case& c = L.add(F16, 128, false, 2, 4, 2, 333, 777);
    with_window(c, 200, 50);
    c.softcap = 20.0f, c.sinks = sink_logits(4);
  }

  // 10f. attention_chunk (Llama 4): causal and not, chunks of 1, 64, 100, 1024 and past every key, Sq = Sk, Sq < Sk,
  // Sq > Sk (rows whose diagonal position is negative see no key), with a window, softcap and sinks; packed and paged.
  L.add(BF16, 128, true, 1, 8, 2, 1000, 1000).attention_chunk = 64;
  L.add(F16, 64, false, 1, 4, 2, 113, 400, Layout::BHSD).attention_chunk = 100;
  L.add(BF16, 256, false, 1, 2, 2, 400, 113).attention_chunk = 1;
  L.add(F16, 128, true, 2, 2, 2, 129, 129).attention_chunk = 5000;
  with_window(L.add(BF16, 64, false, 1, 4, 2, 500, 500), 40, 20).attention_chunk = 96;
  {
    Case& c = L.add(F16, 256, true, 1, 4, 2, 300, 200);
    c.attention_chunk = 48, c.softcap = 30.0f, c.sinks = sink_logits(4);
  }
  add_varlen(L, BF16, 128, true, 4, 2, {1, 17, 0, 113, 300}, {5, 0, 40, 113, 333}).attention_chunk = 32;
  add_paged(L, F16, 64, true, 8, 2, 1, 64, {0, 1, 17, 113, 4097}).attention_chunk = 1024;
}

// 11. Head dims of today's models beyond 64 / 128 / 256 (issue #72): 96 (Phi-3), 192, and (192, 128) with V's head dim
// of its own (MLA prefill): odd and unequal lengths, GQA, both layouts, a KV cache, packed and paged batches, and the variants.
void add_head_dim_cases(CaseList& L, bool quick) {
  const flashcore_dtype F16 = FLASHCORE_DTYPE_FP16, BF16 = FLASHCORE_DTYPE_BF16;
  const int64_t pairs[][2] = {{96, 96}, {192, 192}, {192, 128}};
  if (quick) {
    for (const auto& dims : pairs)
      for (bool causal : {false, true}) L.add(causal ? BF16 : F16, dims[0], causal, 1, 4, 2, 113, 65).head_dim_v = dims[1];
    return;
  }
  const struct { int64_t sq, sk; } shapes[] = {{1, 1}, {17, 17}, {113, 113}, {300, 300}, {17, 1000},
                                               {400, 17}, {1, 4097},  {129, 1024}};
  int n = 0;
  for (const auto& dims : pairs)
    for (bool causal : {false, true})
      for (const auto& sh : shapes) {
        const int64_t B = sh.sq * sh.sk <= 65536 ? 2 : 1;
        Case& c = L.add(kDtypes[n % 2], dims[0], causal, B, n % 3 == 0 ? 8 : 4, 2, sh.sq, sh.sk,
                        n % 2 ? Layout::BHSD : Layout::BSHD);
        c.head_dim_v = dims[1];
        if (n % 5 == 4) c.seqused_k = std::vector<int32_t>(static_cast<size_t>(B), static_cast<int32_t>(sh.sk * 2 / 3));
        ++n;
      }
  for (const auto& dims : pairs)
    for (bool causal : {false, true}) {
      add_varlen(L, causal ? BF16 : F16, dims[0], causal, 4, 1, {1, 17, 0, 300}, {20, 17, 5, 640}).head_dim_v = dims[1];
      add_paged(L, causal ? F16 : BF16, dims[0], causal, 8, 2, 1, 64, {0, 1, 17, 113, 4097}).head_dim_v = dims[1];
      add_paged(L, causal ? BF16 : F16, dims[0], causal, 4, 2, 5, 16, {9, 200, 1000}).head_dim_v = dims[1];
      // The variants rows: a window with softcap, sinks with a chunk.
      Case& w = with_window(L.add(BF16, dims[0], causal, 1, 4, 2, 600, 600), 100, causal ? 0 : 7);
      w.head_dim_v = dims[1], w.softcap = 20.0f;
      Case& k = L.add(F16, dims[0], causal, 1, 4, 4, 200, 600, Layout::BHSD);
      k.head_dim_v = dims[1], k.sinks = sink_logits(4), k.attention_chunk = causal ? 128 : 0;
    }
}

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
    add_serving_cases(L, true);
    add_ring_cases(L, true);
    add_variant_cases(L, true);
    add_head_dim_cases(L, true);
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

  // 8. Serving: varlen, paged, num_splits.
  add_serving_cases(L, false);

  // 9. Ring attention, simulated on one GPU: 1 to 8 ranks, both layouts, odd lengths (not multiples of the chunk
  // count), GQA, every head dim and dtype.
  add_ring_cases(L, false);

  // 10. Attention variants: windows, softcap, sinks, attention_chunk.
  add_variant_cases(L, false);

  // 11. Head dims 96, 192 and (192, 128).
  add_head_dim_cases(L, false);

  return L.finish();
}

// ------------------------------------------------------------------------------------------------
// The runner
// ------------------------------------------------------------------------------------------------
namespace {

using detail::splitmix;

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

// The case's variant fields into params; `sinks` is where the sink logits are for the reader of params (a device
// array for the library, c.sinks itself for the reference).
void set_variants(const Case& c, flashcore_attention_params& p, const float* sinks) {
  p.local = c.local ? 1 : 0;
  p.window_size_left = c.window_left, p.window_size_right = c.window_right;
  p.softcap = c.softcap;
  p.sinks = c.sinks.empty() ? nullptr : sinks;
  p.attention_chunk = c.attention_chunk;
}

// Why the case's variant fields make it invalid for the harness ("" when they do not).
std::string variant_error(const Case& c) {
  if (!c.sinks.empty() && static_cast<int64_t>(c.sinks.size()) != c.heads_q)
    return "sinks has " + std::to_string(c.sinks.size()) + " entries for heads_q " + std::to_string(c.heads_q);
  if (has_variant(c) && c.ring_world > 0) return "a ring case takes no window, softcap, sinks or attention_chunk";
  return "";
}

}  // namespace

flashcore_attention_params mask_of(const Case& c) {
  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.causal = c.causal ? 1 : 0;
  set_variants(c, p, nullptr);
  return p;
}

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
  // Where a variant's mask changes shape (row i's diagonal key is i + Sk - Sq): the first rows whose window starts
  // at or past key 0 (before them the left bound is clipped), and the rows on either side of the first chunk
  // boundaries (a row that starts a chunk sees one key under causal).
  const int64_t diagonal_of_row0 = Sk - Sq;
  if (c.local && c.window_left >= 0)
    for (int64_t r = -1; r <= 1; ++r) add(c.window_left - diagonal_of_row0 + r);
  if (c.attention_chunk > 0) {
    // The first three chunk boundaries past row 0's diagonal (floor division: the diagonal may be negative).
    const int64_t chunk = c.attention_chunk;
    const int64_t first = (diagonal_of_row0 >= 0 ? diagonal_of_row0 / chunk : -((chunk - 1 - diagonal_of_row0) / chunk)) + 1;
    for (int64_t k = first; k < first + 3; ++k) add(k * chunk - diagonal_of_row0 - 1), add(k * chunk - diagonal_of_row0);
  }
  std::mt19937_64 rng(splitmix(seed ^ 0x5eed));
  std::uniform_int_distribution<int64_t> pick(0, Sq - 1);
  // (8 more rows with a variant, so that its targeted rows above do not crowd out the random ones)
  const int64_t wanted = std::min<int64_t>(has_variant(c) ? 72 : 64, Sq);
  while (static_cast<int64_t>(rows.size()) < wanted) rows.insert(pick(rng));
  return {rows.begin(), rows.end()};
}

namespace {

using detail::DeviceBuffer;
using detail::OwnedStream;

bool cuda_ok(cudaError_t e, const char* what, Result& r) {
  if (e == cudaSuccess) return true;
  r.passed = false;
  r.message += std::string(r.message.empty() ? "" : "; ") + what + " failed: " + cudaGetErrorName(e) + " (" +
               cudaGetErrorString(e) + ")";
  return false;
}

void append(std::string& msg, const std::string& part) { msg += (msg.empty() ? "" : "; ") + part; }

// The whole-buffer checks that need no reference: every output element written (not the NaN poison), finite, and
// O = 0 / LSE = -inf on rows that see no key (callers pass fully_masked = false to lse() for such a row with a sink,
// whose LSE is the finite sink logit, compared with the reference's like any other). `where` is called for the first
// bad element only.
struct OutputScan {
  int64_t unwritten = 0, nonfinite = 0, masked_bad = 0;
  std::string first_bad;

  template <class Where>
  void o(uint16_t bits, float x, bool fully_masked, Where where) {
    const char* what = bits == 0xffff ? "unwritten" : !std::isfinite(x) ? "non-finite" : fully_masked && x != 0 ? "nonzero on a fully masked row" : nullptr;
    if (!what) return;
    (bits == 0xffff ? unwritten : !std::isfinite(x) ? nonfinite : masked_bad)++;
    if (first_bad.empty()) first_bad = std::string("O ") + what + " at " + where();
  }
  template <class Where>
  void lse(float l, bool fully_masked, Where where) {
    uint32_t lbits;
    std::memcpy(&lbits, &l, 4);
    const char* what = lbits == 0xffffffffu                  ? "unwritten"
                       : fully_masked && l != -INFINITY      ? "not -inf on a fully masked row"
                       : !fully_masked && !std::isfinite(l) ? "non-finite"
                                                             : nullptr;
    if (!what) return;
    (lbits == 0xffffffffu ? unwritten : fully_masked ? masked_bad : nonfinite)++;
    if (first_bad.empty()) first_bad = std::string("LSE ") + what + " at " + where() + " (value " + format_float(l) + ")";
  }
  void report(Result& r) const {
    r.unwritten = unwritten > 0, r.nonfinite = nonfinite > 0;
    if (unwritten) append(r.message, std::to_string(unwritten) + " output elements kept the NaN poison (unwritten)");
    if (nonfinite) append(r.message, std::to_string(nonfinite) + " output elements are NaN/Inf where the reference is finite");
    if (masked_bad) append(r.message, std::to_string(masked_bad) + " outputs of fully masked rows are not O=0 / LSE=-inf");
    if (!first_bad.empty()) append(r.message, "first: " + first_bad);
  }
};

// The comparison against the float64 reference and its low-precision yardstick, element by element, then the
// tolerance rule (check.h) and the verdict.
struct ErrorTally {
  double atol;                // per unit of max(1, |O_ref|): about one output ulp at the element's magnitude
  double lowp_lse_err = 0;
  double o_excess = -1e300;   // max over elements of |O - O_ref| - atol * max(1, |O_ref|)
  double atol_at_worst = 0;   // atol * max(1, |O_ref|) at the element of o_excess
  std::string worst;
  explicit ErrorTally(const Case& c) : atol(c.dtype == FLASHCORE_DTYPE_FP16 ? 1e-3 : 4e-3) {}

  template <class Where>
  void o(Result& r, double got, double want, double lowp, Where where) {
    r.lowp_o_err = std::max(r.lowp_o_err, std::fabs(lowp - want));
    const double e = std::fabs(got - want);
    if (!std::isfinite(got)) return;
    r.o_err = std::max(r.o_err, e);
    const double slack = atol * std::max(1.0, std::fabs(want));
    if (e - slack > o_excess) {
      o_excess = e - slack, atol_at_worst = slack;
      worst = where() + ": got " + format_float(got) + ", want " + format_float(want);
    }
  }
  void lse(Result& r, double got, double want, double lowp) {
    if (!std::isfinite(want)) return;  // -inf rows are checked exactly by OutputScan
    const double denom = std::max(1.0, std::fabs(want));
    lowp_lse_err = std::max(lowp_lse_err, std::fabs(lowp - want) / denom);
    if (std::isfinite(got)) r.lse_err = std::max(r.lse_err, std::fabs(got - want) / denom);
  }
  void judge(const Case& c, const OutputScan& scan, Result& r) const {
    r.lowp_lse_err = lowp_lse_err;
    // o_tol: the bound at the element nearest to failing (at least the bound where |O_ref| <= 1).
    r.o_tol = 2 * r.lowp_o_err + std::max(atol, atol_at_worst);
    r.lse_tol = c.with_lse ? 2 * lowp_lse_err + 1e-3 : 0;
    const bool o_ok = o_excess <= 2 * r.lowp_o_err, lse_ok = r.lse_err <= r.lse_tol;
    if (!o_ok) {
      append(r.message, "O error " + format_float(o_excess + atol_at_worst) + " > tolerance " +
                            format_float(2 * r.lowp_o_err + atol_at_worst) + " (at " + worst + ")");
    }
    if (!lse_ok) append(r.message, "LSE relative error " + format_float(r.lse_err) + " > tolerance " + format_float(r.lse_tol));
    r.passed = o_ok && lse_ok && !r.unwritten && !r.nonfinite && scan.masked_bad == 0 && !r.out_of_bounds_write &&
               r.deterministic;
  }
};

std::string skip_reason_for_device() {
  // The library's own device checks (driver, device, backend table), as any caller would see them.
  int32_t count = 0;
  if (flashcore_list_kernel_configs(FLASHCORE_DTYPE_BF16, 128, 0, nullptr, 0, &count) != FLASHCORE_SUCCESS)
    return flashcore_last_error();
  return "";
}


}  // namespace

std::string device_skip_reason() { return skip_reason_for_device(); }

// ------------------------------------------------------------------------------------------------
// Serving cases: packed variable-length Q/O and K/V, paged KV caches
// ------------------------------------------------------------------------------------------------
namespace {

constexpr int64_t kGuardRows = 64;   // rows of guard on both sides of Q, K, V and O
constexpr int64_t kLseGuard = 256;   // floats of guard on both sides of LSE

uint16_t nan_bits(flashcore_dtype dt) { return dt == FLASHCORE_DTYPE_FP16 ? 0x7e00 : 0x7fc0; }

// A serving case laid out on the host: the exact images of the device buffers and what the reference needs.
struct ServingLayout {
  bool varlen_q = false, varlen_k = false, paged = false;
  int64_t B = 0, Hq = 0, Hkv = 0, D = 0, DV = 0;  // DV: V's and O's head dim
  std::vector<int64_t> len_q, rows_k, used;  // per sequence: query rows, its K/V rows, keys used (<= rows_k)
  std::vector<int32_t> cu_q, cu_k;           // (B + 1,) when packed
  std::vector<int32_t> seqused;              // seqused_k as passed (raw); empty: not passed
  int64_t total_q = 0, total_k = 0;          // packed rows (0 when dense)
  int64_t sq = 0, sk = 0;                    // params.seqlen_q / seqlen_k
  // Paged: the table (B, width) and the pool's page count.
  int64_t page_size = 0, width = 0, param_stride = 0, num_pages = 0;
  std::vector<int32_t> table;
  // Strides as passed; element offsets of the tensors in their buffers; extents (elements) of O and LSE.
  // O and V have their own (DV columns); q_off / kv_off are in Q's and K's elements, o_off / v_off in O's and V's.
  flashcore_tensor_strides qs{}, ks{}, os{}, vs{};
  int64_t q_off = 0, kv_off = 0, o_off = 0, v_off = 0, o_extent = 0, o_buffer = 0;
  int64_t lse_off = kLseGuard, lse_count = 0, lse_buffer = 0;
  std::vector<uint16_t> q, k, v;                // device images, NaN guards included
  std::vector<uint16_t> k_logical, v_logical;   // paged: dense (B, sk, Hkv, D or DV) for the reference
  flashcore_tensor_strides logical_strides{}, logical_strides_v{};
  std::vector<float> sinks;                     // the case's sink logits (the device array's contents)
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Lays out `c` (see check.h). The pool gets at least min_pages pages. Returns false with err on an invalid case.
bool build_layout(const Case& c, uint64_t seed, int64_t min_pages, ServingLayout& L, std::string& err) {
  L = ServingLayout{};
  const int64_t B = c.batch, Hq = c.heads_q, Hkv = c.heads_kv, D = c.head_dim;
  const int64_t DV = c.head_dim_v != 0 ? c.head_dim_v : D;
  L.B = B, L.Hq = Hq, L.Hkv = Hkv, L.D = D, L.DV = DV;
  L.varlen_q = !c.varlen_q.empty(), L.varlen_k = !c.varlen_k.empty(), L.paged = c.page_size > 0;
  if (B <= 0 || c.seqlen_q <= 0 || c.seqlen_k <= 0 || Hq <= 0 || Hkv <= 0 || D <= 0 || Hq % Hkv != 0) {
    err = "sizes must be positive and heads_q a multiple of heads_kv";
    return false;
  }
  const std::pair<const char*, const std::vector<int32_t>*> lists[] = {
      {"varlen_q", &c.varlen_q}, {"varlen_k", &c.varlen_k}, {"seqused_k", &c.seqused_k}};
  for (const auto& [name, list] : lists) {
    if (!list->empty() && static_cast<int64_t>(list->size()) != B) {
      err = std::string(name) + " has " + std::to_string(list->size()) + " entries for batch " + std::to_string(B);
      return false;
    }
    if (list != &c.seqused_k)
      for (int32_t x : *list)
        if (x < 0) {
          err = std::string(name) + " holds a negative length " + std::to_string(x);
          return false;
        }
  }
  if (c.page_size < 0 || (L.paged && L.varlen_k)) {
    err = c.page_size < 0 ? "page_size < 0" : "varlen_k and page_size are exclusive (the library rejects the pair)";
    return false;
  }
  if (c.block_table_stride != 0 && !L.paged) {
    err = "block_table_stride without page_size";
    return false;
  }
  if (c.dtype != FLASHCORE_DTYPE_FP16 && c.dtype != FLASHCORE_DTYPE_BF16) {
    err = std::string("the harness has no input generator for dtype ") + dtype_name(c.dtype);
    return false;
  }

  if (const std::string why = variant_error(c); !why.empty()) {
    err = why;
    return false;
  }
  L.sinks = c.sinks;

  // Lengths.
  L.sq = L.varlen_q ? std::max<int64_t>(max_of(c.varlen_q), c.seqlen_q) : c.seqlen_q;
  L.sk = L.varlen_k ? std::max<int64_t>(max_of(c.varlen_k), c.seqlen_k) : c.seqlen_k;
  L.len_q.resize(static_cast<size_t>(B));
  L.rows_k.resize(static_cast<size_t>(B));
  L.used.resize(static_cast<size_t>(B));
  L.seqused = c.seqused_k;
  for (int64_t b = 0; b < B; ++b) {
    const size_t i = static_cast<size_t>(b);
    L.len_q[i] = L.varlen_q ? c.varlen_q[i] : L.sq;
    L.rows_k[i] = L.varlen_k ? c.varlen_k[i] : L.sk;
    L.used[i] = c.seqused_k.empty() ? L.rows_k[i] : std::clamp<int64_t>(c.seqused_k[i], 0, L.rows_k[i]);
  }
  auto prefix = [&](const std::vector<int32_t>& lengths, std::vector<int32_t>& cu, int64_t& total) {
    cu.assign(1, 0);
    total = 0;
    for (int32_t x : lengths) {
      total += x;
      if (total > INT32_MAX) return false;
      cu.push_back(static_cast<int32_t>(total));
    }
    return total > 0;
  };
  if (L.varlen_q && !prefix(c.varlen_q, L.cu_q, L.total_q)) {
    err = "varlen_q must sum to a positive int32 (total_q)";
    return false;
  }
  if (L.varlen_k && !prefix(c.varlen_k, L.cu_k, L.total_k)) {
    err = "varlen_k must sum to a positive int32 (total_k)";
    return false;
  }

  // Q and O: packed (total_q rows, batch stride ignored) or dense; 64 guard rows on both sides.
  const int64_t q_rows = L.varlen_q ? L.total_q : L.sq;
  L.qs = layout_strides(c.layout, q_rows, Hq, D);
  L.os = layout_strides(c.layout, q_rows, Hq, DV);
  L.o_extent = (L.varlen_q ? 1 : B) * q_rows * Hq * DV;
  L.q_off = kGuardRows * Hq * D;
  L.o_off = kGuardRows * Hq * DV;
  L.o_buffer = L.o_extent + 2 * L.o_off;
  L.lse_count = L.varlen_q ? Hq * L.total_q : B * Hq * L.sq;
  L.lse_buffer = L.lse_count + 2 * kLseGuard;

  // K and V: packed, paged or dense; 64 guard rows on both sides.
  const uint16_t nan = nan_bits(c.dtype);
  L.kv_off = kGuardRows * Hkv * D;
  L.v_off = kGuardRows * Hkv * DV;
  int64_t kv_extent = 0, v_extent = 0;
  std::vector<int64_t> pages_of(static_cast<size_t>(B), 0);
  if (L.paged) {
    const int64_t P = c.page_size;
    L.page_size = P;
    L.width = ceil_div(L.sk, P);
    if (c.block_table_stride > 0 && c.block_table_stride < L.width) {
      err = "block_table_stride " + std::to_string(c.block_table_stride) + " < ceil(seqlen_k / page_size) = " +
            std::to_string(L.width);
      return false;
    }
    if (c.block_table_stride > 0) L.width = c.block_table_stride;
    L.param_stride = c.block_table_stride;
    int64_t used_pages = 0;
    for (int64_t b = 0; b < B; ++b) used_pages += pages_of[static_cast<size_t>(b)] = ceil_div(L.used[static_cast<size_t>(b)], P);
    L.num_pages = std::max(used_pages + 3 + static_cast<int64_t>(splitmix(seed ^ 0xe7a) % 3), min_pages);
    if (L.num_pages > INT32_MAX / 2) {
      err = "too many pages";
      return false;
    }
    L.ks = layout_strides(c.layout, P, Hkv, D);
    L.vs = layout_strides(c.layout, P, Hkv, DV);
    kv_extent = L.num_pages * P * Hkv * D, v_extent = L.num_pages * P * Hkv * DV;
  } else if (L.varlen_k) {
    L.ks = layout_strides(c.layout, L.total_k, Hkv, D);
    L.vs = layout_strides(c.layout, L.total_k, Hkv, DV);
    kv_extent = L.total_k * Hkv * D, v_extent = L.total_k * Hkv * DV;
  } else {
    L.ks = layout_strides(c.layout, L.sk, Hkv, D);
    L.vs = layout_strides(c.layout, L.sk, Hkv, DV);
    kv_extent = B * L.sk * Hkv * D, v_extent = B * L.sk * Hkv * DV;
  }

  // Q: N(0,1) * input_scale inside the tensor, NaN in the guards.
  L.q.resize(static_cast<size_t>((L.varlen_q ? 1 : B) * q_rows * Hq * D + 2 * L.q_off));
  fill_normal(L.q, c.dtype, seed, 0, c.input_scale);
  std::fill(L.q.begin(), L.q.begin() + L.q_off, nan);
  std::fill(L.q.end() - L.q_off, L.q.end(), nan);

  const size_t kv_size = static_cast<size_t>(kv_extent + 2 * L.kv_off);
  const size_t v_size = static_cast<size_t>(v_extent + 2 * L.v_off);
  if (!L.paged) {
    // K/V as the kernel reads them: values for the used keys, NaN for the rest of each sequence and the guards.
    L.k.resize(kv_size), L.v.resize(v_size);
    fill_normal(L.k, c.dtype, seed, 1, c.input_scale);
    fill_normal(L.v, c.dtype, seed, 2, c.input_scale);
    const std::pair<std::vector<uint16_t>*, int64_t> guarded[] = {{&L.k, L.kv_off}, {&L.v, L.v_off}};
    for (const auto& [img, off] : guarded) {
      std::fill(img->begin(), img->begin() + off, nan);
      std::fill(img->end() - off, img->end(), nan);
    }
    for (int64_t b = 0; b < B; ++b) {
      const size_t bi = static_cast<size_t>(b);
      const int64_t k_base = L.kv_off + (L.varlen_k ? L.cu_k[bi] * L.ks.seq : b * L.ks.batch);
      const int64_t v_base = L.v_off + (L.varlen_k ? L.cu_k[bi] * L.vs.seq : b * L.vs.batch);
      for (int64_t j = L.used[bi]; j < L.rows_k[bi]; ++j)
        for (int64_t h = 0; h < Hkv; ++h) {
          for (int64_t d = 0; d < D; ++d) L.k[static_cast<size_t>(k_base + j * L.ks.seq + h * L.ks.head + d)] = nan;
          for (int64_t d = 0; d < DV; ++d) L.v[static_cast<size_t>(v_base + j * L.vs.seq + h * L.vs.head + d)] = nan;
        }
    }
    return true;
  }

  // Paged: the logical cache (B, sk, Hkv, D), NaN past each sequence's keys, scattered into a NaN pool in a random
  // page order; the block table's entries past each sequence's pages are garbage.
  const int64_t P = L.page_size;
  L.logical_strides = layout_strides(Layout::BSHD, L.sk, Hkv, D);
  L.logical_strides_v = layout_strides(Layout::BSHD, L.sk, Hkv, DV);
  L.k_logical.resize(static_cast<size_t>(B * L.sk * Hkv * D)), L.v_logical.resize(static_cast<size_t>(B * L.sk * Hkv * DV));
  fill_normal(L.k_logical, c.dtype, seed, 1, c.input_scale);
  fill_normal(L.v_logical, c.dtype, seed, 2, c.input_scale);
  const int64_t row = Hkv * D, row_v = Hkv * DV;  // logical rows (all heads)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = L.used[static_cast<size_t>(b)]; j < L.sk; ++j) {
      const size_t at = static_cast<size_t>((b * L.sk + j) * row), at_v = static_cast<size_t>((b * L.sk + j) * row_v);
      std::fill(L.k_logical.begin() + at, L.k_logical.begin() + at + row, nan);
      std::fill(L.v_logical.begin() + at_v, L.v_logical.begin() + at_v + row_v, nan);
    }
  L.k.assign(kv_size, nan), L.v.assign(v_size, nan);
  std::vector<int32_t> order(static_cast<size_t>(L.num_pages));
  for (int64_t i = 0; i < L.num_pages; ++i) order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  std::mt19937_64 rng(splitmix(seed ^ 0x9a6ed));
  std::shuffle(order.begin(), order.end(), rng);
  L.table.assign(static_cast<size_t>(B * L.width), -1);
  size_t next = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t pg = 0; pg < pages_of[static_cast<size_t>(b)]; ++pg) {
      const int32_t page = order[next++];
      L.table[static_cast<size_t>(b * L.width + pg)] = page;
      for (int64_t r = 0; r < P && pg * P + r < L.used[static_cast<size_t>(b)]; ++r)
        for (int64_t h = 0; h < Hkv; ++h) {
          const size_t from = static_cast<size_t>((b * L.sk + pg * P + r) * row + h * D);
          const size_t to = static_cast<size_t>(L.kv_off + page * L.ks.batch + r * L.ks.seq + h * L.ks.head);
          std::copy_n(L.k_logical.begin() + from, D, L.k.begin() + to);
          const size_t from_v = static_cast<size_t>((b * L.sk + pg * P + r) * row_v + h * DV);
          const size_t to_v = static_cast<size_t>(L.v_off + page * L.vs.batch + r * L.vs.seq + h * L.vs.head);
          std::copy_n(L.v_logical.begin() + from_v, DV, L.v.begin() + to_v);
        }
    }
  // Garbage past each sequence's pages: -1, INT32_MAX, an id past num_pages, or the id of an unreferenced NaN page.
  const size_t spare = order.size() - next;  // >= 3 NaN pages no sequence uses
  for (int64_t b = 0; b < B; ++b)
    for (int64_t pg = pages_of[static_cast<size_t>(b)]; pg < L.width; ++pg) {
      const uint64_t h = splitmix(seed ^ splitmix(static_cast<uint64_t>(b * L.width + pg) + 17));
      int32_t& entry = L.table[static_cast<size_t>(b * L.width + pg)];
      switch (h % 4) {
        case 0: entry = -1; break;
        case 1: entry = INT32_MAX; break;
        case 2: entry = static_cast<int32_t>(L.num_pages + static_cast<int64_t>((h >> 8) % 1000)); break;
        default: entry = order[next + static_cast<size_t>((h >> 8) % spare)];
      }
    }
  return true;
}

// The device side of a serving case: buffers sized by a layout, and the params that point into them.
struct ServingDevice {
  DeviceBuffer q, k, v, o, lse, cu_q, cu_k, used, table, ws, sinks;
  flashcore_attention_params p{};
  size_t esize = 2;

  bool allocate(const Case& c, const ServingLayout& L, Result& r) {
    auto alloc = [&](DeviceBuffer& buf, size_t bytes, const char* what) {
      return bytes == 0 || cuda_ok(cudaMalloc(&buf.ptr, bytes), what, r);
    };
    if (!alloc(q, L.q.size() * esize, "cudaMalloc(q)") || !alloc(k, L.k.size() * esize, "cudaMalloc(k)") ||
        !alloc(v, L.v.size() * esize, "cudaMalloc(v)") ||
        !alloc(o, static_cast<size_t>(L.o_buffer) * esize, "cudaMalloc(o)") ||
        (c.with_lse && !alloc(lse, static_cast<size_t>(L.lse_buffer) * 4, "cudaMalloc(lse)")) ||
        !alloc(cu_q, L.cu_q.size() * 4, "cudaMalloc(cu_seqlens_q)") ||
        !alloc(cu_k, L.cu_k.size() * 4, "cudaMalloc(cu_seqlens_k)") ||
        !alloc(used, L.seqused.size() * 4, "cudaMalloc(seqused_k)") ||
        !alloc(table, L.table.size() * 4, "cudaMalloc(block_table)") ||
        !alloc(sinks, L.sinks.size() * 4, "cudaMalloc(sinks)"))
      return false;
    flashcore_attention_params_init(&p);
    auto at = [&](void* base, int64_t elements) { return static_cast<char*>(base) + elements * static_cast<int64_t>(esize); };
    p.q = at(q.ptr, L.q_off), p.k = at(k.ptr, L.kv_off), p.v = at(v.ptr, L.v_off), p.o = at(o.ptr, L.o_off);
    p.lse = c.with_lse ? static_cast<float*>(lse.ptr) + L.lse_off : nullptr;
    p.lse_capacity = c.with_lse ? L.lse_count : 0;
    p.q_strides = L.qs, p.o_strides = L.os;
    p.k_strides = L.ks, p.v_strides = L.vs;
    p.batch = L.B, p.seqlen_q = L.sq, p.seqlen_k = L.sk, p.num_heads_q = L.Hq, p.num_heads_kv = L.Hkv, p.head_dim = L.D;
    p.head_dim_v = c.head_dim_v;
    p.dtype = c.dtype, p.causal = c.causal ? 1 : 0, p.softmax_scale = c.softmax_scale;
    p.kernel_config = c.kernel_config;
    p.seqused_k = static_cast<const int32_t*>(used.ptr);
    p.cu_seqlens_q = static_cast<const int32_t*>(cu_q.ptr), p.total_q = L.total_q;
    p.cu_seqlens_k = static_cast<const int32_t*>(cu_k.ptr), p.total_k = L.total_k;
    p.block_table = static_cast<const int32_t*>(table.ptr);
    p.block_table_stride = L.param_stride;
    p.page_size = L.page_size, p.num_pages = L.num_pages;
    p.num_splits = c.num_splits;
    set_variants(c, p, static_cast<const float*>(sinks.ptr));
    return true;
  }

  // flashcore_attention_validate (skip on what is not compiled in) and the workspace.
  bool prepare(Result& r) {
    uint64_t bytes = 0;
    if (!detail::validate_and_size(p, bytes, r)) return false;
    if (bytes > 0) {
      if (!cuda_ok(cudaMalloc(&ws.ptr, bytes), "cudaMalloc(workspace)", r) ||
          !cuda_ok(cudaMemset(ws.ptr, 0, bytes), "cudaMemset(workspace)", r))
        return false;
      p.workspace = ws.ptr, p.workspace_size = bytes;
    }
    return true;
  }

  // Inputs, lengths and block table, stream-ordered (the stream is synchronized before returning).
  bool upload(const ServingLayout& L, cudaStream_t s, Result& r) {
    auto put = [&](DeviceBuffer& buf, const void* src, size_t bytes, const char* what) {
      return bytes == 0 || cuda_ok(cudaMemcpyAsync(buf.ptr, src, bytes, cudaMemcpyHostToDevice, s), what, r);
    };
    return put(q, L.q.data(), L.q.size() * esize, "cudaMemcpyAsync(q)") &&
           put(k, L.k.data(), L.k.size() * esize, "cudaMemcpyAsync(k)") &&
           put(v, L.v.data(), L.v.size() * esize, "cudaMemcpyAsync(v)") &&
           put(cu_q, L.cu_q.data(), L.cu_q.size() * 4, "cudaMemcpyAsync(cu_seqlens_q)") &&
           put(cu_k, L.cu_k.data(), L.cu_k.size() * 4, "cudaMemcpyAsync(cu_seqlens_k)") &&
           put(used, L.seqused.data(), L.seqused.size() * 4, "cudaMemcpyAsync(seqused_k)") &&
           put(table, L.table.data(), L.table.size() * 4, "cudaMemcpyAsync(block_table)") &&
           put(sinks, L.sinks.data(), L.sinks.size() * 4, "cudaMemcpyAsync(sinks)") &&
           cuda_ok(cudaStreamSynchronize(s), "cudaStreamSynchronize (upload)", r);
  }

  // NaN poison (all-ones) over the whole O and LSE buffers, guards included.
  bool poison(const ServingLayout& L, cudaStream_t s, Result& r) {
    return cuda_ok(cudaMemsetAsync(o.ptr, 0xff, static_cast<size_t>(L.o_buffer) * esize, s), "cudaMemsetAsync(o)", r) &&
           (lse.ptr == nullptr ||
            cuda_ok(cudaMemsetAsync(lse.ptr, 0xff, static_cast<size_t>(L.lse_buffer) * 4, s), "cudaMemsetAsync(lse)", r));
  }

  // O and LSE buffers (guards included) back to the host; synchronizes the stream.
  bool download(const ServingLayout& L, cudaStream_t s, std::vector<uint16_t>& ho, std::vector<float>& hlse, Result& r) {
    ho.resize(static_cast<size_t>(L.o_buffer));
    hlse.resize(lse.ptr ? static_cast<size_t>(L.lse_buffer) : 0);
    return cuda_ok(cudaGetLastError(), "kernel launch", r) &&
           cuda_ok(cudaMemcpyAsync(ho.data(), o.ptr, ho.size() * esize, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync(o)", r) &&
           (hlse.empty() || cuda_ok(cudaMemcpyAsync(hlse.data(), lse.ptr, hlse.size() * 4, cudaMemcpyDeviceToHost, s),
                                    "cudaMemcpyAsync(lse)", r)) &&
           cuda_ok(cudaStreamSynchronize(s), "cudaStreamSynchronize (kernel execution)", r);
  }

  bool forward(cudaStream_t s, Result& r) {
    const flashcore_status fs = flashcore_attention_forward(&p, reinterpret_cast<flashcore_stream_t>(s));
    if (fs == FLASHCORE_SUCCESS) return true;
    append(r.message, std::string("flashcore_attention_forward: ") + flashcore_status_string(fs) + ": " +
                          flashcore_last_error());
    return false;
  }
};

// Checks one run's O and LSE buffers (guards included) of the serving case `c` laid out as L: guards, written
// rows, masked rows, and the per-sequence float64 reference. Fills r's errors and tolerances; r.passed is the
// verdict of this run (r.deterministic is left as it is and counts too).
void check_serving(const Case& c, const ServingLayout& L, uint64_t seed, const std::vector<uint16_t>& ho,
                   const std::vector<float>& hlse, Result& r) {
  const int64_t B = L.B, Hq = L.Hq, D = L.DV;  // O's columns
  const flashcore_tensor_strides& os = L.os;
  auto o_at = [&](int64_t b, int64_t i, int64_t h, int64_t d) -> int64_t {
    return L.o_off + (L.varlen_q ? L.cu_q[static_cast<size_t>(b)] * os.seq : b * os.batch) + i * os.seq +
           h * os.head + d;
  };
  auto lse_at = [&](int64_t b, int64_t h, int64_t i) -> int64_t {
    return L.lse_off + (L.varlen_q ? h * L.total_q + L.cu_q[static_cast<size_t>(b)] + i : (b * Hq + h) * L.sq + i);
  };
  auto to_float = [&](uint16_t x) { return c.dtype == FLASHCORE_DTYPE_FP16 ? ref::half_to_float(x) : ref::bf16_to_float(x); };
  const flashcore_attention_params mask = mask_of(c);
  auto fully_masked = [&](int64_t b, int64_t i) {
    return ref::visible_key_range(mask, L.len_q[static_cast<size_t>(b)], L.used[static_cast<size_t>(b)], i).empty();
  };

  // Guards: nothing outside the tensors may be written.
  int64_t n_guard = 0;
  std::string first_guard;
  for (int64_t e = 0; e < L.o_buffer; ++e) {
    if (e >= L.o_off && e < L.o_off + L.o_extent) continue;
    if (ho[static_cast<size_t>(e)] == 0xffff) continue;
    if (n_guard++ == 0)
      first_guard = "O element " + std::to_string(e - L.o_off) + " relative to o (" +
                    (e < L.o_off ? "before the tensor" : "past its end, " + std::to_string(L.o_extent) + " elements") + ")";
  }
  if (c.with_lse)
    for (int64_t e = 0; e < L.lse_buffer; ++e) {
      if (e >= L.lse_off && e < L.lse_off + L.lse_count) continue;
      uint32_t bits;
      std::memcpy(&bits, &hlse[static_cast<size_t>(e)], 4);
      if (bits == 0xffffffffu) continue;
      if (n_guard++ == 0)
        first_guard = "LSE entry " + std::to_string(e - L.lse_off) + " relative to lse (" +
                      (e < L.lse_off ? "before the tensor" : "past its " + std::to_string(L.lse_count) + " entries") + ")";
    }
  r.out_of_bounds_write = n_guard > 0;
  if (n_guard)
    append(r.message, std::to_string(n_guard) + " guard elements outside O / LSE were written (first: " + first_guard + ")");

  // Every row of every sequence: written, finite, O = 0 / LSE = -inf where no key is visible.
  OutputScan scan;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < L.len_q[static_cast<size_t>(b)]; ++i)
      for (int64_t h = 0; h < Hq; ++h) {
        for (int64_t d = 0; d < D; ++d) {
          const uint16_t bits = ho[static_cast<size_t>(o_at(b, i, h, d))];
          scan.o(bits, to_float(bits), fully_masked(b, i), [&] {
            return "sequence " + std::to_string(b) + " row=" + std::to_string(i) + " h=" + std::to_string(h) +
                   " d=" + std::to_string(d);
          });
        }
        if (!c.with_lse) continue;
        scan.lse(hlse[static_cast<size_t>(lse_at(b, h, i))], fully_masked(b, i) && c.sinks.empty(), [&] {
          return "sequence " + std::to_string(b) + " h=" + std::to_string(h) + " row=" + std::to_string(i);
        });
      }
  scan.report(r);

  // The reference, per sequence: a batch-1 problem over that sequence's rows.
  flashcore_attention_params host;
  flashcore_attention_params_init(&host);
  host.batch = 1, host.num_heads_q = Hq, host.num_heads_kv = L.Hkv, host.head_dim = L.D, host.head_dim_v = L.DV;
  host.dtype = c.dtype, host.causal = c.causal ? 1 : 0, host.softmax_scale = c.softmax_scale;
  set_variants(c, host, c.sinks.data());
  host.q_strides = L.qs;
  host.k_strides = L.paged ? L.logical_strides : L.ks;
  host.v_strides = L.paged ? L.logical_strides_v : L.vs;
  ErrorTally tally(c);
  r.rows_checked = 0;
  for (int64_t b = 0; b < B; ++b) {
    const size_t bi = static_cast<size_t>(b);
    const int64_t lq = L.len_q[bi], keys = L.used[bi];
    if (lq == 0) continue;
    const int32_t used32 = static_cast<int32_t>(keys);
    host.seqlen_q = lq, host.seqlen_k = std::max<int64_t>(1, keys), host.seqused_k = &used32;
    host.q = L.q.data() + L.q_off + (L.varlen_q ? L.cu_q[bi] * L.qs.seq : b * L.qs.batch);
    if (L.paged) {
      host.k = L.k_logical.data() + b * L.sk * L.Hkv * L.D, host.v = L.v_logical.data() + b * L.sk * L.Hkv * L.DV;
    } else {
      host.k = L.k.data() + L.kv_off + (L.varlen_k ? L.cu_k[bi] * L.ks.seq : b * L.ks.batch);
      host.v = L.v.data() + L.v_off + (L.varlen_k ? L.cu_k[bi] * L.vs.seq : b * L.vs.batch);
    }
    Case one = c;
    one.batch = 1, one.seqlen_q = lq, one.seqlen_k = keys;
    std::vector<int64_t> rows = checked_rows(one, splitmix(seed ^ (0x5e9 + static_cast<uint64_t>(b))));
    ref::Output exact, lowp;
    try {
      exact = ref::attention(host, rows), lowp = ref::attention_lowp(host, rows);
    } catch (const std::exception& e) {
      append(r.message, std::string("reference failed for sequence ") + std::to_string(b) + ": " + e.what());
      r.passed = false;
      return;
    }
    if (rows.empty()) {
      rows.resize(static_cast<size_t>(lq));
      for (int64_t i = 0; i < lq; ++i) rows[static_cast<size_t>(i)] = i;
    }
    r.rows_checked += static_cast<int64_t>(rows.size());
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i : rows) {
        for (int64_t d = 0; d < D; ++d) {
          const size_t ri = static_cast<size_t>((i * Hq + h) * D + d);
          tally.o(r, to_float(ho[static_cast<size_t>(o_at(b, i, h, d))]), exact.o[ri], lowp.o[ri], [&] {
            return "sequence " + std::to_string(b) + " h=" + std::to_string(h) + " row=" + std::to_string(i) +
                   " d=" + std::to_string(d);
          });
        }
        if (!c.with_lse) continue;
        const size_t li = static_cast<size_t>(h * lq + i);
        tally.lse(r, hlse[static_cast<size_t>(lse_at(b, h, i))], exact.lse[li], lowp.lse[li]);
      }
  }
  tally.judge(c, scan, r);
}

Result run_serving(const Case& c, uint64_t seed, int repeats, cudaStream_t stream) {
  Result r;
  r.seed = seed;
  ServingLayout L;
  std::string err;
  if (!build_layout(c, seed, 0, L, err)) {
    r.message = "invalid case: " + err + " (" + describe(c) + ")";
    return r;
  }
  ServingDevice dev;
  dev.esize = static_cast<size_t>(flashcore::dtype_size(c.dtype));
  if (!dev.allocate(c, L, r) || !dev.prepare(r) || !dev.upload(L, stream, r)) return r;

  std::vector<uint16_t> ho, first_o;
  std::vector<float> hlse, first_lse;
  repeats = std::max(1, repeats);
  for (int rep = 0; rep < repeats; ++rep) {
    if (!dev.poison(L, stream, r) || !dev.forward(stream, r) || !dev.download(L, stream, ho, hlse, r)) return r;
    if (rep == 0) {
      first_o.swap(ho), first_lse.swap(hlse);
    } else if (ho != first_o || std::memcmp(first_lse.data(), hlse.data(), hlse.size() * 4) != 0) {
      if (r.deterministic) append(r.message, "run " + std::to_string(rep) + " of " + std::to_string(repeats) +
                                                 " is not bit-identical to run 0");
      r.deterministic = false;
    }
  }
  check_serving(c, L, seed, first_o, first_lse, r);
  return r;
}

// Folds the result of one run of a graph test into the overall one.
void merge(Result& all, const Result& part, const std::string& label) {
  all.o_err = std::max(all.o_err, part.o_err), all.o_tol = std::max(all.o_tol, part.o_tol);
  all.lse_err = std::max(all.lse_err, part.lse_err), all.lse_tol = std::max(all.lse_tol, part.lse_tol);
  all.lowp_o_err = std::max(all.lowp_o_err, part.lowp_o_err);
  all.lowp_lse_err = std::max(all.lowp_lse_err, part.lowp_lse_err);
  all.nonfinite |= part.nonfinite, all.unwritten |= part.unwritten, all.out_of_bounds_write |= part.out_of_bounds_write;
  all.deterministic &= part.deterministic;
  all.rows_checked += part.rows_checked;
  all.passed &= part.passed;
  if (!part.message.empty()) append(all.message, label + ": " + part.message);
}

// Empty when a and b can share one set of device buffers and one captured graph; otherwise what differs.
std::string graph_mismatch(const Case& a, const Case& b, const ServingLayout& la, const ServingLayout& lb) {
  const std::pair<const char*, bool> same[] = {
      {"dtype", a.dtype == b.dtype},
      {"head_dim / heads / batch", a.head_dim == b.head_dim && a.head_dim_v == b.head_dim_v && a.heads_q == b.heads_q &&
                                       a.heads_kv == b.heads_kv &&
                                       a.batch == b.batch},
      {"causal / layout / with_lse / softmax_scale",
       a.causal == b.causal && a.layout == b.layout && a.with_lse == b.with_lse && a.softmax_scale == b.softmax_scale},
      {"kernel_config", (a.kernel_config == nullptr) == (b.kernel_config == nullptr) &&
                            (a.kernel_config == nullptr || std::string(a.kernel_config) == b.kernel_config)},
      {"num_splits", a.num_splits == b.num_splits},
      {"variants (local, window, softcap, sinks, attention_chunk)",
       a.local == b.local && a.window_left == b.window_left && a.window_right == b.window_right &&
           a.softcap == b.softcap && a.sinks.size() == b.sinks.size() && a.attention_chunk == b.attention_chunk},
      {"mode (varlen_q / varlen_k / page_size / seqused_k given)",
       la.varlen_q == lb.varlen_q && la.varlen_k == lb.varlen_k && la.page_size == lb.page_size &&
           la.seqused.empty() == lb.seqused.empty()},
      {"params.seqlen_q / seqlen_k", la.sq == lb.sq && la.sk == lb.sk},
      {"total_q / total_k", la.total_q == lb.total_q && la.total_k == lb.total_k},
      {"block table (stride, width, pages)",
       la.param_stride == lb.param_stride && la.width == lb.width && la.num_pages == lb.num_pages},
      {"buffer sizes", la.q.size() == lb.q.size() && la.k.size() == lb.k.size() && la.o_buffer == lb.o_buffer &&
                           la.lse_buffer == lb.lse_buffer},
  };
  for (const auto& [what, ok] : same)
    if (!ok) return what;
  return "";
}

}  // namespace

Result run_graph_replay(const Case& captured, const Case& replayed, uint64_t seed) {
  Result r;
  r.seed = seed;
  if (std::string why = skip_reason_for_device(); !why.empty()) {
    r.skipped = true, r.message = why;
    return r;
  }
  if (!is_serving(captured) || !is_serving(replayed)) {
    r.message = "invalid graph test: both cases must be serving cases (varlen_q, varlen_k or page_size)";
    return r;
  }
  ServingLayout la, lb;
  std::string err;
  if (!build_layout(captured, seed, 0, la, err) || !build_layout(replayed, seed + 1, 0, lb, err)) {
    r.message = "invalid case: " + err;
    return r;
  }
  if (la.num_pages != lb.num_pages) {  // one pool for both: the larger page count
    const int64_t pages = std::max(la.num_pages, lb.num_pages);
    build_layout(captured, seed, pages, la, err);
    build_layout(replayed, seed + 1, pages, lb, err);
  }
  if (const std::string what = graph_mismatch(captured, replayed, la, lb); !what.empty()) {
    r.message = "invalid graph test: the two cases differ in " + what + " (" + describe(captured) + " / " +
                describe(replayed) + ")";
    return r;
  }
  OwnedStream s;
  if (!cuda_ok(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", r)) return r;
  ServingDevice dev;
  dev.esize = static_cast<size_t>(flashcore::dtype_size(captured.dtype));
  if (!dev.allocate(captured, la, r) || !dev.prepare(r) || !dev.upload(la, s.stream, r)) return r;

  r.passed = true;
  std::vector<uint16_t> direct_o, ho;
  std::vector<float> direct_lse, hlse;
  // 1. A direct run (also the library's lazy initialisation, outside the capture).
  {
    Result part;
    part.seed = seed;
    if (!dev.poison(la, s.stream, part) || !dev.forward(s.stream, part) ||
        !dev.download(la, s.stream, direct_o, direct_lse, part)) {
      merge(r, part, "direct run");
      r.passed = false;
      return r;
    }
    check_serving(captured, la, seed, direct_o, direct_lse, part);
    merge(r, part, "direct run");
  }
  // 2. Capture one forward (global capture mode: the library must make no unsafe call while capturing).
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  {
    Result part;
    if (!cuda_ok(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture", part)) {
      merge(r, part, "capture");
      r.passed = false;
      return r;
    }
    const bool launched = dev.forward(s.stream, part);
    const bool ended = cuda_ok(cudaStreamEndCapture(s.stream, &graph), "cudaStreamEndCapture", part);
    const bool made = launched && ended && cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate", part);
    if (!made) {
      if (graph) cudaGraphDestroy(graph);
      (void)cudaGetLastError();
      merge(r, part, "capture");
      r.passed = false;
      return r;
    }
  }
  // 3. Replay with the captured contents, then 4. with the replayed case's lengths, table and values.
  for (int round = 0; round < 2; ++round) {
    const ServingLayout& L = round == 0 ? la : lb;
    const Case& c = round == 0 ? captured : replayed;
    const uint64_t run_seed = round == 0 ? seed : seed + 1;
    const char* label = round == 0 ? "graph replay" : "graph replay with new lengths / table / inputs";
    Result part;
    part.seed = run_seed;
    const bool ran = (round == 0 || dev.upload(L, s.stream, part)) && dev.poison(L, s.stream, part) &&
                     cuda_ok(cudaGraphLaunch(exec, s.stream), "cudaGraphLaunch", part) &&
                     dev.download(L, s.stream, ho, hlse, part);
    if (!ran) {
      merge(r, part, label);
      r.passed = false;
      break;
    }
    if (round == 0 && (ho != direct_o || std::memcmp(hlse.data(), direct_lse.data(), hlse.size() * 4) != 0)) {
      part.deterministic = false;
      append(part.message, "not bit-identical to the direct run");
    }
    check_serving(c, L, run_seed, ho, hlse, part);
    merge(r, part, label);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return r;
}


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

namespace {

// Case::ring_world: every rank's shard of the global tensors in buffers of its own, run through
// flashcore_ring_attention_simulate; the ranks' O and LSE are put back in the global layout.
class RingShards {
 public:
  bool build(const Case& c, const flashcore_attention_params& global, const std::vector<uint16_t>& hq,
             const std::vector<uint16_t>& hk, const std::vector<uint16_t>& hv, Result& r) {
    flashcore_ring_params_init(&ring_);
    ring_.world_size = c.ring_world;
    ring_.layout = c.ring_layout;
    ring_.seqlen_global = c.seqlen_q;
    const int world = c.ring_world;
    const size_t esize = 2;
    for (int rank = 0; rank < world; ++rank) {
      ranks_.push_back(std::make_unique<Rank>());
      Rank& R = *ranks_.back();
      int64_t s0 = 0, l0 = 0, s1 = 0, l1 = 0;
      if (flashcore_ring_shard(&ring_, rank, &s0, &l0, &s1, &l1) != FLASHCORE_SUCCESS) {
        r.message = std::string("flashcore_ring_shard: ") + flashcore_last_error();
        return false;
      }
      for (int64_t i = 0; i < l0; ++i) R.rows.push_back(s0 + i);
      for (int64_t i = 0; i < l1; ++i) R.rows.push_back(s1 + i);
      const int64_t S = static_cast<int64_t>(R.rows.size());
      R.p = global;
      R.p.seqlen_q = R.p.seqlen_k = S;
      R.p.q_strides = R.p.o_strides = layout_strides(c.layout, S, c.heads_q, c.head_dim);
      R.p.k_strides = R.p.v_strides = layout_strides(c.layout, S, c.heads_kv, c.head_dim);
      R.p.workspace = nullptr, R.p.workspace_size = 0;
      const size_t nq = static_cast<size_t>(c.batch * S * c.heads_q * c.head_dim);
      const size_t nkv = static_cast<size_t>(c.batch * S * c.heads_kv * c.head_dim);
      R.nq = nq;
      R.nlse = static_cast<size_t>(c.batch * c.heads_q * S);
      std::vector<uint16_t> lq(nq), lk(nkv), lv(nkv);
      gather(global.q_strides, R.p.q_strides, c.heads_q, R, hq, lq);
      gather(global.k_strides, R.p.k_strides, c.heads_kv, R, hk, lk);
      gather(global.v_strides, R.p.v_strides, c.heads_kv, R, hv, lv);
      if (!cuda_ok(cudaMalloc(&R.q.ptr, nq * esize), "cudaMalloc(ring q)", r) ||
          !cuda_ok(cudaMalloc(&R.k.ptr, nkv * esize), "cudaMalloc(ring k)", r) ||
          !cuda_ok(cudaMalloc(&R.v.ptr, nkv * esize), "cudaMalloc(ring v)", r) ||
          !cuda_ok(cudaMalloc(&R.o.ptr, nq * esize), "cudaMalloc(ring o)", r) ||
          !cuda_ok(cudaMalloc(&R.lse.ptr, R.nlse * 4), "cudaMalloc(ring lse)", r) ||
          !cuda_ok(cudaMemcpy(R.q.ptr, lq.data(), nq * esize, cudaMemcpyHostToDevice), "cudaMemcpy(ring q)", r) ||
          !cuda_ok(cudaMemcpy(R.k.ptr, lk.data(), nkv * esize, cudaMemcpyHostToDevice), "cudaMemcpy(ring k)", r) ||
          !cuda_ok(cudaMemcpy(R.v.ptr, lv.data(), nkv * esize, cudaMemcpyHostToDevice), "cudaMemcpy(ring v)", r))
        return false;
      R.p.q = R.q.ptr, R.p.k = R.k.ptr, R.p.v = R.v.ptr, R.p.o = R.o.ptr;
      R.p.lse = global.lse != nullptr ? static_cast<float*>(R.lse.ptr) : nullptr;
    }
    for (const auto& R : ranks_) locals_.push_back(&R->p);
    uint64_t bytes = 0;
    if (flashcore_ring_workspace_size(locals_[0], &ring_, &bytes) != FLASHCORE_SUCCESS) {
      r.message = std::string("flashcore_ring_workspace_size: ") + flashcore_last_error();
      return false;
    }
    ws_bytes_ = bytes * static_cast<uint64_t>(world);
    if (ws_bytes_ > 0 && (!cuda_ok(cudaMalloc(&ws_.ptr, ws_bytes_), "cudaMalloc(ring workspace)", r) ||
                          !cuda_ok(cudaMemset(ws_.ptr, 0, ws_bytes_), "cudaMemset(ring workspace)", r)))
      return false;
    ring_.workspace = ws_.ptr;
    ring_.workspace_size = ws_bytes_;
    return true;
  }

  // Poison every rank's O and LSE, run, and put the results in ho / hlse (the global layout).
  bool run(const Case& c, const flashcore_attention_params& global, flashcore_stream_t fstream,
           std::vector<uint16_t>& ho, std::vector<float>& hlse, Result& r) {
    const auto stream = reinterpret_cast<cudaStream_t>(fstream);
    for (const auto& rank : ranks_) {
      Rank& R = *rank;
      if (!cuda_ok(cudaMemsetAsync(R.o.ptr, 0xff, R.nq * 2, stream), "cudaMemsetAsync(ring o)", r) ||
          !cuda_ok(cudaMemsetAsync(R.lse.ptr, 0xff, R.nlse * 4, stream), "cudaMemsetAsync(ring lse)", r))
        return false;
    }
    const flashcore_status fs = flashcore_ring_attention_simulate(locals_.data(), &ring_, fstream);
    if (fs != FLASHCORE_SUCCESS) {
      r.message = std::string("flashcore_ring_attention_simulate: ") + flashcore_status_string(fs) + ": " +
                  flashcore_last_error();
      return false;
    }
    if (!cuda_ok(cudaGetLastError(), "kernel launch", r) ||
        !cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize (ring)", r))
      return false;
    const int64_t Hq = c.heads_q, D = c.head_dim;
    for (const auto& rank : ranks_) {
      const Rank& R = *rank;
      std::vector<uint16_t> lo(R.nq);
      std::vector<float> llse(R.nlse);
      if (!cuda_ok(cudaMemcpy(lo.data(), R.o.ptr, R.nq * 2, cudaMemcpyDeviceToHost), "cudaMemcpy(ring o)", r) ||
          !cuda_ok(cudaMemcpy(llse.data(), R.lse.ptr, R.nlse * 4, cudaMemcpyDeviceToHost), "cudaMemcpy(ring lse)", r))
        return false;
      const int64_t S = static_cast<int64_t>(R.rows.size());
      const auto& gs = global.o_strides;
      const auto& ls = R.p.o_strides;
      for (int64_t b = 0; b < c.batch; ++b)
        for (int64_t i = 0; i < S; ++i) {
          const int64_t g = R.rows[static_cast<size_t>(i)];
          for (int64_t h = 0; h < Hq; ++h) {
            std::memcpy(&ho[static_cast<size_t>(b * gs.batch + g * gs.seq + h * gs.head)],
                        &lo[static_cast<size_t>(b * ls.batch + i * ls.seq + h * ls.head)], static_cast<size_t>(D) * 2);
            if (global.lse != nullptr) {
              hlse[static_cast<size_t>((b * Hq + h) * c.seqlen_q + g)] = llse[static_cast<size_t>((b * Hq + h) * S + i)];
            }
          }
        }
    }
    return true;
  }

 private:
  struct Rank {
    std::vector<int64_t> rows;  // global row of each local row
    flashcore_attention_params p{};
    DeviceBuffer q, k, v, o, lse;
    size_t nq = 0, nlse = 0;
  };

  static void gather(const flashcore_tensor_strides& gs, const flashcore_tensor_strides& ls, int64_t heads,
                     const Rank& R, const std::vector<uint16_t>& global, std::vector<uint16_t>& local) {
    const int64_t S = static_cast<int64_t>(R.rows.size()), D = R.p.head_dim;
    for (int64_t b = 0; b < R.p.batch; ++b)
      for (int64_t i = 0; i < S; ++i)
        for (int64_t h = 0; h < heads; ++h)
          std::memcpy(&local[static_cast<size_t>(b * ls.batch + i * ls.seq + h * ls.head)],
                      &global[static_cast<size_t>(b * gs.batch + R.rows[static_cast<size_t>(i)] * gs.seq + h * gs.head)],
                      static_cast<size_t>(D) * 2);
  }

  flashcore_ring_params ring_{};
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<const flashcore_attention_params*> locals_;
  DeviceBuffer ws_;
  uint64_t ws_bytes_ = 0;
};

}  // namespace

Result run_case_on_stream(const Case& c, uint64_t seed, int repeats, flashcore_stream_t fstream) {
  Result r;
  r.seed = seed;
  if (std::string why = skip_reason_for_device(); !why.empty()) {
    r.skipped = true, r.message = why;
    return r;
  }
  const cudaStream_t stream = reinterpret_cast<cudaStream_t>(fstream);
  if (is_serving(c)) return run_serving(c, seed, repeats, stream);
  const int64_t B = c.batch, Sq = c.seqlen_q, Sk = c.seqlen_k, Hq = c.heads_q, Hkv = c.heads_kv, D = c.head_dim;
  const int64_t DV = c.head_dim_v != 0 ? c.head_dim_v : D;  // V's and O's
  if (B <= 0 || Sq <= 0 || Sk <= 0 || Hq <= 0 || Hkv <= 0 || D <= 0 || DV <= 0 || Hq % Hkv != 0) {
    r.message = "invalid case: " + describe(c);
    return r;
  }
  if (const std::string why = variant_error(c); !why.empty()) {
    r.message = "invalid case: " + why + " (" + describe(c) + ")";
    return r;
  }
  const size_t esize = static_cast<size_t>(flashcore::dtype_size(c.dtype));
  const int64_t nq = B * Sq * Hq * D, nkv = B * Sk * Hkv * D, nlse = B * Hq * Sq;
  const int64_t no = B * Sq * Hq * DV, nv = B * Sk * Hkv * DV;

  DeviceBuffer dq, dk, dv, dout, dlse;
  if (!cuda_ok(cudaMalloc(&dq.ptr, static_cast<size_t>(nq) * esize), "cudaMalloc(q)", r) ||
      !cuda_ok(cudaMalloc(&dk.ptr, static_cast<size_t>(nkv) * esize), "cudaMalloc(k)", r) ||
      !cuda_ok(cudaMalloc(&dv.ptr, static_cast<size_t>(nv) * esize), "cudaMalloc(v)", r) ||
      !cuda_ok(cudaMalloc(&dout.ptr, static_cast<size_t>(no) * esize), "cudaMalloc(o)", r) ||
      (c.with_lse && !cuda_ok(cudaMalloc(&dlse.ptr, static_cast<size_t>(nlse) * sizeof(float)), "cudaMalloc(lse)", r)))
    return r;

  DeviceBuffer dsinks;
  if (!c.sinks.empty()) {
    const size_t bytes = c.sinks.size() * sizeof(float);
    if (!cuda_ok(cudaMalloc(&dsinks.ptr, bytes), "cudaMalloc(sinks)", r) ||
        !cuda_ok(cudaMemcpy(dsinks.ptr, c.sinks.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy(sinks)", r))
      return r;
  }

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
  p.q_strides = layout_strides(c.layout, Sq, Hq, D);
  p.o_strides = layout_strides(c.layout, Sq, Hq, DV);
  p.k_strides = layout_strides(c.layout, Sk, Hkv, D);
  p.v_strides = layout_strides(c.layout, Sk, Hkv, DV);
  p.batch = B, p.seqlen_q = Sq, p.seqlen_k = Sk, p.num_heads_q = Hq, p.num_heads_kv = Hkv, p.head_dim = D;
  p.head_dim_v = c.head_dim_v;
  p.dtype = c.dtype, p.causal = c.causal ? 1 : 0, p.softmax_scale = c.softmax_scale;
  p.kernel_config = c.kernel_config;
  p.num_splits = c.num_splits;
  set_variants(c, p, static_cast<const float*>(dsinks.ptr));

  uint64_t ws_bytes = 0;
  if (!detail::validate_and_size(p, ws_bytes, r)) return r;
  if (c.dtype != FLASHCORE_DTYPE_FP16 && c.dtype != FLASHCORE_DTYPE_BF16) {
    r.message = std::string("check: the harness has no input generator for dtype ") + dtype_name(c.dtype);
    return r;
  }

  // The config's workspace (the dynamic scheduler's tile counter), zero-filled as the ABI requires.
  DeviceBuffer dws;
  if (ws_bytes > 0) {
    if (!cuda_ok(cudaMalloc(&dws.ptr, ws_bytes), "cudaMalloc(workspace)", r) ||
        !cuda_ok(cudaMemset(dws.ptr, 0, ws_bytes), "cudaMemset(workspace)", r))
      return r;
    p.workspace = dws.ptr;
    p.workspace_size = ws_bytes;
  }

  // Inputs: fresh N(0,1) * input_scale, stored in the case's layout (dense in storage order).
  std::vector<uint16_t> hq(static_cast<size_t>(nq)), hk(static_cast<size_t>(nkv)), hv(static_cast<size_t>(nv));
  fill_normal(hq, c.dtype, seed, 0, c.input_scale);
  fill_normal(hk, c.dtype, seed, 1, c.input_scale);
  fill_normal(hv, c.dtype, seed, 2, c.input_scale);
  // Past each sequence's length (a KV cache's unused slots): NaN, which a correct kernel never lets into O or LSE.
  auto keys_of = [&](int64_t b) -> int64_t {
    return c.seqused_k.empty() ? Sk : std::clamp<int64_t>(c.seqused_k[static_cast<size_t>(b)], 0, Sk);
  };
  if (!c.seqused_k.empty()) {
    const uint16_t nan_bits = c.dtype == FLASHCORE_DTYPE_FP16 ? 0x7e00 : 0x7fc0;
    const flashcore_tensor_strides ks = p.k_strides, vs = p.v_strides;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = keys_of(b); j < Sk; ++j)
        for (int64_t h = 0; h < Hkv; ++h) {
          for (int64_t d = 0; d < D; ++d) hk[static_cast<size_t>(b * ks.batch + j * ks.seq + h * ks.head + d)] = nan_bits;
          for (int64_t d = 0; d < DV; ++d) hv[static_cast<size_t>(b * vs.batch + j * vs.seq + h * vs.head + d)] = nan_bits;
        }
  }
  if (!cuda_ok(cudaMemcpy(dq.ptr, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy(q)", r) ||
      !cuda_ok(cudaMemcpy(dk.ptr, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy(k)", r) ||
      !cuda_ok(cudaMemcpy(dv.ptr, hv.data(), hv.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy(v)", r))
    return r;

  // Run (repeats times, poisoning O and LSE with all-ones NaN patterns before every call).
  std::vector<uint16_t> ho(static_cast<size_t>(no)), first_o;
  std::vector<float> hlse(c.with_lse ? static_cast<size_t>(nlse) : 0), first_lse;
  repeats = std::max(1, repeats);
  RingShards ring;
  if (c.ring_world > 0) {
    if (Sq != Sk || !c.seqused_k.empty() || c.kernel_config != nullptr || c.num_splits != 0 || DV != D) {
      r.message = "invalid case: a ring case has seqlen_q = seqlen_k, one head dim and no seqused_k, kernel_config or "
                  "num_splits: " +
                  describe(c);
      return r;
    }
    if (!ring.build(c, p, hq, hk, hv, r)) return r;
  }
  for (int rep = 0; rep < repeats; ++rep) {
    if (c.ring_world > 0) {
      if (!ring.run(c, p, fstream, ho, hlse, r)) return r;
    } else {
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
    }
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
  auto fully_masked = [&](int64_t b, int64_t i) { return ref::visible_key_range(p, Sq, keys_of(b), i).empty(); };
  OutputScan scan;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Sq; ++i)
      for (int64_t h = 0; h < Hq; ++h) {
        for (int64_t d = 0; d < DV; ++d) {
          const uint16_t bits = o_at(b, i, h, d);
          scan.o(bits, to_float(bits), fully_masked(b, i), [&] {
            return "b=" + std::to_string(b) + " row=" + std::to_string(i) + " h=" + std::to_string(h) +
                   " d=" + std::to_string(d);
          });
        }
        if (!c.with_lse) continue;
        scan.lse(first_lse[static_cast<size_t>((b * Hq + h) * Sq + i)], fully_masked(b, i) && c.sinks.empty(), [&] {
          return "b=" + std::to_string(b) + " h=" + std::to_string(h) + " row=" + std::to_string(i);
        });
      }
  scan.report(r);

  // Reference comparison on the selected rows.
  flashcore_attention_params host = p;
  host.q = hq.data(), host.k = hk.data(), host.v = hv.data(), host.o = nullptr, host.lse = nullptr;
  host.seqused_k = c.seqused_k.empty() ? nullptr : c.seqused_k.data();
  host.sinks = c.sinks.empty() ? nullptr : c.sinks.data();  // the reference reads the sinks on the host
  std::vector<int64_t> rows = checked_rows(c, seed);
  const ref::Output exact = ref::attention(host, rows), lowp = ref::attention_lowp(host, rows);
  if (rows.empty()) {
    rows.resize(static_cast<size_t>(Sq));
    for (int64_t i = 0; i < Sq; ++i) rows[static_cast<size_t>(i)] = i;
  }
  r.rows_checked = static_cast<int64_t>(rows.size());
  ErrorTally tally(c);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i : rows) {
        for (int64_t d = 0; d < DV; ++d) {
          const size_t ri = static_cast<size_t>(((b * Sq + i) * Hq + h) * DV + d);
          tally.o(r, to_float(o_at(b, i, h, d)), exact.o[ri], lowp.o[ri], [&] {
            return "b=" + std::to_string(b) + " h=" + std::to_string(h) + " row=" + std::to_string(i) + " d=" +
                   std::to_string(d);
          });
        }
        if (!c.with_lse) continue;
        const size_t li = static_cast<size_t>((b * Hq + h) * Sq + i);
        tally.lse(r, first_lse[li], exact.lse[li], lowp.lse[li]);
      }
  tally.judge(c, scan, r);
  return r;
}

}  // namespace flashcore::check
