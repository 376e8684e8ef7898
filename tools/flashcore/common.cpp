#include "common.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "api/backend.h"

namespace fccli {

namespace {
std::string g_command;
}  // namespace

void set_command(const std::string& name) { g_command = name; }
const std::string& command() { return g_command; }
std::string program_name() { return g_command.empty() ? "flashcore" : "flashcore " + g_command; }

void usage_error(const std::string& msg) {
  throw CliError(kExitUsage, msg + "; see '" + program_name() + " --help'");
}

void cuda_check(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  std::ostringstream os;
  os << "CUDA error " << cudaGetErrorName(err) << " (" << cudaGetErrorString(err) << ") in " << what << " at "
     << file << ":" << line;
  throw CliError(kExitFailure, os.str());
}

Args::Args(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) args_.emplace_back(argv[i]);
}

std::string Args::next() {
  if (has_inline_) usage_error("unexpected value '" + inline_ + "'");
  std::string a = args_[pos_++];
  if (a.size() > 2 && a.compare(0, 2, "--") == 0) {
    size_t eq = a.find('=');
    if (eq != std::string::npos) {
      has_inline_ = true;
      inline_ = a.substr(eq + 1);
      a = a.substr(0, eq);
    }
  }
  return a;
}

std::string Args::value(const std::string& flag) {
  if (has_inline_) {
    has_inline_ = false;
    return inline_;
  }
  if (pos_ >= args_.size()) usage_error("option " + flag + " needs a value");
  return args_[pos_++];
}

void Args::no_value(const std::string& flag) {
  if (has_inline_) usage_error("option " + flag + " takes no value");
}

int64_t parse_int(const std::string& flag, const std::string& text, int64_t min_value, int64_t max_value) {
  if (text.empty()) usage_error(flag + ": empty number");
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || *end != '\0')
    usage_error(flag + ": '" + text + "' is not an integer");
  if (v < min_value || v > max_value)
    usage_error(flag + ": " + text + " is out of range [" + std::to_string(min_value) + ", " +
                std::to_string(max_value) + "]");
  return v;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

std::vector<flashcore_dtype> parse_dtypes(const std::string& text, bool allow_8bit) {
  if (text == "fp16") return {FLASHCORE_DTYPE_FP16};
  if (text == "bf16") return {FLASHCORE_DTYPE_BF16};
  if (text == "both") return {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16};
  const bool e4m3 = text == "e4m3" || text == "fp8_e4m3", e5m2 = text == "e5m2" || text == "fp8_e5m2";
  if (e4m3 || e5m2) {
    if (allow_8bit) return {e4m3 ? FLASHCORE_DTYPE_FP8_E4M3 : FLASHCORE_DTYPE_FP8_E5M2};
    usage_error("unsupported dtype '" + text + "': this command runs 16-bit inputs only (expected fp16, bf16 or both)");
  }
  usage_error("unsupported dtype '" + text +
              (allow_8bit ? "' (expected fp16, bf16, both, e4m3 or e5m2)" : "' (expected fp16, bf16 or both)"));
}

int32_t parse_precision(const std::string& text) {
  if (text == "native") return FLASHCORE_PRECISION_NATIVE;
  if (text == "fp8") return FLASHCORE_PRECISION_FP8;
  if (text == "int8") return FLASHCORE_PRECISION_INT8;
  usage_error("--precision: '" + text + "' (expected native, fp8 or int8)");
}

const char* cli_precision_name(int32_t precision) {
  return precision == FLASHCORE_PRECISION_FP8 ? "fp8" : precision == FLASHCORE_PRECISION_INT8 ? "int8" : "native";
}

flashcore_dtype parse_out_dtype(const std::string& text) {
  if (text == "bf16") return FLASHCORE_DTYPE_BF16;
  if (text == "fp16") return FLASHCORE_DTYPE_FP16;
  usage_error("--out-dtype: '" + text + "' (expected bf16 or fp16)");
}

const char* cli_dtype_name(flashcore_dtype dtype) {
  return dtype == FLASHCORE_DTYPE_FP8_E4M3 ? "e4m3" : dtype == FLASHCORE_DTYPE_FP8_E5M2 ? "e5m2" : dtype_name(dtype);
}

