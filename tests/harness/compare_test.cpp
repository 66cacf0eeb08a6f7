// `shardcheck compare` (harness/compare.hpp, harness/npy_read.hpp): dumps written with the
// reference's TensorDumper into scratch directories, compared through the API (the verdict, each
// row's error and tolerance, the BadInput messages naming the dump and the tensor or file) and
// through the built binary (exit codes 0/1/2, report.json, index.html and JUnit read back).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "harness/cli_commands.hpp"
#include "harness/compare.hpp"
#include "harness/npy_read.hpp"
#include "reference/npy.hpp"
#include "tests/harness/cli_support.hpp"
#include "tests/harness/compare_support.hpp"

namespace shardcheck::harness {
namespace compare_test {
namespace {

namespace fs = std::filesystem;
using shardcheck::testing::has;
using shardcheck::testing::read_json;
using shardcheck::testing::shardcheck;
using shardcheck::testing::slurp;
using shardcheck::testing::TempDir;

using compare_support::bad_input;
using compare_support::f64;
using compare_support::Tensors;
using compare_support::values;
using compare_support::write_dump;

// init/param/{w,b}, batch/0/tokens and, per step, loss, grad_norm, param/w and grad/w:
// 2 + 4 · steps compared tensors.
Tensors base(int first_step = 1, int last_step = 3) {
  Tensors t;
  t.push_back({"init/param/w", {{2, 3}, values(6, 0)}});
  t.push_back({"init/param/b", {{3}, values(3, 1)}});
  t.push_back({"batch/0/tokens", {{4}, std::vector<int32_t>{1, 2, 3, 4}}});
  for (int s = first_step; s <= last_step; ++s) {
    const std::string p = "step" + std::to_string(s) + "/";
    t.push_back({p + "loss", {{}, values(1, 10 + s)}});
    t.push_back({p + "grad_norm", {{}, values(1, 20 + s)}});
    t.push_back({p + "param/w", {{2, 3}, values(6, 30 + s)}});
    t.push_back({p + "grad/w", {{2, 3}, values(6, 40 + s)}});
  }
  return t;
}

void drop(Tensors& t, const std::string& name) {
  std::erase_if(t, [&](const auto& e) { return e.first == name; });
}

// Every float64 tensor as float32.
Tensors as_f32(const Tensors& t) {
  Tensors out;
  for (const auto& [n, a] : t) {
    if (const auto* d = std::get_if<std::vector<double>>(&a.data))
      out.push_back({n, {a.shape, std::vector<float>(d->begin(), d->end())}});
    else
      out.push_back({n, a});
  }
  return out;
}

// A .npy file written by hand: magic, version, header length, `dict` padded and ended by '\n',
// then `data`.
void write_raw_npy(const fs::path& file, int version, std::string dict, const std::string& data) {
  const std::size_t prefix = version == 1 ? 10 : 12;
  while ((prefix + dict.size() + 1) % 64) dict.push_back(' ');
  dict.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(version));
  out.push_back('\0');
  for (std::size_t i = 0; i < prefix - 8; ++i)
    out.push_back(static_cast<char>((dict.size() >> (8 * i)) & 0xFF));
  std::ofstream(file, std::ios::binary) << out << dict << data;
}

// Replaces `from` by `to` (same length) in the file's bytes.
void patch_file(const fs::path& file, const std::string& from, const std::string& to) {
  std::string s = slurp(file);
  const auto at = s.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  s.replace(at, from.size(), to);
  std::ofstream(file, std::ios::binary | std::ios::trunc) << s;
}

TEST(CompareDumps, IdenticalDumpsPass) {
  const TempDir tmp("shardcheck_compare_same");
  const fs::path o = write_dump(tmp.path() / "oracle", base());
  const fs::path r = write_dump(tmp.path() / "run", base());
  const CompareResult res = compare_dumps(o, r, std::nullopt);
  EXPECT_EQ(res.rows.size(), 14u);
  EXPECT_EQ(res.steps(), 3u);
  EXPECT_EQ(res.failed(), 0u);
  ASSERT_EQ(res.groups.size(), 4u);
  EXPECT_FALSE(res.groups[0].step.has_value());  // init/ first
  EXPECT_EQ(res.groups[0].tensors, 2u);
  EXPECT_EQ(res.groups[3].step, 3);
  for (const CompareRow& row : res.rows) {
    EXPECT_EQ(row.max_rel_err, 0.0) << row.name;
    EXPECT_EQ(row.tolerance, 1e-9) << row.name;
    EXPECT_NE(row.name.rfind("batch/", 0), 0u) << "batch/ tensors are not compared";
  }
  std::ostringstream text;
  print_compare(text, res);
  EXPECT_TRUE(has(text.str(), "step 2: 4 tensors, 0 failed\n")) << text.str();
  EXPECT_TRUE(has(text.str(), "\ncompare: 14 tensors in 3 steps, 0 failed\n")) << text.str();
  EXPECT_FALSE(has(text.str(), "first failure")) << text.str();
}

TEST(CompareDumps, PerturbedParamFailsNamingStepAndTensor) {
  const TempDir tmp("shardcheck_compare_perturbed");
  Tensors run = base();
  f64(run, "step2/param/w")[4] *= 1 + 1e-6;  // |x| = 1.85 of a max |x| of 2.22 + 0.11 * 32
  const fs::path o = write_dump(tmp.path() / "oracle", base());
  const fs::path r = write_dump(tmp.path() / "run", run);
  const CompareResult res = compare_dumps(o, r, std::nullopt);
  EXPECT_EQ(res.failed(), 1u);
  const CompareRow* f = res.first_failure();
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->step, 2);
  EXPECT_EQ(f->name, "param/w");
  const std::vector<double> w = values(6, 32);
  const double expected = std::abs(w[4]) * 1e-6 / std::abs(w[5]);
  EXPECT_NEAR(f->max_rel_err, expected, expected * 1e-6);
  EXPECT_EQ(f->tolerance, 1e-9);
  std::ostringstream text;
  print_compare(text, res);
  EXPECT_TRUE(has(text.str(), "step 2: 4 tensors, 1 failed\n  param/w [2, 3]")) << text.str();
  EXPECT_TRUE(has(text.str(), "first failure: step 2 tensor param/w: max_rel_err ")) << text.str();
  EXPECT_TRUE(has(text.str(), "> tolerance 1e-09\ncompare: 14 tensors in 3 steps, 1 failed\n"))
      << text.str();
}

TEST(CompareDumps, RtolLoosensEveryTolerance) {
  const TempDir tmp("shardcheck_compare_rtol");
  Tensors run = base();
  f64(run, "step2/param/w")[4] *= 1 + 1e-6;
  const fs::path o = write_dump(tmp.path() / "oracle", base());
  const fs::path r = write_dump(tmp.path() / "run", run);
  const CompareResult res = compare_dumps(o, r, 1e-5);
  EXPECT_EQ(res.failed(), 0u);
  for (const CompareRow& row : res.rows) EXPECT_EQ(row.tolerance, 1e-5) << row.name;
  EXPECT_EQ(compare_dumps(o, r, 1e-7).failed(), 1u);  // the same error, a tighter --rtol
}

TEST(CompareDumps, Float32RunIsJudgedAtFloat32Tolerance) {
  const TempDir tmp("shardcheck_compare_f32");
  const fs::path o = write_dump(tmp.path() / "oracle", base());
  const fs::path r = write_dump(tmp.path() / "run", as_f32(base()));
  const CompareResult res = compare_dumps(o, r, std::nullopt);
  EXPECT_EQ(res.failed(), 0u);
  for (const CompareRow& row : res.rows) {
    EXPECT_EQ(row.dtype, "float32");
    EXPECT_EQ(row.oracle_dtype, "float64");
    EXPECT_EQ(row.tolerance, 1e-4);
    EXPECT_GT(row.max_rel_err, 0.0) << row.name << ": rounded to float32";
  }
  // 1e-3 relative is beyond float32's tolerance.
  Tensors off = base();
  f64(off, "step3/grad/w")[5] *= 1 + 1e-3;
  const fs::path r2 = write_dump(tmp.path() / "run2", as_f32(off));
  const CompareResult res2 = compare_dumps(o, r2, std::nullopt);
  ASSERT_EQ(res2.failed(), 1u);
  EXPECT_EQ(res2.first_failure()->name, "grad/w");
  EXPECT_EQ(res2.first_failure()->step, 3);
}

TEST(CompareDumps, NanInRunFails) {
  const TempDir tmp("shardcheck_compare_nan");
  Tensors run = base();
  f64(run, "step1/grad/w")[0] = std::numeric_limits<double>::quiet_NaN();
  const fs::path o = write_dump(tmp.path() / "oracle", base());
  const fs::path r = write_dump(tmp.path() / "run", run);
  const CompareResult res = compare_dumps(o, r, 1e3);  // no tolerance passes a NaN
  ASSERT_EQ(res.failed(), 1u);
  EXPECT_EQ(res.first_failure()->name, "grad/w");
  EXPECT_TRUE(std::isinf(res.first_failure()->max_rel_err));
  const nlohmann::json j = compare_report_json(res);
  bool seen = false;
  for (const auto& row : j.at("rows"))
    if (row.at("name") == "grad/w" && row.at("step") == 1) {
      seen = true;
      EXPECT_EQ(row.at("max_rel_err"), "inf");
      EXPECT_EQ(row.at("max_abs_err"), "inf");
      EXPECT_EQ(row.at("pass"), false);
    }
  EXPECT_TRUE(seen);
}

TEST(CompareDumps, SameNonFiniteOnBothSidesMatches) {
  const TempDir tmp("shardcheck_compare_both_inf");
  Tensors t = base();
  f64(t, "step1/loss")[0] = std::numeric_limits<double>::infinity();
  const fs::path o = write_dump(tmp.path() / "oracle", t);
  const fs::path r = write_dump(tmp.path() / "run", t);
  EXPECT_EQ(compare_dumps(o, r, std::nullopt).failed(), 0u);
  Tensors neg = t;
  f64(neg, "step1/loss")[0] = -std::numeric_limits<double>::infinity();
  const fs::path r2 = write_dump(tmp.path() / "run2", neg);
  EXPECT_EQ(compare_dumps(o, r2, std::nullopt).failed(), 1u);
}

TEST(CompareDumps, InitComparedWhereBothHaveItBatchNever) {
  const TempDir tmp("shardcheck_compare_init");
  Tensors run = base();
  drop(run, "init/param/b");
  std::get<std::vector<int32_t>>(run[1].second.data)[0] = 99;  // batch/0/tokens differs
  const fs::path o = write_dump(tmp.path() / "oracle", base());
  const fs::path r = write_dump(tmp.path() / "run", run);
  const CompareResult res = compare_dumps(o, r, std::nullopt);
  EXPECT_EQ(res.failed(), 0u);
  EXPECT_EQ(res.rows.size(), 13u);
  EXPECT_EQ(res.rows[0].name, "init/param/w");
  // An init/ tensor both hold is judged.
  Tensors bad = base();
  f64(bad, "init/param/b")[1] += 1e-3;
  const fs::path r2 = write_dump(tmp.path() / "run2", bad);
  const CompareResult res2 = compare_dumps(o, r2, std::nullopt);
  ASSERT_EQ(res2.failed(), 1u);
  EXPECT_FALSE(res2.first_failure()->step.has_value());
  std::ostringstream text;
  print_compare(text, res2);
  EXPECT_TRUE(has(text.str(), "init: 2 tensors, 1 failed\n")) << text.str();
  EXPECT_TRUE(has(text.str(), "first failure: init tensor init/param/b:")) << text.str();
}

TEST(CompareDumps, IntegerTensorsMustBeExact) {
  const TempDir tmp("shardcheck_compare_int");
  Tensors o = base(), r = base();
  const int64_t big = (int64_t{1} << 60) + 1;  // beyond double's exact integers
  o.push_back({"step1/tokens_seen", {{2}, std::vector<int64_t>{big, 7}}});
  r.push_back({"step1/tokens_seen", {{2}, std::vector<int64_t>{big - 1, 7}}});
  const CompareResult res =
      compare_dumps(write_dump(tmp.path() / "o", o), write_dump(tmp.path() / "r", r), std::nullopt);
  ASSERT_EQ(res.failed(), 1u);
  EXPECT_EQ(res.first_failure()->name, "tokens_seen");
  EXPECT_EQ(res.first_failure()->tolerance, 0.0);
  EXPECT_EQ(res.first_failure()->max_abs_err, 1.0);
}

TEST(CompareDumps, MissingTensorInRunIsBadInput) {
  const TempDir tmp("shardcheck_compare_missing_run");
  Tensors run = base();
  drop(run, "step2/grad/w");
  const fs::path o = write_dump(tmp.path() / "oracle", base());
  const fs::path r = write_dump(tmp.path() / "run", run);
  const std::string m = bad_input([&] { compare_dumps(o, r, std::nullopt); });
  EXPECT_TRUE(has(m, "the run dump '" + r.string() + "' lacks the tensor step2/grad/w")) << m;
  EXPECT_TRUE(has(m, "which the oracle dump")) << m;
}

TEST(CompareDumps, MissingTensorInOracleIsBadInput) {
  const TempDir tmp("shardcheck_compare_missing_oracle");
  Tensors oracle = base();
  drop(oracle, "step3/loss");
  drop(oracle, "step3/grad_norm");
  const fs::path o = write_dump(tmp.path() / "oracle", oracle);
  const fs::path r = write_dump(tmp.path() / "run", base());
  const std::string m = bad_input([&] { compare_dumps(o, r, std::nullopt); });
  EXPECT_TRUE(has(m, "the oracle dump '" + o.string() + "' lacks 2 tensors of step 3")) << m;
  EXPECT_TRUE(has(m, "step3/grad_norm, step3/loss")) << m;
}

TEST(CompareDumps, DifferentStepsIsBadInputListingBoth) {
  const TempDir tmp("shardcheck_compare_steps");
  const fs::path o = write_dump(tmp.path() / "oracle", base(1, 4));
  const fs::path r = write_dump(tmp.path() / "run", base(1, 2));
  const std::string m = bad_input([&] { compare_dumps(o, r, std::nullopt); });
  EXPECT_TRUE(has(m, "different steps")) << m;
  EXPECT_TRUE(has(m, "oracle dump '" + o.string() + "' has steps 1-4")) << m;
  EXPECT_TRUE(has(m, "run dump '" + r.string() + "' has steps 1, 2")) << m;
}

TEST(CompareDumps, ShapeMismatchIsBadInputNamingBoth) {
  const TempDir tmp("shardcheck_compare_shape");
  Tensors run = base();
  for (auto& [n, a] : run)
    if (n == "step1/param/w") a.shape = {3, 2};
  const fs::path o = write_dump(tmp.path() / "oracle", base());
  const fs::path r = write_dump(tmp.path() / "run", run);
  const std::string m = bad_input([&] { compare_dumps(o, r, std::nullopt); });
  EXPECT_TRUE(has(m, "step1/param/w: the shapes differ: [2, 3] in the oracle dump")) << m;
  EXPECT_TRUE(has(m, "[3, 2] in the run dump")) << m;
}

TEST(CompareDumps, TruncatedNpyIsBadInputNamingTheFile) {
  const TempDir tmp("shardcheck_compare_truncated");
  const fs::path o = write_dump(tmp.path() / "oracle", base());
  const fs::path r = write_dump(tmp.path() / "run", base());
  const fs::path file = r / ref::TensorDumper::file_name("step2/param/w");
  fs::resize_file(file, fs::file_size(file) - 8);
  const std::string m = bad_input([&] { compare_dumps(o, r, std::nullopt); });
  EXPECT_TRUE(has(m, file.string() + ": truncated: the shape [2, 3] of <f8 needs 48 data bytes, "
                                     "the file has 40"))
      << m;
  EXPECT_TRUE(has(m, "tensor 'step2/param/w'")) << m;
}

TEST(CompareDumps, UnreadableNpyFilesAreBadInput) {
  const TempDir tmp("shardcheck_compare_npy");
  const fs::path o = write_dump(tmp.path() / "oracle", base());
  const std::string name = ref::TensorDumper::file_name("step1/param/w");
  const std::pair<std::function<void(const fs::path&)>, std::string> cases[] = {
      {[](const fs::path& f) { patch_file(f, "'fortran_order': False", "'fortran_order': True "); },
       "fortran_order is True"},
      {[](const fs::path& f) { patch_file(f, "'<f8'", "'>f8'"); }, "big-endian"},
      {[](const fs::path& f) { patch_file(f, "'<f8'", "'<u8'"); }, "dtype '<u8' is not read"},
      {[](const fs::path& f) { patch_file(f, "\x93NUMPY", "\x93NUMPZ"); }, "not a .npy file"},
      {[](const fs::path& f) { patch_file(f, "'shape'", "'shapf'"); }, "unexpected key 'shapf'"},
      {[](const fs::path& f) { fs::remove(f); }, "no such file"},
      {[](const fs::path& f) { std::ofstream(f, std::ios::app) << "xx"; },
       "2 bytes after the data"},
  };
  int i = 0;
  for (const auto& [damage, expected] : cases) {
    const fs::path r = write_dump(tmp.path() / ("run" + std::to_string(i++)), base());
    damage(r / name);
    const std::string m = bad_input([&] { compare_dumps(o, r, std::nullopt); });
    EXPECT_TRUE(has(m, (r / name).string() + ": ")) << m;
    EXPECT_TRUE(has(m, expected)) << m;
  }
}

TEST(CompareDumps, BadIndexIsBadInput) {
  const TempDir tmp("shardcheck_compare_index");
  const fs::path o = write_dump(tmp.path() / "oracle", base());
  const fs::path r = write_dump(tmp.path() / "run", base());
  fs::remove(r / "index.json");
  std::string m = bad_input([&] { compare_dumps(o, r, std::nullopt); });
  EXPECT_TRUE(has(m, "the run dump '" + r.string() + "' has no index.json")) << m;

  std::ofstream(r / "index.json") << "[{\"name\": ";
  m = bad_input([&] { compare_dumps(o, r, std::nullopt); });
  EXPECT_TRUE(has(m, (r / "index.json").string() + ": not valid JSON")) << m;

  std::ofstream(r / "index.json") << R"([{"name": "step1/loss", "file": "step1__loss.npy"}])";
  m = bad_input([&] { compare_dumps(o, r, std::nullopt); });
  EXPECT_TRUE(has(m, "entry 0 lacks \"shape\"")) << m;

  std::ofstream(r / "index.json")
      << R"([{"name": "step1/loss", "file": "step1__loss.npy", "shape": [2], "dtype": "float64"}])";
  m = bad_input([&] { compare_dumps(o, r, std::nullopt); });
  EXPECT_TRUE(has(m, "index.json gives the shape [2] but")) << m;
  EXPECT_TRUE(has(m, "step1__loss.npy holds []")) << m;

  m = bad_input([&] { compare_dumps(o, tmp.path() / "nowhere", std::nullopt); });
  EXPECT_TRUE(has(m, "is not a directory (it does not exist)")) << m;
}

TEST(CompareNpy, ReadsFloat16AndFormatVersion2) {
  const TempDir tmp("shardcheck_compare_npy_read");
  // 1, -2.5, the smallest subnormal 2^-24, +inf.
  const uint16_t half[] = {0x3C00, 0xC100, 0x0001, 0x7C00};
  std::string bytes(sizeof half, '\0');
  std::memcpy(bytes.data(), half, sizeof half);
  write_raw_npy(tmp.path() / "h.npy", 2,
                "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 2), }", bytes);
  const NpyArray a = read_npy(tmp.path() / "h.npy");
  EXPECT_EQ(a.header.dtype, "float16");
  EXPECT_EQ(a.header.shape, (std::vector<int64_t>{2, 2}));
  ASSERT_EQ(a.values.size(), 4u);
  EXPECT_EQ(a.values[0], 1.0);
  EXPECT_EQ(a.values[1], -2.5);
  EXPECT_EQ(a.values[2], std::ldexp(1.0, -24));
  EXPECT_TRUE(std::isinf(a.values[3]));

  write_raw_npy(tmp.path() / "v3.npy", 3,
                "{'descr': '<f2', 'fortran_order': False, 'shape': (1,), }", bytes.substr(0, 2));
  try {
    read_npy(tmp.path() / "v3.npy");
    ADD_FAILURE() << "version 3.0 read";
  } catch (const NpyError& e) {
    EXPECT_TRUE(has(e.what(), "version 3.0 is not read")) << e.what();
  }
}

TEST(CompareCli, ExitCodesAndReports) {
  const TempDir tmp("shardcheck_compare_cli");
  Tensors bad = base();
  f64(bad, "step2/param/w")[4] *= 1 + 1e-6;
  f64(bad, "step3/loss")[0] = std::numeric_limits<double>::quiet_NaN();
  const fs::path o = write_dump(tmp.path() / "oracle", base());
  const fs::path same = write_dump(tmp.path() / "same", base());
  const fs::path r = write_dump(tmp.path() / "run", bad);

  auto [code, out] = shardcheck("compare " + o.string() + " " + same.string());
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(has(out, "\ncompare: 14 tensors in 3 steps, 0 failed\n")) << out;

  const fs::path report = tmp.path() / "report";
  const fs::path junit = tmp.path() / "junit.xml";
  std::tie(code, out) = shardcheck("compare " + o.string() + " " + r.string() + " --report " +
                                   report.string() + " --junit " + junit.string());
  EXPECT_EQ(code, 1) << out;
  EXPECT_TRUE(has(out, "first failure: step 2 tensor param/w: max_rel_err")) << out;
  EXPECT_TRUE(has(out, "\ncompare: 14 tensors in 3 steps, 2 failed\n")) << out;

  const nlohmann::json j = read_json(report / "report.json");
  EXPECT_EQ(j.at("oracle"), o.string());
  EXPECT_EQ(j.at("run"), r.string());
  EXPECT_TRUE(j.at("rtol").is_null());
  EXPECT_EQ(j.at("passed"), 12);
  EXPECT_EQ(j.at("failed"), 2);
  EXPECT_EQ(j.at("rows").size(), 14u);
  ASSERT_EQ(j.at("steps").size(), 3u);
  EXPECT_EQ(j.at("steps")[1], (nlohmann::json{{"step", 2}, {"tensors", 4}, {"failed", 1}}));
  EXPECT_EQ(j.at("init").at("tensors"), 2);
  for (const auto& row : j.at("rows"))
    if (row.at("step") == 3 && row.at("name") == "loss") {
      EXPECT_EQ(row.at("max_rel_err"), "inf");
      EXPECT_EQ(row.at("dtype"), "float64");
      EXPECT_EQ(row.at("tolerance"), 1e-9);
      EXPECT_EQ(row.at("shape"), nlohmann::json::array());
    }
  const std::string html = slurp(report / "index.html");
  const auto first_fail = html.find("<td>FAIL</td>"), first_pass = html.find("<td>pass</td>");
  ASSERT_NE(first_fail, std::string::npos) << html;
  EXPECT_LT(first_fail, first_pass) << "failures first";

  const std::string xml = slurp(junit);
  EXPECT_TRUE(has(xml, "<testsuite name=\"compare\" tests=\"4\" failures=\"2\">")) << xml;
  EXPECT_TRUE(has(xml, "<testcase classname=\"compare\" name=\"step 1\"></testcase>")) << xml;
  EXPECT_TRUE(has(xml,
                  "name=\"step 2\"><failure message=\"1 of 4 tensors out of tolerance: "
                  "param/w\">"))
      << xml;
  EXPECT_TRUE(has(xml,
                  "name=\"step 3\"><failure message=\"1 of 4 tensors out of tolerance: "
                  "loss\">"))
      << xml;

  std::tie(code, out) = shardcheck("compare " + o.string() + " " + r.string() + " --rtol 1e-5");
  EXPECT_EQ(code, 1) << out << "the NaN fails at any tolerance";
  EXPECT_TRUE(has(out, "step 2: 4 tensors, 0 failed")) << out;

  const std::pair<std::string, std::string> bad_args[] = {
      {o.string() + " " + (tmp.path() / "nowhere").string(), "is not a directory"},
      {o.string() + " " + same.string() + " --rtol 0", "--rtol"},
      {o.string() + " " + same.string() + " --rtol nan", "--rtol: expected a finite number > 0"},
      {o.string(), "run is required"},
  };
  for (const auto& [args, message] : bad_args) {
    std::tie(code, out) = shardcheck("compare " + args);
    EXPECT_EQ(code, 2) << args << "\n" << out;
    EXPECT_TRUE(has(out, message)) << args << "\n" << out;
  }
}

}  // namespace
}  // namespace compare_test
}  // namespace shardcheck::harness
