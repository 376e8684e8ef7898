// PLACEHOLDER (being written): host dispatch of the sm90 forward kernels.
#include "sm90/fwd_launch.h"
namespace flashcore::sm90 {
bool is_compiled(flashcore_dtype dtype, int head_dim) {
  const bool fp16 = dtype == FLASHCORE_DTYPE_FP16, bf16 = dtype == FLASHCORE_DTYPE_BF16;
  (void)fp16; (void)bf16; (void)head_dim;
#ifdef FLASHCORE_HAS_fp16_HD64
  if (fp16 && head_dim == 64) return true;
#endif
#ifdef FLASHCORE_HAS_fp16_HD128
  if (fp16 && head_dim == 128) return true;
#endif
#ifdef FLASHCORE_HAS_fp16_HD256
  if (fp16 && head_dim == 256) return true;
#endif
#ifdef FLASHCORE_HAS_bf16_HD64
  if (bf16 && head_dim == 64) return true;
#endif
#ifdef FLASHCORE_HAS_bf16_HD128
  if (bf16 && head_dim == 128) return true;
#endif
#ifdef FLASHCORE_HAS_bf16_HD256
  if (bf16 && head_dim == 256) return true;
#endif
  return false;
}
flashcore_status forward(const flashcore_attention_params&, float, cudaStream_t, std::string& error) {
  error = "sm90 forward kernel not built yet";
  return FLASHCORE_ERROR_INTERNAL;
}
}  // namespace flashcore::sm90
