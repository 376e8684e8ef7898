// Tuning tables (tuning.h): the JSON form, the checks of a table against the device and this library, and the
// per-device choice dispatch asks for. nlohmann/json throws on malformed input; every call into it is caught
// here, so nothing thrown reaches the C ABI.
#include "api/tuning.h"

#include "api/build_id.h"

#include <cuda_runtime_api.h>
#include <sys/stat.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/backend.h"
#include "core/dtype.h"
#include "kernels/sm90/variant.h"

namespace flashcore::tuning {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;  // to_json keeps the schema's key order

constexpr const char kFormat[] = "flashcore-tuning";
constexpr int kFormatVersion = 1;
constexpr int64_t kMaxBucket = int64_t{1} << 20;

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

std::string join_path(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// ---- from_json: strict reading, the first problem named by its place in the table ----

// Reads the fields of one JSON object. Each getter checks that the key is there (or, for optional ones, absent)
// with the right type and range; the first failure is recorded as "<path>.<key>: <what>" in `error`, and every
// later getter does nothing.
class Reader {
 public:
  Reader(const Json& object, std::string path, std::string& error)
      : object_(object), path_(std::move(path)), error_(error) {}

  bool ok() const { return error_.empty(); }
  std::string where(const char* key) const { return path_.empty() ? key : path_ + "." + key; }
  void fail(const char* key, const std::string& what) {
    if (ok()) error_ = where(key) + ": " + what;
  }

  // The value of `key`, nullptr when it is absent (an error unless `optional`) or an earlier getter failed.
  const Json* field(const char* key, bool optional = false) {
    if (!ok()) return nullptr;
    const auto it = object_.find(key);
    if (it == object_.end()) {
      if (!optional) fail(key, "missing");
      return nullptr;
    }
    return &*it;
  }

  bool typed(const char* key, const Json* v, bool right_type, const char* expected) {
    if (v == nullptr) return false;
    if (!right_type) fail(key, std::string("expected ") + expected + ", got " + v->type_name());
    return right_type;
  }

  void string(const char* key, std::string& out, bool optional = false, bool allow_empty = false) {
    const Json* v = field(key, optional);
    if (!typed(key, v, v != nullptr && v->is_string(), "a string")) return;
    out = v->get<std::string>();
    if (out.empty() && !allow_empty) fail(key, "must not be empty");
  }

  void integer(const char* key, int64_t min, int64_t max, int64_t& out) {
    const Json* v = field(key);
    if (!typed(key, v, v != nullptr && v->is_number_integer(), "an integer")) return;
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      fail(key, v->dump() + " is out of range");
      return;
    }
    out = v->get<int64_t>();
    if (out < min || out > max) {
      fail(key, std::to_string(out) + (min == 1 && out < 1 ? " must be positive" : " is out of range [" +
                                       std::to_string(min) + ", " + std::to_string(max) + "]"));
    }
  }

  void integer(const char* key, int64_t min, int64_t max, int& out) {
    int64_t wide = 0;
    integer(key, min, max, wide);
    out = static_cast<int>(wide);
  }

  void unsigned64(const char* key, uint64_t& out) {
    const Json* v = field(key);
    if (!typed(key, v, v != nullptr && v->is_number_integer(), "an integer")) return;
    if (!v->is_number_unsigned() && v->get<int64_t>() < 0) {
      fail(key, v->dump() + " must not be negative");
      return;
    }
    out = v->get<uint64_t>();
  }

  void boolean(const char* key, bool& out) {
    const Json* v = field(key);
    if (typed(key, v, v != nullptr && v->is_boolean(), "true or false")) out = v->get<bool>();
  }

  void positive(const char* key, double& out) {
    const Json* v = field(key);
    if (!typed(key, v, v != nullptr && v->is_number(), "a number")) return;
    out = v->get<double>();
    if (!(out > 0) || !std::isfinite(out)) fail(key, v->dump() + " must be a positive number");
  }

  // The cubin fields: both absent (a config compiled into the library), or a path and its hash. A hash that
  // does not match the file drops the candidate when the table is loaded, not the table.
  void cubin(std::string& path, std::string& hash) {
    string("cubin", path, /*optional=*/true, /*allow_empty=*/true);
    string("cubin_hash", hash, /*optional=*/path.empty(), /*allow_empty=*/true);
    if (ok() && path.empty() && !hash.empty()) fail("cubin_hash", "given without a cubin");
  }

 private:
  const Json& object_;
  std::string path_;
  std::string& error_;
};

bool parse_dtype(const std::string& name, flashcore_dtype& dtype) {
  for (flashcore_dtype d : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP8_E4M3,
                            FLASHCORE_DTYPE_FP8_E5M2}) {
    if (name == dtype_name(d)) {
      dtype = d;
      return true;
    }
  }
  return false;
}

