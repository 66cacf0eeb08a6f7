// `shardcheck compare` with the oracle's noise probe (ORACLE/noise, harness/compare.hpp): each
// tensor's bound is 100 x the probe's error of that tensor up to its step, at least 100 x one ulp
// of the run's dtype (step scalars: of 2^-52 x sqrt(N)), plus a norm-wise row of the parameters
// per step; --rtol overrides it; a probe dump that does not match the oracle is BadInput. Dumps
// are made by hand with ref::TensorDumper; the last test runs `run --dump-tensors` and `compare`
// through the built binary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "harness/cli_commands.hpp"
#include "harness/compare.hpp"
#include "harness/npy_read.hpp"
#include "reference/npy.hpp"
#include "tests/harness/cli_support.hpp"
#include "tests/harness/compare_support.hpp"

namespace shardcheck::harness {
namespace compare_noise_test {
namespace {

namespace fs = std::filesystem;
using shardcheck::testing::has;
using shardcheck::testing::kScenarios;
using shardcheck::testing::read_json;
using shardcheck::testing::shardcheck;
using shardcheck::testing::TempDir;

using compare_support::bad_input;
using compare_support::f64;
using compare_support::Tensors;
using compare_support::values;
using compare_support::write_dump;
constexpr double kEps = std::numeric_limits<double>::epsilon();

// init/param/{w,b}, batch/0/tokens and, per step 1-3, loss, grad_norm, param/w, param/b, grad/w.
Tensors base() {
  Tensors t;
  t.push_back({"init/param/w", {{2, 3}, values(6, 0)}});
  t.push_back({"init/param/b", {{3}, values(3, 1)}});
  t.push_back({"batch/0/tokens", {{4}, std::vector<int32_t>{1, 2, 3, 4}}});
  for (int s = 1; s <= 3; ++s) {
    const std::string p = "step" + std::to_string(s) + "/";
    t.push_back({p + "loss", {{}, values(1, 10 + s)}});
    t.push_back({p + "grad_norm", {{}, values(1, 20 + s)}});
    t.push_back({p + "param/w", {{2, 3}, values(6, 30 + s)}});
    t.push_back({p + "param/b", {{3}, values(3, 50 + s)}});
    t.push_back({p + "grad/w", {{2, 3}, values(6, 40 + s)}});
  }
  return t;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (const double x : v) m = std::max(m, std::abs(x));
  return m;
}

// Moves element i of the tensor by `rel` times its largest magnitude: max_rel_err `rel`.
void nudge(Tensors& t, const std::string& name, double rel, std::size_t i = 0) {
  std::vector<double>& v = f64(t, name);
  v[i] += rel * max_abs(v);
}

// The oracle base() with the probe `noise` in oracle/noise.
fs::path oracle_with_noise(const fs::path& dir, const Tensors& noise) {
  write_dump(dir / "noise", noise);
  return write_dump(dir, base());
}

const CompareRow& row(const CompareResult& r, int64_t step, const std::string& name) {
  for (const CompareRow& x : r.rows)
    if (x.step == step && x.name == name) return x;
  throw std::runtime_error("no row step " + std::to_string(step) + " " + name);
}

TEST(CompareNoise, JustUnderAHundredTimesTheProbePassesJustOverFails) {
  const TempDir tmp("shardcheck_compare_noise_margin");
  Tensors noise = base();
  nudge(noise, "step2/grad/w", 1e-10);
  const fs::path o = oracle_with_noise(tmp.path() / "oracle", noise);
  Tensors under = base(), over = base();
  nudge(under, "step2/grad/w", 99e-10);
  nudge(over, "step2/grad/w", 101e-10);
  const CompareResult pass = compare_dumps(o, write_dump(tmp.path() / "under", under), {});
  EXPECT_EQ(pass.failed(), 0u);
  EXPECT_EQ(pass.noise, (o / "noise").string());
  const CompareRow& g = row(pass, 2, "grad/w");
  EXPECT_EQ(g.bound, "noise");
  ASSERT_TRUE(g.probe_err.has_value());
  EXPECT_NEAR(*g.probe_err, 1e-10, 1e-15);
  EXPECT_NEAR(g.tolerance, 1e-8, 1e-13);
  EXPECT_NEAR(g.max_rel_err, 99e-10, 1e-14);

  const CompareResult fail = compare_dumps(o, write_dump(tmp.path() / "over", over), {});
  ASSERT_EQ(fail.failed(), 1u);
  EXPECT_EQ(fail.first_failure()->step, 2);
  EXPECT_EQ(fail.first_failure()->name, "grad/w");
  std::ostringstream text;
  print_compare(text, fail);
  EXPECT_TRUE(has(text.str(), "<= 100 x the noise probe's error (" + (o / "noise").string() + ")"))
      << text.str();
  EXPECT_TRUE(has(text.str(), "first failure: step 2 tensor grad/w")) << text.str();
}

TEST(CompareNoise, ABoundIsTheProbesLargestErrorOfThatTensorUpToItsStep) {
  const TempDir tmp("shardcheck_compare_noise_running");
  Tensors noise = base();
  nudge(noise, "step2/grad/w", 1e-8);
  nudge(noise, "step3/grad/w", 1e-10);
  const fs::path o = oracle_with_noise(tmp.path() / "oracle", noise);
  Tensors run = base();
  nudge(run, "step3/grad/w", 5e-7);  // 50x the probe's step-2 error, 5000x its step-3 one
  const CompareResult r = compare_dumps(o, write_dump(tmp.path() / "run", run), {});
  EXPECT_EQ(r.failed(), 0u);
  EXPECT_NEAR(row(r, 3, "grad/w").tolerance, 1e-6, 1e-12);
  EXPECT_NEAR(*row(r, 3, "grad/w").probe_err, 1e-8, 1e-14);
  // Step 1 came before the probe moved: its bound is the floor. Another tensor keeps its own.
  EXPECT_EQ(row(r, 1, "grad/w").tolerance, 100 * kEps);
  EXPECT_EQ(row(r, 3, "param/w").tolerance, 100 * kEps);

  Tensors early = base();
  nudge(early, "step1/grad/w", 5e-7);
  const CompareResult e = compare_dumps(o, write_dump(tmp.path() / "early", early), {});
  ASSERT_EQ(e.failed(), 1u);
  EXPECT_EQ(e.first_failure()->step, 1);
}

TEST(CompareNoise, AProbeWithoutErrorLeavesTheFloors) {
  const TempDir tmp("shardcheck_compare_noise_floor");
  const fs::path o = oracle_with_noise(tmp.path() / "oracle", base());
  const fs::path same = write_dump(tmp.path() / "same", base());
  const CompareResult r = compare_dumps(o, same, {});
  EXPECT_EQ(r.failed(), 0u);
  EXPECT_EQ(r.noise_params, 9.0);  // param/w and param/b of step 1
  const double scalar_floor = kEps * std::sqrt(9.0);
  for (const CompareRow& x : r.rows) {
    EXPECT_EQ(x.bound, "noise") << x.name;
    EXPECT_EQ(x.probe_err.value_or(-1), 0.0) << x.name;
    const bool scalar = x.name == "loss" || x.name == "grad_norm";
    EXPECT_EQ(x.tolerance, 100 * (scalar ? scalar_floor : kEps)) << x.name;
  }
  // The loss 0.8x / 1.2x its floor away.
  Tensors near = base(), far = base();
  nudge(near, "step2/loss", 80 * scalar_floor);
  nudge(far, "step2/loss", 120 * scalar_floor);
  EXPECT_EQ(compare_dumps(o, write_dump(tmp.path() / "near", near), {}).failed(), 0u);
  const CompareResult f = compare_dumps(o, write_dump(tmp.path() / "far", far), {});
  ASSERT_EQ(f.failed(), 1u);
  EXPECT_EQ(f.first_failure()->name, "loss");

  // A float32 run: one float32 ulp; an integer tensor stays exact, by dtype.
  Tensors o32 = base(), r32 = base();
  o32.push_back({"step1/tokens_seen", {{2}, std::vector<int64_t>{5, 7}}});
  r32.push_back({"step1/tokens_seen", {{2}, std::vector<int64_t>{5, 8}}});
  for (auto& [n, a] : r32)
    if (const auto* d = std::get_if<std::vector<double>>(&a.data))
      a.data = std::vector<float>(d->begin(), d->end());
  write_dump(tmp.path() / "o32" / "noise", o32);
  const CompareResult c =
      compare_dumps(write_dump(tmp.path() / "o32", o32), write_dump(tmp.path() / "r32", r32), {});
  ASSERT_EQ(c.failed(), 1u);
  EXPECT_EQ(c.first_failure()->name, "tokens_seen");
  EXPECT_EQ(c.first_failure()->bound, "dtype");
  EXPECT_EQ(c.first_failure()->tolerance, 0.0);
  EXPECT_EQ(row(c, 2, "param/w").tolerance, 100 * double{std::numeric_limits<float>::epsilon()});
}

TEST(CompareNoise, TheParametersNormWiseFailWhenEveryTensorIsOffALittle) {
  const TempDir tmp("shardcheck_compare_noise_norm");
  Tensors noise = base();
  for (const char* p : {"step1/param/w", "step1/param/b"}) nudge(noise, p, 1e-9);
  const fs::path o = oracle_with_noise(tmp.path() / "oracle", noise);
  // Every element of every parameter 80 probe-widths off: each tensor within its bound, the
  // model norm-wise not (at least sqrt(3) x 80 = 139 > 100 probe-widths).
  Tensors run = base();
  for (const char* p : {"step1/param/w", "step1/param/b"}) {
    std::vector<double>& v = f64(run, p);
    const double d = 80e-9 * max_abs(v);
    for (double& x : v) x += x > 0 ? d : -d;
  }
  const CompareResult r = compare_dumps(o, write_dump(tmp.path() / "run", run), {});
  EXPECT_EQ(r.rows.size(), 2u + 3 * 6);  // init, then per step 5 tensors and the norm-wise row
  ASSERT_EQ(r.failed(), 1u);
  const CompareRow& n = *r.first_failure();
  EXPECT_EQ(n.step, 1);
  EXPECT_EQ(n.name, "params (norm-wise)");
  EXPECT_EQ(n.shape, (std::vector<int64_t>{9}));
  EXPECT_EQ(n.bound, "noise");
  EXPECT_LT(row(r, 1, "param/w").max_rel_err, row(r, 1, "param/w").tolerance);
  EXPECT_LT(row(r, 1, "param/b").max_rel_err, row(r, 1, "param/b").tolerance);
  // The probe's norm-wise error carries over to later steps.
  EXPECT_EQ(row(r, 3, "params (norm-wise)").tolerance, n.tolerance);
  EXPECT_GT(n.tolerance, 100 * kEps);

  const nlohmann::json j = compare_report_json(r);
  EXPECT_EQ(j.at("noise"), (o / "noise").string());
  for (const auto& x : j.at("rows"))
    if (x.at("name") == "params (norm-wise)" && x.at("step") == 1) {
      EXPECT_EQ(x.at("bound"), "noise");
      EXPECT_EQ(x.at("pass"), false);
      EXPECT_GT(x.at("probe_err").get<double>(), 0.0);
    }
}

TEST(CompareNoise, RtolOverridesTheProbeAndNoProbeMeansByDtype) {
  const TempDir tmp("shardcheck_compare_noise_rtol");
  Tensors noise = base();
  nudge(noise, "step2/grad/w", 1e-12);
  const fs::path o = oracle_with_noise(tmp.path() / "oracle", noise);
  Tensors run = base();
  nudge(run, "step2/grad/w", 1e-6);
  const fs::path r = write_dump(tmp.path() / "run", run);
  EXPECT_EQ(compare_dumps(o, r, {}).failed(), 1u);
  const CompareResult loose = compare_dumps(o, r, 1e-5);
  EXPECT_EQ(loose.failed(), 0u);
  EXPECT_TRUE(loose.noise.empty());
  EXPECT_EQ(loose.rows.size(), 2u + 3 * 5);  // no norm-wise rows
  for (const CompareRow& x : loose.rows) {
    EXPECT_EQ(x.bound, "rtol") << x.name;
    EXPECT_EQ(x.tolerance, 1e-5) << x.name;
    EXPECT_FALSE(x.probe_err.has_value()) << x.name;
  }
  fs::remove_all(o / "noise");
  const CompareResult plain = compare_dumps(o, r, {});
  EXPECT_TRUE(plain.noise.empty());
  for (const CompareRow& x : plain.rows) EXPECT_EQ(x.bound, "dtype") << x.name;
  EXPECT_EQ(plain.failed(), 1u);  // 1e-6 > float64's 1e-9
}

TEST(CompareNoise, AProbeDumpThatDoesNotMatchTheOracleIsBadInput) {
  const TempDir tmp("shardcheck_compare_noise_bad");
  const fs::path r = write_dump(tmp.path() / "run", base());
  const auto without = [&](const std::string& name, const std::string& dir) {
    Tensors t = base();
    std::erase_if(t, [&](const auto& e) { return e.first == name; });
    return oracle_with_noise(tmp.path() / dir, t);
  };
  fs::path o = without("step2/grad/w", "o1");
  std::string m = bad_input([&] { compare_dumps(o, r, {}); });
  EXPECT_TRUE(has(m, "the noise probe dump '" + (o / "noise").string() +
                         "' lacks the tensor step2/grad/w, which the oracle dump"))
      << m;
  o = without("init/param/b", "o2");
  m = bad_input([&] { compare_dumps(o, r, {}); });
  EXPECT_TRUE(has(m, "lacks the tensor init/param/b")) << m;
  Tensors shorter = base();
  std::erase_if(shorter, [](const auto& e) { return e.first.rfind("step3/", 0) == 0; });
  o = oracle_with_noise(tmp.path() / "o3", shorter);
  m = bad_input([&] { compare_dumps(o, r, {}); });
  EXPECT_TRUE(has(m, "different steps")) << m;
  EXPECT_TRUE(has(m, "noise probe dump '" + (o / "noise").string() + "' has steps 1, 2")) << m;
  Tensors nan = base();
  f64(nan, "step1/loss")[0] = std::numeric_limits<double>::quiet_NaN();
  o = oracle_with_noise(tmp.path() / "o4", nan);
  m = bad_input([&] { compare_dumps(o, r, {}); });
  EXPECT_TRUE(has(m, "tensor 'step1/loss'")) << m;
  EXPECT_TRUE(has(m, "too chaotic to check")) << m;
  // --rtol does not read the probe.
  EXPECT_EQ(compare_dumps(o, r, 1e-9).failed(), 0u);
}

// `run --dump-tensors` writes the probe beside the oracle; `compare` derives its bounds from it.
TEST(CompareNoise, RunDumpsTheProbeAndCompareJudgesByIt) {
  const TempDir tmp("shardcheck_compare_noise_cli");
  nlohmann::json s = read_json(kScenarios + "/parity/data_parallel_dense.json");
  s.erase("matrix");
  s["train"]["steps"] = 2;
  const fs::path scenario = tmp.write("scenario.json", s);
  const fs::path dump = tmp.path() / "dump";
  auto [code, out] = shardcheck("run " + scenario.string() + " --dump-tensors " + dump.string());
  ASSERT_EQ(code, 0) << out;
  ASSERT_TRUE(fs::is_regular_file(dump / "noise" / "index.json"));
  std::size_t probe_tensors = 0;
  for (const auto& e : read_json(dump / "noise" / "index.json")) {
    probe_tensors += e.at("name").get<std::string>().rfind("step2/param/", 0) == 0;
    EXPECT_TRUE(fs::exists(dump / "noise" / e.at("file").get<std::string>())) << e.dump();
  }
  EXPECT_GT(probe_tensors, 0u);

  const fs::path report = tmp.path() / "report";
  std::tie(code, out) =
      shardcheck("compare " + dump.string() + " " + dump.string() + " --report " + report.string());
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(has(out, "the noise probe's error (" + (dump / "noise").string() + ")")) << out;
  const nlohmann::json j = read_json(report / "report.json");
  bool norm_row = false;
  for (const auto& x : j.at("rows")) {
    EXPECT_EQ(x.at("bound"), "noise") << x.dump();
    norm_row = norm_row || x.at("name") == "params (norm-wise)";
  }
  EXPECT_TRUE(norm_row);

  // One parameter's largest element 1e-6 relative off.
  const fs::path run = tmp.path() / "run";
  fs::copy(dump, run, fs::copy_options::recursive);
  const fs::path file = run / ref::TensorDumper::file_name("step2/param/embed.weight");
  const NpyArray a = read_npy(file);
  std::vector<double> v = a.values;
  const auto at = std::max_element(v.begin(), v.end(),
                                   [](double x, double y) { return std::abs(x) < std::abs(y); });
  *at *= 1 + 1e-6;
  ref::write_npy(file, {a.header.shape, v});
  std::tie(code, out) = shardcheck("compare " + dump.string() + " " + run.string());
  EXPECT_EQ(code, 1) << out;
  EXPECT_TRUE(has(out, "first failure: step 2 tensor param/embed.weight")) << out;
}

}  // namespace
}  // namespace compare_noise_test
}  // namespace shardcheck::harness