std::vector<bool> parse_causal(const std::string& text) {
  if (text == "0") return {false};
  if (text == "1") return {true};
  if (text == "both") return {false, true};
  usage_error("--causal: '" + text + "' (expected 0, 1 or both)");
}

bool parse_layout_bhsd(const std::string& text) {
  if (text == "bshd") return false;
  if (text == "bhsd") return true;
  usage_error("--layout: '" + text + "' (expected bshd or bhsd)");
}

bool parse_problem_flag(const std::string& flag, Args& a, ProblemFlags& p) {
  if (flag == "--dtype")
    p.dtypes = parse_dtypes(a.value(flag), p.allow_8bit);
  else if (p.allow_8bit && flag == "--precision")
    p.precision = parse_precision(a.value(flag));
  else if (p.allow_8bit && flag == "--out-dtype")
    p.out_dtype = parse_out_dtype(a.value(flag));
  else if (flag == "--causal")
    p.causal = parse_causal(a.value(flag));
  else if (flag == "--layout")
    p.bhsd = parse_layout_bhsd(a.value(flag));
  else
    return false;
  return true;
}

void check_problem_flags(const ProblemFlags& p) {
  if (p.precision != FLASHCORE_PRECISION_NATIVE) {
    for (flashcore_dtype dt : p.dtypes)
      if (flashcore::is_8bit(dt))
        usage_error(std::string("--precision ") + cli_precision_name(p.precision) +
                    " quantizes 16-bit inputs; --dtype " + cli_dtype_name(dt) +
                    " is 8-bit already (use --precision native)");
  }
  if (p.out_dtype == FLASHCORE_DTYPE_SAME) return;
  if (p.precision == FLASHCORE_PRECISION_INT8) {
    // precision = INT8 runs P V in the input dtype and writes O in it: the C ABI takes out_dtype SAME or that dtype.
    for (flashcore_dtype dt : p.dtypes)
      if (dt != p.out_dtype)
        usage_error(std::string("--precision int8 writes O in the input dtype; --out-dtype ") +
                    cli_dtype_name(p.out_dtype) + " differs from --dtype " + cli_dtype_name(dt) +
                    " (leave --out-dtype out)");
  } else if (p.precision != FLASHCORE_PRECISION_FP8 && !(p.dtypes.size() == 1 && flashcore::is_8bit(p.dtypes[0]))) {
    usage_error("--out-dtype is for --dtype e4m3 / e5m2 or --precision fp8 (16-bit calls write O in their input "
                "dtype)");
  }
}

PassMode parse_mode(const std::string& text) {
  if (text == "fwd") return PassMode::Fwd;
  if (text == "bwd") return PassMode::Bwd;
  if (text == "fwdbwd") return PassMode::FwdBwd;
  usage_error("--mode: '" + text + "' (expected fwd, bwd or fwdbwd)");
}

const char* mode_name(PassMode mode) {
  return mode == PassMode::Bwd ? "bwd" : mode == PassMode::FwdBwd ? "fwdbwd" : "fwd";
}

void check_mode_flags(PassMode mode, const ProblemFlags& p) {
  if (!runs_backward(mode)) return;
  for (flashcore_dtype dt : p.dtypes)
    if (flashcore::is_8bit(dt))
      usage_error(std::string("--mode ") + mode_name(mode) + ": the backward takes 16-bit inputs (fp16, bf16); not --dtype " +
                  cli_dtype_name(dt));
  if (p.precision != FLASHCORE_PRECISION_NATIVE)
    usage_error(std::string("--mode ") + mode_name(mode) + ": the backward runs at native precision; not --precision " +
                cli_precision_name(p.precision));
  if (p.out_dtype != FLASHCORE_DTYPE_SAME)
    usage_error(std::string("--mode ") + mode_name(mode) + ": the backward writes O and the gradients in the input dtype "
                "(leave --out-dtype out)");
}

