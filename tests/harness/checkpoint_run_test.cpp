// `shardcheck run --checkpoint-dir / --resume`: a ZeRO-3 run on 4 ranks saves, a DDP run on 2
// ranks resumes from it with parity; a same-topology resume continues bitwise like an
// uninterrupted run; both manifests carry the code's commit; a corrupt newest checkpoint is refused
// naming the shard and the reason (exit 1) and the previous good one is named, as is another run's
// checkpoint or a cursor out of range; a second run on a held directory and bad options exit 2;
// a bf16 resume across the tied embedding's rounding follows each mesh's recipe.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint/checkpoint.hpp"
#include "tests/harness/cli_support.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace fs = std::filesystem;

using shardcheck::testing::shardcheck;

using shardcheck::testing::read_json;
namespace ck = shardcheck::checkpoint;

std::string slurp_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

class CheckpointRun : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("shardcheck_ckrun_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // The dense parity model, 4 steps, saving every `every` steps, one configuration.
  fs::path scenario(const std::string& name, const nlohmann::json& config, int every,
                    const std::string& base = "data_parallel_dense.json") {
    auto j = read_json(fs::path(SHARDCHECK_SCENARIOS_DIR) / "parity" / base);
    j["name"] = name;
    j["train"]["steps"] = 4;
    j["checkpoint"] = {{"every", every}, {"keep", 3}};
    j["matrix"] = nlohmann::json::array({config});
    const fs::path file = dir_ / (name + ".json");
    std::ofstream(file) << j.dump(2);
    return file;
  }
  // Rewrites step's manifest.json with `edit` (then `text_edit` on its text) and commits the
  // result consistently (the marker pins the edited manifest): a hand edit, re-signed.
  static void reseal(const fs::path& step, const std::function<void(nlohmann::json&)>& edit,
                     const std::function<void(std::string&)>& text_edit = {}) {
    auto manifest = read_json(step / "manifest.json");
    edit(manifest);
    std::string text = manifest.dump(1) + "\n";
    if (text_edit) text_edit(text);
    std::ofstream(step / "manifest.json") << text;
    auto marker = read_json(step / "SUCCESS");
    marker["manifest_xxh3"] = ck::hex64(ck::xxh3(std::as_bytes(std::span(text))));
    std::ofstream(step / "SUCCESS") << marker.dump() << "\n";
  }
  // Saves `s` every 2 of its 4 steps into dir_/ck (step-2 and step-4).
  void save_two(const fs::path& s) {
    const auto [code, out] =
        shardcheck("run " + s.string() + " --checkpoint-dir " + (dir_ / "ck").string());
    ASSERT_EQ(code, 0) << out;
    ASSERT_TRUE(fs::exists(dir_ / "ck" / "step-2" / "SUCCESS")) << out;
    ASSERT_TRUE(fs::exists(dir_ / "ck" / "step-4" / "SUCCESS")) << out;
  }
  fs::path dir_;
};

TEST_F(CheckpointRun, ZeroThreeOnFourResumesAsDdpOnTwoWithParity) {
  const auto save = scenario("save", {{"dp", 4}, {"zero", 3}}, 3);
  auto [code, out] =
      shardcheck("run " + save.string() + " --checkpoint-dir " + (dir_ / "ck").string());
  ASSERT_EQ(code, 0) << out;
  ASSERT_TRUE(fs::exists(dir_ / "ck" / "step-3" / "SUCCESS")) << out;
  ASSERT_TRUE(fs::exists(dir_ / "ck" / "step-3" / "manifest.json"));
  const auto resume = scenario("resume", {{"dp", 2}}, 3);
  std::tie(code, out) = shardcheck("run " + resume.string() + " --resume " +
                                   (dir_ / "ck").string() + " --report " + (dir_ / "r").string());
  ASSERT_EQ(code, 0) << out;
  const auto row = read_json(dir_ / "r" / "report.json").at("parity")[0];
  EXPECT_NE(row.at("resumed_from").get<std::string>().find("step-3"), std::string::npos);
  ASSERT_EQ(row.at("steps").size(), 1u);  // only step 4 runs after the resume
  EXPECT_EQ(row.at("steps")[0].at("step"), 4);
  EXPECT_LE(row.at("max_rel_err").get<double>(), 1e-10);
}

