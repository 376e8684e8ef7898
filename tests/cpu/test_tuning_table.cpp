// Tuning tables (src/api/tuning.h) without a GPU: the JSON form and its strict reading, buckets, where the user's
// table lives, and what dispatch keeps of a table for a device (load_for / load_tables / pick, with a fake
// availability check in place of the backend and sm90::register_variant).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "api/backend.h"
#include "api/tuning.h"
#include "flashcore/flashcore.h"
#include "gpu/gpu_skip.h"
#include "kernels/sm90/variant.h"

namespace {

using namespace flashcore::tuning;

// Sets (value != nullptr) or unsets an environment variable for the scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

// A fresh folder, removed with its contents at the end of the scope.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "flashcore-tuning-XXXXXX").string();
    path_ = mkdtemp(pattern.data()) != nullptr ? pattern : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string write(const std::string& name, const std::string& text) const {
    const std::string file = path_ + "/" + name;
    std::ofstream(file, std::ios::binary) << text;
    return file;
  }

 private:
  std::string path_;
};

DeviceKey h100() {
  DeviceKey k;
  k.gpu_name = "NVIDIA H100 80GB HBM3";
  k.sm_count = 132;
  k.cc = 90;
  k.driver_version = 12080;
  return k;
}

Candidate cand(const std::string& config, double ms, const std::string& cubin = "", const std::string& hash = "") {
  Candidate c;
  c.config = config;
  c.ms = ms;
  c.cubin = cubin;
  c.cubin_hash = hash;
  return c;
}

Entry entry(int64_t seqlen_q, int64_t seqlen_k, std::vector<Candidate> elites, bool causal = false) {
  Entry e;
  e.dtype = FLASHCORE_DTYPE_BF16;
  e.head_dim = 128;
  e.causal = causal;
  e.seqlen_q = seqlen_q;
  e.seqlen_k = seqlen_k;
  e.config = elites.at(0).config;
  e.cubin = elites.at(0).cubin;
  e.cubin_hash = elites.at(0).cubin_hash;
  e.speedup = 1.25;
  e.elites = std::move(elites);
  return e;
}

Table table_of(std::vector<Entry> entries, const DeviceKey& device = h100()) {
  Table t;
  t.device = device;
  t.library_version = flashcore_version_string();
  t.kernels_hash = flashcore::tuning::kernels_hash();
  t.seed = 7;
  t.created = "2025-06-01T12:00:00Z";
  t.entries = std::move(entries);
  return t;
}

// The availability check of a device whose library has `compiled` (those in `dynamic` need a workspace); it
// records every candidate it is asked about as "config|cubin".
struct FakeDevice {
  std::set<std::string> compiled;
  std::set<std::string> dynamic;
  std::vector<std::string> asked;

  Availability check() {
    return [this](const Entry&, const Candidate& c, bool& needs_workspace, std::string& why) {
      asked.push_back(c.config + "|" + c.cubin);
      if (compiled.count(c.config) == 0) {
        why = "not compiled";
        return false;
      }
      needs_workspace = dynamic.count(c.config) != 0;
      return true;
    };
  }
};

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string joined(const std::vector<std::string>& lines) {
  std::string all;
  for (const std::string& l : lines) all += l + "\n";
  return all;
}

// ---- JSON form ----

