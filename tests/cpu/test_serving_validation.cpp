// Argument validation of the serving fields (flashcore.h: cu_seqlens_q / cu_seqlens_k with total_q / total_k,
// block_table with block_table_stride / page_size / num_pages, num_splits, flags), without a GPU: every error's
// status and a message naming the argument, O / LSE untouched, and the valid combinations accepted, with the packed
// and paged extents (Q/O of total_q rows, K/V of num_pages pages, LSE of num_heads_q * total_q floats).
// Host buffers stand in for device memory: validation does no device work, and every failing call fails before any.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "api/backend.h"
#include "cpu/validation_util.h"
#include "flashcore/flashcore.h"

namespace {

using flashcore::test::Compiled;
using flashcore::test::first_compiled;
using flashcore::test::HostBuffer;

// Three sequences: 1, 17 and 5 queries (total_q = 23 < batch * seqlen_q = 51), 10, 40 and 0 keys (total_k = 50
// < 3 * 40 = 120); seqlen_q / seqlen_k are the longest. The paged K/V: NUM_PAGES pages of the page size under test.
class ServingValidation : public ::testing::Test {
 protected:
  static constexpr int64_t B = 3, SQ = 17, SK = 40, HQ = 4, HKV = 2, TOTAL_Q = 23, TOTAL_K = 50, NUM_PAGES = 6;
  static constexpr int64_t kMaxPage = 256;  // the largest page size the paged buffers are sized for

  void SetUp() override {
    const Compiled c = first_compiled();
    ASSERT_GT(c.head_dim, 0) << "this build compiled no kernel at all";
    D = c.head_dim;
    dtype = c.dtype;
    // Sized for the dense problem (which holds the packed one) and for the largest pool.
    const int64_t kv_rows = std::max<int64_t>(B * SK, NUM_PAGES * kMaxPage);
    q_ = std::make_unique<HostBuffer>(B * SQ * HQ * D * 2);
    k_ = std::make_unique<HostBuffer>(kv_rows * HKV * D * 2);
    v_ = std::make_unique<HostBuffer>(kv_rows * HKV * D * 2);
    o_ = std::make_unique<HostBuffer>(B * SQ * HQ * D * 2);
    lse_ = std::make_unique<HostBuffer>(B * HQ * SQ * 4);
    ints_ = std::make_unique<HostBuffer>(4096);  // cu_seqlens_q, cu_seqlens_k, block_table, seqused_k (contents unread)
    cu_q = reinterpret_cast<int32_t*>(ints_->data());
    cu_k = reinterpret_cast<int32_t*>(ints_->data() + 256);
    table = reinterpret_cast<int32_t*>(ints_->data() + 512);
    used = reinterpret_cast<int32_t*>(ints_->data() + 3584);
    dense();
  }

  // The dense problem (B, SQ) x (B, SK), BSHD, no LSE, no serving field set. Its row strides are the packed
  // tensors' too (their batch strides, SQ or SK rows, are ignored).
  void dense() {
    flashcore_attention_params_init(&p);
    p.q = q_->data(), p.k = k_->data(), p.v = v_->data(), p.o = o_->data();
    p.batch = B, p.seqlen_q = SQ, p.seqlen_k = SK, p.num_heads_q = HQ, p.num_heads_kv = HKV, p.head_dim = D;
    p.dtype = dtype;
    ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS);
  }

  // Packed Q/O: (TOTAL_Q, HQ, D) rows; cu_seqlens_q given. Batch strides: set_contiguous's (ignored).
  void varlen_q() {
    p.cu_seqlens_q = cu_q, p.total_q = TOTAL_Q;
    p.lse = reinterpret_cast<float*>(lse_->data());
  }
  // Packed K/V: (TOTAL_K, HKV, D) rows; cu_seqlens_k given.
  void varlen_k() { p.cu_seqlens_k = cu_k, p.total_k = TOTAL_K; }
  // Paged K/V: (NUM_PAGES, page, HKV, D), block_table (B, stride).
  void paged(int64_t page, int64_t stride = 0) {
    p.block_table = table, p.page_size = page, p.num_pages = NUM_PAGES, p.block_table_stride = stride;
    p.k_strides = p.v_strides = {page * HKV * D, HKV * D, D, 1};
    p.seqused_k = used;
  }

  void expect_valid(const char* what) {
    SCOPED_TRACE(what);
    EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
    EXPECT_STREQ(flashcore_last_error(), "");
  }

