// Runtime kernel variants (variant.h): config names, the host mirror of KernelConfig and the nvcc build of one tile
// config into a cubin. Loading and the registry: variant_registry.cpp.
#include "kernels/sm90/variant.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "kernels/sm90/smem_plan.h"

namespace flashcore::sm90 {
namespace {

namespace fs = std::filesystem;

// Registers per consumer thread beyond the accumulators and P fragments (indices, row max/sum, descriptors,
// addresses): the largest overhead that keeps every row of configs.txt within its budget (d64 192x128: 128 + 32).
constexpr int kRegOverhead = 32;
constexpr size_t kMaxErrorOutput = 8000;  // nvcc output quoted in an error, at most
// The flags of the library's sm90 units (cmake/FlashcoreCuda.cmake, src/CMakeLists.txt; Release), as one string.
const char* const kDeviceFlags =
    "-cubin -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -lineinfo "
    "-Xptxas=-v -DFLASHCORE_BUILDING_LIBRARY=1";

// Sets `error` and returns `status`.
flashcore_status fail(std::string& error, std::string message, flashcore_status status) {
  error = std::move(message);
  return status;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

bool read_bytes(const fs::path& path, std::string& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  return !f.bad();
}

// A name beside `path` that no other writer (process or thread) uses.
fs::path temp_path(const fs::path& path) {
  static std::atomic<unsigned> serial{0};
  return path.string() + "." + std::to_string(getpid()) + "." + std::to_string(serial++) + ".tmp";
}

// Writes through a temporary name and a rename, so a concurrent reader sees the old file or the whole new one.
bool write_atomically(const fs::path& path, const std::string& bytes) {
  const fs::path tmp = temp_path(path);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f || !f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()))) return false;
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fs::remove(tmp, ec);
  return !ec;
}

uint64_t fnv1a(const std::string& bytes, uint64_t h = 0xcbf29ce484222325ull) {
  for (const unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// One word for sh: 'it'\''s'.
std::string quote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs a shell command; `output` gets its stdout and stderr. True when it exited 0.
bool run(const std::string& command, std::string& output) {
  output.clear();
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return false;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), pipe)) > 0;) output.append(buf, n);
  return pclose(pipe) == 0;
}

bool has_kernel_sources(const fs::path& dir) { return !dir.empty() && is_file(dir / "kernels/sm90/kernel.cuh"); }

const char* dtype_tag(flashcore_dtype dt) { return dt == FLASHCORE_DTYPE_FP16 ? "fp16" : "bf16"; }

// The generated translation unit (config_grammar.h, as the build's units): the row struct and an explicit
// instantiation of its kernel, without a KernelRow (register_variant makes that).
std::string unit_source(const VariantSpec& spec) {
  UnitSpec u;
  u.symbol = variant_symbol(spec);
  u.element = u.out_element = spec.dtype == FLASHCORE_DTYPE_FP16 ? "__half" : "__nv_bfloat16";
  u.head_dim = spec.head_dim;
  u.causal = spec.causal;
  u.shape = spec.shape;
  return sm90::unit_source(u, "flashcore::sm90::build_variant (src/kernels/sm90/variant.cpp)",
                           variant_unit_tail(u.symbol));
}

// The hash a cubin's name carries: every kernel source and header the unit can include (the installed set,
// src/CMakeLists.txt), the unit and the device flags. Neither paths nor nvcc are part of it: a machine without
// nvcc finds the cubins built elsewhere from the same sources (docs/tuning.md, --compile-only); a new nvcc,
// however, reuses cubins of the old one.
bool build_hash(const fs::path& src, const std::string& unit, std::string& hash, std::string& error) {
  std::vector<fs::path> files = {fs::path("..") / "include" / "flashcore" / "flashcore.h"};
  for (const char* sub : {"kernels/common", "kernels/sm90"}) {
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(src / sub, ec)) {
      const std::string ext = e.path().extension().string();
      std::error_code type_ec;
      if (e.is_regular_file(type_ec) && (ext == ".cuh" || ext == ".h" || ext == ".inc")) {
        files.push_back(fs::path(sub) / e.path().filename());
      }
    }
    if (ec) {
      error = "cannot list " + (src / sub).string() + ": " + ec.message();
      return false;
    }
  }
  std::sort(files.begin() + 1, files.end());
  uint64_t h = fnv1a(unit + '\0' + kDeviceFlags + '\0');
  for (const fs::path& f : files) {
    std::string bytes;
    if (!read_bytes(src / f, bytes)) {
      error = "cannot read " + (src / f).string();
      return false;
    }
    h = fnv1a(f.generic_string() + '\0' + bytes + '\0', h);
  }
  hash = hex16(h);
  return true;
}

