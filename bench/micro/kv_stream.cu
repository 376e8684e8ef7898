// kv_stream: how fast can CTAs stream a decode KV cache from HBM, with nothing else in the way?
//
// One CTA per (batch, kv head, split) reads its slice of K and V, (batch, seqlen, kv_heads, 128) bf16 (the
// layout of FA3's and FlashCore's caches: a 256-byte row every kv_heads x 256 bytes) or (batch, kv_heads, seqlen,
// 128) (contiguous per head), through a ring of `stages` stages of block_n keys, and hands each stage back after
// an optional hold (cycles of spinning, standing in for the consumer's GEMMs). Two copy engines:
//   tma:     one thread issues cp.async.bulk.tensor boxes of 64 columns x box_rows rows (128B swizzle, the boxes
//            of FlashCore's producer) completing on mbarrier transaction counts; three consumer warps release.
//   cpasync: all 128 threads issue 16-byte cp.async (each warp two whole 256-byte rows), cp.async.wait_group.
// Prints GB/s (K and V bytes / median time of 10 launches after 3 warm-ups, CUDA events).
//
//   bulk:    1D cp.async.bulk (a whole block per tensor for bhsd, one 256-byte row per copy for bshd).
//
//   kv_stream MODE B S H [--layout bshd|bhsd] [--stages N] [--block-n N] [--box-rows N] [--box-cols 64|128]
//             [--promo 0|64|128|256] [--hold CYCLES] [--splits N] [--head-dim 64|128] [--paged 1]
//   --paged 1 (tma only): the cache in pages of block_n keys, (pages, block_n, H, d), visited in the order of a
//   random block table (one per batch, shared by its heads), each page number read a block ahead.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda/ptx>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kThreads = 128;
constexpr int kMaxStages = 8;

struct Args {
  int B = 16, S = 65536, H = 8;
  bool bhsd = false;
  int stages = 3, block_n = 128, box_rows = 32, hold = 0, splits = 1;
  int promo = 256, box_cols = 64;  // TMA: L2 promotion bytes (0: none); box columns (128: no swizzle, whole rows)
  int d = 128;                     // head dim (64 or 128)
  const int* pages = nullptr;      // tma with --paged: the cache is (B * S / block_n pages, block_n, H, d), a page
                                   // per key block, and block n of batch b is page pages[b * S / block_n + n]
};

__device__ __forceinline__ void spin(int cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

// The slice a CTA streams: batch b, head h, key blocks [key0, key0 + nblocks * block_n) (split `blockIdx % splits`
// of the keys); row `key` of K or V at base + key * row_stride bytes (bshd: ((b * S + key) * H + h) rows, bhsd:
// ((b * H + h) * S + key) rows).
struct Slice {
  int b, h, key0, nblocks;
  int64_t base, row_stride;
};

__device__ __forceinline__ Slice slice_of(const Args& a) {
  Slice sl;
  const int split = blockIdx.x % a.splits, bh = blockIdx.x / a.splits;
  sl.h = bh % a.H;
  sl.b = bh / a.H;
  const int keys = a.S / a.splits;
  sl.key0 = split * keys;
  sl.nblocks = keys / a.block_n;
  const int64_t row = a.d * 2;
  sl.row_stride = a.bhsd ? row : int64_t(a.H) * row;
  sl.base = a.bhsd ? (int64_t(sl.b) * a.H + sl.h) * a.S * row : (int64_t(sl.b) * a.S * a.H + sl.h) * row;
  return sl;
}

__device__ __forceinline__ uint8_t* aligned_1k(uint8_t* raw) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
}

// The mbarrier ring of the tma and bulk modes: one producer arrival (with the transaction bytes) per full barrier,
// one arrival per consumer warp on the empty ones.
__device__ __forceinline__ void init_ring(const Args& a, uint64_t* full, uint64_t* empty) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < a.stages; ++s) {
      cuda::ptx::mbarrier_init(&full[s], 1);
      cuda::ptx::mbarrier_init(&empty[s], kThreads / 32 - 1);
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  __syncthreads();
}

__device__ __forceinline__ void wait_parity(uint64_t* bar, uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}

// Producer side of block n: wait for its stage to be free; returns the stage.
__device__ __forceinline__ int acquire_stage(const Args& a, uint64_t* empty, int n) {
  const int s = n % a.stages;
  wait_parity(&empty[s], ((n / a.stages) & 1) ^ 1u);
  return s;
}

