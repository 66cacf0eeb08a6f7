// Ring-buffer bookkeeping of the flight recorder.
#include "sim/recorder.hpp"

#include <sstream>

#include "sim/topology.hpp"

namespace shardcheck::sim {

std::string_view name_of(OpState s) {
  switch (s) {
    case OpState::issued:
      return "issued";
    case OpState::started:
      return "started";
    case OpState::completed:
      return "completed";
    case OpState::failed:
      return "failed";
  }
  return "?";
}

std::string FlightRecord::describe() const {
  std::ostringstream os;
  os << op << " seq " << seq << " of group " << group << " (" << comm::name_of(dtype) << " x "
     << count << (root >= 0 ? ", root " + std::to_string(root) : "") << "): " << name_of(state);
  if (step > 0) os << ", step " << step;
  if (state == OpState::completed)
    os << ", virtual " << format_seconds(v_start) << "-" << format_seconds(v_end);
  else
    os << ", issued at virtual " << format_seconds(v_issued);
  return os.str();
}

std::uint64_t FlightRecorder::push(FlightRecord r) {
  r.id = next_id_++;
  if (ring_.size() < capacity_)
    ring_.push_back(std::move(r));
  else
    ring_[r.id % capacity_] = std::move(r);
  return next_id_ - 1;
}

FlightRecord* FlightRecorder::find(std::uint64_t id) {
  if (id >= next_id_ || next_id_ - id > ring_.size()) return nullptr;
  return &ring_[id % capacity_];
}

std::vector<FlightRecord> FlightRecorder::snapshot() const {
  std::vector<FlightRecord> out;
  const std::uint64_t first = next_id_ - ring_.size();
  for (std::uint64_t id = first; id < next_id_; ++id) out.push_back(ring_[id % capacity_]);
  return out;
}

const FlightRecord* FlightRecorder::last_completed() const {
  for (std::uint64_t id = next_id_; id > next_id_ - ring_.size(); --id) {
    const FlightRecord& r = ring_[(id - 1) % capacity_];
    if (r.state == OpState::completed) return &r;
  }
  return nullptr;
}

}  // namespace shardcheck::sim