// The run manifest (report.json) and the checkpoint manifest record the version and the commit
// the build came from, the same that `shardcheck --version` prints.
TEST_F(CheckpointRun, ManifestsCarryTheCodeCommit) {
  const auto [vcode, version] = shardcheck("--version");
  ASSERT_EQ(vcode, 0) << version;
  const auto run = scenario("commit", {{"dp", 2}}, 4);
  const auto [code, out] =
      shardcheck("run " + run.string() + " --checkpoint-dir " + (dir_ / "ck").string() +
                 " --report " + (dir_ / "r").string());
  ASSERT_EQ(code, 0) << out;
  const auto manifest = read_json(dir_ / "r" / "report.json").at("manifest");
  const auto saved = read_json(dir_ / "ck" / "step-4" / "manifest.json");
  const std::string commit = manifest.at("code_commit").get<std::string>();
  EXPECT_FALSE(commit.empty());
  EXPECT_EQ(saved.at("code_commit").get<std::string>(), commit);
  EXPECT_EQ(saved.at("code_version"), manifest.at("code_version"));
  EXPECT_NE(version.find("commit " + commit), std::string::npos) << version;
  EXPECT_NE(version.find(manifest.at("code_version").get<std::string>()), std::string::npos);
}

// Expert parallelism carved out of DP: saved on dp4 with ep2 (expert DP 2), resumed on dp4 with
// ep4 (every data rank an expert rank), on dp2 x cp2 with ep4 (EP folded over CP) and on a
// data-parallel mesh (dp2, no EP), with parity.
TEST_F(CheckpointRun, MoeReshardsBetweenExpertParallelSizes) {
  const auto save = scenario("save", {{"dp", 4}, {"ep", 2}}, 2, "mp_ep.json");
  auto [code, out] =
      shardcheck("run " + save.string() + " --checkpoint-dir " + (dir_ / "ck").string());
  ASSERT_EQ(code, 0) << out;
  ASSERT_TRUE(fs::exists(dir_ / "ck" / "step-2" / "SUCCESS")) << out;
  fs::remove_all(dir_ / "ck" / "step-4");  // resume from step 2: steps 3 and 4 on the new mesh
  for (const nlohmann::json& target :
       {nlohmann::json{{"dp", 4}, {"ep", 4}}, nlohmann::json{{"dp", 2}, {"cp", 2}, {"ep", 4}},
        nlohmann::json{{"dp", 2}, {"ep", 1}}}) {
    const auto resume = scenario("resume", target, 2, "mp_ep.json");
    std::tie(code, out) = shardcheck("run " + resume.string() + " --resume " +
                                     (dir_ / "ck").string() + " --report " + (dir_ / "r").string());
    ASSERT_EQ(code, 0) << target.dump() << ": " << out;
    const auto row = read_json(dir_ / "r" / "report.json").at("parity")[0];
    EXPECT_NE(row.at("resumed_from").get<std::string>().find("step-2"), std::string::npos)
        << target.dump();
    EXPECT_EQ(row.at("steps").size(), 2u) << target.dump();
    EXPECT_EQ(row.at("world_size"), target.at("dp").get<int>() * target.value("cp", 1));
    EXPECT_LE(row.at("max_rel_err").get<double>(), 1e-10) << target.dump();
  }
}

