// The correctness sweep shared by the GPU test suite and `flashcore check`: one case list, one runner.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "flashcore/flashcore.h"
#include "flashcore/ring.h"

namespace flashcore::check {

enum class Layout { BSHD, BHSD };

struct Case {
  std::string name;
  int64_t batch = 1, seqlen_q = 128, seqlen_k = 128, heads_q = 1, heads_kv = 1, head_dim = 128;
  int64_t head_dim_v = 0;  // V's and O's head dim (flashcore_attention_params::head_dim_v); 0: head_dim
  flashcore_dtype dtype = FLASHCORE_DTYPE_BF16;
  bool causal = false;
  Layout layout = Layout::BSHD;
  float input_scale = 1.0f;    // inputs ~ N(0, 1) * input_scale (30 for the large-magnitude cases)
  float softmax_scale = 0.0f;  // 0 = default 1/sqrt(head_dim)
  bool with_lse = true;
  const char* kernel_config = nullptr;  // a name from flashcore_list_kernel_configs (nullptr: the default)
  // A KV cache's lengths (flashcore_attention_params::seqused_k), one per batch entry; empty: not given. The K/V
  // rows past each length are filled with NaN, which must never reach O or LSE.
  std::vector<int32_t> seqused_k;

  // ---- Serving (flashcore_attention_params' cu_seqlens_q/k, block_table, num_splits). A case using varlen_q,
  // varlen_k or page_size is a "serving case" (is_serving); run_case lays it out as described here. ----
  // Per-sequence query counts (0 allowed): non-empty = packed variable-length Q and O, (total_q, heads_q, head_dim)
  // (BSHD layout: rows of heads_q * head_dim; BHSD: (heads_q, total_q, head_dim)), cu_seqlens_q built from them,
  // total_q = their sum (> 0), LSE (heads_q, total_q). batch must equal their count. params.seqlen_q is the longest
  // count, or seqlen_q when that is larger (a loose bound; set seqlen_q = 1 for the tight one). The packed tensors'
  // batch strides (ignored by the library) are passed as the whole tensor's size.
  std::vector<int32_t> varlen_q;
  // The same for K and V (packed (total_k, heads_kv, head_dim), cu_seqlens_k; params.seqlen_k = max(longest,
  // seqlen_k)). With seqused_k, sequence b uses min(seqused_k[b], varlen_k[b]) keys. Not with page_size.
  std::vector<int32_t> varlen_k;
  // > 0: a paged KV cache of pages of page_size rows. Sequence b's logical K/V (seqlen_k rows, of which the first
  // seqused_k[b] -- all seqlen_k without seqused_k -- are used) lie in pages of a pool (num_pages, page_size, heads_kv,
  // head_dim) in a random (seeded) order; block_table is (batch, stride). The entries past each sequence's used pages
  // are garbage (-1, ids past num_pages, ids of NaN pages); pool pages no sequence uses, and the rows past each
  // sequence's length in its last page, are NaN; the pool has a few NaN pages nobody references. Q is dense
  // (batch, seqlen_q, heads_q, head_dim), or packed with varlen_q (chunked prefill).
  int page_size = 0;
  // With page_size: block_table row stride passed to the library; 0 = pass 0 (the library's default, exactly
  // ceil(seqlen_k / page_size)); larger values leave extra (garbage) columns in every row.
  int64_t block_table_stride = 0;
  // flashcore_attention_params::num_splits (0: the library's choice; 1: never split; n: at most n parts).
  int num_splits = 0;

  // ---- Attention variants (flashcore_attention_params' local, window_size_left / _right, softcap, sinks,
  // attention_chunk; ABI 0.5), passed as they are to the library and to the reference (dense and serving cases, not
  // ring ones). Rows a variant leaves without a key must give O = 0 and LSE = -inf, or LSE = sinks[h] with sinks
  // (checked against the reference like any LSE). ----
  bool local = false;                         // sliding window (FlashAttention's window_size)
  int32_t window_left = 0, window_right = 0;  // read with local: -1 unbounded, else keys left / right of the diagonal
  float softcap = 0.0f;                       // > 0: scores become softcap * tanh(s / softcap)
  std::vector<float> sinks;                   // one sink logit per query head (heads_q entries); empty: none
  int32_t attention_chunk = 0;                // > 0: a query sees the keys of its own chunk of that many keys only

