// Appending to a KV cache in the same call (flashcore_attention_params::k_new / v_new / seqlen_new): the copy kernel
// must write exactly the rows [seqused_k[b], seqused_k[b] + seqlen_new) of each sequence (dense or paged, dropping
// rows past the capacity, never touching anything else), and the attention must then equal, bit for bit, a call
// without append on a cache the host filled the same way, with lengths seqused_k + seqlen_new.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "flashcore/flashcore.h"
#include "gpu/device_buffer.h"
#include "gpu/gpu_skip.h"

namespace {

using DeviceBuffer = flashcore::test::DeviceBuffer;

template <class T>
void upload(DeviceBuffer& d, const std::vector<T>& h) {
  ASSERT_EQ(cudaMemcpy(d.ptr, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}
template <class T>
std::vector<T> download(const DeviceBuffer& d, size_t count) {
  std::vector<T> h(count);
  EXPECT_EQ(cudaMemcpy(h.data(), d.ptr, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// bf16 bit patterns of small random values (finite, no NaN): exact copies are compared bytewise.
std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) {
    const float f = dist(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    x = static_cast<uint16_t>(bits >> 16);
  }
  return v;
}

struct AppendCase {
  int head_dim;
  int page_size;  // 0: dense cache
  int seqlen_new;
};

void run_append_case(const AppendCase& ac, uint64_t seed) {
  const int64_t B = 3, Hq = 8, Hkv = 2, D = ac.head_dim, cap = 512, Snew = ac.seqlen_new;
  const std::vector<int32_t> lengths = {0, 100, 510};  // the last one runs past the capacity: rows dropped
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const bool paged = ac.page_size > 0;
  const int64_t pages_per_seq = paged ? cap / ac.page_size : 0;
  const int64_t num_pages = paged ? B * pages_per_seq + 3 : 0;  // three spare pages, never referenced
  const int64_t entries = paged ? num_pages : B, rows = paged ? ac.page_size : cap;
  const size_t row_elems = static_cast<size_t>(Hkv * D);
  const size_t cache_elems = static_cast<size_t>(entries * rows) * row_elems;

  std::vector<int32_t> table;
  if (paged) {
    std::vector<int32_t> ids(static_cast<size_t>(num_pages));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    table.assign(ids.begin(), ids.begin() + B * pages_per_seq);
  }
  auto where = [&](int64_t b, int64_t pos) -> size_t {  // element offset of key row `pos` of sequence b, head 0
    if (!paged) return static_cast<size_t>(b * cap + pos) * row_elems;
    const int64_t page = table[static_cast<size_t>(b * pages_per_seq + pos / ac.page_size)];
    return static_cast<size_t>(page * ac.page_size + pos % ac.page_size) * row_elems;
  };

  const std::vector<uint16_t> k0 = random_bf16(cache_elems, rng), v0 = random_bf16(cache_elems, rng);
  const std::vector<uint16_t> kn = random_bf16(static_cast<size_t>(B * Snew) * row_elems, rng);
  const std::vector<uint16_t> vn = random_bf16(kn.size(), rng);
  const std::vector<uint16_t> q = random_bf16(static_cast<size_t>(B * Snew * Hq * D), rng);
  // What the cache must hold after the append.
  std::vector<uint16_t> k1 = k0, v1 = v0;
  std::vector<int32_t> after(lengths.size());
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = lengths[static_cast<size_t>(b)];
    after[static_cast<size_t>(b)] = static_cast<int32_t>(std::min<int64_t>(len + Snew, cap));
    for (int64_t t = 0; t < Snew && len + t < cap; ++t) {
      const size_t src = static_cast<size_t>(b * Snew + t) * row_elems;
      std::copy_n(kn.begin() + src, row_elems, k1.begin() + where(b, len + t));
      std::copy_n(vn.begin() + src, row_elems, v1.begin() + where(b, len + t));
    }
  }

  DeviceBuffer dk(cache_elems * 2), dv(cache_elems * 2), dk_ref(cache_elems * 2), dv_ref(cache_elems * 2);
  DeviceBuffer dkn(kn.size() * 2), dvn(vn.size() * 2), dq(q.size() * 2), do_a(q.size() * 2), do_b(q.size() * 2);
  DeviceBuffer dlen(lengths.size() * 4), dafter(after.size() * 4), dtable(std::max<size_t>(table.size(), 1) * 4);
  DeviceBuffer dlse_a(static_cast<size_t>(B * Hq * Snew) * 4), dlse_b(static_cast<size_t>(B * Hq * Snew) * 4);
  upload(dk, k0), upload(dv, v0), upload(dk_ref, k1), upload(dv_ref, v1), upload(dkn, kn), upload(dvn, vn);
  upload(dq, q), upload(dlen, lengths), upload(dafter, after);
  if (paged) upload(dtable, table);
  ASSERT_EQ(cudaMemset(do_a.ptr, 0xff, q.size() * 2), cudaSuccess);  // NaN poison
  ASSERT_EQ(cudaMemset(do_b.ptr, 0xff, q.size() * 2), cudaSuccess);
  DeviceBuffer ws(64 << 20);
  ASSERT_EQ(cudaMemset(ws.ptr, 0, 64 << 20), cudaSuccess);

  auto params = [&](void* k, void* v, void* o, float* lse, const int32_t* used) {
    flashcore_attention_params p;
    flashcore_attention_params_init(&p);
    p.q = dq.ptr, p.k = k, p.v = v, p.o = o, p.lse = lse;
    p.batch = B, p.seqlen_q = Snew, p.seqlen_k = cap, p.num_heads_q = Hq, p.num_heads_kv = Hkv, p.head_dim = D;
    p.dtype = FLASHCORE_DTYPE_BF16;
    p.causal = 1;
    p.q_strides = {Snew * Hq * D, Hq * D, D, 1};
    p.o_strides = p.q_strides;
    p.k_strides = {rows * Hkv * D, Hkv * D, D, 1};
    p.v_strides = p.k_strides;
    p.seqused_k = used;
    p.workspace = ws.ptr, p.workspace_size = 64 << 20;
    if (paged) {
      p.block_table = static_cast<const int32_t*>(dtable.ptr);
      p.block_table_stride = pages_per_seq;
      p.page_size = ac.page_size;
      p.num_pages = num_pages;
    }
    return p;
  };
  flashcore_attention_params a = params(dk.ptr, dv.ptr, do_a.ptr, static_cast<float*>(dlse_a.ptr),
                                        static_cast<const int32_t*>(dlen.ptr));
  a.k_new = dkn.ptr, a.v_new = dvn.ptr, a.seqlen_new = Snew;
  a.k_new_strides = {Snew * Hkv * D, Hkv * D, D, 1};
  a.v_new_strides = a.k_new_strides;
  ASSERT_EQ(flashcore_attention_forward(&a, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  const flashcore_attention_params b = params(dk_ref.ptr, dv_ref.ptr, do_b.ptr, static_cast<float*>(dlse_b.ptr),
                                              static_cast<const int32_t*>(dafter.ptr));
  ASSERT_EQ(flashcore_attention_forward(&b, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const std::string what = "d" + std::to_string(D) + (paged ? " page " + std::to_string(ac.page_size) : " dense") +
                           " seqlen_new " + std::to_string(Snew);
  EXPECT_TRUE(download<uint16_t>(dk, cache_elems) == k1) << what << ": K cache after the append";
  EXPECT_TRUE(download<uint16_t>(dv, cache_elems) == v1) << what << ": V cache after the append";
  const std::vector<uint16_t> oa = download<uint16_t>(do_a, q.size()), ob = download<uint16_t>(do_b, q.size());
  EXPECT_TRUE(oa == ob) << what << ": O with append differs from O on the host-appended cache";
  const size_t lse_n = static_cast<size_t>(B * Hq * Snew);
  EXPECT_TRUE(download<uint32_t>(dlse_a, lse_n) == download<uint32_t>(dlse_b, lse_n)) << what << ": LSE differs";
  size_t poisoned = 0;
  for (uint16_t x : oa) poisoned += x == 0xffff;
  EXPECT_EQ(poisoned, 0u) << what << ": O elements left unwritten";
}

TEST(KvAppend, DenseAndPagedMatchHostAppend) {
  FLASHCORE_REQUIRE_GPU();  // serving layouts: both backends (FLASHCORE_BACKEND=sm80 runs the portable one)
  uint64_t seed = 4242;
  for (int hd : {64, 128}) {
    for (int page : {0, 16, 64}) {
      for (int snew : {1, 4}) run_append_case({hd, page, snew}, seed++);
    }
  }
}

TEST(KvAppend, ArgumentErrorsNameTheField) {
  FLASHCORE_REQUIRE_GPU();  // serving layouts: both backends (FLASHCORE_BACKEND=sm80 runs the portable one)
  DeviceBuffer q(4096), k(65536), v(65536), o(4096), kn(4096), vn(4096), used(64);
  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.q = q.ptr, p.k = k.ptr, p.v = v.ptr, p.o = o.ptr;
  p.batch = 1, p.seqlen_q = 1, p.seqlen_k = 64, p.num_heads_q = 1, p.num_heads_kv = 1, p.head_dim = 64;
  p.dtype = FLASHCORE_DTYPE_BF16;
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS);
  p.k_new = kn.ptr, p.v_new = vn.ptr, p.seqlen_new = 1;
  p.k_new_strides = {64, 64, 64, 1};
  p.v_new_strides = p.k_new_strides;
  EXPECT_EQ(flashcore_attention_forward(&p, nullptr), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("seqused_k"), std::string::npos) << flashcore_last_error();
  p.seqused_k = static_cast<const int32_t*>(used.ptr);
  p.v_new = nullptr;
  EXPECT_EQ(flashcore_attention_forward(&p, nullptr), FLASHCORE_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(flashcore_last_error()).find("v_new"), std::string::npos) << flashcore_last_error();
  p.v_new = k.ptr;  // the cache itself: read while written
  EXPECT_EQ(flashcore_attention_forward(&p, nullptr), FLASHCORE_ERROR_OVERLAPPING_OUTPUT);
  p.v_new = vn.ptr;
  p.seqlen_new = 0;
  EXPECT_EQ(flashcore_attention_forward(&p, nullptr), FLASHCORE_ERROR_INVALID_SIZE);
  EXPECT_NE(std::string(flashcore_last_error()).find("seqlen_new"), std::string::npos) << flashcore_last_error();
  p.seqlen_new = 1;
  ASSERT_EQ(cudaMemset(used.ptr, 0, 64), cudaSuccess);
  EXPECT_EQ(flashcore_attention_forward(&p, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