// The bf16 recipe rounds a tied embedding's two uses apart on a pipeline (they live on two
// stages) and as their sum on one stage: a pp2 checkpoint resumed on dp2 (and back) is judged
// against the reference that rounds as the saver did up to the save and as the new mesh after it.
TEST_F(CheckpointRun, Bf16TiedResumeAcrossThePipelineFollowsEachMeshsRecipe) {
  for (const auto& [from, to] :
       {std::pair{nlohmann::json{{"pp", 2}, {"pp_schedule", "1f1b"}}, nlohmann::json{{"dp", 2}}},
        std::pair{nlohmann::json{{"dp", 2}}, nlohmann::json{{"pp", 2}, {"pp_schedule", "1f1b"}}}}) {
    fs::remove_all(dir_ / "ck");
    const auto save = scenario("save", from, 2, "mp_bf16.json");
    auto [code, out] =
        shardcheck("run " + save.string() + " --checkpoint-dir " + (dir_ / "ck").string());
    ASSERT_EQ(code, 0) << out;
    fs::remove_all(dir_ / "ck" / "step-4");  // resume from step 2: steps 3 and 4 on the new mesh
    const auto resume = scenario("resume", to, 2, "mp_bf16.json");
    std::tie(code, out) = shardcheck("run " + resume.string() + " --resume " +
                                     (dir_ / "ck").string() + " --report " + (dir_ / "r").string());
    EXPECT_EQ(code, 0) << from.dump() << " -> " << to.dump() << ": " << out;
    const auto row = read_json(dir_ / "r" / "report.json").at("parity")[0];
    EXPECT_EQ(row.at("steps").size(), 2u);
    EXPECT_GT(row.at("margin").get<double>(), 10.0) << out;
  }
}

TEST_F(CheckpointRun, SameTopologyResumeIsBitwise) {
  const auto s = scenario("same", {{"dp", 3}, {"zero", 2}}, 2);
  auto [code, out] = shardcheck("run " + s.string() + " --checkpoint-dir " +
                                (dir_ / "ck").string() + " --report " + (dir_ / "full").string());
  ASSERT_EQ(code, 0) << out;
  fs::remove_all(dir_ / "ck" / "step-4");  // resume from step 2
  std::tie(code, out) = shardcheck("run " + s.string() + " --resume " + (dir_ / "ck").string() +
                                   " --report " + (dir_ / "resumed").string());
  ASSERT_EQ(code, 0) << out;
  const auto full = read_json(dir_ / "full" / "report.json").at("parity")[0].at("steps");
  const auto resumed = read_json(dir_ / "resumed" / "report.json").at("parity")[0].at("steps");
  ASSERT_EQ(resumed.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(resumed[i].at("step"), full[i + 2].at("step"));
    // Exact: the same doubles, not merely within tolerance.
    EXPECT_EQ(resumed[i].at("loss").get<double>(), full[i + 2].at("loss").get<double>());
    EXPECT_EQ(resumed[i].at("max_rel_err").get<double>(),
              full[i + 2].at("max_rel_err").get<double>());
  }
}

TEST_F(CheckpointRun, CorruptNewestCheckpointIsRefusedNamingShardAndPreviousGood) {
  const auto s = scenario("corrupt", {{"dp", 2}}, 2);
  auto [code, out] =
      shardcheck("run " + s.string() + " --checkpoint-dir " + (dir_ / "ck").string());
  ASSERT_EQ(code, 0) << out;
  fs::path victim;
  for (const auto& e : fs::directory_iterator(dir_ / "ck" / "step-4"))
    if (e.path().extension() == ".shard") victim = e.path();
  ASSERT_FALSE(victim.empty());
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(-1, std::ios::end);
    f.write(&c, 1);
  }
  std::tie(code, out) = shardcheck("run " + s.string() + " --resume " + (dir_ / "ck").string());
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("checksum_mismatch"), std::string::npos) << out;
  EXPECT_NE(out.find(victim.filename().string()), std::string::npos) << out;
  EXPECT_NE(out.find("step-2"), std::string::npos) << "previous good checkpoint named\n" << out;
}

