// RunOptions::compute / `--compute`: every strategy rank computes the reference ops on the
// installed ref::Compute while it trains (on the simulator, on the NCCL path's runner, after a
// resume), the single-device reference never does, parity holds with a Compute that sums in
// another order, and a Compute that gets one element wrong fails every configuration. The fakes
// here are CPU loops, so all of this runs without a GPU; `--compute cuda` without the GPU build or
// a device is an exit 2 that names the fix.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness/backend.hpp"
#include "harness/report.hpp"
#include "harness/runner.hpp"
#include "harness/runner_detail.hpp"
#include "reference/compute.hpp"
#include "reference/data.hpp"
#include "sim/world.hpp"
#include "tests/harness/cli_support.hpp"

namespace shardcheck::harness {
namespace {

using ref::Tensor;
using shardcheck::testing::shardcheck;
using shardcheck::testing::small_scenario;
using shardcheck::testing::TempDir;

using shardcheck::testing::has;

// What the fakes saw: per Compute instance (one per rank and configuration run), its rank, the
// thread it was made on, its calls and the threads the calls came from.
struct Ledger {
  struct Instance {
    int rank = -1;
    std::thread::id made_on;
    int calls = 0;
    std::set<std::thread::id> called_on;
  };
  std::mutex mu;
  std::vector<Instance> instances;
  std::size_t add(int rank) {
    const std::scoped_lock lock(mu);
    instances.push_back({rank, std::this_thread::get_id(), 0, {}});
    return instances.size() - 1;
  }
  void call(std::size_t at) {
    const std::scoped_lock lock(mu);
    ++instances[at].calls;
    instances[at].called_on.insert(std::this_thread::get_id());
  }
};

// The linear ops by their own loops, summing in the reverse order of ops.cpp (and accumulating dw
// per call before adding it), so results differ from the CPU's in rounding only. With `perturb`,
// linear_forward's first output element is scaled by (1 + perturb): a planted device bug.
class FakeCompute final : public ref::Compute {
 public:
  FakeCompute(Ledger* ledger, int rank, double perturb, std::string name)
      : ledger_(ledger), at_(ledger ? ledger->add(rank) : 0), perturb_(perturb), name_(name) {}
  std::string name() const override { return name_; }

  bool linear_forward(const Tensor<double>& x, const Tensor<double>& w,
                      Tensor<double>& y) override {
    return fwd(x, w, y, false);
  }
  bool linear_forward(const Tensor<float>& x, const Tensor<float>& w, Tensor<float>& y) override {
    return fwd(x, w, y, false);
  }
  bool linear_t_forward(const Tensor<double>& x, const Tensor<double>& w,
                        Tensor<double>& y) override {
    return fwd(x, w, y, true);
  }
  bool linear_t_forward(const Tensor<float>& x, const Tensor<float>& w, Tensor<float>& y) override {
    return fwd(x, w, y, true);
  }
  bool linear_backward(const Tensor<double>& dy, const Tensor<double>& x, const Tensor<double>& w,
                       Tensor<double>& dx, Tensor<double>& dw) override {
    return bwd(dy, x, w, dx, dw, false);
  }
  bool linear_backward(const Tensor<float>& dy, const Tensor<float>& x, const Tensor<float>& w,
                       Tensor<float>& dx, Tensor<float>& dw) override {
    return bwd(dy, x, w, dx, dw, false);
  }
  bool linear_t_backward(const Tensor<double>& dy, const Tensor<double>& x, const Tensor<double>& w,
                         Tensor<double>& dx, Tensor<double>& dw) override {
    return bwd(dy, x, w, dx, dw, true);
  }
  bool linear_t_backward(const Tensor<float>& dy, const Tensor<float>& x, const Tensor<float>& w,
                         Tensor<float>& dx, Tensor<float>& dw) override {
    return bwd(dy, x, w, dx, dw, true);
  }