// The bucket fields: a power of two up to 2^20 (what bucket_of gives), else no call could ever match it.
void read_bucket(Reader& r, const char* key, int64_t& out) {
  r.integer(key, 1, kMaxBucket, out);
  if (r.ok() && bucket_of(out) != out) r.fail(key, std::to_string(out) + " is not a bucket (a power of two <= 2^20)");
}

void read_entry(const Json& j, const std::string& path, Entry& e, std::string& error) {
  if (!j.is_object()) {
    error = path + ": expected an object, got " + j.type_name();
    return;
  }
  Reader r(j, path, error);
  std::string dtype;
  r.string("dtype", dtype);
  if (r.ok() && !parse_dtype(dtype, e.dtype))
    r.fail("dtype", "\"" + dtype + "\" is not fp16, bf16, fp8_e4m3 or fp8_e5m2");
  r.integer("head_dim", 1, INT32_MAX, e.head_dim);
  r.boolean("causal", e.causal);
  read_bucket(r, "seqlen_q", e.seqlen_q);
  read_bucket(r, "seqlen_k", e.seqlen_k);
  r.string("config", e.config);
  r.cubin(e.cubin, e.cubin_hash);
  r.positive("speedup", e.speedup);
  const Json* elites = r.field("elites");
  if (!r.typed("elites", elites, elites != nullptr && elites->is_array(), "an array")) return;
  if (elites->empty()) {
    r.fail("elites", "must hold at least the winner");
    return;
  }
  for (size_t i = 0; i < elites->size() && r.ok(); ++i) {
    const std::string where = r.where("elites") + "[" + std::to_string(i) + "]";
    const Json& ej = (*elites)[i];
    if (!ej.is_object()) {
      error = where + ": expected an object, got " + ej.type_name();
      return;
    }
    Candidate c;
    Reader er(ej, where, error);
    er.string("config", c.config);
    er.positive("ms", c.ms);
    er.cubin(c.cubin, c.cubin_hash);
    e.elites.push_back(std::move(c));
  }
  if (!r.ok()) return;
  const Candidate& first = e.elites.front();
  if (first.config != e.config || first.cubin != e.cubin) {
    r.fail("elites", "the first elite (\"" + first.config + "\") is not the winner (\"" + e.config +
                         "\"): elites are fastest first");
  }
}

