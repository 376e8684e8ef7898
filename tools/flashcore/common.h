// Shared pieces of the `flashcore` command-line program: errors and exit codes, CUDA checking,
// argument helpers, device detection.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "core/launch_util.h"
#include "flashcore/flashcore.h"

namespace fccli {

// The program is versioned with the library it is built from: the header's FLASHCORE_VERSION_* macros.
#define FLASHCORE_CLI_STR2(x) #x
#define FLASHCORE_CLI_STR(x) FLASHCORE_CLI_STR2(x)
#define FLASHCORE_CLI_VERSION                                                                     \
  FLASHCORE_CLI_STR(FLASHCORE_VERSION_MAJOR) "." FLASHCORE_CLI_STR(FLASHCORE_VERSION_MINOR) "." \
      FLASHCORE_CLI_STR(FLASHCORE_VERSION_PATCH)

// Exit codes of the program.
enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,  // a run failed: CUDA error, kernel error, a check failed
  kExitUsage = 2,    // bad command line: unknown flag/preset, malformed shape, unsupported dtype/head dim
  kExitNoGpu = 3,    // no GPU that runs the command: none, one no backend of this build serves, or a Hopper-only
                     // feature (8-bit, the autotuner) asked of a GPU the portable backend serves
};

// Thrown anywhere; main() prints "flashcore[ <command>]: <message>" on one line and exits with `code`.
struct CliError : std::runtime_error {
  int code;
  CliError(int c, const std::string& msg) : std::runtime_error(msg), code(c) {}
};

// The subcommand being run ("bench", "check", ...; "" before one is chosen). main() sets it; messages and
// usage errors name it.
void set_command(const std::string& name);
const std::string& command();
// "flashcore" or "flashcore <command>": the prefix of every message the program prints.
std::string program_name();

// Throws CliError(kExitUsage, "<msg>; see 'flashcore <command> --help'").
[[noreturn]] void usage_error(const std::string& msg);

// Every CUDA runtime call goes through this: on failure throws CliError(kExitFailure) naming the call.
void cuda_check(cudaError_t err, const char* what, const char* file, int line);
#define FC_CUDA(call) ::fccli::cuda_check((call), #call, __FILE__, __LINE__)

// Command-line cursor: argv after the subcommand.
class Args {
 public:
  Args(int argc, char** argv, int first);
  bool done() const { return pos_ >= args_.size() && !has_inline_; }
  // Next argument; "--flag=value" returns "--flag" and keeps "value" for value().
  std::string next();
  // Value of the flag just returned by next(): the inline "=value" or the following argument.
  std::string value(const std::string& flag);
  // Call after handling a flag that takes no value: rejects "--flag=value".
  void no_value(const std::string& flag);

 private:
  std::vector<std::string> args_;
  size_t pos_ = 0;
  bool has_inline_ = false;
  std::string inline_;
};

int64_t parse_int(const std::string& flag, const std::string& text, int64_t min_value, int64_t max_value);
std::vector<std::string> split(const std::string& text, char sep);

// "fp16" / "bf16" / "both" -> list of dtypes, and with allow_8bit also "e4m3" (alias "fp8_e4m3"); usage_error
// otherwise.
std::vector<flashcore_dtype> parse_dtypes(const std::string& text, bool allow_8bit = false);
// "native" / "fp8" / "int8" -> FLASHCORE_PRECISION_*.
int32_t parse_precision(const std::string& text);
// FLASHCORE_PRECISION_* -> its command-line word: "native", "fp8", "int8" (also the JSON / CSV "precision" field).
const char* cli_precision_name(int32_t precision);
// "bf16" / "fp16" -> the dtype (O of 8-bit calls).
flashcore_dtype parse_out_dtype(const std::string& text);
// The short dtype word of the command line: "fp16", "bf16", "e4m3".
const char* cli_dtype_name(flashcore_dtype dtype);
// "0" / "1" / "both" -> list.
std::vector<bool> parse_causal(const std::string& text);
// "bshd" -> false, "bhsd" -> true.
bool parse_layout_bhsd(const std::string& text);
using flashcore::dtype_name;  // src/core/dtype.h

// The problem flags shared by bench, check and tune: --dtype, --causal, --layout; with allow_8bit (bench, check)
// also --dtype e4m3, --precision and --out-dtype.
struct ProblemFlags {
  std::vector<flashcore_dtype> dtypes{FLASHCORE_DTYPE_BF16};
  std::vector<bool> causal;  // empty: not given (each command has its default)
  bool bhsd = false;
  bool allow_8bit = false;                           // set by the command before parsing
  int32_t precision = FLASHCORE_PRECISION_NATIVE;    // --precision: of the 16-bit dtypes (FP8, INT8: quantized)
  flashcore_dtype out_dtype = FLASHCORE_DTYPE_SAME;  // --out-dtype (SAME: not given)
};
// Consumes the value of `flag` when it is one of them and returns true; false for any other flag.
bool parse_problem_flag(const std::string& flag, Args& a, ProblemFlags& p);
// After parsing (allow_8bit commands): --precision fp8 / int8 needs 16-bit dtypes, and --out-dtype follows the C ABI's
// rule (src/api/validate.cpp): fp16 or bf16 for 8-bit inputs and precision fp8, the input dtype for precision int8,
// not given for native 16-bit calls; usage_error otherwise.
void check_problem_flags(const ProblemFlags& p);

