// The dump comparison of compare.hpp: reading and checking both index.json files (and the noise
// probe's) and every listed .npy header, pairing tensors step by step, the per-tensor errors and
// bounds. The text, report.json, index.html and JUnit writers are compare_report.cpp.
#include "harness/compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <set>

#include "harness/cli_commands.hpp"
#include "harness/npy_read.hpp"
#include "harness/parity_bound.hpp"

namespace shardcheck::harness {

namespace {

namespace fs = std::filesystem;

// One tensor of a dump: what index.json says, its file's header, and where it belongs.
struct DumpTensor {
  std::string name;  // as listed
  fs::path file;
  NpyHeader header;
  enum class Kind { kStep, kInit, kBatch } kind = Kind::kBatch;
  int64_t step = 0;
  std::string key;  // within its step for kStep, the full name for kInit
};

struct Dump {
  std::string role;  // "oracle" or "run"
  fs::path dir;
  std::vector<DumpTensor> tensors;
  std::map<int64_t, std::map<std::string, std::size_t>> steps;  // step -> key -> tensor index
  std::map<std::string, std::size_t> init;                      // name -> tensor index

  std::string what() const { return "the " + role + " dump '" + dir.string() + "'"; }
};

// "step<N>/<rest>" -> N and rest; false when the name is not of that form.
bool split_step_name(const std::string& name, int64_t& step, std::string& rest) {
  if (name.rfind("step", 0) != 0) return false;
  std::size_t i = 4;
  int64_t n = 0;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') {
    if (n > (std::numeric_limits<int64_t>::max() - 9) / 10) return false;
    n = n * 10 + (name[i] - '0');
    ++i;
  }
  if (i == 4 || i >= name.size() || name[i] != '/' || i + 1 == name.size()) return false;
  step = n;
  rest = name.substr(i + 1);
  return true;
}

const nlohmann::json& index_field(const nlohmann::json& e, const char* key, const fs::path& index,
                                  std::size_t i) {
  if (!e.contains(key))
    throw BadInput(index.string() + ": entry " + std::to_string(i) + " lacks \"" + key +
                   "\" (each entry is {\"name\", \"file\", \"shape\", \"dtype\"})");
  return e.at(key);
}

Dump load_dump(const fs::path& dir, const std::string& role) {
  Dump d{role, dir, {}, {}, {}};
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw BadInput(d.what() + " is not a directory" +
                   (fs::exists(dir, ec) ? "" : " (it does not exist)"));
  const fs::path index = dir / "index.json";
  if (!fs::is_regular_file(index, ec))
    throw BadInput(d.what() + " has no index.json (expected " + index.string() +
                   ", written by --dump-tensors)");
  nlohmann::json j;
  {
    std::ifstream f(index);
    if (!f) throw BadInput(index.string() + ": cannot be opened for reading");
    try {
      j = nlohmann::json::parse(f);
    } catch (const nlohmann::json::exception& e) {
      throw BadInput(index.string() + ": not valid JSON (" + e.what() + ")");
    }
  }
  if (!j.is_array())
    throw BadInput(index.string() +
                   ": expected a JSON list of {\"name\", \"file\", \"shape\", \"dtype\"}");
  std::set<std::string> names;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& e = j[i];
    const std::string at = index.string() + ": entry " + std::to_string(i);
    if (!e.is_object()) throw BadInput(at + " is not an object");
    const auto& name = index_field(e, "name", index, i);
    const auto& file = index_field(e, "file", index, i);
    const auto& shape = index_field(e, "shape", index, i);
    const auto& dtype = index_field(e, "dtype", index, i);
    if (!name.is_string() || name.get<std::string>().empty())
      throw BadInput(at + ": \"name\" must be a non-empty string");
    if (!file.is_string() || file.get<std::string>().empty())
      throw BadInput(at + ": \"file\" must be a non-empty string");
    if (!dtype.is_string()) throw BadInput(at + ": \"dtype\" must be a string");
    std::vector<int64_t> dims;
    if (!shape.is_array()) throw BadInput(at + ": \"shape\" must be a list of integers >= 0");
    for (const auto& dim : shape) {
      if (!dim.is_number_integer() || dim.get<int64_t>() < 0)
        throw BadInput(at + ": \"shape\" must be a list of integers >= 0");
      dims.push_back(dim.get<int64_t>());
    }
    DumpTensor t;
    t.name = name.get<std::string>();
    t.file = dir / file.get<std::string>();
    if (!names.insert(t.name).second)
      throw BadInput(index.string() + ": the tensor '" + t.name + "' is listed twice");
    try {
      t.header = read_npy_header(t.file);
    } catch (const NpyError& err) {
      throw BadInput(d.what() + ", tensor '" + t.name + "': " + err.what());
    }
    if (t.header.shape != dims)
      throw BadInput(d.what() + ", tensor '" + t.name + "': index.json gives the shape " +
                     shape_text(dims) + " but " + t.file.string() + " holds " +
                     shape_text(t.header.shape));
    if (dtype.get<std::string>() != t.header.dtype)
      throw BadInput(d.what() + ", tensor '" + t.name + "': index.json gives the dtype '" +
                     dtype.get<std::string>() + "' but " + t.file.string() + " holds " +
                     t.header.dtype + " ('" + t.header.descr + "')");
    if (split_step_name(t.name, t.step, t.key)) {
      t.kind = DumpTensor::Kind::kStep;
      if (!d.steps[t.step].emplace(t.key, d.tensors.size()).second)
        throw BadInput(index.string() + ": step " + std::to_string(t.step) + " lists '" + t.key +
                       "' twice (as '" + t.name + "' and another spelling of the step)");
    } else if (t.name.rfind("init/", 0) == 0) {
      t.kind = DumpTensor::Kind::kInit;
      t.key = t.name;
      d.init.emplace(t.key, d.tensors.size());
    } else if (t.name.rfind("batch/", 0) == 0) {
      t.kind = DumpTensor::Kind::kBatch;
    } else {
      throw BadInput(d.what() + ": the tensor '" + t.name +
                     "' has an unknown name (expected step<N>/..., init/... or batch/...)");
    }
    d.tensors.push_back(std::move(t));
  }
  return d;
}

