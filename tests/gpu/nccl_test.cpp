// NcclCommunicator at every world size the machine offers (1 .. visible GPUs, single-process mode):
// every op out of place and in place, on device buffers with poisoned outputs, host buffers
// staged, split, p2p, and the failure paths (bad arguments, count mismatch, a hung peer).
// Every test skips with a clear message when no GPU is visible.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <thread>

#include "comm/errors.hpp"
#include "gpu/bootstrap.hpp"
#include "tests/gpu/support.hpp"

namespace shardcheck::gpu {
namespace {

using testing::DeviceVec;
using testing::world_sizes;

constexpr std::size_t kCount = 1000;  // not a multiple of anything convenient

// A rank whose ASSERT fails returns early and leaves its peers waiting in their next collective:
// a one-minute timeout (not the default five) turns that into a prompt PeerError.
NcclOptions test_options() {
  NcclOptions o;
  o.timeout = std::chrono::seconds(60);
  return o;
}

void run(int p, const std::function<void(NcclCommunicator&)>& fn, NcclOptions o = test_options()) {
  run_all_gpus(p, fn, o);
}

// Rank r's value at i: small integers, so f32 sums and products are exact.
double value(int r, std::size_t i) {
  return static_cast<double>((r + 1) * (static_cast<int>(i % 5) + 1));
}

template <class T>
std::vector<T> contribution(int r, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(value(r, i));
  return v;
}

double expected(comm::ReduceOp op, int p, std::size_t i, bool integer) {
  double acc = value(0, i);
  for (int r = 1; r < p; ++r) {
    const double x = value(r, i);
    switch (op) {
      case comm::ReduceOp::sum:
      case comm::ReduceOp::avg:
        acc += x;
        break;
      case comm::ReduceOp::max:
        acc = std::max(acc, x);
        break;
      case comm::ReduceOp::min:
        acc = std::min(acc, x);
        break;
      case comm::ReduceOp::prod:
        acc *= x;
        break;
    }
  }
  if (op == comm::ReduceOp::avg) acc = integer ? std::trunc(acc / p) : acc / p;
  return acc;
}

constexpr comm::ReduceOp kOps[] = {comm::ReduceOp::sum, comm::ReduceOp::avg, comm::ReduceOp::max,
                                   comm::ReduceOp::min, comm::ReduceOp::prod};

template <class T>
void check_all_reduce(bool in_place) {
  for (int p : world_sizes()) {
    run(p, [&](NcclCommunicator& c) {
      for (comm::ReduceOp op : kOps) {
        const std::size_t n = op == comm::ReduceOp::prod ? 16 : kCount;
        DeviceVec<T> send(contribution<T>(c.rank(), n));
        DeviceVec<T> recv(n);
        recv.poison();
        DeviceVec<T>& out = in_place ? send : recv;
        if (in_place)
          c.all_reduce(send.buf(c.device()), {op})->wait();
        else
          c.all_reduce(send.cbuf(c.device()), recv.buf(c.device()), {op})->wait();
        const std::vector<T> got = out.download();
        for (std::size_t i = 0; i < n; ++i) {
          double want = expected(op, p, i, std::is_integral_v<T>);
          // Integer prod wraps modulo 2^bits (8 ranks: 5^8 * 8! > 2^31 for i32).
          if constexpr (std::is_integral_v<T>)
            want = static_cast<double>(static_cast<T>(static_cast<std::int64_t>(want)));
          ASSERT_NEAR(static_cast<double>(got[i]), want, 1e-6 * std::abs(want))
              << "op " << comm::name_of(op) << " p " << p << " i " << i;
        }
      }
    });
  }
}

TEST(Nccl, AllReduceF32EveryOp) {
  SC_REQUIRE_GPU();
  check_all_reduce<float>(false);
  check_all_reduce<float>(true);
}

TEST(Nccl, AllReduceF64AndI32) {
  SC_REQUIRE_GPU();
  check_all_reduce<double>(false);
  check_all_reduce<std::int32_t>(false);
  check_all_reduce<std::int64_t>(true);
}

TEST(Nccl, AllReduceBf16RoundsOnceFromF32) {
  SC_REQUIRE_GPU();
  for (int p : world_sizes()) {
    run(p, [&](NcclCommunicator& c) {
      // Each rank adds 1 + 2^-7 (exact in bf16); the f32 sum is exact and rounds once to bf16.
      std::vector<comm::bf16> h(64, comm::bf16(1.0F + 1.0F / 128));
      DeviceVec<comm::bf16> buf(h);
      c.all_reduce(buf.buf(c.device()))->wait();
      const float want =
          static_cast<float>(comm::bf16(static_cast<float>(p) * (1.0F + 1.0F / 128)));
      for (const comm::bf16 v : buf.download()) ASSERT_EQ(static_cast<float>(v), want) << "p " << p;
    });
  }
}

TEST(Nccl, ReduceScatterAndAllGather) {
  SC_REQUIRE_GPU();
  for (int p : world_sizes()) {
    run(p, [&](NcclCommunicator& c) {
      const auto pp = static_cast<std::size_t>(p);
      const auto me = static_cast<std::size_t>(c.rank());
      DeviceVec<float> send(contribution<float>(c.rank(), kCount * pp));
      DeviceVec<float> chunk(kCount);
      chunk.poison();
      c.reduce_scatter(send.cbuf(c.device()), chunk.buf(c.device()))->wait();
      std::vector<float> got = chunk.download();
      for (std::size_t i = 0; i < kCount; ++i)
        ASSERT_EQ(got[i], expected(comm::ReduceOp::sum, p, me * kCount + i, false)) << i;
      c.reduce_scatter(send.buf(c.device()))->wait();  // in place: lands at [rank*c, (rank+1)*c)
      const std::vector<float> whole = send.download();
      for (std::size_t i = 0; i < kCount; ++i) ASSERT_EQ(whole[me * kCount + i], got[i]) << i;

      DeviceVec<float> gathered(kCount * pp);
      gathered.poison();
      c.all_gather(chunk.cbuf(c.device()), gathered.buf(c.device()))->wait();
      got = gathered.download();
      for (std::size_t i = 0; i < kCount * pp; ++i)
        ASSERT_EQ(got[i], expected(comm::ReduceOp::sum, p, i, false)) << i;
      DeviceVec<float> inplace(kCount * pp);
      inplace.poison();
      cudaMemcpy(inplace.data() + me * kCount, chunk.data(), kCount * 4, cudaMemcpyDeviceToDevice);
      cudaDeviceSynchronize();  // the default stream's copy, before the comm stream reads it
      c.all_gather(inplace.buf(c.device()))->wait();
      ASSERT_EQ(inplace.download(), got);
    });
  }
}

TEST(Nccl, BroadcastFromEveryRoot) {
  SC_REQUIRE_GPU();
  for (int p : world_sizes()) {
    run(p, [&](NcclCommunicator& c) {
      for (int root = 0; root < p; ++root) {
        DeviceVec<double> send(contribution<double>(c.rank(), kCount));
        DeviceVec<double> recv(kCount);
        recv.poison();
        c.broadcast(send.cbuf(c.device()), recv.buf(c.device()), {root})->wait();
        ASSERT_EQ(recv.download(), contribution<double>(root, kCount)) << "root " << root;
        c.broadcast(send.buf(c.device()), {root})->wait();
        ASSERT_EQ(send.download(), contribution<double>(root, kCount)) << "root " << root;
      }
    });
  }
}

TEST(Nccl, AllToAllEqualAndVariable) {
  SC_REQUIRE_GPU();
  for (int p : world_sizes()) {
    run(p, [&](NcclCommunicator& c) {
      const auto pp = static_cast<std::size_t>(p);
      const int me = c.rank();
      // Equal splits: element i of chunk j from rank r is 1000*r + 10*j + i.
      const std::size_t per = 7;
      std::vector<std::int32_t> h(per * pp);
      for (std::size_t j = 0; j < pp; ++j)
        for (std::size_t i = 0; i < per; ++i)
          h[j * per + i] =
              static_cast<std::int32_t>(1000 * me + 10 * static_cast<int>(j) + static_cast<int>(i));
      std::vector<std::int32_t> want(per * pp);
      for (std::size_t r = 0; r < pp; ++r)
        for (std::size_t i = 0; i < per; ++i)
          want[r * per + i] =
              static_cast<std::int32_t>(1000 * static_cast<int>(r) + 10 * me + static_cast<int>(i));
      DeviceVec<std::int32_t> send(h);
      DeviceVec<std::int32_t> recv(h.size());
      recv.poison();
      c.all_to_all(send.cbuf(c.device()), recv.buf(c.device()))->wait();
      ASSERT_EQ(recv.download(), want);
      c.all_to_all(send.buf(c.device()))->wait();
      ASSERT_EQ(send.download(), want);

      // Variable splits: rank r sends (r + j) % 3 elements to rank j, valued 100*r + j.
      std::vector<std::size_t> sc(pp), rc(pp);
      std::vector<float> sh, wanth;
      for (std::size_t j = 0; j < pp; ++j) {
        sc[j] = (static_cast<std::size_t>(me) + j) % 3;
        rc[j] = (j + static_cast<std::size_t>(me)) % 3;
        sh.insert(sh.end(), sc[j], static_cast<float>(100 * me + static_cast<int>(j)));
        wanth.insert(wanth.end(), rc[j], static_cast<float>(100 * static_cast<int>(j) + me));
      }
      DeviceVec<float> vs(sh.empty() ? std::vector<float>{0} : sh);
      DeviceVec<float> vr(std::max<std::size_t>(wanth.size(), 1));
      vr.poison();
      c.all_to_all_v(vs.cbuf(c.device()), sc, vr.buf(c.device()), rc)->wait();
      const std::vector<float> got = vr.download();
      for (std::size_t i = 0; i < wanth.size(); ++i) ASSERT_EQ(got[i], wanth[i]) << i;
    });
  }
}

TEST(Nccl, SendRecvRingPostedBeforeWaiting) {
  SC_REQUIRE_GPU();
  for (int p : world_sizes()) {
    run(p, [&](NcclCommunicator& c) {
      const int next = (c.rank() + 1) % p;
      const int prev = (c.rank() + p - 1) % p;
      // Large enough that an unbatched send would block without its receive.
      const std::size_t n = 1 << 20;
      DeviceVec<float> out(contribution<float>(c.rank(), n));
      DeviceVec<float> in(n);
      in.poison();
      auto s = c.send(out.cbuf(c.device()), next);
      auto r = c.recv(in.buf(c.device()), prev);
      s->wait();
      r->wait();
      EXPECT_TRUE(r->is_completed());
      ASSERT_EQ(in.download(), contribution<float>(prev, n));
      // Host buffers, the send's Work dropped before anything launched it: its staging must live
      // until the held group is enqueued (by the recv's wait), and the data still arrives.
      const std::vector<float> hs = contribution<float>(c.rank() + 10, 4096);
      std::vector<float> hr(hs.size(), std::nanf(""));
      (void)c.send(comm::cview(std::span<const float>(hs)), next);
      c.recv(comm::view(std::span<float>(hr)), prev)->wait();
      ASSERT_EQ(hr, contribution<float>(prev + 10, hs.size()));
    });
  }
}

TEST(Nccl, HostBuffersAreStaged) {
  SC_REQUIRE_GPU();
  for (int p : world_sizes()) {
    run(p, [&](NcclCommunicator& c) {
      std::vector<float> h = contribution<float>(c.rank(), kCount);
      std::vector<float> out(kCount, std::nanf(""));
      c.all_reduce(std::span<const float>(h), std::span<float>(out))->wait();
      for (std::size_t i = 0; i < kCount; ++i)
        ASSERT_EQ(out[i], expected(comm::ReduceOp::sum, p, i, false));
      c.all_reduce(std::span<float>(h), {comm::ReduceOp::max})->wait();
      for (std::size_t i = 0; i < kCount; ++i)
        ASSERT_EQ(h[i], expected(comm::ReduceOp::max, p, i, false));
      c.barrier()->wait();
    });
  }
}

TEST(Nccl, SplitFormsGroupsByColorOrderedByKey) {
  SC_REQUIRE_GPU();
  for (int p : world_sizes()) {
    run(p, [&](NcclCommunicator& c) {
      const int color = c.rank() % 2;
      auto sub = c.split(color, -c.rank(), {"parity"});  // reversed order by key
      ASSERT_NE(sub, nullptr);
      std::vector<int> want;
      for (int r = p - 1; r >= 0; --r)
        if (r % 2 == color) want.push_back(r);
      EXPECT_EQ(sub->members(), want);
      EXPECT_EQ(sub->world_rank(), c.rank());
      std::vector<float> one{1.0F};
      sub->all_reduce(std::span<float>(one))->wait();
      EXPECT_EQ(one[0], static_cast<float>(want.size()));
      EXPECT_EQ(&sub->memory(), &c.memory());  // one set of books per world rank
      auto none = c.split(c.rank() == 0 ? -1 : 0, c.rank());
      EXPECT_EQ(none == nullptr, c.rank() == 0);
    });
  }
}

TEST(Nccl, BadArgumentsAreInvalidArgumentWithRankOpSeq) {
  SC_REQUIRE_GPU();
  run(1, [&](NcclCommunicator& c) {
    DeviceVec<float> a(8), b(9);
    try {
      (void)c.all_reduce(a.cbuf(c.device()), b.buf(c.device()));
      FAIL() << "no error";
    } catch (const comm::InvalidArgument& e) {
      EXPECT_EQ(e.context().op, "all_reduce");
      EXPECT_EQ(e.context().rank, 0);
      EXPECT_NE(std::string(e.what()).find("seq 0"), std::string::npos) << e.what();
    }
    EXPECT_THROW((void)c.broadcast(a.buf(c.device()), {3}), comm::InvalidArgument);
    EXPECT_THROW((void)c.send(a.cbuf(c.device()), 1), comm::InvalidArgument);
  });
}

TEST(Nccl, AllToAllVCountMismatchIsAMismatchErrorOnEveryRank) {
  SC_REQUIRE_GPU();
  if (visible_devices() < 2) GTEST_SKIP() << "needs 2 GPUs";
  std::atomic<int> mismatches{0};
  EXPECT_THROW(run(2,
                   [&](NcclCommunicator& c) {
                     DeviceVec<float> s(8), r(8);
                     std::vector<std::size_t> sc{2, 2};
                     std::vector<std::size_t> rc{2, c.rank() == 0 ? 3U : 2U};
                     try {
                       (void)c.all_to_all_v(s.cbuf(c.device()), sc, r.buf(c.device()), rc);
                     } catch (const comm::MismatchError&) {
                       ++mismatches;
                       throw;
                     }
                   }),
               RankFailure);
  EXPECT_EQ(mismatches.load(), 2);
}

TEST(Nccl, SignatureCheckPassesMatchingCallsAndNamesAMismatch) {
  SC_REQUIRE_GPU();
  NcclOptions o = test_options();
  o.check_signatures = true;
  for (int p : world_sizes()) {  // matching calls: the check is invisible
    run(
        p,
        [&](NcclCommunicator& c) {
          DeviceVec<float> x(contribution<float>(c.rank(), 64));
          c.all_reduce(x.buf(c.device()))->wait();
          c.broadcast(x.buf(c.device()), {p - 1})->wait();
          c.barrier()->wait();
          EXPECT_EQ(x.download(), [&] {
            std::vector<float> w(64);
            for (std::size_t i = 0; i < w.size(); ++i)
              w[i] = static_cast<float>(expected(comm::ReduceOp::sum, p, i, false));
            return w;
          }());
        },
        o);
  }
  if (visible_devices() < 2) GTEST_SKIP() << "the mismatch half needs 2 GPUs";
  std::atomic<int> mismatches{0};
  EXPECT_THROW(run(
                   2,
                   [&](NcclCommunicator& c) {
                     DeviceVec<float> x(c.rank() == 0 ? 64 : 65);
                     try {
                       (void)c.all_reduce(x.buf(c.device()));
                     } catch (const comm::MismatchError& e) {
                       EXPECT_EQ(e.ranks(), (std::vector<int>{0, 1}));
                       EXPECT_NE(std::string(e.what()).find("count"), std::string::npos);
                       ++mismatches;
                       throw;
                     }
                   },
                   o),
               RankFailure);
  EXPECT_EQ(mismatches.load(), 2);
}

TEST(Nccl, HungPeerTimesOutAsPeerErrorNotAHang) {
  SC_REQUIRE_GPU();
  if (visible_devices() < 2) GTEST_SKIP() << "needs 2 GPUs";
  NcclOptions o = test_options();
  o.timeout = std::chrono::milliseconds(3000);
  std::atomic<bool> rank0_done{false};
  try {
    run_all_gpus(
        2,
        [&](NcclCommunicator& c) {
          if (c.rank() == 1) {  // never joins, but keeps its communicator (and the buffers rank
            while (!rank0_done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
            return;  // 0's kernel may touch) alive until rank 0 has aborted
          }
          try {
            DeviceVec<float> x(1024);
            c.all_reduce(x.buf(c.device()))->wait();
          } catch (...) {
            rank0_done = true;
            throw;
          }
          rank0_done = true;
        },
        o);
    FAIL() << "no error";
  } catch (const RankFailure& f) {
    EXPECT_EQ(f.rank(), 0);
    EXPECT_THROW(std::rethrow_exception(f.cause()), comm::PeerError);
    EXPECT_NE(std::string(f.what()).find("all_reduce"), std::string::npos) << f.what();
  }
  // Reaching here is the point: a hang would be caught by ctest's timeout, not by a clock here.
}

}  // namespace
}  // namespace shardcheck::gpu
