// The run manifest says where a run comes from (harness/provenance.hpp): a run id per invocation,
// the model and data manifests whose hashes follow the model and the token stream and nothing else,
// the checkpoint policy, every configuration's groups, and the rank -> group lines `run` prints at
// start (left out with --quiet).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "harness/provenance.hpp"
#include "harness/report.hpp"
#include "harness/scenario.hpp"
#include "tests/harness/cli_support.hpp"

namespace shardcheck::harness {
namespace {

namespace fs = std::filesystem;
using shardcheck::testing::read_json;
using shardcheck::testing::shardcheck;
using shardcheck::testing::TempDir;

const std::string kProvenanceFile =
    std::string(SHARDCHECK_SCENARIOS_DIR) + "/parity/vocab_padding_f32.json";

// The scenario with one step and the configurations tp2 and dp2-tp2-pp2.
fs::path provenance_scenario(const fs::path& dir) {
  auto j = nlohmann::json::parse(std::ifstream(kProvenanceFile));
  j["train"]["steps"] = 1;
  j["checkpoint"] = {{"every", 1}, {"keep", 3}};
  j["matrix"] = {{{"tp", 2}}, {{"dp", 2}, {"tp", 2}, {"pp", 2}}};
  const fs::path file = dir / "provenance.json";
  std::ofstream(file) << j.dump();
  return file;
}

TEST(Provenance, TheManifestNamesTheRunItsModelDataPolicyAndGroups) {
  const TempDir tmp("shardcheck_provenance");
  const fs::path file = provenance_scenario(tmp.path());
  const auto [code, out] =
      shardcheck("run " + file.string() + " --report " + (tmp.path() / "a").string());
  ASSERT_EQ(code, 0) << out;
  // Logged at start, before the parity table: each configuration's groups along its axes.
  EXPECT_NE(out.find("# groups vocab-padding-f32 tp2 (2 ranks, order tp-cp-ep-dp-pp): tp [0 1]\n"),
            std::string::npos)
      << out;
  EXPECT_NE(
      out.find("# groups vocab-padding-f32 dp2-tp2-pp2-1f1b (8 ranks, order tp-cp-ep-dp-pp): dp "
               "[0 2] [1 3] [4 6] [5 7]; tp [0 1] [2 3] [4 5] [6 7]; pp [0 4] [1 5] [2 6] [3 7]\n"),
      std::string::npos)
      << out;
  EXPECT_LT(out.find("# groups"), out.find("PASS"));
  const auto m = read_json(tmp.path() / "a" / "manifest.json");
  const auto r = read_json(tmp.path() / "a" / "report.json");
  const std::string id = m.at("run_id");
  EXPECT_TRUE(std::regex_match(id, std::regex("[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}"))) << id;
  EXPECT_EQ(r.at("manifest").at("run_id"), id);
  EXPECT_EQ(m.at("model").at("config").at("vocab"), 41);
  EXPECT_TRUE(std::regex_match(m.at("model").at("hash").get<std::string>(),
                               std::regex("xxh3:[0-9a-f]{16}")));
  const auto& data = m.at("data");
  EXPECT_EQ(data.at("config").at("documents"), 200);
  EXPECT_GT(data.at("sequences").get<int>(), 16);
  EXPECT_GT(data.at("tokens").get<int>(), data.at("sequences").get<int>());
  EXPECT_EQ(m.at("checkpoint").at("every"), 1);
  EXPECT_EQ(m.at("checkpoint").at("keep"), 3);
  ASSERT_EQ(m.at("configs").size(), 2u);
  EXPECT_EQ(m.at("configs")[1].at("groups").size(), 8u);
  EXPECT_EQ(m.at("configs")[1].at("groups")[5].at("pp"), nlohmann::json({1, 5}));

  // A second invocation: another run id, the same model and data; --quiet leaves out the groups.
  const auto [code2, out2] =
      shardcheck("run " + file.string() + " --quiet --report " + (tmp.path() / "b").string());
  ASSERT_EQ(code2, 0) << out2;
  EXPECT_EQ(out2.find("# groups"), std::string::npos) << out2;
  const auto m2 = read_json(tmp.path() / "b" / "manifest.json");
  EXPECT_NE(m2.at("run_id"), id);
  EXPECT_EQ(m2.at("model"), m.at("model"));
  EXPECT_EQ(m2.at("data"), m.at("data"));
}

TEST(Provenance, TheHashesFollowTheModelAndTheTokenStreamOnly) {
  Scenario s = load_scenario(kProvenanceFile);
  const auto base = manifest_json(s);
  const auto hashes = [](const nlohmann::json& m) {
    return std::pair{m.at("model").at("hash"), m.at("data").at("hash")};
  };
  Scenario other_seed = s;
  other_seed.seed += 1;  // other tokens (and initial weights: not the model's shape)
  EXPECT_EQ(hashes(manifest_json(other_seed)).first, hashes(base).first);
  EXPECT_NE(hashes(manifest_json(other_seed)).second, hashes(base).second);
  Scenario wider = s;
  wider.model.ffn += 8;  // another model, the same corpus
  EXPECT_NE(hashes(manifest_json(wider)).first, hashes(base).first);
  EXPECT_EQ(hashes(manifest_json(wider)).second, hashes(base).second);
  Scenario other_mesh = s;
  other_mesh.configs.resize(1);
  other_mesh.train.steps = 1;  // neither model nor corpus
  EXPECT_EQ(hashes(manifest_json(other_mesh)), hashes(base));
}

}  // namespace
}  // namespace shardcheck::harness