// "1-3, 5, 7-8"; "none" when empty.
std::string step_list(const std::map<int64_t, std::map<std::string, std::size_t>>& steps) {
  std::vector<int64_t> s;
  for (const auto& [n, tensors] : steps) s.push_back(n);
  if (s.empty()) return "none";
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    std::size_t j = i;
    while (j + 1 < s.size() && s[j + 1] == s[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(s[i]) +
           (j > i ? (j == i + 1 ? ", " : "-") + std::to_string(s[j]) : "");
    i = j + 1;
  }
  return out;
}

// Every tensor of `have`'s step that `lacks` does not hold: a BadInput naming them.
void check_same_tensors(const Dump& have, const Dump& lacks, int64_t step) {
  const auto& mine = have.steps.at(step);
  const auto& theirs = lacks.steps.at(step);
  std::vector<std::string> missing;
  for (const auto& [key, index] : mine)
    if (!theirs.count(key)) missing.push_back(have.tensors[index].name);
  if (missing.empty()) return;
  if (missing.size() == 1)
    throw BadInput(lacks.what() + " lacks the tensor " + missing[0] + ", which " + have.what() +
                   " holds");
  std::string list;
  for (std::size_t i = 0; i < missing.size() && i < 8; ++i) list += (i ? ", " : "") + missing[i];
  if (missing.size() > 8) list += " and " + std::to_string(missing.size() - 8) + " more";
  throw BadInput(lacks.what() + " lacks " + std::to_string(missing.size()) + " tensors of step " +
                 std::to_string(step) + " that " + have.what() + " holds: " + list);
}

// The same steps in both dumps and the same tensors in each step, or a BadInput naming them.
void check_same_steps(const Dump& a, const Dump& b) {
  bool same_steps = a.steps.size() == b.steps.size();
  for (const auto& [step, tensors] : a.steps) same_steps = same_steps && b.steps.count(step);
  if (!same_steps)
    throw BadInput("the dumps hold different steps: " + a.what() + " has steps " +
                   step_list(a.steps) + "; " + b.what() + " has steps " + step_list(b.steps));
  for (const auto& [step, tensors] : a.steps) {
    check_same_tensors(a, b, step);
    check_same_tensors(b, a, step);
  }
}

// The counterpart in `other` of each oracle tensor that is compared (every step<N>/ tensor, an
// init/ tensor where `other` holds it; null otherwise); every shape checked before any data is
// read.
std::vector<const DumpTensor*> counterparts(const Dump& od, const Dump& other) {
  std::vector<const DumpTensor*> partner(od.tensors.size(), nullptr);
  for (std::size_t i = 0; i < od.tensors.size(); ++i) {
    const DumpTensor& o = od.tensors[i];
    if (o.kind == DumpTensor::Kind::kStep)
      partner[i] = &other.tensors[other.steps.at(o.step).at(o.key)];
    else if (o.kind == DumpTensor::Kind::kInit && other.init.count(o.key))
      partner[i] = &other.tensors[other.init.at(o.key)];
    if (partner[i] && partner[i]->header.shape != o.header.shape)
      throw BadInput(o.name + ": the shapes differ: " + shape_text(o.header.shape) + " in " +
                     od.what() + ", " + shape_text(partner[i]->header.shape) + " in " +
                     other.what());
  }
  return partner;
}

NpyArray read_tensor(const Dump& d, const DumpTensor& t) {
  try {
    return read_npy(t.file);
  } catch (const NpyError& err) {
    throw BadInput(d.what() + ", tensor '" + t.name + "': " + err.what());
  }
}

// |a − b| for two integers, exactly (the difference of two int64 fits an unsigned 64-bit integer).
double int_distance(int64_t a, int64_t b) {
  const auto ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
  return static_cast<double>(a >= b ? ua - ub : ub - ua);
}

// One tensor against the oracle's: max_abs and max_rel as compare.hpp says, and the sums of the
// norm-wise measure (infinite with a non-finite mismatch; matching non-finite elements left out).
struct Errors {
  double max_abs = 0, max_rel = 0;
  double diff_sq = 0, ref_sq = 0;  // sum (x - oracle)^2, sum oracle^2
};

Errors errors_of(const NpyArray& oracle, const NpyArray& run) {
  const bool ints = !oracle.ints.empty() && !run.ints.empty();
  double scale = 0, max_abs = 0, diff_sq = 0, ref_sq = 0;
  bool nonfinite_mismatch = false;
  for (std::size_t i = 0; i < oracle.values.size(); ++i) {
    const double o = oracle.values[i], r = run.values[i];
    if (std::isfinite(o)) {
      scale = std::max(scale, std::abs(o));
      ref_sq += o * o;
    }
    if (ints) {
      max_abs = std::max(max_abs, int_distance(run.ints[i], oracle.ints[i]));
    } else if (!std::isfinite(o) || !std::isfinite(r)) {
      const bool same = (std::isnan(o) && std::isnan(r)) || o == r;  // o == r: the same infinity
      nonfinite_mismatch = nonfinite_mismatch || !same;
    } else {
      max_abs = std::max(max_abs, std::abs(r - o));
      diff_sq += (r - o) * (r - o);
    }
  }
  if (scale == 0) scale = 1;
  const double inf = std::numeric_limits<double>::infinity();
  if (nonfinite_mismatch) return {inf, inf, inf, ref_sq};
  return {max_abs, max_abs / scale, diff_sq, ref_sq};
}

// The noise bound's floor for a run tensor of `dtype` (harness/README.md "Parity bounds", the
// formula of noise_floors in parity_bound.cpp, by the run's dtype rather than the scenario's
// precision): one ulp relative of the dtype; for a step scalar at least 2^-52 x sqrt(N), N the
// model's parameter elements (a sum of N squares, in f64, added in another order).
double noise_floor_of(const std::string& dtype, bool step_scalar, double n_params) {
  const double eps64 = std::numeric_limits<double>::epsilon();
  const double unit = dtype == "float64"   ? eps64
                      : dtype == "float32" ? double{std::numeric_limits<float>::epsilon()}
                                           : std::ldexp(1.0, -10);  // float16
  return step_scalar ? std::max(unit, eps64 * std::sqrt(n_params)) : unit;
}

// N of the step scalars' floor: the elements of the oracle's param/ tensors at its first step that
// holds any (init/param/ when no step does).
double parameter_count(const Dump& od) {
  for (const auto& [step, tensors] : od.steps) {
    double n = 0;
    for (const auto& [key, index] : tensors)
      if (key.rfind("param/", 0) == 0) n += static_cast<double>(od.tensors[index].header.numel);
    if (n > 0) return n;
  }
  double n = 0;
  for (const auto& [name, index] : od.init)
    if (name.rfind("init/param/", 0) == 0) n += static_cast<double>(od.tensors[index].header.numel);
  return n;
}

// One step's parameters norm-wise, added up tensor by tensor (the run's and the probe's).
struct NormSums {
  double run_diff_sq = 0, probe_diff_sq = 0, ref_sq = 0;
  int64_t elements = 0;
  double unit = 0;  // the largest floor of the run's dtypes
  std::string dtype, oracle_dtype;
};

double norm_rel(double diff_sq, double ref_sq) {
  return ref_sq > 0 ? std::sqrt(diff_sq / ref_sq) : std::sqrt(diff_sq);
}

// The comparison once the dumps are checked: each oracle tensor against its partner in the run,
// under the rule that applies, with the noise probe's largest errors so far.
struct Comparison {
  const Dump& od;
  const Dump& rd;
  const Dump* nd = nullptr;                // the noise probe, or null
  std::vector<const DumpTensor*> run;      // each oracle tensor's partner in the run
  std::vector<const DumpTensor*> probe{};  // ... in the noise probe
  std::optional<double> rtol;
  double n_params = 0;                        // N of the step scalars' floor
  std::map<std::string, double> probe_max{};  // per tensor (its key; init/: its name)
  double probe_norm_max = 0;

  // max(m, e): the probe's largest error so far; one that is not finite cannot bound anything.
  double raise(double m, double e, const std::string& what) const {
    if (!std::isfinite(e))
      throw BadInput(nd->what() + ", " + what + ": the noise probe's error against the oracle is " +
                     num_text(e) + ": the scenario is too chaotic to check");
    return std::max(m, e);
  }

  CompareRow row(std::size_t i, std::optional<int64_t> step, NormSums& norm) {
    const DumpTensor& o = od.tensors[i];
    const DumpTensor& r = *run[i];
    CompareRow row;
    row.step = step;
    row.name = o.key;
    row.shape = o.header.shape;
    row.dtype = r.header.dtype;
    row.oracle_dtype = o.header.dtype;
    const NpyArray oracle = read_tensor(od, o);
    const Errors e = errors_of(oracle, read_tensor(rd, r));
    row.max_abs_err = e.max_abs;
    row.max_rel_err = e.max_rel;
    if (rtol) {
      row.tolerance = *rtol;
      row.bound = "rtol";
    } else if (!nd || r.header.integer()) {
      row.tolerance = default_tolerance(row.dtype);
      row.bound = "dtype";
    } else {
      const Errors pe = errors_of(oracle, read_tensor(*nd, *probe[i]));
      double& m = probe_max[o.key];
      m = raise(m, pe.max_rel, "tensor '" + o.name + "'");
      const bool scalar = step && o.key.find('/') == std::string::npos;
      row.probe_err = m;
      row.tolerance = kNoiseMargin * std::max(m, noise_floor_of(row.dtype, scalar, n_params));
      row.bound = "noise";
      if (step && o.key.rfind("param/", 0) == 0) {
        norm.run_diff_sq += e.diff_sq;
        norm.probe_diff_sq += pe.diff_sq;
        norm.ref_sq += e.ref_sq;
        norm.elements += static_cast<int64_t>(o.header.numel);
        norm.unit = std::max(norm.unit, noise_floor_of(row.dtype, false, 0));
        norm.dtype = norm.dtype.empty() || norm.dtype == row.dtype ? row.dtype : "mixed";
        norm.oracle_dtype = norm.oracle_dtype.empty() || norm.oracle_dtype == row.oracle_dtype
                                ? row.oracle_dtype
                                : "mixed";
      }
    }
    row.pass = row.max_rel_err <= row.tolerance;
    return row;
  }

  // The step's parameters norm-wise (max_abs_err: ||run - oracle||_2), against the probe's.
  CompareRow norm_row(int64_t step, const NormSums& n) {
    CompareRow row;
    row.step = step;
    row.name = "params (norm-wise)";
    row.shape = {n.elements};
    row.dtype = n.dtype;
    row.oracle_dtype = n.oracle_dtype;
    row.max_abs_err = std::sqrt(n.run_diff_sq);
    row.max_rel_err = norm_rel(n.run_diff_sq, n.ref_sq);
    probe_norm_max = raise(probe_norm_max, norm_rel(n.probe_diff_sq, n.ref_sq),
                           "step " + std::to_string(step) + " parameters norm-wise");
    row.probe_err = probe_norm_max;
    row.tolerance = kNoiseMargin * std::max(probe_norm_max, n.unit);
    row.bound = "noise";
    row.pass = row.max_rel_err <= row.tolerance;
    return row;
  }
};

}  // namespace

