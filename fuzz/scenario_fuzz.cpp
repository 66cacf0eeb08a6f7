// libFuzzer entry point for the scenario loader (body in fuzz/scenario_target.hpp).
#include "fuzz/scenario_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  shardcheck::fuzz::scenario_one(data, size);
  return 0;
}