bool parse_table(const std::string& text, Table& out, std::string& error) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    error = e.what();
    return false;
  }
  if (!j.is_object()) {
    error = std::string("the table is not a JSON object (got ") + j.type_name() + ")";
    return false;
  }
  Table t;
  Reader r(j, "", error);
  std::string format;
  r.string("format", format);
  if (r.ok() && format != kFormat) r.fail("format", "\"" + format + "\" is not \"" + kFormat + "\"");
  r.integer("format_version", 1, INT32_MAX, t.format_version);
  if (r.ok() && t.format_version != kFormatVersion) {
    r.fail("format_version", std::to_string(t.format_version) + " is not supported (this library reads " +
                                 std::to_string(kFormatVersion) + ")");
  }
  const Json* device = r.field("device");
  if (r.typed("device", device, device != nullptr && device->is_object(), "an object")) {
    Reader d(*device, "device", error);
    d.string("gpu_name", t.device.gpu_name);
    d.integer("sm_count", 1, INT32_MAX, t.device.sm_count);
    d.integer("cc", 1, INT32_MAX, t.device.cc);
    d.integer("driver_version", 1, INT32_MAX, t.device.driver_version);
  }
  r.string("library_version", t.library_version);
  r.string("kernels_hash", t.kernels_hash, /*optional=*/true, /*allow_empty=*/true);
  r.unsigned64("seed", t.seed);
  r.string("created", t.created, /*optional=*/false, /*allow_empty=*/true);
  const Json* entries = r.field("entries");
  if (!r.typed("entries", entries, entries != nullptr && entries->is_array(), "an array")) return false;
  std::map<std::tuple<flashcore_dtype, int, bool, int64_t, int64_t>, size_t> seen;
  for (size_t i = 0; i < entries->size() && r.ok(); ++i) {
    const std::string path = "entries[" + std::to_string(i) + "]";
    Entry e;
    read_entry((*entries)[i], path, e, error);
    if (!r.ok()) break;
    const auto [it, fresh] = seen.emplace(std::make_tuple(e.dtype, e.head_dim, e.causal, e.seqlen_q, e.seqlen_k), i);
    if (!fresh) {
      error = path + ": repeats the key (dtype, head_dim, causal, seqlen_q, seqlen_k) of entries[" +
              std::to_string(it->second) + "]";
      break;
    }
    t.entries.push_back(std::move(e));
  }
  if (!r.ok()) return false;
  out = std::move(t);
  return true;
}

OrderedJson cubin_fields(OrderedJson j, const std::string& cubin, const std::string& hash) {
  if (!cubin.empty()) {
    j["cubin"] = cubin;
    j["cubin_hash"] = hash;
  }
  return j;
}

// ---- loading for a device ----

void warn(LoadedTable& out, std::string line) { out.warnings.push_back(std::move(line)); }

std::string key_text(const Entry& e) {
  return std::string(dtype_name(e.dtype)) + " head_dim " + std::to_string(e.head_dim) +
         (e.causal ? " causal" : " non-causal");
}

std::string gpu_text(const std::string& name, int sm_count) {
  return "\"" + name + "\" (" + std::to_string(sm_count) + " SMs)";
}

std::string cc_text(int cc) { return std::to_string(cc / 10) + "." + std::to_string(cc % 10); }

// Why table `t` does not fit `device` and this library; "" when it does.
std::string mismatch(const Table& t, const DeviceKey& device, bool check_driver) {
  if (t.device.gpu_name != device.gpu_name || t.device.sm_count != device.sm_count) {
    return "it was made on " + gpu_text(t.device.gpu_name, t.device.sm_count) + ", this device is " +
           gpu_text(device.gpu_name, device.sm_count);
  }
  if (t.device.cc != device.cc) {
    return "it was made on compute capability " + cc_text(t.device.cc) + ", this device is " + cc_text(device.cc);
  }
  if (t.library_version != flashcore_version_string()) {
    return "it was made by FlashCore " + t.library_version + ", this is " + flashcore_version_string() +
           " (re-run flashcore tune)";
  }
  // A user table must come from this build's kernels; a built-in one is part of the sources (the configure step
  // checks that every config it names is compiled: src/kernels/sm90/sources.cmake).
  if (check_driver && t.kernels_hash != kernels_hash()) {
    return "it was made for the kernels of another build (kernels_hash " +
           (t.kernels_hash.empty() ? std::string("absent") : "\"" + t.kernels_hash + "\"") + ", this library's is \"" +
           kernels_hash() + "\"; re-run flashcore tune)";
  }
  if (check_driver && t.device.driver_version / 1000 != device.driver_version / 1000) {
    return "it was made under CUDA driver " + std::to_string(t.device.driver_version) + ", this one is " +
           std::to_string(device.driver_version) + " (another major version)";
  }
  return "";
}

struct Verdict {
  bool ok = false;
  bool needs_workspace = false;
  std::string why;
};

