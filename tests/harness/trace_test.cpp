// The trace files `run --report` writes (harness/trace.hpp): every event carries the Chrome Trace
// Event Format's required fields (name, ph, pid, tid; ts and dur on complete events; the scope of
// instant events), a process per rank and a thread per stream are named, each rank's steps are
// marked, a pipeline's sends and receives are on their own thread, and an injected hang shows as
// a fault event on the rank it names, events name their stage, pass, microbatch and chunk, and each
// rank's memory counter peaks where its tracker did. nlohmann::json parses each file whole, and
// the events keep the rules of Perfetto's JSON importer (src/trace_processor/importers/json/ of
// google/perfetto, read for reports/2026-12-02-perfetto-and-browser-checks.md): numeric ts and dur
// at whole nanoseconds (the importer reads fraction digits into an int64 and rounds to ns), named
// processes and threads with non-empty names, numeric counter values, and no two complete events
// of one thread partly overlapping once rounded to ns as the importer rounds them. Goodput leaves
// out a skipped step's tokens; the step phases name a straggler.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "harness/trace.hpp"
#include "tests/harness/cli_support.hpp"

namespace shardcheck::harness {
namespace {

namespace fs = std::filesystem;
using shardcheck::testing::kScenarios;
using shardcheck::testing::read_json;
using shardcheck::testing::shardcheck;
using shardcheck::testing::TempDir;

// A timestamp or duration in microseconds as Perfetto's importer stores it: whole nanoseconds
// (llround(us * 1000)). Expects the value to be whole nanoseconds already, so nothing is lost and
// the printed number has at most three fraction digits.
int64_t perfetto_ns(const nlohmann::json& us, const nlohmann::json& e) {
  EXPECT_TRUE(us.is_number()) << e.dump();
  const double v = us.get<double>() * 1000.0;
  const auto ns = std::llround(v);
  EXPECT_NEAR(v, static_cast<double>(ns), 1e-9 * std::max(1.0, std::abs(v)))
      << "not whole nanoseconds: " << e.dump();
  return ns;
}

// Checks the format of every event of `trace`; returns the events per (category, pid).
std::map<std::pair<std::string, int>, int> check_format(const nlohmann::json& trace, int ranks) {
  std::map<std::pair<std::string, int>, int> seen;
  std::set<std::pair<int, int>> named_threads;
  std::set<int> named_processes;
  EXPECT_EQ(trace.at("displayTimeUnit"), "ms");
  EXPECT_TRUE(trace.at("traceEvents").is_array());
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
      const std::string name = e.at("name").get<std::string>();
      if (name == "process_name" || name == "thread_name") {  // else the importer rejects it
        EXPECT_TRUE(e.at("args").at("name").is_string()) << e.dump();
        EXPECT_FALSE(e.at("args").at("name").get<std::string>().empty()) << e.dump();
      }
      if (name.ends_with("_sort_index")) {
        EXPECT_TRUE(e.at("args").at("sort_index").is_number_integer()) << e.dump();
      }
      continue;
    }
    EXPECT_GE(perfetto_ns(e.at("ts"), e), 0) << e.dump();
    EXPECT_TRUE(e.at("cat").is_string()) << e.dump();
    if (ph == "X") {
      EXPECT_GE(perfetto_ns(e.at("dur"), e), 0) << e.dump();
      EXPECT_TRUE(e.at("args").contains("step")) << e.dump();
    } else if (ph == "C") {  // a counter: one track per arg, each value a number
      EXPECT_TRUE(e.at("args").at("bytes").is_number_unsigned()) << e.dump();
      for (const auto& [key, value] : e.at("args").items())
        EXPECT_TRUE(value.is_number()) << key << " in " << e.dump();
    } else {
      EXPECT_EQ(ph, "i") << e.dump();
      const std::string scope = e.at("s").get<std::string>();
      EXPECT_TRUE(scope == "g" || scope == "p" || scope == "t") << e.dump();
    }
    ++seen[{e.at("cat").get<std::string>(), pid}];
  }
  EXPECT_EQ(named_processes.size(), static_cast<std::size_t>(ranks));
  EXPECT_GE(named_threads.size(), static_cast<std::size_t>(3 * ranks));
  // Every event on a named thread; a thread's complete events never overlap, in the importer's
  // nanoseconds (a partial overlap is an import error, slice_spill_overlapping_complete_event;
  // a stream runs one thing at a time, so not even nesting is expected).
  std::map<std::pair<int, int>, std::vector<std::pair<int64_t, int64_t>>> slices;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M") continue;
    const std::pair<int, int> thread{e.at("pid").get<int>(), e.at("tid").get<int>()};
    EXPECT_TRUE(named_threads.count(thread)) << e.dump();
    if (e.at("ph") == "X") {
      const int64_t ts = perfetto_ns(e.at("ts"), e);
      slices[thread].emplace_back(ts, ts + perfetto_ns(e.at("dur"), e));
    }
  }
  for (auto& [thread, v] : slices) {
    std::sort(v.begin(), v.end());
    for (std::size_t i = 1; i < v.size(); ++i)
      EXPECT_GE(v[i].first, v[i - 1].second) << "pid " << thread.first << " tid " << thread.second
                                             << " event at " << v[i].first << " ns";
  }
  return seen;
}

