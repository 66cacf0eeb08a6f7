// The scenario runner's NCCL path: the same per-rank training function as on the simulator
// (detail::train_rank), run by a backend's rank runner. Under mpirun each process holds one rank,
// so the ranks' records are all-gathered (as bytes, over the world communicator) before the parity
// check; every process then reaches the same verdict and only rank 0 prints (cmd_run.cpp). Timing
// is wall time: each rank measures its own steps.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <span>
#include <stdexcept>
#include <type_traits>

#include "comm/errors.hpp"
#include "harness/driver.hpp"
#include "harness/runner_detail.hpp"
#include "parallel/mp/mesh_engine.hpp"

namespace shardcheck::harness::detail {

namespace {

class Writer {
 public:
  template <class T>
  void pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  template <class T>
  void pods(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    pod<std::uint64_t>(v.size());
    const auto* p = reinterpret_cast<const std::byte*>(v.data());
    out_.insert(out_.end(), p, p + v.size() * sizeof(T));
  }
  void str(const std::string& s) { pods(std::vector<char>(s.begin(), s.end())); }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

class Reader {
 public:
  explicit Reader(const std::vector<std::byte>& in) : in_(in) {}
  template <class T>
  T pod() {
    T v;
    std::memcpy(&v, take(sizeof(T)), sizeof(T));
    return v;
  }
  template <class T>
  std::vector<T> pods() {
    const auto n = pod<std::uint64_t>();
    if (n > (in_.size() - at_) / sizeof(T) + 1) fail();
    std::vector<T> v(n);
    if (n > 0) std::memcpy(v.data(), take(n * sizeof(T)), n * sizeof(T));
    return v;
  }
  std::string str() {
    const std::vector<char> c = pods<char>();
    return {c.begin(), c.end()};
  }
  std::size_t count() { return static_cast<std::size_t>(pod<std::uint64_t>()); }

