// `--backend nccl` in `run` and `bench collectives`: without the gpu/ backend (or without a GPU)
// a clear exit 2 naming the fix; what only the simulator offers is refused; the NCCL path of the
// runner (the per-rank records gathered over the world communicator, as under mpirun) checked on
// the simulator against the plain simulated run; on a machine with GPUs, real runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "harness/backend.hpp"
#include "harness/runner_detail.hpp"
#include "reference/data.hpp"
#include "reference/trainer.hpp"
#include "sim/world.hpp"
#include "tests/harness/cli_support.hpp"

namespace shardcheck::harness {
namespace {

using shardcheck::testing::kScenarios;
using shardcheck::testing::read_json;
using shardcheck::testing::shardcheck;
using shardcheck::testing::TempDir;

using shardcheck::testing::has;

nlohmann::json small_scenario(const nlohmann::json& matrix) {
  return shardcheck::testing::small_scenario("nccl-small", matrix, 5, 2);
}

TEST(NcclBackend, UnavailableIsExitTwoNamingTheFix) {
  if (nccl_built() && nccl_unavailable().empty()) GTEST_SKIP() << "a GPU is visible";
  const std::string want = nccl_built() ? "no CUDA device" : "configure with the cuda preset";
  for (const std::string& args :
       {"run " + kScenarios + "/parity/data_parallel_dense.json --backend nccl",
        "matrix " + kScenarios + "/parity --backend nccl",
        std::string("bench collectives --backend nccl")}) {
    const auto [code, out] = shardcheck(args);
    EXPECT_EQ(code, 2) << args << "\n" << out;
    EXPECT_TRUE(has(out, "--backend nccl: ")) << args << "\n" << out;
    EXPECT_TRUE(has(out, want)) << args << "\n" << out;
    if (!nccl_built()) {
      EXPECT_TRUE(has(out, "built without the NCCL backend")) << out;
    }
  }
}

TEST(NcclBackend, SimulatorOnlyFeaturesAreRefused) {
  const TempDir dir("shardcheck_nccl_refusals");
  nlohmann::json faulty = small_scenario({{{"dp", 2}}});
  faulty["faults"] = {{{"kind", "straggler"}, {"rank", 1}, {"slowdown", 2.0}}};
  const auto with_faults = dir.write("faults.json", faulty);
  const auto plain = dir.write("plain.json", small_scenario({{{"dp", 1}}}));
  const std::pair<std::string, std::string> cases[] = {
      {"run " + with_faults.string() + " --backend nccl", "injected faults"},
      {"run " + plain.string() + " --backend nccl --checkpoint-dir " + (dir.path() / "ck").string(),
       "--checkpoint-dir and --resume"},
  };
  for (const auto& [args, what] : cases) {
    const auto [code, out] = shardcheck(args);
    EXPECT_EQ(code, 2) << args << "\n" << out;
    EXPECT_TRUE(has(out, what)) << args << "\n" << out;
    EXPECT_TRUE(has(out, "only the simulator offers")) << args << "\n" << out;
  }
}

// The runner's NCCL path with the simulator as its rank runner, each rank gathering every rank's
// record as a process under mpirun does: same verdict and figures as the plain simulated run.
TEST(NcclPath, GatheredRecordsGiveTheSimulatorsVerdict) {
  const Scenario s = parse_scenario(
      small_scenario({{{"dp", 2}}, {{"dp", 2}, {"zero", 3}}, {{"tp", 2}}, {{"dp", 2}, {"pp", 2}}}));
  const ref::Dataset ds = ref::build_dataset(s.data, s.model, s.seed);
  const detail::Trace want = detail::reference_run(s, ds, "");  // with its noise floor
  const RunResult sim = run_scenario(s);
  ASSERT_EQ(sim.configs.size(), s.configs.size());
  for (std::size_t i = 0; i < s.configs.size(); ++i) {
    const ParallelSpec& p = s.configs[i];
    const int world = p.mesh.world_size();
    const detail::Ranks on_sim = [world](const auto& fn) { sim::SimWorld(world).run(fn); };
    for (const bool gather : {false, true}) {
      const ConfigResult r = detail::run_config_ranks(s, ds, want, p, on_sim, gather, world, "");
      const ConfigResult& base = sim.configs[i];
      SCOPED_TRACE(p.label() + (gather ? " gathered" : ""));
      ASSERT_TRUE(base.pass) << base.detail;
      EXPECT_TRUE(r.pass) << r.detail;
      EXPECT_EQ(r.strategy, base.strategy);
      EXPECT_EQ(r.max_rel_err, base.max_rel_err)  // the simulator is bitwise deterministic
          << r.detail << " vs " << base.detail;
      ASSERT_EQ(r.steps.size(), base.steps.size());
      for (std::size_t k = 0; k < r.steps.size(); ++k)
        EXPECT_EQ(r.steps[k].loss, base.steps[k].loss);
      ASSERT_EQ(r.memory.size(), static_cast<std::size_t>(world));
      for (std::size_t q = 0; q < r.memory.size(); ++q) {
        EXPECT_EQ(r.memory[q].rank, base.memory[q].rank);
        EXPECT_EQ(r.memory[q].peak, base.memory[q].peak);
        EXPECT_EQ(r.memory[q].peak_phase, base.memory[q].peak_phase);
      }
    }
  }
}

TEST(NcclPath, ConfigurationsBeyondTheMachineAreNotRun) {
  const Scenario s = parse_scenario(small_scenario({{{"dp", 2}}}));
  const ref::Dataset ds = ref::build_dataset(s.data, s.model, s.seed);
  const detail::Trace want = detail::reference_run(s, ds, "");  // with its noise floor
  const detail::Ranks never = [](const auto&) { FAIL() << "must not run"; };
  const ConfigResult few =
      detail::run_config_ranks(s, ds, want, s.configs[0], never, false, 1, "visible GPUs");
  EXPECT_FALSE(few.supported);
  EXPECT_FALSE(few.pass);
  EXPECT_TRUE(has(few.detail, "needs 2 ranks, 1 visible GPUs")) << few.detail;
  // Under mpirun the process count must match exactly (one rank per process).
  const ConfigResult more =
      detail::run_config_ranks(s, ds, want, s.configs[0], never, true, 4, "processes");
  EXPECT_FALSE(more.supported);
  EXPECT_TRUE(has(more.detail, "needs 2 ranks, 4 processes")) << more.detail;
}

TEST(NcclPath, ARankFailureIsReportedWithItsRank) {
  const Scenario s = parse_scenario(small_scenario({{{"dp", 2}}}));
  const ref::Dataset ds = ref::build_dataset(s.data, s.model, s.seed);
  const detail::Trace want = detail::reference_run(s, ds, "");  // with its noise floor
  const detail::Ranks failing = [](const auto& fn) {
    sim::SimWorld(2).run([&](comm::Communicator& c) {
      if (c.rank() == 1) throw std::runtime_error("device lost");
      fn(c);
    });
  };
  const ConfigResult r =
      detail::run_config_ranks(s, ds, want, s.configs[0], failing, false, 2, "visible GPUs");
  EXPECT_FALSE(r.pass);
  EXPECT_TRUE(r.broke);
  EXPECT_TRUE(has(r.detail, "device lost")) << r.detail;
}

// Real runs, where this build has the backend and the machine a GPU.
TEST(NcclBackend, RunsParityAndTheBenchmarkOnGpus) {
  if (!nccl_built()) GTEST_SKIP() << "built without the NCCL backend (cuda preset)";
  if (const std::string why = nccl_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const int gpus = nccl_place().capacity;
  nlohmann::json matrix = {{{"dp", 1}}};
  if (gpus >= 2) matrix.push_back({{"dp", 2}, {"zero", 1}});
  if (gpus >= 2) matrix.push_back({{"tp", 2}});
  const TempDir dir("shardcheck_nccl_gpu");
  const auto file = dir.write("s.json", small_scenario(matrix));
  const auto [code, out] =
      shardcheck("run " + file.string() + " --backend nccl --report " + dir.path().string());
  ASSERT_EQ(code, 0) << out;
  const auto j = read_json(dir.path() / "report.json");
  EXPECT_EQ(j.at("backend"), "nccl");
  EXPECT_TRUE(j.at("pass").get<bool>());
  const auto [bcode, bout] =
      shardcheck("bench collectives --backend nccl -b 1KB -e 64KB --iters 3");
  EXPECT_EQ(bcode, 0) << bout;
  EXPECT_TRUE(has(bout, "# Out of bounds values : 0 OK")) << bout;
}

}  // namespace
}  // namespace shardcheck::harness
