// ABI 0.8's serving fields (kv_batch_idx / kv_batch_size, leftpad_k, cu_seqlens_k_new / total_k_new, seqused_q) through the
// public C API, without a GPU: their place in the struct, the 0.7 layout (FLASHCORE_ATTENTION_PARAMS_V7_SIZE) still
// accepted with the new fields at their defaults whatever its memory holds past it, and every rule with its status and
// a message naming the field. Host buffers stand in for device memory: the argument checks touch no device.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cpu/validation_util.h"
#include "flashcore/flashcore.h"

namespace {

using flashcore::test::HostBuffer;

TEST(CacheSlotAbi, LayoutOfTheFieldsSince08) {
  EXPECT_EQ(size_t{FLASHCORE_ATTENTION_PARAMS_V7_SIZE}, 696u);
  EXPECT_EQ(offsetof(flashcore_attention_params, kv_batch_idx), size_t{FLASHCORE_ATTENTION_PARAMS_V7_SIZE});
  EXPECT_EQ(offsetof(flashcore_attention_params, kv_batch_size), 704u);
  EXPECT_EQ(offsetof(flashcore_attention_params, leftpad_k), 712u);
  EXPECT_EQ(offsetof(flashcore_attention_params, cu_seqlens_k_new), 720u);
  EXPECT_EQ(offsetof(flashcore_attention_params, total_k_new), 728u);
  EXPECT_EQ(offsetof(flashcore_attention_params, seqused_q), 736u);
  EXPECT_EQ(offsetof(flashcore_attention_params, rotary_cos), 744u);
  EXPECT_EQ(offsetof(flashcore_attention_params, rotary_seqlen), 760u);
  EXPECT_EQ(offsetof(flashcore_attention_params, rotary_dim), 768u);
  EXPECT_EQ(offsetof(flashcore_attention_params, rotary_seqlens), 776u);
  EXPECT_EQ(sizeof(flashcore_attention_params), 784u);
  EXPECT_GE(FLASHCORE_VERSION_MINOR, 8);
  flashcore_attention_params p;
  std::memset(&p, 0x5A, sizeof(p));
  flashcore_attention_params_init(&p);
  EXPECT_EQ(p.kv_batch_idx, nullptr);
  EXPECT_EQ(p.kv_batch_size, 0);
  EXPECT_EQ(p.leftpad_k, nullptr);
  EXPECT_EQ(p.cu_seqlens_k_new, nullptr);
  EXPECT_EQ(p.total_k_new, 0);
  EXPECT_EQ(p.seqused_q, nullptr);
}

TEST(CacheSlotAbi, InitSizedWithTheV7SizeWritesNothingPastIt) {
  std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 64, 0xC7);
  auto* v7 = reinterpret_cast<flashcore_attention_params*>(buf.data());
  flashcore_attention_params_init_sized(v7, FLASHCORE_ATTENTION_PARAMS_V7_SIZE);
  EXPECT_STREQ(flashcore_last_error(), "");
  EXPECT_EQ(v7->struct_size, uint32_t{FLASHCORE_ATTENTION_PARAMS_V7_SIZE});
  EXPECT_EQ(v7->head_dim_v, 0);
  for (size_t i = FLASHCORE_ATTENTION_PARAMS_V7_SIZE; i < buf.size(); ++i) {
    ASSERT_EQ(buf[i], 0xC7) << "byte " << i << " written past a 0.7 struct by params_init_sized";
  }
}

// A KV cache call: 2 sequences of 4 queries on a dense cache of 64 rows (3 slots), 2 new rows each.
class CacheSlotValidation : public ::testing::Test {
 protected:
  static constexpr int64_t B = 2, SQ = 4, SK = 64, HQ = 4, HKV = 2, SLOTS = 3, NEW = 2;