TEST(TuningJson, RoundTrip) {
  Table t = table_of({entry(4096, 4096, {cand("128x176x2-static", 1.21), cand("128x128x2-pp-static", 1.3)}),
                      entry(512, 1024,
                            {cand("192x112x2-pp-dynamic", 0.125, "/cache/v/a.cubin", "0123456789abcdef"),
                             cand("128x128x2-pp-dynamic", 0.25)},
                            /*causal=*/true)});
  t.entries[1].dtype = FLASHCORE_DTYPE_FP16;
  t.entries[1].head_dim = 64;
  t.seed = 18446744073709551615ull;
  t.device.driver_version = 13000;
  const std::string text = to_json(t);
  EXPECT_TRUE(has(text, "\"format\": \"flashcore-tuning\"")) << text;
  EXPECT_TRUE(has(text, "\"format_version\": 1")) << text;

  Table back;
  std::string error;
  ASSERT_TRUE(from_json(text, back, error)) << error;
  EXPECT_EQ(error, "");
  EXPECT_EQ(back.format_version, 1);
  EXPECT_EQ(back.device.gpu_name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(back.device.sm_count, 132);
  EXPECT_EQ(back.device.cc, 90);
  EXPECT_EQ(back.device.driver_version, 13000);
  EXPECT_EQ(back.library_version, flashcore_version_string());
  EXPECT_EQ(back.seed, 18446744073709551615ull);
  EXPECT_EQ(back.created, "2025-06-01T12:00:00Z");
  ASSERT_EQ(back.entries.size(), 2u);
  const Entry& a = back.entries[0];
  EXPECT_EQ(a.dtype, FLASHCORE_DTYPE_BF16);
  EXPECT_EQ(a.head_dim, 128);
  EXPECT_FALSE(a.causal);
  EXPECT_EQ(a.seqlen_q, 4096);
  EXPECT_EQ(a.seqlen_k, 4096);
  EXPECT_EQ(a.config, "128x176x2-static");
  EXPECT_EQ(a.cubin, "");
  EXPECT_DOUBLE_EQ(a.speedup, 1.25);
  ASSERT_EQ(a.elites.size(), 2u);
  EXPECT_EQ(a.elites[1].config, "128x128x2-pp-static");
  EXPECT_DOUBLE_EQ(a.elites[1].ms, 1.3);
  const Entry& b = back.entries[1];
  EXPECT_EQ(b.dtype, FLASHCORE_DTYPE_FP16);
  EXPECT_EQ(b.head_dim, 64);
  EXPECT_TRUE(b.causal);
  EXPECT_EQ(b.seqlen_q, 512);
  EXPECT_EQ(b.seqlen_k, 1024);
  EXPECT_EQ(b.cubin, "/cache/v/a.cubin");
  EXPECT_EQ(b.cubin_hash, "0123456789abcdef");
  EXPECT_EQ(b.elites[0].cubin, "/cache/v/a.cubin");
  EXPECT_EQ(b.elites[0].cubin_hash, "0123456789abcdef");
  EXPECT_DOUBLE_EQ(b.elites[0].ms, 0.125);
  EXPECT_EQ(b.elites[1].cubin, "");
  EXPECT_EQ(to_json(back), text);  // nothing lost or reordered
}

// 8-bit keys (`flashcore tune --dtype e4m3`): the dtype as dtype_name writes it, read back, and picked for that dtype
// only (an entry serves both O dtypes: the key is the input dtype).
TEST(TuningJson, EightBitEntriesRoundTrip) {
  Table t = table_of({entry(8192, 8192, {cand("128x192x2-pp-static", 0.9), cand("128x128x3-pp-static", 1.0)}),
                      entry(1024, 1024, {cand("192x128x3-static", 0.1)})});
  t.entries[0].dtype = FLASHCORE_DTYPE_FP8_E4M3;
  t.entries[1].dtype = FLASHCORE_DTYPE_FP8_E5M2;
  t.entries[1].head_dim = 64;
  const std::string text = to_json(t);
  EXPECT_TRUE(has(text, "\"dtype\": \"fp8_e4m3\"")) << text;
  EXPECT_TRUE(has(text, "\"dtype\": \"fp8_e5m2\"")) << text;
  Table back;
  std::string error;
  ASSERT_TRUE(from_json(text, back, error)) << error;
  ASSERT_EQ(back.entries.size(), 2u);
  EXPECT_EQ(back.entries[0].dtype, FLASHCORE_DTYPE_FP8_E4M3);
  EXPECT_EQ(back.entries[1].dtype, FLASHCORE_DTYPE_FP8_E5M2);
  EXPECT_EQ(to_json(back), text);

  FakeDevice dev{{"128x192x2-pp-static", "128x128x3-pp-static", "192x128x3-static"}, {}, {}};
  LoadedTable out;
  ASSERT_TRUE(load_for(h100(), text, "x", "", dev.check(), out)) << joined(out.warnings);
  const std::string* chosen = pick(out, FLASHCORE_DTYPE_FP8_E4M3, 128, false, 8192, 8192, true);
  ASSERT_NE(chosen, nullptr);
  EXPECT_EQ(*chosen, "128x192x2-pp-static");
  EXPECT_EQ(pick(out, FLASHCORE_DTYPE_BF16, 128, false, 8192, 8192, true), nullptr);  // not the 16-bit key
  EXPECT_EQ(pick(out, FLASHCORE_DTYPE_FP8_E5M2, 128, false, 8192, 8192, true), nullptr);
  chosen = pick(out, FLASHCORE_DTYPE_FP8_E5M2, 64, false, 1024, 1024, true);
  ASSERT_NE(chosen, nullptr);
  EXPECT_EQ(*chosen, "192x128x3-static");
}

// The header's example, as a person or another tool would write it.
std::string example_text() {
  std::string text = R"({"format": "flashcore-tuning", "format_version": 1,
    "device": {"gpu_name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "cc": 90, "driver_version": 12080},
    "library_version": "@VERSION@", "kernels_hash": "@KERNELS@", "seed": 7, "created": "2025-06-01T12:00:00Z",
    "entries": [{"dtype": "bf16", "head_dim": 128, "causal": false, "seqlen_q": 4096, "seqlen_k": 4096,
                 "config": "128x176x2-static", "speedup": 1.08,
                 "elites": [{"config": "128x176x2-static", "ms": 1.21}, {"config": "128x128x2-pp-static", "ms": 1.3}]},
                {"dtype": "bf16", "head_dim": 128, "causal": true, "seqlen_q": 1024, "seqlen_k": 1024,
                 "config": "128x128x2-pp-dynamic", "speedup": 1.02,
                 "elites": [{"config": "128x128x2-pp-dynamic", "ms": 0.5}]}]})";
  text.replace(text.find("@VERSION@"), 9, flashcore_version_string());
  text.replace(text.find("@KERNELS@"), 9, flashcore::tuning::kernels_hash());
  return text;
}

TEST(TuningJson, ReadsTheDocumentedForm) {
  Table t;
  std::string error;
  ASSERT_TRUE(from_json(example_text(), t, error)) << error;
  ASSERT_EQ(t.entries.size(), 2u);
  EXPECT_EQ(t.seed, 7u);
  EXPECT_DOUBLE_EQ(t.entries[0].speedup, 1.08);
  EXPECT_TRUE(t.entries[1].causal);
  EXPECT_EQ(t.entries[1].seqlen_q, 1024);
  EXPECT_EQ(t.entries[1].elites.size(), 1u);
}

struct Corruption {
  const char* from;
  const char* to;
  const char* error;  // a part of the message
};