flashcore_attention_params problem_params(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                                          int64_t heads_kv, int64_t head_dim, flashcore_dtype dtype, bool causal,
                                          bool bhsd, int64_t head_dim_v) {
  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.batch = batch;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.num_heads_q = heads_q;
  p.num_heads_kv = heads_kv;
  p.head_dim = head_dim;
  p.head_dim_v = head_dim_v;
  p.dtype = dtype;
  p.causal = causal ? 1 : 0;
  if (flashcore_attention_params_set_contiguous(&p, bhsd ? 1 : 0) != FLASHCORE_SUCCESS)
    throw CliError(kExitFailure, std::string("set_contiguous: ") + flashcore_last_error());
  return p;
}

flashcore_capabilities capabilities() {
  flashcore_capabilities caps;
  flashcore_capabilities_init(&caps);
  flashcore_status st = flashcore_get_capabilities(&caps);
  if (st != FLASHCORE_SUCCESS)
    throw CliError(kExitFailure, std::string("flashcore_get_capabilities failed: ") + flashcore_status_string(st) +
                                     ": " + flashcore_last_error());
  return caps;
}

bool caps_has_dtype(const flashcore_capabilities& caps, flashcore_dtype dt) {
  for (int i = 0; i < caps.num_dtypes && i < FLASHCORE_MAX_CAPS; ++i)
    if (caps.dtypes[i] == dt) return true;
  return false;
}

// flashcore_capabilities lists the dtypes a call passes, so not FLASHCORE_DTYPE_INT8 (only the key of the int8 Q K^T
// kernels), and flashcore_list_kernel_configs needs a device: ask the backend table that caps.dtypes comes from
// (src/api/capabilities.cpp), so that --precision int8 is refused before the device, as --precision fp8 is.
bool have_int8_kernels() { return flashcore::backend::compiled_head_dims(FLASHCORE_DTYPE_INT8, nullptr, 0) > 0; }

void require_precision_kernels(int32_t precision, const flashcore_capabilities& caps) {
  if (precision == FLASHCORE_PRECISION_FP8 && !caps_has_dtype(caps, FLASHCORE_DTYPE_FP8_E4M3))
    usage_error("--precision fp8 runs the e4m3 kernels, which are not compiled into this FlashCore");
  if (precision == FLASHCORE_PRECISION_INT8 && !have_int8_kernels())
    usage_error("--precision int8 runs the int8 Q K^T kernels, which are not compiled into this FlashCore "
                "(FLASHCORE_DTYPES without i8)");
}

bool caps_has_head_dim(const flashcore_capabilities& caps, int64_t d) {
  for (int i = 0; i < caps.num_head_dims && i < FLASHCORE_MAX_CAPS; ++i)
    if (caps.head_dims[i] == d) return true;
  return false;
}

std::string caps_head_dims_string(const flashcore_capabilities& caps) {
  std::string s;
  for (int i = 0; i < caps.num_head_dims && i < FLASHCORE_MAX_CAPS; ++i)
    s += (i ? "," : "") + std::to_string(caps.head_dims[i]);
  return s.empty() ? "none" : s;
}

namespace {

std::string version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

// Why cudaGetDeviceCount found no device, in plain words. CUDA reports a missing driver and a driver older
// than the runtime with the same code (cudaErrorInsufficientDriver, "CUDA driver version is insufficient
// for CUDA runtime version"); cudaDriverGetVersion tells them apart: it reports 0 when no driver is loaded.
std::string no_device_reason(cudaError_t err) {
  int runtime = 0, driver = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  (void)cudaGetLastError();
  const int branch = min_driver_branch(runtime / 1000);
  const std::string needs = branch ? "driver R" + std::to_string(branch) + " or newer" : "a newer driver";
  const std::string build = "this CUDA " + std::to_string(runtime / 1000) + " build";
  if (driver == 0) return "no NVIDIA driver found (libcuda.so.1 could not be loaded); " + build + " needs " + needs;
  if (err == cudaErrorInsufficientDriver || driver < runtime / 1000 * 1000)
    return "NVIDIA driver too old for " + build + " (needs " + needs + "; the installed one supports CUDA " +
           version_text(driver) + ")";
  if (err == cudaSuccess || err == cudaErrorNoDevice) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    if (visible != nullptr) return std::string("no GPU (none visible with CUDA_VISIBLE_DEVICES='") + visible + "')";
    return "no GPU (the NVIDIA driver, CUDA " + version_text(driver) + ", sees no device)";
  }
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

}  // namespace

