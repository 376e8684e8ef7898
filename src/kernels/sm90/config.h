// A kernel config: one row of the tile-config table (configs.txt) turned into the compile-time constants the
// sm90 kernel is built from. Rows are generated (gen_rows.cpp) as small structs with the fields below; the
// kernel takes KernelConfig<Row> as its only template parameter.
//
//   struct Row {                              // e.g. bf16, head dim 128, non-causal, 128x128, 2 stages
//     using Element = __nv_bfloat16;          // Q, K, V
//     using OutElement = __nv_bfloat16;       // O
//     static constexpr int kHeadDim = 128;
//     static constexpr bool kCausal = false;
//     static constexpr TileShape kShape = {128, 128, 2, true, Schedule::kStaticPersistent, false};
//   };
#pragma once
#include <cstdint>
#include <type_traits>

#include "kernels/common/element.cuh"
#include "kernels/sm90/smem_plan.h"
#include "kernels/sm90/tile_shape.h"

namespace flashcore::sm90 {

// A row's K/V storage type: Row::KVElement where the row declares one (the e4m3 KV-cache rows of configs_kv8.txt),
// else Element.
template <class Row, class = void>
struct RowKVElement {
  using type = typename Row::Element;
};
template <class Row>
struct RowKVElement<Row, std::void_t<typename Row::KVElement>> {
  using type = typename Row::KVElement;
};

template <class Row>
struct KernelConfig {
  using Element = typename Row::Element;
  using OutElement = typename Row::OutElement;
  static constexpr int kHeadDim = Row::kHeadDim;    // Q's and K's
  static constexpr int kHeadDimV = Row::kHeadDimV;  // V's and O's (MLA prefill: 192 / 128)
  static constexpr bool kCausal = Row::kCausal;
  static constexpr TileShape kShape = Row::kShape;
  static constexpr int kBlockM = kShape.block_m;
  static constexpr int kBlockN = kShape.block_n;
  static constexpr int kStages = kShape.stages;
  static constexpr bool kPingPong = kShape.pingpong;
  static constexpr Schedule kSchedule = kShape.schedule;
  static constexpr bool kPersistent =
      kSchedule == Schedule::kStaticPersistent || kSchedule == Schedule::kDynamicPersistent;
  static constexpr bool kSplitKv = kSchedule == Schedule::kSplitKv;
  static constexpr bool kLastRoundSplit = splits_last_round(kShape);  // prefill split: whole rounds, then parts
  static constexpr bool kSwapAB = swaps_gemms(kShape);  // decode_swap.cuh
  static constexpr int kKVBoxRows = kv_box_rows(kShape);  // rows per K/V TMA box (tile_shape.h)

