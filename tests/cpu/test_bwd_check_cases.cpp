// The backward's case list (src/check/check_bwd.h; no device needed): it covers the backward's v1 scope and the
// variants (ABI 0.6: window, softcap, sinks), stays affordable for the float64 reference, its names are unique and
// carry the forward's variant suffixes (what `flashcore check --filter` selects), and every variant case passes the
// library's own argument checks (forward and backward, on host buffers standing in for device memory, as
// test_backward_validation.cpp does).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "api/backend.h"
#include "check/check_bwd.h"
#include "cpu/validation_util.h"
#include "reference/reference.h"

namespace check = flashcore::check;
namespace bwd = flashcore::check::bwd;

namespace {

template <typename Pred>
bool any(const std::vector<check::Case>& list, Pred pred) {
  return std::any_of(list.begin(), list.end(), pred);
}

bool fully_masked_rows(const check::Case& c) { return c.causal && c.seqlen_q > c.seqlen_k; }

// Query rows of the case that see no key under its mask (causal and the window), as the reference states it.
int64_t rows_without_keys(const check::Case& c) {
  const flashcore_attention_params p = check::mask_of(c);
  int64_t n = 0;
  for (int64_t i = 0; i < c.seqlen_q; ++i) n += flashcore::reference::visible_key_range(p, c.seqlen_q, c.seqlen_k, i).empty();
  return n;
}

bool window_only(const check::Case& c) { return c.local && c.softcap == 0.0f && c.sinks.empty(); }
bool softcap_only(const check::Case& c) { return !c.local && c.softcap > 0.0f && c.sinks.empty(); }
bool sinks_only(const check::Case& c) { return !c.local && c.softcap == 0.0f && !c.sinks.empty(); }
int variant_kinds(const check::Case& c) { return int{c.local} + int{c.softcap > 0.0f} + int{!c.sinks.empty()}; }

// The cases `flashcore check --filter text` keeps (tools/flashcore/check_cmd.cpp: the name or the description holds
// the text; backward items are described as "backward " + describe()).
std::vector<std::string> filtered(const std::vector<check::Case>& list, const std::string& text) {
  std::vector<std::string> kept;
  for (const auto& c : list)
    if (c.name.find(text) != std::string::npos || ("backward " + check::describe(c)).find(text) != std::string::npos)
      kept.push_back(c.name);
  return kept;
}

// A case's backward call on host buffers (the argument checks touch no device memory): the forward's fields, the
// case's mask, softcap and sinks (check::mask_of), and the gradients (dsinks with sinks). layout: the status of
// setting the case's contiguous strides.
struct HostCall {
  using HostBuffer = flashcore::test::HostBuffer;
  explicit HostCall(const check::Case& c)
      : q(bytes(c, c.seqlen_q, c.heads_q)), k(bytes(c, c.seqlen_k, c.heads_kv)), v(bytes(c, c.seqlen_k, c.heads_kv)),
        o(bytes(c, c.seqlen_q, c.heads_q)), dout(bytes(c, c.seqlen_q, c.heads_q)), dq(bytes(c, c.seqlen_q, c.heads_q)),
        dk(bytes(c, c.seqlen_k, c.heads_kv)), dv(bytes(c, c.seqlen_k, c.heads_kv)),
        lse(c.batch * c.heads_q * c.seqlen_q * 4), sinks(c.heads_q * 4), dsinks(c.heads_q * 4), p(check::mask_of(c)) {
    p.q = q.data(), p.k = k.data(), p.v = v.data(), p.o = o.data(), p.lse = reinterpret_cast<float*>(lse.data());
    p.batch = c.batch, p.seqlen_q = c.seqlen_q, p.seqlen_k = c.seqlen_k, p.num_heads_q = c.heads_q;
    p.num_heads_kv = c.heads_kv, p.head_dim = c.head_dim, p.dtype = c.dtype, p.softmax_scale = c.softmax_scale;
    p.head_dim_v = c.head_dim_v;  // (V, O, dO and dV then have fewer columns than the buffers hold)
    p.sinks = c.sinks.empty() ? nullptr : reinterpret_cast<const float*>(sinks.data());
    layout = flashcore_attention_params_set_contiguous(&p, c.layout == check::Layout::BHSD ? 1 : 0);
  }
  // The backward's outputs (after a validate of the forward's fields, if wanted).
  void add_gradients(const check::Case& c) {
    p.dout = dout.data(), p.dq = dq.data(), p.dk = dk.data(), p.dv = dv.data();
    p.dsinks = c.sinks.empty() ? nullptr : reinterpret_cast<float*>(dsinks.data());
  }
  bool untouched() const {
    return dq.untouched() && dk.untouched() && dv.untouched() && dsinks.untouched() && o.untouched() &&
           lse.untouched();
  }
  static size_t bytes(const check::Case& c, int64_t rows, int64_t heads) {
    return static_cast<size_t>(c.batch * rows * heads * c.head_dim * 2);
  }

