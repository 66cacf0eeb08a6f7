// Replays the scenario loader's fuzz seed corpus (fuzz/corpus/scenario/*) through the fuzz target's
// body with the regular compiler: the copies of committed scenarios load, every bad_* seed is
// refused with a ScenarioError (never another exception, which would escape this test).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/scenario_target.hpp"

namespace {

TEST(FuzzCorpus, ScenarioSeedsLoadOrAreRefused) {
  const std::filesystem::path dir = std::filesystem::path(SHARDCHECK_FUZZ_CORPUS_DIR) / "scenario";
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  int loaded = 0, refused = 0;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::vector<std::uint8_t> bytes{std::istreambuf_iterator<char>(in),
                                          std::istreambuf_iterator<char>()};
    const bool ok = shardcheck::fuzz::scenario_one(bytes.data(), bytes.size());
    const bool bad = f.filename().string().rfind("bad_", 0) == 0;
    EXPECT_EQ(ok, !bad) << f.filename();
    (ok ? loaded : refused)++;
  }
  EXPECT_GE(loaded, 10);
  EXPECT_GE(refused, 5);
}

}  // namespace
