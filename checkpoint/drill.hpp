// Fault drills at the library level: each function damages a committed checkpoint the way a real
// failure would and says which shard it hit and which RestoreError reason a correct reader must
// raise. crash_before_commit() instead makes one rank die inside save() after writing its shards.
// For tests and the harness's `drill checkpoint`; never called on a run's real checkpoints.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "checkpoint/errors.hpp"
#include "checkpoint/writer.hpp"

namespace shardcheck::checkpoint::drill {

// What a drill did, and what restore must answer.
struct Damage {
  std::string file;    // shard file name inside the step directory ("SUCCESS" for the marker)
  std::string tensor;  // "" for the marker
  Reason expect;       // the reason a fail-closed reader raises
  std::string what;    // one line for reports
};

// The shard a drill hits: the `shard_index`-th in manifest order (tensors by name, then shards),
// modulo the number of shards. Throws RestoreError if the checkpoint has no shards.
Damage remove_shard(const std::filesystem::path& step_dir, std::size_t shard_index = 0);
// Flips every bit of one payload byte (offset `byte` modulo the payload size).
Damage flip_payload_byte(const std::filesystem::path& step_dir, std::size_t shard_index = 0,
                         std::uint64_t byte = 0);
// Cuts the file in the middle of its payload.
Damage truncate_shard(const std::filesystem::path& step_dir, std::size_t shard_index = 0);
// Replaces the shard by a self-consistent one (valid header, checksum matching its own payload)
// holding different values: what a stale or mixed-up file from another save looks like.
Damage replace_with_stale_shard(const std::filesystem::path& step_dir, std::size_t shard_index = 0);
// Deletes SUCCESS: the directory is no longer a committed checkpoint.
Damage remove_marker(const std::filesystem::path& step_dir);

// Thrown on the dying rank by crash_before_commit's hook.
class SimulatedCrash : public std::runtime_error {
 public:
  explicit SimulatedCrash(int rank)
      : std::runtime_error("simulated crash of rank " + std::to_string(rank) +
                           " after writing its shards, before commit") {}
};

// `base` with a hook that makes `rank` throw SimulatedCrash once its shards are written: save()
// then never commits and step-N.tmp/ stays behind. Under sim::SimWorld the other ranks fail with a
// PeerError and SimWorld::run throws RankFailure naming `rank`.
SaveOptions crash_before_commit(SaveOptions base, int rank);

}  // namespace shardcheck::checkpoint::drill
