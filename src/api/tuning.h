// Tuning tables: the autotuner's choices (flashcore tune) per GPU and shape bucket, read by dispatch at first use.
// Format and lookup rules: docs/tuning.md. A table is keyed by GPU name, SM count, compute capability, driver
// and library version; one that does not match the device or this library is ignored with a warning, and so
// is every entry that names a config which is neither compiled in nor a loadable, hash-verified cubin.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "flashcore/flashcore.h"

namespace flashcore::tuning {

struct Candidate {
  std::string config;  // config name (sm90::config_name)
  double ms = 0;       // median kernel time on the bucket's benchmark shape
};

struct Entry {
  flashcore_dtype dtype = FLASHCORE_DTYPE_BF16;
  int head_dim = 0;
  bool causal = false;
  int64_t seqlen_q = 0, seqlen_k = 0;  // the bucket: bucket_of() of the call's lengths
  std::string config;                  // the winner
  std::string cubin;                   // "" for a config compiled into the library, else the cubin's path
  std::string cubin_hash;              // sm90::file_hash of that cubin
  double speedup = 1;                  // default's time / winner's time on the bucket's shape
  std::vector<Candidate> elites;       // top-K, fastest first (the winner first)
};

struct DeviceKey {
  std::string gpu_name;  // cudaDeviceProp::name
  int sm_count = 0;
  int cc = 0;            // major * 10 + minor
  int driver_version = 0;  // cudaDriverGetVersion
};

struct Table {
  int format_version = 1;
  DeviceKey device;
  std::string library_version;  // flashcore_version_string() of the library that made it
  uint64_t seed = 0;
  std::string created;          // ISO 8601 UTC
  std::vector<Entry> entries;
};

// JSON text <-> Table. from_json rejects (false + error) anything that is not a well-formed table of this format.
std::string to_json(const Table& table);
bool from_json(const std::string& text, Table& out, std::string& error);

// The bucket of a sequence length: the smallest power of two >= seqlen (1 for seqlen <= 1), capped at 2^20.
int64_t bucket_of(int64_t seqlen);

// The device's key (cudaGetDeviceProperties, cudaDriverGetVersion); false when the device cannot be queried.
bool device_key(int device, DeviceKey& key);

// Where the user's table for a device lives: $FLASHCORE_TUNING_TABLE when set (a file), else
// <cache>/tuning-<gpu slug>-<sm count>sm.json with <cache> = $FLASHCORE_CACHE_DIR, $XDG_CACHE_HOME/flashcore or
// ~/.cache/flashcore.
std::string table_path(const DeviceKey& key);
std::string cache_dir();

// The built-in table for a GPU (shipped with the library, src/api/tuned/*.json), nullptr when there is none.
const char* builtin_table_json(const DeviceKey& key);

// The config dispatch should use for a call that names none: "" = the library's default row. Loads, once per
// device, the user's table (table_path) or else the built-in one, and keeps only entries whose config is
// available (compiled in, or a cubin that exists with the recorded hash and registers). The first elite of the
// call's bucket that is available and runnable wins; `workspace_given`: the call passed a workspace, so a config
// that needs one (dynamic scheduler) may be chosen, otherwise such elites are passed over.
std::string choose(int device, int cc, flashcore_dtype dtype, int head_dim, bool causal, int64_t seqlen_q,
                   int64_t seqlen_k, bool workspace_given);

// Where the choice for `device` came from: "user:<path>", "builtin:<gpu>", or "none", with the warnings issued.
std::string source_description(int device);

// Forget the loaded tables (tests; the next choose() reloads).
void reset();

}  // namespace flashcore::tuning
