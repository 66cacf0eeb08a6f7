// The pipeline bubble in report.json: measured on the virtual timeline beside (p-1)/(v*m+p-1).
// Compute-bound (a slow device, free links): the measure sits just above the formula (the head
// makes the last stage the longest); the interleaved schedule's is smaller; none without pp. With
// real link latencies, the schedule's bubble comes from the run replayed with free links.
#include <gtest/gtest.h>

#include "tests/harness/cli_support.hpp"

namespace shardcheck::harness {
namespace {

using shardcheck::testing::read_json;
using shardcheck::testing::shardcheck;
using shardcheck::testing::TempDir;

nlohmann::json scenario() {
  return nlohmann::json::parse(R"({
    "name": "bubble", "seed": 3,
    "model": {"vocab": 32, "hidden": 16, "layers": 8, "heads": 4, "kv_heads": 2, "ffn": 24,
              "seq_len": 16},
    "train": {"steps": 2, "global_batch": 16, "micro_batch": 2},
    "data": {"documents": 200, "min_len": 3, "max_len": 20},
    "parallel": {"pp": 4},
    "matrix": [{"pp": 4, "pp_schedule": "gpipe"}, {"pp": 4, "pp_schedule": "1f1b"},
               {"pp": 4, "pp_schedule": "interleaved", "virtual_stages": 2}, {"dp": 2, "pp": 1}],
    "topology": {"intra_node": {"bandwidth_gbps": 1e9, "latency_us": 0},
                 "inter_node": {"bandwidth_gbps": 1e9, "latency_us": 0},
                 "device": {"peak_tflops": 1e-6, "hbm_gbps": 1e9}}})");
}

TEST(PipelineBubble, ReportedBesideTheFormula) {
  const TempDir tmp("shardcheck_bubble");
  const auto [code, out] = shardcheck("run " + tmp.write("s.json", scenario()).string() +
                                      " --report " + tmp.path().string());
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("bubble"), std::string::npos) << out;
  const auto rows = read_json(tmp.path() / "report.json").at("parity");
  ASSERT_EQ(rows.size(), 4u);
  double measured[3];
  for (int i = 0; i < 3; ++i) {
    const auto& p = rows[static_cast<std::size_t>(i)].at("pipeline");
    const double formula = p.at("bubble_formula").get<double>();
    measured[i] = p.at("bubble_measured").get<double>();
    EXPECT_EQ(p.at("microbatches"), 8);
    EXPECT_EQ(p.at("stage_bubble").size(), 4u);
    EXPECT_GE(measured[i], formula - 1e-9) << rows[static_cast<std::size_t>(i)].at("config");
    EXPECT_LE(measured[i], formula + 0.1) << rows[static_cast<std::size_t>(i)].at("config");
  }
  EXPECT_NEAR(rows[0].at("pipeline").at("bubble_formula").get<double>(), 3.0 / 11.0, 1e-12);
  EXPECT_NEAR(rows[2].at("pipeline").at("bubble_formula").get<double>(), 3.0 / 19.0, 1e-12);
  EXPECT_LT(measured[2], measured[1]);  // interleaving shrinks the bubble
  EXPECT_TRUE(rows[3].at("pipeline").is_null());
}

// With slow links (1 s a message on the slow device: as long as dozens of ops) the compute stream
// also waits on the sends and collectives, so its idle time as run is far above the formula; the
// run replayed with free links measures the schedule's own bubble, which sits at the formula for
// all three schedules (just above it: the head makes the last stage the longest), and is what
// timing.bubble_fraction reports.
TEST(PipelineBubble, TheScheduleBubbleIsMeasuredWithFreeLinks) {
  auto j = scenario();
  for (const char* link : {"intra_node", "inter_node"})
    j["topology"][link] = {{"bandwidth_gbps", 1e9}, {"latency_us", 1e6}};
  const TempDir tmp("shardcheck_bubble_free");
  const auto [code, out] =
      shardcheck("run " + tmp.write("s.json", j).string() + " --report " + tmp.path().string());
  ASSERT_EQ(code, 0) << out;
  const auto rows = read_json(tmp.path() / "report.json").at("parity");
  double schedule[3];
  for (int i = 0; i < 3; ++i) {
    const auto& row = rows[static_cast<std::size_t>(i)];
    const auto& p = row.at("pipeline");
    const double formula = p.at("bubble_formula").get<double>();
    schedule[i] = p.at("bubble_schedule").get<double>();
    EXPECT_GE(schedule[i], formula - 1e-9) << row.at("config");
    EXPECT_LE(schedule[i], formula + 0.1) << row.at("config");
    EXPECT_GT(p.at("bubble_measured").get<double>(), schedule[i] + 0.1) << row.at("config");
    EXPECT_NEAR(p.at("exposed_comm_wait").get<double>(),
                p.at("bubble_measured").get<double>() - schedule[i], 1e-12);
    EXPECT_EQ(row.at("timing").at("bubble_fraction").get<double>(), schedule[i]);
  }
  EXPECT_LT(schedule[2], schedule[1]);  // interleaving shrinks the bubble
  EXPECT_EQ(rows[3].at("timing").at("bubble_fraction").get<double>(), 0.0);
}

}  // namespace
}  // namespace shardcheck::harness
