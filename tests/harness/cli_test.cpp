// The shardcheck executable: exit codes for every class of bad input (2), success (0), and the
// fields of `bench collectives --json`, read back as JSON (never compared as stdout text).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "cli_support.hpp"

namespace {

struct Result {
  int code = -1;
  std::string output;
};

// `shardcheck ARGS` (cli_support.hpp) as {code, output}.
Result run_cli(const std::string& args) {
  auto [code, out] = shardcheck::testing::shardcheck(args);
  return {code, std::move(out)};
}

using shardcheck::testing::has;

TEST(Cli, BadInputExitsTwoAndSaysWhat) {
  const std::pair<std::string, std::string> cases[] = {
      {"", "subcommand"},
      {"bench", "subcommand"},
      {"nonsense", "nonsense"},
      {"bench collectives --op all_sum", "--op: unknown collective 'all_sum'"},
      {"bench collectives --dtype f8", "--dtype: unknown dtype 'f8'"},
      {"bench collectives --redop mean", "--redop: unknown reduction 'mean'"},
      {"bench collectives --ranks 0", "--ranks"},
      {"bench collectives --ranks two", "--ranks"},
      {"bench collectives -b 1MB -e 4KB", "--min-bytes must be positive and at most --max-bytes"},
      {"bench collectives --backend mpi", "--backend"},
      {"bench collectives --frobnicate", "frobnicate"},
  };
  for (const auto& [args, message] : cases) {
    const Result r = run_cli(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_TRUE(has(r.output, message)) << args << "\n" << r.output;
  }
}

TEST(Cli, HelpExitsZero) {
  const Result r = run_cli("bench collectives --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(has(r.output, "--min-bytes"));
}

TEST(Cli, BenchWritesJsonWithNcclTestsFields) {
  const auto path = std::filesystem::temp_directory_path() / "shardcheck_cli_bench.json";
  const Result r = run_cli(
      "bench collectives --ranks 4 --op all_gather --dtype bf16 -b 1KB -e 8KB --iters 2 --json " +
      path.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "# Out of bounds values : 0 OK")) << r.output;
  std::ifstream f(path);
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j.at("backend"), "sim");
  EXPECT_EQ(j.at("ranks"), 4);
  EXPECT_EQ(j.at("op"), "all_gather");
  EXPECT_EQ(j.at("dtype"), "bf16");
  EXPECT_DOUBLE_EQ(j.at("busbw_factor").get<double>(), 0.75);
  ASSERT_EQ(j.at("rows").size(), 4u);
  std::size_t bytes = 1024;
  for (const auto& row : j.at("rows")) {
    EXPECT_EQ(row.at("bytes"), bytes);
    EXPECT_EQ(row.at("count").get<std::size_t>() * 2, bytes);
    for (const char* mode : {"out_of_place", "in_place"}) {
      const auto& c = row.at(mode);
      EXPECT_EQ(c.at("wrong"), 0);
      EXPECT_GT(c.at("time_us").get<double>(), 0.0);
      EXPECT_NEAR(c.at("busbw_gbps").get<double>(), c.at("algbw_gbps").get<double>() * 0.75, 1e-9);
    }
    bytes *= 2;
  }
  std::filesystem::remove(path);
}

// --max-time takes a finite number of seconds: NaN (which passed CLI11's non-negative check),
// infinities and negative numbers are refused, exit 2, naming the option; 0 still means no limit.
TEST(Cli, MaxTimeMustBeFinite) {
  for (const char* value : {"nan", "NaN", "inf", "-inf", "-1", "1e999", "5s"}) {
    const Result r = run_cli(std::string("bench collectives --ranks 2 -b 1KB -e 1KB --iters 1 "
                                         "--max-time ") +
                             value);
    EXPECT_EQ(r.code, 2) << value << "\n" << r.output;
    EXPECT_TRUE(has(r.output, "--max-time")) << value << "\n" << r.output;
  }
  const Result r = run_cli("bench collectives --ranks 2 -b 1KB -e 1KB --iters 1 --max-time 0");
  EXPECT_EQ(r.code, 0) << r.output;
}

// A size range that holds no element of the dtype (or, for the ops that split the buffer, no
// multiple of the ranks) printed no row and exited 0: refused, exit 2, saying why.
TEST(Cli, BenchSizeRangeWithNoRowIsRefused) {
  Result r = run_cli("bench collectives -b 3 -e 7 --dtype f64");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "no size in the range")) << r.output;
  EXPECT_TRUE(has(r.output, "one element of 8 bytes")) << r.output;
  r = run_cli("bench collectives --op all_gather --ranks 8 -b 8 -e 16 --dtype f32");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "8 elements of 4 bytes (all_gather splits")) << r.output;
}

// 512 ranks x 1,000,000 iterations of 4 KiB was estimated at 52 s, accepted, and ran ~13 h: the
// estimate now counts each collective's per-op cost (budget.hpp) and the run is refused under
// --max-time naming the estimate and what to shrink; a small run still passes the same limit.
TEST(Cli, BenchPastMaxTimeIsRefusedWithThePerOpCost) {
  Result r = run_cli("bench collectives --ranks 512 -b 4KB -e 4KB --iters 1000000 --max-time 60");
  EXPECT_EQ(r.code, 2) << r.output;
  for (const char* part : {"bench collectives: needs at least", "more than 60 s (--max-time",
                           "--iters 1000000", "512 ranks", "shrink --iters"})
    EXPECT_TRUE(has(r.output, part)) << part << "\n" << r.output;
  r = run_cli("bench collectives --ranks 4 -b 1KB -e 4KB --iters 3 --max-time 60");
  EXPECT_EQ(r.code, 0) << r.output;
}

}  // namespace
