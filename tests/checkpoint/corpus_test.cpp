// Replays the fuzz seed corpus (fuzz/corpus/<target>/*) through the fuzz target bodies with the
// regular compiler, so the parsers' handling of each seed is checked on every build, and checks
// that the corpus holds both inputs that parse and inputs that are refused.
#include <gtest/gtest.h>

#include <fstream>

#include "fuzz/targets.hpp"
#include "tests/checkpoint/support.hpp"

namespace shardcheck::testing {
namespace {

std::vector<std::vector<std::uint8_t>> corpus(const std::string& target) {
  std::vector<std::vector<std::uint8_t>> out;
  const fs::path dir = fs::path(SHARDCHECK_SOURCE_DIR) / "fuzz" / "corpus" / target;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    out.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return out;
}

TEST(FuzzCorpus, ManifestSeedsParseOrFailClosed) {
  int ok = 0, refused = 0;
  for (const auto& in : corpus("manifest"))
    (fuzz::manifest_one(in.data(), in.size()) ? ok : refused)++;
  EXPECT_GT(ok, 0);
  EXPECT_GT(refused, 0);
}

TEST(FuzzCorpus, ShardHeaderSeedsParseOrFailClosed) {
  int ok = 0, refused = 0;
  for (const auto& in : corpus("shard_header"))
    (fuzz::shard_header_one(in.data(), in.size()) ? ok : refused)++;
  EXPECT_GT(ok, 0);
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace shardcheck::testing