  HostBuffer q, k, v, o, dout, dq, dk, dv, lse, sinks, dsinks;
  flashcore_attention_params p;
  flashcore_status layout = FLASHCORE_SUCCESS;
};

}  // namespace

TEST(BwdCheckCases, FullListCoversTheBackwardScope) {
  const auto list = bwd::cases(false);
  for (int64_t S : {1, 17, 64, 65, 128, 129, 1000, 2048})
    for (auto dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16})
      for (int64_t D : {64, 128})
        for (bool causal : {false, true})
          EXPECT_TRUE(any(list, [&](const check::Case& c) {
            return c.seqlen_q == S && c.seqlen_k == S && c.dtype == dt && c.head_dim == D && c.causal == causal;
          })) << "S=" << S << " dtype " << dt << " D=" << D << " causal=" << causal;
  for (bool causal : {false, true}) {
    EXPECT_TRUE(any(list, [&](const check::Case& c) { return c.causal == causal && c.seqlen_q < c.seqlen_k; }));
    EXPECT_TRUE(any(list, [&](const check::Case& c) { return c.causal == causal && c.seqlen_q > c.seqlen_k; }));
  }
  EXPECT_TRUE(any(list, fully_masked_rows));
  for (int64_t ratio : {2, 8})
    EXPECT_TRUE(any(list, [&](const check::Case& c) { return c.heads_kv > 1 && c.heads_q / c.heads_kv == ratio; }))
        << "GQA ratio " << ratio;
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.heads_kv == 1 && c.heads_q > 1; })) << "MQA";
  for (auto layout : {check::Layout::BSHD, check::Layout::BHSD})
    EXPECT_TRUE(any(list, [&](const check::Case& c) { return c.layout == layout; }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.batch == 7; }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.softmax_scale != 0.0f; }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.input_scale != 1.0f; }));
  for (const auto& c : list) {
    // The backward's head dims (96, 192, (192, 128) and 256: the sm90 backend's).
    EXPECT_TRUE(c.head_dim == 64 || c.head_dim == 96 || c.head_dim == 128 || c.head_dim == 192 || c.head_dim == 256)
        << c.name;
    EXPECT_TRUE(c.head_dim_v == 0 || (c.head_dim == 192 && c.head_dim_v == 128)) << c.name;
    EXPECT_TRUE(c.with_lse && !check::is_serving(c) && c.ring_world == 0 && c.seqused_k.empty()) << c.name;
    if (!c.sinks.empty()) {
      EXPECT_EQ(static_cast<int64_t>(c.sinks.size()), c.heads_q) << c.name;
    }
  }
}