Verdict check(const Entry& e, Candidate c, const std::string& table_dir, const Availability& available) {
  Verdict v;
  if (!c.cubin.empty()) {
    if (c.cubin.front() != '/') c.cubin = join_path(table_dir, c.cubin);
    struct stat st {};
    if (::stat(c.cubin.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      v.why = "its cubin " + c.cubin + " does not exist";
      return v;
    }
    const std::string hash = sm90::file_hash(c.cubin);
    if (hash.empty()) {
      v.why = "its cubin " + c.cubin + " cannot be read";
      return v;
    }
    if (lower(hash) != lower(c.cubin_hash)) {
      v.why = "its cubin " + c.cubin + " has hash " + hash + ", the table recorded " + c.cubin_hash;
      return v;
    }
  }
  v.ok = available(e, c, v.needs_workspace, v.why);
  return v;
}

// Reads a whole file: 0, or the errno of the failure.
int read_file(const std::string& path, std::string& text) {
  errno = 0;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return errno != 0 ? errno : EIO;
  text.clear();
  char buf[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  const int err = std::ferror(f) != 0 ? (errno != 0 ? errno : EIO) : 0;
  std::fclose(f);
  return err;
}

std::string dir_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
}

bool tuning_off() {
  const char* v = std::getenv("FLASHCORE_TUNING");
  return v != nullptr && std::strcmp(v, "off") == 0;
}

// The availability of a candidate on this device: a cubin registers (sm90::register_variant, once per path;
// the row then lives as long as the process), then the backend of `cc` has the config for the entry's key.
Availability device_availability(int cc) {
  return [cc](const Entry& e, const Candidate& c, bool& needs_workspace, std::string& why) {
    if (!c.cubin.empty()) {
      sm90::VariantSpec spec;
      spec.dtype = e.dtype;
      spec.head_dim = e.head_dim;
      spec.causal = e.causal;
      if (!sm90::parse_config_name(c.config, spec.shape)) {
        why = "\"" + c.config + "\" is not a config name";
        return false;
      }
      const sm90::KernelRow* row = nullptr;
      std::string error;
      if (sm90::register_variant(spec, c.cubin, &row, error) != FLASHCORE_SUCCESS) {
        why = "its cubin " + c.cubin + " does not load: " + error;
        return false;
      }
    }
    if (!backend::config_available(cc, e.dtype, e.head_dim, e.causal, c.config.c_str(), &needs_workspace)) {
      why = "this library has no such config for " + key_text(e) + " on compute capability " + cc_text(cc);
      return false;
    }
    return true;
  };
}

LoadedTable load_device(int device, int cc) {
  DeviceKey key;
  if (!device_key(device, key)) return LoadedTable{};
  const std::string user = table_path(key);
  return load_tables(key, user, !env("FLASHCORE_TUNING_TABLE").empty(), builtin_table_json(key),
                     device_availability(cc));
}

// The table of each device, loaded at its first use. Devices below kFastDevices are also published in an atomic
// slot, so that later calls take no lock. Never destroyed: a call may still dispatch while static objects are
// destroyed at exit, and choose() hands out pointers into the tables (reset() retires them).
constexpr int kFastDevices = 64;
struct Loaded {
  std::mutex mutex;
  std::map<int, std::shared_ptr<const LoadedTable>> tables;
  std::vector<std::shared_ptr<const LoadedTable>> retired;
  std::atomic<const LoadedTable*> fast[kFastDevices] = {};
};
Loaded& loaded() {
  static Loaded* state = new Loaded;
  return *state;
}

const LoadedTable& table_for(int device, int cc) {
  Loaded& s = loaded();
  const bool fast = device >= 0 && device < kFastDevices;
  if (fast) {
    if (const LoadedTable* t = s.fast[device].load(std::memory_order_acquire)) return *t;
  }
  const std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.tables.find(device);
  if (it == s.tables.end()) {
    auto table = std::make_shared<const LoadedTable>(load_device(device, cc));
    for (const std::string& line : table->warnings) std::fprintf(stderr, "flashcore: %s\n", line.c_str());
    it = s.tables.emplace(device, std::move(table)).first;
  }
  if (fast) s.fast[device].store(it->second.get(), std::memory_order_release);
  return *it->second;
}

}  // namespace

const char* kernels_hash() { return FLASHCORE_KERNELS_HASH; }

