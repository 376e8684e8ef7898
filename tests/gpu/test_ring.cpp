// Ring attention and the merge of partial results on the GPU. The simulated ring's accuracy is judged by the check
// harness (Case::ring_world cases of check::cases, run by test_forward.cpp); here: the merge kernel against float64,
// the ring entries' device-side argument errors, and the real ring over NCCL on two GPUs, which must be bit-identical
// to the simulation (the same blocks, in the same order, with the same merge).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "dist/nccl.h"
#include "flashcore/flashcore.h"
#include "flashcore/ring.h"
#include "gpu/device_buffer.h"
#include "gpu/gpu_skip.h"

namespace {

using flashcore::test::DeviceBuffer;

uint16_t to_bf16(float x) {
  const __nv_bfloat16 b = __float2bfloat16(x);
  uint16_t bits;
  std::memcpy(&bits, &b, 2);
  return bits;
}
float from_bf16(uint16_t bits) {
  uint32_t u = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Folds two bf16 parts into a float32 state (init with the first), writes bf16 O, and compares with float64.
TEST(Merge, MatchesFloat64AndHandlesRowsWithNoKey) {
  FLASHCORE_REQUIRE_GPU();
  for (int D : {64, 128, 256}) {
    const int64_t B = 2, S = 37, H = 3, n = B * S * H * D, nl = B * H * S;
    std::mt19937 gen(1234 + D);
    std::normal_distribution<float> normal;
    std::vector<uint16_t> pa(n), pb(n);
    std::vector<float> la(nl), lb(nl);
    for (int64_t i = 0; i < n; ++i) pa[i] = to_bf16(normal(gen)), pb[i] = to_bf16(normal(gen));
    for (int64_t i = 0; i < nl; ++i) la[i] = 3 * normal(gen), lb[i] = 3 * normal(gen);
    // Row 0 of every (b, h): part a saw no key; row 1: neither did (O = 0, LSE = -inf); row 2: b saw none.
    for (int64_t bh = 0; bh < B * H; ++bh) {
      la[bh * S + 0] = -INFINITY, la[bh * S + 1] = -INFINITY, lb[bh * S + 1] = -INFINITY, lb[bh * S + 2] = -INFINITY;
    }
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          for (int64_t s : {0, 1}) pa[((b * S + s) * H + h) * D + d] = 0;
          for (int64_t s : {1, 2}) pb[((b * S + s) * H + h) * D + d] = 0;
        }
    DeviceBuffer dpa(n * 2), dpb(n * 2), dla(nl * 4), dlb(nl * 4), dacc(n * 4), dlacc(nl * 4), dout(n * 2);
    ASSERT_EQ(cudaMemcpy(dpa.ptr, pa.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dpb.ptr, pb.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dla.ptr, la.data(), nl * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dlb.ptr, lb.data(), nl * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(dacc.ptr, 0xff, n * 4), cudaSuccess);  // NaN: init must not read the state
    ASSERT_EQ(cudaMemset(dlacc.ptr, 0xff, nl * 4), cudaSuccess);
    ASSERT_EQ(cudaMemset(dout.ptr, 0xff, n * 2), cudaSuccess);

    flashcore_merge_params m;
    flashcore_merge_params_init(&m);
    m.batch = B, m.seqlen = S, m.num_heads = H, m.head_dim = D;
    const flashcore_tensor_strides o_strides{S * H * D, H * D, D, 1};
    m.o_part = dpa.ptr, m.o_part_strides = o_strides, m.part_dtype = FLASHCORE_DTYPE_BF16;
    m.lse_part = static_cast<const float*>(dla.ptr), m.lse_part_strides = {H * S, S, 1};
    m.o_acc = static_cast<float*>(dacc.ptr), m.o_acc_strides = o_strides;
    m.lse_acc = static_cast<float*>(dlacc.ptr), m.lse_acc_strides = {H * S, S, 1};
    m.init = 1;
    ASSERT_EQ(flashcore_attention_merge(&m, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
    m.o_part = dpb.ptr, m.lse_part = static_cast<const float*>(dlb.ptr), m.init = 0;
    m.o_out = dout.ptr, m.o_out_strides = o_strides, m.out_dtype = FLASHCORE_DTYPE_BF16;
    ASSERT_EQ(flashcore_attention_merge(&m, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
    std::vector<uint16_t> out(n);
    std::vector<float> lse(nl);
    ASSERT_EQ(cudaMemcpy(out.data(), dout.ptr, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(lse.data(), dlacc.ptr, nl * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    double max_err = 0, max_lse_err = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t s = 0; s < S; ++s) {
          const int64_t li = (b * H + h) * S + s;
          const double a = la[li], c = lb[li], m2 = std::max(a, c);
          const double wa = std::isinf(a) ? 0 : std::exp(a - m2), wb = std::isinf(c) ? 0 : std::exp(c - m2);
          const double total = wa + wb;
          if (total == 0) {
            EXPECT_TRUE(std::isinf(lse[li]) && lse[li] < 0) << "row with no key: lse " << lse[li];
          } else {
            max_lse_err = std::max(max_lse_err, std::abs(lse[li] - (m2 + std::log(total))));
          }
          for (int64_t d = 0; d < D; ++d) {
            const int64_t i = ((b * S + s) * H + h) * D + d;
            const double want = total == 0 ? 0 : (wa * from_bf16(pa[i]) + wb * from_bf16(pb[i])) / total;
            const float got = from_bf16(out[i]);
            ASSERT_TRUE(std::isfinite(got)) << "D=" << D << " b=" << b << " h=" << h << " s=" << s << " d=" << d;
            max_err = std::max(max_err, std::abs(got - want));
          }
        }
    EXPECT_LT(max_err, 0.02) << "D=" << D;  // one bf16 rounding of values below 4
    EXPECT_LT(max_lse_err, 1e-5) << "D=" << D;
  }
}

struct Shards {
  flashcore_ring_params ring{};
  std::vector<flashcore_attention_params> p;
  std::vector<std::unique_ptr<DeviceBuffer>> bufs;
};

// world ranks' shard buffers (bf16, bshd, zeros) on the current device, for the argument checks below.
Shards make_shards(int world, int64_t seqlen, int64_t heads, int64_t D) {
  Shards s;
  flashcore_ring_params_init(&s.ring);
  s.ring.world_size = world;
  s.ring.seqlen_global = seqlen;
  for (int r = 0; r < world; ++r) {
    int64_t a = 0, la = 0, b = 0, lb = 0;
    EXPECT_EQ(flashcore_ring_shard(&s.ring, r, &a, &la, &b, &lb), FLASHCORE_SUCCESS);
    const int64_t S = la + lb;
    flashcore_attention_params p;
    flashcore_attention_params_init(&p);
    p.batch = 1, p.seqlen_q = p.seqlen_k = S, p.num_heads_q = p.num_heads_kv = heads, p.head_dim = D;
    p.dtype = FLASHCORE_DTYPE_BF16;
    EXPECT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS);
    void** slots[] = {const_cast<void**>(&p.q), const_cast<void**>(&p.k), const_cast<void**>(&p.v), &p.o};
    for (void** slot : slots) {
      s.bufs.push_back(std::make_unique<DeviceBuffer>(static_cast<size_t>(S * heads * D * 2)));
      EXPECT_EQ(cudaMemset(s.bufs.back()->ptr, 0, static_cast<size_t>(S * heads * D * 2)), cudaSuccess);
      *slot = s.bufs.back()->ptr;
    }
    s.p.push_back(p);
  }
  return s;
}

TEST(Ring, SimulateChecksShardsAndWorkspace) {
  FLASHCORE_REQUIRE_GPU();
  Shards s = make_shards(3, 1001, 2, 128);
  uint64_t bytes = 0;
  ASSERT_EQ(flashcore_ring_workspace_size(&s.p[0], &s.ring, &bytes), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_GT(bytes, 0u);
  DeviceBuffer ws(bytes * 3);
  ASSERT_EQ(cudaMemset(ws.ptr, 0, bytes * 3), cudaSuccess);
  std::vector<const flashcore_attention_params*> locals = {&s.p[0], &s.p[1], &s.p[2]};

  s.ring.workspace = ws.ptr;
  s.ring.workspace_size = bytes * 3 - 256;
  EXPECT_EQ(flashcore_ring_attention_simulate(locals.data(), &s.ring, nullptr), FLASHCORE_ERROR_INVALID_SIZE);
  EXPECT_NE(std::string(flashcore_last_error()).find("workspace_size"), std::string::npos) << flashcore_last_error();
  s.ring.workspace_size = bytes * 3;
  ASSERT_EQ(flashcore_ring_attention_simulate(locals.data(), &s.ring, nullptr), FLASHCORE_SUCCESS)
      << flashcore_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  flashcore_attention_params wrong = s.p[1];
  wrong.seqlen_q = wrong.seqlen_k = wrong.seqlen_q + 1;
  locals[1] = &wrong;
  EXPECT_EQ(flashcore_ring_attention_simulate(locals.data(), &s.ring, nullptr), FLASHCORE_ERROR_INVALID_SIZE);
  EXPECT_NE(std::string(flashcore_last_error()).find("local[1].seqlen_q"), std::string::npos) << flashcore_last_error();
  wrong = s.p[1];
  wrong.num_heads_kv = 1;
  EXPECT_EQ(flashcore_ring_attention_simulate(locals.data(), &s.ring, nullptr), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("num_heads_kv differs"), std::string::npos) << flashcore_last_error();
  wrong = s.p[1];
  wrong.kernel_config = "128x128x2-pp-static";
  EXPECT_EQ(flashcore_ring_attention_simulate(locals.data(), &s.ring, nullptr), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("kernel_config"), std::string::npos) << flashcore_last_error();
  std::vector<uint8_t> host(64);
  wrong = s.p[1];
  wrong.o = host.data();
  EXPECT_EQ(flashcore_ring_attention_simulate(locals.data(), &s.ring, nullptr), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("local[1]"), std::string::npos) << flashcore_last_error();
}

TEST(Ring, ForwardWithoutCommunicatorSaysWhy) {
  FLASHCORE_REQUIRE_GPU();
  Shards s = make_shards(2, 100, 2, 64);
  s.ring.rank = 0;
  const flashcore_status st = flashcore_ring_attention_forward(&s.p[0], &s.ring, nullptr);
  // Without NCCL the loader's message; with it, the missing communicator.
  EXPECT_TRUE(st == FLASHCORE_ERROR_NCCL || st == FLASHCORE_ERROR_NULL_POINTER) << flashcore_last_error();
  EXPECT_NE(std::string(flashcore_last_error()).find(st == FLASHCORE_ERROR_NCCL ? "NCCL" : "nccl_comm"),
            std::string::npos)
      << flashcore_last_error();
}

// Random bf16 shard contents for rank r of a ring, from the global tensors (bshd).
std::vector<uint16_t> shard_rows(const std::vector<uint16_t>& global, const std::vector<int64_t>& rows, int64_t width) {
  std::vector<uint16_t> out;
  out.reserve(rows.size() * static_cast<size_t>(width));
  for (int64_t g : rows) out.insert(out.end(), global.begin() + g * width, global.begin() + (g + 1) * width);
  return out;
}

// Two GPUs, one thread each, a communicator from ncclCommInitAll: O and LSE of every rank bit-identical to the
// simulated ring's, for causal and not, both layouts, an odd length and GQA.
TEST(Ring, NcclOnTwoGpusMatchesTheSimulationBitForBit) {
  FLASHCORE_REQUIRE_GPU();
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  if (devices < 2) GTEST_SKIP() << "multi-GPU test skipped: needs 2 GPUs, found " << devices;
  std::string why;
  const flashcore::dist::NcclApi* nccl = flashcore::dist::nccl(why);
  if (nccl == nullptr) GTEST_SKIP() << "multi-GPU test skipped: " << why;
  const int world = 2;
  void* comms[2] = {nullptr, nullptr};
  const int devlist[2] = {0, 1};
  ASSERT_EQ(nccl->comm_init_all(comms, world, devlist), 0);

  const int64_t Hq = 8, Hkv = 2, D = 128;
  for (flashcore_ring_layout layout : {FLASHCORE_RING_ZIGZAG, FLASHCORE_RING_CONTIGUOUS}) {
    for (int causal : {0, 1}) {
      const int64_t seqlen = 4097;
      std::mt19937 gen(99 + causal + 2 * layout);
      std::normal_distribution<float> normal;
      std::vector<uint16_t> q(seqlen * Hq * D), k(seqlen * Hkv * D), v(seqlen * Hkv * D);
      for (auto* t : {&q, &k, &v})
        for (auto& x : *t) x = to_bf16(normal(gen));
      flashcore_ring_params ring;
      flashcore_ring_params_init(&ring);
      ring.world_size = world;
      ring.seqlen_global = seqlen;
      ring.layout = layout;

      // Per rank and per mode (0 = simulated on device 0, 1 = NCCL on device `rank`): buffers and params.
      struct Run {
        std::unique_ptr<DeviceBuffer> q, k, v, o, lse, ws;
        flashcore_attention_params p{};
        std::vector<uint16_t> o_host;
        std::vector<float> lse_host;
        int64_t S = 0;
      };
      Run runs[2][2];
      uint64_t ws_bytes = 0;
      for (int mode = 0; mode < 2; ++mode) {
        for (int r = 0; r < world; ++r) {
          ASSERT_EQ(cudaSetDevice(mode == 0 ? 0 : r), cudaSuccess);
          int64_t a = 0, la = 0, b = 0, lb = 0;
          ASSERT_EQ(flashcore_ring_shard(&ring, r, &a, &la, &b, &lb), FLASHCORE_SUCCESS);
          std::vector<int64_t> rows;
          for (int64_t i = 0; i < la; ++i) rows.push_back(a + i);
          for (int64_t i = 0; i < lb; ++i) rows.push_back(b + i);
          Run& R = runs[mode][r];
          R.S = static_cast<int64_t>(rows.size());
          const auto lq = shard_rows(q, rows, Hq * D), lk = shard_rows(k, rows, Hkv * D), lv = shard_rows(v, rows, Hkv * D);
          R.q = std::make_unique<DeviceBuffer>(lq.size() * 2);
          R.k = std::make_unique<DeviceBuffer>(lk.size() * 2);
          R.v = std::make_unique<DeviceBuffer>(lv.size() * 2);
          R.o = std::make_unique<DeviceBuffer>(lq.size() * 2);
          R.lse = std::make_unique<DeviceBuffer>(static_cast<size_t>(Hq * R.S) * 4);
          ASSERT_EQ(cudaMemcpy(R.q->ptr, lq.data(), lq.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(R.k->ptr, lk.data(), lk.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(R.v->ptr, lv.data(), lv.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
          ASSERT_EQ(cudaMemset(R.o->ptr, 0xff, lq.size() * 2), cudaSuccess);
          flashcore_attention_params& p = R.p;
          flashcore_attention_params_init(&p);
          p.q = R.q->ptr, p.k = R.k->ptr, p.v = R.v->ptr, p.o = R.o->ptr, p.lse = static_cast<float*>(R.lse->ptr);
          p.batch = 1, p.seqlen_q = p.seqlen_k = R.S, p.num_heads_q = Hq, p.num_heads_kv = Hkv, p.head_dim = D;
          p.dtype = FLASHCORE_DTYPE_BF16, p.causal = causal;
          ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS);
          ASSERT_EQ(flashcore_ring_workspace_size(&p, &ring, &ws_bytes), FLASHCORE_SUCCESS) << flashcore_last_error();
          const uint64_t bytes = mode == 0 ? ws_bytes * world : ws_bytes;
          if (mode == 1 || r == 0) {
            R.ws = std::make_unique<DeviceBuffer>(bytes);
            ASSERT_EQ(cudaMemset(R.ws->ptr, 0, bytes), cudaSuccess);
          }
        }
      }
      // Simulated, on device 0.
      ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
      flashcore_ring_params sim = ring;
      sim.workspace = runs[0][0].ws->ptr;
      sim.workspace_size = ws_bytes * world;
      const flashcore_attention_params* locals[] = {&runs[0][0].p, &runs[0][1].p};
      ASSERT_EQ(flashcore_ring_attention_simulate(locals, &sim, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      // Over NCCL: one thread per rank.
      flashcore_status status[2] = {FLASHCORE_ERROR_INTERNAL, FLASHCORE_ERROR_INTERNAL};
      std::string errors[2];
      std::vector<std::thread> threads;
      for (int r = 0; r < world; ++r) {
        threads.emplace_back([&, r] {
          cudaSetDevice(r);
          flashcore_ring_params mine = ring;
          mine.rank = r;
          mine.nccl_comm = comms[r];
          mine.workspace = runs[1][r].ws->ptr;
          mine.workspace_size = ws_bytes;
          cudaStream_t stream;
          cudaStreamCreate(&stream);
          status[r] = flashcore_ring_attention_forward(&runs[1][r].p, &mine, reinterpret_cast<flashcore_stream_t>(stream));
          errors[r] = flashcore_last_error();
          cudaStreamSynchronize(stream);
          cudaStreamDestroy(stream);
        });
      }
      for (auto& t : threads) t.join();
      for (int r = 0; r < world; ++r) ASSERT_EQ(status[r], FLASHCORE_SUCCESS) << "rank " << r << ": " << errors[r];
      for (int mode = 0; mode < 2; ++mode) {
        for (int r = 0; r < world; ++r) {
          Run& R = runs[mode][r];
          ASSERT_EQ(cudaSetDevice(mode == 0 ? 0 : r), cudaSuccess);
          R.o_host.resize(static_cast<size_t>(R.S * Hq * D));
          R.lse_host.resize(static_cast<size_t>(R.S * Hq));
          ASSERT_EQ(cudaMemcpy(R.o_host.data(), R.o->ptr, R.o_host.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(R.lse_host.data(), R.lse->ptr, R.lse_host.size() * 4, cudaMemcpyDeviceToHost),
                    cudaSuccess);
        }
      }
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(std::memcmp(runs[0][r].o_host.data(), runs[1][r].o_host.data(), runs[0][r].o_host.size() * 2), 0)
            << "rank " << r << " O differs from the simulation (layout " << layout << ", causal " << causal << ")";
        EXPECT_EQ(std::memcmp(runs[0][r].lse_host.data(), runs[1][r].lse_host.data(), runs[0][r].lse_host.size() * 4), 0)
            << "rank " << r << " LSE differs from the simulation";
      }
      for (int mode = 0; mode < 2; ++mode) {
        for (int r = 0; r < world; ++r) {
          cudaSetDevice(mode == 0 ? 0 : r);
          runs[mode][r] = Run{};
        }
      }
      cudaSetDevice(0);
    }
  }
  for (void* c : comms) nccl->comm_destroy(c);
}

}  // namespace
