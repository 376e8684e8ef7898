#include "api/error.h"

namespace flashcore::api {
namespace {
thread_local std::string t_last_error;
}

void clear_error() noexcept { t_last_error.clear(); }  // clear() keeps the buffer: never allocates

flashcore_status set_error(flashcore_status status, const std::string& message) noexcept {
  try {
    t_last_error = message.empty() ? std::string(flashcore_status_string(status)) : message;
  } catch (...) {
    t_last_error.clear();  // out of memory while recording the message: keep the status at least
  }
  return status;
}

flashcore_status internal_error(const char* function, const char* what) noexcept {
  try {
    t_last_error = std::string(function) + ": internal error: " + what;
  } catch (...) {
    t_last_error.clear();
  }
  return FLASHCORE_ERROR_INTERNAL;
}

const char* last_error() noexcept { return t_last_error.c_str(); }

}  // namespace flashcore::api