TEST(BwdCheckCases, FullListCoversTheVariants) {
  const auto list = bwd::cases(false);
  // Windows: (0, 0) and (1, 0) causal and not; left-only; right-only non-causal; both bounds; a left bound past every
  // key; causal + a left bound; with GQA and MQA; rows that see no key because of the window alone.
  for (bool causal : {false, true}) {
    EXPECT_TRUE(any(list, [&](const check::Case& c) {
      return c.local && c.causal == causal && c.window_left == 0 && (causal || c.window_right == 0);
    })) << "window (0, 0), causal=" << causal;
    EXPECT_TRUE(any(list, [&](const check::Case& c) {
      return c.local && c.causal == causal && c.window_left == 1 && (causal || c.window_right == 0);
    })) << "window (1, 0), causal=" << causal;
    EXPECT_TRUE(any(list, [&](const check::Case& c) {
      return c.local && c.causal == causal && c.window_left > c.seqlen_k;
    })) << "a left bound past every key, causal=" << causal;
  }
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.local && !c.causal && c.window_left > 0 && c.window_right == -1; }))
      << "left-only";
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.local && !c.causal && c.window_left == -1 && c.window_right > 0; }))
      << "right-only, non-causal";
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.local && !c.causal && c.window_left > 0 && c.window_right > 0; }))
      << "both bounds";
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.local && c.causal && c.window_left > 0; })) << "causal + left";
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.local && c.heads_kv > 1 && c.heads_q / c.heads_kv == 4; }))
      << "a window with GQA 4";
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.local && c.heads_kv == 1 && c.heads_q > 1; })) << "MQA window";
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.local && !c.causal && rows_without_keys(c) > 0; }))
      << "non-causal rows that see no key (the window's)";
  for (bool longer_q : {false, true})
    EXPECT_TRUE(any(list, [&](const check::Case& c) {
      return check::has_variant(c) && (longer_q ? c.seqlen_q > c.seqlen_k : c.seqlen_q < c.seqlen_k);
    })) << "a variant with Sq " << (longer_q ? ">" : "<") << " Sk";
  // softcap 30 alone (on plain inputs and on inputs * 3, past tanh's linear range) and with a window.
  EXPECT_TRUE(any(list, [](const check::Case& c) { return softcap_only(c) && c.softcap == 30.0f && c.input_scale == 1.0f; }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return softcap_only(c) && c.softcap == 30.0f && c.input_scale > 1.0f; }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.softcap == 30.0f && c.local && c.sinks.empty(); }));
  // sinks alone (causal and not), with a window, with rows that see no key (causal Sq > Sk, and window (0, 0) with
  // Sq > Sk), with GQA, with batch > 1.
  for (bool causal : {false, true})
    EXPECT_TRUE(any(list, [&](const check::Case& c) { return sinks_only(c) && c.causal == causal; })) << causal;
  EXPECT_TRUE(any(list, [](const check::Case& c) { return !c.sinks.empty() && c.local && c.softcap == 0.0f; }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return !c.sinks.empty() && fully_masked_rows(c); }));
  EXPECT_TRUE(any(list, [](const check::Case& c) {
    return !c.sinks.empty() && c.local && c.window_left == 0 && (c.causal || c.window_right == 0) &&
           c.seqlen_q > c.seqlen_k;
  })) << "sinks, window (0, 0), Sq > Sk";
  EXPECT_TRUE(any(list, [](const check::Case& c) { return !c.sinks.empty() && c.heads_kv < c.heads_q; }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return !c.sinks.empty() && c.batch > 1; }));
  // All three together; both layouts; every dtype x head dim with a variant, and with each kind.
  EXPECT_TRUE(any(list, [](const check::Case& c) { return variant_kinds(c) == 3; }));
  for (auto layout : {check::Layout::BSHD, check::Layout::BHSD})
    EXPECT_TRUE(any(list, [&](const check::Case& c) { return check::has_variant(c) && c.layout == layout; }));
  for (auto dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16})
    for (int64_t D : {64, 128}) {
      auto is = [&](const check::Case& c) { return c.dtype == dt && c.head_dim == D; };
      EXPECT_TRUE(any(list, [&](const check::Case& c) { return is(c) && c.local; })) << "window, dtype " << dt << " D=" << D;
      EXPECT_TRUE(any(list, [&](const check::Case& c) { return is(c) && !c.sinks.empty(); }))
          << "sinks, dtype " << dt << " D=" << D;
    }
  for (auto dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16})
    EXPECT_TRUE(any(list, [&](const check::Case& c) { return c.dtype == dt && c.softcap > 0; })) << "softcap, dtype " << dt;
  for (int64_t D : {64, 128})
    EXPECT_TRUE(any(list, [&](const check::Case& c) { return c.head_dim == D && c.softcap > 0; })) << "softcap, D=" << D;
  // attention_chunk (0.6.1): causal and not, with Sq > Sk, with a window, with softcap and sinks, past every key.
  for (bool causal : {false, true})
    EXPECT_TRUE(any(list, [&](const check::Case& c) { return c.attention_chunk > 0 && c.causal == causal; })) << causal;
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.attention_chunk > 0 && c.seqlen_q > c.seqlen_k; }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.attention_chunk > 0 && c.local; }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.attention_chunk > 0 && c.softcap > 0 && !c.sinks.empty(); }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.attention_chunk >= c.seqlen_k; }));
}

