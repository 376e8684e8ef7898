// FlashCore from C++ (flashcore.hpp): errors as exceptions, capabilities, and (on a GPU it supports) one forward
// pass on (B, S, H, D) bf16 tensors. Without a supported GPU (sm_80 or newer) it says so and exits 0.
// Build: see examples/CMakeLists.txt (find_package(flashcore)).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <flashcore/flashcore.hpp>
#include <stdexcept>
#include <string>

namespace {

// Device memory that frees itself.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&ptr, bytes) != cudaSuccess || cudaMemset(ptr, 0, bytes) != cudaSuccess)
      throw std::runtime_error("cudaMalloc/cudaMemset failed");
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

}  // namespace

int main() {
  try {
    std::printf("attention_cpp: FlashCore %s\n", flashcore::version().c_str());

    // Arguments are checked before any device work; a bad one throws flashcore::Error with the reason.
    // validate() touches no memory, so these placeholder addresses are never read.
    const int64_t batch = 1, seq = 128, heads = 8, dim = 64;
    void* fake = reinterpret_cast<void*>(uintptr_t{1} << 20);
    auto good = flashcore::TensorView::bshd(fake, FLASHCORE_DTYPE_BF16, batch, seq, heads, dim);
    // Each sequence row padded by 4 elements (8 bytes): the TMA loads need 16-byte strides.
    const int64_t row = heads * dim + 4;
    auto bad = flashcore::TensorView::strided(fake, FLASHCORE_DTYPE_BF16, batch, seq, heads, dim, {seq * row, row, dim, 1});
    try {
      flashcore::validate(bad, good, good, good);
      std::printf("attention_cpp: expected a validation error\n");
      return 1;
    } catch (const flashcore::Error& e) {
      std::printf("attention_cpp: a bad stride is refused: %s\n", e.what());
    }

    const flashcore::Capabilities caps = flashcore::capabilities();
    std::string head_dims;
    for (int d : caps.head_dims) head_dims += (head_dims.empty() ? "" : ",") + std::to_string(d);
    std::printf("attention_cpp: compiled head dims %s; device arch %d\n", head_dims.c_str(), caps.device_arch);
    if (!caps.device_supported) {
      std::printf("attention_cpp: no supported GPU found: nothing to run\n");
      return 0;
    }

    const int64_t d = caps.head_dims.at(0);
    const size_t bytes = static_cast<size_t>(batch * seq * heads * d) * 2;
    DeviceBuffer q(bytes), k(bytes), v(bytes), o(bytes);
    using flashcore::TensorView;
    flashcore::attention_forward(TensorView::bshd(q.ptr, FLASHCORE_DTYPE_BF16, batch, seq, heads, d),
                                 TensorView::bshd(k.ptr, FLASHCORE_DTYPE_BF16, batch, seq, heads, d),
                                 TensorView::bshd(v.ptr, FLASHCORE_DTYPE_BF16, batch, seq, heads, d),
                                 TensorView::bshd(o.ptr, FLASHCORE_DTYPE_BF16, batch, seq, heads, d), {/*causal=*/true});
    if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("cudaDeviceSynchronize failed");
    std::printf("attention_cpp: causal bf16 forward (batch %lld, seqlen %lld, heads %lld, head dim %lld): ok\n",
                static_cast<long long>(batch), static_cast<long long>(seq), static_cast<long long>(heads),
                static_cast<long long>(d));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_cpp: %s\n", e.what());
    return 1;
  }
}
