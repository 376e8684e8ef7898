// Runtime kernel variants (variant.h). STUB: being implemented.
#include "kernels/sm90/variant.h"

namespace flashcore::sm90 {

std::string config_name(const TileShape&) { return ""; }
bool parse_config_name(const std::string&, TileShape&) { return false; }
Footprint footprint(const VariantSpec&) { return {}; }
bool feasible(const VariantSpec&, std::string& why) {
  why = "not implemented";
  return false;
}
std::string kernel_source_dir() { return ""; }
flashcore_status build_variant(const VariantSpec&, const std::string&, std::string&, std::string& error) {
  error = "not implemented";
  return FLASHCORE_ERROR_INTERNAL;
}
flashcore_status register_variant(const VariantSpec&, const std::string&, const KernelRow**, std::string& error) {
  error = "not implemented";
  return FLASHCORE_ERROR_INTERNAL;
}
flashcore_status register_faulty_variant_for_testing(const VariantSpec&, const std::string&, const std::string&,
                                                     std::string& error) {
  error = "not implemented";
  return FLASHCORE_ERROR_INTERNAL;
}
std::string file_hash(const std::string&) { return ""; }

}  // namespace flashcore::sm90