// Why ptxas's report (-Xptxas=-v) disqualifies the kernel; "" when it does not.
std::string ptxas_verdict(const std::string& report) {
  if (report.find("C7508") != std::string::npos) return "ptxas ignored setmaxnreg (C7508)";
  std::istringstream lines(report);
  int reports = 0;
  for (std::string line; std::getline(lines, line);) {
    // C7510, C7512, ...: ptxas serialized wgmma (for lack of registers, or another reason): slow.
    if (line.find("wgmma.mma_async instructions are serialized") != std::string::npos) return line;
    int stack = 0, stores = 0, loads = 0;
    const size_t at = line.find_first_not_of(" \t");
    if (at == std::string::npos || line.find("bytes stack frame") == std::string::npos) continue;
    if (std::sscanf(line.c_str() + at, "%d bytes stack frame, %d bytes spill stores, %d bytes spill loads", &stack,
                    &stores, &loads) != 3) {
      continue;
    }
    ++reports;
    if (stack != 0 || stores != 0 || loads != 0) return "the kernel uses local memory: " + line.substr(at);
  }
  return reports > 0 ? "" : "no ptxas -v report in nvcc's output";
}

}  // namespace

Footprint footprint(const VariantSpec& spec) {
  const SmemPlan plan = smem_plan(spec.shape, spec.head_dim, 2, 2);  // fp16 and bf16: 2-byte Q, K, V and O
  Footprint f;
  f.threads = plan.threads;
  f.smem_bytes = plan.smem_bytes;
  f.separate_o = plan.separate_o;
  f.consumer_regs = plan.consumer_regs;
  // Per consumer thread (64 rows per warpgroup): O (64 x D fp32) and S (64 x N fp32) over 128 threads, and P
  // packed two 16-bit values per register.
  f.estimated_regs = spec.head_dim / 2 + spec.shape.block_n / 2 + spec.shape.block_n / 4 + kRegOverhead;
  return f;
}

bool feasible(const VariantSpec& spec, std::string& why) {
  const TileShape& s = spec.shape;
  auto reject = [&](const std::string& reason) {
    why = reason;
    return false;
  };
  if (spec.dtype != FLASHCORE_DTYPE_FP16 && spec.dtype != FLASHCORE_DTYPE_BF16) {
    return reject("dtype must be fp16 or bf16");
  }
  // The rules of every compiled row (smem_plan.h shape_fault, which config.h asserts), for 16-bit inputs: the
  // shape first (footprint() needs a well-formed one), then its shared memory.
  // Head dims: multiples of 64 (128-byte chunks of 64 columns), or 96 (64-byte chunks of 32: smem_plan.h
  // swizzle_row_bytes); the kernel has no 32-byte 16-bit rows.
  const int chunk_cols = spec.head_dim == 96 ? 32 : 64;
  ShapeFault fault = shape_fault(s, spec.head_dim, chunk_cols, 16, 0);
  const Footprint f = fault == ShapeFault::kNone ? footprint(spec) : Footprint{};
  if (fault == ShapeFault::kNone) fault = shape_fault(s, spec.head_dim, chunk_cols, 16, f.smem_bytes);
  switch (fault) {
    case ShapeFault::kNone: break;
    case ShapeFault::kHeadDim:
      return reject("head_dim = " + std::to_string(spec.head_dim) + " is not 96 nor a multiple of 64 in [64, 256]");
    case ShapeFault::kBlockM:
      return reject("block_m = " + std::to_string(s.block_m) +
                    " is not 64, 128 or 192 (64 rows per warpgroup), nor 8 in a split row with block_n a multiple of "
                    "64 and no ping-pong");
    case ShapeFault::kBlockN:
      return reject("block_n = " + std::to_string(s.block_n) + " is not a multiple of 16 in [16, 256]");
    case ShapeFault::kStages: return reject("stages = " + std::to_string(s.stages) + " is not in [1, 8]");
    case ShapeFault::kSchedule: return reject("unknown schedule " + std::to_string(static_cast<int>(s.schedule)));
    case ShapeFault::kPingPong: return reject("ping-pong needs two or more consumer warpgroups (block_m >= 128)");
    case ShapeFault::kPacked:
      return reject("a packed flavour (-packed) is a dynamic row's (counted ring positions in its producer)");
    case ShapeFault::kSmem:
      return reject("shared memory " + std::to_string(f.smem_bytes) + " bytes > " + std::to_string(kSmemLimitBytes));
  }
  // The register estimate is the host's own guess (ptxas decides for a compiled row, and check_sass.sh checks it).
  if (f.estimated_regs > f.consumer_regs) {
    return reject("about " + std::to_string(f.estimated_regs) + " registers per consumer thread > the budget of " +
                  std::to_string(f.consumer_regs));
  }
  why.clear();
  return true;
}

std::string kernel_source_dir() {
  if (const std::string dir = env("FLASHCORE_KERNEL_SOURCES"); !dir.empty()) {
    if (has_kernel_sources(dir)) return dir;
    return has_kernel_sources(dir + "/src") ? dir + "/src" : "";  // the root of a source tree also does
  }
#ifdef FLASHCORE_SOURCE_ROOT
  if (has_kernel_sources(FLASHCORE_SOURCE_ROOT "/src")) return FLASHCORE_SOURCE_ROOT "/src";
#endif
  // <libdir>/../share/flashcore/src beside the library (or program) this function was loaded from.
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&kernel_source_dir), &info) != 0 && info.dli_fname != nullptr) {
    std::error_code ec;
    const fs::path lib = fs::absolute(info.dli_fname, ec);
    const fs::path dir = (lib.parent_path() / ".." / "share" / "flashcore" / "src").lexically_normal();
    if (!ec && has_kernel_sources(dir)) return dir.string();
  }
  return "";
}