 private:
  [[noreturn]] static void fail() { throw std::runtime_error("gathered rank record is truncated"); }
  const std::byte* take(std::size_t n) {
    if (n > in_.size() - at_) fail();
    const std::byte* p = in_.data() + at_;
    at_ += n;
    return p;
  }
  const std::vector<std::byte>& in_;
  std::size_t at_ = 0;
};

// Every rank's record and books, on every rank: lengths first, then the padded bytes.
void gather_all(comm::Communicator& c, const RankTrace& t, const RankMemory& m,
                std::vector<RankTrace>& all, std::vector<RankMemory>& memory) {
  const std::vector<std::byte> mine = pack(t, m);
  const auto n = static_cast<std::size_t>(c.size());
  std::int64_t len = static_cast<std::int64_t>(mine.size());
  std::vector<std::int64_t> lens(n);
  c.all_gather(comm::cview(std::span<const std::int64_t>(&len, 1)),
               comm::view(std::span<std::int64_t>(lens)))
      ->wait();
  const auto width = static_cast<std::size_t>(*std::max_element(lens.begin(), lens.end()));
  std::vector<std::uint8_t> send(width), recv(width * n);
  std::memcpy(send.data(), mine.data(), mine.size());
  c.all_gather(comm::cview(std::span<const std::uint8_t>(send)),
               comm::view(std::span<std::uint8_t>(recv)))
      ->wait();
  all.assign(n, {});
  memory.assign(n, {});
  for (std::size_t q = 0; q < n; ++q) {
    const auto* p = reinterpret_cast<const std::byte*>(recv.data() + q * width);
    unpack(std::vector<std::byte>(p, p + lens[q]), all[q], memory[q]);
  }
}

// A rank's failure: the first root cause wins over the AbortedErrors it caused in the others.
struct Failure {
  int rank = -1;  // -1: the runner's error, whose message names the rank
  std::string what;
  std::exception_ptr cause;
  bool follow_on = false;
};

FaultResult fault_of(const Failure& f) {
  FaultResult out;
  out.kind = "error";
  if (f.rank >= 0) out.ranks = {f.rank};
  out.message = (f.rank >= 0 ? "rank " + std::to_string(f.rank) + ": " : "") + f.what;
  try {
    std::rethrow_exception(f.cause);
  } catch (const parallel::NonFiniteGradientError& e) {
    out.kind = "nan";
    out.ranks = e.ranks();
    out.step = e.step();
    out.message = std::string(e.what()) + "; the run stopped (health.nan_policy \"stop\")";
  } catch (const comm::MismatchError&) {
    out.kind = "mismatch";
  } catch (const comm::PeerError&) {
    out.kind = "hang";
  } catch (...) {
  }
  return out;
}

// The simulator's timing fields from measured wall time: per (rank, step) the seconds the rank's
// step took on it (forward, backward, collectives and optimizer, as the engine's step() runs them).
TimingResult wall_timing(const Scenario& s, const ParallelSpec& p, const Trace& want,
                         const std::vector<RankTrace>& got) {
  std::vector<sim::StepTime> times;
  for (std::size_t rank = 0; rank < got.size(); ++rank)
    for (std::size_t k = 0; k < got[rank].step_seconds.size(); ++k)
      times.push_back({static_cast<int>(rank), got[rank].first_step + static_cast<int>(k), 0.0,
                       got[rank].step_seconds[k]});
  TimingResult t = timing_of(times, s.train.steps);
  fill_rates(s, p, want, t);
  return t;
}

}  // namespace

namespace {

void write_pieces(Writer& w, const std::vector<parallel::StatePiece>& pieces) {
  w.pod<std::uint64_t>(pieces.size());
  for (const parallel::StatePiece& pc : pieces) {
    w.str(pc.tensor);
    w.pods(pc.shape);
    w.pod(pc.dtype);
    w.pod<std::uint64_t>(pc.begin);
    w.pod<std::uint64_t>(pc.count);
    w.pods(pc.bytes);
  }
}

std::vector<parallel::StatePiece> read_pieces(Reader& r) {
  std::vector<parallel::StatePiece> pieces(r.count());
  for (parallel::StatePiece& pc : pieces) {
    pc.tensor = r.str();
    pc.shape = r.pods<std::int64_t>();
    pc.dtype = r.pod<comm::DType>();
    pc.begin = r.count();
    pc.count = r.count();
    pc.bytes = r.pods<std::byte>();
  }
  return pieces;
}

}  // namespace

std::vector<std::byte> pack(const RankTrace& t, const RankMemory& m) {
  Writer w;
  w.pod(t.first_step);
  w.pods(t.steps);
  w.pod<std::uint64_t>(t.pieces.size());
  for (const auto& step : t.pieces) write_pieces(w, step);
  write_pieces(w, t.held);
  w.pod<std::uint64_t>(t.held_digests.size());
  for (const auto& step : t.held_digests) {
    w.pod<std::uint64_t>(step.size());
    for (const HeldDigest& d : step) {
      w.str(d.tensor);
      w.pod(d.dtype);
      w.pod<std::uint64_t>(d.begin);
      w.pod<std::uint64_t>(d.count);
      w.pod(d.hash);
    }
  }
  w.pod<std::uint64_t>(t.final_params.size());
  for (const auto& e : t.final_params) {
    w.str(e.name);
    w.pods(e.value.shape());
    w.pods(e.value.vec());
  }
  w.pod<std::uint64_t>(t.health.size());
  for (const parallel::StepHealth& h : t.health) {
    w.pod(h.skipped);
    w.pods(h.nonfinite_ranks);
  }
  w.pods(t.step_seconds);
  w.str(t.compute);
  w.pod(t.device_ops);
  w.pod(m.rank);
  w.pod(m.resident.bytes);
  w.pod(m.at_peak.bytes);
  w.pod<std::uint64_t>(m.peak);
  w.str(m.peak_phase);
  return w.take();
}

void unpack(const std::vector<std::byte>& bytes, RankTrace& t, RankMemory& m) {
  Reader r(bytes);
  t = {};
  t.first_step = r.pod<int>();
  t.steps = r.pods<ref::StepRecord>();
  t.pieces.resize(r.count());
  for (auto& step : t.pieces) step = read_pieces(r);
  t.held = read_pieces(r);
  t.held_digests.resize(r.count());
  for (auto& step : t.held_digests) {
    step.resize(r.count());
    for (HeldDigest& d : step) {
      d.tensor = r.str();
      d.dtype = r.pod<comm::DType>();
      d.begin = r.count();
      d.count = r.count();
      d.hash = r.pod<std::uint64_t>();
    }
  }
  for (std::size_t i = 0, n = r.count(); i < n; ++i) {
    std::string name = r.str();
    ref::Shape shape = r.pods<std::int64_t>();
    t.final_params.add(std::move(name), std::move(shape)).vec() = r.pods<double>();
  }
  t.health.resize(r.count());
  for (parallel::StepHealth& h : t.health) {
    h.skipped = r.pod<bool>();
    h.nonfinite_ranks = r.pods<int>();
  }
  t.step_seconds = r.pods<double>();
  t.compute = r.str();
  t.device_ops = r.pod<int64_t>();
  m.rank = r.pod<int>();
  m.resident.bytes = r.pod<decltype(m.resident.bytes)>();
  m.at_peak.bytes = r.pod<decltype(m.at_peak.bytes)>();
  m.peak = r.count();
  m.peak_phase = r.str();
}

ConfigResult run_config_ranks(const Scenario& s, const ref::Dataset& ds, const Trace& want,
                              const ParallelSpec& p, const Ranks& ranks, bool gather, int capacity,
                              const std::string& capacity_what, const ComputeFactory& compute) {
  ConfigResult r = config_row(s, p);
  if (!r.supported) return r;
  const int world = p.mesh.world_size();
  if (world > capacity || (gather && world != capacity)) {
    r.supported = false;
    r.detail = "not run: needs " + std::to_string(world) + " ranks, " + std::to_string(capacity) +
               " " + capacity_what;
    return r;
  }
  r.strategy = strategy_name(p);

  const auto n = static_cast<std::size_t>(world);
  std::vector<RankTrace> got(n);
  std::vector<RankMemory> memory(n);
  // With gather: each rank's gathered copy (under mpirun this process fills only its own).
  std::vector<std::vector<RankTrace>> got_copies(n);
  std::vector<std::vector<RankMemory>> memory_copies(n);
  std::mutex failures_mutex;
  std::vector<Failure> failures;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    ranks([&](comm::Communicator& c) {
      const auto me = static_cast<std::size_t>(c.rank());
      try {
        train_rank(c, s, ds, p, {}, got[me], memory[me], compute);
        if (gather) gather_all(c, got[me], memory[me], got_copies[me], memory_copies[me]);
      } catch (const std::exception& e) {
        const std::scoped_lock lock(failures_mutex);
        failures.push_back({c.world_rank(), e.what(), std::current_exception(),
                            dynamic_cast<const comm::AbortedError*>(&e) != nullptr});
        throw;
      }
    });
  } catch (const std::exception& e) {
    // The runner's own error (it names the rank) when no rank recorded a root cause of its own.
    if (std::all_of(failures.begin(), failures.end(), [](const Failure& f) { return f.follow_on; }))
      failures.insert(failures.begin(), {-1, e.what(), std::current_exception(), false});
  }
  r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!failures.empty()) {
    std::stable_sort(failures.begin(), failures.end(), [](const Failure& a, const Failure& b) {
      return a.follow_on != b.follow_on ? b.follow_on : a.rank < b.rank;
    });
    r.faults.push_back(fault_of(failures.front()));
    r.detail = r.faults.back().message;
    note_compute(got, r);  // this process's ranks
  } else {
    if (gather) {
      const auto it = std::find_if(got_copies.begin(), got_copies.end(),
                                   [](const auto& v) { return !v.empty(); });
      const auto at = static_cast<std::size_t>(it - got_copies.begin());
      got = std::move(got_copies[at]);
      memory = std::move(memory_copies[at]);
    }
    r.memory = memory;
    note_compute(got, r);
    measure_parity(s, want, got, r);
    if (auto f = nan_result(got[0])) r.faults.push_back(*f);
    r.timing = wall_timing(s, p, want, got);
    r.wall_timing = true;
    double seconds = 0;  // the slowest rank's wall time over its steps
    for (const RankTrace& t : got) {
      double mine = 0;
      for (const double x : t.step_seconds) mine += x;
      seconds = std::max(seconds, mine);
    }
    r.goodput = goodput_of(want, got[0], seconds);
  }
  decide(s, r);
  return r;
}

}  // namespace shardcheck::harness::detail
