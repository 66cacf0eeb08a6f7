// report.json's MoE load (harness/moe_load.hpp): the reference run's per-expert load each step and
// layer, the totals, each EP configuration's load per EP rank, and the HTML section; null for a
// dense model.
#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "harness/html.hpp"
#include "harness/report.hpp"
#include "harness/runner.hpp"
#include "harness/scenario.hpp"

namespace shardcheck::harness {
namespace {

const std::string kMoeParityDir = std::string(SHARDCHECK_SCENARIOS_DIR) + "/parity/";

int64_t load_sum(const nlohmann::json& a) {
  int64_t s = 0;
  for (const auto& v : a) s += v.get<int64_t>();
  return s;
}

TEST(MoeLoad, TheReportShowsTheExpertLoadOfEveryStepAndEpRank) {
  Scenario s = load_scenario(kMoeParityDir + "mp_ep_f32.json");
  s.model.moe->capacity_factor = 0.5;  // some assignments dropped
  s.configs.resize(2);                 // dp2-ep2, dp4-ep4
  RunOptions o;
  o.schedule_bubble = false;
  const RunResult r = run_scenario(s, o);
  ASSERT_TRUE(r.pass());
  const nlohmann::json j = report_json(r, "sim");
  const nlohmann::json& m = j.at("moe");
  ASSERT_EQ(m.at("steps").size(), 2u);
  int64_t kept = 0, dropped = 0;
  for (const auto& step : m.at("steps")) {
    int64_t step_dropped = 0;
    ASSERT_EQ(step.at("layers").size(), 2u);  // 4 layers, every 2nd is MoE
    for (const auto& l : step.at("layers")) {
      EXPECT_EQ(l.at("routed").size(), 4u);
      EXPECT_EQ(load_sum(l.at("routed")) - load_sum(l.at("kept")), l.at("dropped").get<int64_t>());
      step_dropped += l.at("dropped").get<int64_t>();
      kept += load_sum(l.at("kept"));
    }
    EXPECT_EQ(step.at("dropped").get<int64_t>(), step_dropped);
    EXPECT_GT(step.at("aux").get<double>(), 0.0);
    dropped += step_dropped;
  }
  EXPECT_GT(dropped, 0);
  EXPECT_EQ(m.at("total").at("dropped").get<int64_t>(), dropped);
  EXPECT_EQ(load_sum(m.at("total").at("kept")), kept);
  EXPECT_GE(m.at("total").at("max_over_mean").get<double>(), 1.0);
  // EP coordinate e computes the kept assignments of experts [e*E/ep, (e+1)*E/ep).
  const auto& total_kept = m.at("total").at("kept");
  for (const auto& row : j.at("parity")) {
    const auto& ep = row.at("ep_load");
    const auto n = row.at("mesh").at("ep").get<std::size_t>();
    ASSERT_EQ(ep.at("kept").size(), n) << row.at("config");
    const std::size_t per = 4 / n;
    for (std::size_t e = 0; e < n; ++e) {
      int64_t want = 0;
      for (std::size_t x = e * per; x < (e + 1) * per; ++x) want += total_kept[x].get<int64_t>();
      EXPECT_EQ(ep.at("kept")[e].get<int64_t>(), want) << row.at("config") << " EP " << e;
    }
  }
  EXPECT_NE(render_html(j).find("MoE load"), std::string::npos);

  Scenario dense = load_scenario(kMoeParityDir + "data_parallel_f32.json");
  dense.configs.resize(1);
  const nlohmann::json d = report_json(run_scenario(dense, o), "sim");
  EXPECT_TRUE(d.at("moe").is_null());
  EXPECT_TRUE(d.at("parity")[0].at("ep_load").is_null());
}

}  // namespace
}  // namespace shardcheck::harness