TEST(BwdCheckCases, QuickListIsSmall) {
  const auto quick = bwd::cases(true);
  EXPECT_GE(quick.size(), 16u);
  EXPECT_LE(quick.size(), 32u);
  for (auto dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16})
    for (int64_t D : {64, 128})
      for (bool causal : {false, true})
        EXPECT_TRUE(any(quick, [&](const check::Case& c) {
          return c.dtype == dt && c.head_dim == D && c.causal == causal && c.seqlen_q % 2 == 1;
        })) << "dtype " << dt << " D=" << D << " causal=" << causal;
  for (const auto& c : quick) EXPECT_LE(c.batch * c.heads_q * c.seqlen_q * c.seqlen_k, 64 * 1024) << c.name;
  EXPECT_TRUE(any(quick, fully_masked_rows));
  // Head dim 256 (the sm90 backend's wide kernel), both dtypes and masks, GQA, Sq != Sk.
  for (auto dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16})
    for (bool causal : {false, true})
      EXPECT_TRUE(any(quick, [&](const check::Case& c) {
        return c.dtype == dt && c.head_dim == 256 && c.causal == causal && c.heads_q > c.heads_kv &&
               c.seqlen_q != c.seqlen_k;
      })) << "dtype " << dt << " D=256 causal=" << causal;
  // Head dims 96, 192 and (192, 128) (the sm90 backend's), causal and not, GQA.
  for (int64_t pair : {96, 192, 192128})
    for (bool causal : {false, true})
      EXPECT_TRUE(any(quick, [&](const check::Case& c) {
        const int64_t d = pair == 192128 ? 192 : pair, dv = pair == 192128 ? 128 : 0;
        return c.head_dim == d && c.head_dim_v == dv && c.causal == causal && c.heads_q > c.heads_kv;
      })) << "pair " << pair << " causal=" << causal;
}

TEST(BwdCheckCases, QuickListHasFourVariantCases) {
  // One window, one softcap, one sinks, one combination: each kind's code path in a smoke run, no more.
  const auto quick = bwd::cases(true);
  std::vector<check::Case> variants;
  for (const auto& c : quick)
    if (check::has_variant(c)) variants.push_back(c);
  ASSERT_EQ(variants.size(), 4u);
  EXPECT_EQ(std::count_if(variants.begin(), variants.end(), window_only), 1);
  EXPECT_EQ(std::count_if(variants.begin(), variants.end(), softcap_only), 1);
  EXPECT_EQ(std::count_if(variants.begin(), variants.end(), sinks_only), 1);
  EXPECT_EQ(std::count_if(variants.begin(), variants.end(), [](const check::Case& c) { return variant_kinds(c) >= 2; }), 1);
  // The sinks and the combination reach rows that see no key (dQ = 0 there, LSE = the sink).
  for (const auto& c : variants) {
    if (!c.sinks.empty()) {
      EXPECT_GT(rows_without_keys(c), 0) << c.name;
    }
  }
  for (const auto& c : variants) EXPECT_EQ(c.attention_chunk, 0) << c.name;
}