TEST(TuningJson, RejectsMalformedTablesNamingTheField) {
  const Corruption cases[] = {
      {R"("format": "flashcore-tuning")", R"("format": "other-table")", "format: \"other-table\" is not"},
      {R"("format": "flashcore-tuning", )", "", "format: missing"},
      {R"("format_version": 1)", R"("format_version": 2)", "format_version: 2 is not supported"},
      {R"("format_version": 1)", R"("format_version": "1")", "format_version: expected an integer, got string"},
      {R"("sm_count": 132)", R"("sm_count": "132")", "device.sm_count: expected an integer, got string"},
      {R"("sm_count": 132)", R"("sm_count": 0)", "device.sm_count: 0 must be positive"},
      {R"("cc": 90, )", "", "device.cc: missing"},
      {R"("driver_version": 12080)", R"("driver_version": 12080.5)", "device.driver_version: expected an integer"},
      {R"("gpu_name": "NVIDIA H100 80GB HBM3")", R"("gpu_name": "")", "device.gpu_name: must not be empty"},
      {R"("seed": 7)", R"("seed": -7)", "seed: -7 must not be negative"},
      {R"("created": "2025-06-01T12:00:00Z")", R"("created": null)", "created: expected a string, got null"},
      {R"("entries": [)", R"("entries": {"x": 1}, "y": [)", "entries: expected an array, got object"},
      {R"("dtype": "bf16", "head_dim": 128, "causal": false)", R"("dtype": "fp32", "head_dim": 128, "causal": false)",
       "entries[0].dtype: \"fp32\" is not fp16, bf16, fp8_e4m3 or fp8_e5m2"},
      {R"("head_dim": 128, "causal": false)", R"("head_dim": 0, "causal": false)",
       "entries[0].head_dim: 0 must be positive"},
      {R"("head_dim": 128, "causal": false)", R"("head_dim": -64, "causal": false)",
       "entries[0].head_dim: -64 must be positive"},
      {R"("head_dim": 128, "causal": false)", R"("head_dim": 128.0, "causal": false)",
       "entries[0].head_dim: expected an integer, got number"},
      {R"("causal": false)", R"("causal": 0)", "entries[0].causal: expected true or false, got number"},
      {R"("causal": true)", R"("causal": "yes")", "entries[1].causal: expected true or false, got string"},
      {R"("seqlen_q": 4096)", R"("seqlen_q": 3000)", "entries[0].seqlen_q: 3000 is not a bucket"},
      {R"("seqlen_k": 1024)", R"("seqlen_k": 0)", "entries[1].seqlen_k: 0 must be positive"},
      {R"("seqlen_k": 4096)", R"("seqlen_k": 2097152)", "entries[0].seqlen_k: 2097152 is out of range"},
      {R"("speedup": 1.08)", R"("speedup": 0)", "entries[0].speedup: 0 must be a positive number"},
      {R"("speedup": 1.02,)", "", "entries[1].speedup: missing"},
      {R"({"config": "128x128x2-pp-static", "ms": 1.3})", R"({"config": "128x128x2-pp-static", "ms": -1})",
       "entries[0].elites[1].ms: -1 must be a positive number"},
      {R"({"config": "128x128x2-pp-static", "ms": 1.3})", R"("128x128x2-pp-static")",
       "entries[0].elites[1]: expected an object, got string"},
      {R"({"config": "128x128x2-pp-dynamic", "ms": 0.5})", "", "entries[1].elites: must hold at least the winner"},
      {R"("elites": [{"config": "128x128x2-pp-dynamic", "ms": 0.5}])", R"("elites": "128x128x2-pp-dynamic")",
       "entries[1].elites: expected an array, got string"},
      {R"({"config": "128x176x2-static", "ms": 1.21}, )", "", "entries[0].elites: the first elite"},
      {R"({"config": "128x176x2-static", "ms": 1.21})",
       R"({"config": "128x176x2-static", "ms": 1.21, "cubin": "/x.cubin", "cubin_hash": "0123456789abcdef"})",
       "entries[0].elites: the first elite"},
      {R"({"config": "128x128x2-pp-static", "ms": 1.3})",
       R"({"config": "128x128x2-pp-static", "ms": 1.3, "cubin": "/x.cubin"})",
       "entries[0].elites[1].cubin_hash: missing"},
      {R"({"config": "128x128x2-pp-static", "ms": 1.3})",
       R"({"config": "128x128x2-pp-static", "ms": 1.3, "cubin_hash": "0123456789abcdef"})",
       "entries[0].elites[1].cubin_hash: given without a cubin"},
      {R"("config": "128x128x2-pp-dynamic", "speedup")", R"("config": 5, "speedup")",
       "entries[1].config: expected a string, got number"},
      {R"("causal": true, "seqlen_q": 1024, "seqlen_k": 1024)",
       R"("causal": false, "seqlen_q": 4096, "seqlen_k": 4096)", "entries[1]: repeats the key"},
  };
  for (const Corruption& c : cases) {
    std::string text = example_text();
    const size_t at = text.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.from;
    text.replace(at, std::string(c.from).size(), c.to);
    Table t;
    t.seed = 99;
    std::string error;
    EXPECT_FALSE(from_json(text, t, error)) << c.to;
    EXPECT_TRUE(has(error, c.error)) << "expected \"" << c.error << "\" in: " << error;
    EXPECT_EQ(t.seed, 99u) << "a rejected table must leave the output alone";
  }
}

TEST(TuningJson, RejectsCorruptAndTruncatedText) {
  const std::string good = example_text();
  Table t;
  std::string error;
  EXPECT_FALSE(from_json(good.substr(0, good.size() / 2), t, error));  // a file cut short
  EXPECT_TRUE(has(error, "parse error")) << error;
  EXPECT_FALSE(from_json("", t, error));
  EXPECT_TRUE(has(error, "parse error")) << error;
  EXPECT_FALSE(from_json("{\"format\": \"flashcore-tuning\",,}", t, error));
  EXPECT_TRUE(has(error, "parse error")) << error;
  EXPECT_FALSE(from_json(std::string("{\"format\": \"flash\0core\"}", 24), t, error));
  EXPECT_FALSE(error.empty());
  EXPECT_FALSE(from_json("[1, 2]", t, error));
  EXPECT_EQ(error, "the table is not a JSON object (got array)");
  EXPECT_FALSE(from_json("{}", t, error));
  EXPECT_EQ(error, "format: missing");
}