  void SetUp() override {
    const flashcore::test::Compiled c = flashcore::test::first_compiled();
    if (c.head_dim == 0) GTEST_SKIP() << "no 16-bit head dim compiled in this build";
    const int64_t d = c.head_dim;
    q_ = std::make_unique<HostBuffer>(B * SQ * HQ * d * 2);
    k_ = std::make_unique<HostBuffer>(SLOTS * SK * HKV * d * 2);
    v_ = std::make_unique<HostBuffer>(SLOTS * SK * HKV * d * 2);
    o_ = std::make_unique<HostBuffer>(B * SQ * HQ * d * 2);
    kn_ = std::make_unique<HostBuffer>(B * NEW * HKV * d * 2);
    vn_ = std::make_unique<HostBuffer>(B * NEW * HKV * d * 2);
    ints_ = std::make_unique<HostBuffer>(256);
    flashcore_attention_params_init(&p);
    p.q = q_->data(), p.k = k_->data(), p.v = v_->data(), p.o = o_->data();
    p.batch = B, p.seqlen_q = SQ, p.seqlen_k = SK, p.num_heads_q = HQ, p.num_heads_kv = HKV, p.head_dim = d;
    p.dtype = c.dtype;
    ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS) << flashcore_last_error();
    p.seqused_k = ints(0);
    p.kv_batch_idx = ints(16);
    p.kv_batch_size = SLOTS;
    p.k_new = kn_->data(), p.v_new = vn_->data(), p.seqlen_new = NEW;
    p.k_new_strides = {NEW * HKV * d, HKV * d, d, 1};
    p.v_new_strides = p.k_new_strides;
  }
  const int32_t* ints(size_t offset) const { return reinterpret_cast<const int32_t*>(ints_->data() + offset * 4); }

  void expect_error(const flashcore_attention_params& params, flashcore_status want,
                    const std::vector<std::string>& needles) {
    const flashcore_status got = flashcore_attention_validate(&params);
    EXPECT_EQ(got, want) << "got " << flashcore_status_string(got) << ": " << flashcore_last_error();
    const std::string message = flashcore_last_error();
    for (const std::string& needle : needles) {
      EXPECT_NE(message.find(needle), std::string::npos) << "message '" << message << "' lacks '" << needle << "'";
    }
    EXPECT_TRUE(o_->untouched()) << "O was written by a failing call";
  }

  flashcore_attention_params p{};
  std::unique_ptr<HostBuffer> q_, k_, v_, o_, kn_, vn_, ints_;
};

TEST_F(CacheSlotValidation, SlotsValidateAndSizeTheCache) {
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
  // A slot count past INT32_MAX or not positive is refused.
  flashcore_attention_params zero = p;
  zero.kv_batch_size = 0;
  expect_error(zero, FLASHCORE_ERROR_INVALID_SIZE, {"kv_batch_size = 0", "kv_batch_idx"});
  flashcore_attention_params huge = p;
  huge.kv_batch_size = int64_t{INT32_MAX} + 1;
  expect_error(huge, FLASHCORE_ERROR_SIZE_OVERFLOW, {"kv_batch_size"});
  flashcore_attention_params stray = p;
  stray.kv_batch_idx = nullptr;
  expect_error(stray, FLASHCORE_ERROR_INVALID_ARGUMENT, {"kv_batch_size = 3", "kv_batch_idx is NULL"});
  // O over the last slot of the cache: K is kv_batch_size = 3 entries long, not batch = 2.
  flashcore_attention_params overlap = p;
  overlap.o = static_cast<unsigned char*>(const_cast<void*>(p.k)) + 2 * SK * HKV * p.head_dim * 2;
  expect_error(overlap, FLASHCORE_ERROR_OVERLAPPING_OUTPUT, {"overlaps"});
}

TEST_F(CacheSlotValidation, SlotsAndPaddingNeedACache) {
  flashcore_attention_params no_lengths = p;
  no_lengths.seqused_k = nullptr;
  no_lengths.k_new = no_lengths.v_new = nullptr, no_lengths.seqlen_new = 0;
  expect_error(no_lengths, FLASHCORE_ERROR_INVALID_ARGUMENT, {"kv_batch_idx", "seqused_k"});
  no_lengths.kv_batch_idx = nullptr, no_lengths.kv_batch_size = 0;
  no_lengths.leftpad_k = ints(32);
  expect_error(no_lengths, FLASHCORE_ERROR_INVALID_ARGUMENT, {"leftpad_k", "seqused_k"});
  flashcore_attention_params packed = p;
  packed.k_new = packed.v_new = nullptr, packed.seqlen_new = 0;
  packed.cu_seqlens_k = ints(48), packed.total_k = SK;
  expect_error(packed, FLASHCORE_ERROR_INVALID_ARGUMENT, {"kv_batch_idx with cu_seqlens_k"});
}

