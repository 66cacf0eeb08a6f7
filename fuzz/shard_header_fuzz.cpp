// libFuzzer entry point for the shard header parser (body in fuzz/targets.hpp).
#include "fuzz/targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  shardcheck::fuzz::shard_header_one(data, size);
  return 0;
}
