// The shard file: a small binary header (magic, format version, dtype, logical shape, slice,
// tensor name, payload size and XXH3 checksum, header checksum) followed by the payload bytes.
// parse_shard_header() is strict: it bounds every size before allocating and throws RestoreError
// (bad_header) on anything malformed. Byte layout: see checkpoint/README.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/layout.hpp"
#include "comm/dtype.hpp"

namespace shardcheck::checkpoint {

inline constexpr std::uint32_t kFormatVersion = 1;
inline constexpr std::size_t kHeaderFixedBytes = 40;  // magic .. payload checksum
inline constexpr std::size_t kMaxNameBytes = 4096;
inline constexpr std::size_t kMaxHeaderBytes = 8192;  // bound for any header this format allows

struct ShardHeader {
  std::string tensor;
  comm::DType dtype = comm::DType::f32;
  Shape shape;
  Slice slice;
  std::uint64_t payload_bytes = 0;
  std::uint64_t payload_xxh3 = 0;
  std::uint32_t header_bytes = 0;  // set by parse/encode: offset of the payload in the file
};

// XXH3-64 of the bytes (xxHash's one-shot and streaming forms give the same value).
std::uint64_t xxh3(std::span<const std::byte> bytes);
std::string hex64(std::uint64_t v);
// Parses exactly 16 lowercase hex digits; false otherwise.
bool parse_hex64(const std::string& s, std::uint64_t& out);

// Incremental XXH3-64 for files read in chunks.
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void update(std::span<const std::byte> bytes);
  std::uint64_t digest() const;

 private:
  void* state_;
};

// Header bytes for h (h.header_bytes is ignored; the result's size is the header size).
std::vector<std::byte> encode_shard_header(const ShardHeader& h);
// Header size announced by the fixed part (first kHeaderFixedBytes bytes), after checking magic,
// version and field bounds; throws RestoreError(bad_header / version_mismatch).
std::uint32_t shard_header_size(std::span<const std::byte> fixed);
// Parses the header at the start of `bytes` (which may continue with payload). Throws
// RestoreError(bad_header / version_mismatch) naming `file` on any violation.
ShardHeader parse_shard_header(std::span<const std::byte> bytes, const std::string& file = {});

// Stable on-disk dtype codes (independent of comm::DType's enumerator values).
std::uint8_t dtype_code(comm::DType t);

// "param_embed.weight.1a2b3c4d.f0+128.r3.shard": the sanitised tensor name ([A-Za-z0-9._-], at
// most 96 characters), 8 hex digits of the name's hash (keeps names that sanitise alike apart), the
// slice, the writing rank (two ranks saving the same slice collide in the layout check, which names
// both, not in the file system).
std::string shard_file_name(const std::string& tensor, const Slice& slice, int rank = 0);
// The file names a manifest may use: one path component of [A-Za-z0-9._+-], not starting with '.',
// at most 255 bytes.
bool is_safe_file_name(const std::string& name);

}  // namespace shardcheck::checkpoint
