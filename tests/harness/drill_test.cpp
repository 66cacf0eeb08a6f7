// `shardcheck drill checkpoint` end to end: every scenario in scenarios/drills passes all its
// drills (report.json, index.html, JUnit); each planted restore bug turns the drill that guards
// against it to FAIL (a drill that cannot fail proves nothing); undrillable scenarios exit 2 naming
// the path.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include "tests/harness/cli_support.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "harness/drill.hpp"
#include "harness/scenario.hpp"

namespace {

namespace fs = std::filesystem;
using shardcheck::harness::DrillOptions;
using shardcheck::harness::DrillReport;
using shardcheck::harness::PlantedBug;
const fs::path kDrills = fs::path(SHARDCHECK_SCENARIOS_DIR) / "drills";

using shardcheck::testing::shardcheck;

using shardcheck::testing::read_json;

using shardcheck::testing::slurp;

using shardcheck::testing::TempDir;

class DrillScenario : public ::testing::TestWithParam<std::string> {};

TEST_P(DrillScenario, EveryDrillPasses) {
  const fs::path file = kDrills / (GetParam() + ".json");
  const TempDir tmp("shardcheck_drill_" + GetParam());
  const fs::path junit = tmp.path() / "junit.xml";
  const auto [code, out] =
      shardcheck("drill checkpoint " + file.string() + " --report " +
                 (tmp.path() / "report").string() + " --junit " + junit.string());
  ASSERT_EQ(code, 0) << out;
  const auto report = read_json(tmp.path() / "report" / "report.json");
  EXPECT_TRUE(report.at("pass").get<bool>());
  EXPECT_EQ(report.at("manifest").at("scenario"), report.at("scenario"));
  // The restore's cost in goodput: the steps after the save are trained twice.
  const auto& g = report.at("goodput");
  EXPECT_GT(g.at("tokens_replayed").get<double>(), 0.0);
  EXPECT_EQ(g.at("tokens_good").get<double>(),
            g.at("tokens_processed").get<double>() - g.at("tokens_replayed").get<double>());
  EXPECT_LT(g.at("fraction").get<double>(), 1.0);
  std::set<std::string> want;
  const auto scenario = read_json(file);
  for (const auto& d : scenario.at("drills")) want.insert(d.get<std::string>());
  want.insert("latest_bad_refused");
  std::set<std::string> got;
  for (const auto& d : report.at("drills")) {
    const std::string name = d.at("name");
    const std::string detail = d.at("detail");
    got.insert(name);
    EXPECT_TRUE(d.at("pass").get<bool>()) << name << ": " << detail;
    // Each bad case names the reason and the shard it refused.
    static const std::map<std::string, std::string> named = {
        {"missing_shard", "missing_shard: shard '"},
        {"corrupt_shard", "checksum_mismatch: shard '"},
        {"truncated_shard", "truncated_shard: shard '"},
        {"stale_marker", "stale_shard: shard '"},
        {"latest_bad_refused", "previous good checkpoint offered: step-2"},
        {"resume_exact", "bitwise equal"},
        {"crash_before_commit", "step-4.tmp left uncommitted; open_latest = step-2"}};
    if (const auto it = named.find(name); it != named.end()) {
      EXPECT_NE(detail.find(it->second), std::string::npos) << name << ": " << detail;
    }
  }
  EXPECT_EQ(got, want);
  EXPECT_NE(slurp(tmp.path() / "report" / "index.html").find("latest_bad_refused"),
            std::string::npos);
  const std::string xml = slurp(junit);
  std::size_t cases = 0;
  for (auto at = xml.find("<testcase "); at != std::string::npos;
       at = xml.find("<testcase ", at + 1))
    ++cases;
  EXPECT_EQ(cases, want.size()) << xml;
  EXPECT_EQ(xml.find("<failure"), std::string::npos) << xml;
  EXPECT_NE(out.find("drills: " + std::to_string(want.size()) + " passed, 0 failed"),
            std::string::npos)
      << out;
}

INSTANTIATE_TEST_SUITE_P(Scenarios, DrillScenario,
                         ::testing::Values("ddp", "zero3", "fsdp_full_shard", "bf16_zero2",
                                           "tp2-pp2", "bf16_pp2_tied", "mesh_zero3_ep", "bf16_ddp",
                                           "swiglu_tp_reshard", "vocab_pad_reshard"));

// Runs `drills` of a scenario in-process with a planted restore bug.
DrillReport planted(const std::string& scenario, std::vector<std::string> drills, PlantedBug bug) {
  shardcheck::harness::Scenario s =
      shardcheck::harness::load_scenario((kDrills / (scenario + ".json")).string());
  s.drills = std::move(drills);
  return shardcheck::harness::run_drills(s, DrillOptions{.planted_bug = bug});
}

const shardcheck::harness::DrillResult& drill(const DrillReport& r, const std::string& name) {
  const auto it =
      std::find_if(r.drills.begin(), r.drills.end(), [&](const auto& d) { return d.name == name; });
  EXPECT_NE(it, r.drills.end()) << name;
  return *it;
}

TEST(DrillMutation, SwallowedRestoreErrorsFailEveryBadCase) {
  const DrillReport r = planted(
      "ddp", {"restore_same", "missing_shard", "corrupt_shard", "truncated_shard", "stale_marker"},
      PlantedBug::swallow_restore_errors);
  EXPECT_TRUE(drill(r, "restore_same").pass) << drill(r, "restore_same").detail;
  for (const char* name : {"missing_shard", "corrupt_shard", "truncated_shard", "stale_marker"}) {
    EXPECT_FALSE(drill(r, name).pass) << name;
    EXPECT_NE(drill(r, name).detail.find("did not refuse"), std::string::npos)
        << drill(r, name).detail;
  }
  EXPECT_FALSE(r.pass());
  EXPECT_FALSE(r.broke());
}

TEST(DrillMutation, SkippedChecksumsFailTheCorruptShardDrill) {
  // Without hashing at open, the corruption is found (if at all) only mid-import: state changed.
  // Here the rank that reads the corrupt shard throws the right error naming the right shard, but
  // too late; the others do not read it at all and restore the run without complaint.
  const DrillReport r = planted("zero3", {"corrupt_shard"}, PlantedBug::skip_checksums);
  const std::string& detail = drill(r, "corrupt_shard").detail;
  EXPECT_FALSE(drill(r, "corrupt_shard").pass) << detail;
  EXPECT_NE(detail.find("refused, but only after changing the engine's state"), std::string::npos)
      << detail;
  EXPECT_NE(detail.find("did not refuse"), std::string::npos) << detail;
}

TEST(DrillMutation, UnrestoredSamplerFailsResumeExactAndRestoreSame) {
  const DrillReport r = planted("ddp", {"restore_same", "resume_exact"}, PlantedBug::replay_data);
  EXPECT_FALSE(drill(r, "resume_exact").pass);
  EXPECT_NE(drill(r, "resume_exact").detail.find("other samples"), std::string::npos)
      << drill(r, "resume_exact").detail;
  EXPECT_FALSE(drill(r, "restore_same").pass) << drill(r, "restore_same").detail;
}

TEST(DrillMutation, WrongStepFailsResumeExact) {
  const DrillReport r = planted("fsdp_full_shard", {"resume_exact", "restore_resharded"},
                                PlantedBug::off_by_one_step);
  EXPECT_FALSE(drill(r, "resume_exact").pass) << drill(r, "resume_exact").detail;
  EXPECT_FALSE(drill(r, "restore_resharded").pass) << drill(r, "restore_resharded").detail;
}

TEST(DrillMutation, ResumingFromAnUncommittedSaveFailsCrashBeforeCommit) {
  const DrillReport r = planted("ddp", {"crash_before_commit"}, PlantedBug::accept_uncommitted);
  EXPECT_FALSE(drill(r, "crash_before_commit").pass);
  EXPECT_NE(drill(r, "crash_before_commit").detail.find("the resume picked step-4.tmp"),
            std::string::npos)
      << drill(r, "crash_before_commit").detail;
}

TEST(DrillMutation, SilentlySkippingABadNewestCheckpointFails) {
  const DrillReport r = planted("ddp", {"restore_same"}, PlantedBug::skip_bad_latest);
  EXPECT_FALSE(drill(r, "latest_bad_refused").pass);
  EXPECT_NE(drill(r, "latest_bad_refused").detail.find("did not refuse"), std::string::npos)
      << drill(r, "latest_bad_refused").detail;
}

TEST(DrillCli, BadScenariosExit2NamingThePath) {
  const TempDir tmp("shardcheck_drill_bad");
  nlohmann::json base = read_json(kDrills / "ddp.json");
  const auto expect_2 = [&](nlohmann::json j, const std::string& path) {
    const auto [code, out] = shardcheck("drill checkpoint " + tmp.write("s.json", j).string());
    EXPECT_EQ(code, 2) << out;
    EXPECT_NE(out.find(path), std::string::npos) << out;
  };
  auto j = base;
  j["drills"] = nlohmann::json::array();
  expect_2(j, "$.drills");
  j = base;
  j["drills"] = {"restore_same", "reload"};
  expect_2(j, "$.drills[1]");
  j = base;
  j["checkpoint"].erase("restore_parallel");
  expect_2(j, "$.checkpoint.restore_parallel");
  j = base;
  j["checkpoint"]["every"] = 4;
  expect_2(j, "$.checkpoint.every");
  const auto [code, out] = shardcheck("drill checkpoint " + (tmp.path() / "none.json").string());
  EXPECT_EQ(code, 2) << out;
  const auto [code2, out2] = shardcheck("drill nothing " + (kDrills / "ddp.json").string());
  EXPECT_EQ(code2, 2) << out2;
}

TEST(DrillCli, KeepDirKeepsTheCheckpointsAndMustBeEmpty) {
  const TempDir tmp("shardcheck_drill_keep");
  nlohmann::json j = read_json(kDrills / "ddp.json");
  j["drills"] = {"crash_before_commit"};
  const fs::path file = tmp.write("s.json", j);
  const fs::path keep = tmp.path() / "keep";
  const auto [code, out] =
      shardcheck("drill checkpoint " + file.string() + " --keep-dir " + keep.string());
  ASSERT_EQ(code, 0) << out;
  EXPECT_TRUE(fs::exists(keep / "saved" / "step-2" / "SUCCESS"));
  EXPECT_TRUE(fs::exists(keep / "crash_before_commit" / "step-2" / "SUCCESS"));
  EXPECT_TRUE(fs::exists(keep / "crash_before_commit" / "step-4.tmp"));
  EXPECT_FALSE(fs::exists(keep / "crash_before_commit" / "step-4"));
  const auto [again, out2] =
      shardcheck("drill checkpoint " + file.string() + " --keep-dir " + keep.string());
  EXPECT_EQ(again, 2) << out2;
  EXPECT_NE(out2.find("not empty"), std::string::npos) << out2;
}

TEST(DrillMutation, LostFusedGateUpOrderFailsTheReshardedRestore) {
  // Gate and up read back from [gate_0 | up_0 | gate_1 | up_1] split in halves: the resharded run
  // starts from other weights (and optimizer moments) than were saved.
  const DrillReport r =
      planted("swiglu_tp_reshard", {"restore_resharded"}, PlantedBug::fused_gate_up_order);
  EXPECT_FALSE(drill(r, "restore_resharded").pass) << drill(r, "restore_resharded").detail;
  EXPECT_FALSE(r.broke());
}

TEST(DrillMutation, AHeadReadAsPaddedFailsTheRestores) {
  // Saved by TP 4 with 41 ids padded to 64: a loader reading lm_head.weight [h, 41] at the padded
  // row stride of 64 shifts every row but the first; both restores start from other weights.
  const DrillReport r = planted("vocab_pad_reshard", {"restore_same", "restore_resharded"},
                                PlantedBug::head_read_as_padded);
  EXPECT_FALSE(drill(r, "restore_same").pass) << drill(r, "restore_same").detail;
  EXPECT_FALSE(drill(r, "restore_resharded").pass) << drill(r, "restore_resharded").detail;
  EXPECT_FALSE(r.broke());
}

TEST(DrillMutation, TensorPipelineMeshCatchesAnUnrestoredSamplerAndSwallowedErrors) {
  // The drills guard a TP x PP mesh as they guard DP: a replayed data cursor fails the exact
  // resume, a swallowed restore error fails the damaged-shard drills.
  DrillReport r = planted("tp2-pp2", {"resume_exact"}, PlantedBug::replay_data);
  EXPECT_FALSE(drill(r, "resume_exact").pass) << drill(r, "resume_exact").detail;
  r = planted("tp2-pp2", {"missing_shard", "corrupt_shard"}, PlantedBug::swallow_restore_errors);
  for (const char* name : {"missing_shard", "corrupt_shard"}) {
    EXPECT_FALSE(drill(r, name).pass) << name;
  }
}

}  // namespace