  // validate() and forward() both return `want` with a message holding every needle; O and LSE untouched.
  void expect_error(flashcore_status want, const std::vector<std::string>& needles) {
    for (int forward = 0; forward < 2; ++forward) {
      SCOPED_TRACE(forward ? "flashcore_attention_forward" : "flashcore_attention_validate");
      const flashcore_status got = forward ? flashcore_attention_forward(&p, nullptr) : flashcore_attention_validate(&p);
      EXPECT_EQ(got, want) << "got " << flashcore_status_string(got) << ": " << flashcore_last_error();
      const std::string message = flashcore_last_error();
      for (const std::string& needle : needles) {
        EXPECT_NE(message.find(needle), std::string::npos) << "message '" << message << "' lacks '" << needle << "'";
      }
    }
    EXPECT_TRUE(o_->untouched()) << "O was written by a failing call";
    EXPECT_TRUE(lse_->untouched()) << "LSE was written by a failing call";
  }

  int64_t D = 0;
  flashcore_dtype dtype = FLASHCORE_DTYPE_BF16;
  flashcore_attention_params p{};
  std::unique_ptr<HostBuffer> q_, k_, v_, o_, lse_, ints_;
  int32_t *cu_q = nullptr, *cu_k = nullptr, *table = nullptr, *used = nullptr;
};

const int32_t* shifted(const int32_t* ptr, int bytes) {
  return reinterpret_cast<const int32_t*>(reinterpret_cast<const unsigned char*>(ptr) + bytes);
}

// ---- valid combinations ----
TEST_F(ServingValidation, DefaultsAreValid) { expect_valid("no serving field"); }

TEST_F(ServingValidation, VarlenQAndKAreValid) {
  varlen_q();
  expect_valid("varlen q (dense K/V)");
  varlen_k();
  expect_valid("varlen q + k");
  p.seqused_k = used;
  expect_valid("varlen q + k + seqused_k");
  p.num_splits = 1;
  expect_valid("varlen q, num_splits = 1 (never split)");
  p.cu_seqlens_q = nullptr, p.total_q = 0, p.lse = nullptr;
  p.num_splits = 0;
  expect_valid("varlen k alone");
}

TEST_F(ServingValidation, PagedIsValid) {
  for (int64_t page : {int64_t{16}, int64_t{32}, int64_t{256}}) {
    SCOPED_TRACE(page);
    paged(page);
    expect_valid("paged, stride 0");
    const int64_t width = (SK + page - 1) / page;
    p.block_table_stride = width;
    expect_valid("paged, stride = ceil(seqlen_k / page_size)");
    p.block_table_stride = width + 7;
    expect_valid("paged, a wider table");
  }
}

TEST_F(ServingValidation, PagedWithVarlenQIsValid) {
  varlen_q();
  for (int64_t page : {int64_t{16}, int64_t{256}}) {
    paged(page, 3);
    expect_valid("paged + varlen q");
  }
  p.num_splits = 1;
  expect_valid("paged + varlen q, num_splits = 1");
}

TEST_F(ServingValidation, NumSplitsRange) {
  for (int32_t splits : {0, 1, 2, 3, 64, 256}) {
    p.num_splits = splits;
    expect_valid(("num_splits = " + std::to_string(splits)).c_str());
  }
  paged(64);
  p.seqlen_q = 1;
  p.num_splits = 3;
  expect_valid("paged decode, num_splits = 3");
}

// The int32 arrays need 4-byte alignment only (not the tensors' 16).
TEST_F(ServingValidation, IntArraysNeedFourByteAlignmentOnly) {
  varlen_q();
  varlen_k();
  p.cu_seqlens_q = shifted(cu_q, 4), p.cu_seqlens_k = shifted(cu_k, 12);
  expect_valid("cu_seqlens at 4-byte offsets");
  dense();
  paged(16);
  p.block_table = shifted(table, 4);
  expect_valid("block_table at a 4-byte offset");
}

// ---- MISALIGNED_POINTER ----
TEST_F(ServingValidation, MisalignedIntArrays) {
  for (int bytes : {1, 2, 3}) {
    SCOPED_TRACE(bytes);
    dense();
    varlen_q();
    varlen_k();
    p.cu_seqlens_q = shifted(cu_q, bytes);
    expect_error(FLASHCORE_ERROR_MISALIGNED_POINTER, {"cu_seqlens_q"});
    p.cu_seqlens_q = cu_q;
    p.cu_seqlens_k = shifted(cu_k, bytes);
    expect_error(FLASHCORE_ERROR_MISALIGNED_POINTER, {"cu_seqlens_k"});
    dense();
    paged(32);
    p.block_table = shifted(table, bytes);
    expect_error(FLASHCORE_ERROR_MISALIGNED_POINTER, {"block_table"});
  }
}