TEST_F(CacheSlotValidation, PaddingOnAPagedCacheIsRefused) {
  flashcore_attention_params paged = p;
  paged.kv_batch_idx = nullptr, paged.kv_batch_size = 0;
  paged.leftpad_k = ints(32);
  paged.block_table = ints(48), paged.page_size = 16, paged.num_pages = 2;
  paged.k_strides = {16 * HKV * p.head_dim, HKV * p.head_dim, p.head_dim, 1};
  paged.v_strides = paged.k_strides;
  expect_error(paged, FLASHCORE_ERROR_INVALID_ARGUMENT, {"leftpad_k with block_table"});
  paged.leftpad_k = nullptr;
  EXPECT_EQ(flashcore_attention_validate(&paged), FLASHCORE_SUCCESS) << flashcore_last_error();
  // Slots on a paged cache select block_table rows: the table's extent is kv_batch_size rows.
  paged.kv_batch_idx = ints(16), paged.kv_batch_size = 5;
  EXPECT_EQ(flashcore_attention_validate(&paged), FLASHCORE_SUCCESS) << flashcore_last_error();
}

TEST_F(CacheSlotValidation, PackedAppendRules) {
  flashcore_attention_params packed = p;
  packed.cu_seqlens_k_new = ints(48);
  packed.total_k_new = 3;
  expect_error(packed, FLASHCORE_ERROR_INVALID_ARGUMENT, {"seqlen_new = 2", "cu_seqlens_k_new"});
  packed.seqlen_new = 0;
  EXPECT_EQ(flashcore_attention_validate(&packed), FLASHCORE_SUCCESS) << flashcore_last_error();
  packed.total_k_new = 0;
  expect_error(packed, FLASHCORE_ERROR_INVALID_SIZE, {"total_k_new = 0"});
  packed.total_k_new = int64_t{INT32_MAX};
  expect_error(packed, FLASHCORE_ERROR_SIZE_OVERFLOW, {"total_k_new"});
  packed.total_k_new = 3;
  packed.k_new = packed.v_new = nullptr;
  expect_error(packed, FLASHCORE_ERROR_INVALID_ARGUMENT, {"cu_seqlens_k_new is set but k_new is NULL"});
  flashcore_attention_params stray = p;
  stray.total_k_new = 4;
  expect_error(stray, FLASHCORE_ERROR_INVALID_ARGUMENT, {"total_k_new = 4", "cu_seqlens_k_new is NULL"});
  // Packed new rows are one entry of total_k_new rows (k_new's batch stride ignored): 64 of them reach K here.
  flashcore_attention_params into_cache = p;
  into_cache.seqlen_new = 0, into_cache.cu_seqlens_k_new = ints(48), into_cache.total_k_new = 64;
  into_cache.k_new = static_cast<const unsigned char*>(p.k) - 8 * HKV * p.head_dim * 2;
  expect_error(into_cache, FLASHCORE_ERROR_OVERLAPPING_OUTPUT, {"k_new"});
}

TEST_F(CacheSlotValidation, MisalignedArraysNameTheField) {
  const char* names[] = {"kv_batch_idx", "leftpad_k", "cu_seqlens_k_new", "seqused_q"};
  for (int i = 0; i < 4; ++i) {
    flashcore_attention_params m = p;
    const int32_t* odd = reinterpret_cast<const int32_t*>(ints_->data() + 130);
    if (i == 0) m.kv_batch_idx = odd;
    if (i == 1) m.leftpad_k = odd;
    if (i == 2) m.cu_seqlens_k_new = odd, m.total_k_new = 4, m.seqlen_new = 0;
    if (i == 3) m.seqused_q = odd, m.cu_seqlens_q = ints(40), m.total_q = B * SQ;
    expect_error(m, FLASHCORE_ERROR_MISALIGNED_POINTER, {names[i]});
  }
}

TEST_F(CacheSlotValidation, SequsedQNeedsPackedQueries) {
  flashcore_attention_params m = p;
  m.seqused_q = ints(40);
  expect_error(m, FLASHCORE_ERROR_INVALID_ARGUMENT, {"seqused_q is set but cu_seqlens_q is NULL"});
  m.cu_seqlens_q = ints(48), m.total_q = B * SQ;
  EXPECT_EQ(flashcore_attention_validate(&m), FLASHCORE_SUCCESS) << flashcore_last_error();
}