 private:
  // W(i, o) of the [in, out] weight, or of the [out, in] one when transposed.
  template <class T>
  static T wv(const Tensor<T>& w, int64_t i, int64_t o, bool t) {
    return t ? w.at(o, i) : w.at(i, o);
  }
  template <class T>
  bool fwd(const Tensor<T>& x, const Tensor<T>& w, Tensor<T>& y, bool t) {
    if (ledger_) ledger_->call(at_);
    const int64_t n = x.dim(0), in = x.dim(1), out = y.dim(1);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t o = 0; o < out; ++o) {
        T acc = 0;
        for (int64_t i = in - 1; i >= 0; --i) acc += x.at(r, i) * wv(w, i, o, t);
        y.at(r, o) = acc;
      }
    if (!t && perturb_ != 0 && y.numel() > 0) y[0] *= static_cast<T>(1 + perturb_);
    return true;
  }
  template <class T>
  bool bwd(const Tensor<T>& dy, const Tensor<T>& x, const Tensor<T>& w, Tensor<T>& dx,
           Tensor<T>& dw, bool t) {
    if (ledger_) ledger_->call(at_);
    const int64_t n = x.dim(0), in = x.dim(1), out = dy.dim(1);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < in; ++i) {
        T acc = 0;
        for (int64_t o = out - 1; o >= 0; --o) acc += dy.at(r, o) * wv(w, i, o, t);
        dx.at(r, i) = acc;
      }
    for (int64_t i = 0; i < in; ++i)
      for (int64_t o = 0; o < out; ++o) {
        T acc = 0;
        for (int64_t r = n - 1; r >= 0; --r) acc += x.at(r, i) * dy.at(r, o);
        (t ? dw.at(o, i) : dw.at(i, o)) += acc;
      }
    return true;
  }
  Ledger* ledger_;
  std::size_t at_;
  double perturb_;
  std::string name_;
};

ComputeFactory fake_factory(Ledger* ledger, double perturb = 0) {
  return [ledger, perturb](int rank) -> std::unique_ptr<ref::Compute> {
    return std::make_unique<FakeCompute>(ledger, rank, perturb, "fake");
  };
}

// A data-parallel matrix and a model-parallel one (tensor, pipeline, and the two with DP).
std::vector<Scenario> matrices() {
  return {parse_scenario(small_scenario("compute-dp", {{{"dp", 2}}, {{"dp", 4}, {"zero", 3}}})),
          parse_scenario(small_scenario(
              "compute-mp", {{{"tp", 2}}, {{"dp", 2}, {"pp", 2}}, {{"dp", 2}, {"tp", 2}}}))};
}

int ranks_of(const Scenario& s) {
  int n = 0;
  for (const ParallelSpec& p : s.configs) n += p.mesh.world_size();
  return n;
}

// Every rank of every configuration made its own Compute on its own thread and computed there;
// the caller's thread (where the reference runs) never did.
void expect_every_rank_dispatched(const Ledger& ledger, const Scenario& s) {
  ASSERT_EQ(ledger.instances.size(), static_cast<std::size_t>(ranks_of(s)));
  std::map<int, int> per_rank;
  for (const Ledger::Instance& in : ledger.instances) {
    ++per_rank[in.rank];
    EXPECT_GT(in.calls, 0) << "rank " << in.rank << " never computed on its Compute";
    EXPECT_NE(in.made_on, std::this_thread::get_id()) << "made on the reference's thread";
    EXPECT_EQ(in.called_on, std::set<std::thread::id>{in.made_on}) << "rank " << in.rank;
  }
  for (const ParallelSpec& p : s.configs)
    for (int r = 0; r < p.mesh.world_size(); ++r) EXPECT_GE(per_rank[r], 1) << "rank " << r;
}

TEST(ComputeOption, EveryRankComputesThereAndTheReferenceStaysOnTheCpu) {
  for (const Scenario& s : matrices()) {
    SCOPED_TRACE(s.name);
    // A Compute on the caller's thread: the reference run must not use it either.
    Ledger caller;
    FakeCompute on_caller(&caller, -1, 0, "caller");
    const ref::ComputeScope scope(&on_caller);
    Ledger ledger;
    RunOptions o;
    o.compute = {fake_factory(&ledger), "fake"};
    const RunResult r = run_scenario(s, o);
    ASSERT_EQ(r.configs.size(), s.configs.size());
    for (const ConfigResult& c : r.configs) {
      EXPECT_TRUE(c.pass) << c.config << ": " << c.detail;
      EXPECT_EQ(c.compute, "fake") << c.config;
      EXPECT_GT(c.device_ops, 0) << c.config << ": no op counted as computed there";
    }
    expect_every_rank_dispatched(ledger, s);
    EXPECT_EQ(caller.instances[0].calls, 0) << "the reference run computed on the caller's Compute";
    const nlohmann::json j = report_json(r, "sim");
    EXPECT_EQ(j.at("compute"), "fake");
    for (const auto& row : j.at("parity")) {
      EXPECT_EQ(row.at("compute"), "fake");
      EXPECT_GT(row.at("device_ops").get<int64_t>(), 0);
    }
  }
}

