// Collective benchmark driver. Inputs follow a pattern of small integers with period 11 in the
// element index, so every expected value is exact in every dtype and found from an 11-entry table.
#include "harness/bench_collectives.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace shardcheck::harness {

bool is_bench_op(BenchOp op) {
  const comm::OpInfo& i = comm::info(op);
  return i.collective && i.layout != comm::Layout::none && i.layout != comm::Layout::varies;
}

bool parse_bench_op(std::string_view s, BenchOp& out) {
  const std::optional<comm::Op> op = comm::op_named(s);
  if (!op || !is_bench_op(*op)) return false;
  out = *op;
  return true;
}

double bus_factor(BenchOp op, int n) {
  return comm::busbw_factor(op, n);
}

std::uint64_t BenchResult::total_wrong() const {
  std::uint64_t w = 0;
  for (const auto& r : rows) w += r.out_of_place.wrong + r.in_place.wrong;
  return w;
}

namespace {

constexpr std::size_t kPeriod = 11;

// Accumulator type matching the comm/ contract: f64 in f64, other floats in f32, integers in i64
// (the patterned values never overflow, so wrapping never matters here).
template <class T>
using AccOf = std::conditional_t<std::is_same_v<T, double>, double,
                                 std::conditional_t<std::is_integral_v<T>, std::int64_t, float>>;

template <class T>
T to_type(AccOf<T> v) {
  if constexpr (std::is_same_v<T, comm::bf16> || std::is_same_v<T, comm::f16>)
    return T(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

int pattern(int rank, std::size_t k, comm::ReduceOp op) {
  const std::size_t m = (static_cast<std::size_t>(rank) * 7 + k * 3) % kPeriod;
  if (op == comm::ReduceOp::prod) return m == 0 ? 2 : 1;
  return static_cast<int>(m) - 5;
}

template <class T>
T value(int rank, std::size_t k, comm::ReduceOp op) {
  int v = pattern(rank, k, op);
  if constexpr (std::is_unsigned_v<T>) v += 5;  // keep u8 non-negative
  return to_type<T>(static_cast<AccOf<T>>(v));
}

// The reduction of every rank's value at each index class k mod 11.
template <class T>
std::vector<T> reduced_table(int n, comm::ReduceOp op) {
  std::vector<T> t(kPeriod);
  for (std::size_t k = 0; k < kPeriod; ++k) {
    using A = AccOf<T>;
    auto load = [&](int r) {
      if constexpr (std::is_same_v<T, comm::bf16> || std::is_same_v<T, comm::f16>)
        return static_cast<A>(static_cast<float>(value<T>(r, k, op)));
      else
        return static_cast<A>(value<T>(r, k, op));
    };
    A acc = load(0);
    for (int r = 1; r < n; ++r) {
      const A x = load(r);
      switch (op) {
        case comm::ReduceOp::sum:
        case comm::ReduceOp::avg:
          acc = acc + x;
          break;
        case comm::ReduceOp::prod:
          acc = acc * x;
          break;
        case comm::ReduceOp::max:
          acc = std::max(acc, x);
          break;
        case comm::ReduceOp::min:
          acc = std::min(acc, x);
          break;
      }
      if constexpr (std::is_integral_v<T>)
        acc = static_cast<A>(static_cast<T>(acc));  // wrap as T does
    }
    if (op == comm::ReduceOp::avg) acc = acc / static_cast<A>(n);
    t[k] = to_type<T>(acc);
  }
  return t;
}

template <class T>
bool same(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

using Layout = comm::Counts;  // element counts of this rank's buffers

Layout layout(BenchOp op, std::size_t count, int n) {
  return comm::counts_for(op, count, n);
}

template <class T>
class Case {
 public:
  Case(comm::Communicator& c, const BenchOptions& o, std::size_t count, bool in_place)
      : c_(c),
        o_(o),
        count_(count),
        in_place_(in_place),
        lay_(layout(o.op, count, c.size())),
        table_(reduced_table<T>(c.size(), o.redop)) {
    const std::size_t len = std::max(lay_.send, lay_.recv);
    send_.resize(in_place ? len : lay_.send);
    recv_.resize(in_place ? 0 : lay_.recv);
  }

  void fill() {
    const int r = c_.rank();
    const std::size_t per = lay_.recv / static_cast<std::size_t>(c_.size());
    if (o_.op == BenchOp::all_gather) {  // this rank's chunk, at its place when in-place
      const std::size_t base = in_place_ ? per * static_cast<std::size_t>(r) : 0;
      for (std::size_t i = 0; i < lay_.send; ++i) send_[base + i] = value<T>(r, i, o_.redop);
    } else if (o_.op == BenchOp::all_to_all) {
      for (std::size_t i = 0; i < lay_.send; ++i) send_[i] = value<T>(r, i, o_.redop);
    } else {
      for (std::size_t i = 0; i < lay_.send; ++i) send_[i] = value<T>(r, i, o_.redop);
    }
    if (!in_place_ && !recv_.empty())
      std::memset(static_cast<void*>(recv_.data()), 0x5a, recv_.size() * sizeof(T));
  }

  void run() {
    using comm::Buffer;
    using comm::ConstBuffer;
    const auto r = static_cast<std::size_t>(c_.rank());
    Buffer all = comm::view(std::span<T>(send_));
    ConstBuffer s = comm::cview(std::span<const T>(send_.data(), lay_.send));
    Buffer d = in_place_ ? all : comm::view(std::span<T>(recv_));
    switch (o_.op) {
      case BenchOp::all_reduce:
        c_.all_reduce(s, d, {.op = o_.redop})->wait();
        break;
      case BenchOp::broadcast:
        c_.broadcast(s, d, {.root = 0})->wait();
        break;
      case BenchOp::reduce:  // to rank 0, as nccl-tests' reduce_perf's default root
        if (in_place_)
          c_.reduce(all, 0, {.op = o_.redop})->wait();
        else
          c_.reduce(s, d, 0, {.op = o_.redop})->wait();
        break;
      case BenchOp::all_to_all:
        c_.all_to_all(s, d)->wait();
        break;
      case BenchOp::all_gather:
        if (in_place_)
          c_.all_gather(all)->wait();
        else
          c_.all_gather(s, d)->wait();
        break;
      case BenchOp::reduce_scatter:
        if (in_place_)
          c_.reduce_scatter(all, {.op = o_.redop})->wait();
        else
          c_.reduce_scatter(s, d, {.op = o_.redop})->wait();
        break;
      default:  // an op is_bench_op admits but this switch does not run: never time nothing
        throw std::logic_error("bench: no run for " + std::string(comm::info(o_.op).name));
    }
    (void)r;
  }

  std::uint64_t wrong() const {
    const int n = c_.size();
    const auto r = static_cast<std::size_t>(c_.rank());
    const std::vector<T>& out = in_place_ ? send_ : recv_;
    std::uint64_t bad = 0;
    const std::size_t per = count_ / static_cast<std::size_t>(n);
    switch (o_.op) {
      case BenchOp::all_reduce:
        for (std::size_t k = 0; k < count_; ++k) bad += !same(out[k], table_[k % kPeriod]);
        break;
      case BenchOp::broadcast:
        for (std::size_t k = 0; k < count_; ++k) bad += !same(out[k], value<T>(0, k, o_.redop));
        break;
      case BenchOp::reduce:  // the root's result; other ranks' receive buffers are not written
        if (r == 0)
          for (std::size_t k = 0; k < count_; ++k) bad += !same(out[k], table_[k % kPeriod]);
        break;
      case BenchOp::all_gather:
        for (std::size_t q = 0; q < static_cast<std::size_t>(n); ++q)
          for (std::size_t i = 0; i < per; ++i)
            bad += !same(out[q * per + i], value<T>(static_cast<int>(q), i, o_.redop));
        break;
      case BenchOp::reduce_scatter: {
        const std::size_t base = in_place_ ? r * per : 0;
        for (std::size_t i = 0; i < per; ++i)
          bad += !same(out[base + i], table_[(r * per + i) % kPeriod]);
        break;
      }
      case BenchOp::all_to_all:
        for (std::size_t j = 0; j < static_cast<std::size_t>(n); ++j)
          for (std::size_t i = 0; i < per; ++i)
            bad += !same(out[j * per + i], value<T>(static_cast<int>(j), r * per + i, o_.redop));
        break;
      default:
        throw std::logic_error("bench: no check for " + std::string(comm::info(o_.op).name));
    }
    return bad;
  }

 private:
  comm::Communicator& c_;
  const BenchOptions& o_;
  std::size_t count_;
  bool in_place_;
  Layout lay_;
  std::vector<T> table_;
  std::vector<T> send_, recv_;
};

// One size, one mode, on every rank: check run, warm-up, calibrated timed loop.
template <class T>
BenchCell measure(const RankRunner& run, int n, const BenchOptions& o, std::size_t count,
                  bool in_place) {
  std::vector<std::uint64_t> wrong(static_cast<std::size_t>(n));
  double seconds = 0;
  std::int64_t iters_used = 0;
  run([&](comm::Communicator& c) {
    Case<T> cs(c, o, count, in_place);
    cs.fill();
    cs.run();
    // Every rank learns the total (under mpirun a process sees only its own rank's slot).
    auto bad = static_cast<std::int64_t>(cs.wrong());
    c.all_reduce(comm::view(std::span<std::int64_t>(&bad, 1)), {.op = comm::ReduceOp::sum})->wait();
    wrong[static_cast<std::size_t>(c.rank())] = static_cast<std::uint64_t>(bad);
    for (int i = 0; i < o.warmup; ++i) cs.run();
    std::int64_t iters = o.iters;
    if (iters <= 0) {  // calibrate on rank 0's clock, then agree on the count
      c.barrier()->wait();
      const auto t0 = std::chrono::steady_clock::now();
      cs.run();
      const double one =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      iters = std::clamp<std::int64_t>(
          static_cast<std::int64_t>(o.target_seconds / std::max(one, 1e-7)), 3, 2000);
      c.broadcast(comm::view(std::span<std::int64_t>(&iters, 1)), {.root = 0})->wait();
    }
    c.barrier()->wait();
    const auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < iters; ++i) cs.run();
    c.barrier()->wait();
    if (c.rank() == 0) {
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      iters_used = iters;
    }
  });
  BenchCell cell;
  const auto bytes = static_cast<double>(count * comm::size_of(o.dtype));
  const double per_op = seconds / static_cast<double>(std::max<std::int64_t>(iters_used, 1));
  cell.time_us = per_op * 1e6;
  cell.algbw_gbps = per_op > 0 ? bytes / per_op * 1e-9 : 0;
  cell.busbw_gbps = cell.algbw_gbps * bus_factor(o.op, n);
  cell.wrong = *std::max_element(wrong.begin(), wrong.end());  // every filled slot: the total
  return cell;
}

}  // namespace

std::vector<std::size_t> bench_counts(const BenchOptions& o, int ranks) {
  const std::size_t esize = comm::size_of(o.dtype);
  const bool split = comm::splits_by_rank(o.op);
  const std::size_t align = split ? static_cast<std::size_t>(std::max(ranks, 1)) : 1;
  std::vector<std::size_t> counts;
  for (std::size_t bytes = std::max<std::size_t>(o.min_bytes, 1); bytes <= o.max_bytes;
       bytes *= 2) {
    const std::size_t count = bytes / esize / align * align;
    if (count > 0) counts.push_back(count);
    if (bytes > o.max_bytes / 2) break;  // avoid overflow past the last size
  }
  return counts;
}

BenchResult bench_collectives(const RankRunner& run, const std::string& backend, int ranks,
                              const BenchOptions& o) {
  BenchResult res{backend, ranks, o, {}};
  const std::size_t esize = comm::size_of(o.dtype);
  for (const std::size_t count : bench_counts(o, ranks)) {
    BenchRow row;
    row.count = count;
    row.bytes = count * esize;
    comm::visit_dtype(o.dtype, [&](auto tag) {
      using T = decltype(tag);
      row.out_of_place = measure<T>(run, ranks, o, count, false);
      row.in_place = measure<T>(run, ranks, o, count, true);
    });
    res.rows.push_back(row);
    if (o.on_row) o.on_row(row);
  }
  return res;
}

namespace {
std::string_view type_name(comm::DType t) {
  switch (t) {
    case comm::DType::f64:
      return "double";
    case comm::DType::f32:
      return "float";
    case comm::DType::bf16:
      return "bfloat16";
    case comm::DType::f16:
      return "half";
    case comm::DType::i32:
      return "int32";
    case comm::DType::i64:
      return "int64";
    case comm::DType::u8:
      return "uint8";
  }
  return "?";
}
}  // namespace

void print_header(std::ostream& os, const std::string& backend, int ranks, const BenchOptions& o) {
  os << "# shardcheck bench collectives: " << name_of(o.op) << ", backend " << backend << ", "
     << ranks << " ranks, dtype " << comm::name_of(o.dtype) << "\n";
  os << "#                                                  out-of-place                       "
        "in-place\n";
  os << "#        size        count      type   redop     time   algbw   busbw  #wrong     time   "
        "algbw   busbw  #wrong\n";
  os << "#         (B)   (elements)                       (us)  (GB/s)  (GB/s)             (us)  "
        "(GB/s)  (GB/s)"
     << std::endl;  // flushed: a run killed before its first row still shows what it ran
}

void print_row(std::ostream& os, const BenchOptions& o, const BenchRow& row) {
  char line[256];
  const bool reduces = comm::info(o.op).reduces;
  std::snprintf(line, sizeof line,
                "%13zu %12zu %9s %7s %8.1f %7.2f %7.2f %7llu %8.1f %7.2f %7.2f %7llu\n", row.bytes,
                row.count, std::string(type_name(o.dtype)).c_str(),
                reduces ? std::string(comm::name_of(o.redop)).c_str() : "none",
                row.out_of_place.time_us, row.out_of_place.algbw_gbps, row.out_of_place.busbw_gbps,
                static_cast<unsigned long long>(row.out_of_place.wrong), row.in_place.time_us,
                row.in_place.algbw_gbps, row.in_place.busbw_gbps,
                static_cast<unsigned long long>(row.in_place.wrong));
  os << line << std::flush;
}

void print_footer(std::ostream& os, const BenchResult& r) {
  double bus_sum = 0;
  for (const auto& row : r.rows) bus_sum += row.out_of_place.busbw_gbps + row.in_place.busbw_gbps;
  os << "# Out of bounds values : " << r.total_wrong() << (r.total_wrong() == 0 ? " OK" : " FAILED")
     << "\n";
  char line[128];
  std::snprintf(line, sizeof line, "# Avg bus bandwidth    : %.3f GB/s\n",
                r.rows.empty() ? 0.0 : bus_sum / (2.0 * static_cast<double>(r.rows.size())));
  os << line;
}

void print_table(std::ostream& os, const BenchResult& r) {
  print_header(os, r.backend, r.ranks, r.options);
  for (const auto& row : r.rows) print_row(os, r.options, row);
  print_footer(os, r);
}

}  // namespace shardcheck::harness
