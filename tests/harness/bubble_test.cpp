// The pipeline bubble in report.json: measured on the virtual timeline beside (p-1)/(v*m+p-1).
// Compute-bound (a slow device, free links): the measure sits just above the formula (the head
// makes the last stage the longest); the interleaved schedule's is smaller; none without pp.
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

}  // namespace
}  // namespace shardcheck::harness