TEST(ComputeOption, OnlyTheReferenceRunningComputesNothingThere) {
  // FSDP no_shard is not built on a model-parallel mesh: the configuration is reported
  // unsupported, only the reference runs.
  const Scenario s = parse_scenario(small_scenario(
      "reference-only", {{{"dp", 2}, {"tp", 2}, {"fsdp", {{"sharding", "no_shard"}}}}}));
  Ledger ledger;
  RunOptions o;
  o.compute = {fake_factory(&ledger), "fake"};
  const RunResult r = run_scenario(s, o);
  ASSERT_EQ(r.configs.size(), 1u);
  EXPECT_FALSE(r.configs[0].supported);
  EXPECT_TRUE(ledger.instances.empty());
  EXPECT_EQ(r.configs[0].compute, "");  // it did not run anywhere
  EXPECT_EQ(r.configs[0].device_ops, 0);
}

TEST(ComputeOption, WithoutAComputeRanksStayOnTheCpu) {
  const Scenario s = matrices()[0];
  const RunResult r = run_scenario(s);
  EXPECT_EQ(r.compute, "cpu");
  for (const ConfigResult& c : r.configs) {
    EXPECT_TRUE(c.pass) << c.detail;
    EXPECT_EQ(c.compute, "cpu");
    EXPECT_EQ(c.device_ops, 0);
  }
  EXPECT_EQ(report_json(r, "sim").at("compute"), "cpu");
}

// f32 on a Compute (every op sums in another order, with more terms than one rounding) is judged
// at kDeviceFactor times the CPU's bound. The summary says where the ranks computed and how much.
TEST(ComputeOption, F32OnAComputeIsJudgedAtTheDeviceBound) {
  nlohmann::json j = small_scenario("compute-f32", {{{"dp", 2}}});
  j["train"]["precision"] = "f32";
  const Scenario s = parse_scenario(j);
  RunOptions o;
  o.compute = {fake_factory(nullptr), "fake"};
  const RunResult on_fake = run_scenario(s, o);
  const RunResult on_cpu = run_scenario(s);
  ASSERT_EQ(on_fake.configs.size(), 1u);
  EXPECT_TRUE(on_fake.configs[0].pass) << on_fake.configs[0].detail;
  // Every step's bound is its measure's bound with the device factor on the device, without it
  // on the CPU.
  const auto measure_of = [](const std::string& name) {
    for (int m = 0; m < kMeasures; ++m)
      if (name == measure_name(static_cast<Measure>(m))) return static_cast<Measure>(m);
    ADD_FAILURE() << "no measure named " << name;
    return Measure::scalars;
  };
  for (const auto& [run, device] : {std::pair{&on_fake, true}, std::pair{&on_cpu, false}})
    for (const StepParity& sp : run->configs[0].steps) {
      EXPECT_GT(sp.bound, 0.0);
      EXPECT_DOUBLE_EQ(sp.bound, run->noise.bound(sp.step, measure_of(sp.measure), device))
          << (device ? "device" : "cpu") << " step " << sp.step << " " << sp.measure;
    }
  std::ostringstream summary;
  print_summary(summary, on_fake);
  EXPECT_TRUE(has(summary.str(), "computed on fake: ")) << summary.str();
  EXPECT_TRUE(has(summary.str(), " ops there")) << summary.str();
}