  // > 0: ring attention over ring_world simulated ranks (flashcore_ring_attention_simulate) instead of one forward
  // call: the global Q, K, V (seqlen_q = seqlen_k) are cut into the ranks' shards under ring_layout, each rank's O and
  // LSE are put back in place, and the result is judged against the reference like any case. Dense cases only.
  int ring_world = 0;
  flashcore_ring_layout ring_layout = FLASHCORE_RING_ZIGZAG;
};

// True when the case uses varlen_q, varlen_k or page_size.
bool is_serving(const Case& c);
// True when the case sets a variant field (local, softcap, sinks, attention_chunk).
bool has_variant(const Case& c);
// The case's mask (causal, the window, attention_chunk; softcap too, no sinks) in otherwise default params, as
// reference::visible_key_range reads it: the keys each row sees.
flashcore_attention_params mask_of(const Case& c);

// The list. `quick` = a small subset for sanitizers/smoke runs (every dtype x head dim x causal, small
// shapes). The full list covers the GPU-suite requirements of issue #3.
std::vector<Case> cases(bool quick);

// "B,H,S,D[,Hkv[,Sk]]" -> Case, with dtype and causal given. Returns false and sets err on a bad string.
bool parse_shape(const std::string& text, Case& out, std::string& err);

struct Result {
  bool passed = false;
  bool skipped = false;      // e.g. no device / not compiled in
  double o_err = 0, o_tol = 0;      // max |O - ref|; the bound at the element nearest to failing
  double lse_err = 0, lse_tol = 0;  // max |LSE - ref| over finite entries and the bound
  double lowp_o_err = 0;            // the low-precision yardstick's own error
  bool nonfinite = false;    // NaN/Inf in output where the reference is finite
  bool unwritten = false;    // an output element kept its poison value
  bool deterministic = true; // bit-identical over the requested repeats
  std::string message;       // why it failed / was skipped ("" when it passed)
  // Extensions (appended; older fields unchanged):
  double lowp_lse_err = 0;   // the yardstick's own relative LSE error
  int64_t rows_checked = 0;  // query rows compared against the reference per (batch, head); serving cases: per head,
                             // summed over the sequences
  uint64_t seed = 0;         // the seed the inputs came from (to reproduce a failure)
  bool out_of_bounds_write = false;  // serving cases: an O / LSE guard element (outside the tensor) was written
};

// Allocate device buffers, fill fresh random inputs (seed), poison O and LSE with NaN before every call,
// run flashcore_attention_forward, compare against the float64 reference (on a sample of rows when the
// problem is large), and, when repeats > 1, check bit-exact determinism over `repeats` runs.
//
// Tolerances (see check.cpp): |O - O_ref| <= 2 * lowp_o_err + atol * max(1, |O_ref|) at every element (atol
// 1e-3 fp16, 4e-3 bf16), where lowp_o_err is the error of reference::attention_lowp(); lse_err (relative to
// max(1, |ref|)) <= 2 * lowp_lse_err + 1e-3.
// Skipped (skipped = true, message = reason) without an sm_90 device, or when flashcore_attention_validate
// reports the (dtype, head_dim) as not compiled in. Runs on a private non-blocking stream.
//
// Serving cases (is_serving): the reference runs per sequence (a batch-1 problem of that sequence's rows), every
// query row of every sequence must be written (O = 0 / LSE = -inf where a row sees no key), and O, LSE, Q, K and V
// are allocated with 64 guard rows (LSE: 256 guard floats) on both sides of the tensor: O's and LSE's guards keep
// their NaN poison or the case fails (nothing may be written outside the tensor), Q's and K/V's are NaN (nothing
// outside them may reach O or LSE). lse_capacity is passed exactly. num_splits is passed for every case.
Result run_case(const Case& c, uint64_t seed, int repeats = 1);

// The same, enqueued on `stream` (nullptr = the legacy default stream), which the caller owns.
Result run_case_on_stream(const Case& c, uint64_t seed, int repeats, flashcore_stream_t stream);

// The query rows run_case compares against the reference (for every batch and head): empty = all rows,
// used when Sq * Sk <= 256 * 256 or Sq <= 64; otherwise 64 rows (a few more with a variant): 0, 1, Sq-2, Sq-1, the
// 64-row tile edges 63/64, 127/128, 191/192, 255/256, the edges of the last tile, the first rows that see a key
// (causal, Sq > Sk), with a window the first rows whose window lies wholly among the keys, with attention_chunk the
// rows on either side of the first chunk boundaries, and random rows drawn from `seed`.
// Serving cases take this per sequence, from a batch-1 case of that sequence's query count and keys used.
std::vector<int64_t> checked_rows(const Case& c, uint64_t seed);

// CUDA-graph replay of a serving case: lays out `captured` (as run_case does), runs it once directly (checked), captures
// one flashcore_attention_forward into a CUDA graph, replays it (checked), then overwrites the device inputs, the
// cu_seqlens / seqused_k arrays and the block table in place with `replayed`'s (new lengths, a new page order, new
// values; seed + 1), replays the same graph and checks it against a fresh reference. Both cases must have the same
// buffer sizes: the same mode, dtype, head_dim, heads, batch, causal, layout, page_size, block_table_stride,
// num_splits, with_lse, params.seqlen_q / seqlen_k (make them loose bounds) and total_q / total_k (the same sums);
// the pool gets the larger page count of the two. The capture uses cudaStreamCaptureModeGlobal on a private
// non-blocking stream (after the direct run, so lazy initialisation is done). Result messages say which run failed;
// the graph replay of the captured contents must also be bit-identical to the direct run.
Result run_graph_replay(const Case& captured, const Case& replayed, uint64_t seed);

// Why GPU cases cannot run here ("" when an sm_90 device is present), e.g. "no CUDA device (...)".
std::string device_skip_reason();

std::string describe(const Case& c);  // one line, e.g. "bf16 B=2 Hq=8 Hkv=2 Sq=113 Sk=4097 D=128 causal bshd"
                                      // (variants: " window=(16,-1) softcap=30 sinks attention_chunk=64")

}  // namespace flashcore::check
