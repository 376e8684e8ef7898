// Ring attention's plan (src/dist/ring_plan.h) and the GPU-free checks of the ring and merge entry points.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "dist/ring_plan.h"
#include "flashcore/ring.h"

namespace {

using flashcore::dist::kv_source;
using flashcore::dist::max_shard_len;
using flashcore::dist::min_seqlen;
using flashcore::dist::Piece;
using flashcore::dist::Shard;
using flashcore::dist::shard_of;
using flashcore::dist::step_piece;

constexpr flashcore_ring_layout kLayouts[] = {FLASHCORE_RING_ZIGZAG, FLASHCORE_RING_CONTIGUOUS};

// Global row of local row `i` of a shard.
int64_t global_row(const Shard& s, int64_t i) { return i < s.first.len ? s.first.start + i : s.second.start + i - s.first.len; }

TEST(RingPlan, ShardsPartitionTheSequence) {
  for (flashcore_ring_layout layout : kLayouts) {
    for (int world : {1, 2, 3, 4, 7, 8}) {
      for (int64_t seqlen : {min_seqlen(layout, world), int64_t{17}, int64_t{113}, int64_t{1000}, int64_t{4097}}) {
        if (seqlen < min_seqlen(layout, world)) continue;
        std::vector<int> owner(static_cast<size_t>(seqlen), -1);
        int64_t longest = 0;
        for (int r = 0; r < world; ++r) {
          const Shard s = shard_of(layout, seqlen, world, r);
          EXPECT_GT(s.first.len, 0);
          if (layout == FLASHCORE_RING_ZIGZAG) {
            EXPECT_GT(s.second.len, 0);
            EXPECT_LT(s.first.start, s.second.start);  // local order is global order
          } else {
            EXPECT_EQ(s.second.len, 0);
          }
          longest = std::max(longest, s.len());
          for (int64_t i = 0; i < s.len(); ++i) {
            const int64_t g = global_row(s, i);
            ASSERT_GE(g, 0);
            ASSERT_LT(g, seqlen);
            EXPECT_EQ(owner[static_cast<size_t>(g)], -1) << "row " << g << " in two shards";
            owner[static_cast<size_t>(g)] = r;
          }
        }
        for (int64_t g = 0; g < seqlen; ++g) EXPECT_NE(owner[static_cast<size_t>(g)], -1) << "row " << g << " unowned";
        EXPECT_EQ(max_shard_len(layout, seqlen, world), longest);
      }
    }
  }
}

// Over all steps, the blocks of every rank cover each visible (query, key) pair of the global mask exactly once
// and no invisible pair: with a correct forward and merge, the ring computes full attention.
TEST(RingPlan, StepsCoverTheMaskExactlyOnce) {
  for (flashcore_ring_layout layout : kLayouts) {
    for (bool causal : {false, true}) {
      for (int world : {1, 2, 3, 4, 5, 8}) {
        for (int64_t seqlen : {int64_t{16}, int64_t{37}, int64_t{113}}) {
          if (seqlen < min_seqlen(layout, world)) continue;
          std::vector<int> seen(static_cast<size_t>(seqlen * seqlen), 0);
          for (int r = 0; r < world; ++r) {
            const Shard mine = shard_of(layout, seqlen, world, r);
            for (int step = 0; step < world; ++step) {
              const Shard theirs = shard_of(layout, seqlen, world, kv_source(world, r, step));
              Piece pc;
              if (!step_piece(layout, causal, seqlen, world, r, step, pc)) continue;
              ASSERT_LE(pc.q_begin + pc.q_len, mine.len());
              ASSERT_LE(pc.k_begin + pc.k_len, theirs.len());
              if (pc.causal) {
                EXPECT_EQ(pc.q_len, pc.k_len);
              }
              for (int64_t i = 0; i < pc.q_len; ++i) {
                for (int64_t j = 0; j < pc.k_len; ++j) {
                  if (pc.causal && j > i) continue;  // bottom-right = top-left for a square block
                  const int64_t q = global_row(mine, pc.q_begin + i), k = global_row(theirs, pc.k_begin + j);
                  ++seen[static_cast<size_t>(q * seqlen + k)];
                }
              }
            }
          }
          for (int64_t q = 0; q < seqlen; ++q) {
            for (int64_t k = 0; k < seqlen; ++k) {
              const int expected = (!causal || k <= q) ? 1 : 0;
              ASSERT_EQ(seen[static_cast<size_t>(q * seqlen + k)], expected)
                  << "layout " << layout << " causal " << causal << " world " << world << " seqlen " << seqlen
                  << " pair (" << q << ", " << k << ")";
            }
          }
        }
      }
    }
  }
}

// Zigzag balances causal work: every rank computes the same number of pairs within a few rows' worth.
TEST(RingPlan, ZigzagBalancesCausalWork) {
  const int64_t seqlen = 4096 + 13;
  for (int world : {2, 4, 8}) {
    std::vector<double> work(static_cast<size_t>(world), 0.0);
    for (int r = 0; r < world; ++r) {
      for (int step = 0; step < world; ++step) {
        Piece pc;
        if (!step_piece(FLASHCORE_RING_ZIGZAG, true, seqlen, world, r, step, pc)) continue;
        work[static_cast<size_t>(r)] += pc.causal ? pc.q_len * (pc.q_len + 1) / 2.0 : double(pc.q_len) * pc.k_len;
      }
    }
    const double ideal = seqlen * (seqlen + 1) / 2.0 / world;
    for (int r = 0; r < world; ++r) EXPECT_NEAR(work[static_cast<size_t>(r)] / ideal, 1.0, 0.01) << "rank " << r;
  }
}

flashcore_ring_params ring_of(int world, int64_t seqlen, flashcore_ring_layout layout = FLASHCORE_RING_ZIGZAG) {
  flashcore_ring_params ring;
  flashcore_ring_params_init(&ring);
  ring.world_size = world;
  ring.seqlen_global = seqlen;
  ring.layout = layout;
  return ring;
}

TEST(RingApi, ShardMatchesThePlanAndChecksItsArguments) {
  flashcore_ring_params ring;
  flashcore_ring_params_init(&ring);
  EXPECT_EQ(ring.struct_size, sizeof(ring));
  EXPECT_EQ(ring.rank, -1);
  EXPECT_EQ(ring.layout, FLASHCORE_RING_ZIGZAG);
  ring = ring_of(3, 1000);
  int64_t s0 = 0, l0 = 0, s1 = 0, l1 = 0;
  ASSERT_EQ(flashcore_ring_shard(&ring, 2, &s0, &l0, &s1, &l1), FLASHCORE_SUCCESS);
  const Shard want = shard_of(FLASHCORE_RING_ZIGZAG, 1000, 3, 2);
  EXPECT_EQ(s0, want.first.start);
  EXPECT_EQ(l0, want.first.len);
  EXPECT_EQ(s1, want.second.start);
  EXPECT_EQ(l1, want.second.len);

  EXPECT_EQ(flashcore_ring_shard(&ring, 3, &s0, &l0, &s1, &l1), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("rank = 3"), std::string::npos) << flashcore_last_error();
  EXPECT_EQ(flashcore_ring_shard(&ring, 0, nullptr, &l0, &s1, &l1), FLASHCORE_ERROR_NULL_POINTER);
  EXPECT_EQ(flashcore_ring_shard(nullptr, 0, &s0, &l0, &s1, &l1), FLASHCORE_ERROR_NULL_POINTER);

  const struct {
    flashcore_ring_params ring;
    flashcore_status status;
    const char* names;
  } bad[] = {
      {ring_of(0, 1000), FLASHCORE_ERROR_INVALID_SIZE, "world_size = 0"},
      {ring_of(4, 7), FLASHCORE_ERROR_INVALID_SIZE, "seqlen_global = 7"},
      {ring_of(4, 3, FLASHCORE_RING_CONTIGUOUS), FLASHCORE_ERROR_INVALID_SIZE, "seqlen_global = 3"},
      {ring_of(2, int64_t{1} << 40), FLASHCORE_ERROR_SIZE_OVERFLOW, "seqlen_global"},
      {ring_of(2, 100, static_cast<flashcore_ring_layout>(7)), FLASHCORE_ERROR_INVALID_ARGUMENT, "layout = 7"},
  };
  for (const auto& b : bad) {
    EXPECT_EQ(flashcore_ring_shard(&b.ring, 0, &s0, &l0, &s1, &l1), b.status) << b.names;
    EXPECT_NE(std::string(flashcore_last_error()).find(b.names), std::string::npos) << flashcore_last_error();
  }
  flashcore_ring_params wrong_size = ring_of(2, 100);
  wrong_size.struct_size = 8;
  EXPECT_EQ(flashcore_ring_shard(&wrong_size, 0, &s0, &l0, &s1, &l1), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("struct_size"), std::string::npos);
}

TEST(RingApi, EntriesRefuseNullArguments) {
  flashcore_ring_params ring = ring_of(2, 64);
  uint64_t bytes = 1;
  EXPECT_EQ(flashcore_ring_workspace_size(nullptr, &ring, &bytes), FLASHCORE_ERROR_NULL_POINTER);
  EXPECT_EQ(bytes, 0u);
  EXPECT_EQ(flashcore_ring_attention_forward(nullptr, nullptr, nullptr), FLASHCORE_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(flashcore_last_error()).find("ring is NULL"), std::string::npos);
  EXPECT_EQ(flashcore_ring_attention_simulate(nullptr, &ring, nullptr), FLASHCORE_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(flashcore_last_error()).find("local is NULL"), std::string::npos);
}

// Ring attention's shards and merges have one head dim for K, V and O, one the merge kernel takes: a V head dim of its
// own or head dim 192 is refused before any device access, naming the field.
TEST(RingApi, RefusesHeadDimsItsMergeDoesNotTake) {
  flashcore_ring_params ring = ring_of(2, 64);
  const int64_t len = 32, H = 2;
  alignas(16) static uint16_t q[len * H * 192], k[len * H * 192], v[len * H * 192], o[len * H * 192];
  alignas(16) static float lse[H * len];
  for (const auto& [d, dv] : {std::pair<int64_t, int64_t>{192, 128}, {192, 0}}) {
    flashcore_attention_params p;
    flashcore_attention_params_init(&p);
    p.batch = 1, p.seqlen_q = p.seqlen_k = len, p.num_heads_q = p.num_heads_kv = H, p.head_dim = d, p.head_dim_v = dv;
    p.dtype = FLASHCORE_DTYPE_BF16;
    ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS) << flashcore_last_error();
    p.q = q, p.k = k, p.v = v, p.o = o, p.lse = lse;
    if (flashcore_attention_validate(&p) != FLASHCORE_SUCCESS) continue;  // (192 not compiled in this build)
    uint64_t bytes = 1;
    EXPECT_EQ(flashcore_ring_workspace_size(&p, &ring, &bytes), FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM)
        << flashcore_last_error();
    const std::string message = flashcore_last_error();
    EXPECT_NE(message.find("head_dim = 192"), std::string::npos) << message;
    if (dv != 0) {
      EXPECT_NE(message.find("head_dim_v = 128"), std::string::npos) << message;
    }
  }
}

