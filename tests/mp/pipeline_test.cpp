// Pipeline parallelism: schedule properties (each action once, backward after forward, 1F1B's
// in-flight bound, Megatron's interleaved order worked by hand), the executor on the simulator
// against a single-stage toy model (gradients equal, no deadlock), the bubble measured on the
// simulator's timeline against (p-1)/(v*m + p-1), and the layer partition.
#include "parallel/mp/pipeline.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "sim/world.hpp"

namespace shardcheck::parallel {
namespace {

using Kind = PipeAction::Kind;

struct Config {
  PipeSchedule s;
  int p, m, v;
};

std::vector<Config> valid_configs() {
  std::vector<Config> out;
  for (const int p : {1, 2, 3, 4}) {
    for (int m = std::max(p, 1); m <= 3 * p + 1; ++m) {
      out.push_back({PipeSchedule::gpipe, p, m, 1});
      out.push_back({PipeSchedule::one_f_one_b, p, m, 1});
      for (const int v : {2, 3}) {
        if (m % p == 0) out.push_back({PipeSchedule::interleaved, p, m, v});
      }
    }
  }
  return out;
}

TEST(PipelineSchedule, EveryActionOnceAndEachBackwardAfterItsForward) {
  for (const Config& c : valid_configs()) {
    for (int s = 0; s < c.p; ++s) {
      SCOPED_TRACE(std::string(name_of(c.s)) + " p=" + std::to_string(c.p) + " m=" +
                   std::to_string(c.m) + " v=" + std::to_string(c.v) + " s=" + std::to_string(s));
      const auto acts = pipeline_schedule(c.s, c.p, s, c.m, c.v);
      ASSERT_EQ(acts.size(), static_cast<std::size_t>(2 * c.m * c.v));
      std::set<std::pair<int, int>> fwd, bwd;
      for (const PipeAction& a : acts) {
        ASSERT_GE(a.microbatch, 0);
        ASSERT_LT(a.microbatch, c.m);
        ASSERT_GE(a.chunk, 0);
        ASSERT_LT(a.chunk, c.v);
        const std::pair<int, int> id{a.microbatch, a.chunk};
        if (a.kind == Kind::forward) {
          EXPECT_TRUE(fwd.insert(id).second);
        } else {
          EXPECT_TRUE(fwd.contains(id)) << "backward before forward";
          EXPECT_TRUE(bwd.insert(id).second);
        }
      }
      EXPECT_EQ(fwd.size(), static_cast<std::size_t>(c.m * c.v));
      EXPECT_EQ(bwd.size(), fwd.size());
    }
  }
}

int max_in_flight(const std::vector<PipeAction>& acts) {
  int now = 0, most = 0;
  for (const PipeAction& a : acts) {
    now += a.kind == Kind::forward ? 1 : -1;
    most = std::max(most, now);
  }
  return most;
}

TEST(PipelineSchedule, OneFOneBKeepsAtMostPMinusStageInFlight) {
  for (const int m : {4, 5, 8}) {
    for (int s = 0; s < 4; ++s) {
      EXPECT_EQ(max_in_flight(pipeline_schedule(PipeSchedule::one_f_one_b, 4, s, m, 1)), 4 - s);
      EXPECT_EQ(max_in_flight(pipeline_schedule(PipeSchedule::gpipe, 4, s, m, 1)), m);
    }
  }
}

std::vector<PipeAction> parse(const std::string& text) {
  // "F0.0 B1.0": kind, microbatch, chunk.
  std::vector<PipeAction> out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != 'F' && text[i] != 'B') continue;
    const Kind k = text[i] == 'F' ? Kind::forward : Kind::backward;
    out.push_back({k, text[i + 1] - '0', text[i + 3] - '0'});
  }
  return out;
}

TEST(PipelineSchedule, InterleavedMatchesMegatronWorkedByHand) {
  // p = 2, v = 2, m = 4. Forward k runs chunk (k%4)/2 on microbatch (k/4)*2 + k%2; backward k
  // runs chunk 1-(k%4)/2. Warmup: stage 0 (2-0-1)*2 + (2-1)*2 = 4, stage 1 0 + 2 = 2.
  EXPECT_EQ(pipeline_schedule(PipeSchedule::interleaved, 2, 0, 4, 2),
            parse("F0.0 F1.0 F0.1 F1.1 "                      // warmup
                  "F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 "  // 1F1B
                  "B2.1 B3.1 B2.0 B3.0"));                    // cooldown
  EXPECT_EQ(pipeline_schedule(PipeSchedule::interleaved, 2, 1, 4, 2),
            parse("F0.0 F1.0 "
                  "F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 "
                  "B2.0 B3.0"));
  // m == p: every forward first (Megatron's all-warmup case).
  EXPECT_EQ(pipeline_schedule(PipeSchedule::interleaved, 2, 1, 2, 2),
            parse("F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0"));
  // 1F1B, p = 3, stage 0: warmup 2.
  EXPECT_EQ(pipeline_schedule(PipeSchedule::one_f_one_b, 3, 0, 4, 1),
            parse("F0.0 F1.0 F2.0 B0.0 F3.0 B1.0 B2.0 B3.0"));
}

