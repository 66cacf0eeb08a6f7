// The bodies of the fuzz targets, shared by the libFuzzer entry points (fuzz/*_fuzz.cpp) and the
// corpus replay unit test. Contract: any input either parses or throws RestoreError; anything else
// (a crash, another exception, a sanitizer report, unbounded allocation) is a bug.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "checkpoint/errors.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/shard_file.hpp"

namespace shardcheck::fuzz {

// Returns true when the input parsed.
inline bool manifest_one(const std::uint8_t* data, std::size_t size) {
  try {
    const auto m =
        checkpoint::parse_manifest(std::string_view(reinterpret_cast<const char*>(data), size));
    // A parsed manifest must print and parse back to the same layout.
    const auto again = checkpoint::parse_manifest(checkpoint::dump_manifest(m));
    if (again.tensors.size() != m.tensors.size()) __builtin_trap();
    return true;
  } catch (const checkpoint::RestoreError&) {
    return false;
  }
}

inline bool shard_header_one(const std::uint8_t* data, std::size_t size) {
  try {
    const auto bytes = std::as_bytes(std::span(data, size));
    const auto h = checkpoint::parse_shard_header(bytes, "fuzz");
    // A parsed header must encode back to the same bytes.
    const auto again = checkpoint::encode_shard_header(h);
    // (Fuzz builds accept any header checksum, so the trailing 8 bytes may differ there.)
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
    const std::size_t compared = again.size() - 8;
#else
    const std::size_t compared = again.size();
#endif
    if (again.size() != h.header_bytes ||
        !std::equal(again.begin(), again.begin() + static_cast<std::ptrdiff_t>(compared),
                    bytes.begin()))
      __builtin_trap();
    return true;
  } catch (const checkpoint::RestoreError&) {
    return false;
  }
}

}  // namespace shardcheck::fuzz