// ---- buckets and paths ----

TEST(TuningBuckets, PowersOfTwoCapped) {
  EXPECT_EQ(bucket_of(-5), 1);
  EXPECT_EQ(bucket_of(0), 1);
  EXPECT_EQ(bucket_of(1), 1);
  EXPECT_EQ(bucket_of(2), 2);
  EXPECT_EQ(bucket_of(3), 4);
  EXPECT_EQ(bucket_of(4096), 4096);
  EXPECT_EQ(bucket_of(4097), 8192);
  EXPECT_EQ(bucket_of((int64_t{1} << 20) - 1), int64_t{1} << 20);
  EXPECT_EQ(bucket_of(int64_t{1} << 20), int64_t{1} << 20);
  EXPECT_EQ(bucket_of((int64_t{1} << 20) + 1), int64_t{1} << 20);
  EXPECT_EQ(bucket_of(INT64_MAX), int64_t{1} << 20);
}

TEST(TuningPaths, EnvironmentOrder) {
  ScopedEnv table("FLASHCORE_TUNING_TABLE", nullptr), cache("FLASHCORE_CACHE_DIR", nullptr),
      xdg("XDG_CACHE_HOME", nullptr), home("HOME", "/home/u");
  const DeviceKey k = h100();
  const std::string file = "tuning-nvidia-h100-80gb-hbm3-132sm.json";
  EXPECT_EQ(cache_dir(), "/home/u/.cache/flashcore");
  EXPECT_EQ(table_path(k), "/home/u/.cache/flashcore/" + file);
  {
    ScopedEnv empty_xdg("XDG_CACHE_HOME", "");  // empty: as if unset
    EXPECT_EQ(table_path(k), "/home/u/.cache/flashcore/" + file);
  }
  ScopedEnv xdg_set("XDG_CACHE_HOME", "/xdg/");
  EXPECT_EQ(cache_dir(), "/xdg/flashcore");
  EXPECT_EQ(table_path(k), "/xdg/flashcore/" + file);
  ScopedEnv cache_set("FLASHCORE_CACHE_DIR", "/fc-cache");
  EXPECT_EQ(cache_dir(), "/fc-cache");
  EXPECT_EQ(table_path(k), "/fc-cache/" + file);
  ScopedEnv table_set("FLASHCORE_TUNING_TABLE", "/tables/mine.json");
  EXPECT_EQ(table_path(k), "/tables/mine.json");
  EXPECT_EQ(cache_dir(), "/fc-cache");  // the table's own path does not move the cache

  DeviceKey odd = k;
  odd.gpu_name = "NVIDIA H200 (SXM) NVL";
  odd.sm_count = 144;
  ScopedEnv table_unset("FLASHCORE_TUNING_TABLE", nullptr);
  EXPECT_EQ(table_path(odd), "/fc-cache/tuning-nvidia-h200--sxm--nvl-144sm.json");
}

TEST(TuningPaths, NoHome) {
  ScopedEnv table("FLASHCORE_TUNING_TABLE", nullptr), cache("FLASHCORE_CACHE_DIR", nullptr),
      xdg("XDG_CACHE_HOME", nullptr), home("HOME", nullptr);
  EXPECT_EQ(cache_dir(), "");
  EXPECT_EQ(table_path(h100()), "");
}

// ---- what a device keeps of a table ----

TEST(TuningLoad, KeepsAvailableElitesInOrder) {
  FakeDevice dev{{"128x128x2-pp-static", "128x176x2-static"}, {}, {}};
  const std::string text =
      to_json(table_of({entry(4096, 4096, {cand("64x96x3-static", 1.0), cand("128x176x2-static", 1.1),
                                           cand("128x128x2-pp-static", 1.2)}),
                        entry(1024, 1024, {cand("64x96x3-static", 0.3), cand("128x128x2-pp-static", 0.4)})}));
  LoadedTable out;
  ASSERT_TRUE(load_for(h100(), text, "/t/table.json", "/t", dev.check(), out)) << joined(out.warnings);
  ASSERT_EQ(out.entries.size(), 2u);
  ASSERT_EQ(out.entries[0].choices.size(), 2u);
  EXPECT_EQ(out.entries[0].choices[0].config, "128x176x2-static");
  EXPECT_EQ(out.entries[0].choices[1].config, "128x128x2-pp-static");
  // The uncompiled config: dropped with one warning, though it is in two buckets (and checked once).
  ASSERT_EQ(out.warnings.size(), 1u) << joined(out.warnings);
  EXPECT_EQ(out.warnings[0],
            "tuning table /t/table.json: dropping config \"64x96x3-static\" for bf16 head_dim 128 non-causal: "
            "not compiled");
  EXPECT_EQ(dev.asked.size(), 3u) << "each (key, config, cubin) is checked once";

  const std::string* chosen = pick(out, FLASHCORE_DTYPE_BF16, 128, false, 3000, 4096, false);
  ASSERT_NE(chosen, nullptr);
  EXPECT_EQ(*chosen, "128x176x2-static");
  chosen = pick(out, FLASHCORE_DTYPE_BF16, 128, false, 1000, 513, false);
  ASSERT_NE(chosen, nullptr);
  EXPECT_EQ(*chosen, "128x128x2-pp-static");
  EXPECT_EQ(pick(out, FLASHCORE_DTYPE_BF16, 128, false, 4096, 4097, false), nullptr);  // no bucket (4096, 8192)
  EXPECT_EQ(pick(out, FLASHCORE_DTYPE_BF16, 128, true, 4096, 4096, false), nullptr);   // no causal entry
  EXPECT_EQ(pick(out, FLASHCORE_DTYPE_FP16, 128, false, 4096, 4096, false), nullptr);
  EXPECT_EQ(pick(out, FLASHCORE_DTYPE_BF16, 64, false, 4096, 4096, false), nullptr);
}