// A checkpoint that validates but is not this run's (another seed), or whose cursor is out of
// range, is refused before any rank starts: exit 1 naming the field, not exit 3 from inside a
// rank (or a resume at a garbage sampler offset).
TEST_F(CheckpointRun, AnotherRunsOrAnOutOfRangeCursorIsRefusedNamingTheField) {
  const auto s = scenario("cursor", {{"dp", 2}}, 2);
  auto [code, out] =
      shardcheck("run " + s.string() + " --checkpoint-dir " + (dir_ / "ck").string());
  ASSERT_EQ(code, 0) << out;
  auto other = read_json(s);
  other["seed"] = other.value("seed", 1234) + 1;
  const fs::path reseeded = dir_ / "reseeded.json";
  std::ofstream(reseeded) << other.dump(2);
  std::tie(code, out) =
      shardcheck("run " + reseeded.string() + " --resume " + (dir_ / "ck").string());
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("training.seed"), std::string::npos) << out;
  // A hand-edited sampler offset, committed consistently (the marker pins the edited manifest).
  for (const auto& [key, value] : {std::pair<const char*, std::int64_t>{"offset", -5},
                                   {"offset", std::int64_t{1} << 62},
                                   {"steps", 0}}) {  // one batch per step: 4 at step 4
    const fs::path step = dir_ / "ck" / "step-4";
    auto manifest = read_json(step / "manifest.json");
    manifest["sampler"][key] = value;
    const std::string text = manifest.dump(1) + "\n";
    std::ofstream(step / "manifest.json") << text;
    auto marker = read_json(step / "SUCCESS");
    marker["manifest_xxh3"] = ck::hex64(ck::xxh3(std::as_bytes(std::span(text))));
    std::ofstream(step / "SUCCESS") << marker.dump() << "\n";
    std::tie(code, out) = shardcheck("run " + s.string() + " --resume " + (dir_ / "ck").string());
    EXPECT_EQ(code, 1) << out;
    EXPECT_NE(out.find("sampler." + std::string(key) + " is " + std::to_string(value)),
              std::string::npos)
        << out;
  }
}

// A checkpoint of another recipe (anything that changes the trajectory: the LR schedule's length,
// dropout, the optimizer, clipping, precision, micro-batching, the data) is refused before any
// rank starts: exit 1 naming the field's JSON path in the manifest and both values, and whether an
// older checkpoint passes (none here: both are of the saved recipe). Before, `train.steps` 4 -> 6
// and `model.dropout` resumed and failed parity with no hint.
TEST_F(CheckpointRun, ResumeOfAnotherRecipeIsRefusedNamingTheFieldAndBothValues) {
  const auto s = scenario("recipe", {{"dp", 2}}, 2);
  save_two(s);
  const auto base = read_json(s);
  const auto& o = base.at("train").at("optimizer");
  ASSERT_EQ(base.at("model").at("dropout"), 0.1);
  ASSERT_EQ(base.at("train").at("micro_batch"), 2);
  struct Edit {
    std::function<void(nlohmann::json&)> edit;
    std::string says;
  };
  const double lr = o.at("lr").get<double>();
  const std::vector<Edit> edits = {
      {[](auto& j) { j["train"]["steps"] = 6; },
       "$.training.steps is 4 in the checkpoint, 6 in this run ($.train.steps)"},
      {[](auto& j) { j["model"]["dropout"] = 0.5; },
       "$.training.model.dropout is 0.1 in the checkpoint, 0.5 in this run ($.model.dropout)"},
      {[](auto& j) { j["train"]["micro_batch"] = 4; },
       "$.training.micro_batch is 2 in the checkpoint, 4 in this run"},
      {[](auto& j) { j["train"]["precision"] = "f32"; },
       "$.training.precision is \"f64\" in the checkpoint, \"f32\" in this run"},
      {[](auto& j) { j["data"]["documents"] = 321; },
       "$.training.data.documents is 320 in the checkpoint, 321 in this run"},
      {[](auto& j) { j["data"]["packing"] = false; },
       "$.training.data.packing is true in the checkpoint, false in this run"},
      {[lr](auto& j) { j["train"]["optimizer"]["lr"] = lr * 2; },
       "$.optimizer.lr is " + nlohmann::json(lr).dump() + " in the checkpoint, " +
           nlohmann::json(lr * 2).dump() + " in this run ($.train.optimizer.lr)"},
      {[](auto& j) { j["train"]["optimizer"]["weight_decay"] = 0.25; },
       "$.optimizer.weight_decay is " + nlohmann::json(o.value("weight_decay", 0.1)).dump() +
           " in the checkpoint, 0.25 in this run"},
      {[](auto& j) {
         j["train"]["optimizer"]["betas"] = {0.8, 0.95};
       },
       "$.optimizer.beta1 is 0.9 in the checkpoint, 0.8 in this run ($.train.optimizer.betas[0])"},
      {[](auto& j) { j["train"]["clip_grad_norm"] = 0.5; }, "in this run ($.train.clip_grad_norm)"},
      {[](auto& j) { j["train"]["optimizer"]["warmup"] = 2; },
       "$.lr_schedule.warmup is " + nlohmann::json(o.value("warmup", 1)).dump() +
           " in the checkpoint, 2 in this run"},
  };
  for (const Edit& e : edits) {
    auto j = base;
    e.edit(j);
    const fs::path other = dir_ / "other.json";
    std::ofstream(other) << j.dump(2);
    const auto [code, out] =
        shardcheck("run " + other.string() + " --resume " + (dir_ / "ck").string());
    EXPECT_EQ(code, 1) << e.says << "\n" << out;
    EXPECT_NE(out.find(e.says), std::string::npos) << out;
    EXPECT_NE(out.find("previous good checkpoint: none"), std::string::npos) << out;
    EXPECT_EQ(out.find("Rank "), std::string::npos) << "refused before any rank starts\n" << out;
  }
}