  // Element is the type of Q and K (the S GEMM). Three families:
  //   16-bit: Q, K, V, P in Element;
  //   8-bit (kFp8: e4m3 or e5m2): Q, K, V in 8 bits, V transposed in the workspace (VLayout::kDimMajor), descales
  //   per head; P in e4m3 for both (three mantissa bits to e5m2's two: the P V GEMM of e5m2 inputs is e4m3 x e5m2);
  //   int8 Q K^T (kInt8QK, precision = INT8): Q, K int8 with per-token / per-64-key-block scales, S in s32;
  //   P and V in the 16-bit OutElement, V as stored.
  static constexpr bool kInt8QK = std::is_same_v<Element, int8_t>;
  static constexpr int kElemBytes = kernels::ElemTraits<Element>::kBytes;
  static constexpr bool kFp8 = kElemBytes == 1 && !kInt8QK;
  static constexpr int kOutElemBytes = kernels::ElemTraits<OutElement>::kBytes;
  static constexpr int kMmaK = kernels::kMmaK<Element>;       // S GEMM k-step
  static constexpr VLayout kVLayout = kFp8 ? VLayout::kDimMajor : VLayout::kKeyMajor;
  // An e4m3 KV cache under 16-bit Q (configs_kv8.txt, FLASHCORE_FLAG_KV_FP8_E4M3): TMA brings each K/V block in 8
  // bits into a staging ring, the producer's other warps widen it into the 16-bit tile the GEMMs read
  // (convert_kv.cuh), and the descales of the tile's (batch, KV head) scale S and O as the 8-bit rows' do.
  using KVElement = typename RowKVElement<Row>::type;
  static constexpr bool kKV8 = kernels::ElemTraits<KVElement>::kBytes == 1 && kElemBytes == 2;
  static constexpr bool kDescaled = kFp8 || kKV8;  // per-(batch, KV head) descales in the scores and O
  // The e4m3 KV cache's transposed decode rows (block_m 8): the consumers widen K and V from the staging ring into the
  // GEMMs' register operands (decode_swap_kv8.cuh); no converter warps, no 16-bit K/V ring.
  static constexpr bool kKV8Direct = kKV8 && swaps_gemms(kShape);
  // bf16 Q on an e4m3 KV cache computes in fp16 (MmaElement): e4m3 widens to fp16 in one instruction per pair, to bf16
  // in four, and the widening bounds these rows' speed. The consumers convert their Q slice to fp16 in place, scaled
  // by a power of two (convert_kv.cuh q_slice_to_half), P is fp16 and O is stored in bf16
  // (docs/decisions.md#kv8-half-compute).
  static constexpr bool kHalfCompute = kKV8 && std::is_same_v<Element, __nv_bfloat16>;
  using MmaElement = std::conditional_t<kHalfCompute, __half, Element>;  // the S GEMM's operands
  using PVElement = std::conditional_t<kInt8QK, OutElement, MmaElement>;
  static constexpr int kVElemBytes = kernels::ElemTraits<PVElement>::kBytes;
  static constexpr int kPVMmaK = kernels::kMmaK<PVElement>;   // P V GEMM k-step

  // Skip the O rescale when no row max of a warp changed (mainloop.cuh), with maxima kept within a slack of 2^8 (16-bit
  // and int8 P: softmax.cuh, kLazyRescale). It makes the time depend on the data, so it is a config column
  // (configs.txt: rescale vote/always).
  static constexpr bool kSkipUnitRescale = kShape.rescale_vote;
  static constexpr bool kLazyRescale = kSkipUnitRescale && !kFp8;  // 8-bit P keeps the exact max
  // The softmax reduces row 1's max between row 0's exponentials (softmax.cuh kRowAfterRow): +1..4% at d128 and d64
  // causal on the H100, -2..5% in the d64 non-causal rows, which keep ptxas's order (docs/decisions.md#row-after-row).
  static constexpr bool kRowAfterRow = kHeadDim != 64 || kCausal;

  // Launch shape and shared-memory layout (smem_plan.h, shared with the host).
  static constexpr SmemPlan kPlan =
      smem_plan(kShape, kHeadDim, kElemBytes, kOutElemBytes, kVElemBytes, kHeadDimV, kKV8);
  static constexpr int kConsumerWarpgroups = kPlan.consumer_warpgroups;
  static constexpr int kRowsPerWarpgroup = sm90::kRowsPerWarpgroup;
  // The causal 16-bit variants rows (TileShape::variants) take a sliding window (kernels/common/mask.cuh, tile.cuh
  // windowed): its bounds need registers where S, O and both P sets are live, and the rows with three consumer
  // warpgroups (d64, 192 query rows) have none to spare (they spilled), so the causal d64 variants row has two
  // (backend.cpp, variant_row).
  static constexpr bool kTakesWindow =
      kShape.variants && kCausal && kElemBytes == 2 && !kInt8QK && kConsumerWarpgroups < 3;
  static constexpr int kThreads = kPlan.threads;
  static constexpr int kConsumerThreads = kPlan.consumer_threads;
  // An e4m3 KV cache's producer warpgroup widens K and V (convert_kv.cuh): 96 registers keep several of a converter
  // thread's unrolled passes in flight (56 spilled there); its one consumer warpgroup keeps 240.
  static constexpr int kProducerRegs = kKV8 && !kKV8Direct ? 96 : producer_regs(kShape);
  // A packed row's producer keeps its ring positions (K/V, tile ids) as counts (pipeline.cuh PipelineCount).
  static constexpr bool kCountedRings = kShape.packed;
  static constexpr int kConsumerRegs = kPlan.consumer_regs;
  // P in two register sets that take turns, so that the softmax overlaps the P V GEMM (mainloop.cuh, keep_allocated),
  // where the second set fits: O, S and two P sets within 192 of 240 registers (ptxas spilled at d128 128x176, d256
  // 128x80 and with three consumer warpgroups' 160). The other configs keep one set, and ptxas waits for the P V GEMM
  // before their softmax.
  static constexpr int kPSteps = kBlockN / kPVMmaK;  // P V k-steps; a P set is 4 registers per step
  // 8-bit P leaves more room: 208 (d128 128 x 192, the long-sequence defaults: O 64 + S 96 + two P sets of 24, no
  // spills; docs/decisions.md#pv-overlap).
  static constexpr int kTwoPSetsBudget = kFp8 ? 208 : 192;
  static constexpr bool kTwoPSets =  // (the transposed decode rows keep P in shared memory: decode_swap.cuh)
      !kSwapAB && kConsumerRegs >= 240 && kHeadDimV / 2 + kBlockN / 2 + 2 * 4 * kPSteps <= kTwoPSetsBudget;

