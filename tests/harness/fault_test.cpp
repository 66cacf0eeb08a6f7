// Faults end to end through `shardcheck run`: every scenario in scenarios/faults is diagnosed with
// the injected rank named (exit 0 because expect.fault names it); the same faults without the
// expectation break the run (exit 3); a wrong expectation or a fault that did nothing fails the
// check (exit 1); and the report of a run is a pure function of the scenario (no wall time aside).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include "tests/harness/cli_support.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace {

namespace fs = std::filesystem;
const fs::path kFaults = fs::path(SHARDCHECK_SCENARIOS_DIR) / "faults";

using shardcheck::testing::shardcheck;

using shardcheck::testing::read_json;

using shardcheck::testing::TempDir;

class FaultScenario : public ::testing::TestWithParam<std::string> {};

TEST_P(FaultScenario, IsDiagnosedNamingTheInjectedRank) {
  const fs::path file = kFaults / (GetParam() + ".json");
  const auto scenario = read_json(file);
  const TempDir tmp("shardcheck_fault_" + GetParam());
  const auto [code, out] = shardcheck("run " + file.string() + " --report " + tmp.path().string());
  ASSERT_EQ(code, 0) << out;
  const auto report = read_json(tmp.path() / "report.json");
  const std::string want = scenario.at("expect").at("fault");
  const int rank = scenario.at("faults")[0].at("rank");
  bool found = false;
  for (const auto& f : report.at("faults")) {
    if (f.at("kind") != want || !f.at("detected").get<bool>()) continue;
    found = true;
    EXPECT_NE(std::find(f.at("ranks").begin(), f.at("ranks").end(), rank), f.at("ranks").end())
        << f.dump();
    EXPECT_FALSE(f.at("message").get<std::string>().empty());
    if (want != "straggler" && want != "nan" && want != "corruption") {
      // The simulator's diagnoses carry every rank's flight recorder.
      EXPECT_EQ(f.at("flight_records").size(),
                report.at("parity")[0].at("world_size").get<std::size_t>());
    }
    if (want == "mismatch" || want == "corruption") {
      EXPECT_FALSE(f.at("op").get<std::string>().empty()) << f.dump();
      EXPECT_FALSE(f.at("group").get<std::string>().empty()) << f.dump();
    }
  }
  EXPECT_TRUE(found) << report.at("faults").dump(2);
  EXPECT_TRUE(fs::exists(tmp.path() / "index.html"));
}

TEST_P(FaultScenario, WithoutTheExpectationTheRunBreaksOrFails) {
  auto scenario = read_json(kFaults / (GetParam() + ".json"));
  const std::string kind = scenario.at("expect").at("fault");
  scenario.erase("expect");
  const TempDir tmp("shardcheck_fault_unexpected_" + GetParam());
  const auto [code, out] = shardcheck("run " + tmp.write("s.json", scenario).string());
  // A straggler changes no number (it passes parity: 0); everything else breaks the run (3),
  // except a silent corruption, which only the parity check sees (1).
  const int want = kind == "straggler" ? 0 : GetParam() == "corrupt_silent" ? 1 : 3;
  EXPECT_EQ(code, want) << out;
}

TEST_P(FaultScenario, ExpectingAnotherFaultFails) {
  auto scenario = read_json(kFaults / (GetParam() + ".json"));
  const std::string kind = scenario.at("expect").at("fault");
  scenario["expect"]["fault"] = kind == "deadlock" ? "oom" : "deadlock";
  const TempDir tmp("shardcheck_fault_wrong_" + GetParam());
  const auto [code, out] = shardcheck("run " + tmp.write("s.json", scenario).string());
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("was not detected"), std::string::npos) << out;
}

INSTANTIATE_TEST_SUITE_P(Faults, FaultScenario,
                         ::testing::Values("hang", "crash", "skip_collective", "mismatch",
                                           "nan_gradient", "nan_stop", "nan_gradient_mesh",
                                           "nan_stop_mesh", "corrupt_checksum", "corrupt_silent",
                                           "memory_budget", "straggler"));

// A check that can fail: a straggler of slowdown 1 slows nothing and must not be reported found.
TEST(FaultChecks, AStragglerThatIsNotSlowIsNotDetected) {
  auto scenario = read_json(kFaults / "straggler.json");
  scenario["faults"][0]["slowdown"] = 1.0;
  const TempDir tmp("shardcheck_fault_noslow");
  const auto [code, out] = shardcheck("run " + tmp.write("s.json", scenario).string());
  EXPECT_EQ(code, 1) << out;
}

// A fault at an op its rank never issues cannot fire: a crash at op 10^9 ran clean and passed
// (issue 52, item 5). Refused at load (exit 2) naming the fault and the ops the rank issues; the
// last op it issues is still a fault that fires (the count is the engine's, not a guess).
TEST(FaultChecks, AFaultThatCannotFireIsRefusedAndTheLastOpFires) {
  const TempDir tmp("shardcheck_fault_unreachable");
  for (const char* mesh : {R"({"dp": 2})", R"({"tp": 2})", R"({"dp": 2, "tp": 2, "pp": 2})"}) {
    auto s = shardcheck::testing::small_scenario("unreachable", nlohmann::json::array());
    s["parallel"] = nlohmann::json::parse(mesh);
    s["faults"] = {{{"kind", "crash"}, {"rank", 1}, {"step", 2}, {"op_index", 1000000000}}};
    s["expect"] = {{"fault", "crash"}};
    const auto [code, out] = shardcheck("run " + tmp.write("s.json", s).string());
    EXPECT_EQ(code, 2) << out;
    EXPECT_TRUE(shardcheck::testing::has(out, "$.faults[0].op_index")) << out;
    const auto at = out.find(" issues ");
    ASSERT_NE(at, std::string::npos) << out;
    const int ops = std::stoi(out.substr(at + 8));
    ASSERT_GT(ops, 0) << out;
    s["faults"][0]["op_index"] = ops - 1;
    const auto [fired, out_fired] = shardcheck("run " + tmp.write("s.json", s).string());
    EXPECT_EQ(fired, 0) << mesh << ": the crash at the last op was not detected\n" << out_fired;
    s["faults"][0]["op_index"] = ops;
    EXPECT_EQ(shardcheck("run " + tmp.write("s.json", s).string()).first, 2) << mesh;
  }
}

// Reports are a pure function of the scenario: two runs give the same report.json once the wall
// times are removed (virtual time, diagnoses and flight records included).
TEST(FaultChecks, ReportsAreDeterministic) {
  const TempDir a("shardcheck_det_a"), b("shardcheck_det_b");
  for (const char* name : {"straggler", "hang"}) {
    const std::string file = (kFaults / (std::string(name) + ".json")).string();
    ASSERT_EQ(shardcheck("run " + file + " --report " + a.path().string()).first, 0);
    ASSERT_EQ(shardcheck("run " + file + " --report " + b.path().string()).first, 0);
    auto ra = read_json(a.path() / "report.json"), rb = read_json(b.path() / "report.json");
    // Everything but the wall times and the run id (new for each invocation, by design).
    EXPECT_NE(ra.at("manifest").at("run_id"), rb.at("manifest").at("run_id"));
    for (auto* r : {&ra, &rb}) {
      for (auto& row : r->at("parity")) row.erase("wall_s");
      r->at("manifest").erase("run_id");
    }
    EXPECT_EQ(ra, rb) << name;
  }
}

}  // namespace
