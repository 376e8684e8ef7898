// The sm90 config grammar, in one place (host only): a tile config's name ("128x128x2-pp-static-vote") and its
// TileShape, the columns of configs*.txt, and the text of the translation unit that instantiates a kernel. The build
// generates its kernel units with it (gen_rows.cpp, run by sources.cmake at configure time) and runtime
// variants are named, parsed and built with it (variant.cpp), so the two cannot drift apart.
#pragma once
#include <string>
#include <vector>

#include "kernels/sm90/tile_shape.h"

namespace flashcore::sm90 {

// Schedule's enumerators, in order, and their names in configs.txt and config names.
inline constexpr const char* kScheduleNames[] = {"onecta", "static", "dynamic", "split"};
inline constexpr const char* kScheduleEnumerators[] = {"kOneTilePerCta", "kStaticPersistent", "kDynamicPersistent",
                                                       "kSplitKv"};
inline constexpr int kSchedules = 4;

// "<block_m>x<block_n>x<stages>[-pp]-<schedule>[-vote][-packed][-var]".
inline std::string config_name(const TileShape& shape) {
  const int sched = static_cast<int>(shape.schedule);
  return std::to_string(shape.block_m) + "x" + std::to_string(shape.block_n) + "x" + std::to_string(shape.stages) +
         (shape.pingpong ? "-pp" : "") + "-" + (sched >= 0 && sched < kSchedules ? kScheduleNames[sched] : "?") +
         (shape.rescale_vote ? "-vote" : "") + (shape.packed ? "-packed" : "") + (shape.variants ? "-var" : "");
}

namespace grammar_detail {
// A decimal number of 1 to 3 digits at `pos`.
inline bool read_number(const std::string& s, size_t& pos, int& value) {
  size_t digits = 0;
  for (value = 0; pos < s.size() && digits < 4 && s[pos] >= '0' && s[pos] <= '9'; ++digits) {
    value = value * 10 + (s[pos++] - '0');
  }
  return digits >= 1 && digits <= 3;
}
}  // namespace grammar_detail

// The inverse of config_name; false on a malformed or non-canonical name (no sign, no leading zeros).
inline bool parse_config_name(const std::string& name, TileShape& shape) {
  using grammar_detail::read_number;
  TileShape t{};
  size_t pos = 0;
  if (!read_number(name, pos, t.block_m) || name.compare(pos++, 1, "x") != 0 || !read_number(name, pos, t.block_n) ||
      name.compare(pos++, 1, "x") != 0 || !read_number(name, pos, t.stages)) {
    return false;
  }
  std::string tail = name.substr(pos);
  t.pingpong = tail.rfind("-pp-", 0) == 0;
  if (t.pingpong) tail.erase(0, 3);
  t.variants = tail.size() > 4 && tail.compare(tail.size() - 4, 4, "-var") == 0;
  if (t.variants) tail.erase(tail.size() - 4);
  t.packed = tail.size() > 7 && tail.compare(tail.size() - 7, 7, "-packed") == 0;
  if (t.packed) tail.erase(tail.size() - 7);
  t.rescale_vote = tail.size() > 5 && tail.compare(tail.size() - 5, 5, "-vote") == 0;
  if (t.rescale_vote) tail.erase(tail.size() - 5);
  int sched = 0;
  while (sched < kSchedules && tail != std::string("-") + kScheduleNames[sched]) ++sched;
  if (sched == kSchedules) return false;
  t.schedule = static_cast<Schedule>(sched);
  if (config_name(t) != name) return false;
  shape = t;
  return true;
}

// One data row of configs*.txt: "head_dim causal block_m block_n stages pingpong schedule rescale choice" (the
// columns are described in configs.txt). The choice column's "packed-only" makes the row's packed flavour.
struct ConfigRow {
  int head_dim = 0;
  int head_dim_v = 0;  // V's and O's head dim: the head_dim column's "<qk>/<v>" form (e.g. 192/128), else head_dim
  bool causal = false;
  TileShape shape{};
  std::string choice;    // default, default(seqlen_k<=N), packed, packed-only, dispatch, plain or -
  std::string row_part;  // the symbol's tail: "<bm>x<bn>x<st>_<pp|np>_<schedule>_<always|vote>[_packed]"
};

// Parses `line`; false with `error` set on a malformed row.
inline bool parse_config_row(const std::string& line, ConfigRow& row, std::string& error) {
  std::vector<std::string> f;
  for (size_t i = 0; i < line.size();) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t') ++j;
    if (j > i) f.push_back(line.substr(i, j - i));
    i = j;
  }
  auto fail = [&](const std::string& why) {
    error = why + " in '" + line + "'";
    return false;
  };
  if (f.size() != 9) return fail("expected 9 fields");
  int sched = 0;
  while (sched < kSchedules && f[6] != kScheduleNames[sched]) ++sched;
  if (sched == kSchedules) return fail("unknown schedule '" + f[6] + "'");
  if (f[5] != "pp" && f[5] != "-") return fail("pingpong must be pp or -");
  if (f[7] != "always" && f[7] != "vote") return fail("rescale must be always or vote");
  size_t used = 0;
  ConfigRow r;
  try {
    r.head_dim = std::stoi(f[0], &used);
    r.head_dim_v = r.head_dim;
    if (used < f[0].size() && f[0][used] == '/') {  // "<head_dim>/<head_dim_v>"
      size_t used_v = 0;
      r.head_dim_v = std::stoi(f[0].substr(used + 1), &used_v);
      used += 1 + used_v;
    }
    if (used != f[0].size()) return fail("head_dim must be <n> or <n>/<n_v>");
    r.shape.block_m = std::stoi(f[2]);
    r.shape.block_n = std::stoi(f[3]);
    r.shape.stages = std::stoi(f[4]);
  } catch (...) {
    return fail("a size is not a number");
  }
  if (f[1] != "0" && f[1] != "1") return fail("causal must be 0 or 1");
  r.causal = f[1] == "1";
  r.shape.pingpong = f[5] == "pp";
  r.shape.schedule = static_cast<Schedule>(sched);
  r.shape.rescale_vote = f[7] == "vote";
  r.choice = f[8];
  const std::string& c = r.choice;
  const bool conditional = c.rfind("default(seqlen_k<=", 0) == 0 && c.back() == ')';
  if (c != "default" && !conditional && c != "packed" && c != "packed-only" && c != "dispatch" && c != "plain" &&
      c != "variants" && c != "-") {
    return fail("choice must be default, default(seqlen_k<=N), packed, packed-only, dispatch, plain, variants or -");
  }
  if (c == "variants" && r.shape.schedule == Schedule::kSplitKv) {
    return fail("a variants row is one-CTA, static or dynamic (a dynamic one serves the dense calls that give a "
                "workspace; a one-CTA or static row of its key the others)");
  }
  if ((c == "packed" || c == "packed-only") && r.shape.schedule == Schedule::kSplitKv) {
    return fail("a packed (varlen) choice cannot be a split row");
  }
  if (c == "packed-only" && r.shape.schedule != Schedule::kDynamicPersistent) {
    return fail("only a dynamic row has a packed flavour");
  }
  if (c == "dispatch" && r.shape.schedule != Schedule::kSplitKv && r.shape.schedule != Schedule::kStaticPersistent) {
    return fail("only split and static rows are picked by a dispatch rule");
  }
  if (c == "plain" && r.shape.rescale_vote) return fail("a plain row is a vote default's tile without the vote");
  r.shape.packed = c == "packed-only";
  r.shape.variants = c == "variants";
  r.row_part = f[2] + "x" + f[3] + "x" + f[4] + "_" + (r.shape.pingpong ? "pp" : "np") + "_" + f[6] + "_" + f[7] +
               (r.shape.packed ? "_packed" : "") + (r.shape.variants ? "_var" : "");
  row = r;
  return true;
}