TEST(TuningLoad, EntryWithNothingAvailableIsDropped) {
  FakeDevice dev{{"128x128x2-pp-static"}, {}, {}};
  const std::string text = to_json(table_of({entry(2048, 2048, {cand("64x96x3-static", 1.0)}),
                                             entry(4096, 4096, {cand("128x128x2-pp-static", 1.0)})}));
  LoadedTable out;
  ASSERT_TRUE(load_for(h100(), text, "x", "", dev.check(), out));
  ASSERT_EQ(out.entries.size(), 1u);
  EXPECT_EQ(out.entries[0].seqlen_q, 4096);
  EXPECT_EQ(pick(out, FLASHCORE_DTYPE_BF16, 128, false, 2048, 2048, true), nullptr);
}

TEST(TuningLoad, WorkspaceConfigsOnlyWhenAWorkspaceIsGiven) {
  FakeDevice dev{{"128x128x2-pp-dynamic", "128x176x2-onecta"}, {"128x128x2-pp-dynamic"}, {}};
  const std::string text = to_json(table_of(
      {entry(4096, 4096, {cand("128x128x2-pp-dynamic", 1.0), cand("128x176x2-onecta", 1.1)}, /*causal=*/true),
       entry(1024, 1024, {cand("128x128x2-pp-dynamic", 1.0)}, /*causal=*/true)}));
  LoadedTable out;
  ASSERT_TRUE(load_for(h100(), text, "x", "", dev.check(), out));
  EXPECT_TRUE(out.warnings.empty()) << joined(out.warnings);
  ASSERT_EQ(out.entries.size(), 2u);
  EXPECT_TRUE(out.entries[0].choices[0].needs_workspace);
  EXPECT_FALSE(out.entries[0].choices[1].needs_workspace);
  const std::string* with = pick(out, FLASHCORE_DTYPE_BF16, 128, true, 4096, 4096, true);
  const std::string* without = pick(out, FLASHCORE_DTYPE_BF16, 128, true, 4096, 4096, false);
  ASSERT_NE(with, nullptr);
  ASSERT_NE(without, nullptr);
  EXPECT_EQ(*with, "128x128x2-pp-dynamic");
  EXPECT_EQ(*without, "128x176x2-onecta");
  // Only the dynamic one: without a workspace the default runs.
  EXPECT_EQ(pick(out, FLASHCORE_DTYPE_BF16, 128, true, 1024, 1024, false), nullptr);
  ASSERT_NE(pick(out, FLASHCORE_DTYPE_BF16, 128, true, 1024, 1024, true), nullptr);
}

TEST(TuningLoad, CubinMissingOrWithAnotherHashIsDropped) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string cubin = dir.write("v.cubin", "not really a cubin");
  const std::string missing = dir.path() + "/gone.cubin";
  FakeDevice dev{{"192x112x2-pp-static", "160x128x2-pp-static", "128x128x2-pp-static"}, {}, {}};
  const std::string text = to_json(table_of({entry(
      8192, 8192,
      {cand("192x112x2-pp-static", 1.0, missing, "0123456789abcdef"),
       cand("160x128x2-pp-static", 1.1, cubin, "0000000000000000"), cand("128x128x2-pp-static", 1.2)})}));
  LoadedTable out;
  ASSERT_TRUE(load_for(h100(), text, "/t/table.json", dir.path(), dev.check(), out));
  ASSERT_EQ(out.entries.size(), 1u);
  ASSERT_EQ(out.entries[0].choices.size(), 1u);
  EXPECT_EQ(out.entries[0].choices[0].config, "128x128x2-pp-static");
  // The file checks come first: the availability check never saw the two cubins.
  EXPECT_EQ(dev.asked, std::vector<std::string>{"128x128x2-pp-static|"});
  ASSERT_EQ(out.warnings.size(), 2u) << joined(out.warnings);
  EXPECT_EQ(out.warnings[0], "tuning table /t/table.json: dropping config \"192x112x2-pp-static\" for bf16 head_dim "
                             "128 non-causal: its cubin " + missing + " does not exist");
  EXPECT_TRUE(has(out.warnings[1], "dropping config \"160x128x2-pp-static\"")) << out.warnings[1];
  EXPECT_TRUE(has(out.warnings[1], "its cubin " + cubin)) << out.warnings[1];
  if (!flashcore::sm90::file_hash(cubin).empty()) {
    EXPECT_TRUE(has(out.warnings[1], "the table recorded 0000000000000000")) << out.warnings[1];
  }
  const std::string* chosen = pick(out, FLASHCORE_DTYPE_BF16, 128, false, 8192, 8192, false);
  ASSERT_NE(chosen, nullptr);
  EXPECT_EQ(*chosen, "128x128x2-pp-static");
}

TEST(TuningLoad, CubinWithTheRecordedHashIsOfferedByItsPath) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string cubin = dir.write("v.cubin", "cubin bytes");
  const std::string hash = flashcore::sm90::file_hash(cubin);
  if (hash.empty()) GTEST_SKIP() << "sm90::file_hash is not implemented in this build";
  FakeDevice dev{{"192x112x2-pp-static"}, {}, {}};
  // A relative path is taken relative to the table's folder.
  const std::string text = to_json(table_of({entry(8192, 8192, {cand("192x112x2-pp-static", 1.0, "v.cubin", hash)})}));
  LoadedTable out;
  ASSERT_TRUE(load_for(h100(), text, "t", dir.path(), dev.check(), out)) << joined(out.warnings);
  EXPECT_TRUE(out.warnings.empty()) << joined(out.warnings);
  EXPECT_EQ(dev.asked, std::vector<std::string>{"192x112x2-pp-static|" + cubin});
  ASSERT_EQ(out.entries.size(), 1u);
}