  // Shared-memory row widths (smem_plan.h swizzle_row_bytes): 128, or 64 (64-byte swizzle) for 8-bit head dim 64's Q
  // and K and for every tile of 16-bit head dim 96.
  static constexpr int kQKRowBytes = kPlan.qk_row_bytes;
  static constexpr int kVRowBytes = kPlan.v_row_bytes;  // a key-major V's (VLayout::kKeyMajor)
  static constexpr int kOutRowBytes = kPlan.out_row_bytes;  // the staged O's
  static constexpr int kChunkCols = kPlan.chunk_cols;
  static constexpr int kChunks = kPlan.chunks;
  static constexpr int kQChunkBytes = kPlan.q_chunk_bytes;
  static constexpr int kKVChunkBytes = kPlan.kv_chunk_bytes;
  // 8-bit V, transposed (VLayout::kDimMajor): rows are head-dim columns, kVTChunkKeys keys (bytes) per row of a chunk
  // (tile_shape.h: 128, or 64 with the 64-byte swizzle where the key block is not whole 128-key rows).
  static constexpr int kVTChunkKeys = vt_chunk_keys(kShape, kHeadDim);
  // 8-bit V given as stored can be transposed in place by the producer warps (transpose_v.cuh; tile_shape.h).
  static constexpr bool kTransposesV = kFp8 && transposes_v_in_place(kShape, kHeadDim);
  static constexpr int kVTChunks = kBlockN / kVTChunkKeys;
  static constexpr int kVTChunkBytes = kHeadDim * kVTChunkKeys;
  // V's row chunks (16-bit V of an int8 Q K^T config: 64 columns per chunk while Q and K have 128).
  static constexpr int kVChunkCols = kPlan.v_chunk_cols;
  static constexpr int kVChunks = kPlan.v_chunks;
  static constexpr int kVChunkBytes = kPlan.v_chunk_bytes;
  static constexpr int kQBytes = kPlan.q_bytes;
  static constexpr int kKTileBytes = kPlan.k_tile_bytes;
  static constexpr int kVTileBytes = kPlan.v_tile_bytes;
  static constexpr int kOutChunkCols = kPlan.out_chunk_cols;
  static constexpr int kOutChunks = kPlan.out_chunks;
  static constexpr int kOutChunkBytes = kPlan.out_chunk_bytes;
  static constexpr int kOutBytes = kPlan.out_bytes;
  // The e4m3 staging ring (kKV8): stage s of K at kSmemK8Offset + s * kK8TileBytes, V likewise; a block in the 8-bit
  // rows' layout (kKV8RowBytes-byte rows, kKV8Chunks chunks of kKV8ChunkCols columns, kKV8ChunkBytes each).
  static constexpr int kKV8RowBytes = kPlan.kv8_row_bytes;
  static constexpr int kKV8ChunkCols = kPlan.kv8_row_bytes;
  static constexpr int kKV8Chunks = kKV8 ? kHeadDim / kKV8ChunkCols : 0;
  static constexpr int kKV8ChunkBytes = kBlockN * kKV8RowBytes;
  static constexpr int kK8TileBytes = kPlan.k8_tile_bytes;
  static constexpr int kSmemK8Offset = kPlan.k8_offset;
  static constexpr int kSmemV8Offset = kPlan.v8_offset;

