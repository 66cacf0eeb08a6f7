// Typed errors of the checkpoint protocol. A caller acts on `reason()` and names `file()` /
// `tensor()` in its report; a drill checks that the right reason and shard were named.
// Broken invariants inside this module use SC_CHECK (comm/errors.hpp) instead.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace shardcheck::checkpoint {

// Why a save was refused or a checkpoint fails validation. Stable names (name_of) appear in
// messages and reports; never renumber, only append.
enum class Reason : std::uint8_t {
  io_error,             // the file system refused (permissions, disk full, ...)
  no_checkpoint,        // the directory holds no committed step-N
  already_committed,    // save: step-N exists and is committed
  missing_marker,       // step dir without SUCCESS
  bad_marker,           // SUCCESS unreadable, or its step / manifest checksum disagree
  missing_manifest,     // SUCCESS present but manifest.json missing
  bad_manifest,         // manifest.json not valid JSON or not the schema
  version_mismatch,     // a format version this reader does not know
  unsafe_path,          // a manifest path with '..', '/', an absolute path, or a symlink
  bad_tensor,           // tensor metadata invalid or inconsistent (dtype, shape, byte size)
  duplicate_shard,      // two shards with the same file name
  overlapping_shards,   // an element covered twice
  incomplete_coverage,  // an element covered by no shard, or an expected tensor missing
  out_of_bounds,        // a slice outside its tensor's logical shape
  unexpected_tensor,    // save: a tensor not in the expected layout
  missing_shard,        // a shard file the manifest names is absent
  truncated_shard,      // a shard file shorter than its header and payload
  oversized_shard,      // a shard file longer than its header and payload
  bad_header,           // the shard header is malformed (magic, sizes, header checksum)
  header_mismatch,      // the header disagrees with the manifest (tensor, dtype, shape, slice)
  checksum_mismatch,    // payload bytes differ from the checksum in its own header: corruption
  stale_shard,          // payload matches its header but not the manifest: a replaced shard
  rank_failed,          // save: a rank could not write its shards
  bad_request,          // a read of an unknown tensor or a region outside it
  locked,               // save: another run holds the checkpoint directory (DirLock)
  changed_during_save,  // save: step-N.tmp/ no longer holds exactly what the ranks wrote
};

std::string_view name_of(Reason r);

// Base of both directions. what() = "<reason>: <file or tensor>: <detail>", control characters
// escaped (comm/text.hpp); the accessors return the names unescaped.
class CheckpointError : public std::runtime_error {
 public:
  CheckpointError(Reason reason, std::string detail, std::string file = {},
                  std::string tensor = {});
  Reason reason() const { return reason_; }
  const std::string& file() const { return file_; }      // shard or metadata file, "" if none
  const std::string& tensor() const { return tensor_; }  // tensor name, "" if none
  const std::string& detail() const { return detail_; }

 private:
  Reason reason_;
  std::string detail_, file_, tensor_;
};

// save() refused to commit: every rank throws the same SaveError (the coordinator's verdict).
class SaveError : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

// A checkpoint failed validation or a read was impossible. previous_good(): set by open_latest()
// when the newest committed checkpoint is bad, naming the newest older one that validates ("" if
// none does), so a caller can offer it instead of silently skipping.
class RestoreError : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
  RestoreError(const CheckpointError& e, std::string previous_good);
  const std::string& previous_good() const { return previous_good_; }

 private:
  std::string previous_good_;
};

}  // namespace shardcheck::checkpoint
