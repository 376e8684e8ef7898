// The portable kernels' shared-memory swizzle (src/kernels/sm80/smem.cuh) enumerated on the host, above all the
// 12-unit layout of head dim 96 (192-byte rows): every row a permutation of its units; the ldmatrix fast path
// (lane_swizzle_key, swizzled_offset_even) equal to the plain offset; and no bank conflict in any access pattern the
// forward kernel makes with configs.txt's tiles: ldmatrix's 8-row reads, the cp.async copies (loads.cuh, TileCopy:
// also that each thread's copies sit at compile-time offsets from its first), the epilogue's staging stores and its
// copy out of the staged rows (epilogue.cuh). Rows of a multiple of 128 bytes must keep the old layout, unit u of row
// r at u ^ (r % 8), exactly. The tiles' geometry is written out here (Tile, from config.h's rules) rather than taken
// from config.h, which a host compiler cannot include cleanly (kernels/common/element.cuh); the kernels' own
// static_asserts (loads.cuh TileCopy, config.h) hold the device side to the same constraints.
//
// Bank model: 32 banks of 4 bytes; a 16-byte access covers bank group (address / 16) % 8. A phase of 16-byte accesses
// (8 lanes: one 8x8 matrix of ldmatrix, a quarter warp of cp.async / LDS.128) is conflict-free when its 8 groups are
// distinct; the epilogue's 4-byte staging stores (32 lanes) when their 32 banks are. Tiles start at multiples of 128
// bytes (config.h's offsets), so offsets within a tile decide.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>  // __host__ / __device__ / __forceinline__ for smem.cuh under a host compiler

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "kernels/sm80/smem.cuh"

