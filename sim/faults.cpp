// Fault plan validation, per-rank matching and the deterministic payload corruption.
#include "sim/faults.hpp"

#include <cmath>
#include <sstream>

namespace shardcheck::sim {

std::string_view name_of(FaultKind k) {
  switch (k) {
    case FaultKind::straggler:
      return "straggler";
    case FaultKind::hang:
      return "hang";
    case FaultKind::crash:
      return "crash";
    case FaultKind::skip_collective:
      return "skip_collective";
    case FaultKind::mismatch:
      return "mismatch";
    case FaultKind::corrupt_payload:
      return "corrupt_payload";
    case FaultKind::memory_budget:
      return "memory_budget";
    case FaultKind::nan_gradient:
      return "nan_gradient";
  }
  return "?";
}

std::string_view name_of(MismatchWhat w) {
  switch (w) {
    case MismatchWhat::count:
      return "count";
    case MismatchWhat::dtype:
      return "dtype";
    case MismatchWhat::op:
      return "op";
  }
  return "?";
}

std::string Fault::describe() const {
  std::ostringstream os;
  os << name_of(kind) << " of rank " << rank;
  switch (kind) {
    case FaultKind::straggler:
      os << " (x" << slowdown << " compute) from step " << from_step;
      break;
    case FaultKind::memory_budget:
      os << " (" << bytes << " B)";
      break;
    case FaultKind::nan_gradient:
      os << " at step " << step;
      break;
    default:
      os << " at step " << step;
      if (op_index < 0)
        os << " start";
      else
        os << ", op " << op_index;
      if (kind == FaultKind::mismatch) os << " (" << name_of(what) << ")";
  }
  return os.str();
}

std::string FiredFault::describe() const {
  std::ostringstream os;
  os << name_of(fault.kind) << " fired on rank " << fault.rank << " at step " << step;
  if (op_index < 0)
    os << " start";
  else
    os << ", op " << op_index << " (" << op << " seq " << seq << " of group " << group << ")";
  if (!detail.empty()) os << ": " << detail;
  return os.str();
}

InjectedCrash::InjectedCrash(int rank, int step, int op_index, const std::string& where)
    : std::runtime_error("injected crash of rank " + std::to_string(rank) + " at step " +
                         std::to_string(step) +
                         (op_index < 0 ? " start" : ", op " + std::to_string(op_index)) +
                         (where.empty() ? "" : " (" + where + ")")),
      rank_(rank),
      step_(step),
      op_index_(op_index) {}

void validate(const FaultPlan& plan, int world_size) {
  for (std::size_t i = 0; i < plan.faults.size(); ++i) {
    const Fault& f = plan.faults[i];
    const std::string at =
        "faults[" + std::to_string(i) + "] (" + std::string(name_of(f.kind)) + ")";
    auto fail = [&](const std::string& what) { throw std::invalid_argument(at + ": " + what); };
    if (f.rank < 0 || f.rank >= world_size)
      fail("rank " + std::to_string(f.rank) + " is outside the world of " +
           std::to_string(world_size));
    switch (f.kind) {
      case FaultKind::straggler:
        if (!(std::isfinite(f.slowdown) && f.slowdown > 0))
          fail("slowdown must be a positive number");
        if (f.from_step < 1) fail("from_step must be >= 1");
        break;
      case FaultKind::memory_budget:
        break;
      case FaultKind::nan_gradient:
        if (f.step < 1) fail("step must be >= 1");
        break;
      case FaultKind::hang:
      case FaultKind::crash:
        if (f.step < 1) fail("step must be >= 1");
        if (f.op_index < -1) fail("op_index must be >= -1 (-1: at the step start)");
        break;
      default:
        if (f.step < 1) fail("step must be >= 1");
        if (f.op_index < 0) fail("op_index must be >= 0");
    }
  }
}

RankFaults::RankFaults(const FaultPlan& plan, int rank) {
  for (const Fault& f : plan.faults)
    if (f.rank == rank) faults_.push_back(f);
}

double RankFaults::slowdown(int step) const {
  double s = 1.0;
  for (const Fault& f : faults_)
    if (f.kind == FaultKind::straggler && step >= f.from_step) s *= f.slowdown;
  return s;
}

std::optional<Fault> RankFaults::at_step_start(int step) const {
  for (const Fault& f : faults_)
    if ((f.kind == FaultKind::hang || f.kind == FaultKind::crash) && f.step == step &&
        f.op_index < 0)
      return f;
  return std::nullopt;
}

std::optional<Fault> RankFaults::at_op(int step, int op_index) const {
  for (const Fault& f : faults_) switch (f.kind) {
      case FaultKind::hang:
      case FaultKind::crash:
      case FaultKind::skip_collective:
      case FaultKind::mismatch:
      case FaultKind::corrupt_payload:
        if (f.step == step && f.op_index == op_index) return f;
        break;
      default:
        break;
    }
  return std::nullopt;
}

std::optional<std::size_t> RankFaults::memory_budget() const {
  for (const Fault& f : faults_)
    if (f.kind == FaultKind::memory_budget) return f.bytes;
  return std::nullopt;
}

std::size_t corrupt_index(std::uint64_t seed, int rank, int step, int op_index, std::size_t count) {
  // splitmix64 of the fault's coordinates: the same element every run.
  std::uint64_t z = seed ^ (std::uint64_t(std::uint32_t(rank)) << 40) ^
                    (std::uint64_t(std::uint32_t(step)) << 20) ^
                    std::uint64_t(std::uint32_t(op_index));
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<std::size_t>(z % count);
}

void flip_element(void* data, std::size_t elem_size, std::size_t index) {
  auto* p = static_cast<unsigned char*>(data) + index * elem_size + (elem_size - 1);
  *p = static_cast<unsigned char>(*p ^ 0x40u);
}

}  // namespace shardcheck::sim
