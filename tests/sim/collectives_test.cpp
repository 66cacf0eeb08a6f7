// Every collective on the simulator, parameterised over world size x count x in-place, for every
// dtype and reduce op, against exactly predictable results (patterned small integers); reduce's
// root against all_reduce on inexact floats, and a non-root's empty recv.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "sim/world.hpp"
#include "tests/sim/support.hpp"

namespace shardcheck::testing {
namespace {

using comm::Communicator;

template <class T>
void poison(std::vector<T>& v) {
  if (!v.empty()) std::memset(static_cast<void*>(v.data()), 0x5a, v.size() * sizeof(T));
}

template <class T>
T value(int src, int dst, std::size_t idx) {  // payload element idx sent from src to dst
  return pattern<T>(src, static_cast<std::size_t>(dst) * 37 + idx, ReduceOp::sum);
}

std::size_t split_size(int src, int dst, std::size_t count) {
  return count == 0
             ? 0
             : (count + 3 * static_cast<std::size_t>(src) + 5 * static_cast<std::size_t>(dst)) % 7 +
                   count / 4;
}

template <class T>
void note(std::vector<std::string>& errors, const std::string& what, const std::vector<T>& got,
          const std::vector<T>& want, std::size_t offset = 0) {
  const std::size_t wrong = count_bitwise_diff(got.data() + offset, want.data(), want.size());
  if (wrong)
    errors.push_back(what + ": " + std::to_string(wrong) + " wrong of " +
                     std::to_string(want.size()));
}

// Inputs of every rank and the serial result, per reduce op, computed once before the ranks run.
template <class T>
struct Reduction {
  std::vector<std::vector<T>> in;
  std::vector<T> want;
};
template <class T>
std::vector<Reduction<T>> reductions(int n, std::size_t count) {
  std::vector<Reduction<T>> out;
  for (ReduceOp op : kAllReduceOps) {
    Reduction<T> red{
        std::vector<std::vector<T>>(static_cast<std::size_t>(n), std::vector<T>(count)), {}};
    for (int q = 0; q < n; ++q)
      for (std::size_t k = 0; k < count; ++k)
        red.in[static_cast<std::size_t>(q)][k] = pattern<T>(q, k, op);
    red.want = serial_reduce(red.in, op);
    out.push_back(std::move(red));
  }
  return out;
}

template <class T>
std::vector<std::string> check_all_ops(Communicator& c, std::size_t count, bool in_place,
                                       const std::vector<Reduction<T>>& ar,
                                       const std::vector<Reduction<T>>& rs) {
  std::vector<std::string> errors;
  const int n = c.size(), r = c.rank();
  const auto un = static_cast<std::size_t>(n);
  const std::size_t per_rank = count > 13 ? count / un : count;

  for (std::size_t o = 0; o < std::size(kAllReduceOps); ++o) {
    const ReduceOp op = kAllReduceOps[o];
    const auto& all = ar[o].in;
    const std::vector<T>& want = ar[o].want;
    std::vector<T> in = all[static_cast<std::size_t>(r)], out(count);
    poison(out);
    if (in_place) {
      c.all_reduce(comm::view(std::span<T>(in)), {.op = op})->wait();
      note(errors, "all_reduce " + std::string(comm::name_of(op)), in, want);
    } else {
      c.all_reduce(comm::cview(std::span<const T>(in)), comm::view(std::span<T>(out)), {.op = op})
          ->wait();
      note(errors, "all_reduce " + std::string(comm::name_of(op)), out, want);
    }
  }

  for (std::size_t o = 0; o < std::size(kAllReduceOps); ++o) {
    const ReduceOp op = kAllReduceOps[o];
    const auto& all = rs[o].in;
    const std::vector<T>& full = rs[o].want;
    const std::vector<T> want(
        full.begin() + static_cast<long>(per_rank * static_cast<std::size_t>(r)),
        full.begin() + static_cast<long>(per_rank * static_cast<std::size_t>(r + 1)));
    std::vector<T> send = all[static_cast<std::size_t>(r)], recv(per_rank);
    poison(recv);
    if (in_place) {
      c.reduce_scatter(comm::view(std::span<T>(send)), {.op = op})->wait();
      note(errors, "reduce_scatter " + std::string(comm::name_of(op)), send, want,
           per_rank * static_cast<std::size_t>(r));
    } else {
      c.reduce_scatter(comm::cview(std::span<const T>(send)), comm::view(std::span<T>(recv)),
                       {.op = op})
          ->wait();
      note(errors, "reduce_scatter " + std::string(comm::name_of(op)), recv, want);
    }
  }

  {
    std::vector<T> want(per_rank * un), buf(per_rank * un), mine(per_rank);
    for (int q = 0; q < n; ++q)
      for (std::size_t k = 0; k < per_rank; ++k)
        want[static_cast<std::size_t>(q) * per_rank + k] = value<T>(q, 0, k);
    for (std::size_t k = 0; k < per_rank; ++k) mine[k] = value<T>(r, 0, k);
    poison(buf);
    if (in_place) {
      std::copy(mine.begin(), mine.end(),
                buf.begin() + static_cast<long>(per_rank * static_cast<std::size_t>(r)));
      c.all_gather(comm::view(std::span<T>(buf)))->wait();
    } else {
      c.all_gather(comm::cview(std::span<const T>(mine)), comm::view(std::span<T>(buf)))->wait();
    }
    note(errors, "all_gather", buf, want);
  }

  for (int root : {0, n - 1}) {
    std::vector<T> want(count), buf(count);
    for (std::size_t k = 0; k < count; ++k) want[k] = value<T>(root, 1, k);
    if (r == root)
      buf = want;
    else
      poison(buf);
    if (in_place) {
      c.broadcast(comm::view(std::span<T>(buf)), {.root = root})->wait();
      note(errors, "broadcast root " + std::to_string(root), buf, want);
    } else {
      std::vector<T> out(count);
      poison(out);
      c.broadcast(comm::cview(std::span<const T>(buf)), comm::view(std::span<T>(out)),
                  {.root = root})
          ->wait();
      note(errors, "broadcast root " + std::to_string(root), out, want);
    }
  }

  // reduce: the root gets all_reduce's result (the same serial rank-order reduction, bitwise);
  // other ranks' recv and every send stay as they were. Every op to the last rank, sum to rank 0.
  for (std::size_t o = 0; o < std::size(kAllReduceOps); ++o) {
    const ReduceOp op = kAllReduceOps[o];
    const std::vector<T>& mine = ar[o].in[static_cast<std::size_t>(r)];
    for (int root : {0, n - 1}) {
      if (root == 0 && op != ReduceOp::sum && n > 1) continue;
      const std::string what =
          "reduce " + std::string(comm::name_of(op)) + " root " + std::to_string(root);
      std::vector<T> in = mine;
      if (in_place) {
        c.reduce(comm::view(std::span<T>(in)), root, {.op = op})->wait();
        note(errors, what, in, r == root ? ar[o].want : mine);
      } else {
        std::vector<T> out(count);
        poison(out);
        const std::vector<T> poisoned = out;
        c.reduce(comm::cview(std::span<const T>(in)), comm::view(std::span<T>(out)), root,
                 {.op = op})
            ->wait();
        note(errors, what, out, r == root ? ar[o].want : poisoned);
        note(errors, what + " (send kept)", in, mine);
      }
    }
  }

  {
    std::vector<T> send(per_rank * un), want(per_rank * un), out(per_rank * un);
    for (int j = 0; j < n; ++j)
      for (std::size_t i = 0; i < per_rank; ++i) {
        send[static_cast<std::size_t>(j) * per_rank + i] = value<T>(r, j, i);
        want[static_cast<std::size_t>(j) * per_rank + i] = value<T>(j, r, i);
      }
    poison(out);
    if (in_place) {
      c.all_to_all(comm::view(std::span<T>(send)))->wait();
      note(errors, "all_to_all", send, want);
    } else {
      c.all_to_all(comm::cview(std::span<const T>(send)), comm::view(std::span<T>(out)))->wait();
      note(errors, "all_to_all", out, want);
    }
  }

  {
    std::vector<std::size_t> sc(un), rc(un);
    for (int j = 0; j < n; ++j) {
      sc[static_cast<std::size_t>(j)] = split_size(r, j, count);
      rc[static_cast<std::size_t>(j)] = split_size(j, r, count);
    }
    std::vector<T> send, want;
    for (int j = 0; j < n; ++j) {
      for (std::size_t i = 0; i < sc[static_cast<std::size_t>(j)]; ++i)
        send.push_back(value<T>(r, j, i));
      for (std::size_t i = 0; i < rc[static_cast<std::size_t>(j)]; ++i)
        want.push_back(value<T>(j, r, i));
    }
    const std::size_t len = std::max(send.size(), want.size());
    send.resize(len);
    std::vector<T> out(len);
    poison(out);
    if (in_place) {
      c.all_to_all_v(comm::view(std::span<T>(send)), sc, comm::view(std::span<T>(send)), rc)
          ->wait();
      note(errors, "all_to_all_v", send, want);
    } else {
      c.all_to_all_v(comm::cview(std::span<const T>(send)), sc, comm::view(std::span<T>(out)), rc)
          ->wait();
      note(errors, "all_to_all_v", out, want);
    }
  }
  c.barrier()->wait();
  return errors;
}

// On values whose sums round (f32, bf16), the root's reduce equals all_reduce bit for bit; the
// other ranks may pass an empty recv.
TEST(Reduce, RootGetsAllReducesBitsAndOthersAnEmptyRecvIsFine) {
  constexpr int n = 5;
  constexpr std::size_t count = 1000;
  for (comm::DType dt : {comm::DType::f32, comm::DType::bf16}) {
    std::vector<std::string> errors(n);
    comm::visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      sim::SimWorld(n).run([&](Communicator& c) {
        std::vector<T> in(count), all(count), red(count);
        for (std::size_t k = 0; k < count; ++k)
          in[k] = T(static_cast<float>(std::sin(0.37 * static_cast<double>(k) + c.rank()) * 1e3));
        c.all_reduce(comm::cview(std::span<const T>(in)), comm::view(std::span<T>(all)),
                     {.op = ReduceOp::avg})
            ->wait();
        const int root = 3;
        if (c.rank() == root)
          c.reduce(comm::cview(std::span<const T>(in)), comm::view(std::span<T>(red)), root,
                   {.op = ReduceOp::avg})
              ->wait();
        else
          c.reduce(comm::cview(std::span<const T>(in)), comm::Buffer{nullptr, 0, dt, {}}, root,
                   {.op = ReduceOp::avg})
              ->wait();
        if (c.rank() == root && count_bitwise_diff(red.data(), all.data(), count) != 0)
          errors[static_cast<std::size_t>(c.rank())] = "reduce differs from all_reduce";
      });
    });
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << comm::name_of(dt) << " rank " << r;
  }
}

