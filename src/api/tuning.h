// Tuning tables: the autotuner's choices (flashcore tune) per GPU and shape bucket, read by dispatch at first use.
// Format and lookup rules: docs/tuning.md. A table is keyed by GPU name, SM count, compute capability, driver
// and library version; one that does not match the device or this library is ignored with a warning, and so
// is every entry that names a config which is neither compiled in nor a loadable, hash-verified cubin.
// FLASHCORE_TUNING=off (read at every call) turns tuned dispatch off: calls that name no config run the default.
//
// The JSON form (to_json / from_json; keys in any order, unknown keys ignored):
//   {"format": "flashcore-tuning", "format_version": 1,
//    "device": {"gpu_name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "cc": 90, "driver_version": 12080},
//    "library_version": "0.2.0", "seed": 7, "created": "2025-06-01T12:00:00Z",
//    "entries": [{"dtype": "bf16", "head_dim": 128, "causal": false, "seqlen_q": 4096, "seqlen_k": 4096,
//                 "config": "128x176x2-static", "speedup": 1.08,
//                 "cubin": "/root/.cache/flashcore/variants/x.cubin", "cubin_hash": "0123456789abcdef",
//                 "elites": [{"config": "128x176x2-static", "ms": 1.21, "cubin": "...", "cubin_hash": "..."},
//                            {"config": "128x128x2-pp-static", "ms": 1.30}]}]}
// "cubin" and "cubin_hash" are left out for a config compiled into the library (a relative cubin path is taken
// relative to the table's folder). dtype: "fp16" or "bf16"; seqlen_q/seqlen_k: buckets (bucket_of); elites:
// at least one, the first the winner (same config and cubin as the entry's); each key (dtype, head_dim, causal,
// seqlen_q, seqlen_k) at most once.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "flashcore/flashcore.h"

namespace flashcore::tuning {

struct Candidate {
  std::string config;  // config name (sm90::config_name)
  double ms = 0;       // median kernel time on the bucket's benchmark shape
  std::string cubin;       // "" for a config compiled into the library, else the cubin's path
  std::string cubin_hash;  // sm90::file_hash of that cubin
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
  std::string kernels_hash;     // kernels_hash() of the library that made it ("" in tables from before 0.3.0's)
  uint64_t seed = 0;
  std::string created;          // ISO 8601 UTC
  std::vector<Entry> entries;
};

// A hash of the kernel sources and build flags this library was compiled from (16 hex digits; src/CMakeLists.txt,
// generated api/build_id.h). A table made by another build is stale for a user table even at the same version: the
// kernels it timed may have changed (the version string stayed 0.3.0 over some 40 kernel changes).
const char* kernels_hash();

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

// The config dispatch should use for a call that names none: nullptr = the library's default row (the string lives
// as long as the process: loaded tables are never freed, reset() only retires them). Loads, once per
// device, the user's table (table_path) or else the built-in one, and keeps only entries whose config is
// available (compiled in, or a cubin that exists with the recorded hash and registers). The first elite of the
// call's bucket that is available and runnable wins; `workspace_given`: the call passed a workspace, so a config
// that needs one (dynamic scheduler) may be chosen, otherwise such elites are passed over.
// After the first call per device, a call costs a lock-free pointer load and a scan of the table (on the hot
// path of every forward call).
const char* choose(int device, int cc, flashcore_dtype dtype, int head_dim, bool causal, int64_t seqlen_q,
                   int64_t seqlen_k, bool workspace_given);

// Where the choice for `device` came from: "user:<path>", "builtin:<gpu>", or "none", with the warnings issued.
std::string source_description(int device);

// Forget the loaded tables (tests; the next choose() reloads). Retired tables stay allocated.
void reset();

// ---- The parts of choose() that need no GPU (tests) ----

// One embedded table (src/api/tuned/*.json, generated by cmake/FlashcoreTunedTables.cmake).
struct BuiltinTable {
  const char* gpu_name;
  int sm_count;
  const char* json;
};
// Every embedded table (count 0, nullptr when the library was configured without any).
const BuiltinTable* builtin_tables(int& count);

// Whether a candidate of `entry` can run on the device: compiled in for the entry's key, or (candidate.cubin set;
// the file exists and has the recorded hash) a cubin that registers. Sets `needs_workspace` (the config needs a
// device workspace: dynamic scheduler); on false, `why` says what is missing.
using Availability = std::function<bool(const Entry& entry, const Candidate& candidate, bool& needs_workspace,
                                        std::string& why)>;

// A table as dispatch uses it: per bucket, the candidates that are available, best first.
struct Choice {
  std::string config;
  bool needs_workspace = false;
};
struct LoadedEntry {
  flashcore_dtype dtype = FLASHCORE_DTYPE_BF16;
  int head_dim = 0;
  bool causal = false;
  int64_t seqlen_q = 0, seqlen_k = 0;
  std::vector<Choice> choices;  // never empty
};
struct LoadedTable {
  std::string origin = "none";        // "user:<path>", "builtin:<gpu name>" or "none"
  std::vector<LoadedEntry> entries;
  std::vector<std::string> warnings;  // one line each, without the "flashcore: " prefix stderr gets
};

// Checks `text`, read from `origin` (a path, or `built-in for "<gpu>" (<n> SMs)`), against `device` and this
// library: on a mismatch (GPU name, SM count, compute capability, library version, driver major version) or a
// malformed table, appends ONE warning naming `origin` and the reason and returns false (`out.entries` untouched).
// Otherwise replaces `out.entries` with the table's entries, each candidate checked once: a cubin that is
// missing or whose sm90::file_hash differs from the recorded one, or that `available` rejects, is dropped with
// a warning naming the config and why (identical warnings once); an entry left with no candidate is dropped.
// `table_dir` resolves relative cubin paths. `check_driver` = false for the built-in tables, which are made for a
// GPU kind and hold under any driver and kernels hash (a user table must match both).
bool load_for(const DeviceKey& device, const std::string& text, const std::string& origin,
              const std::string& table_dir, const Availability& available, LoadedTable& out, bool check_driver = true);

// What choose() loads for a device: the table at `user_path` when that file exists (a missing file is silent
// unless `user_path_explicit`, i.e. named by FLASHCORE_TUNING_TABLE), else or when it is ignored the built-in
// `builtin_json` (nullptr: none), else none.
LoadedTable load_tables(const DeviceKey& device, const std::string& user_path, bool user_path_explicit,
                        const char* builtin_json, const Availability& available);

// The first choice of the entry for (dtype, head_dim, causal, bucket_of(seqlen_q), bucket_of(seqlen_k)) that
// needs no workspace or may have one (`workspace_given`); nullptr when there is none (the default runs).
const std::string* pick(const LoadedTable& table, flashcore_dtype dtype, int head_dim, bool causal,
                        int64_t seqlen_q, int64_t seqlen_k, bool workspace_given);

}  // namespace flashcore::tuning
