// `flashcore info`: versions, compiled capabilities, the device.
#include <cstdio>

#include "commands.h"
#include "common.h"
#include "nvml_sampler.h"

namespace fccli {

int run_info(int argc, char** argv, int first) {
  int device = 0;
  Args a(argc, argv, first);
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--device")
      device = static_cast<int>(parse_int(f, a.value(f), 0, 1023));
    else
      usage_error("info: unknown option '" + f + "'");
  }
  int major = 0, minor = 0, patch = 0;
  flashcore_version(&major, &minor, &patch);
  std::printf("flashcore cli %s, library %s (header %d.%d.%d)\n", FLASHCORE_CLI_VERSION, flashcore_version_string(),
              FLASHCORE_VERSION_MAJOR, FLASHCORE_VERSION_MINOR, FLASHCORE_VERSION_PATCH);
  flashcore_capabilities caps = capabilities();
  std::printf("dtypes:    ");
  for (int i = 0; i < caps.num_dtypes && i < FLASHCORE_MAX_CAPS; ++i) std::printf("%s%s", i ? "," : "", dtype_name(caps.dtypes[i]));
  std::printf("%s\nhead dims: %s\narchs:     ", caps.num_dtypes ? "" : "none", caps_head_dims_string(caps).c_str());
  for (int i = 0; i < caps.num_archs && i < FLASHCORE_MAX_CAPS; ++i) std::printf("%ssm_%d", i ? "," : "", caps.archs[i]);
  std::printf("%s\n", caps.num_archs ? "" : "none");
  std::printf("O dtypes:  ");
  for (int i = 0; i < caps.num_out_dtypes && i < FLASHCORE_MAX_CAPS; ++i)
    std::printf("%s%s", i ? "," : "", dtype_name(caps.out_dtypes[i]));
  std::printf("%s\nabi:       params struct %u bytes (0.1 layout: %d)\n", caps.num_out_dtypes ? "" : "none",
              caps.params_struct_size, FLASHCORE_ATTENTION_PARAMS_V1_SIZE);
#ifdef FLASHCORE_CLI_HAVE_CHECK
  std::printf("check:     built in\n");
#else
  std::printf("check:     not built\n");
#endif
  int runtime = 0, driver = 0;
  FC_CUDA(cudaRuntimeGetVersion(&runtime));
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  std::printf("cuda:      runtime %d.%d, driver %s\n", runtime / 1000, (runtime % 1000) / 10,
              driver ? (std::to_string(driver / 1000) + "." + std::to_string((driver % 1000) / 10)).c_str() : "none");

  DeviceInfo dev;
  std::string reason;
  if (!query_device(device, dev, reason)) {
    std::printf("device:    no CUDA device (%s)\n", reason.c_str());
    return kExitOk;
  }
  std::printf("device:    %d: %s, sm_%d%d, %d SMs, L2 %.1f MiB, max SM clock %d MHz, memory %.1f GiB @ %d MHz\n",
              dev.index, dev.name.c_str(), dev.major, dev.minor, dev.sms, dev.l2_bytes / 1048576.0, dev.clock_mhz,
              dev.mem_bytes / 1073741824.0, dev.mem_clock_mhz);
  std::printf("supported: %s%s\n", caps.device_supported ? "yes, backend " : "no (no compiled kernel for this GPU)",
              caps.device_supported ? caps.device_backend : "");
  PowerSampler sampler(dev.pci_bus_id);
  if (sampler.available()) {
    sampler.start();
    PowerStats p = sampler.stop();
    std::printf("nvml:      %.0f W, SM %.0f MHz, %d C\n", p.power_mean_w, p.sm_clock_mean_mhz, p.temp_max_c);
  } else {
    std::printf("nvml:      n/a (%s)\n", sampler.why_unavailable().c_str());
  }
  return kExitOk;
}

}  // namespace fccli