// --mode of bench and check: the forward alone (the default), the backward (flashcore_attention_backward; the forward
// runs once before it for O and LSE), or both.
enum class PassMode { Fwd, Bwd, FwdBwd };
// "fwd" / "bwd" / "fwdbwd" -> the mode; usage_error otherwise.
PassMode parse_mode(const std::string& text);
// The mode's command-line word (also the JSON / CSV "mode" field).
const char* mode_name(PassMode mode);
inline bool runs_backward(PassMode mode) { return mode != PassMode::Fwd; }
// After parsing: the backward takes 16-bit inputs at native precision and writes gradients in the input dtype, so a
// backward mode refuses --dtype e4m3 / e5m2, --precision fp8 / int8 and --out-dtype (usage_error).
void check_mode_flags(PassMode mode, const ProblemFlags& p);

// Params for a problem of these sizes with contiguous strides ("bshd", or "bhsd" when `bhsd`); pointers unset.
// Throws CliError(kExitFailure) naming flashcore_last_error() when the library refuses the sizes.
flashcore_attention_params problem_params(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                                          int64_t heads_kv, int64_t head_dim, flashcore_dtype dtype, bool causal,
                                          bool bhsd, int64_t head_dim_v = 0);

// Library capabilities (never needs a GPU).
flashcore_capabilities capabilities();
bool caps_has_dtype(const flashcore_capabilities& caps, flashcore_dtype dt);
// Whether this build compiled the int8 Q K^T kernels that precision = INT8 runs (any head dim; no device needed).
bool have_int8_kernels();
// usage_error when the kernels `precision` runs are not compiled in: the e4m3 ones for FP8, the int8 Q K^T ones for
// INT8 (checked before the device, as a --dtype that is not compiled in).
void require_precision_kernels(int32_t precision, const flashcore_capabilities& caps);
bool caps_has_head_dim(const flashcore_capabilities& caps, int64_t d);
std::string caps_head_dims_string(const flashcore_capabilities& caps);

struct DeviceInfo {
  int index = -1;
  std::string name;
  int major = 0, minor = 0;
  int sms = 0;
  int64_t l2_bytes = 0;
  int clock_mhz = 0;      // max SM clock
  int mem_clock_mhz = 0;
  int mem_bus_bits = 0;
  int64_t mem_bytes = 0;
  // Theoretical DRAM bandwidth, GB/s: 2 transfers per memory clock x bus width (0 when unknown), as the library's V
  // route rule computes it.
  double hbm_peak_gbps() const { return flashcore::core::dram_peak_gbps_of(mem_clock_mhz * 1000, mem_bus_bits); }
  std::string pci_bus_id;  // for NVML
  std::string backend;     // the library's backend for it (flashcore_capabilities.device_backend): "sm90", "sm80"
  bool hopper_backend() const { return backend == "sm90"; }
  std::string arch_text() const { return "sm_" + std::to_string(major) + std::to_string(minor); }
};

// Fills `info` for device `index`. Returns false with a reason when there is no usable CUDA device; never
// throws for that. The reason starts with one of:
//   "no NVIDIA driver found ..."                           (libcuda.so.1 cannot be loaded)
//   "NVIDIA driver too old for this CUDA 13 build (...)"   (it names the driver branch needed, e.g. R580)
//   "no GPU (...)"                                         (the driver sees none, or CUDA_VISIBLE_DEVICES hides all)
//   "device N out of range ..."
// or names another CUDA error.
bool query_device(int index, DeviceInfo& info, std::string& reason);

// The CUDA runtime this program is linked with and the installed driver, as "13.0" / "12.4"; the driver is
// "none" when no driver is installed (cudaDriverGetVersion reports 0).
std::string cuda_runtime_version();
std::string cuda_driver_version();
// The oldest driver branch for a runtime major version, e.g. 13 -> 580 (R580); 0 when not known.
int min_driver_branch(int runtime_major);

// For `bench`, `check`, `tune` and `tvla`: selects device `index` and requires that a backend of this library serves
// it (flashcore_capabilities.device_supported: sm90 on Hopper, the portable sm80 backend on 8.x and, through its PTX,
// on newer GPUs; FLASHCORE_BACKEND=sm80 is honoured). Otherwise throws CliError(kExitNoGpu, "no supported GPU found:
// <reason>"). The returned info names the backend.
DeviceInfo require_device(int index);

// For what only the sm90 backend runs (8-bit inputs, precision fp8 / int8, the autotuner): throws
// CliError(kExitNoGpu, "<what> runs on Hopper (the sm90 backend) only; device N (<name>, sm_XY) is served by the
// portable sm80 backend ...") unless `dev`'s backend is sm90.
void require_hopper_backend(const DeviceInfo& dev, const std::string& what);

std::string shell_quote(const std::string& s);
std::string json_escape(const std::string& s);
// A CSV field: quoted (inner quotes doubled) when it holds a comma, a quote or a line break.
std::string csv_field(const std::string& s);

}  // namespace fccli
