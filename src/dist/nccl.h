// NCCL, loaded at run time (dlopen): FlashCore has no link dependency on it. Only the few entry points ring
// attention uses are resolved, with the types of NCCL's stable C ABI (ncclComm_t is an opaque pointer,
// ncclResult_t and ncclDataType_t are int-sized enums).
#pragma once
#include <cstddef>
#include <string>

#include <cuda_runtime_api.h>

namespace flashcore::dist {

struct NcclApi {
  using Result = int;                      // ncclResult_t: 0 = ncclSuccess
  static constexpr int kUint8 = 1;         // ncclDataType_t ncclUint8
  Result (*group_start)();
  Result (*group_end)();
  Result (*send)(const void* buf, size_t count, int datatype, int peer, void* comm, cudaStream_t stream);
  Result (*recv)(void* buf, size_t count, int datatype, int peer, void* comm, cudaStream_t stream);
  Result (*comm_count)(const void* comm, int* count);
  Result (*comm_user_rank)(const void* comm, int* rank);
  Result (*comm_cu_device)(const void* comm, int* device);
  const char* (*get_error_string)(Result result);
  Result (*get_version)(int* version);
  // For tests and tools that make their own communicators (not used by the library).
  Result (*comm_init_all)(void** comms, int ndev, const int* devlist);
  Result (*comm_destroy)(void* comm);
  std::string path;  // the library that was loaded
};

// NCCL, loaded once per process from $FLASHCORE_NCCL_LIBRARY, else libnccl.so.2, else libnccl.so. nullptr when it
// cannot be loaded; `message` then says why (each path tried and dlerror()).
const NcclApi* nccl(std::string& message);

// "<what>: NCCL error <code> (<ncclGetErrorString>)".
std::string nccl_message(const NcclApi& api, const char* what, NcclApi::Result result);

}  // namespace flashcore::dist