std::string find_nvcc() {
  std::vector<std::string> candidates = {env("FLASHCORE_NVCC"), env("CUDACXX")};
  if (const std::string home = env("CUDA_HOME"); !home.empty()) candidates.push_back(home + "/bin/nvcc");
  std::istringstream path(env("PATH"));
  for (std::string dir; std::getline(path, dir, ':');) {
    if (!dir.empty()) candidates.push_back(dir + "/nvcc");
  }
  candidates.push_back("/usr/local/cuda/bin/nvcc");
  for (const std::string& c : candidates) {
    if (!c.empty() && is_file(c) && access(c.c_str(), X_OK) == 0) return c;
  }
  return "";
}

std::string cubin_stem(const VariantSpec& spec) {
  return std::string("sm90_") + dtype_tag(spec.dtype) + "_d" + std::to_string(spec.head_dim) +
         (spec.causal ? "_c1_" : "_c0_") + config_name(spec.shape);
}

std::string variant_symbol(const VariantSpec& spec) {
  std::string symbol = "v_" + cubin_stem(spec);
  std::replace(symbol.begin(), symbol.end(), '-', '_');
  return symbol;
}

flashcore_status build_variant(const VariantSpec& spec, const std::string& out_dir, std::string& cubin_path,
                               std::string& error) {
  if (std::string why; !feasible(spec, why)) {
    return fail(error, "infeasible variant: " + why, FLASHCORE_ERROR_INVALID_ARGUMENT);
  }
  const std::string src = kernel_source_dir();
  if (src.empty()) {
    error = "no kernel sources found: set FLASHCORE_KERNEL_SOURCES to the src directory of a FlashCore source tree "
            "(or install FlashCore, which puts them in <prefix>/share/flashcore/src)";
    return FLASHCORE_ERROR_UNSUPPORTED_ARCH;
  }
  const std::string unit = unit_source(spec);
  std::string hash;
  if (!build_hash(src, unit, hash, error)) return FLASHCORE_ERROR_INTERNAL;
  const fs::path dir(out_dir.empty() ? "." : out_dir);
  const fs::path base = dir / (cubin_stem(spec) + "_" + hash);
  const fs::path cubin = base.string() + ".cubin";
  cubin_path = cubin.string();
  if (is_file(cubin)) return FLASHCORE_SUCCESS;  // built before from the same inputs

  const std::string nvcc = find_nvcc();
  if (nvcc.empty()) {
    cubin_path.clear();
    return fail(error, "nvcc not found ($FLASHCORE_NVCC, $CUDACXX, $CUDA_HOME/bin, PATH, /usr/local/cuda/bin) and no "
                       "prebuilt " + cubin.string(), FLASHCORE_ERROR_UNSUPPORTED_ARCH);
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  const fs::path cu = base.string() + ".cu";
  if (!write_atomically(cu, unit)) return fail(error, "cannot write " + cu.string(), FLASHCORE_ERROR_INTERNAL);
  const fs::path tmp = temp_path(cubin);  // renamed to `cubin` once ptxas's report is accepted
  const fs::path include = (fs::path(src) / ".." / "include").lexically_normal();
  std::string command = quote(nvcc) + " " + kDeviceFlags + " -I" + quote(src) + " -I" + quote(include.string());
  // CCCL (<cuda/ptx>) from the toolkit of this nvcc (CUDA 13 keeps it in include/cccl; nvcc adds that itself).
  if (const fs::path cccl = fs::path(nvcc).parent_path() / ".." / "include" / "cccl"; fs::is_directory(cccl, ec)) {
    command += " -isystem " + quote(cccl.lexically_normal().string());
  }
  command += " -o " + quote(tmp.string()) + " " + quote(cu.string());
  std::string output;
  const bool compiled = run(command, output);
  (void)write_atomically(base.string() + ".log", command + "\n" + output);
  const std::string verdict = compiled ? ptxas_verdict(output) : "";
  if (!compiled || !verdict.empty()) {
    fs::remove(tmp, ec);
    cubin_path.clear();
    if (compiled) {
      return fail(error, config_name(spec.shape) + " rejected: " + verdict, FLASHCORE_ERROR_INVALID_ARGUMENT);
    }
    return fail(error, "nvcc failed: " + command + "\n" + output.substr(0, kMaxErrorOutput), FLASHCORE_ERROR_INTERNAL);
  }
  fs::rename(tmp, cubin, ec);
  if (ec) {
    fs::remove(tmp, ec);
    cubin_path.clear();
    return fail(error, "cannot write " + cubin.string(), FLASHCORE_ERROR_INTERNAL);
  }
  return FLASHCORE_SUCCESS;
}

std::string file_hash(const std::string& path) {
  std::string bytes;
  return read_bytes(path, bytes) ? hex16(fnv1a(bytes)) : "";
}

}  // namespace flashcore::sm90