// A newest checkpoint of another recipe, or one written before a field was recorded, names the
// previous good checkpoint (one that passes every check); out-of-range optimizer and schedule
// values are refused when read, naming the field: lr 5 (in range, not this run's), weight decay
// -1, lr 1e308, a NaN or an overflowing number (not JSON). Each edit is re-signed.
TEST_F(CheckpointRun, AManifestOfAnotherRecipeOrOutOfRangeValuesIsRefusedNamingThePreviousGood) {
  const auto s = scenario("range", {{"dp", 2}}, 2);
  save_two(s);
  const fs::path step4 = dir_ / "ck" / "step-4";
  const std::string pristine = slurp_bytes(step4 / "manifest.json");
  const std::string marker = slurp_bytes(step4 / "SUCCESS");
  struct Edit {
    std::function<void(nlohmann::json&)> edit;
    std::string says;
    std::function<void(std::string&)> text_edit = {};
  };
  const auto replace = [](const std::string& from, const std::string& to) {
    return [from, to](std::string& text) {
      const auto at = text.find(from);
      ASSERT_NE(at, std::string::npos) << from;
      text.replace(at, from.size(), to);
    };
  };
  const std::vector<Edit> edits = {
      {[](auto& j) { j["training"]["model"]["dropout"] = 0.3; },
       "$.training.model.dropout is 0.3 in the checkpoint, 0.1 in this run"},
      {[](auto& j) { j["training"].erase("micro_batch"); },
       "$.training.micro_batch is absent in the checkpoint, 2 in this run"},
      {[](auto& j) { j["training"]["model"].erase("dropout"); },
       "$.training.model.dropout is absent in the checkpoint"},
      {[](auto& j) { j["optimizer"]["lr"] = 5; }, "$.optimizer.lr is 5 in the checkpoint"},
      {[](auto& j) { j["optimizer"]["weight_decay"] = -1; },
       "$.optimizer.weight_decay is -1, outside [0, 10]"},
      {[](auto& j) { j["optimizer"]["lr"] = 1e308; }, "$.optimizer.lr is 1e+308, outside [0, 10]"},
      {[](auto& j) { j["lr_schedule"]["min_lr"] = 1e308; },
       "$.lr_schedule.min_lr is 1e+308, outside [0, 10]"},
      {[](auto& j) { j["optimizer"]["eps"] = 0; }, "$.optimizer.eps is 0, outside [1e-30, 1]"},
      {[](auto& j) { j["optimizer"]["beta2"] = 1; }, "$.optimizer.beta2 is 1, outside [0, 1)"},
      {[](auto& j) { j["optimizer"]["lr"] = "fast"; },
       "$.optimizer.lr is \"fast\", expected a number"},
      {[](auto& j) { j["lr_schedule"]["total_steps"] = 0; },
       "$.lr_schedule.total_steps is 0, outside [1, 1e+07]"},
      {[](auto& j) { j["optimizer"]["lr"] = "@"; }, "1e400",
       replace("\"@\"", "1e400")},  // nlohmann refuses a number that overflows a double
      {[](auto& j) { j["optimizer"]["lr"] = "@"; }, "not valid JSON", replace("\"@\"", "NaN")},
  };
  for (const Edit& e : edits) {
    std::ofstream(step4 / "manifest.json", std::ios::binary | std::ios::trunc) << pristine;
    std::ofstream(step4 / "SUCCESS", std::ios::binary | std::ios::trunc) << marker;
    reseal(step4, e.edit, e.text_edit);
    const auto [code, out] =
        shardcheck("run " + s.string() + " --resume " + (dir_ / "ck").string());
    EXPECT_EQ(code, 1) << e.says << "\n" << out;
    EXPECT_NE(out.find(e.says), std::string::npos) << out;
    EXPECT_NE(out.find("the previous good checkpoint is " + (dir_ / "ck" / "step-2").string()),
              std::string::npos)
        << out;
  }
}

