// Opening a committed checkpoint, fail closed: the marker, the manifest (schema, version, paths,
// layout) and every shard (present, a regular file, header consistent with the manifest, exact
// size, checksum) are validated before any tensor is returned. Reads then reshard: any region (flat
// range or box) of any tensor is assembled from whichever shards cover it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "checkpoint/layout.hpp"
#include "checkpoint/manifest.hpp"
#include "comm/communicator.hpp"

namespace shardcheck::checkpoint {

struct OpenOptions {
  // Hash every payload at open. Off only when a caller has verified them itself (open_collective
  // splits the hashing across ranks).
  bool verify_checksums = true;
};

// A step-N directory (never step-N.tmp); committed when it holds a SUCCESS file.
struct StepDir {
  std::uint64_t step = 0;
  std::filesystem::path path;
  bool committed = false;
};
std::vector<StepDir> list_steps(const std::filesystem::path& dir);  // ascending by step
// N for "step-N" (digits only, no leading zeros, fits 64 bits); nullopt otherwise.
std::optional<std::uint64_t> parse_step_dir_name(const std::string& name);
// The newest committed step-N in dir, not validated; nullopt when there is none.
std::optional<std::filesystem::path> latest_committed(const std::filesystem::path& dir);
// The shard file dir/s.file matches its record: a regular file whose header names t's tensor,
// dtype and shape, s's slice, payload size and checksum, and whose size is header + payload.
// Returns the header size. Throws RestoreError (missing_shard, unsafe_path, truncated_shard,
// oversized_shard, bad_header, header_mismatch, stale_shard); the payload is not hashed. Open
// checks every shard with it, and the writer its own files before it commits.
std::uint32_t check_shard_file(const std::filesystem::path& dir, const TensorRecord& t,
                               const ShardRecord& s);

class Checkpoint {
 public:
  // Validates step_dir completely; throws RestoreError naming the reason, shard and tensor.
  static Checkpoint open(const std::filesystem::path& step_dir, const OpenOptions& o = {});
  // Collective: every rank validates the structure and hashes 1/size of the shards; all ranks
  // then agree, so either every rank returns the checkpoint or every rank throws RestoreError
  // (the failure with the lowest shard index, naming it).
  static Checkpoint open_collective(comm::Communicator& world,
                                    const std::filesystem::path& step_dir);

  const Manifest& manifest() const { return manifest_; }
  const std::filesystem::path& path() const { return dir_; }
  // Throws RestoreError(bad_request) for an unknown name.
  const TensorRecord& tensor(std::string_view name) const;

  // Fills `out` with the region's elements in the region's own C order (for a flat range: the
  // logical order; for a box: the box's row-major order). out.size() must be the region's bytes.
  // Shards read whole are re-hashed against the manifest (a file changed after open is caught).
  void read(std::string_view tensor, const Slice& region, std::span<std::byte> out) const;
  std::vector<std::byte> read(std::string_view tensor, const Slice& region) const;
  // The reader callback the engine imports through: (tensor, begin, count) -> bytes.
  std::vector<std::byte> read_flat(std::string_view tensor, std::uint64_t begin,
                                   std::uint64_t count) const {
    return read(tensor, FlatRange{begin, count});
  }

 private:
  Checkpoint() = default;
  const TensorRecord& find(std::string_view name) const;
  void verify_shard(std::size_t tensor, std::size_t shard) const;

  std::filesystem::path dir_;
  Manifest manifest_;
  std::vector<std::vector<std::uint32_t>> header_bytes_;  // per tensor, per shard
};

// Opens the newest committed checkpoint in dir. Throws RestoreError(no_checkpoint) when there is
// none; when the newest fails validation, throws its error with previous_good() naming the newest
// older checkpoint that validates: a bad checkpoint is never skipped silently.
Checkpoint open_latest(const std::filesystem::path& dir, const OpenOptions& o = {});

}  // namespace shardcheck::checkpoint