// ---- total_q / total_k ----
TEST_F(ServingValidation, PackedTensorsNeedTheirTotal) {
  for (int64_t total : {int64_t{0}, int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
    SCOPED_TRACE(total);
    dense();
    varlen_q();
    p.total_q = total;
    expect_error(FLASHCORE_ERROR_INVALID_SIZE, {"total_q"});
    dense();
    varlen_k();
    p.total_k = total;
    expect_error(FLASHCORE_ERROR_INVALID_SIZE, {"total_k"});
  }
}

TEST_F(ServingValidation, TotalWithoutCuSeqlens) {
  for (int64_t total : {int64_t{1}, int64_t{TOTAL_Q}}) {
    dense();
    p.total_q = total;
    expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"total_q"});
    dense();
    p.total_k = total;
    expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"total_k"});
  }
}

// ---- block_table and its fields ----
TEST_F(ServingValidation, BadPageSize) {
  // (Since 0.8 every size in [1, 65536] is a page: 8, 24 or 100 validate.)
  for (int64_t page : {int64_t{0}, int64_t{-16}, int64_t{-1}, int64_t{65536 + 16}, int64_t{65537},
                       int64_t{131072}, std::numeric_limits<int64_t>::max()}) {
    SCOPED_TRACE(page);
    paged(16);
    p.page_size = page;
    expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"page_size"});
  }
}

TEST_F(ServingValidation, BadNumPages) {
  for (int64_t pages : {int64_t{0}, int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
    SCOPED_TRACE(pages);
    paged(16);
    p.num_pages = pages;
    expect_error(FLASHCORE_ERROR_INVALID_SIZE, {"num_pages"});
  }
}

TEST_F(ServingValidation, BadBlockTableStride) {
  // seqlen_k = 40: 3 entries of 16, 1 of 64.
  for (int64_t stride : {int64_t{-1}, int64_t{1}, int64_t{2}, std::numeric_limits<int64_t>::min()}) {
    SCOPED_TRACE(stride);
    paged(16);
    p.block_table_stride = stride;
    expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"block_table_stride"});
  }
  paged(64, -3);
  expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"block_table_stride"});
  paged(16, 3);
  p.seqlen_k = 49;  // now 4 entries are needed
  expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"block_table_stride"});
}

TEST_F(ServingValidation, PagingFieldsWithoutBlockTable) {
  const struct {
    const char* name;
    int64_t flashcore_attention_params::*field;
    int64_t value;
  } fields[] = {{"page_size", &flashcore_attention_params::page_size, 16},
                {"num_pages", &flashcore_attention_params::num_pages, 4},
                {"block_table_stride", &flashcore_attention_params::block_table_stride, 3},
                {"page_size", &flashcore_attention_params::page_size, -16}};
  for (const auto& f : fields) {
    SCOPED_TRACE(f.name);
    dense();
    p.*f.field = f.value;
    expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {f.name});
  }
}

TEST_F(ServingValidation, BlockTableWithCuSeqlensK) {
  paged(16);
  varlen_k();
  expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"block_table", "cu_seqlens_k"});
}

// ---- num_splits ----
TEST_F(ServingValidation, BadNumSplits) {
  for (int32_t splits : {-1, 257, 1000, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()}) {
    SCOPED_TRACE(splits);
    p.num_splits = splits;
    expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"num_splits"});
  }
}

TEST_F(ServingValidation, NumSplitsWithVarlenQ) {
  varlen_q();
  for (int32_t splits : {2, 3, 256}) {
    SCOPED_TRACE(splits);
    p.num_splits = splits;
    expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"num_splits"});
  }
}

// ---- flags ----
TEST_F(ServingValidation, UnknownFlagsAreRefused) {
  for (uint32_t value : {4u, 0x80000000u, FLASHCORE_FLAG_V_TRANSPOSED | 4u}) {  // (2: FLASHCORE_FLAG_KV_FP8_E4M3 since 0.9)
    p.flags = value;
    expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"flags", "does not know"});
  }
}