// The key count of a "default(seqlen_k<=N)" choice (0 for others).
inline long long choice_max_seqlen_k(const std::string& choice) {
  const std::string prefix = "default(seqlen_k<=";
  return choice.rfind(prefix, 0) == 0 ? std::stoll(choice.substr(prefix.size())) : 0;
}

// What a kernel's translation unit instantiates: the row struct `symbol` (Element, OutElement, head dim, mask,
// shape), and `tail`, the line after the namespace: the compiled row's FLASHCORE_SM90_DEFINE_ROW (kernel.cuh), or for
// a runtime variant an explicit instantiation of the kernel.
struct UnitSpec {
  std::string symbol;
  std::string element, out_element;  // C++ element types, e.g. "__nv_bfloat16"
  std::string kv_element;            // K/V's where they differ (an e4m3 KV cache's rows), else empty
  int head_dim = 0;
  int head_dim_v = 0;  // 0: head_dim
  bool causal = false;
  TileShape shape{};
};

inline std::string unit_source(const UnitSpec& u, const std::string& generator, const std::string& tail) {
  const TileShape& s = u.shape;
  auto b = [](bool v) { return v ? "true" : "false"; };
  return "// Generated by " + generator + ": do not edit.\n" +
         "#include \"kernels/sm90/kernel.cuh\"\n"
         "namespace flashcore::sm90 {\n"
         "struct " + u.symbol + " {\n" +
         "  using Element = " + u.element + ";\n" +
         "  using OutElement = " + u.out_element + ";\n" +
         (u.kv_element.empty() ? std::string() : "  using KVElement = " + u.kv_element + ";\n") +
         "  static constexpr int kHeadDim = " + std::to_string(u.head_dim) + ";\n" +
         "  static constexpr int kHeadDimV = " + std::to_string(u.head_dim_v != 0 ? u.head_dim_v : u.head_dim) + ";\n" +
         "  static constexpr bool kCausal = " + b(u.causal) + ";\n" +
         "  static constexpr TileShape kShape = {" + std::to_string(s.block_m) + ", " + std::to_string(s.block_n) +
         ", " + std::to_string(s.stages) + ", " + b(s.pingpong) + ", Schedule::" +
         kScheduleEnumerators[static_cast<int>(s.schedule)] + ", " + b(s.rescale_vote) + ", " + b(s.packed) + ", " +
         b(s.variants) + "};\n" +
         "};\n" + tail;
}

// The explicit instantiation a runtime variant's unit ends with (inside namespace flashcore::sm90).
inline std::string variant_unit_tail(const std::string& symbol) {
  return "template __global__ void flashcore_fwd_sm90_kernel<KernelConfig<" + symbol +
         ">>(const __grid_constant__ FwdParams);\n}  // namespace flashcore::sm90\n";
}

}  // namespace flashcore::sm90
