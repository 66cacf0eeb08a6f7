// Reason names and message formatting for checkpoint errors.
#include "checkpoint/errors.hpp"

#include "comm/text.hpp"

namespace shardcheck::checkpoint {

std::string_view name_of(Reason r) {
  switch (r) {
    case Reason::io_error:
      return "io_error";
    case Reason::no_checkpoint:
      return "no_checkpoint";
    case Reason::already_committed:
      return "already_committed";
    case Reason::missing_marker:
      return "missing_marker";
    case Reason::bad_marker:
      return "bad_marker";
    case Reason::missing_manifest:
      return "missing_manifest";
    case Reason::bad_manifest:
      return "bad_manifest";
    case Reason::version_mismatch:
      return "version_mismatch";
    case Reason::unsafe_path:
      return "unsafe_path";
    case Reason::bad_tensor:
      return "bad_tensor";
    case Reason::duplicate_shard:
      return "duplicate_shard";
    case Reason::overlapping_shards:
      return "overlapping_shards";
    case Reason::incomplete_coverage:
      return "incomplete_coverage";
    case Reason::out_of_bounds:
      return "out_of_bounds";
    case Reason::unexpected_tensor:
      return "unexpected_tensor";
    case Reason::missing_shard:
      return "missing_shard";
    case Reason::truncated_shard:
      return "truncated_shard";
    case Reason::oversized_shard:
      return "oversized_shard";
    case Reason::bad_header:
      return "bad_header";
    case Reason::header_mismatch:
      return "header_mismatch";
    case Reason::checksum_mismatch:
      return "checksum_mismatch";
    case Reason::stale_shard:
      return "stale_shard";
    case Reason::rank_failed:
      return "rank_failed";
    case Reason::bad_request:
      return "bad_request";
    case Reason::locked:
      return "locked";
    case Reason::changed_during_save:
      return "changed_during_save";
  }
  return "unknown";
}

namespace {
// Names in a checkpoint are input (a manifest may hold any string): every control character is
// escaped in what(), so a newline cannot forge a line of output and a NUL cannot cut the message
// short. file(), tensor() and detail() keep the names as they were.
std::string format(Reason r, const std::string& detail, const std::string& file,
                   const std::string& tensor) {
  std::string s(name_of(r));
  if (!file.empty()) s += ": shard '" + comm::printable(file) + "'";
  if (!tensor.empty())
    s += (file.empty() ? ": tensor '" : " of tensor '") + comm::printable(tensor) + "'";
  return s + ": " + comm::printable(detail);
}
}  // namespace

CheckpointError::CheckpointError(Reason reason, std::string detail, std::string file,
                                 std::string tensor)
    : std::runtime_error(format(reason, detail, file, tensor)),
      reason_(reason),
      detail_(std::move(detail)),
      file_(std::move(file)),
      tensor_(std::move(tensor)) {}

RestoreError::RestoreError(const CheckpointError& e, std::string previous_good)
    : CheckpointError(e.reason(),
                      e.detail() + "; previous good checkpoint: " +
                          (previous_good.empty() ? std::string("none") : previous_good),
                      e.file(), e.tensor()),
      previous_good_(std::move(previous_good)) {}

}  // namespace shardcheck::checkpoint