// A checkpoint whose manifest lacks a tensor the engine reads is refused before any rank starts:
// exit 1 naming the tensor and the previous good checkpoint. Before, the ranks failed mid-import:
// exit 3, "Rank 0 failed: bad_request".
TEST_F(CheckpointRun, AMissingTensorIsRefusedBeforeAnyRankStartsNamingThePreviousGood) {
  const auto s = scenario("tensors", {{"dp", 2}}, 2);
  save_two(s);
  const fs::path step4 = dir_ / "ck" / "step-4";
  const std::string pristine = slurp_bytes(step4 / "manifest.json");
  const std::string marker = slurp_bytes(step4 / "SUCCESS");
  for (const std::string victim :
       {"exp_avg_sq/final_norm.weight", "param/embed.weight", "optimizer/step"}) {
    std::ofstream(step4 / "manifest.json", std::ios::binary | std::ios::trunc) << pristine;
    std::ofstream(step4 / "SUCCESS", std::ios::binary | std::ios::trunc) << marker;
    reseal(step4, [&](nlohmann::json& j) {
      auto& ts = j["tensors"];
      for (std::size_t i = 0; i < ts.size(); ++i)
        if (ts[i]["name"] == victim) return ts.erase(i);
      FAIL() << victim << " not in the manifest";
    });
    const auto [code, out] =
        shardcheck("run " + s.string() + " --resume " + (dir_ / "ck").string());
    EXPECT_EQ(code, 1) << victim << "\n" << out;
    EXPECT_NE(out.find("incomplete_coverage: tensor '" + victim + "'"), std::string::npos) << out;
    EXPECT_NE(out.find("$.tensors lacks '" + victim + "'"), std::string::npos) << out;
    EXPECT_NE(out.find("the previous good checkpoint is " + (dir_ / "ck" / "step-2").string()),
              std::string::npos)
        << out;
    EXPECT_EQ(out.find("Rank "), std::string::npos) << out;
  }
}

// One run per checkpoint directory: while another holds it, a run is refused at once (exit 2)
// naming the holder, and writes nothing there.
TEST_F(CheckpointRun, ASecondRunOnTheDirectoryIsRefusedNamingTheHolder) {
  const auto s = scenario("locked", {{"dp", 2}}, 2);
  const ck::DirLock held(dir_ / "ck");
  const auto [code, out] =
      shardcheck("run " + s.string() + " --checkpoint-dir " + (dir_ / "ck").string());
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("in use by another run (pid " + std::to_string(::getpid())), std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(dir_ / "ck" / "step-2"));
  // A matrix saves each configuration into DIR/<label>: a run holding that folder alone is
  // another writer of it, refused the same way.
  auto two = read_json(s);
  two["matrix"] = {{{"dp", 2}}, {{"dp", 2}, {"zero", 1}}};
  const fs::path both = dir_ / "two.json";
  std::ofstream(both) << two.dump(2);
  const ck::DirLock inner(dir_ / "ck2" / "dp2");
  const auto [code2, out2] =
      shardcheck("run " + both.string() + " --checkpoint-dir " + (dir_ / "ck2").string());
  EXPECT_EQ(code2, 2) << out2;
  EXPECT_NE(out2.find("in use by another run"), std::string::npos) << out2;
}

TEST_F(CheckpointRun, BadOptionsExitTwo) {
  const auto never = scenario("never", {{"dp", 2}}, 0);
  EXPECT_EQ(
      shardcheck("run " + never.string() + " --checkpoint-dir " + (dir_ / "ck").string()).first, 2);
  EXPECT_EQ(shardcheck("run " + never.string() + " --resume " + (dir_ / "nope").string()).first, 2);
}

}  // namespace
