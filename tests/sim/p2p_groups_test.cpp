// Point-to-point matching (order, tags, self, mismatch) and sub-groups: split colors and keys,
// DeviceMesh groups built by splitting the world, and concurrent collectives on disjoint groups.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "comm/errors.hpp"
#include "comm/mesh.hpp"
#include "sim/world.hpp"

namespace shardcheck::testing {
namespace {

using comm::Communicator;

TEST(P2P, RingExchangeDeliversInOrderPerTag) {
  for (int n : {1, 2, 3, 8}) {
    sim::SimWorld w(n);
    w.run([n](Communicator& c) {
      const int next = (c.rank() + 1) % n, prev = (c.rank() + n - 1) % n;
      std::vector<double> a{double(c.rank()), 1.0}, b{double(c.rank()), 2.0}, ra(2), rb(2);
      // Post everything first, then wait: the pattern pipeline schedules use (batch_isend_irecv).
      auto s1 = c.send(comm::view(std::span<double>(a)), next, {.tag = 7});
      auto s2 = c.send(comm::view(std::span<double>(b)), next, {.tag = 7});
      auto r1 = c.recv(comm::view(std::span<double>(ra)), prev, {.tag = 7});
      auto r2 = c.recv(comm::view(std::span<double>(rb)), prev, {.tag = 7});
      for (auto* wk : {&s1, &s2, &r1, &r2}) (*wk)->wait();
      EXPECT_EQ(ra, (std::vector<double>{double(prev), 1.0}));
      EXPECT_EQ(rb, (std::vector<double>{double(prev), 2.0}));
      EXPECT_TRUE(s1->is_completed());
    });
  }
}

TEST(P2P, TagsMatchIndependently) {
  sim::SimWorld w(2);
  w.run([](Communicator& c) {
    std::vector<int> x(1), y(1);
    if (c.rank() == 0) {
      std::vector<int> a{1}, b{2};
      auto s1 = c.send(comm::view(std::span<int>(a)), 1, {.tag = 1});
      auto s2 = c.send(comm::view(std::span<int>(b)), 1, {.tag = 2});
      s1->wait();
      s2->wait();
    } else {
      c.recv(comm::view(std::span<int>(y)), 0, {.tag = 2})->wait();  // tag 2 first
      c.recv(comm::view(std::span<int>(x)), 0, {.tag = 1})->wait();
      EXPECT_EQ(x[0], 1);
      EXPECT_EQ(y[0], 2);
    }
  });
}

TEST(P2P, CountMismatchIsTyped) {
  sim::SimWorld w(2);
  EXPECT_THROW(
      {
        try {
          w.run([](Communicator& c) {
            std::vector<float> v(c.rank() == 0 ? 3 : 4);
            if (c.rank() == 0)
              c.send(comm::view(std::span<float>(v)), 1)->wait();
            else
              c.recv(comm::view(std::span<float>(v)), 0)->wait();
          });
        } catch (const sim::RankFailure& f) {
          f.rethrow_cause();
        }
      },
      comm::MismatchError);
}

TEST(Groups, SplitOrdersByKeyAndSkipsNegativeColors) {
  sim::SimWorld w(6);
  w.run([](Communicator& c) {
    const int r = c.rank();
    auto g = c.split(r == 5 ? -1 : r % 2, -r, {.name = "parity"});  // reverse order by key
    if (r == 5) {
      EXPECT_EQ(g, nullptr);
      return;
    }
    ASSERT_NE(g, nullptr);
    const std::vector<int> want = r % 2 ? std::vector<int>{3, 1} : std::vector<int>{4, 2, 0};
    EXPECT_EQ(g->members(), want);
    EXPECT_EQ(g->world_rank(), r);
    std::vector<int> v{r};
    g->all_reduce(std::span<int>(v))->wait();
    EXPECT_EQ(v[0], std::accumulate(want.begin(), want.end(), 0));
  });
}

TEST(Groups, MeshGroupsReduceOnlyOverTheirMembers) {
  const comm::DeviceMesh mesh({.dp = 2, .tp = 2, .pp = 2});
  sim::SimWorld w(mesh.world_size());
  w.run([&](Communicator& c) {
    comm::MeshGroups g = comm::build_groups(mesh, c);
    for (comm::Axis a : comm::kAllAxes) {
      const std::vector<int> members = mesh.group(c.rank(), a);
      EXPECT_EQ(g.get(a).members(), members) << comm::name_of(a);
      std::vector<std::int64_t> v{std::int64_t{1} << c.rank()};
      g.get(a).all_reduce(std::span<std::int64_t>(v))->wait();
      std::int64_t want = 0;
      for (int m : members) want += std::int64_t{1} << m;
      EXPECT_EQ(v[0], want) << comm::name_of(a);
    }
  });
}

TEST(Groups, DisjointGroupsRunConcurrently) {
  // Each half runs a different number of collectives on its own group while the other half is busy:
  // they must not wait for each other (a global barrier per op would deadlock here).
  sim::SimWorld w(4);
  w.run([](Communicator& c) {
    auto half = c.split(c.rank() / 2, c.rank());
    std::vector<float> v(64, 1.0f);
    const int rounds = c.rank() < 2 ? 5 : 50;
    for (int i = 0; i < rounds; ++i)
      half->all_reduce(comm::view(std::span<float>(v)), {.op = comm::ReduceOp::avg})->wait();
    c.barrier()->wait();
    EXPECT_EQ(v[0], 1.0f);
  });
}

}  // namespace
}  // namespace shardcheck::testing
