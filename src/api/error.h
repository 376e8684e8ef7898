// Thread-local "last error" of the C ABI, and the guard that keeps exceptions from crossing it.
#pragma once
#include <exception>
#include <new>
#include <string>

#include "flashcore/flashcore.h"

namespace flashcore::api {

// Clears this thread's last error (every C entry point does so first).
void clear_error() noexcept;

// Records `message` as this thread's last error and returns `status` (an empty message records the
// status string instead).
flashcore_status set_error(flashcore_status status, const std::string& message) noexcept;

// This thread's last error message; "" when none. Never NULL.
const char* last_error() noexcept;

// Records "<function>: <what>" as FLASHCORE_ERROR_INTERNAL (for exceptions caught at the ABI boundary).
flashcore_status internal_error(const char* function, const char* what) noexcept;

// Runs `body` (returning flashcore_status) with the last error cleared first; any exception becomes
// FLASHCORE_ERROR_INTERNAL with its message.
template <typename Body>
flashcore_status guarded(const char* function, Body&& body) noexcept {
  clear_error();
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return internal_error(function, "out of host memory");
  } catch (const std::exception& e) {
    return internal_error(function, e.what());
  } catch (...) {
    return internal_error(function, "unknown exception");
  }
}

}  // namespace flashcore::api
