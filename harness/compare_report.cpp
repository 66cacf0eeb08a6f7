// The output writers of `shardcheck compare` (compare.hpp): the text summary on stdout,
// report.json, index.html and the JUnit XML, all from a CompareResult (the comparison itself is
// compare.cpp; nothing there depends on this file).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "harness/compare.hpp"
#include "harness/html.hpp"
#include "harness/npy_read.hpp"
#include "harness/report.hpp"

namespace shardcheck::harness {

namespace {

nlohmann::json json_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

std::string group_label(std::optional<int64_t> step) {
  return step ? "step " + std::to_string(*step) : "init";
}

std::string failure_text(const CompareRow& row) {
  return row.name + " " + shape_text(row.shape) + ": max_rel_err " + num_text(row.max_rel_err) +
         " > tolerance " + num_text(row.tolerance, "%g");
}

}  // namespace

void print_compare(std::ostream& os, const CompareResult& r) {
  os << "# compare: oracle " << r.oracle << ", run " << r.run << "; pass when " << tolerance_rule(r)
     << "\n";
  std::size_t i = 0;
  for (const CompareGroup& g : r.groups) {
    os << group_label(g.step) << ": " << g.tensors << " tensors, " << g.failed << " failed\n";
    for (std::size_t k = 0; k < g.tensors; ++k, ++i) {
      const CompareRow& row = r.rows[i];
      if (row.pass) continue;
      char line[160];
      std::snprintf(line, sizeof line, " %-14s max_rel_err %-10s tolerance %-8s FAIL\n",
                    shape_text(row.shape).c_str(), num_text(row.max_rel_err).c_str(),
                    num_text(row.tolerance, "%g").c_str());
      os << "  " << row.name << line;
    }
  }
  if (const CompareRow* f = r.first_failure())
    os << "first failure: " << group_label(f->step) << " tensor " << f->name << ": max_rel_err "
       << num_text(f->max_rel_err) << " > tolerance " << num_text(f->tolerance, "%g") << "\n";
  os << "compare: " << r.rows.size() << " tensors in " << r.steps() << " steps, " << r.failed()
     << " failed\n";
}

nlohmann::json compare_report_json(const CompareResult& r) {
  nlohmann::json steps = nlohmann::json::array(), rows = nlohmann::json::array();
  nlohmann::json init = nullptr;
  for (const CompareGroup& g : r.groups) {
    const nlohmann::json counts{{"tensors", g.tensors}, {"failed", g.failed}};
    if (!g.step) {
      init = counts;
      continue;
    }
    nlohmann::json s = counts;
    s["step"] = *g.step;
    steps.push_back(s);
  }
  for (const CompareRow& row : r.rows)
    rows.push_back(
        {{"step", row.step ? nlohmann::json(*row.step) : nlohmann::json(nullptr)},
         {"name", row.name},
         {"shape", row.shape},
         {"dtype", row.dtype},
         {"oracle_dtype", row.oracle_dtype},
         {"max_abs_err", json_number(row.max_abs_err)},
         {"max_rel_err", json_number(row.max_rel_err)},
         {"tolerance", json_number(row.tolerance)},
         {"bound", row.bound},
         {"probe_err", row.probe_err ? json_number(*row.probe_err) : nlohmann::json(nullptr)},
         {"pass", row.pass}});
  return {{"command", "compare"},
          {"oracle", r.oracle},
          {"run", r.run},
          {"rtol", r.rtol ? nlohmann::json(*r.rtol) : nlohmann::json(nullptr)},
          {"noise", r.noise.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.noise)},
          {"tolerance_rule", tolerance_rule(r)},
          {"pass", r.failed() == 0},
          {"init", init},
          {"steps", steps},
          {"rows", rows},
          {"passed", r.rows.size() - r.failed()},
          {"failed", r.failed()}};
}

std::string compare_html(const CompareResult& r) {
  using html::escape;
  std::ostringstream h;
  const std::size_t failed = r.failed();
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
    << "<title>shardcheck compare: " << (failed ? "FAIL" : "PASS") << "</title><style>"
    << "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
    << "td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}"
    << "td.n{text-align:right;font-family:monospace}tr.fail{background:#fdd}</style></head><body>\n"
    << "<h1>shardcheck compare: " << (failed ? "FAIL" : "PASS") << "</h1>\n<p>oracle <code>"
    << escape(r.oracle) << "</code>, run <code>" << escape(r.run) << "</code></p>\n<p>pass when "
    << escape(tolerance_rule(r)) << "</p>\n<p>" << r.rows.size() << " tensors in " << r.steps()
    << " steps, " << failed << " failed</p>\n";
  h << "<table>\n<tr><th>step</th><th>tensor</th><th>shape</th><th>dtype (run / oracle)</th>"
    << "<th>max_abs_err</th><th>max_rel_err</th><th>tolerance</th><th>result</th></tr>\n";
  std::vector<const CompareRow*> order;
  for (const CompareRow& row : r.rows) order.push_back(&row);
  std::stable_partition(order.begin(), order.end(), [](const CompareRow* x) { return !x->pass; });
  for (const CompareRow* row : order)
    h << "<tr" << (row->pass ? "" : " class=\"fail\"") << "><td>" << escape(group_label(row->step))
      << "</td><td>" << escape(row->name) << "</td><td>" << escape(shape_text(row->shape))
      << "</td><td>" << escape(row->dtype) << " / " << escape(row->oracle_dtype)
      << "</td><td class=\"n\">" << num_text(row->max_abs_err) << "</td><td class=\"n\">"
      << num_text(row->max_rel_err) << "</td><td class=\"n\">" << num_text(row->tolerance, "%g")
      << "</td><td>" << (row->pass ? "pass" : "FAIL") << "</td></tr>\n";
  h << "</table>\n</body></html>\n";
  return h.str();
}

std::string compare_junit(const CompareResult& r) {
  std::ostringstream f;
  f << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<testsuites tests=\"" << r.groups.size() << "\" failures=\"";
  std::size_t failing_groups = 0;
  for (const CompareGroup& g : r.groups) failing_groups += g.failed > 0;
  f << failing_groups << "\">\n  <testsuite name=\"compare\" tests=\"" << r.groups.size()
    << "\" failures=\"" << failing_groups << "\">\n";
  std::size_t i = 0;
  for (const CompareGroup& g : r.groups) {
    f << "    <testcase classname=\"compare\" name=\"" << xml_escape(group_label(g.step)) << "\">";
    std::string names, detail;
    for (std::size_t k = 0; k < g.tensors; ++k, ++i) {
      const CompareRow& row = r.rows[i];
      if (row.pass) continue;
      names += (names.empty() ? "" : ", ") + row.name;
      detail += failure_text(row) + "\n";
    }
    if (g.failed)
      f << "<failure message=\""
        << xml_escape(std::to_string(g.failed) + " of " + std::to_string(g.tensors) +
                      " tensors out of tolerance: " + names)
        << "\">" << xml_escape(detail) << "</failure>";
    f << "</testcase>\n";
  }
  f << "  </testsuite>\n</testsuites>\n";
  return f.str();
}

}  // namespace shardcheck::harness