std::string to_json(const Table& table) {
  OrderedJson j;
  j["format"] = kFormat;
  j["format_version"] = table.format_version;
  j["device"] = {{"gpu_name", table.device.gpu_name},
                 {"sm_count", table.device.sm_count},
                 {"cc", table.device.cc},
                 {"driver_version", table.device.driver_version}};
  j["library_version"] = table.library_version;
  j["kernels_hash"] = table.kernels_hash;
  j["seed"] = table.seed;
  j["created"] = table.created;
  OrderedJson entries = OrderedJson::array();
  for (const Entry& e : table.entries) {
    OrderedJson ej = {{"dtype", dtype_name(e.dtype)}, {"head_dim", e.head_dim}, {"causal", e.causal},
                      {"seqlen_q", e.seqlen_q},       {"seqlen_k", e.seqlen_k}, {"config", e.config}};
    ej = cubin_fields(std::move(ej), e.cubin, e.cubin_hash);
    ej["speedup"] = e.speedup;
    OrderedJson elites = OrderedJson::array();
    for (const Candidate& c : e.elites) {
      elites.push_back(cubin_fields({{"config", c.config}, {"ms", c.ms}}, c.cubin, c.cubin_hash));
    }
    ej["elites"] = std::move(elites);
    entries.push_back(std::move(ej));
  }
  j["entries"] = std::move(entries);
  // Invalid UTF-8 in a name is replaced rather than thrown.
  return j.dump(2, ' ', false, OrderedJson::error_handler_t::replace) + "\n";
}

bool from_json(const std::string& text, Table& out, std::string& error) {
  error.clear();
  try {
    return parse_table(text, out, error);
  } catch (const std::exception& e) {  // a conversion nlohmann refuses: reported, never thrown
    error = std::string("malformed table: ") + e.what();
    return false;
  }
}

int64_t bucket_of(int64_t seqlen) {
  int64_t bucket = 1;
  while (bucket < seqlen && bucket < kMaxBucket) bucket <<= 1;
  return bucket;
}

bool device_key(int device, DeviceKey& key) {
  cudaDeviceProp prop{};
  int driver = 0;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess || cudaDriverGetVersion(&driver) != cudaSuccess) {
    (void)cudaGetLastError();  // do not leave the error for the caller's next CUDA call
    return false;
  }
  key.gpu_name = prop.name;
  key.sm_count = prop.multiProcessorCount;
  key.cc = prop.major * 10 + prop.minor;
  key.driver_version = driver;
  return true;
}

std::string cache_dir() {
  if (std::string dir = env("FLASHCORE_CACHE_DIR"); !dir.empty()) return dir;
  if (std::string xdg = env("XDG_CACHE_HOME"); !xdg.empty()) return join_path(xdg, "flashcore");
  if (std::string home = env("HOME"); !home.empty()) return join_path(home, ".cache/flashcore");
  return "";
}

std::string table_path(const DeviceKey& key) {
  if (std::string path = env("FLASHCORE_TUNING_TABLE"); !path.empty()) return path;
  const std::string dir = cache_dir();
  if (dir.empty()) return "";
  std::string slug = lower(key.gpu_name);
  for (char& c : slug) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '-';
  }
  return join_path(dir, "tuning-" + slug + "-" + std::to_string(key.sm_count) + "sm.json");
}

const char* builtin_table_json(const DeviceKey& key) {
  int count = 0;
  const BuiltinTable* tables = builtin_tables(count);
  for (int i = 0; i < count; ++i) {
    if (key.gpu_name == tables[i].gpu_name && key.sm_count == tables[i].sm_count) return tables[i].json;
  }
  return nullptr;
}

