// The mutation suite against the committed parity scenarios, in every precision whose rows run a
// planted bug's code path: each row that exercises the bug passes clean and fails planted, and
// the test prints one table line per row (clean error and bound, planted error and bound, the
// measure that caught it), the table of reports/ "parity bounds".
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "comm/mesh.hpp"
#include "harness/runner.hpp"
#include "harness/scenario.hpp"
#include "parallel/testing.hpp"
#include "tests/harness/cli_support.hpp"

namespace shardcheck::harness {
namespace {

using parallel::testing::Mutation;
using shardcheck::testing::kScenarios;

using Exercised = std::function<bool(const Scenario&, const ParallelSpec&)>;

struct Case {
  const char* name;
  Mutation mutation;
  Exercised exercised;
  // Every exercised row must fail (false: the bug changes numbers only on some of them, e.g. a
  // wrong shard offset only on uneven shards, dropped tokens only where capacity binds; the table
  // shows which).
  bool every_row = true;
  // With every_row false: the scenarios where some row must fail (an uneven shard runs there).
  std::vector<std::string> caught_in = {};
};

bool dp(const Scenario&, const ParallelSpec& p) {
  return p.mesh.dp > 1;
}
bool data_reduced(const Scenario&, const ParallelSpec& p) {
  return p.mesh.dp * p.mesh.cp > 1;
}
bool tp(const Scenario&, const ParallelSpec& p) {
  return p.mesh.tp > 1;
}
bool cp(const Scenario&, const ParallelSpec& p) {
  return p.mesh.cp > 1;
}
bool ep(const Scenario& s, const ParallelSpec& p) {
  return s.model.moe && p.mesh.ep > 1;
}

// Whether an EP group holds ranks of more than one data rank (not only CP ranks of one).
bool ep_peers_read_several_data_ranks(const ParallelSpec& p) {
  const comm::DeviceMesh mesh(p.mesh, p.order);
  std::set<int> data;
  for (int m : mesh.group(0, comm::Axis::ep)) data.insert(mesh.coord(m, comm::Axis::dp));
  return data.size() > 1;
}

// Every planted bug, on one committed scenario (one test per scenario, so the clean run is made
// once per process and the scenarios run in parallel).
const std::vector<Case>& cases();

class MutationTable : public ::testing::TestWithParam<std::string> {};

TEST_P(MutationTable, EveryPlantedBugThatRunsFails) {
  const std::string file = GetParam();
  RunOptions clean;
  clean.schedule_bubble = false;  // parity only
  const RunResult base = run_scenario(load_scenario(kScenarios + "/parity/" + file), clean);
  const std::string precision = ref::to_string(base.scenario.train.precision);
  for (const ConfigResult& b : base.configs)
    EXPECT_TRUE(b.pass) << file << " " << b.config << " fails clean: " << b.detail;
  int ran = 0;
  for (const Case& c : cases()) {
    bool any = false;
    for (const ParallelSpec& p : base.scenario.configs) any = any || c.exercised(base.scenario, p);
    if (!any) continue;
    ++ran;
    RunOptions o = clean;
    o.planted = c.mutation;
    const RunResult bad = run_scenario(base.scenario, o);
    ASSERT_EQ(bad.configs.size(), base.configs.size());
    int caught = 0;
    for (std::size_t i = 0; i < base.configs.size(); ++i) {
      const ConfigResult &b = base.configs[i], &m = bad.configs[i];
      if (!c.exercised(base.scenario, b.spec)) continue;
      if (!m.pass) ++caught;
      if (c.every_row) {
        EXPECT_FALSE(m.pass) << c.name << " passed on " << file << " " << m.config << ": "
                             << m.detail;
      }
      std::printf("TABLE| %s | %s | %s | %s | %.2e / %.2e | %.2e / %.2e | %s | %s\n", c.name,
                  precision.c_str(), base.scenario.name.c_str(), b.config.c_str(), b.max_rel_err,
                  b.tolerance, m.max_rel_err, m.tolerance, m.measure.c_str(),
                  m.pass ? "PASSED" : "caught");
    }
    if (c.every_row ||
        std::find(c.caught_in.begin(), c.caught_in.end(), file) != c.caught_in.end()) {
      EXPECT_GT(caught, 0) << c.name << ": no row of " << file << " caught it";
    }
  }
  EXPECT_GT(ran, 0) << file << " runs no planted bug's code";
}

std::string file_name(const ::testing::TestParamInfo<std::string>& p) {
  return p.param.substr(0, p.param.find('.'));
}

// The scenarios: f64, f32 and bf16 rows of every axis, with the GELU and the SwiGLU MLP, and a
// padded vocabulary.
INSTANTIATE_TEST_SUITE_P(Parity, MutationTable,
                         ::testing::Values("mp_compose.json", "mp_compose_moe.json", "mp_cp.json",
                                           "fsdp_dense.json", "mp_f32.json",
                                           "data_parallel_f32.json", "mp_ep_f32.json",
                                           "mp_bf16.json", "bf16_recipe.json", "mp_ep_bf16.json",
                                           "swiglu.json", "swiglu_f32.json", "swiglu_bf16.json",
                                           "llama_rope.json", "vocab_padding.json",
                                           "vocab_padding_f32.json", "vocab_padding_bf16.json"),
                         file_name);

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      Case{"mean_of_rank_means", Mutation::kMeanOfRankMeans, dp},
      Case{"local_norm_clip", Mutation::kLocalNormClip,
           [](const Scenario&, const ParallelSpec& p) { return p.mesh.world_size() > 1; }},
      Case{"skip_bucket", Mutation::kSkipBucket, data_reduced},
      Case{"wrong_shard_offset",
           Mutation::kWrongShardOffset,
           [](const Scenario&, const ParallelSpec& p) {
             return p.mesh.dp > 1 && (p.zero() || p.fsdp());
           },
           false,
           {"fsdp_dense.json", "data_parallel_f32.json", "bf16_recipe.json"}},
      Case{"same_samples", Mutation::kSameSamples, dp},
      Case{"unit_reduced_early", Mutation::kUnitReducedEarly,
           [](const Scenario&, const ParallelSpec& p) { return p.shards_params(); }, true},
      Case{"skip_replica_sum", Mutation::kSkipReplicaSum,
           [](const Scenario&, const ParallelSpec& p) {
             return p.hybrid() && p.mesh.dp > p.fsdp()->shard_group_size &&
                    p.fsdp()->shard_group_size > 0;
           }},
      Case{"row_parallel_not_reduced", Mutation::kRowParallelNotReduced, tp},
      Case{"gqa_wrong_head_mapping", Mutation::kGqaWrongHeadMapping, tp},
      Case{"vocab_target_not_reduced", Mutation::kVocabTargetNotReduced, tp},
      Case{"vocab_pad_not_masked", Mutation::kVocabPadNotMasked,
           [](const Scenario& s, const ParallelSpec& p) {
             return s.model.padded_vocab(p.mesh.tp) != s.model.vocab;
           }},
      Case{"gate_up_swapped", Mutation::kGateUpSwapped,
           [](const Scenario& s, const ParallelSpec& p) {
             return p.mesh.tp > 1 && s.model.gated_mlp();
           }},
      Case{"replica_not_updated", Mutation::kReplicaNotUpdated, tp},
      Case{"norm_over_wrong_group", Mutation::kNormOverWrongGroup, tp},
      Case{"cp_rope_chunk_offset", Mutation::kCpRopeChunkOffset, cp},
      Case{"ring_diagonal_unmasked", Mutation::kRingDiagonalUnmasked,
           [](const Scenario&, const ParallelSpec& p) {
             return p.mesh.cp > 1 && p.cp_algo == parallel::CpAlgo::ring;
           }},
      Case{"skip_tied_embedding_sync", Mutation::kSkipTiedEmbeddingSync,
           [](const Scenario& s, const ParallelSpec& p) {
             return p.mesh.pp > 1 && s.model.tie_embeddings;
           }},
      Case{"route_dropped_tokens", Mutation::kRouteDroppedTokens, ep},
      Case{"aux_per_rank_mean", Mutation::kAuxPerRankMean, ep},
      Case{"expert_sum_over_dense_group", Mutation::kExpertSumOverDenseGroup,
           [](const Scenario& s, const ParallelSpec& p) {
             return ep(s, p) && p.mesh.dp * p.mesh.cp > p.mesh.ep;
           }},
      Case{"grad_averaged_not_summed", Mutation::kGradAveragedNotSummed, data_reduced},
      Case{"bf16_working_left_in_f32", Mutation::kBf16WorkingLeftInF32,
           [](const Scenario& s, const ParallelSpec& p) {
             return s.train.precision == ref::Precision::kBf16 && p.zero_given() < 3 && !p.fsdp();
           }},
      Case{"bf16_experts_rounded_together", Mutation::kBf16ExpertsRoundedTogether,
           [](const Scenario& s, const ParallelSpec& p) {
             return s.train.precision == ref::Precision::kBf16 && ep(s, p) &&
                    ep_peers_read_several_data_ranks(p);
           }}};
  return all;
}

}  // namespace
}  // namespace shardcheck::harness