TEST_F(CacheSlotValidation, RotaryRules) {
  HostBuffer tables(4096);
  flashcore_attention_params r = p;
  r.rotary_cos = tables.data(), r.rotary_sin = tables.data() + 2048;
  r.rotary_seqlen = 64, r.rotary_dim = 32;
  EXPECT_EQ(flashcore_attention_validate(&r), FLASHCORE_SUCCESS) << flashcore_last_error();
  r.rotary_interleaved = 1;
  EXPECT_EQ(flashcore_attention_validate(&r), FLASHCORE_SUCCESS) << flashcore_last_error();
  flashcore_attention_params m = r;
  m.rotary_interleaved = 2;
  expect_error(m, FLASHCORE_ERROR_INVALID_ARGUMENT, {"rotary_interleaved = 2"});
  for (int32_t dim : {0, 24, static_cast<int32_t>(p.head_dim) + 16}) {
    m = r;
    m.rotary_dim = dim;
    expect_error(m, FLASHCORE_ERROR_INVALID_ARGUMENT, {"rotary_dim = " + std::to_string(dim)});
  }
  m = r;
  m.rotary_seqlen = 0;
  expect_error(m, FLASHCORE_ERROR_INVALID_SIZE, {"rotary_seqlen = 0"});
  m = r;
  m.rotary_sin = nullptr;
  expect_error(m, FLASHCORE_ERROR_NULL_POINTER, {"rotary_sin"});
  m = r;
  m.k_new = m.v_new = nullptr, m.seqlen_new = 0;
  expect_error(m, FLASHCORE_ERROR_INVALID_ARGUMENT, {"rotary_cos is set but k_new is NULL"});
  m = r;
  m.rotary_cos = tables.data() + 1;
  expect_error(m, FLASHCORE_ERROR_MISALIGNED_POINTER, {"rotary_cos"});
  m = r;
  m.rotary_seqlens = reinterpret_cast<const int32_t*>(ints_->data() + 2);
  expect_error(m, FLASHCORE_ERROR_MISALIGNED_POINTER, {"rotary_seqlens"});
  // Fields of a rotation without rotary_cos.
  const char* stray[] = {"rotary_sin", "rotary_seqlen", "rotary_dim", "rotary_interleaved", "rotary_seqlens"};
  for (int i = 0; i < 5; ++i) {
    m = p;
    if (i == 0) m.rotary_sin = tables.data();
    if (i == 1) m.rotary_seqlen = 8;
    if (i == 2) m.rotary_dim = 16;
    if (i == 3) m.rotary_interleaved = 1;
    if (i == 4) m.rotary_seqlens = ints(8);
    expect_error(m, FLASHCORE_ERROR_INVALID_ARGUMENT, {std::string(stray[i]) + " is set but rotary_cos is NULL"});
  }
}

TEST_F(CacheSlotValidation, EightBitRefusesThem) {
  flashcore_attention_params fp8 = p;
  fp8.precision = FLASHCORE_PRECISION_FP8;
  const flashcore_status got = flashcore_attention_validate(&fp8);
  EXPECT_EQ(got, FLASHCORE_ERROR_INVALID_ARGUMENT) << flashcore_last_error();
  EXPECT_NE(std::string(flashcore_last_error()).find("serving layouts"), std::string::npos) << flashcore_last_error();
  // (The backward refuses seqused_k, which these fields require: test_backward_validation.cpp.)
}

// A 0.7 caller (struct_size FLASHCORE_ATTENTION_PARAMS_V7_SIZE) never has the 0.8 fields read: junk past 696 bytes
// leaves the plain call.
TEST_F(CacheSlotValidation, A07StructIgnoresItsMemoryPastTheLayout) {
  std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 16, 0);
  flashcore_attention_params plain = p;
  plain.kv_batch_idx = nullptr, plain.kv_batch_size = 0;
  std::memcpy(buf.data(), &plain, sizeof(plain));
  auto* v7 = reinterpret_cast<flashcore_attention_params*>(buf.data());
  v7->struct_size = FLASHCORE_ATTENTION_PARAMS_V7_SIZE;
  std::memset(buf.data() + FLASHCORE_ATTENTION_PARAMS_V7_SIZE, 0x7F, sizeof(flashcore_attention_params) - 696);
  EXPECT_EQ(flashcore_attention_validate(v7), FLASHCORE_SUCCESS) << flashcore_last_error();
  // The same bytes in a 0.8 struct are a garbage slot count without slots: refused.
  v7->struct_size = sizeof(flashcore_attention_params);
  EXPECT_NE(flashcore_attention_validate(v7), FLASHCORE_SUCCESS);
}

}  // namespace
