// NCCL loaded at run time (nccl.h).
#include "dist/nccl.h"

#include <dlfcn.h>

#include <cstdlib>
#include <vector>

namespace flashcore::dist {

namespace {

struct Loaded {
  NcclApi api{};
  bool ok = false;
  std::string message;
};

template <class F>
bool resolve(void* lib, const char* name, F& fn, std::string& missing) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
  return fn != nullptr;
}

Loaded load() {
  Loaded out;
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("FLASHCORE_NCCL_LIBRARY"); env != nullptr && *env != '\0') {
    candidates.emplace_back(env);
  } else {
    candidates = {"libnccl.so.2", "libnccl.so"};
  }
  void* lib = nullptr;
  std::string tried;
  for (const std::string& path : candidates) {
    lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) {
      out.api.path = path;
      break;
    }
    const char* why = dlerror();
    tried += (tried.empty() ? "" : "; ") + path + ": " + (why != nullptr ? why : "not found");
  }
  if (lib == nullptr) {
    out.message = "NCCL could not be loaded (" + tried +
                  "); set FLASHCORE_NCCL_LIBRARY to libnccl.so.2's path or add its folder to LD_LIBRARY_PATH";
    return out;
  }
  std::string missing;
  NcclApi& a = out.api;
  resolve(lib, "ncclGroupStart", a.group_start, missing);
  resolve(lib, "ncclGroupEnd", a.group_end, missing);
  resolve(lib, "ncclSend", a.send, missing);
  resolve(lib, "ncclRecv", a.recv, missing);
  resolve(lib, "ncclCommCount", a.comm_count, missing);
  resolve(lib, "ncclCommUserRank", a.comm_user_rank, missing);
  resolve(lib, "ncclCommCuDevice", a.comm_cu_device, missing);
  resolve(lib, "ncclGetErrorString", a.get_error_string, missing);
  resolve(lib, "ncclGetVersion", a.get_version, missing);
  resolve(lib, "ncclCommInitAll", a.comm_init_all, missing);
  resolve(lib, "ncclCommDestroy", a.comm_destroy, missing);
  if (!missing.empty()) {
    out.message = a.path + " lacks " + missing + " (NCCL 2.7 or newer is needed for send/recv)";
    return out;
  }
  out.ok = true;
  return out;
}

}  // namespace

const NcclApi* nccl(std::string& message) {
  static const Loaded loaded = load();
  if (!loaded.ok) {
    message = loaded.message;
    return nullptr;
  }
  return &loaded.api;
}

std::string nccl_message(const NcclApi& api, const char* what, NcclApi::Result result) {
  return std::string(what) + ": NCCL error " + std::to_string(result) + " (" + api.get_error_string(result) + ")";
}

}  // namespace flashcore::dist