void expect_error(PipeSchedule s, int p, int m, int v, const std::string& needle) {
  try {
    (void)pipeline_schedule(s, p, 0, m, v);
    ADD_FAILURE() << "no PipelineError for " << needle;
  } catch (const PipelineError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(PipelineSchedule, UnsupportedConfigurationsAreNamed) {
  expect_error(PipeSchedule::one_f_one_b, 4, 3, 1, "microbatches = 3 < stages = 4");
  expect_error(PipeSchedule::gpipe, 2, 1, 1, "microbatches = 1 < stages = 2");
  expect_error(PipeSchedule::interleaved, 4, 6, 2,
               "microbatches = 6 is not divisible by stages = 4");
  expect_error(PipeSchedule::interleaved, 2, 4, 1, "virtual_stages = 1, expected >= 2");
  expect_error(PipeSchedule::one_f_one_b, 2, 4, 2, "virtual_stages = 2, expected 1");
  EXPECT_THROW((void)pipeline_schedule(PipeSchedule::gpipe, 2, 2, 4, 1), PipelineError);
  EXPECT_NO_THROW((void)pipeline_schedule(PipeSchedule::gpipe, 1, 0, 1, 1));
}

TEST(PipelineBubble, FormulaAndMeasurement) {
  EXPECT_DOUBLE_EQ(bubble_formula(4, 8, 1), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(bubble_formula(4, 8, 2), 3.0 / 19.0);
  EXPECT_EQ(bubble_formula(1, 5, 1), 0.0);
  const std::vector<Interval> iv{{1, 3}, {2, 4}, {6, 7}, {-1, 0.5}, {9, 12}};
  // Busy within [0, 10]: [0, 0.5] + [1, 4] + [6, 7] + [9, 10] = 5.5.
  EXPECT_DOUBLE_EQ(measured_bubble(iv, 0, 10), 1 - 5.5 / 10);
  EXPECT_DOUBLE_EQ(measured_bubble({}, 0, 2), 1.0);
  const std::vector<std::vector<Interval>> two{{{0, 10}}, {{0, 5}}};
  EXPECT_DOUBLE_EQ(mean_measured_bubble(two, 0, 10), 0.25);
  EXPECT_THROW((void)measured_bubble(iv, 1, 1), PipelineError);
}

TEST(PartitionLayers, EqualCostsSplitEqually) {
  const std::vector<double> c(8, 1.0);
  using R = std::vector<std::pair<int, int>>;
  EXPECT_EQ(partition_layers(c, 0, 0, 4), (R{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  EXPECT_EQ(partition_layers(c, 0, 0, 1), (R{{0, 8}}));
  EXPECT_EQ(partition_layers(c, 0, 0, 8).size(), 8u);
  // Ties: as even as possible, then earlier chunks take fewer layers.
  EXPECT_EQ(partition_layers(std::vector<double>(6, 1.0), 0, 0, 4),
            (R{{0, 1}, {1, 2}, {2, 4}, {4, 6}}));
}

TEST(PartitionLayers, HeavyLastLayerGetsItsOwnChunk) {
  const std::vector<double> c{1, 1, 1, 1, 1, 1, 1, 5};
  using R = std::vector<std::pair<int, int>>;
  EXPECT_EQ(partition_layers(c, 0, 0, 2), (R{{0, 6}, {6, 8}}));          // 6 | 1+5
  EXPECT_EQ(partition_layers(c, 0, 0, 3), (R{{0, 3}, {3, 7}, {7, 8}}));  // 3 | 4 | 5
}

TEST(PartitionLayers, FirstAndLastExtrasShiftBoundaries) {
  const std::vector<double> c(8, 1.0);
  using R = std::vector<std::pair<int, int>>;
  EXPECT_EQ(partition_layers(c, 2, 0, 2), (R{{0, 3}, {3, 8}}));  // 2+3 | 5
  EXPECT_EQ(partition_layers(c, 0, 2, 2), (R{{0, 5}, {5, 8}}));  // 5 | 3+2
  // Embedding and head each worth a layer: 10 units over 4 chunks, optimum 3.
  const R r = partition_layers(c, 1, 1, 4);
  EXPECT_EQ(r, (R{{0, 1}, {1, 3}, {3, 6}, {6, 8}}));
}

TEST(PartitionLayers, FewerLayersThanChunksThrows) {
  const std::vector<double> c(3, 1.0);
  try {
    (void)partition_layers(c, 0, 0, 4);
    ADD_FAILURE() << "no throw";
  } catch (const PipelineError& e) {
    EXPECT_NE(std::string(e.what()).find("3 layers cannot fill 4 chunks"), std::string::npos);
  }
  EXPECT_THROW((void)partition_layers(c, -1, 0, 2), PipelineError);
}

}  // namespace
}  // namespace shardcheck::parallel
