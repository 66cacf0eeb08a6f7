// The CLI writes only inside the directories the user named, and refuses before anything runs
// (exit 2, naming the path) what it cannot write there: a symlink at any level below --report,
// --checkpoint-dir or --dump-tensors (its target untouched), a plain file where traces/ goes,
// two scenarios whose traces would share a directory, a scenario file given twice, an output that
// is an input, a matrix directory that cannot be read (with the reason).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/harness/cli_support.hpp"

namespace {

namespace fs = std::filesystem;
using shardcheck::testing::has;
using shardcheck::testing::shardcheck;
using shardcheck::testing::small_scenario;
using shardcheck::testing::TempDir;

std::string get(const fs::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

class Confined : public ::testing::Test {
 protected:
  TempDir tmp_{"shardcheck_confined_" +
               std::string(::testing::UnitTest::GetInstance()->current_test_info()->name())};
  TempDir other_{"shardcheck_confined_other_" +
                 std::string(::testing::UnitTest::GetInstance()->current_test_info()->name())};
  // A one-step, two-configuration scenario named `name`, saved as DIR/file.
  fs::path scenario(const std::string& file, const std::string& name = "conf") {
    auto j = small_scenario(name, nlohmann::json::array({{{"dp", 2}}, {{"dp", 2}, {"zero", 1}}}),
                            11, 2);
    j["checkpoint"] = {{"every", 1}, {"keep", 1}};
    return tmp_.write(file, j);
  }
  // The other directory holds a file the run must never touch.
  void plant_victim() const { std::ofstream(other_.path() / "victim") << "keep"; }
  void expect_victim_untouched() const {
    EXPECT_EQ(get(other_.path() / "victim"), "keep");
    EXPECT_EQ(std::distance(fs::directory_iterator(other_.path()), fs::directory_iterator{}), 1);
  }
};

// A symlink at each level below --report: the run is refused before it starts, nothing is
// written through the link, and no manifest.json is left behind.
TEST_F(Confined, ASymlinkAnywhereBelowTheReportDirectoryIsRefusedBeforeTheRun) {
  const fs::path s = scenario("s.json");
  const std::string trace_dir = "traces/conf";
  for (const std::string& level : {std::string("traces"), trace_dir, trace_dir + "/00-dp2.json",
                                   std::string("report.json"), std::string("index.html"),
                                   std::string("manifest.json")}) {
    plant_victim();
    const fs::path report = tmp_.path() / "report";
    fs::remove_all(report);
    fs::create_directories((report / level).parent_path());
    const bool file_level = has(level, ".");
    fs::create_symlink(file_level ? other_.path() / "victim" : other_.path(), report / level);
    const auto [code, out] = shardcheck("run " + s.string() + " --report " + report.string());
    EXPECT_EQ(code, 2) << level << "\n" << out;
    EXPECT_TRUE(has(out, "symlink")) << level << "\n" << out;
    EXPECT_FALSE(has(out, "parity:")) << level << ": the run started\n" << out;
    if (level != "manifest.json") {
      EXPECT_FALSE(fs::exists(report / "manifest.json")) << level;
    }
    expect_victim_untouched();
  }
}

TEST_F(Confined, APlainFileWhereTracesGoIsRefusedBeforeTheRun) {
  const fs::path s = scenario("s.json");
  const fs::path report = tmp_.path() / "report";
  fs::create_directories(report);
  std::ofstream(report / "traces") << "a file";
  const auto [code, out] = shardcheck("run " + s.string() + " --report " + report.string());
  EXPECT_EQ(code, 2) << out;
  EXPECT_TRUE(has(out, "traces")) << out;
  EXPECT_FALSE(fs::exists(report / "manifest.json"));
}

// --checkpoint-dir D where D/<label> links to another directory holding a committed checkpoint:
// refused, no lock or step written there, nothing of it deleted.
TEST_F(Confined, ACheckpointDirectoryBelowTheNamedOneThatIsASymlinkIsRefused) {
  const fs::path s = scenario("s.json");
  plant_victim();
  const fs::path ck = tmp_.path() / "ck";
  fs::create_directories(ck);
  fs::create_symlink(other_.path(), ck / "dp2");
  const auto [code, out] = shardcheck("run " + s.string() + " --checkpoint-dir " + ck.string());
  EXPECT_EQ(code, 2) << out;
  EXPECT_TRUE(has(out, "symlink")) << out;
  expect_victim_untouched();
}

TEST_F(Confined, ANoiseDirectoryThatIsASymlinkIsRefusedForDumpTensors) {
  const fs::path s = scenario("s.json");
  plant_victim();
  const fs::path dump = tmp_.path() / "dump";
  fs::create_directories(dump);
  fs::create_symlink(other_.path(), dump / "noise");
  const auto [code, out] = shardcheck("run " + s.string() + " --dump-tensors " + dump.string());
  EXPECT_EQ(code, 2) << out;
  EXPECT_TRUE(has(out, "symlink")) << out;
  expect_victim_untouched();
}

TEST_F(Confined, ScenariosWhoseTracesWouldCollideAreRefusedNamingBoth) {
  const fs::path a = scenario("a.json", "a/b"), b = scenario("b.json", "a_b");
  const auto [code, out] = shardcheck("matrix " + a.string() + " " + b.string() + " --report " +
                                      (tmp_.path() / "report").string());
  EXPECT_EQ(code, 2) << out;
  EXPECT_TRUE(has(out, "a/b") && has(out, "a_b") && has(out, a.string()) && has(out, b.string()))
      << out;
  const auto [twice, out2] = shardcheck("matrix " + a.string() + " " + a.string());
  EXPECT_EQ(twice, 2) << out2;
  EXPECT_TRUE(has(out2, "given twice")) << out2;
}

TEST_F(Confined, AnOutputThatIsAnInputIsRefused) {
  const fs::path s = scenario("s.json");
  const std::string before = get(s);
  const auto [code, out] = shardcheck("run " + s.string() + " --junit " + s.string());
  EXPECT_EQ(code, 2) << out;
  EXPECT_TRUE(has(out, "--junit") && has(out, "input")) << out;
  EXPECT_EQ(get(s), before);
  const fs::path in_report = scenario("report.json");
  const auto [code2, out2] =
      shardcheck("run " + in_report.string() + " --report " + tmp_.path().string());
  EXPECT_EQ(code2, 2) << out2;
  EXPECT_TRUE(has(out2, "input")) << out2;
}

TEST_F(Confined, AMatrixDirectoryThatCannotBeReadSaysWhy) {
  const fs::path dir = tmp_.path() / "m";
  fs::create_directories(dir);
  fs::create_symlink("loop", dir / "loop");
  const auto [code, out] = shardcheck("matrix " + (dir / "loop").string());
  EXPECT_EQ(code, 2) << out;
  EXPECT_TRUE(has(out, "symbolic links")) << out;
  fs::create_symlink("loop.json", dir / "loop.json");  // a scenario in the directory that loops
  const auto [code2, out2] = shardcheck("matrix " + dir.string());
  EXPECT_EQ(code2, 2) << out2;
  EXPECT_TRUE(has(out2, "loop.json") && has(out2, "symbolic links")) << out2;
}

}  // namespace