TEST(BwdCheckCases, FilterSelectsTheVariants) {
  // The forward's suffixes: _win<L>x<R> (R = 0 with causal, inf for -1), _cap<C>, _sinks; --filter _win / _cap /
  // _sinks keep exactly the cases with a window / softcap / sinks.
  for (bool quick : {false, true}) {
    const auto list = bwd::cases(quick);
    std::vector<std::string> win, cap, sinks;
    for (const auto& c : list) {
      if (c.local) win.push_back(c.name);
      if (c.softcap > 0) cap.push_back(c.name);
      if (!c.sinks.empty()) sinks.push_back(c.name);
    }
    EXPECT_FALSE(win.empty());
    EXPECT_FALSE(cap.empty());
    EXPECT_FALSE(sinks.empty());
    EXPECT_EQ(filtered(list, "_win"), win) << "quick=" << quick;
    EXPECT_EQ(filtered(list, "_cap"), cap) << "quick=" << quick;
    EXPECT_EQ(filtered(list, "_sinks"), sinks) << "quick=" << quick;
  }
  // The exact forms.
  check::Case c;
  c.dtype = FLASHCORE_DTYPE_BF16, c.head_dim = 64, c.heads_q = c.heads_kv = 2, c.seqlen_q = c.seqlen_k = 65;
  auto name_of = [](const check::Case& x) {
    for (const auto& y : bwd::cases(false))
      if (y.local == x.local && y.window_left == x.window_left && y.window_right == x.window_right &&
          y.causal == x.causal && y.softcap == x.softcap && y.sinks.empty() == x.sinks.empty())
        return y.name;
    return std::string();
  };
  c.local = true, c.window_left = 16, c.window_right = -1, c.causal = false;
  EXPECT_NE(name_of(c).find("_win16xinf"), std::string::npos) << name_of(c);
  c.window_left = -1, c.window_right = 16;
  EXPECT_NE(name_of(c).find("_wininfx16"), std::string::npos) << name_of(c);
  c.window_left = 16, c.window_right = -1, c.causal = true;  // causal: the right bound is 0 whatever it says
  EXPECT_NE(name_of(c).find("_win16x0"), std::string::npos) << name_of(c);
  for (const auto& x : bwd::cases(false)) {
    if (x.softcap == 30.0f) {
      EXPECT_NE(x.name.find("_cap30"), std::string::npos) << x.name;
    }
    if (!x.sinks.empty()) {
      EXPECT_NE(x.name.find("_sinks"), std::string::npos) << x.name;
    }
  }
}

