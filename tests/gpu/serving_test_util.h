// Helpers shared by the serving GPU tests (test_varlen.cpp, test_paged_kv.cpp, test_kv_cache.cpp): case seeds that
// FLASHCORE_SEED can move, a one-line report of a check::Result, and the kernel configs compiled for a key.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "check/check.h"
#include "flashcore/flashcore.h"

namespace flashcore::test {

// FNV-1a of the case name from `basis` (each file keeps its own), xor FLASHCORE_SEED when set.
inline uint64_t case_seed(const std::string& name, uint64_t basis) {
  uint64_t h = basis;
  if (const char* env = std::getenv("FLASHCORE_SEED"); env && *env) h ^= std::strtoull(env, nullptr, 0);
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

inline std::string report(const check::Case& c, const check::Result& r) {
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "%s [seed %llu]: O err %.3g (tol %.3g, lowp %.3g), LSE err %.3g (tol %.3g), rows checked %lld",
                check::describe(c).c_str(), static_cast<unsigned long long>(r.seed), r.o_err, r.o_tol, r.lowp_o_err,
                r.lse_err, r.lse_tol, static_cast<long long>(r.rows_checked));
  return buf;
}

inline const char* dtype_text(flashcore_dtype dt) { return dt == FLASHCORE_DTYPE_FP16 ? "fp16" : "bf16"; }

inline int32_t max_of(const std::vector<int32_t>& v) {
  int32_t m = 0;
  for (int32_t x : v) m = x > m ? x : m;
  return m;
}

// The configs flashcore_list_kernel_configs names for (dtype, head_dim, causal) on this device (at most 64).
inline flashcore_status kernel_configs(flashcore_dtype dt, int hd, bool causal, std::vector<std::string>& out) {
  const char* names[64];
  int32_t count = 0;
  const flashcore_status st = flashcore_list_kernel_configs(dt, hd, causal ? 1 : 0, names, 64, &count);
  out.assign(names, names + (st == FLASHCORE_SUCCESS ? (count < 64 ? count : 64) : 0));
  return st;
}

// A config sweep over packed or paged layouts: a broken variant that test_variants.cpp registers is no config to
// sweep, and a dynamic-schedule config must refuse a paged call, and a packed one unless it has three consumer
// warpgroups (192-row tiles) or is a row's packed flavour (name suffix "-packed"; sm90/smem_plan.h takes_packed),
// with a message that says why. True when `config` is either (the caller skips it).
inline bool not_a_serving_config(const std::string& config) { return config.find("faulty") != std::string::npos; }
// Rows without a serving layout's path (sm90 smem_plan.h takes_packed / takes_paged), which refuse such calls with a
// clear error (checked here): the dynamic rows (no paged path; a packed one only as a 192-row row or a packed flavour)
// and the prefill split-KV rows ("-split" with more than 64 query rows: dense calls only).
inline bool prefill_split_config(const std::string& config) {
  const size_t x = config.find('x');
  return config.size() > 6 && config.compare(config.size() - 6, 6, "-split") == 0 && x != std::string::npos &&
         std::stoi(config.substr(0, x)) > 64;
}
inline bool refused_for_layout(const std::string& config, const check::Result& r, bool paged) {
  const bool split = prefill_split_config(config);
  if (!split && config.find("dynamic") == std::string::npos) return false;
  const bool packed_flavour = config.size() > 7 && config.compare(config.size() - 7, 7, "-packed") == 0;
  if (!split && !paged && (config.rfind("192x", 0) == 0 || packed_flavour)) return false;  // must run the packed call
  EXPECT_FALSE(r.passed) << config;
  const char* why = paged ? "has no paged path" : "has no packed (varlen) path";
  EXPECT_NE(r.message.find(why), std::string::npos) << config << ": " << r.message;
  return true;
}

}  // namespace flashcore::test