TEST(TuningLoad, TableForAnotherDeviceOrLibraryIsIgnored) {
  struct Case {
    const char* what;
    DeviceKey made_on;
    std::string version;
    const char* reason;
  };
  DeviceKey other_gpu = h100(), other_sms = h100(), other_cc = h100(), other_driver = h100(), same_driver = h100();
  other_gpu.gpu_name = "NVIDIA H200";
  other_sms.sm_count = 114;
  other_cc.cc = 100;
  other_driver.driver_version = 13000;
  same_driver.driver_version = 12020;  // 12.2 vs 12.8: the same major version is fine
  const Case cases[] = {
      {"gpu", other_gpu, flashcore_version_string(),
       "it was made on \"NVIDIA H200\" (132 SMs), this device is \"NVIDIA H100 80GB HBM3\" (132 SMs)"},
      {"sms", other_sms, flashcore_version_string(), "made on \"NVIDIA H100 80GB HBM3\" (114 SMs)"},
      {"cc", other_cc, flashcore_version_string(), "made on compute capability 10.0, this device is 9.0"},
      {"library", h100(), "0.0.1", "made by FlashCore 0.0.1, this is "},
      {"driver", other_driver, flashcore_version_string(), "made under CUDA driver 13000, this one is 12080"},
  };
  FakeDevice dev{{"128x176x2-static"}, {}, {}};
  for (const Case& c : cases) {
    Table t = table_of({entry(4096, 4096, {cand("128x176x2-static", 1.0)})}, c.made_on);
    t.library_version = c.version;
    LoadedTable out;
    out.entries.push_back(LoadedEntry{});  // must stay untouched
    EXPECT_FALSE(load_for(h100(), to_json(t), "/t/x.json", "/t", dev.check(), out)) << c.what;
    ASSERT_EQ(out.warnings.size(), 1u) << c.what;
    EXPECT_TRUE(has(out.warnings[0], "ignoring tuning table /t/x.json: ")) << out.warnings[0];
    EXPECT_TRUE(has(out.warnings[0], c.reason)) << out.warnings[0];
    EXPECT_EQ(out.entries.size(), 1u) << c.what;
  }
  EXPECT_TRUE(dev.asked.empty()) << "an ignored table's candidates are not checked";

  // The same version from another build's kernels (or from before kernel hashes) is stale for a user table, not for
  // a built-in one.
  for (const char* other : {"0123456789abcdef", ""}) {
    Table t = table_of({entry(4096, 4096, {cand("128x176x2-static", 1.0)})});
    t.kernels_hash = other;
    LoadedTable out;
    EXPECT_FALSE(load_for(h100(), to_json(t), "/t/x.json", "/t", dev.check(), out)) << other;
    ASSERT_EQ(out.warnings.size(), 1u);
    EXPECT_TRUE(has(out.warnings[0], "made for the kernels of another build")) << out.warnings[0];
    EXPECT_TRUE(has(out.warnings[0], std::string("this library's is \"") + flashcore::tuning::kernels_hash()))
        << out.warnings[0];
    LoadedTable builtin;
    EXPECT_TRUE(load_for(h100(), to_json(t), "builtin", "", dev.check(), builtin, /*check_driver=*/false))
        << joined(builtin.warnings);
  }

  Table t = table_of({entry(4096, 4096, {cand("128x176x2-static", 1.0)})}, same_driver);
  LoadedTable out;
  EXPECT_TRUE(load_for(h100(), to_json(t), "/t/x.json", "/t", dev.check(), out)) << joined(out.warnings);
  EXPECT_EQ(out.entries.size(), 1u);
}

TEST(TuningLoad, MalformedTableIsIgnoredWithTheParserError) {
  FakeDevice dev;
  LoadedTable out;
  EXPECT_FALSE(load_for(h100(), "{\"format\": ", "/t/x.json", "/t", dev.check(), out));
  ASSERT_EQ(out.warnings.size(), 1u);
  EXPECT_TRUE(has(out.warnings[0], "ignoring tuning table /t/x.json: malformed: ")) << out.warnings[0];
  EXPECT_TRUE(has(out.warnings[0], "parse error")) << out.warnings[0];
}

