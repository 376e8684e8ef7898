// `flashcore ring`: scaling of ring attention (include/flashcore/ring.h) over the GPUs of this machine, one thread
// per GPU and an NCCL communicator from ncclCommInitAll (NCCL loaded at run time, src/dist/nccl.h). Per sequence
// length and mask, in one run: T1 = the whole sequence on GPU 0; TN = the ring over N GPUs (the slowest rank);
// TN serial = the same with FLASHCORE_RING_SERIALIZE (no overlap); Tcomm = the ring's transfers alone; the largest
// difference between the ring's O and the one-GPU O. Efficiency = T1 / (N * TN).
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "commands.h"
#include "common.h"
#include "dist/nccl.h"
#include "flashcore/ring.h"
#include "random_pool.h"
#include "reference/reference.h"

namespace fccli {

void print_ring_help() {
  std::printf(
      "usage: flashcore ring [options]\n"
      "  ring attention over the visible GPUs (one thread each, NCCL), against one GPU on the whole sequence\n"
      "  --seqlens L1,L2,..   sequence lengths (default 32768,65536,131072,262144)\n"
      "  --head-dims D        64, 128 or 256 (default 128): one head dim per run (old name: --head-dim)\n"
      "  --heads H            query heads (default 16)\n"
      "  --kv-heads H         KV heads (default 16)\n"
      "  --gpus N             ranks (default: every visible GPU)\n"
      "  --layout zigzag|contiguous  (default zigzag)\n"
      "  --iters N            timed repetitions, median reported (default 5; old name: --reps)\n"
      "  --json FILE          also write the rows as JSON\n"
      "  NCCL: $FLASHCORE_NCCL_LIBRARY, else libnccl.so.2 on the loader's path\n");
}

namespace {

// A reusable barrier for the rank threads (C++17 has none).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(m_);
    const int gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen != gen_; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_ = 0, gen_ = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Row {
  int64_t seqlen = 0;
  bool causal = false;
  double t1 = 0, tn = 0, tn_serial = 0, tcomm = 0, max_err = 0;
};

// One rank's buffers: its shard of Q, K, V, its O, the ring workspace, the transfer-only buffers.
struct RankState {
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *ws = nullptr, *xfer[2] = {nullptr, nullptr};
  uint64_t ws_bytes = 0;
  int64_t rows = 0;
  flashcore_attention_params p{};
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  ~RankState() {
    for (void* ptr : {q, k, v, o, ws, xfer[0], xfer[1]})
      if (ptr) cudaFree(ptr);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (stream) cudaStreamDestroy(stream);
  }
};

}  // namespace

int run_ring(int argc, char** argv, int first) {
  std::vector<int64_t> seqlens = {32768, 65536, 131072, 262144};
  int64_t D = 128, Hq = 16, Hkv = 16, reps = 5, gpus = 0;
  flashcore_ring_layout layout = FLASHCORE_RING_ZIGZAG;
  std::string json;
  for (int i = first; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      print_ring_help();
      return kExitOk;
    } else if (a == "--seqlens") {
      seqlens.clear();
      for (const std::string& s : split(value(), ',')) seqlens.push_back(parse_int(a, s, 2, 1 << 24));
    } else if (a == "--head-dims" || a == "--head-dim") {  // --head-dim: the old name, kept as an alias
      const std::vector<std::string> dims = split(value(), ',');
      if (dims.size() != 1) usage_error(a + ": one head dim per run (the ring's rows share it)");
      D = parse_int(a, dims[0], 64, 256);
    } else if (a == "--heads") {
      Hq = parse_int(a, value(), 1, 1024);
    } else if (a == "--kv-heads") {
      Hkv = parse_int(a, value(), 1, 1024);
    } else if (a == "--gpus") {
      gpus = parse_int(a, value(), 1, 64);
    } else if (a == "--iters" || a == "--reps") {  // --reps: the old name, kept as an alias
      reps = parse_int(a, value(), 1, 1000);
    } else if (a == "--layout") {
      const std::string l = value();
      if (l != "zigzag" && l != "contiguous") usage_error("--layout must be zigzag or contiguous");
      layout = l == "zigzag" ? FLASHCORE_RING_ZIGZAG : FLASHCORE_RING_CONTIGUOUS;
    } else if (a == "--json") {
      json = value();
    } else {
      usage_error("unknown option '" + a + "'");
    }
  }
  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess || visible == 0) {
    std::fprintf(stderr, "flashcore ring: no CUDA device\n");
    return kExitNoGpu;
  }
  const int world = static_cast<int>(gpus > 0 ? gpus : visible);
  if (world > visible) usage_error("--gpus " + std::to_string(world) + ": only " + std::to_string(visible) + " visible");
  std::string why;
  const flashcore::dist::NcclApi* nccl = flashcore::dist::nccl(why);
  if (nccl == nullptr) {
    std::fprintf(stderr, "flashcore ring: %s\n", why.c_str());
    return kExitFailure;
  }
  std::vector<void*> comms(static_cast<size_t>(world));
  std::vector<int> devlist(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) devlist[static_cast<size_t>(r)] = r;
  if (int rc = nccl->comm_init_all(comms.data(), world, devlist.data()); rc != 0) {
    std::fprintf(stderr, "flashcore ring: ncclCommInitAll: %s\n", nccl->get_error_string(rc));
    return kExitFailure;
  }
  int nccl_version = 0;
  nccl->get_version(&nccl_version);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("flashcore ring: %d x %s, NCCL %d (%s), bf16 d%lld, %lld/%lld heads, %s, median of %lld\n", world,
              prop.name, nccl_version, nccl->path.c_str(), static_cast<long long>(D), static_cast<long long>(Hq),
              static_cast<long long>(Hkv), layout == FLASHCORE_RING_ZIGZAG ? "zigzag" : "contiguous",
              static_cast<long long>(reps));
  std::printf("| seqlen | causal | T1 ms | T%d ms | efficiency | serial ms | comm-only ms | hidden | max err |\n", world);
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  std::vector<Row> rows;
  RandomPool pool(20261123);
  std::mt19937_64 rng(7);
  for (int64_t S : seqlens) {
    for (bool causal : {false, true}) {
      Row row;
      row.seqlen = S;
      row.causal = causal;
      // The whole sequence on GPU 0: inputs, one-GPU O.
      FC_CUDA(cudaSetDevice(0));
      const size_t qb = static_cast<size_t>(S * Hq * D * 2), kvb = static_cast<size_t>(S * Hkv * D * 2);
      void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *ws = nullptr;
      FC_CUDA(cudaMalloc(&q, qb));
      FC_CUDA(cudaMalloc(&k, kvb));
      FC_CUDA(cudaMalloc(&v, kvb));
      FC_CUDA(cudaMalloc(&o, qb));
      pool.fill(static_cast<char*>(q), qb, FLASHCORE_DTYPE_BF16, rng, nullptr);
      pool.fill(static_cast<char*>(k), kvb, FLASHCORE_DTYPE_BF16, rng, nullptr);
      pool.fill(static_cast<char*>(v), kvb, FLASHCORE_DTYPE_BF16, rng, nullptr);
      flashcore_attention_params full;
      flashcore_attention_params_init(&full);
      full.q = q, full.k = k, full.v = v, full.o = o;
      full.batch = 1, full.seqlen_q = full.seqlen_k = S, full.num_heads_q = Hq, full.num_heads_kv = Hkv;
      full.head_dim = D, full.dtype = FLASHCORE_DTYPE_BF16, full.causal = causal ? 1 : 0;
      flashcore_attention_params_set_contiguous(&full, 0);
      uint64_t wsb = 0;
      if (flashcore_attention_workspace_size(&full, &wsb) != FLASHCORE_SUCCESS) {
        std::fprintf(stderr, "flashcore ring: %s\n", flashcore_last_error());
        return kExitFailure;
      }
      if (wsb > 0) {
        FC_CUDA(cudaMalloc(&ws, wsb));
        FC_CUDA(cudaMemset(ws, 0, wsb));
        full.workspace = ws, full.workspace_size = wsb;
      }
      {
        cudaEvent_t a, b;
        FC_CUDA(cudaEventCreate(&a));
        FC_CUDA(cudaEventCreate(&b));
        std::vector<double> t;
        for (int64_t rep = 0; rep <= reps; ++rep) {
          FC_CUDA(cudaEventRecord(a, nullptr));
          if (flashcore_attention_forward(&full, nullptr) != FLASHCORE_SUCCESS) {
            std::fprintf(stderr, "flashcore ring: %s\n", flashcore_last_error());
            return kExitFailure;
          }
          FC_CUDA(cudaEventRecord(b, nullptr));
          FC_CUDA(cudaEventSynchronize(b));
          float ms = 0;
          FC_CUDA(cudaEventElapsedTime(&ms, a, b));
          if (rep > 0) t.push_back(ms);  // rep 0 is the warm-up
        }
        row.t1 = median(t);
        cudaEventDestroy(a);
        cudaEventDestroy(b);
      }
      // The shards, copied from GPU 0 to each rank's GPU.
      flashcore_ring_params ring;
      flashcore_ring_params_init(&ring);
      ring.world_size = world;
      ring.seqlen_global = S;
      ring.layout = layout;
      std::vector<std::unique_ptr<RankState>> ranks;
      std::vector<std::vector<std::pair<int64_t, int64_t>>> chunks(static_cast<size_t>(world));
      for (int r = 0; r < world; ++r) {
        ranks.push_back(std::make_unique<RankState>());
        RankState& R = *ranks.back();
        int64_t s0 = 0, l0 = 0, s1 = 0, l1 = 0;
        flashcore_ring_shard(&ring, r, &s0, &l0, &s1, &l1);
        chunks[static_cast<size_t>(r)] = {{s0, l0}, {s1, l1}};
        R.rows = l0 + l1;
        FC_CUDA(cudaSetDevice(r));
        FC_CUDA(cudaStreamCreateWithFlags(&R.stream, cudaStreamNonBlocking));
        FC_CUDA(cudaEventCreate(&R.start));
        FC_CUDA(cudaEventCreate(&R.stop));
        FC_CUDA(cudaMalloc(&R.q, static_cast<size_t>(R.rows * Hq * D * 2)));
        FC_CUDA(cudaMalloc(&R.k, static_cast<size_t>(R.rows * Hkv * D * 2)));
        FC_CUDA(cudaMalloc(&R.v, static_cast<size_t>(R.rows * Hkv * D * 2)));
        FC_CUDA(cudaMalloc(&R.o, static_cast<size_t>(R.rows * Hq * D * 2)));
        int64_t at = 0;
        for (const auto& [start, len] : chunks[static_cast<size_t>(r)]) {
          if (len == 0) continue;
          FC_CUDA(cudaMemcpyPeer(static_cast<char*>(R.q) + at * Hq * D * 2, r, static_cast<char*>(q) + start * Hq * D * 2, 0,
                                 static_cast<size_t>(len * Hq * D * 2)));
          FC_CUDA(cudaMemcpyPeer(static_cast<char*>(R.k) + at * Hkv * D * 2, r, static_cast<char*>(k) + start * Hkv * D * 2, 0,
                                 static_cast<size_t>(len * Hkv * D * 2)));
          FC_CUDA(cudaMemcpyPeer(static_cast<char*>(R.v) + at * Hkv * D * 2, r, static_cast<char*>(v) + start * Hkv * D * 2, 0,
                                 static_cast<size_t>(len * Hkv * D * 2)));
          at += len;
        }
        R.p = full;
        R.p.q = R.q, R.p.k = R.k, R.p.v = R.v, R.p.o = R.o;
        R.p.seqlen_q = R.p.seqlen_k = R.rows;
        R.p.workspace = nullptr, R.p.workspace_size = 0;
        flashcore_attention_params_set_contiguous(&R.p, 0);
        if (flashcore_ring_workspace_size(&R.p, &ring, &R.ws_bytes) != FLASHCORE_SUCCESS) {
          std::fprintf(stderr, "flashcore ring: %s\n", flashcore_last_error());
          return kExitFailure;
        }
        FC_CUDA(cudaMalloc(&R.ws, R.ws_bytes));
        FC_CUDA(cudaMemset(R.ws, 0, R.ws_bytes));
        const size_t xfer = static_cast<size_t>(2 * (S / world) * Hkv * D * 2);  // the same count on every rank
        FC_CUDA(cudaMalloc(&R.xfer[0], xfer));
        FC_CUDA(cudaMalloc(&R.xfer[1], xfer));
        FC_CUDA(cudaDeviceSynchronize());
      }
      // Each mode: every rank in its thread, `reps` timed runs after a warm-up; a rep's time is the slowest rank's.
      auto timed = [&](int mode) -> double {  // 0 ring, 1 ring serialized, 2 transfers alone
        Barrier barrier(world);
        std::vector<std::vector<double>> per_rank(static_cast<size_t>(world));
        std::vector<std::string> errors(static_cast<size_t>(world));
        std::vector<std::thread> threads;
        for (int r = 0; r < world; ++r) {
          threads.emplace_back([&, r] {
            RankState& R = *ranks[static_cast<size_t>(r)];
            cudaSetDevice(r);
            flashcore_ring_params mine = ring;
            mine.rank = r;
            mine.nccl_comm = comms[static_cast<size_t>(r)];
            mine.workspace = R.ws;
            mine.workspace_size = R.ws_bytes;
            mine.flags = mode == 1 ? FLASHCORE_RING_SERIALIZE : 0;
            const int next = (r + 1) % world, prev = (r + world - 1) % world;
            const size_t bytes = static_cast<size_t>(2 * (S / world) * Hkv * D * 2);
            for (int64_t rep = 0; rep <= reps; ++rep) {
              barrier.wait();
              cudaEventRecord(R.start, R.stream);
              if (mode == 2) {
                for (int step = 0; step + 1 < world; ++step) {
                  nccl->group_start();
                  nccl->send(R.xfer[step % 2], bytes, flashcore::dist::NcclApi::kUint8, next, mine.nccl_comm, R.stream);
                  nccl->recv(R.xfer[1 - step % 2], bytes, flashcore::dist::NcclApi::kUint8, prev, mine.nccl_comm, R.stream);
                  nccl->group_end();
                }
              } else if (flashcore_ring_attention_forward(&R.p, &mine, reinterpret_cast<flashcore_stream_t>(R.stream)) !=
                         FLASHCORE_SUCCESS) {
                errors[static_cast<size_t>(r)] = flashcore_last_error();
              }
              cudaEventRecord(R.stop, R.stream);
              cudaEventSynchronize(R.stop);
              float ms = 0;
              cudaEventElapsedTime(&ms, R.start, R.stop);
              if (rep > 0) per_rank[static_cast<size_t>(r)].push_back(ms);
            }
          });
        }
        for (auto& t : threads) t.join();
        for (const std::string& e : errors) {
          if (!e.empty()) throw CliError(kExitFailure, "ring forward: " + e);
        }
        std::vector<double> slowest(static_cast<size_t>(reps), 0.0);
        for (const auto& t : per_rank)
          for (size_t i = 0; i < t.size(); ++i) slowest[i] = std::max(slowest[i], t[i]);
        return median(slowest);
      };
      row.tn = timed(0);
      // Accuracy of the (overlapped) ring's O against the one-GPU O, on the host.
      {
        std::vector<uint16_t> ref(static_cast<size_t>(S * Hq * D)), got;
        FC_CUDA(cudaSetDevice(0));
        FC_CUDA(cudaMemcpy(ref.data(), o, qb, cudaMemcpyDeviceToHost));
        for (int r = 0; r < world; ++r) {
          RankState& R = *ranks[static_cast<size_t>(r)];
          got.resize(static_cast<size_t>(R.rows * Hq * D));
          FC_CUDA(cudaSetDevice(r));
          FC_CUDA(cudaMemcpy(got.data(), R.o, got.size() * 2, cudaMemcpyDeviceToHost));
          int64_t at = 0;
          for (const auto& [start, len] : chunks[static_cast<size_t>(r)]) {
            for (int64_t i = 0; i < len * Hq * D; ++i) {
              const double a = flashcore::reference::bf16_to_float(got[static_cast<size_t>(at * Hq * D + i)]);
              const double b = flashcore::reference::bf16_to_float(ref[static_cast<size_t>(start * Hq * D + i)]);
              row.max_err = std::max(row.max_err, std::abs(a - b));
            }
            at += len;
          }
        }
      }
      row.tn_serial = timed(1);
      row.tcomm = timed(2);
      ranks.clear();
      FC_CUDA(cudaSetDevice(0));
      for (void* ptr : {q, k, v, o, ws})
        if (ptr) cudaFree(ptr);
      const double eff = row.t1 / (world * row.tn);
      const double hidden = row.tcomm > 0 ? (row.tn_serial - row.tn) / row.tcomm : 0;
      std::printf("| %lld | %s | %.2f | %.2f | %.1f%% | %.2f | %.2f | %.0f%% | %.3g |\n", static_cast<long long>(S),
                  causal ? "yes" : "no", row.t1, row.tn, 100 * eff, row.tn_serial, row.tcomm, 100 * hidden, row.max_err);
      std::fflush(stdout);
      rows.push_back(row);
    }
  }
  for (void* c : comms) nccl->comm_destroy(c);
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f == nullptr) throw CliError(kExitFailure, "cannot write " + json);
    std::fprintf(f, "{\"gpu\": \"%s\", \"world\": %d, \"nccl\": %d, \"head_dim\": %lld, \"heads\": %lld, \"kv_heads\": %lld, \"rows\": [",
                 json_escape(prop.name).c_str(), world, nccl_version, static_cast<long long>(D),
                 static_cast<long long>(Hq), static_cast<long long>(Hkv));
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(f, "%s{\"seqlen\": %lld, \"causal\": %s, \"t1_ms\": %.4f, \"tn_ms\": %.4f, \"serial_ms\": %.4f, \"comm_ms\": %.4f, \"max_err\": %.4g}",
                   i ? ", " : "", static_cast<long long>(r.seqlen), r.causal ? "true" : "false", r.t1, r.tn,
                   r.tn_serial, r.tcomm, r.max_err);
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  return kExitOk;
}

}  // namespace fccli