// Consumer warps (1..3): wait for each block, read a word of it, hold it `hold` cycles, hand it back.
__device__ __forceinline__ float consume_ring(const Args& a, const uint8_t* smem, uint64_t* full, uint64_t* empty,
                                              int nblocks) {
  const int tile = a.block_n * a.d * 2;
  float acc = 0.f;
  for (int n = 0; n < nblocks; ++n) {
    const int s = n % a.stages;
    wait_parity(&full[s], (n / a.stages) & 1);
    acc += reinterpret_cast<const float*>(smem + s * 2 * tile)[threadIdx.x];
    if (a.hold > 0) spin(a.hold);
    __syncwarp();
    if (threadIdx.x % 32 == 0) {
      cuda::ptx::mbarrier_arrive(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared, &empty[s]);
    }
  }
  return acc;
}

// Stage s of the ring: K at s * 2 * tile, V right after; within a tile, column chunk c (64 columns, 128 bytes)
// at c * block_n * 128, row r of the chunk at r * 128 (the 128B-swizzled K-major layout wgmma reads).
__global__ void __launch_bounds__(kThreads) tma_stream(const __grid_constant__ CUtensorMap mk,
                                                      const __grid_constant__ CUtensorMap mv, Args a,
                                                      float* sink) {
  extern __shared__ uint8_t raw[];
  uint8_t* smem = aligned_1k(raw);
  __shared__ uint64_t full[kMaxStages], empty[kMaxStages];
  const int tile = a.block_n * a.d * 2;
  const Slice sl = slice_of(a);
  init_ring(a, full, empty);
  float acc = 0.f;
  if (threadIdx.x == 0) {
    const int* table =
        a.pages == nullptr ? nullptr : a.pages + int64_t(sl.b) * (a.S / a.block_n) + sl.key0 / a.block_n;
    int page = table == nullptr ? 0 : __ldg(table);
    for (int n = 0; n < sl.nblocks; ++n) {
      const int next_page = table != nullptr && n + 1 < sl.nblocks ? __ldg(table + n + 1) : 0;  // a block ahead
      const int s = acquire_stage(a, empty, n);
      cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                           &full[s], 2 * tile);
      for (int t = 0; t < 2; ++t) {
        const CUtensorMap* map = t == 0 ? &mk : &mv;
        for (int r = 0; r < a.block_n; r += a.box_rows) {
          for (int c = 0; c < a.d / a.box_cols; ++c) {
            const int32_t coords[4] = {c * a.box_cols, table != nullptr ? r : sl.key0 + n * a.block_n + r, sl.h,
                                       table != nullptr ? page : sl.b};
            cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global,
                                            smem + (2 * s + t) * tile + (c * a.block_n + r) * a.box_cols * 2, map,
                                            coords, &full[s]);
          }
        }
      }
      page = next_page;
    }
  } else if (threadIdx.x >= 32) {
    acc = consume_ring(a, smem, full, empty, sl.nblocks);
  }
  if (acc == 12345.f) sink[0] = acc;  // keeps the reads
}

// bulk: 1D cp.async.bulk. bhsd: one copy of block_n contiguous rows per tensor and block; bshd: one row per copy,
// issued by the 32 lanes of warp 0.
__global__ void __launch_bounds__(kThreads) bulk_stream(const uint8_t* k, const uint8_t* v, Args a, float* sink) {
  extern __shared__ uint8_t raw[];
  uint8_t* smem = aligned_1k(raw);
  __shared__ uint64_t full[kMaxStages], empty[kMaxStages];
  const int row = a.d * 2, tile = a.block_n * row;
  const Slice sl = slice_of(a);
  const int lane = threadIdx.x % 32;
  init_ring(a, full, empty);
  float acc = 0.f;
  if (threadIdx.x < 32) {
    for (int n = 0; n < sl.nblocks; ++n) {
      const int s = acquire_stage(a, empty, n);
      if (lane == 0) {
        cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                             &full[s], 2 * tile);
      }
      __syncwarp();
      for (int t = 0; t < 2; ++t) {
        const uint8_t* src = (t == 0 ? k : v) + sl.base + (sl.key0 + int64_t(n) * a.block_n) * sl.row_stride;
        uint8_t* dst = smem + (2 * s + t) * tile;
        if (a.bhsd) {
          if (lane == 0) {
            cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, src, tile, &full[s]);
          }
        } else {
          for (int r = lane; r < a.block_n; r += 32) {
            cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, dst + r * row,
                                     src + r * sl.row_stride, row, &full[s]);
          }
        }
      }
    }
  } else {
    acc = consume_ring(a, smem, full, empty, sl.nblocks);
  }
  if (acc == 12345.f) sink[0] = acc;
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void cp_async_wait_runtime(int n) {
  switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    case 6: cp_async_wait<6>(); break;
    default: cp_async_wait<7>(); break;
  }
}

