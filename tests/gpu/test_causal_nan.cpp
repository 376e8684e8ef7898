// Causal NaN hygiene (serving issue): a non-finite V value at a key that some query rows may not see must not reach
// those rows (0 * NaN is NaN in a tensor-core P V). Each row that sees no poisoned key must be bit-identical to a run
// where the poisoned V rows hold zeros, and each row that sees one must be non-finite, as exact masked attention
// gives. Every causal config compiled for bf16 d128, the defaults of the other head dims and dtypes, Sq == Sk and
// Sq < Sk (bottom-right), GQA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "flashcore/flashcore.h"
#include "gpu/device_buffer.h"
#include "gpu/gpu_skip.h"

namespace {

using Buffer = flashcore::test::DeviceBuffer;

uint16_t to_16bit(float f, flashcore_dtype dt) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (dt == FLASHCORE_DTYPE_BF16) return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  // fp16 of a value in [-4, 4]: exact enough through the normal range (round to nearest on the dropped bits).
  const int exp = static_cast<int>((bits >> 23) & 0xff) - 127 + 15;
  if (exp <= 0) return static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t mant = (bits & 0x7fffffu) + 0x1000u;
  return static_cast<uint16_t>(((bits >> 16) & 0x8000u) | (static_cast<uint32_t>(exp) << 10) | (mant >> 13));
}

bool finite16(uint16_t h, flashcore_dtype dt) {
  const uint16_t e = dt == FLASHCORE_DTYPE_BF16 ? 0x7f80 : 0x7c00;
  return (h & e) != e;
}