std::string num_text(double v, const char* spec) {
  char buf[48];
  std::snprintf(buf, sizeof buf, spec, v);
  return buf;
}

std::size_t CompareResult::failed() const {
  std::size_t n = 0;
  for (const CompareRow& row : rows) n += !row.pass;
  return n;
}

std::size_t CompareResult::steps() const {
  std::size_t n = 0;
  for (const CompareGroup& g : groups) n += g.step.has_value();
  return n;
}

const CompareRow* CompareResult::first_failure() const {
  for (const CompareRow& row : rows)
    if (!row.pass) return &row;
  return nullptr;
}

double default_tolerance(const std::string& dtype) {
  if (dtype == "float64") return 1e-9;
  if (dtype == "float32") return 1e-4;
  if (dtype == "float16") return 1e-2;
  return 0;  // integers: exact
}

std::string tolerance_rule(const CompareResult& r) {
  const std::string measure = "max_rel_err = max|run - oracle| / max|oracle| <= ";
  if (r.rtol) return measure + num_text(*r.rtol, "%g") + " for every tensor (--rtol)";
  if (!r.noise.empty())
    return measure + num_text(kNoiseMargin, "%g") + " x the noise probe's error (" + r.noise +
           ") on the same tensor, its largest up to that step; floors one ulp of the run's dtype, "
           "step scalars 2^-52 x sqrt(N) (N = " +
           num_text(r.noise_params, "%.0f") +
           " parameters); integers 0; per step also the parameters norm-wise, ||run - oracle|| / "
           "||oracle||, alike";
  return measure +
         "the run's dtype's tolerance: float64 1e-9, float32 1e-4, float16 1e-2, integers 0";
}