// Every variant case (full and quick) passes the library's argument checks, forward (flashcore_attention_validate)
// and backward (flashcore_attention_backward with dsinks when the case has sinks), on host buffers: the call then
// fails only at the device checks (NO_DEVICE here; with a GPU, "host memory"). A case whose (dtype, head_dim) this
// build has no backward for is checked at a compiled one (its shape, layout and variant unchanged), and at its own
// (dtype, head_dim) must get UNSUPPORTED_HEAD_DIM / _DTYPE, which the runner reports as skipped.
TEST(BwdCheckCases, VariantCasesPassTheLibrarysValidation) {
  flashcore_dtype compiled_dt = FLASHCORE_DTYPE_BF16;
  int compiled_d = 0;
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16})
    for (int d : {64, 128})
      if (compiled_d == 0 && flashcore::backend::backward_compiled(dt, d)) compiled_dt = dt, compiled_d = d;
  if (compiled_d == 0) GTEST_SKIP() << "this build compiled no backward (fp16 / bf16, head_dim 64 or 128)";
  using flashcore::test::HostBuffer;
  auto passed_argument_checks = [](flashcore_status st, const std::string& message) {
    return st == FLASHCORE_ERROR_NO_DEVICE || st == FLASHCORE_ERROR_UNSUPPORTED_ARCH || st == FLASHCORE_ERROR_CUDA ||
           (st == FLASHCORE_ERROR_INVALID_ARGUMENT && message.find("host memory") != std::string::npos);
  };
  int checked = 0, substituted = 0;
  for (bool quick : {false, true})
    for (check::Case c : bwd::cases(quick)) {
      if (!check::has_variant(c)) continue;
      SCOPED_TRACE(c.name);
      if (!flashcore::backend::backward_compiled(c.dtype, static_cast<int>(c.head_dim), static_cast<int>(c.head_dim_v),
                                                 true)) {
        ++substituted;
        c.dtype = compiled_dt, c.head_dim = compiled_d, c.head_dim_v = 0;
      }
      HostCall call(c);
      flashcore_attention_params& p = call.p;
      ASSERT_EQ(call.layout, FLASHCORE_SUCCESS) << flashcore_last_error();
      EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << "forward: " << flashcore_last_error();

      call.add_gradients(c);
      uint64_t bytes = 0;
      const bool known = flashcore_attention_backward_workspace_size(&p, &bytes) == FLASHCORE_SUCCESS;
      // Unknown without a device: generous (the header's estimate x 4 + 1 MiB); a GPU-less call never compares it.
      if (!known) bytes = static_cast<uint64_t>((4 * c.head_dim + 8) * c.batch * c.heads_q * c.seqlen_q * 4 + (1 << 20));
      HostBuffer workspace(bytes);
      p.workspace = workspace.data(), p.workspace_size = bytes;
      const flashcore_status st = flashcore_attention_backward(&p, nullptr);
      const std::string message = flashcore_last_error();
      EXPECT_TRUE(passed_argument_checks(st, message)) << "backward: " << flashcore_status_string(st) << ": " << message;
      EXPECT_TRUE(call.untouched());
      ++checked;
    }
  // A control: the same checks refuse a bad window bound, so passing them above means something.
  {
    check::Case c = bwd::cases(true).back();
    c.dtype = compiled_dt, c.head_dim = compiled_d;
    HostCall call(c);
    ASSERT_EQ(call.layout, FLASHCORE_SUCCESS);
    call.add_gradients(c);
    flashcore_attention_params& p = call.p;
    p.local = 1, p.window_size_left = -2, p.window_size_right = 4;
    const flashcore_status st = flashcore_attention_backward(&p, nullptr);
    EXPECT_EQ(st, FLASHCORE_ERROR_INVALID_ARGUMENT) << flashcore_status_string(st) << ": " << flashcore_last_error();
  }
  std::printf("%d variant cases checked (%d at the compiled dtype %d / head_dim %d instead of their own)\n", checked,
              substituted, static_cast<int>(compiled_dt), compiled_d);
  EXPECT_GT(checked, 20);
}

TEST(BwdCheckCases, UncompiledHeadDimIsRefusedAsTheRunnerSkips) {
  // The runner skips a case the library answers with UNSUPPORTED_HEAD_DIM / _DTYPE: make sure a variant does not
  // change that status into another (which would fail the case in a minimal build).
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16})
    for (int d : {64, 128}) {
      if (flashcore::backend::backward_compiled(dt, d)) continue;
      for (const auto& c : bwd::cases(true)) {
        if (!check::has_variant(c) || c.dtype != dt || c.head_dim != d) continue;
        SCOPED_TRACE(c.name);
        HostCall call(c);
        ASSERT_EQ(call.layout, FLASHCORE_SUCCESS);
        call.add_gradients(c);
        uint64_t bytes = 0;
        const flashcore_status st = flashcore_attention_backward_workspace_size(&call.p, &bytes);
        EXPECT_TRUE(st == FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM || st == FLASHCORE_ERROR_UNSUPPORTED_DTYPE)
            << flashcore_status_string(st) << ": " << flashcore_last_error();
      }
    }
}

