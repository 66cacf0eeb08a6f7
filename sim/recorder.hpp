// Flight recorder: a per-rank ring buffer of the last collectives and point-to-point ops, with
// their state (issued, started, completed, failed), wall timestamps, step and virtual start/end,
// for diagnosing hangs and mismatches after the fact. Plain data; the world lock guards it. Not a
// tracer of compute (the timeline is).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/dtype.hpp"

namespace shardcheck::sim {

enum class OpState : std::uint8_t { issued, started, completed, failed };
std::string_view name_of(OpState s);

struct FlightRecord {
  std::uint64_t id = 0;  // per rank, increasing from 0: the order this rank issued its ops
  std::string group;
  std::string op;         // "all_reduce", "send to rank 3 tag 0", ...
  std::uint64_t seq = 0;  // per group (collectives) or per peer, tag and direction (p2p)
  comm::DType dtype = comm::DType::u8;
  std::size_t count = 0;
  int root = -1;  // broadcast / reduce root (group rank), -1 otherwise
  OpState state = OpState::issued;
  double t_issued = 0, t_started = 0, t_ended = 0;  // seconds since the run started (wall clock)
  int step = 0;  // the rank's step when it issued the op (0 before the first begin_step)
  // Virtual seconds: when the rank issued it (its compute clock), and when the op ran on the comm
  // stream. v_start and v_end are meaningful once the state is completed.
  double v_issued = 0, v_start = 0, v_end = 0;
  // "all_reduce seq 3 of group world (f32 x 1024): completed, step 2, virtual 1.000 ms-1.250 ms"
  std::string describe() const;
};

class FlightRecorder {
 public:
  explicit FlightRecorder(std::size_t capacity = 256) : capacity_(capacity) {}
  // Appends a record (dropping the oldest beyond capacity); returns its id.
  std::uint64_t push(FlightRecord r);
  // The record with this id, or nullptr when it has been dropped from the ring.
  FlightRecord* find(std::uint64_t id);
  // Records from oldest to newest.
  std::vector<FlightRecord> snapshot() const;
  // The newest completed record, or nullptr.
  const FlightRecord* last_completed() const;

 private:
  std::size_t capacity_;
  std::uint64_t next_id_ = 0;
  std::vector<FlightRecord> ring_;  // ring_[id % capacity_]
};

}  // namespace shardcheck::sim