  static constexpr int kSmemQOffset = kPlan.q_offset;  // Q stage s: + s * kQBytes
  static constexpr int kQStages = kPlan.q_stages;
  static constexpr int kSmemKOffset = kPlan.k_offset;
  static constexpr int kSmemVOffset = kPlan.v_offset;
  static constexpr int kSmemKVEnd = kPlan.kv_end;
  static constexpr int kSmemSwapPOffset = kPlan.swap_p_offset;
  static constexpr int kSmemSwapRedOffset = kPlan.swap_red_offset;
  static constexpr int kSmemBarrierBytes = sm90::kSmemBarrierBytes;
  static constexpr int kSmemSlack = kSmemSlackBytes;
  static constexpr bool kSeparateO = kPlan.separate_o;
  static constexpr int kSmemOOffset = kPlan.o_offset;
  static constexpr int kSmemBarrierOffset = kPlan.barrier_offset;
  static constexpr int kSmemBytes = kPlan.smem_bytes;
  // Arrivals that release the Q tile: every consumer thread after its last S GEMM, or one thread per consumer
  // warpgroup after the store has read the staged O.
  static constexpr int kQReleaseArrivals = kSeparateO ? kConsumerThreads : kConsumerWarpgroups;

  static_assert((kElemBytes == 2 || kElemBytes == 1) && kOutElemBytes == 2, "16- or 8-bit inputs, 16-bit O");
  static_assert(!kFp8 || kBlockN % kVTChunkKeys == 0, "8-bit: the transposed V tile is whole 32-, 64- or 128-key chunks");
  static_assert(kElemBytes == 2 || !kSplitKv, "8-bit: no split-KV rows (yet)");
  static_assert(!kLastRoundSplit || kSeparateO, "a prefill split row's parts hand back their Q tile in the main loop");
  static_assert(!kInt8QK || (kBlockN % 64 == 0 && kVElemBytes == 2), "int8 Q K^T: one K scale per 64 keys, 16-bit V");
  static_assert(shape_fault(kShape, kHeadDim, kChunkCols, kPVMmaK, kSmemBytes) == ShapeFault::kNone,
                "the tile config breaks a shape rule (smem_plan.h shape_fault: head dim, block_m, block_n, stages, "
                "ping-pong, packed flavour, shared memory)");
  static_assert(kSeparateO || kOutBytes <= kQBytes, "O staged in the Q tile must fit there");
  static_assert(kQStages == 1 || kSwapAB, "a Q ring only on the transposed decode rows (no O staged in Q)");
  static_assert(!kSwapAB || kElemBytes == 2, "transposed decode: 16-bit inputs");
  static_assert(kHeadDimV == kHeadDim || (kElemBytes == 2 && !kInt8QK && !kSwapAB),
                "a V head dim of its own: 16-bit inputs, not the transposed decode rows");
  static_assert(kHeadDimV % kOutChunkCols == 0 && kHeadDimV % kVChunkCols == 0 && kHeadDimV <= 256,
                "V's head dim: whole chunks of V and O, wgmma N <= 256");
  static_assert(kVLayout == VLayout::kDimMajor || kVRowBytes == 128 ||
                    (kVRowBytes == 64 && kElemBytes == 2 && !kSwapAB && !kKV8),
                "64-byte V rows (16-bit head dim 96): the row kinds written for them (no transposed decode, no e4m3 "
                "KV cache)");
  static_assert(!kKV8 || (kSplitKv && !kLastRoundSplit && kHeadDimV == kHeadDim && !kShape.variants &&
                          std::is_same_v<KVElement, __nv_fp8_e4m3> && (!kSwapAB || kHeadDim == 128)),
                "e4m3 KV cache rows: split-KV 64-row tiles or transposed d128 decode tiles, one head dim, no variants "
                "(configs_kv8.txt)");
  static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumerThreads <= 65536, "register budget");
};

}  // namespace flashcore::sm90