TEST(BwdCheckCases, NamesAreUniqueAndSafe) {
  for (bool quick : {false, true}) {
    std::set<std::string> names;
    for (const auto& c : bwd::cases(quick)) {
      EXPECT_EQ(c.name.rfind("bwd_", 0), 0u) << c.name;
      EXPECT_TRUE(names.insert(c.name).second) << "duplicate name " << c.name;
      for (char ch : c.name) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_') << c.name;
      EXPECT_EQ(c.heads_q % c.heads_kv, 0) << c.name;
    }
  }
}

TEST(BwdCheckCases, FullListIsAffordable) {
  // The float64 reference does every (query, key) pair of every query head, about 5 multiply-adds per head_dim
  // element each (bwd::reference_macs). Budget: about a minute on 16 cores.
  double macs = 0;
  for (const auto& c : bwd::cases(false)) macs += bwd::reference_macs(c);
  std::printf("backward list: %zu cases, %.3g reference multiply-adds\n", bwd::cases(false).size(), macs);
  EXPECT_LT(macs, 5e10);
  double variant_macs = 0;
  int variants = 0;
  for (const auto& c : bwd::cases(false))
    if (check::has_variant(c)) variant_macs += bwd::reference_macs(c), ++variants;
  std::printf("of which %d variant cases, %.3g reference multiply-adds\n", variants, variant_macs);
  // A window counts only the keys its rows see: (0, 0) on a square problem is one key a row.
  check::Case c;
  c.seqlen_q = c.seqlen_k = 1000, c.head_dim = 64, c.local = true;
  EXPECT_DOUBLE_EQ(bwd::reference_macs(c), 5.0 * 1000 * 64);
  c.sinks = {0.0f};
  EXPECT_DOUBLE_EQ(bwd::reference_macs(c), 7.0 * 1000 * 64);
  c.softcap = 30.0f;
  EXPECT_DOUBLE_EQ(bwd::reference_macs(c), 8.0 * 1000 * 64);
}

TEST(BwdCheckCases, Tolerances) {
  EXPECT_LT(bwd::tolerance(FLASHCORE_DTYPE_FP16), bwd::tolerance(FLASHCORE_DTYPE_BF16));
  EXPECT_GT(bwd::tolerance(FLASHCORE_DTYPE_FP16), 0.0);
  EXPECT_LT(bwd::tolerance(FLASHCORE_DTYPE_BF16), 0.05);  // a wrong mask or a dropped key block is ~0.1 .. 1
  // dsinks: one rounding of the O the forward stored, 2^-8 (bf16) / 2^-11 (fp16) of each term.
  EXPECT_EQ(bwd::dsinks_o_rounding(FLASHCORE_DTYPE_BF16), 1.0 / 256);
  EXPECT_EQ(bwd::dsinks_o_rounding(FLASHCORE_DTYPE_FP16), 1.0 / 2048);
  // softcap: + half of tanh.approx's 2^-11 of the largest capped score; nothing without one.
  for (auto dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16}) {
    EXPECT_EQ(bwd::softcap_tolerance(dt, 0.0), bwd::tolerance(dt));
    EXPECT_DOUBLE_EQ(bwd::softcap_tolerance(dt, 30.0), bwd::tolerance(dt) + 15.0 / 2048);
  }
  EXPECT_LT(bwd::softcap_tolerance(FLASHCORE_DTYPE_BF16, 30.0), 0.05);
}

TEST(BwdCheckCases, InvalidSinksSizeIsAnInvalidCase) {
  // Without a device the runner skips first; the size check is in run_case_on_stream after it. What is checked here:
  // the list itself never has a wrong size (FullListCoversTheBackwardScope), and a case with one is not run as is.
  check::Case c;
  c.heads_q = c.heads_kv = 4, c.head_dim = 64, c.sinks = {0.0f, 1.0f};
  const bwd::Result r = bwd::run_case(c, 1);
  EXPECT_FALSE(r.passed);
  if (!r.skipped) {
    EXPECT_NE(r.message.find("sinks has 2 entries"), std::string::npos) << r.message;
  }
}