// flashcore_attention_merge's argument checks come before any device access.
TEST(MergeApi, ArgumentChecksNameTheField) {
  alignas(16) static float acc[2 * 8 * 4 * 128];
  alignas(16) static float lse_acc[2 * 4 * 8];
  alignas(16) static uint16_t part[2 * 8 * 4 * 128];
  alignas(16) static float lse_part[2 * 4 * 8];
  auto good = [&] {
    flashcore_merge_params m;
    flashcore_merge_params_init(&m);
    m.batch = 2;
    m.seqlen = 8;
    m.num_heads = 4;
    m.head_dim = 128;
    m.o_part = part;
    m.o_part_strides = {8 * 4 * 128, 4 * 128, 128, 1};
    m.part_dtype = FLASHCORE_DTYPE_BF16;
    m.lse_part = lse_part;
    m.lse_part_strides = {4 * 8, 8, 1};
    m.o_acc = acc;
    m.o_acc_strides = m.o_part_strides;
    m.lse_acc = lse_acc;
    m.lse_acc_strides = m.lse_part_strides;
    return m;
  };
  flashcore_merge_params m = good();
  EXPECT_EQ(m.struct_size, sizeof(m));
  struct Bad {
    void (*edit)(flashcore_merge_params&);
    flashcore_status status;
    const char* text;
  };
  const Bad bad[] = {
      {[](flashcore_merge_params& p) { p.struct_size = 4; }, FLASHCORE_ERROR_INVALID_ARGUMENT, "struct_size"},
      {[](flashcore_merge_params& p) { p.o_acc = nullptr; }, FLASHCORE_ERROR_NULL_POINTER, "o_acc is NULL"},
      {[](flashcore_merge_params& p) { p.lse_part = nullptr; }, FLASHCORE_ERROR_NULL_POINTER, "lse_part"},
      {[](flashcore_merge_params& p) { p.seqlen = 0; }, FLASHCORE_ERROR_INVALID_SIZE, "seqlen = 0"},
      {[](flashcore_merge_params& p) { p.head_dim = 96; }, FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM, "head_dim = 96"},
      {[](flashcore_merge_params& p) { p.part_dtype = FLASHCORE_DTYPE_FP8_E4M3; }, FLASHCORE_ERROR_UNSUPPORTED_DTYPE,
       "part_dtype"},
      {[](flashcore_merge_params& p) { p.o_part_strides.dim = 2; }, FLASHCORE_ERROR_INVALID_STRIDE, "o_part_strides.dim"},
      {[](flashcore_merge_params& p) { p.o_acc_strides.seq = 3; }, FLASHCORE_ERROR_INVALID_STRIDE, "o_acc_strides.seq"},
      {[](flashcore_merge_params& p) { p.init = 2; }, FLASHCORE_ERROR_INVALID_ARGUMENT, "init = 2"},
      {[](flashcore_merge_params& p) {
         p.init = 1;
         p.o_part = nullptr;
         p.lse_part = nullptr;
       },
       FLASHCORE_ERROR_NULL_POINTER, "init = 1"},
      {[](flashcore_merge_params& p) { p.lse_acc = p.lse_part == nullptr ? nullptr : const_cast<float*>(p.lse_part); },
       FLASHCORE_ERROR_OVERLAPPING_OUTPUT, "overlaps"},
      {[](flashcore_merge_params& p) { p.o_acc = reinterpret_cast<float*>(reinterpret_cast<char*>(p.o_acc) + 4); },
       FLASHCORE_ERROR_MISALIGNED_POINTER, "o_acc"},
      {[](flashcore_merge_params& p) {
         p.o_out = p.o_acc;
         p.o_out_strides = p.o_acc_strides;
         p.out_dtype = FLASHCORE_DTYPE_FP16;
       },
       FLASHCORE_ERROR_OVERLAPPING_OUTPUT, "o_out"},
      {[](flashcore_merge_params& p) {
         p.o_out = p.o_acc;
         p.o_out_strides = p.o_acc_strides;
         p.out_dtype = FLASHCORE_DTYPE_FP32;
       },
       FLASHCORE_ERROR_UNSUPPORTED_DTYPE, "out_dtype"},
  };
  for (const Bad& b : bad) {
    flashcore_merge_params p = good();
    b.edit(p);
    EXPECT_EQ(flashcore_attention_merge(&p, nullptr), b.status) << b.text << ": " << flashcore_last_error();
    EXPECT_NE(std::string(flashcore_last_error()).find(b.text), std::string::npos) << flashcore_last_error();
  }
  EXPECT_EQ(flashcore_attention_merge(nullptr, nullptr), FLASHCORE_ERROR_NULL_POINTER);
}

}  // namespace