namespace {

using flashcore::sm80::lane_swizzle_key;
using flashcore::sm80::swizzled_offset;
using flashcore::sm80::swizzled_offset_even;

// A forward tile of 16-bit elements, head_dim_v = head dim, no split (config.h's KernelConfig, the members used here).
template <int kD, int kBlockM_, int kBlockN_, int kWarps_>
struct Tile {
  static constexpr int kHeadDim = kD;
  static constexpr int kRowBytes = 2 * kD;
  // config.h kCopyThreadsPerRow: 16 at head dim 256, 4 at 96 (12-unit rows), else 8.
  static constexpr int kCopyThreadsPerRow = kD == 256 ? 16 : kD == 96 ? 4 : 8;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRowsPerWarp = kBlockM / kWarps;
  static constexpr int kMTiles = kRowsPerWarp / 16;
  static constexpr int kWarpDim = kD;
  static constexpr int kOutElemBytes = 2;
};

int bank_group(uint32_t offset) { return static_cast<int>(offset / 16 % 8); }

// True when the 16-byte accesses at `offsets` (one phase: 8 of them) hit 8 distinct bank groups.
bool conflict_free_16(const std::vector<uint32_t>& offsets) {
  std::set<int> groups;
  for (uint32_t o : offsets) groups.insert(bank_group(o));
  return offsets.size() == 8 && groups.size() == 8;
}

// Every row's units land on a permutation of its unit positions, 16-byte aligned, inside the row.
template <int kRowBytes>
void expect_bijective_rows() {
  constexpr int kUnits = kRowBytes / 16;
  for (int r = 0; r < 256; ++r) {
    std::set<uint32_t> seen;
    for (int u = 0; u < kUnits; ++u) {
      const uint32_t o = swizzled_offset<kRowBytes>(r, u);
      ASSERT_EQ(o % 16, 0u);
      ASSERT_GE(o, static_cast<uint32_t>(r * kRowBytes));
      ASSERT_LT(o, static_cast<uint32_t>((r + 1) * kRowBytes));
      seen.insert(o);
      // The key repeats every 8 rows (the copies' passes and the GEMMs' 16-row steps rely on it).
      ASSERT_EQ(swizzled_offset<kRowBytes>(r + 8, u), o + 8 * kRowBytes);
    }
    ASSERT_EQ(static_cast<int>(seen.size()), kUnits) << "row " << r << " of " << kRowBytes << " bytes";
  }
}

TEST(Sm80Swizzle, RowsArePermutations) {
  expect_bijective_rows<128>();
  expect_bijective_rows<192>();
  expect_bijective_rows<256>();
  expect_bijective_rows<384>();
  expect_bijective_rows<512>();
}

// Rows of a multiple of 128 bytes: the layout (and the backward's non-template lane key) as before head dim 96.
template <int kRowBytes>
void expect_old_layout() {
  for (int r = 0; r < 64; ++r) {
    for (int u = 0; u < kRowBytes / 16; ++u) {
      ASSERT_EQ(swizzled_offset<kRowBytes>(r, u), static_cast<uint32_t>(r * kRowBytes + ((u ^ (r & 7)) << 4)));
    }
    for (int c = 0; c < 2; ++c) {
      const uint32_t old_key = static_cast<uint32_t>(((r & 7) ^ c) << 4);
      ASSERT_EQ(lane_swizzle_key<kRowBytes>(r, c), old_key);
      ASSERT_EQ(lane_swizzle_key(r, c), old_key);
      for (int u2 = 0; u2 < kRowBytes / 16; u2 += 2) {
        const uint32_t rb = static_cast<uint32_t>(r * kRowBytes);
        ASSERT_EQ(swizzled_offset_even<kRowBytes>(rb, old_key, u2),
                  rb + static_cast<uint32_t>((u2 & ~7) << 4) + (old_key ^ static_cast<uint32_t>((u2 & 7) << 4)));
      }
    }
  }
}

TEST(Sm80Swizzle, MultipleOf128RowsKeepTheOldLayout) {
  expect_old_layout<128>();
  expect_old_layout<256>();
  expect_old_layout<384>();
  expect_old_layout<512>();
}

// 8 consecutive rows from a multiple of 8 at any one unit (an 8x8 matrix of ldmatrix): 8 distinct bank groups.
template <int kRowBytes>
void expect_column_reads_conflict_free() {
  for (int r0 = 0; r0 < 128; r0 += 8) {
    for (int u = 0; u < kRowBytes / 16; ++u) {
      std::vector<uint32_t> phase;
      for (int i = 0; i < 8; ++i) phase.push_back(swizzled_offset<kRowBytes>(r0 + i, u));
      ASSERT_TRUE(conflict_free_16(phase)) << kRowBytes << "-byte rows " << r0 << ".., unit " << u;
    }
  }
}

TEST(Sm80Swizzle, EightRowsAtOneUnitAreConflictFree) {
  expect_column_reads_conflict_free<128>();
  expect_column_reads_conflict_free<192>();
  expect_column_reads_conflict_free<256>();
  expect_column_reads_conflict_free<384>();
  expect_column_reads_conflict_free<512>();
}

// The ldmatrix fast path of gemm.cuh for each lane pattern: Q's A fragments (load_q_frag: row base + lane % 8 +
// 8 (m % 2), unit 2 kk + m / 2, the key of the full row), K's B fragments (KLane: row 8 (lane / 16) + lane % 8, unit
// 2 kk + (lane / 8) % 2, 16 np rows on) and V's (VLane: row 8 ((lane / 8) % 2) + lane % 8, unit 2 dp + lane / 16,
// 16 kk rows on). Each lane's offset must equal swizzled_offset, and each matrix (lanes 8 m .. 8 m + 7) be
// conflict-free.
struct LanePattern {
  const char* name;
  int (*row)(int lane);
  int (*c)(int lane);
};
const LanePattern kLanePatterns[] = {
    {"Q", [](int l) { return l % 8 + 8 * ((l / 8) % 2); }, [](int l) { return l / 16; }},
    {"K", [](int l) { return 8 * (l / 16) + l % 8; }, [](int l) { return (l / 8) % 2; }},
    {"V", [](int l) { return 8 * ((l / 8) % 2) + l % 8; }, [](int l) { return l / 16; }},
};

template <int kRowBytes>
void expect_ldmatrix_fast_path() {
  for (const LanePattern& pat : kLanePatterns) {
    for (int base = 0; base < 128; base += 16) {  // tile_row0, 16 np or 16 kk: multiples of 16
      for (int u2 = 0; u2 < kRowBytes / 16; u2 += 2) {
        std::vector<uint32_t> offsets;
        for (int lane = 0; lane < 32; ++lane) {
          const int row = base + pat.row(lane);
          const uint32_t key = lane_swizzle_key<kRowBytes>(pat.row(lane), pat.c(lane));
          const uint32_t full_key = lane_swizzle_key<kRowBytes>(row, pat.c(lane));  // load_q_frag's form
          ASSERT_EQ(key, full_key);
          const uint32_t o = swizzled_offset_even<kRowBytes>(static_cast<uint32_t>(row * kRowBytes), key, u2);
          ASSERT_EQ(o, swizzled_offset<kRowBytes>(row, u2 + pat.c(lane)))
              << pat.name << " " << kRowBytes << "-byte rows, lane " << lane << ", base " << base << ", u2 " << u2;
          offsets.push_back(o);
        }
        for (int m = 0; m < 4; ++m) {
          const std::vector<uint32_t> matrix(offsets.begin() + 8 * m, offsets.begin() + 8 * m + 8);
          ASSERT_TRUE(conflict_free_16(matrix)) << pat.name << " matrix " << m << ", u2 " << u2;
        }
      }
    }
  }
}

TEST(Sm80Swizzle, LdmatrixFastPathMatchesAndIsConflictFree) {
  expect_ldmatrix_fast_path<128>();
  expect_ldmatrix_fast_path<192>();
  expect_ldmatrix_fast_path<256>();
  expect_ldmatrix_fast_path<384>();
  expect_ldmatrix_fast_path<512>();
}

// loads.cuh's TileCopy for a tile of kRows rows of Cfg: thread t copies row t / T + i x (rows per pass), unit t % T +
// g T, at its first destination (thread_dest) plus the compile-time offset i x (rows per pass) x row bytes + 16 T g.
// Every (row, unit) once, at swizzled_offset, and each quarter warp's 8 copies of one (i, g) conflict-free.
template <class Cfg, int kRows>
void expect_tile_copy() {
  constexpr int kRowBytes = Cfg::kRowBytes;
  constexpr int kT = Cfg::kCopyThreadsPerRow;
  constexpr int kColUnits = kRowBytes / 16 / kT;
  constexpr int kRowsPerPass = Cfg::kThreads / kT;
  constexpr int kPasses = kRows / kRowsPerPass;
  static_assert(kPasses * kRowsPerPass == kRows && kColUnits * kT * 16 == kRowBytes, "whole passes and units");
  std::set<uint32_t> covered;
  for (int i = 0; i < kPasses; ++i) {
    for (int g = 0; g < kColUnits; ++g) {
      for (int q = 0; q < Cfg::kThreads / 8; ++q) {
        std::vector<uint32_t> phase;
        for (int t = 8 * q; t < 8 * q + 8; ++t) {
          const uint32_t first = swizzled_offset<kRowBytes>(t / kT, t % kT);
          const uint32_t d = first + static_cast<uint32_t>(i * kRowsPerPass * kRowBytes + 16 * kT * g);
          ASSERT_EQ(d, swizzled_offset<kRowBytes>(t / kT + i * kRowsPerPass, t % kT + g * kT))
              << "head dim " << Cfg::kHeadDim << ": thread " << t << ", pass " << i << ", column group " << g;
          covered.insert(d);
          phase.push_back(d);
        }
        ASSERT_TRUE(conflict_free_16(phase)) << "head dim " << Cfg::kHeadDim << ": quarter warp " << q << ", pass "
                                             << i << ", column group " << g;
      }
    }
  }
  EXPECT_EQ(static_cast<int>(covered.size()), kRows * kRowBytes / 16);
}

// epilogue.cuh: the staging stores (4 bytes per lane: rows tile_row0 + lane / 4 + 8 i, unit j, + 4 (lane % 4)) hit
// 32 distinct banks; the copy out (one of its two branches, as there) reads every unit of the warp's rows once, each
// quarter warp conflict-free.
template <class Cfg>
void expect_epilogue() {
  constexpr int kRowBytes = Cfg::kRowBytes;
  constexpr int kWarpUnits = Cfg::kWarpDim * Cfg::kOutElemBytes / 16;
  for (int warp = 0; warp < Cfg::kWarps; ++warp) {
    const int warp_row0 = warp * Cfg::kRowsPerWarp;  // tile_row0(warp, 0) without split
    for (int t = 0; t < Cfg::kMTiles; ++t) {
      for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < Cfg::kWarpDim / 8; ++j) {
          std::set<int> banks;
          for (int lane = 0; lane < 32; ++lane) {
            const int r = warp_row0 + 16 * t + lane / 4 + 8 * i;
            banks.insert(static_cast<int>((swizzled_offset<kRowBytes>(r, j) + 4 * (lane % 4)) / 4 % 32));
          }
          ASSERT_EQ(banks.size(), 32u) << "head dim " << Cfg::kHeadDim << ": staging, warp " << warp << ", unit " << j;
        }
      }
    }
    // The copy out: (row within the warp's rows, unit) of lane `lane` in pass `pass`.
    std::set<uint32_t> covered;
    constexpr int kUnits = Cfg::kRowsPerWarp * kWarpUnits;
    for (int pass = 0; pass < kUnits / 32; ++pass) {
      std::vector<uint32_t> offsets;
      for (int lane = 0; lane < 32; ++lane) {
        int r, unit;
        if constexpr (32 % kWarpUnits == 0) {
          r = lane / kWarpUnits + 32 / kWarpUnits * pass, unit = lane % kWarpUnits;
        } else {
          r = (lane + 32 * pass) / kWarpUnits, unit = (lane + 32 * pass) % kWarpUnits;
        }
        offsets.push_back(swizzled_offset<kRowBytes>(warp_row0 + r, unit));
        covered.insert(offsets.back());
      }
      for (int q = 0; q < 4; ++q) {
        const std::vector<uint32_t> phase(offsets.begin() + 8 * q, offsets.begin() + 8 * q + 8);
        ASSERT_TRUE(conflict_free_16(phase)) << "head dim " << Cfg::kHeadDim << ": copy out, warp " << warp
                                             << ", pass " << pass << ", quarter " << q;
      }
    }
    EXPECT_EQ(static_cast<int>(covered.size()), kUnits);
  }
}