// One stage: block_n rows of K then of V, in 16-byte pieces; thread t takes pieces t, t + 128, ...
__device__ __forceinline__ void cp_stage(const Args& a, const Slice& sl, const uint8_t* k, const uint8_t* v, int n,
                                         uint8_t* dst) {
  const int row = a.d * 2, per_row = row / 16, pieces = a.block_n * per_row;
  const int64_t row0 = sl.key0 + int64_t(n) * a.block_n;
  for (int t = 0; t < 2; ++t) {
    const uint8_t* src = (t == 0 ? k : v) + sl.base;
    for (int i = threadIdx.x; i < pieces; i += kThreads) {
      const int r = i / per_row, c = i % per_row;
      cp_async16(dst + (t * a.block_n + r) * row + c * 16, src + (row0 + r) * sl.row_stride + c * 16);
    }
  }
}

__global__ void __launch_bounds__(kThreads) cp_stream(const uint8_t* k, const uint8_t* v, Args a, float* sink) {
  extern __shared__ uint8_t raw[];
  const int tile = a.block_n * a.d * 2;
  const Slice sl = slice_of(a);
  float acc = 0.f;
  // Ring of `stages` stages, stages - 1 in flight ahead of the one being read (the sm80 scheme).
  for (int n = 0; n < a.stages - 1 && n < sl.nblocks; ++n) {
    cp_stage(a, sl, k, v, n, raw + n * 2 * tile);
    cp_async_commit();
  }
  for (int n = 0; n < sl.nblocks; ++n) {
    const int ahead = n + a.stages - 1;
    if (ahead < sl.nblocks) cp_stage(a, sl, k, v, ahead, raw + (ahead % a.stages) * 2 * tile);
    cp_async_commit();
    cp_async_wait_runtime(a.stages - 1);  // block n's group done, stages - 1 newer ones may be in flight
    __syncthreads();
    acc += reinterpret_cast<const float*>(raw + (n % a.stages) * 2 * tile)[threadIdx.x];
    if (a.hold > 0) spin(a.hold);
    __syncthreads();
  }
  if (acc == 12345.f) sink[0] = acc;
}