// A device op that gets one element wrong by 0.1% must fail the parity check of every
// configuration, data-parallel and model-parallel alike.
TEST(ComputeOption, APerturbedDeviceOpFailsEveryConfiguration) {
  for (const Scenario& s : matrices()) {
    SCOPED_TRACE(s.name);
    RunOptions o;
    o.compute = {fake_factory(nullptr, 1e-3), "fake"};
    const RunResult r = run_scenario(s, o);
    ASSERT_EQ(r.configs.size(), s.configs.size());
    EXPECT_FALSE(r.pass());
    for (const ConfigResult& c : r.configs) {
      EXPECT_TRUE(c.supported) << c.config << ": " << c.detail;
      EXPECT_FALSE(c.parity_pass) << c.config << " passed with a perturbed linear_forward";
      EXPECT_FALSE(c.pass) << c.config;
      EXPECT_GT(c.max_rel_err, c.tolerance) << c.config;
    }
  }
}

// The NCCL path of the runner (here with the simulator as its rank runner, records gathered as
// under mpirun) installs the Compute on every rank too, and reports wall-clock timing.
TEST(ComputeOption, TheNcclPathComputesThereAndMeasuresWallTime) {
  const Scenario s = matrices()[1];
  const ref::Dataset ds = ref::build_dataset(s.data, s.model, s.seed);
  const detail::Trace want = detail::reference_run(s, ds, "");
  Ledger ledger;
  for (const ParallelSpec& p : s.configs) {
    SCOPED_TRACE(p.label());
    const int world = p.mesh.world_size();
    const detail::Ranks on_sim = [world](const auto& fn) { sim::SimWorld(world).run(fn); };
    const ConfigResult r =
        detail::run_config_ranks(s, ds, want, p, on_sim, true, world, "", fake_factory(&ledger));
    EXPECT_TRUE(r.pass) << r.detail;
    EXPECT_EQ(r.compute, "fake");
    EXPECT_TRUE(r.wall_timing);
    ASSERT_TRUE(r.timing.valid);
    EXPECT_GT(r.timing.step_time_s, 0.0);
    EXPECT_GT(r.device_ops, 0);
    EXPECT_GT(r.timing.tokens_per_s, 0.0);
    EXPECT_GT(r.wall_seconds, 0.0);
  }
  expect_every_rank_dispatched(ledger, s);
  // The wall timing reaches report.json, labelled as such.
  RunResult run{s, {}, want.noise, {}, "fake", {}, {}};
  run.configs.push_back(detail::run_config_ranks(
      s, ds, want, s.configs[0], [](const auto& fn) { sim::SimWorld(2).run(fn); }, true, 2, "",
      fake_factory(nullptr)));
  const nlohmann::json row = report_json(run, "nccl").at("parity")[0];
  EXPECT_TRUE(has(row.at("timing").at("time").get<std::string>(), "wall")) << row.dump();
  EXPECT_GT(row.at("wall_s").get<double>(), 0.0);
}

// A resumed run's ranks compute on the Compute as well.
TEST(ComputeOption, AResumedRunComputesThere) {
  const TempDir dir("shardcheck_compute_resume");
  nlohmann::json j = small_scenario("compute-resume", {{{"dp", 2}, {"zero", 1}}});
  j["checkpoint"] = {{"every", 2}, {"keep", 2}};
  const Scenario s = parse_scenario(j);
  RunOptions save;
  save.checkpoint_dir = (dir.path() / "ck").string();
  ASSERT_TRUE(run_scenario(s, save).pass());
  Ledger ledger;
  RunOptions resume;
  resume.resume_dir = save.checkpoint_dir;
  resume.compute = {fake_factory(&ledger), "fake"};
  const RunResult r = run_scenario(s, resume);
  ASSERT_EQ(r.configs.size(), 1u);
  EXPECT_TRUE(r.configs[0].pass) << r.configs[0].detail;
  EXPECT_TRUE(has(r.configs[0].resumed_from, "step-2")) << r.configs[0].resumed_from;
  expect_every_rank_dispatched(ledger, s);
}

TEST(ComputeOption, CudaWithoutTheBuildOrADeviceIsExitTwoNamingTheFix) {
  if (cuda_compute_unavailable().empty()) GTEST_SKIP() << "a GPU is visible to the GPU build";
  const TempDir dir("shardcheck_compute_cli");
  const auto file = dir.write("s.json", small_scenario("compute-cli", {{{"dp", 2}}}));
  for (const std::string& args : {"run " + file.string() + " --compute cuda",
                                  "matrix " + file.string() + " --compute cuda"}) {
    const auto [code, out] = shardcheck(args);
    EXPECT_EQ(code, 2) << args << "\n" << out;
    EXPECT_TRUE(has(out, "--compute cuda: ")) << out;
    EXPECT_TRUE(has(out, "--compute cpu")) << out;  // the way out
    EXPECT_TRUE(has(out, "configure with the cuda preset") || has(out, "no CUDA device")) << out;
  }
  // --compute cpu is the simulator's default and runs.
  const auto [code, out] = shardcheck("run " + file.string() + " --compute cpu");
  EXPECT_EQ(code, 0) << out;
}