// Runs the case twice (poisoned V, then zeros at the poisoned rows) and compares row by row. Returns the rows checked.
int run_poison_case(flashcore_dtype dt, int hd, const char* config, int64_t sq, int64_t sk, std::vector<int64_t> nan_keys,
                    int64_t inf_key, uint32_t seed) {
  const int64_t B = 1, Hq = 4, Hkv = 2;
  const uint16_t nan16 = dt == FLASHCORE_DTYPE_BF16 ? 0x7fc0 : 0x7e00, inf16 = dt == FLASHCORE_DTYPE_BF16 ? 0x7f80 : 0x7c00;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  auto fill = [&](size_t n) {
    std::vector<uint16_t> v(n);
    for (auto& x : v) x = to_16bit(dist(rng), dt);
    return v;
  };
  const size_t q_n = static_cast<size_t>(B * sq * Hq * hd), kv_n = static_cast<size_t>(B * sk * Hkv * hd);
  const std::vector<uint16_t> q = fill(q_n), k = fill(kv_n), v_clean0 = fill(kv_n);
  std::vector<uint16_t> v_bad = v_clean0, v_clean = v_clean0;
  int64_t first_poison = sk;  // over every KV head (NaN rows); KV head 1 also has the Inf element
  for (int64_t key : nan_keys) {
    for (int64_t h = 0; h < Hkv; ++h) {
      for (int64_t d = 0; d < hd; ++d) {
        const size_t at = static_cast<size_t>((key * Hkv + h) * hd + d);
        v_bad[at] = nan16;
        v_clean[at] = 0;
      }
    }
    first_poison = std::min(first_poison, key);
  }
  if (inf_key >= 0) {  // one element of one head
    const size_t at = static_cast<size_t>((inf_key * Hkv + 1) * hd + 3);
    v_bad[at] = inf16;
    v_clean[at] = 0;
  }
  const int64_t first_poison_head1 = inf_key >= 0 ? std::min(first_poison, inf_key) : first_poison;

  Buffer dq(q_n * 2), dk(kv_n * 2), dv(kv_n * 2), do1(q_n * 2), do2(q_n * 2), ws(64 << 20);
  EXPECT_EQ(cudaMemcpy(dq.ptr, q.data(), q_n * 2, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dk.ptr, k.data(), kv_n * 2, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemset(ws.ptr, 0, 64 << 20), cudaSuccess);
  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.q = dq.ptr, p.k = dk.ptr, p.v = dv.ptr;
  p.batch = B, p.seqlen_q = sq, p.seqlen_k = sk, p.num_heads_q = Hq, p.num_heads_kv = Hkv, p.head_dim = hd;
  p.dtype = dt;
  p.causal = 1;
  p.kernel_config = config;
  p.flags = FLASHCORE_FLAG_CAUSAL_NONFINITE_MASKING;
  p.workspace = ws.ptr, p.workspace_size = 64 << 20;
  EXPECT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS);
  std::vector<uint16_t> out[2];
  for (int run = 0; run < 2; ++run) {
    const std::vector<uint16_t>& v = run == 0 ? v_bad : v_clean;
    void* o = run == 0 ? do1.ptr : do2.ptr;
    EXPECT_EQ(cudaMemcpy(dv.ptr, v.data(), kv_n * 2, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemset(o, 0xff, q_n * 2), cudaSuccess);
    p.o = o;
    const flashcore_status st = flashcore_attention_forward(&p, nullptr);
    EXPECT_EQ(st, FLASHCORE_SUCCESS) << flashcore_last_error();
    if (st != FLASHCORE_SUCCESS) return 0;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    out[run].resize(q_n);
    EXPECT_EQ(cudaMemcpy(out[run].data(), o, q_n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  const std::string what = std::string(config ? config : "default") + " d" + std::to_string(hd) + " Sq=" +
                           std::to_string(sq) + " Sk=" + std::to_string(sk);
  int bad_rows = 0;
  for (int64_t i = 0; i < sq; ++i) {
    const int64_t limit = std::min(sk, std::max<int64_t>(0, i + 1 + sk - sq));  // keys < limit are visible
    for (int64_t h = 0; h < Hq; ++h) {
      const bool sees_poison = limit > (h / (Hq / Hkv) == 1 ? first_poison_head1 : first_poison);
      const size_t row = static_cast<size_t>((i * Hq + h) * hd);
      bool equal = true, any_non_finite = false;
      for (int64_t d = 0; d < hd; ++d) {
        equal &= out[0][row + d] == out[1][row + d];
        any_non_finite |= !finite16(out[0][row + d], dt);
      }
      const bool ok = sees_poison ? any_non_finite : equal;
      if (!ok && bad_rows++ < 5) {
        ADD_FAILURE() << what << ": row " << i << " head " << h << (sees_poison ? " sees" : " does not see")
                      << " a poisoned key but is "
                      << (sees_poison ? "finite" : "not bit-identical to the clean run");
      }
    }
  }
  return static_cast<int>(sq);
}

TEST(CausalNaN, PoisonedVReachesOnlyTheRowsThatSeeIt) {
  FLASHCORE_REQUIRE_GPU();
  int runs = 0;
  uint32_t seed = 77;
  const char* names[64];
  int32_t count = 0;
  ASSERT_EQ(flashcore_list_kernel_configs(FLASHCORE_DTYPE_BF16, 128, 1, names, 64, &count), FLASHCORE_SUCCESS);
  for (int i = 0; i < count && i < 64; ++i) {
    runs += run_poison_case(FLASHCORE_DTYPE_BF16, 128, names[i], 300, 300, {150, 299}, 77, seed++) > 0;
    runs += run_poison_case(FLASHCORE_DTYPE_BF16, 128, names[i], 17, 600, {590}, 595, seed++) > 0;
    runs += run_poison_case(FLASHCORE_DTYPE_BF16, 128, names[i], 200, 200, {130}, -1, seed++) > 0;
  }
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16}) {
    for (int hd : {64, 256}) {
      runs += run_poison_case(dt, hd, nullptr, 300, 300, {150, 299}, 77, seed++) > 0;
      runs += run_poison_case(dt, hd, nullptr, 17, 600, {590}, 595, seed++) > 0;
    }
  }
  std::printf("causal NaN: %d case(s) run\n", runs);
}

}  // namespace