// How many events of category `cat` rank `pid` has in check_format's count (0 when none).
int count_of(const std::map<std::pair<std::string, int>, int>& seen, const char* cat, int pid) {
  const auto it = seen.find({cat, pid});
  return it == seen.end() ? 0 : it->second;
}

// Each rank's events name its pipeline stage (its pp coordinate, from process_labels); inside
// the schedule each compute event names its pass, microbatch (every one of the rank's) and chunk
// (below the virtual stages), and a forward pass computes no backward; the optimizer, after the
// schedule, is in no pass.
void check_pipeline_args(const nlohmann::json& trace, const nlohmann::json& row) {
  ASSERT_TRUE(row.at("pipeline").is_object()) << row.at("config");
  const int microbatches = row.at("pipeline").at("microbatches").get<int>();
  const int chunks = row.at("pipeline").at("virtual_stages").get<int>();
  std::map<int, int> stage_of;
  for (const auto& e : trace.at("traceEvents"))
    if (e.at("name") == "process_labels") {
      const auto labels = nlohmann::json::parse(e.at("args").at("labels").get<std::string>());
      stage_of[e.at("pid").get<int>()] = labels.value("pp", 0);
    }
  std::map<int, std::set<int>> microbatches_of;
  std::map<int, std::set<std::string>> passes_of;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    const int pid = e.at("pid").get<int>();
    const auto& args = e.at("args");
    EXPECT_EQ(args.at("stage"), stage_of.at(pid)) << e.dump();
    if (e.at("cat") != "compute") continue;
    const std::string name = e.at("name").get<std::string>();
    if (name == "adamw") {
      EXPECT_FALSE(args.contains("pass")) << e.dump();
      continue;
    }
    if (!args.contains("pass")) continue;  // the harness's final gather, after the last step
    const int mb = args.at("microbatch").get<int>(), chunk = args.at("chunk").get<int>();
    EXPECT_GE(mb, 0) << e.dump();
    EXPECT_LT(mb, microbatches) << e.dump();
    EXPECT_GE(chunk, 0) << e.dump();
    EXPECT_LT(chunk, chunks) << e.dump();
    microbatches_of[pid].insert(mb);
    passes_of[pid].insert(args.at("pass").get<std::string>());
    if (args.at("pass") == "forward") {
      EXPECT_EQ(name.find("backward"), std::string::npos) << e.dump();
    }
  }
  for (const auto& [pid, stage] : stage_of) {
    EXPECT_EQ(microbatches_of[pid].size(), static_cast<std::size_t>(microbatches))
        << row.at("config") << " rank " << pid;
    EXPECT_EQ(passes_of[pid], (std::set<std::string>{"forward", "backward"}))
        << row.at("config") << " rank " << pid;
  }
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
      if (key.first != "step" && key.first != "fault" && key.first != "memory")
        complete += static_cast<std::size_t>(n);
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
    check_pipeline_args(trace, row);
    // The memory counter of each rank reaches the peak its tracker reports, and no more.
    std::map<int, std::size_t> highest;
    for (const auto& e : trace.at("traceEvents"))
      if (e.at("ph") == "C" && e.at("name") == "memory")
        highest[e.at("pid").get<int>()] =
            std::max(highest[e.at("pid").get<int>()], e.at("args").at("bytes").get<std::size_t>());
    for (const auto& m : row.at("memory"))
      EXPECT_EQ(highest[m.at("rank").get<int>()], m.at("peak").get<std::size_t>())
          << row.at("config") << " rank " << m.at("rank");
  }
}