TEST(TuningLoad, UserTableThenBuiltInThenNone) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  FakeDevice dev{{"128x176x2-static", "128x128x2-pp-static"}, {}, {}};
  const std::string user_text = to_json(table_of({entry(4096, 4096, {cand("128x176x2-static", 1.0)})}));
  const std::string builtin_text = to_json(table_of({entry(4096, 4096, {cand("128x128x2-pp-static", 1.0)})}));
  DeviceKey h200 = h100();
  h200.gpu_name = "NVIDIA H200";
  const std::string foreign_text = to_json(table_of({entry(4096, 4096, {cand("128x176x2-static", 1.0)})}, h200));
  const std::string user = dir.write("user.json", user_text);
  const std::string foreign = dir.write("foreign.json", foreign_text);
  const std::string truncated = dir.write("truncated.json", user_text.substr(0, user_text.size() - 10));
  const std::string missing = dir.path() + "/missing.json";

  LoadedTable t = load_tables(h100(), user, false, builtin_text.c_str(), dev.check());
  EXPECT_EQ(t.origin, "user:" + user);
  EXPECT_TRUE(t.warnings.empty()) << joined(t.warnings);
  ASSERT_NE(pick(t, FLASHCORE_DTYPE_BF16, 128, false, 4096, 4096, false), nullptr);
  EXPECT_EQ(*pick(t, FLASHCORE_DTYPE_BF16, 128, false, 4096, 4096, false), "128x176x2-static");

  t = load_tables(h100(), foreign, false, builtin_text.c_str(), dev.check());
  EXPECT_EQ(t.origin, "builtin:NVIDIA H100 80GB HBM3");
  ASSERT_EQ(t.warnings.size(), 1u) << joined(t.warnings);
  EXPECT_TRUE(has(t.warnings[0], "ignoring tuning table " + foreign + ": it was made on \"NVIDIA H200\""))
      << t.warnings[0];
  ASSERT_NE(pick(t, FLASHCORE_DTYPE_BF16, 128, false, 4096, 4096, false), nullptr);
  EXPECT_EQ(*pick(t, FLASHCORE_DTYPE_BF16, 128, false, 4096, 4096, false), "128x128x2-pp-static");

  t = load_tables(h100(), truncated, false, builtin_text.c_str(), dev.check());
  EXPECT_EQ(t.origin, "builtin:NVIDIA H100 80GB HBM3");
  ASSERT_EQ(t.warnings.size(), 1u) << joined(t.warnings);
  EXPECT_TRUE(has(t.warnings[0], "ignoring tuning table " + truncated + ": malformed: ")) << t.warnings[0];

  // The default path missing is the normal case: silent. A path the user named is worth a warning.
  t = load_tables(h100(), missing, false, builtin_text.c_str(), dev.check());
  EXPECT_EQ(t.origin, "builtin:NVIDIA H100 80GB HBM3");
  EXPECT_TRUE(t.warnings.empty()) << joined(t.warnings);
  t = load_tables(h100(), missing, true, nullptr, dev.check());
  EXPECT_EQ(t.origin, "none");
  ASSERT_EQ(t.warnings.size(), 1u);
  EXPECT_EQ(t.warnings[0], "ignoring tuning table " + missing + ": cannot read it: No such file or directory");

  t = load_tables(h100(), dir.path(), false, nullptr, dev.check());  // a folder: unreadable as a file
  EXPECT_EQ(t.origin, "none");
  ASSERT_EQ(t.warnings.size(), 1u);
  EXPECT_TRUE(has(t.warnings[0], "ignoring tuning table " + dir.path() + ": cannot read it: ")) << t.warnings[0];

  t = load_tables(h100(), foreign, false, foreign_text.c_str(), dev.check());  // both for another GPU
  EXPECT_EQ(t.origin, "none");
  ASSERT_EQ(t.warnings.size(), 2u);
  EXPECT_TRUE(has(t.warnings[1], "ignoring tuning table built-in for \"NVIDIA H100 80GB HBM3\" (132 SMs): "))
      << t.warnings[1];
  EXPECT_TRUE(t.entries.empty());
  EXPECT_EQ(pick(t, FLASHCORE_DTYPE_BF16, 128, false, 4096, 4096, true), nullptr);

  t = load_tables(h100(), "", false, nullptr, dev.check());
  EXPECT_EQ(t.origin, "none");
  EXPECT_TRUE(t.warnings.empty());
}

// Every table built into this library parses, is keyed by what it records and is found for that GPU.
TEST(TuningBuiltin, EmbeddedTablesAreValid) {
  int count = -1;
  const BuiltinTable* tables = builtin_tables(count);
  ASSERT_GE(count, 0);
  EXPECT_EQ(tables == nullptr, count == 0);
  for (int i = 0; i < count; ++i) {
    Table t;
    std::string error;
    ASSERT_TRUE(from_json(tables[i].json, t, error)) << tables[i].gpu_name << ": " << error;
    EXPECT_EQ(t.device.gpu_name, tables[i].gpu_name);
    EXPECT_EQ(t.device.sm_count, tables[i].sm_count);
    EXPECT_EQ(t.library_version, flashcore_version_string()) << tables[i].gpu_name << ": made by another version";
    DeviceKey k;
    k.gpu_name = tables[i].gpu_name;
    k.sm_count = tables[i].sm_count;
    EXPECT_EQ(builtin_table_json(k), tables[i].json);
  }
  DeviceKey none = h100();
  none.gpu_name = "No Such GPU";
  EXPECT_EQ(builtin_table_json(none), nullptr);
}

// ---- switched off, and the C ABI's view ----

TEST(TuningDispatch, OffMeansDefaults) {
  ScopedEnv off("FLASHCORE_TUNING", "off");
  EXPECT_EQ(choose(0, 90, FLASHCORE_DTYPE_BF16, 128, false, 4096, 4096, true), nullptr);
  EXPECT_EQ(source_description(0), "off (FLASHCORE_TUNING=off)");
}