template <class Cfg>
void expect_forward_accesses() {
  expect_tile_copy<Cfg, Cfg::kBlockM>();  // Q
  expect_tile_copy<Cfg, Cfg::kBlockN>();  // K and V
  expect_epilogue<Cfg>();
}

// The head dim 96 rows of configs.txt (128 x 64, 4 warps x 32 rows; the stages do not change the accesses): 4 copy
// threads per row, 12-unit swizzle; and 8 warps of 16 rows (not in configs.txt): 64 rows per copy pass.
TEST(Sm80Swizzle, HeadDim96ForwardAccesses) {
  expect_forward_accesses<Tile<96, 128, 64, 4>>();
  expect_forward_accesses<Tile<96, 128, 64, 8>>();
  expect_forward_accesses<Tile<96, 64, 64, 4>>();
}

// The same model holds the other head dims' tiles (as before head dim 96).
TEST(Sm80Swizzle, OtherHeadDimsForwardAccesses) {
  expect_forward_accesses<Tile<64, 128, 64, 4>>();
  expect_forward_accesses<Tile<128, 128, 64, 4>>();
  expect_forward_accesses<Tile<128, 128, 64, 8>>();
  expect_forward_accesses<Tile<192, 128, 64, 8>>();
  expect_forward_accesses<Tile<256, 64, 64, 4>>();
  expect_forward_accesses<Tile<256, 128, 64, 8>>();
}

}  // namespace
