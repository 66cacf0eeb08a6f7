// RapidCheck: random collective programs on random groups (world and a split into two halves),
// with one random fault on a random rank at a random step and op. The run always ends, the
// diagnosis names the injected rank; without the fault the same program completes with results
// equal to their serial definitions.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <vector>

#include "sim/world.hpp"

namespace shardcheck::sim {
namespace {

using comm::Communicator;

enum class Kind { all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, barrier };
struct Op {
  Kind kind;
  bool world;  // else the rank's half
  int count;   // elements per rank (chunk size for gather/scatter/all_to_all)
  int root;    // broadcast: group rank, taken modulo the group size
};

double input(int rank, int op, int i) {
  return static_cast<double>((rank * 31 + op * 7 + i) % 13);  // small integers: sums are exact
}

// Runs op `o` (the op_number-th of the program) on group g and counts wrong elements.
int run_op(Communicator& g, const Op& o, int op_number) {
  const auto p = static_cast<std::size_t>(g.size());
  const auto c = static_cast<std::size_t>(o.count);
  const int me = g.rank();
  const auto& members = g.members();
  auto in = [&](int grank, std::size_t i) {
    return input(members[static_cast<std::size_t>(grank)], op_number, static_cast<int>(i));
  };
  int wrong = 0;
  switch (o.kind) {
    case Kind::all_reduce: {
      std::vector<double> v(c);
      for (std::size_t i = 0; i < c; ++i) v[i] = in(me, i);
      g.all_reduce(std::span<double>(v))->wait();
      for (std::size_t i = 0; i < c; ++i) {
        double want = 0;
        for (int r = 0; r < g.size(); ++r) want += in(r, i);
        wrong += v[i] != want;
      }
      break;
    }
    case Kind::all_gather: {
      std::vector<double> mine(c), all(c * p);
      for (std::size_t i = 0; i < c; ++i) mine[i] = in(me, i);
      g.all_gather(comm::cview(std::span<const double>(mine)), comm::view(std::span<double>(all)))
          ->wait();
      for (std::size_t r = 0; r < p; ++r)
        for (std::size_t i = 0; i < c; ++i) wrong += all[r * c + i] != in(static_cast<int>(r), i);
      break;
    }
    case Kind::reduce_scatter: {
      std::vector<double> full(c * p), out(c);
      for (std::size_t i = 0; i < c * p; ++i) full[i] = in(me, i);
      g.reduce_scatter(comm::cview(std::span<const double>(full)),
                       comm::view(std::span<double>(out)))
          ->wait();
      for (std::size_t i = 0; i < c; ++i) {
        double want = 0;
        for (int r = 0; r < g.size(); ++r) want += in(r, static_cast<std::size_t>(me) * c + i);
        wrong += out[i] != want;
      }
      break;
    }
    case Kind::broadcast: {
      const int root = o.root % g.size();
      std::vector<double> v(c);
      for (std::size_t i = 0; i < c; ++i) v[i] = in(me, i);
      g.broadcast(comm::view(std::span<double>(v)), {.root = root})->wait();
      for (std::size_t i = 0; i < c; ++i) wrong += v[i] != in(root, i);
      break;
    }
    case Kind::all_to_all: {
      std::vector<double> send(c * p), recv(c * p);
      for (std::size_t i = 0; i < c * p; ++i) send[i] = in(me, i);
      g.all_to_all(comm::cview(std::span<const double>(send)), comm::view(std::span<double>(recv)))
          ->wait();
      for (std::size_t j = 0; j < p; ++j)
        for (std::size_t i = 0; i < c; ++i)
          wrong += recv[j * c + i] != in(static_cast<int>(j), static_cast<std::size_t>(me) * c + i);
      break;
    }
    case Kind::barrier:
      g.barrier()->wait();
      break;
  }
  return wrong;
}

struct Program {
  int n;
  std::vector<std::vector<Op>> steps;
  bool halves() const { return n >= 4; }  // the split gives groups of at least two
};

int run_program(const Program& prog, Communicator& c) {
  auto half = c.split(c.rank() < prog.n / 2 ? 0 : 1, c.rank(), {.name = "half"});
  int wrong = 0, op_number = 0;
  for (std::size_t s = 0; s < prog.steps.size(); ++s) {
    c.begin_step(static_cast<int>(s) + 1);
    for (const Op& o : prog.steps[s]) {
      c.compute({.name = "work", .flops = 1e8 * (1 + c.rank() % 3)});
      wrong += run_op(o.world || !prog.halves() ? c : *half, o, op_number++);
    }
  }
  return wrong;
}

rc::Gen<Op> gen_op() {
  return rc::gen::build<Op>(
      rc::gen::set(&Op::kind,
                   rc::gen::element(Kind::all_reduce, Kind::all_gather, Kind::reduce_scatter,
                                    Kind::broadcast, Kind::all_to_all, Kind::barrier)),
      rc::gen::set(&Op::world, rc::gen::arbitrary<bool>()),
      rc::gen::set(&Op::count, rc::gen::inRange(1, 6)),
      rc::gen::set(&Op::root, rc::gen::inRange(0, 8)));
}

bool has_payload_from(const Op& o, int group_rank, int group_size) {
  if (o.kind == Kind::barrier) return false;
  if (o.kind == Kind::broadcast) return o.root % group_size == group_rank;
  return true;
}

RC_GTEST_PROP(FaultProperties, OneRandomFaultIsDetectedAndTracedToItsRank, ()) {
  Program prog;
  prog.n = *rc::gen::inRange(2, 9);
  const int nsteps = *rc::gen::inRange(1, 4);
  for (int s = 0; s < nsteps; ++s)
    prog.steps.push_back(*rc::gen::container<std::vector<Op>>(
        static_cast<std::size_t>(*rc::gen::inRange(1, 5)), gen_op()));

  // Without a fault: completes, every result exact.
  {
    SimWorld w(prog.n);
    std::vector<int> wrong(static_cast<std::size_t>(prog.n));
    w.run(
        [&](Communicator& c) { wrong[static_cast<std::size_t>(c.rank())] = run_program(prog, c); });
    for (int x : wrong) RC_ASSERT(x == 0);
    RC_ASSERT(!w.diagnosis().has_value());
  }

  Fault f;
  f.kind = *rc::gen::element(FaultKind::hang, FaultKind::crash, FaultKind::skip_collective,
                             FaultKind::mismatch, FaultKind::corrupt_payload);
  f.rank = *rc::gen::inRange(0, prog.n);
  f.step = *rc::gen::inRange(1, nsteps + 1);
  const auto& ops = prog.steps[static_cast<std::size_t>(f.step - 1)];
  f.op_index = *rc::gen::inRange(0, static_cast<int>(ops.size()));
  f.what = *rc::gen::element(MismatchWhat::count, MismatchWhat::dtype, MismatchWhat::op);
  if (f.kind == FaultKind::corrupt_payload) {
    // Only an op that carries a payload from this rank can be corrupted.
    const Op& o = ops[static_cast<std::size_t>(f.op_index)];
    const bool world = o.world || !prog.halves();
    const int half_lo = f.rank < prog.n / 2 ? 0 : prog.n / 2;
    const int gsize = world ? prog.n : (f.rank < prog.n / 2 ? prog.n / 2 : prog.n - prog.n / 2);
    RC_PRE(has_payload_from(o, world ? f.rank : f.rank - half_lo, gsize));
  }
  RC_TAG(name_of(f.kind));

  SimWorld w(prog.n, {.faults = {.seed = 11, .faults = {f}}, .checksum_payloads = true});
  bool failed = false;
  try {
    w.run([&](Communicator& c) { run_program(prog, c); });
  } catch (const RankFailure&) {
    failed = true;
  }
  RC_ASSERT(failed);
  RC_ASSERT(w.diagnosis().has_value());
  const Diagnosis& d = *w.diagnosis();
  RC_ASSERT(d.ranks == std::vector<int>{f.rank});
  RC_ASSERT(d.fault.has_value() || d.kind == DiagnosisKind::crash);
  switch (f.kind) {
    case FaultKind::hang:
      RC_ASSERT(d.kind == DiagnosisKind::hang);
      break;
    case FaultKind::crash:
      RC_ASSERT(d.kind == DiagnosisKind::crash);
      break;
    case FaultKind::skip_collective:
      RC_ASSERT(d.kind == DiagnosisKind::deadlock || d.kind == DiagnosisKind::mismatch);
      break;
    case FaultKind::mismatch:
      RC_ASSERT(d.kind == DiagnosisKind::mismatch);
      break;
    default:
      RC_ASSERT(d.kind == DiagnosisKind::corruption);
  }
}

}  // namespace
}  // namespace shardcheck::sim