int min_driver_branch(int runtime_major) {
  switch (runtime_major) {
    case 11: return 450;
    case 12: return 525;
    case 13: return 580;
    default: return 0;
  }
}

std::string cuda_runtime_version() {
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) return "unknown";
  return version_text(v);
}

std::string cuda_driver_version() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess || v == 0) {
    (void)cudaGetLastError();
    return "none";
  }
  return version_text(v);
}

bool query_device(int index, DeviceInfo& info, std::string& reason) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count <= 0) {
    (void)cudaGetLastError();  // clear the error state
    reason = no_device_reason(err);
    return false;
  }
  if (index < 0 || index >= count) {
    reason = "device " + std::to_string(index) + " out of range (" + std::to_string(count) + " visible)";
    return false;
  }
  cudaDeviceProp prop{};
  FC_CUDA(cudaGetDeviceProperties(&prop, index));
  info.index = index;
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  info.sms = prop.multiProcessorCount;
  info.l2_bytes = prop.l2CacheSize;
  info.mem_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  int khz = 0;
  FC_CUDA(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, index));
  info.clock_mhz = khz / 1000;
  FC_CUDA(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, index));
  info.mem_clock_mhz = khz / 1000;
  FC_CUDA(cudaDeviceGetAttribute(&info.mem_bus_bits, cudaDevAttrGlobalMemoryBusWidth, index));
  char bus[64] = {0};
  FC_CUDA(cudaDeviceGetPCIBusId(bus, sizeof(bus), index));
  info.pci_bus_id = bus;
  return true;
}

DeviceInfo require_device(int index) {
  DeviceInfo info;
  std::string reason;
  if (!query_device(index, info, reason)) throw CliError(kExitNoGpu, "no supported GPU found: " + reason);
  FC_CUDA(cudaSetDevice(index));
  // The library's own answer for the current device: the backend table (sm90 for 9.0, the portable backend for 8.x
  // and for newer GPUs through its PTX), FLASHCORE_BACKEND included.
  const flashcore_capabilities caps = capabilities();
  if (!caps.device_supported) {
    std::string archs;
    for (int i = 0; i < caps.num_archs && i < FLASHCORE_MAX_CAPS; ++i)
      archs += (i ? "," : "") + std::to_string(caps.archs[i]);
    const char* forced = std::getenv("FLASHCORE_BACKEND");
    throw CliError(kExitNoGpu, "no supported GPU found: device " + std::to_string(index) + " is " + info.name + ", " +
                                   info.arch_text() + ", which no backend of this FlashCore serves (compiled for " +
                                   (archs.empty() ? std::string("none") : archs) + ")" +
                                   (forced != nullptr && forced[0] != '\0' && std::string(forced) != "auto"
                                        ? std::string("; FLASHCORE_BACKEND=") + forced + " is set"
                                        : std::string("")));
  }
  info.backend = caps.device_backend;
  return info;
}

void require_hopper_backend(const DeviceInfo& dev, const std::string& what) {
  if (dev.hopper_backend()) return;
  throw CliError(kExitNoGpu, what + " runs on Hopper (the sm90 backend) only; device " + std::to_string(dev.index) +
                                 " (" + dev.name + ", " + dev.arch_text() + ") is served by the " +
                                 (dev.backend == "sm80" ? std::string("portable sm80 backend (fp16 / bf16)")
                                                        : "'" + dev.backend + "' backend"));
}

std::string shell_quote(const std::string& s) {
  bool plain = !s.empty();
  for (char c : s)
    if (!(isalnum(static_cast<unsigned char>(c)) || c == ',' || c == '.' || c == '-' || c == '_' || c == '/' ||
          c == '=' || c == ':'))
      plain = false;
  if (plain) return s;
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace fccli