TEST(TuningDispatch, SelectedConfigArguments) {
  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  char name[64] = "junk";
  EXPECT_EQ(flashcore_attention_selected_config(&p, nullptr, 64), FLASHCORE_ERROR_NULL_POINTER);
  EXPECT_TRUE(has(flashcore_last_error(), "name is NULL")) << flashcore_last_error();
  EXPECT_EQ(flashcore_attention_selected_config(nullptr, name, sizeof(name)), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(has(flashcore_last_error(), "params is NULL")) << flashcore_last_error();
  EXPECT_STREQ(name, "");
  // Validated like forward: an all-zero struct has no tensors.
  EXPECT_EQ(flashcore_attention_selected_config(&p, name, sizeof(name)), flashcore_attention_forward(&p, nullptr));
  EXPECT_NE(flashcore_attention_selected_config(&p, name, sizeof(name)), FLASHCORE_SUCCESS);
}

TEST(TuningDispatch, SelectedConfigWithoutDevice) {
  if (flashcore::testing::cuda_device_visible()) {
    GTEST_SKIP() << "a CUDA device is visible; this test covers the GPU-less case";
  }
  alignas(16) static uint16_t q[2 * 64 * 128], k[2 * 64 * 128], v[2 * 64 * 128], o[2 * 64 * 128];
  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = o;
  p.batch = 1;
  p.seqlen_q = p.seqlen_k = 64;
  p.num_heads_q = p.num_heads_kv = 2;
  p.head_dim = 128;
  p.dtype = FLASHCORE_DTYPE_BF16;
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS) << flashcore_last_error();
  char name[64];
  EXPECT_EQ(flashcore_attention_selected_config(&p, name, sizeof(name)), FLASHCORE_ERROR_NO_DEVICE);
  EXPECT_STREQ(name, "");
}

// The real dispatch on a Hopper GPU: a user table (FLASHCORE_TUNING_TABLE) steers workspace_size, selected_config
// and forward for calls that name no config; an unknown config in it is dropped with a warning; a table for
// another GPU, FLASHCORE_TUNING=off or a bucket without an entry leave the default.
TEST(TuningDispatch, OnAHopperGpu) {
  FLASHCORE_REQUIRE_BACKEND("sm90");
  int device = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  DeviceKey key;
  ASSERT_TRUE(device_key(device, key));
  const flashcore_dtype dtype = FLASHCORE_DTYPE_BF16;
  int head_dim = 0;
  std::vector<std::string> configs;  // causal configs of the first head dim that has two, the default first
  for (int hd : {64, 128, 256}) {
    const char* names[16];
    const int n = flashcore::backend::kernel_configs(key.cc, dtype, hd, true, names, 16);
    if (n >= 2) {
      head_dim = hd;
      configs.assign(names, names + std::min(n, 16));
      break;
    }
  }
  if (head_dim == 0) GTEST_SKIP() << "no bf16 head dim with two causal configs in this build";
  const std::string def = configs[0], tuned = configs[1];
  bool tuned_needs_workspace = false;
  ASSERT_TRUE(flashcore::backend::config_available(key.cc, dtype, head_dim, true, tuned.c_str(),
                                                   &tuned_needs_workspace));

  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  Table table = table_of({entry(256, 256, {cand("no-such-config", 1.0), cand(tuned, 1.1), cand(def, 1.2)}, true)},
                         key);
  table.entries[0].head_dim = head_dim;
  const std::string path = dir.write("table.json", to_json(table));
  ScopedEnv table_env("FLASHCORE_TUNING_TABLE", path.c_str()), on("FLASHCORE_TUNING", nullptr);
  reset();

  const int64_t s = 200, heads = 2, elems = s * heads * head_dim;
  void* buf = nullptr;
  void* workspace = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, 4 * elems * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&workspace, 256), cudaSuccess);
  ASSERT_EQ(cudaMemset(buf, 0, 4 * elems * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(workspace, 0, 256), cudaSuccess);
  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.q = buf;
  p.k = static_cast<char*>(buf) + elems * 2;
  p.v = static_cast<char*>(buf) + 2 * elems * 2;
  p.o = static_cast<char*>(buf) + 3 * elems * 2;
  p.batch = 1;
  p.seqlen_q = p.seqlen_k = s;  // bucket 256
  p.num_heads_q = p.num_heads_kv = heads;
  p.head_dim = head_dim;
  p.dtype = dtype;
  p.causal = 1;
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS) << flashcore_last_error();
  auto selected = [&p] {
    char name[64] = "unset";
    const flashcore_status st = flashcore_attention_selected_config(&p, name, sizeof(name));
    return st == FLASHCORE_SUCCESS ? std::string(name) : "error: " + std::string(flashcore_last_error());
  };

  EXPECT_EQ(selected(), tuned_needs_workspace ? def : tuned);  // no workspace given
  uint64_t bytes = 1;
  ASSERT_EQ(flashcore_attention_workspace_size(&p, &bytes), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_EQ(bytes > 0, tuned_needs_workspace) << "workspace_size reports the tuned config's needs";
  p.workspace = workspace;
  p.workspace_size = 256;
  EXPECT_EQ(selected(), tuned);
  EXPECT_EQ(flashcore_attention_forward(&p, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::string source = source_description(device);
  EXPECT_TRUE(has(source, "user:" + path)) << source;
  EXPECT_TRUE(has(source, "dropping config \"no-such-config\"")) << source;
  char small[4];
  EXPECT_EQ(flashcore_attention_selected_config(&p, small, sizeof(small)), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(has(flashcore_last_error(), "too small")) << flashcore_last_error();

  p.seqlen_q = p.seqlen_k = 100;  // bucket (128, 128): no entry
  EXPECT_EQ(selected(), def);
  p.seqlen_q = p.seqlen_k = s;
  p.kernel_config = def.c_str();  // a named config is never overridden
  EXPECT_EQ(selected(), def);
  p.kernel_config = nullptr;
  {
    ScopedEnv off("FLASHCORE_TUNING", "off");
    EXPECT_EQ(selected(), def);
  }
  EXPECT_EQ(selected(), tuned);

  DeviceKey other = key;
  other.gpu_name += " (another)";
  dir.write("table.json", to_json(table_of(table.entries, other)));
  reset();
  EXPECT_EQ(selected(), def);
  EXPECT_TRUE(has(source_description(device), "ignoring tuning table " + path + ": it was made on"))
      << source_description(device);

  reset();
  cudaFree(buf);
  cudaFree(workspace);
}

}  // namespace
