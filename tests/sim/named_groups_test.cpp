// Id-keyed groups (SimCommunicator::group, what torch.distributed's new_group maps onto): built by
// the members alone without a collective, the same group for every member that names the id,
// refused with the id named when members disagree or a rank is not a member, and a member that
// never joins is a deadlock that names it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/errors.hpp"
#include "sim/communicator.hpp"
#include "sim/world.hpp"
#include "tests/sim/failure_support.hpp"

namespace shardcheck::testing {
namespace {

using comm::Communicator;

sim::SimCommunicator& as_sim(Communicator& c) { return dynamic_cast<sim::SimCommunicator&>(c); }

TEST(NamedGroups, MembersAloneReduceInGroupRankOrder) {
  sim::SimWorld w(4);
  w.run([](Communicator& c) {
    if (c.rank() == 1) return;  // not a member: builds nothing, calls nothing
    const std::vector<int> members{3, 0, 2};
    auto g = as_sim(c).group("7", members, "pg");
    EXPECT_EQ(g->size(), 3);
    EXPECT_EQ(g->members(), members);
    EXPECT_EQ(g->rank(), c.rank() == 3 ? 0 : c.rank() == 0 ? 1 : 2);
    EXPECT_EQ(g->name(), "pg[3,0,2]");
    std::vector<double> x{double(c.rank())};
    g->all_reduce(comm::view(std::span<double>(x)))->wait();
    EXPECT_EQ(x[0], 5.0);
    // The same id again is the same group: its sequence numbers go on.
    auto again = as_sim(c).group("7", members, "pg");
    std::vector<double> y{1.0};
    again->all_reduce(comm::view(std::span<double>(y)))->wait();
    EXPECT_EQ(y[0], 3.0);
  });
}

TEST(NamedGroups, DisagreeingMembersNameTheId) {
  auto [f, e] = expect_failure<comm::InvalidArgument>(2, [](Communicator& c) {
    if (c.rank() == 0) {
      (void)as_sim(c).group("x", {0, 1}, "pg");
    } else {
      (void)as_sim(c).group("y", {1}, "solo");  // first, so that "x" is rank 0's alone
      (void)as_sim(c).group("x", {1, 0}, "pg");
    }
  });
  EXPECT_NE(std::string(e.what()).find("group id 'x' was registered with members"),
            std::string::npos)
      << e.what();
}

TEST(NamedGroups, NonMemberAndBadRanksAreRefused) {
  auto [f, e] = expect_failure<comm::InvalidArgument>(2, [](Communicator& c) {
    if (c.rank() == 0) (void)as_sim(c).group("a", {1}, "pg");
  });
  EXPECT_NE(std::string(e.what()).find("rank 0 is not among the members [1]"), std::string::npos)
      << e.what();
  auto [f2, e2] = expect_failure<comm::InvalidArgument>(2, [](Communicator& c) {
    (void)as_sim(c).group("b", {c.rank(), 2}, "pg");
  });
  EXPECT_NE(std::string(e2.what()).find("not distinct world ranks in [0, 2)"), std::string::npos)
      << e2.what();
}

TEST(NamedGroups, AMemberThatNeverJoinsIsADeadlockNamingIt) {
  auto [f, e] = expect_failure<comm::DeadlockError>(3, [](Communicator& c) {
    if (c.rank() == 2) return;  // a member of the group below that never builds it
    auto g = as_sim(c).group("g", {0, 1, 2}, "pg");
    std::vector<float> x{1.0f};
    g->all_reduce(comm::view(std::span<float>(x)))->wait();
  });
  EXPECT_EQ(e.missing(), std::vector<int>{2});
}

}  // namespace
}  // namespace shardcheck::testing