// The HTML's memory over the step: the shown rank that holds the most in the step, the step in
// 100 equal buckets, each the most held in it (at least what it began with), carried where nothing
// changes; samples of other steps only give the value at the start.
TEST(Trace, MemoryOverTheStepKeepsEachBucketsHighestValue) {
  ConfigResult c;
  c.spec.mesh.dp = 2;
  for (int r = 0; r < 2; ++r) {
    sim::TimelineEvent e;
    e.rank = r;
    e.step = 1;
    e.start = 0;
    e.end = 1;
    e.name = e.kind = "compute";
    c.timeline.push_back(e);
  }
  c.memory_series = {
      {{0.0, 1, 100}, {0.5, 1, 300}, {0.5, 1, 200}, {0.9, 1, 50}, {1.5, 2, 5000}},
      {{0.0, 0, 120}, {0.2, 1, 150}},
  };
  auto tl = step_timeline(c, "trace.json", 1);
  ASSERT_TRUE(tl.contains("memory")) << tl.dump();
  const auto& m = tl.at("memory");
  EXPECT_EQ(m.at("rank"), 0);
  EXPECT_EQ(m.at("peak"), 300);  // step 2's 5000 is not this step
  const auto b = m.at("buckets").get<std::vector<std::size_t>>();
  ASSERT_EQ(b.size(), 100u);
  EXPECT_EQ(b[0], 100u);
  EXPECT_EQ(b[49], 100u);
  EXPECT_EQ(b[50], 300u);
  EXPECT_EQ(b[51], 200u);
  EXPECT_EQ(b[90], 200u);
  EXPECT_EQ(b[99], 50u);
  c.memory_series[1].push_back({0.7, 1, 400});  // now rank 1 holds the most; 120 before the step
  tl = step_timeline(c, "trace.json", 1);
  const auto b1 = tl.at("memory").at("buckets").get<std::vector<std::size_t>>();
  EXPECT_EQ(tl.at("memory").at("rank"), 1);
  EXPECT_EQ(b1[0], 120u);
  EXPECT_EQ(b1[20], 150u);
  EXPECT_EQ(b1[70], 400u);
  EXPECT_EQ(b1[99], 400u);
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
  // The diagnosis names the rank and the phase its time went to (backward is twice the forward).
  const auto report = read_json(dir.path() / "report.json");  // outlives `fault`
  const auto& fault = report.at("parity")[0].at("faults")[0];
  EXPECT_EQ(fault.at("ranks"), nlohmann::json::array({3}));
  EXPECT_EQ(fault.at("phase"), "backward");
  EXPECT_NE(fault.at("message").get<std::string>().find("most of it in backward"),
            std::string::npos)
      << fault.dump();
}

// Full activation checkpointing re-runs each block's forward inside its backward: that is
// recompute, not forward (the ops are the forward's, the pass says otherwise). Without
// recomputation there is none.
TEST(StepPhases, FullRecomputeIsCountedAsRecompute) {
  TempDir dir("phases_recompute");
  const auto [code, out] = shardcheck(
      "run " + kScenarios + "/parity/mp_recompute_full.json --report " + dir.path().string());
  ASSERT_EQ(code, 0) << out;
  const auto report = read_json(dir.path() / "report.json");
  for (const auto& row : report.at("parity")) {
    const auto& ph = row.at("phases");
    const double forward = ph.at("forward").at("p50").get<double>();
    const double recompute = ph.at("recompute").at("p50").get<double>();
    EXPECT_GT(forward, 0.0) << row.at("config");
    // every block again (on a stage without the head, all of its forward), but not the head
    EXPECT_GT(recompute, 0.5 * forward) << row.at("config");
    EXPECT_LE(recompute, forward * (1 + 1e-9)) << row.at("config");  // summed in another order
    EXPECT_LT(ph.at("recompute").at("max").get<double>(), ph.at("forward").at("max").get<double>())
        << row.at("config");
  }
  TempDir none("phases_no_recompute");
  const auto [code2, out2] =
      shardcheck("run " + kScenarios + "/parity/mp_pp.json --report " + none.path().string());
  ASSERT_EQ(code2, 0) << out2;
  const auto plain = read_json(none.path() / "report.json");
  for (const auto& row : plain.at("parity"))
    EXPECT_EQ(row.at("phases").at("recompute").at("max").get<double>(), 0.0) << row.at("config");
}

}  // namespace
}  // namespace shardcheck::harness