TEST_F(ServingValidation, VTransposedFlagIsFor8BitCallsOnly) {
  p.flags = FLASHCORE_FLAG_V_TRANSPOSED;
  expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"flags", "FLASHCORE_FLAG_V_TRANSPOSED", "8-bit"});
}

// V given transposed spans (batch, num_heads_kv, head_dim, seqlen_k rounded up to 128) bytes: an O placed past V's
// extent as given, but inside that one, overlaps it.
TEST_F(ServingValidation, TransposedVIsCheckedAtItsPaddedExtent) {
  if (!flashcore::backend::is_compiled(FLASHCORE_DTYPE_FP8_E4M3, static_cast<int>(D))) {
    GTEST_SKIP() << "this build has no e4m3 kernels at head_dim " << D;
  }
  p.dtype = FLASHCORE_DTYPE_FP8_E4M3;
  p.out_dtype = FLASHCORE_DTYPE_BF16;
  p.o = v_->data() + B * SK * HKV * D;  // right after V as given (1-byte elements)
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
  p.flags = FLASHCORE_FLAG_V_TRANSPOSED;
  expect_error(FLASHCORE_ERROR_OVERLAPPING_OUTPUT, {"v (transposed)", "overlaps"});
}

// ---- extents of the packed and paged tensors ----

// With cu_seqlens_q, Q and O hold total_q rows (their batch strides are ignored): O right after Q's 23 rows does not
// overlap it, though batch * seqlen_q = 51 rows would; O one row earlier does.
TEST_F(ServingValidation, PackedQExtentIsTotalQRows) {
  varlen_q();
  const int64_t row_bytes = HQ * D * 2;
  HostBuffer both(2 * TOTAL_Q * row_bytes);
  p.q = both.data();
  p.o = both.data() + TOTAL_Q * row_bytes;
  expect_valid("O adjacent to packed Q");
  p.q_strides.batch = p.o_strides.batch = 12;  // ignored: neither a multiple of 8 nor a real stride
  expect_valid("packed Q/O with a meaningless batch stride");
  p.o = both.data() + (TOTAL_Q - 1) * row_bytes;
  const flashcore_status st = flashcore_attention_validate(&p);
  EXPECT_EQ(st, FLASHCORE_ERROR_OVERLAPPING_OUTPUT) << flashcore_last_error();
}

// With cu_seqlens_k, K and V hold total_k rows: O right after V's 50 rows does not overlap it (B * SK = 120 would).
TEST_F(ServingValidation, PackedKExtentIsTotalKRows) {
  varlen_k();
  const int64_t v_bytes = TOTAL_K * HKV * D * 2;
  const int64_t o_bytes = B * SQ * HQ * D * 2;
  HostBuffer both(v_bytes + o_bytes);
  p.v = both.data();
  p.o = both.data() + v_bytes;
  expect_valid("O adjacent to packed V");
  p.o = both.data() + v_bytes - 16;
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_ERROR_OVERLAPPING_OUTPUT) << flashcore_last_error();
}

// With block_table, K and V are num_pages pages of page_size rows: O right after the pool does not overlap it; O over
// its last page does.
TEST_F(ServingValidation, PagedKvExtentIsThePool) {
  const int64_t page = 32, pool_bytes = NUM_PAGES * page * HKV * D * 2;
  const int64_t o_bytes = B * SQ * HQ * D * 2;
  HostBuffer both(pool_bytes + o_bytes);
  paged(page);
  p.k = both.data();
  p.o = both.data() + pool_bytes;
  expect_valid("O adjacent to the K pool");
  p.o = both.data() + pool_bytes - page * HKV * D * 2;
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_ERROR_OVERLAPPING_OUTPUT) << flashcore_last_error();
}

// With cu_seqlens_q, LSE is (num_heads_q, total_q): lse_capacity = num_heads_q * total_q is enough (batch * num_heads_q
// * seqlen_q = 204 is not needed), one less is not.
TEST_F(ServingValidation, PackedLseCapacityIsHeadsTimesTotalQ) {
  varlen_q();
  p.lse_capacity = HQ * TOTAL_Q;
  expect_valid("lse_capacity = num_heads_q * total_q");
  p.lse_capacity = HQ * TOTAL_Q - 1;
  expect_error(FLASHCORE_ERROR_INVALID_SIZE, {"lse_capacity = " + std::to_string(HQ * TOTAL_Q - 1),
                                              std::to_string(HQ * TOTAL_Q)});
}

}  // namespace