CompareResult compare_dumps(const fs::path& oracle, const fs::path& run,
                            std::optional<double> rtol) {
  const Dump od = load_dump(oracle, "oracle");
  const Dump rd = load_dump(run, "run");
  check_same_steps(od, rd);
  Comparison c{.od = od, .rd = rd, .run = counterparts(od, rd), .rtol = rtol};
  // The noise probe `run --dump-tensors` writes beside the oracle: the bounds derive from it
  // unless --rtol is given (harness/README.md "Parity bounds").
  std::optional<Dump> nd;
  std::error_code ec;
  if (!rtol && fs::is_regular_file(oracle / "noise" / "index.json", ec)) {
    nd = load_dump(oracle / "noise", "noise probe");
    check_same_steps(od, *nd);
    c.probe = counterparts(od, *nd);
    for (std::size_t i = 0; i < od.tensors.size(); ++i)
      if (c.run[i] && !c.probe[i])
        throw BadInput(nd->what() + " lacks the tensor " + od.tensors[i].name + ", which " +
                       od.what() + " holds");
    c.nd = &*nd;
    c.n_params = parameter_count(od);
  }

  CompareResult r;
  r.oracle = oracle.string();
  r.run = run.string();
  r.rtol = rtol;
  r.noise = nd ? nd->dir.string() : "";
  r.noise_params = c.n_params;
  NormSums unused;
  // init/: the oracle's order, where the run holds the tensor too.
  CompareGroup init{std::nullopt, 0, 0};
  for (std::size_t i = 0; i < od.tensors.size(); ++i) {
    if (od.tensors[i].kind != DumpTensor::Kind::kInit || !c.run[i]) continue;
    r.rows.push_back(c.row(i, std::nullopt, unused));
    ++init.tensors;
    init.failed += !r.rows.back().pass;
  }
  if (init.tensors) r.groups.push_back(init);
  // Steps in order, each in the oracle's order (then, with the probe, the parameters norm-wise).
  for (const auto& [step, tensors] : od.steps) {
    CompareGroup g{step, 0, 0};
    std::vector<std::size_t> order;
    for (const auto& [key, index] : tensors) order.push_back(index);
    std::sort(order.begin(), order.end());
    NormSums norm;
    for (const std::size_t i : order) {
      r.rows.push_back(c.row(i, step, norm));
      ++g.tensors;
      g.failed += !r.rows.back().pass;
    }
    if (!norm.dtype.empty()) {
      r.rows.push_back(c.norm_row(step, norm));
      ++g.tensors;
      g.failed += !r.rows.back().pass;
    }
    r.groups.push_back(g);
  }
  if (r.rows.empty())
    throw BadInput("nothing to compare: neither " + od.what() + " nor " + rd.what() +
                   " holds a step<N>/ tensor, and they share no init/ tensor");
  return r;
}

}  // namespace shardcheck::harness
