// The trace files `run --report` writes (harness/trace.hpp): every event carries the Chrome Trace
// Event Format's required fields (name, ph, pid, tid; ts and dur on complete events; the scope of
// instant events), a process per rank and a thread per stream are named, each rank's steps are
// marked, a pipeline's sends and receives are on their own thread, and an injected hang shows as
// a fault event on the rank it names. nlohmann::json parses each file whole. Goodput leaves out a
// skipped step's tokens; the step phases name a straggler.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/harness/cli_support.hpp"

namespace shardcheck::harness {
namespace {

namespace fs = std::filesystem;
using shardcheck::testing::kScenarios;
using shardcheck::testing::read_json;
using shardcheck::testing::shardcheck;
using shardcheck::testing::TempDir;

// Checks the format of every event of `trace`; returns the events per (category, pid).
std::map<std::pair<std::string, int>, int> check_format(const nlohmann::json& trace, int ranks) {
  std::map<std::pair<std::string, int>, int> seen;
  std::set<std::pair<int, int>> named_threads;
  std::set<int> named_processes;
  EXPECT_EQ(trace.at("displayTimeUnit"), "ms");
  for (const auto& e : trace.at("traceEvents")) {
    EXPECT_TRUE(e.at("name").is_string()) << e.dump();
    const std::string ph = e.at("ph").get<std::string>();
    const int pid = e.at("pid").get<int>();
    EXPECT_TRUE(e.at("tid").is_number_integer()) << e.dump();
    EXPECT_GE(pid, 0);
    EXPECT_LT(pid, ranks);
    if (ph == "M") {
      if (e.at("name") == "process_name") named_processes.insert(pid);
      if (e.at("name") == "thread_name") named_threads.insert({pid, e.at("tid").get<int>()});
      EXPECT_TRUE(e.at("args").is_object()) << e.dump();
      continue;
    }
    EXPECT_TRUE(e.at("ts").is_number()) << e.dump();
    EXPECT_GE(e.at("ts").get<double>(), 0.0) << e.dump();
    EXPECT_TRUE(e.at("cat").is_string()) << e.dump();
    if (ph == "X") {
      EXPECT_GE(e.at("dur").get<double>(), 0.0) << e.dump();
      EXPECT_TRUE(e.at("args").contains("step")) << e.dump();
    } else {
      EXPECT_EQ(ph, "i") << e.dump();
      const std::string scope = e.at("s").get<std::string>();
      EXPECT_TRUE(scope == "g" || scope == "p" || scope == "t") << e.dump();
    }
    ++seen[{e.at("cat").get<std::string>(), pid}];
  }
  EXPECT_EQ(named_processes.size(), static_cast<std::size_t>(ranks));
  EXPECT_GE(named_threads.size(), static_cast<std::size_t>(3 * ranks));
  // Every event on a named thread; a thread's complete events never overlap (Perfetto would
  // report them as misnested slices).
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> slices;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M") continue;
    const std::pair<int, int> thread{e.at("pid").get<int>(), e.at("tid").get<int>()};
    EXPECT_TRUE(named_threads.count(thread)) << e.dump();
    if (e.at("ph") == "X")
      slices[thread].emplace_back(e.at("ts").get<double>(),
                                  e.at("ts").get<double>() + e.at("dur").get<double>());
  }
  for (auto& [thread, v] : slices) {
    std::sort(v.begin(), v.end());
    for (std::size_t i = 1; i < v.size(); ++i)
      EXPECT_GE(v[i].first, v[i - 1].second - 1e-6)
          << "pid " << thread.first << " tid " << thread.second << " event at " << v[i].first;
  }
  return seen;
}

// How many events of category `cat` rank `pid` has in check_format's count (0 when none).
int count_of(const std::map<std::pair<std::string, int>, int>& seen, const char* cat, int pid) {
  const auto it = seen.find({cat, pid});
  return it == seen.end() ? 0 : it->second;
}

TEST(Trace, APipelineRunWritesOneWellFormedTracePerConfiguration) {
  TempDir dir("trace_pp");
  const auto [code, out] =
      shardcheck("run " + kScenarios + "/parity/mp_pp.json --report " + dir.path().string());
  ASSERT_EQ(code, 0) << out;
  const auto report = read_json(dir.path() / "report.json");
  for (const auto& row : report.at("parity")) {
    const auto trace = read_json(dir.path() / row.at("trace").at("file").get<std::string>());
    const int ranks = row.at("world_size").get<int>();
    const auto seen = check_format(trace, ranks);
    std::size_t complete = 0;
    for (const auto& [key, n] : seen)
      if (key.first != "step" && key.first != "fault") complete += static_cast<std::size_t>(n);
    EXPECT_EQ(complete, row.at("trace").at("events").get<std::size_t>()) << row.at("config");
    for (int r = 0; r < ranks; ++r) {
      // each step's start, and the harness's final gather after the last
      EXPECT_EQ(count_of(seen, "step", r), report.at("manifest").at("steps").get<int>() + 1)
          << row.at("config") << " rank " << r;
      EXPECT_GT(count_of(seen, "compute", r), 0);
      if (row.at("mesh").at("pp").get<int>() > 1) {
        EXPECT_GT(count_of(seen, "p2p", r), 0) << row.at("config");
      }
    }
  }
}

TEST(Trace, AnInjectedHangIsAFaultEventOnTheRankItNames) {
  TempDir dir("trace_hang");
  const auto [code, out] =
      shardcheck("run " + kScenarios + "/faults/hang.json --report " + dir.path().string());
  ASSERT_EQ(code, 0) << out;
  const auto report = read_json(dir.path() / "report.json");
  const auto& row = report.at("parity")[0];
  const auto trace = read_json(dir.path() / row.at("trace").at("file").get<std::string>());
  const auto seen = check_format(trace, row.at("world_size").get<int>());
  ASSERT_FALSE(row.at("faults").empty());
  for (int r : row.at("faults")[0].at("ranks"))
    EXPECT_GT(count_of(seen, "fault", r), 0) << "rank " << r;
}

// Goodput beside the raw throughput: the step the non-finite policy skips processed its tokens
// for nothing; a clean run's goodput is all its tokens.
TEST(Goodput, ASkippedStepsTokensDoNotAdvanceTraining) {
  TempDir dir("goodput_skip");
  const auto [code, out] =
      shardcheck("run " + kScenarios + "/faults/nan_gradient.json --report " + dir.path().string());
  ASSERT_EQ(code, 0) << out;
  const auto g = read_json(dir.path() / "report.json").at("parity")[0].at("goodput");
  const double processed = g.at("tokens_processed").get<double>();
  const double skipped = g.at("tokens_skipped").get<double>();
  EXPECT_GT(skipped, 0.0);
  EXPECT_LT(skipped, processed);  // one step of three
  EXPECT_EQ(g.at("tokens_good").get<double>(), processed - skipped);
  EXPECT_NEAR(g.at("fraction").get<double>(), (processed - skipped) / processed, 1e-12);
  EXPECT_LT(g.at("good_tokens_per_s").get<double>(), g.at("tokens_per_s").get<double>());

  TempDir clean("goodput_clean");
  const auto [code2, out2] = shardcheck("run " + kScenarios + "/parity/ddp_overlap.json --report " +
                                        clean.path().string());
  ASSERT_EQ(code2, 0) << out2;
  const auto report = read_json(clean.path() / "report.json");  // outlives the loop
  for (const auto& row : report.at("parity"))
    EXPECT_EQ(row.at("goodput").at("fraction").get<double>(), 1.0) << row.at("config");
}

// Step phases per rank: a 3x straggler (rank 3 of DDP 4) has the most forward and backward time,
// and the others wait for it in the gradient all_reduce (exposed communication), so the slowest
// rank of that phase is another one.
TEST(StepPhases, AStragglerIsTheSlowestRankOfItsComputePhases) {
  TempDir dir("phases_straggler");
  const auto [code, out] =
      shardcheck("run " + kScenarios + "/faults/straggler.json --report " + dir.path().string());
  ASSERT_EQ(code, 0) << out;
  const auto ph = read_json(dir.path() / "report.json").at("parity")[0].at("phases");
  for (const char* p : {"forward", "backward"}) {
    EXPECT_EQ(ph.at(p).at("slowest_rank"), 3) << p;
    EXPECT_GT(ph.at(p).at("max").get<double>(), 1.5 * ph.at(p).at("p50").get<double>()) << p;
  }
  EXPECT_NE(ph.at("exposed_comm").at("slowest_rank"), 3);
  EXPECT_NE(out.find("phases per step"), std::string::npos) << out;
}

}  // namespace
}  // namespace shardcheck::harness
