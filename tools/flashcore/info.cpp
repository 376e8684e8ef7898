// `flashcore info`: versions, compiled capabilities, the device; as text, and as JSON with --json FILE.
#include <cstdio>
#include <fstream>
#include <string>

#include "core/dtype.h"
#include "commands.h"
#include "kernels/sm90/launch.h"
#include "common.h"
#include "nvml_sampler.h"

namespace fccli {

void print_info_help() {
  std::printf(
      "usage: flashcore info [--device N] [--json FILE] [--kernels]\n"
      "\n"
      "Prints the versions (program, library, CUDA runtime and driver), what this FlashCore was compiled for\n"
      "(dtypes, head dims, archs, output dtypes, ABI sizes) and the device, with the reason when there is\n"
      "none (no NVIDIA driver found / driver too old for this CUDA build / no GPU). Needs no GPU.\n"
      "\n"
      "options:\n"
      "  --device N       CUDA device to describe (default 0)\n"
      "  --json FILE      also write all of it as one JSON object to FILE\n"
      "  --kernels        instead, list the compiled sm90 kernels, one per line: the generated row's name (which\n"
      "                   the kernel's symbol carries), two_p_sets=0|1 (config.h kTwoPSets) and v_in_place=0|1\n"
      "                   (8-bit rows whose producer warps transpose V, tile_shape.h transposes_v_in_place);\n"
      "                   tools/check_sass.sh checks the SASS of each against them\n"
      "\n"
      "exit status: 0 (also without a GPU), 1 FILE cannot be written, 2 bad arguments\n");
}

namespace {

#ifdef FLASHCORE_CLI_HAVE_CHECK
constexpr bool kHaveCheck = true;
#else
constexpr bool kHaveCheck = false;
#endif
// The arch of the PTX compiled in beside the portable kernels' SASS (FLASHCORE_SM80_PTX), 0 without (tools/CMakeLists.txt).
#ifndef FLASHCORE_CLI_SM80_PTX_ARCH
#define FLASHCORE_CLI_SM80_PTX_ARCH 0
#endif
constexpr int kPortablePtxArch = FLASHCORE_CLI_SM80_PTX_ARCH;

std::string dtypes_text(const flashcore_dtype* list, int n, const char* sep, const char* quote) {
  std::string s;
  for (int i = 0; i < n && i < FLASHCORE_MAX_CAPS; ++i) s += std::string(i ? sep : "") + quote + dtype_name(list[i]) + quote;
  return s;
}

template <typename T>
std::string ints_text(const T* list, int n, const char* sep, const char* prefix) {
  std::string s;
  for (int i = 0; i < n && i < FLASHCORE_MAX_CAPS; ++i) s += std::string(i ? sep : "") + prefix + std::to_string(list[i]);
  return s;
}

std::string or_none(const std::string& s) { return s.empty() ? "none" : s; }

void write_json(const std::string& path, const flashcore_capabilities& caps, bool have_dev, const DeviceInfo& dev,
                const std::string& reason, const PowerSampler* sampler, const PowerStats& power) {
  std::ofstream f(path);
  if (!f) throw CliError(kExitFailure, "cannot write " + path);
  f << "{\n  \"tool\": \"flashcore info\",\n  \"cli_version\": \"" FLASHCORE_CLI_VERSION "\",\n";
  f << "  \"library_version\": \"" << json_escape(flashcore_version_string()) << "\",\n";
  f << "  \"header_version\": \"" FLASHCORE_CLI_VERSION "\",\n";
  f << "  \"cuda\": {\"runtime\": \"" << cuda_runtime_version() << "\", \"driver\": ";
  const std::string driver = cuda_driver_version();
  f << (driver == "none" ? "null" : "\"" + driver + "\"") << "},\n";
  f << "  \"capabilities\": {\"dtypes\": [" << dtypes_text(caps.dtypes, caps.num_dtypes, ", ", "\"")
    << "], \"head_dims\": [" << ints_text(caps.head_dims, caps.num_head_dims, ", ", "")
    << "], \"archs\": [" << ints_text(caps.archs, caps.num_archs, ", ", "")
    << "], \"portable_ptx_arch\": " << (kPortablePtxArch > 0 ? std::to_string(kPortablePtxArch) : "null")
    << ", \"out_dtypes\": [" << dtypes_text(caps.out_dtypes, caps.num_out_dtypes, ", ", "\"")
    << "], \"params_struct_size\": " << caps.params_struct_size
    << ", \"params_v1_size\": " << FLASHCORE_ATTENTION_PARAMS_V1_SIZE
    << ", \"params_v2_size\": " << FLASHCORE_ATTENTION_PARAMS_V2_SIZE
    << ", \"check_built\": " << (kHaveCheck ? "true" : "false") << "},\n";
  if (!have_dev) {
    f << "  \"device\": null,\n  \"device_reason\": \"" << json_escape(reason) << "\"\n}\n";
  } else {
    f << "  \"device\": {\"index\": " << dev.index << ", \"name\": \"" << json_escape(dev.name) << "\", \"sm\": "
      << dev.major << dev.minor << ", \"sms\": " << dev.sms << ", \"l2_bytes\": " << dev.l2_bytes
      << ", \"max_sm_clock_mhz\": " << dev.clock_mhz << ", \"memory_bytes\": " << dev.mem_bytes
      << ", \"memory_clock_mhz\": " << dev.mem_clock_mhz << ", \"pci_bus_id\": \"" << json_escape(dev.pci_bus_id)
      << "\", \"supported\": " << (caps.device_supported ? "true" : "false") << ", \"backend\": "
      << (caps.device_supported ? "\"" + json_escape(caps.device_backend) + "\"" : "null") << ", \"nvml\": ";
    if (sampler != nullptr && sampler->available() && power.valid)
      f << "{\"power_w\": " << power.power_mean_w << ", \"sm_clock_mhz\": " << power.sm_clock_mean_mhz
        << ", \"temp_c\": " << power.temp_max_c << "}";
    else
      f << "null";
    f << "},\n  \"device_reason\": null\n}\n";
  }
  if (!f) throw CliError(kExitFailure, "error writing " + path);
}

}  // namespace

int run_info(int argc, char** argv, int first) {
  int device = 0;
  std::string json_path;
  Args a(argc, argv, first);
  while (!a.done()) {
    std::string f = a.next();
    if (f == "-h" || f == "--help") {
      print_info_help();
      return kExitOk;
    } else if (f == "--device") {
      device = static_cast<int>(parse_int(f, a.value(f), 0, 1023));
    } else if (f == "--kernels") {
      int n = 0;
      const flashcore::sm90::KernelRow* const* rows = flashcore::sm90::rows(n);
      for (int i = 0; i < n; ++i) {
        const flashcore::sm90::KernelRow& r = *rows[i];
        const bool v_in_place =
            flashcore::is_8bit(r.dtype) && flashcore::sm90::transposes_v_in_place(r.shape, r.head_dim);
        std::printf("%s two_p_sets=%d v_in_place=%d\n", r.symbol != nullptr ? r.symbol : "?", r.two_p_sets ? 1 : 0,
                    v_in_place ? 1 : 0);
      }
      return kExitOk;
    } else if (f == "--json") {
      json_path = a.value(f);
      if (json_path.empty()) usage_error("--json: empty file name");
    } else {
      usage_error("unknown option '" + f + "'");
    }
  }
  std::printf("flashcore cli %s, library %s (header %d.%d.%d)\n", FLASHCORE_CLI_VERSION, flashcore_version_string(),
              FLASHCORE_VERSION_MAJOR, FLASHCORE_VERSION_MINOR, FLASHCORE_VERSION_PATCH);
  flashcore_capabilities caps = capabilities();
  std::printf("dtypes:    %s\n", or_none(dtypes_text(caps.dtypes, caps.num_dtypes, ",", "")).c_str());
  std::printf("head dims: %s\n", caps_head_dims_string(caps).c_str());
  std::printf("archs:     %s", or_none(ints_text(caps.archs, caps.num_archs, ",", "sm_")).c_str());
  if (kPortablePtxArch > 0)
    std::printf(" + compute_%d PTX of the portable kernels (JIT-compiled on newer GPUs: 10.x, 12.x)", kPortablePtxArch);
  std::printf("\n");
  std::printf("O dtypes:  %s\n", or_none(dtypes_text(caps.out_dtypes, caps.num_out_dtypes, ",", "")).c_str());
  std::printf("abi:       params struct %u bytes (0.1 layout: %d, 0.2 layout: %d)\n", caps.params_struct_size,
              FLASHCORE_ATTENTION_PARAMS_V1_SIZE, FLASHCORE_ATTENTION_PARAMS_V2_SIZE);
  std::printf("check:     %s\n", kHaveCheck ? "built in" : "not built");
  std::printf("cuda:      runtime %s, driver %s\n", cuda_runtime_version().c_str(), cuda_driver_version().c_str());

  DeviceInfo dev;
  std::string reason;
  PowerStats power;
  if (!query_device(device, dev, reason)) {
    std::printf("device:    none: %s\n", reason.c_str());
    if (!json_path.empty()) write_json(json_path, caps, false, dev, reason, nullptr, power);
    return kExitOk;
  }
  // The capabilities describe the current device: make it the one asked for.
  if (dev.index != 0 || device != 0) {
    FC_CUDA(cudaSetDevice(dev.index));
    caps = capabilities();
  }
  std::printf("device:    %d: %s, sm_%d%d, %d SMs, L2 %.1f MiB, max SM clock %d MHz, memory %.1f GiB @ %d MHz\n",
              dev.index, dev.name.c_str(), dev.major, dev.minor, dev.sms, dev.l2_bytes / 1048576.0, dev.clock_mhz,
              dev.mem_bytes / 1073741824.0, dev.mem_clock_mhz);
  std::printf("supported: %s%s\n", caps.device_supported ? "yes, backend " : "no (no compiled kernel for this GPU)",
              caps.device_supported ? caps.device_backend : "");
  PowerSampler sampler(dev.pci_bus_id);
  if (sampler.available()) {
    sampler.start();
    power = sampler.stop();
    std::printf("nvml:      %.0f W, SM %.0f MHz, %d C\n", power.power_mean_w, power.sm_clock_mean_mhz, power.temp_max_c);
  } else {
    std::printf("nvml:      n/a (%s)\n", sampler.why_unavailable().c_str());
  }
  if (!json_path.empty()) write_json(json_path, caps, true, dev, reason, &sampler, power);
  return kExitOk;
}

}  // namespace fccli