class Collectives : public ::testing::TestWithParam<std::tuple<int, std::size_t, bool>> {};

TEST_P(Collectives, EveryOpEveryDtypeMatchesTheExactResult) {
  const auto [world, count, in_place] = GetParam();
  sim::SimWorld w(world);
  for (comm::DType dt : comm::kAllDTypes) {
    std::vector<std::vector<std::string>> errors(static_cast<std::size_t>(world));
    comm::visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      const std::size_t per_rank = count > 13 ? count / static_cast<std::size_t>(world) : count;
      const auto ar = reductions<T>(world, count);
      const auto rs = reductions<T>(world, per_rank * static_cast<std::size_t>(world));
      w.run([&](Communicator& c) {
        errors[static_cast<std::size_t>(c.rank())] = check_all_ops<T>(c, count, in_place, ar, rs);
      });
    });
    for (int r = 0; r < world; ++r)
      for (const auto& e : errors[static_cast<std::size_t>(r)])
        ADD_FAILURE() << "dtype " << comm::name_of(dt) << ", rank " << r << ": " << e;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldCountInPlace, Collectives,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 7, 8, 16),
                                            ::testing::Values(std::size_t{0}, std::size_t{1},
                                                              std::size_t{13},
                                                              std::size_t{1} << 16),
                                            ::testing::Bool()),
                         [](const auto& p) {
                           return "n" + std::to_string(std::get<0>(p.param)) + "_count" +
                                  std::to_string(std::get<1>(p.param)) +
                                  (std::get<2>(p.param) ? "_inplace" : "_outofplace");
                         });

}  // namespace
}  // namespace shardcheck::testing
