// `shardcheck compare`: judges a run's tensor dump against an oracle's, step by step (DESIGN.md
// "Tensor dumps": DIR/index.json and one .npy per tensor). Every tensor `step<N>/...` of a step is
// compared with the oracle's of that step, `init/...` where both dumps hold it, `batch/...` never.
// Per tensor: max_abs_err = max|run − oracle| (in double), max_rel_err = max_abs_err / max|oracle|
// (1 when the oracle is all zeros); a non-finite run element where the oracle's is finite (or the
// other way round, or two different non-finite values) makes both infinite; the same NaN or the
// same infinity on both sides matches. A tensor passes when max_rel_err <= its tolerance:
//  - --rtol when given;
//  - else, when ORACLE/noise/index.json exists (the noise probe `run --dump-tensors` writes beside
//    the reference: the reference trained again with every op's result moved by one ulp), the
//    bound `run` judges parity by (harness/README.md "Parity bounds", parity_bound.hpp): for a
//    float tensor at step k, kNoiseMargin x max(the probe's max_rel_err against the oracle of the
//    same tensor, its largest over the steps up to k; a floor of one ulp relative of the run's
//    dtype, for the step scalars (step<N>/<name>, no '/') at least 2^-52 x sqrt(N) with N the
//    oracle's parameter elements). Each step holding param/ tensors gets one more row, the
//    parameters norm-wise ("params (norm-wise)": ||run - oracle||_2 / ||oracle||_2 over every
//    param/ tensor, in max_rel_err; the numerator in max_abs_err), bound alike by the probe's.
//    Integer tensors stay exact;
//  - else by the run's dtype (float64 1e-9, float32 1e-4, float16 1e-2, integers 0).
//
// Dumps that cannot be compared (a missing or malformed index.json or .npy, an index that
// disagrees with its files, different steps, a tensor in one dump only, different shapes; the
// same of the noise probe's dump against the oracle's, or a probe error that is not finite) throw
// BadInput (harness/cli_commands.hpp) naming the dump, the tensor or file, and what was expected.
//
// report.json writes a non-finite number as the string "inf", "-inf" or "nan" (JSON has none).
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace shardcheck::harness {

struct CompareRow {
  std::optional<int64_t> step;  // nullopt: an init/ tensor
  std::string name;             // within its step ("loss", "param/embed.weight"); init/: in full
  std::vector<int64_t> shape;
  std::string dtype;         // the run's (it picks the tolerance)
  std::string oracle_dtype;  // the oracle's
  double max_abs_err = 0;
  double max_rel_err = 0;
  double tolerance = 0;
  std::string bound;                // the rule of its tolerance: "noise", "dtype" or "rtol"
  std::optional<double> probe_err;  // "noise": the probe's largest max_rel_err up to this step
  bool pass = true;
};

// One group of rows: the init/ tensors (step nullopt, first when any) or one step.
struct CompareGroup {
  std::optional<int64_t> step;
  std::size_t tensors = 0;
  std::size_t failed = 0;
};

struct CompareResult {
  std::string oracle, run;     // the dump directories as given
  std::optional<double> rtol;  // --rtol, or nullopt: by the noise probe or by dtype
  std::string noise;           // the noise probe's dump the bounds derive from ("" when none)
  double noise_params = 0;     // N of the step scalars' floor (with `noise`)
  std::vector<CompareGroup> groups;
  std::vector<CompareRow> rows;  // group by group, each in the oracle's index order

  std::size_t failed() const;
  std::size_t steps() const;  // numbered steps (the init/ group not counted)
  const CompareRow* first_failure() const;
};

// The tolerance for a run tensor of `dtype` ("float64", ...) without --rtol or a noise probe.
double default_tolerance(const std::string& dtype);
// The rule in words, for the header line and the reports.
std::string tolerance_rule(const CompareResult& r);
// One number as printf's `spec` writes it, for the messages and the reports.
std::string num_text(double v, const char* spec = "%.3g");

// Loads both dumps (and ORACLE/noise when it holds index.json and no --rtol is given), checks that
// they can be compared, compares. Throws BadInput.
CompareResult compare_dumps(const std::filesystem::path& oracle, const std::filesystem::path& run,
                            std::optional<double> rtol);

// The writers (compare_report.cpp) read a CompareResult only; the comparison never calls them.
//
// The text summary: a header, a line per group with its failing rows under it, the first failure
// (when any) and `compare: N tensors in S steps, F failed`.
void print_compare(std::ostream& os, const CompareResult& r);
// report.json: {command: "compare", oracle, run, rtol (null: by the noise probe or dtype), noise
// (the probe's dump or null), tolerance_rule, pass, init: {tensors, failed} or null, steps:
// [{step, tensors, failed}], rows: [{step (null for init/), name, shape, dtype, oracle_dtype,
// max_abs_err, max_rel_err, tolerance, bound, probe_err (null unless bound "noise"), pass}],
// passed, failed} (passed and failed count rows).
nlohmann::json compare_report_json(const CompareResult& r);
// index.html: one self-contained page, the rows in a table, failures first.
std::string compare_html(const CompareResult& r);
// JUnit XML: testsuite "compare", one testcase per group ("init", "step N").
std::string compare_junit(const CompareResult& r);

}  // namespace shardcheck::harness
