/* The parent project's program: links flashcore::flashcore only (the CUDA runtime is inside libflashcore.so). */
#include <flashcore/flashcore.h>
#include <stdio.h>

int main(void) {
  flashcore_capabilities caps;
  flashcore_capabilities_init(&caps);
  if (flashcore_get_capabilities(&caps) != FLASHCORE_SUCCESS) {
    fprintf(stderr, "parent_consumer: %s\n", flashcore_last_error());
    return 1;
  }
  printf("parent_consumer: FlashCore %s, %d head dim(s), device arch %d, %s\n", flashcore_version_string(),
         caps.num_head_dims, caps.device_arch,
         caps.device_supported ? "supported GPU present" : "no supported GPU found");
  return 0;
}
