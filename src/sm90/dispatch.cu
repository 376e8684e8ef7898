// PLACEHOLDER (being written): host dispatch of the sm90 forward kernels.
#include "sm90/fwd_launch.h"
namespace flashcore::sm90 {
bool is_compiled(flashcore_dtype, int) { return false; }
flashcore_status forward(const flashcore_attention_params&, float, cudaStream_t, std::string& error) {
  error = "sm90 forward kernel not built yet";
  return FLASHCORE_ERROR_INTERNAL;
}
}  // namespace flashcore::sm90