#define CHECK(x)                                                                        \
  do {                                                                                  \
    cudaError_t e = (x);                                                                \
    if (e != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

CUtensorMap make_map(void* base, const Args& a) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  // Dims {col, seq, head, batch}; strides in bytes of dims 1..3.
  const cuuint64_t row = cuuint64_t(a.d) * 2;  // bytes
  cuuint64_t dims[4] = {cuuint64_t(a.d), cuuint64_t(a.S), cuuint64_t(a.H), cuuint64_t(a.B)};
  cuuint64_t strides[3];
  if (a.pages != nullptr) {  // (pages, block_n, H, d)
    dims[1] = cuuint64_t(a.block_n);
    dims[3] = cuuint64_t(a.B) * (a.S / a.block_n);
    strides[0] = cuuint64_t(a.H) * row;
    strides[1] = row;
    strides[2] = cuuint64_t(a.block_n) * a.H * row;
  } else if (a.bhsd) {
    strides[0] = row;
    strides[1] = cuuint64_t(a.S) * row;
    strides[2] = cuuint64_t(a.H) * a.S * row;
  } else {
    strides[0] = cuuint64_t(a.H) * row;
    strides[1] = row;
    strides[2] = cuuint64_t(a.S) * a.H * row;
  }
  const cuuint32_t box[4] = {cuuint32_t(a.box_cols), cuuint32_t(a.box_rows), 1, 1};
  const CUtensorMapL2promotion promo = a.promo == 0    ? CU_TENSOR_MAP_L2_PROMOTION_NONE
                                       : a.promo == 64  ? CU_TENSOR_MAP_L2_PROMOTION_L2_64B
                                       : a.promo == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                                                        : CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  const CUtensorMapSwizzle swizzle = a.box_cols == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE;
  const cuuint32_t elem[4] = {1, 1, 1, 1};
  CUtensorMap m;
  CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, base, dims, strides, box, elem,
                      CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, promo,
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed (%d)\n", int(r));
    std::exit(1);
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: kv_stream tma|bulk|cpasync B S H [--layout bshd|bhsd] [--stages N] [--block-n N] "
                         "[--box-rows N] [--hold CYCLES] [--splits N]\n");
    return 2;
  }
  const std::string mode = argv[1];
  Args a;
  bool paged = false;
  a.B = std::atoi(argv[2]);
  a.S = std::atoi(argv[3]);
  a.H = std::atoi(argv[4]);
  for (int i = 5; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--layout") a.bhsd = v == "bhsd";
    else if (k == "--stages") a.stages = std::atoi(v.c_str());
    else if (k == "--block-n") a.block_n = std::atoi(v.c_str());
    else if (k == "--box-rows") a.box_rows = std::atoi(v.c_str());
    else if (k == "--hold") a.hold = std::atoi(v.c_str());
    else if (k == "--splits") a.splits = std::atoi(v.c_str());
    else if (k == "--promo") a.promo = std::atoi(v.c_str());
    else if (k == "--box-cols") a.box_cols = std::atoi(v.c_str());
    else if (k == "--head-dim") a.d = std::atoi(v.c_str());
    else if (k == "--paged") paged = std::atoi(v.c_str()) != 0;
    else { std::fprintf(stderr, "unknown option %s\n", k.c_str()); return 2; }
  }
  if (a.stages > kMaxStages || a.S % (a.splits * a.block_n) != 0 || a.block_n % a.box_rows != 0 ||
      (a.d != 64 && a.d != 128) || (paged && mode != "tma")) {
    std::fprintf(stderr, "bad arguments\n");
    return 2;
  }
  const size_t bytes = size_t(a.B) * a.S * a.H * (a.d * 2);
  uint8_t *k = nullptr, *v = nullptr;
  float* sink = nullptr;
  CHECK(cudaMalloc(&k, bytes));
  CHECK(cudaMalloc(&v, bytes));
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMemset(k, 0x3c, bytes));
  CHECK(cudaMemset(v, 0x3c, bytes));
  int* table = nullptr;
  if (paged) {  // a random permutation of the pages, shared by the heads of a batch (a serving engine's block table)
    const int n = a.B * (a.S / a.block_n);
    std::vector<int> perm(n);
    for (int i = 0; i < n; ++i) perm[i] = i;
    uint64_t x = 88172645463325252ull;
    for (int i = n - 1; i > 0; --i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::swap(perm[i], perm[x % (i + 1)]);
    }
    CHECK(cudaMalloc(&table, n * sizeof(int)));
    CHECK(cudaMemcpy(table, perm.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    a.pages = table;
  }
  const int grid = a.B * a.H * a.splits;
  const int smem = a.stages * 2 * a.block_n * (a.d * 2) + 1024;
  CUtensorMap mk{}, mv{};
  if (mode == "tma") {
    mk = make_map(k, a);
    mv = make_map(v, a);
    CHECK(cudaFuncSetAttribute(tma_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  } else if (mode == "bulk") {
    CHECK(cudaFuncSetAttribute(bulk_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  } else {
    CHECK(cudaFuncSetAttribute(cp_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  }
  auto launch = [&] {
    if (mode == "tma") tma_stream<<<grid, kThreads, smem>>>(mk, mv, a, sink);
    else if (mode == "bulk") bulk_stream<<<grid, kThreads, smem>>>(k, v, a, sink);
    else cp_stream<<<grid, kThreads, smem>>>(k, v, a, sink);
  };
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < 13; ++i) {
    CHECK(cudaEventRecord(e0));
    launch();
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float t = 0.f;
    CHECK(cudaEventElapsedTime(&t, e0, e1));
    if (i >= 3) ms.push_back(t);
  }
  CHECK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  const double t = ms[ms.size() / 2] * 1e-3;
  std::printf("%-7s d%d%s %s B=%d S=%d H=%d stages=%d block_n=%d box=%dx%d promo=%d hold=%d splits=%d grid=%d smem=%d: "
              "%.1f us, %.0f GB/s\n",
              mode.c_str(), a.d, paged ? " paged" : "", a.bhsd ? "bhsd" : "bshd", a.B, a.S, a.H, a.stages, a.block_n, a.box_cols, a.box_rows,
              a.promo, a.hold, a.splits, grid, smem, t * 1e6, 2.0 * bytes / t / 1e9);
  return 0;
}