TEST(ComputeOption, AnUnknownComputeIsExitTwo) {
  const TempDir dir("shardcheck_compute_bogus");
  const auto file = dir.write("s.json", small_scenario("compute-bogus", {{{"dp", 2}}}));
  for (const std::string& args : {"run " + file.string() + " --compute bogus",
                                  "matrix " + file.string() + " --compute bogus"}) {
    const auto [code, out] = shardcheck(args);
    EXPECT_EQ(code, 2) << args << "\n" << out;
    EXPECT_TRUE(has(out, "--compute")) << out;
    EXPECT_TRUE(has(out, "bogus")) << out;
  }
}

// With a GPU: the simulator's ranks on the device (DeviceCompute) keep parity with the CPU
// reference, and report.json says where they computed.
TEST(ComputeOption, CudaOnTheSimulatorKeepsParity) {
  if (const std::string why = cuda_compute_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const TempDir dir("shardcheck_compute_cuda");
  nlohmann::json j = small_scenario("compute-cuda", {{{"dp", 2}}, {{"tp", 2}}});
  j["train"]["precision"] = "f32";
  const auto file = dir.write("s.json", j);
  const auto [code, out] = shardcheck("run " + file.string() + " --compute cuda --report " +
                                      (dir.path() / "r").string());
  ASSERT_EQ(code, 0) << out;
  const auto report = shardcheck::testing::read_json(dir.path() / "r" / "report.json");
  EXPECT_EQ(report.at("compute"), "cuda");
  EXPECT_EQ(report.at("backend"), "sim");
  for (const auto& row : report.at("parity")) {
    EXPECT_NE(row.at("compute"), "cpu") << row.dump();
    EXPECT_GT(row.at("device_ops").get<int64_t>(), 0) << "every op fell back: " << row.dump();
    EXPECT_LE(row.at("max_rel_err").get<double>(), row.at("tolerance").get<double>()) << row.dump();
  }
}

// With a GPU and the NCCL backend: the ranks compute on their GPUs by default, --compute cpu keeps
// them on the CPU, and each row has wall-clock timing.
TEST(ComputeOption, TheNcclBackendComputesOnGpusByDefault) {
  if (!nccl_built()) GTEST_SKIP() << "built without the NCCL backend (cuda preset)";
  if (const std::string why = nccl_unavailable(); !why.empty()) GTEST_SKIP() << why;
  if (const std::string why = cuda_compute_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const TempDir dir("shardcheck_compute_nccl");
  nlohmann::json j = small_scenario("compute-nccl", {{{"dp", 1}}});
  j["train"]["precision"] = "f32";
  const auto file = dir.write("s.json", j);
  for (const std::string compute : {"", "cpu"}) {
    const auto report = dir.path() / ("r" + compute);
    const auto [code, out] = shardcheck("run " + file.string() + " --backend nccl" +
                                        (compute.empty() ? "" : " --compute " + compute) +
                                        " --report " + report.string());
    ASSERT_EQ(code, 0) << out;
    const auto r = shardcheck::testing::read_json(report / "report.json");
    EXPECT_EQ(r.at("compute"), compute.empty() ? "cuda" : "cpu");
    const auto& row = r.at("parity")[0];
    EXPECT_EQ(row.at("compute") == "cpu", compute == "cpu") << row.dump();
    EXPECT_EQ(row.at("device_ops").get<int64_t>() > 0, compute.empty()) << row.dump();
    EXPECT_GT(row.at("wall_s").get<double>(), 0.0);
    EXPECT_TRUE(has(row.at("timing").at("time").get<std::string>(), "wall")) << row.dump();
    EXPECT_GT(row.at("timing").at("step_time_s").get<double>(), 0.0);
  }
}

}  // namespace
}  // namespace shardcheck::harness