bool load_for(const DeviceKey& device, const std::string& text, const std::string& origin,
              const std::string& table_dir, const Availability& available, LoadedTable& out, bool check_driver) {
  Table table;
  std::string error;
  if (!from_json(text, table, error)) {
    warn(out, "ignoring tuning table " + origin + ": malformed: " + error);
    return false;
  }
  if (const std::string why = mismatch(table, device, check_driver); !why.empty()) {
    warn(out, "ignoring tuning table " + origin + ": " + why);
    return false;
  }
  // A candidate is checked once per (key, config, cubin): the same one in many buckets costs one check and
  // one warning.
  std::map<std::string, Verdict> verdicts;
  std::vector<LoadedEntry> entries;
  for (const Entry& e : table.entries) {
    LoadedEntry le;
    le.dtype = e.dtype;
    le.head_dim = e.head_dim;
    le.causal = e.causal;
    le.seqlen_q = e.seqlen_q;
    le.seqlen_k = e.seqlen_k;
    for (const Candidate& c : e.elites) {
      const std::string id = key_text(e) + '\n' + c.config + '\n' + c.cubin + '\n' + c.cubin_hash;
      const auto [it, fresh] = verdicts.try_emplace(id);
      if (fresh) {
        it->second = check(e, c, table_dir, available);
        // A built-in table's runners-up that the build tier left out (docs/decisions.md#build-tiers) go quietly: the
        // configure step checks that its choices are compiled.
        const bool builtin_runner_up = origin.rfind("built-in", 0) == 0 && c.config != e.config;
        if (!it->second.ok && !builtin_runner_up) {
          warn(out, "tuning table " + origin + ": dropping config \"" + c.config + "\" for " + key_text(e) + ": " +
                        it->second.why);
        }
      }
      if (it->second.ok) le.choices.push_back({c.config, it->second.needs_workspace});
    }
    if (!le.choices.empty()) entries.push_back(std::move(le));
  }
  out.entries = std::move(entries);
  return true;
}

LoadedTable load_tables(const DeviceKey& device, const std::string& user_path, bool user_path_explicit,
                        const char* builtin_json, const Availability& available) {
  LoadedTable out;
  if (!user_path.empty()) {
    std::string text;
    const int err = read_file(user_path, text);
    if (err == 0) {
      if (load_for(device, text, user_path, dir_of(user_path), available, out)) {
        out.origin = "user:" + user_path;
        return out;
      }
    } else if (err != ENOENT || user_path_explicit) {
      warn(out, "ignoring tuning table " + user_path + ": cannot read it: " + std::strerror(err));
    }
  }
  if (builtin_json != nullptr) {
    const std::string origin = "built-in for " + gpu_text(device.gpu_name, device.sm_count);
    if (load_for(device, builtin_json, origin, "", available, out, /*check_driver=*/false)) {
      out.origin = "builtin:" + device.gpu_name;
    }
  }
  return out;
}

const std::string* pick(const LoadedTable& table, flashcore_dtype dtype, int head_dim, bool causal,
                        int64_t seqlen_q, int64_t seqlen_k, bool workspace_given) {
  const int64_t bucket_q = bucket_of(seqlen_q), bucket_k = bucket_of(seqlen_k);
  for (const LoadedEntry& e : table.entries) {
    if (e.dtype != dtype || e.head_dim != head_dim || e.causal != causal || e.seqlen_q != bucket_q ||
        e.seqlen_k != bucket_k) {
      continue;
    }
    for (const Choice& c : e.choices) {
      if (!c.needs_workspace || workspace_given) return &c.config;
    }
    return nullptr;
  }
  return nullptr;
}

const char* choose(int device, int cc, flashcore_dtype dtype, int head_dim, bool causal, int64_t seqlen_q,
                   int64_t seqlen_k, bool workspace_given) {
  if (tuning_off()) return nullptr;
  const std::string* config =
      pick(table_for(device, cc), dtype, head_dim, causal, seqlen_q, seqlen_k, workspace_given);
  return config != nullptr ? config->c_str() : nullptr;
}

std::string source_description(int device) {
  if (tuning_off()) return "off (FLASHCORE_TUNING=off)";
  DeviceKey key;
  const int cc = device_key(device, key) ? key.cc : 0;
  const LoadedTable& table = table_for(device, cc);
  std::string text = table.origin;
  for (const std::string& line : table.warnings) text += "; " + line;
  return text;
}

void reset() {
  Loaded& s = loaded();
  const std::lock_guard<std::mutex> lock(s.mutex);
  for (std::atomic<const LoadedTable*>& slot : s.fast) slot.store(nullptr, std::memory_order_release);
  for (auto& [device, table] : s.tables) s.retired.push_back(std::move(table));
  s.tables.clear();
}

}  // namespace flashcore::tuning
