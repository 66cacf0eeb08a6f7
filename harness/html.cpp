// index.html: the page, its header/manifest and the tables (parity, timing, faults, drills, plan;
// the plan search is html_search.cpp's).
// The SVG figures are in html_svg.cpp, escaping and formatting in html_text.cpp. Reads only the
// report JSON, so it renders old reports (fewer fields) and matrix reports alike.
#include "harness/html.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <set>
#include <string_view>
#include <vector>

namespace shardcheck::harness {

namespace {

using namespace html;  // NOLINT: this file is the html module

std::string badge(const Json* pass) {
  if (!pass || !pass->is_boolean()) return "<span class=\"badge na\">NOT RECORDED</span>";
  return pass->get<bool>() ? "<span class=\"badge pass\">PASS</span>"
                           : "<span class=\"badge fail\">FAIL</span>";
}

std::string pct(double fraction) {
  return fmt(fraction * 100, "%.2f") + " %";
}

std::string timing_table(const Json& t) {
  std::string rank_rows;
  if (const Json* rs = object_of(t, "rank_step_time_s")) {
    std::string v;
    for (const char* k : {"p50", "p95", "max"})
      v += (v.empty() ? "" : " / ") + (has_num(*rs, k) ? fmt_seconds(num(*rs, k)) : "\xE2\x80\x93");
    rank_rows = "<tr><th>rank step time p50 / p95 / max</th><td class=\"num\">" + escape(v) +
                "</td></tr>\n";
  }
  return kv_table(
      t,
      {{"step_time_s", "step time (max over ranks)", fmt_seconds},
       {"tokens_per_s", "tokens/s (non-padding)", [](double v) { return fmt(v, "%.4g"); }},
       {"mfu", "MFU", pct},
       {"bubble_fraction", "pipeline bubble", pct},
       {"scaling_efficiency", "scaling efficiency", pct}},
      {"rank_step_time_s"}, rank_rows);
}

std::string goodput_table(const Json& g) {
  return kv_table(g,
                  {{"fraction", "goodput (tokens that advanced training)", pct},
                   {"good_tokens_per_s", "good tokens/s", [](double v) { return fmt(v, "%.4g"); }},
                   {"tokens_per_s", "tokens/s processed", [](double v) { return fmt(v, "%.4g"); }}},
                  {});
}

// report.json's "moe": the reference run's expert load over the whole run (routed and kept per
// expert), then per step its drops and aux loss.
std::string moe_section(const Json& m) {
  std::string o = "<p>" + escape(str(m, "source")) + "; " + cell(field(m, "experts")) +
                  " experts, top-" + cell(field(m, "top_k")) + ", capacity factor " +
                  cell(field(m, "capacity_factor")) + ".</p>\n";
  if (const Json* t = object_of(m, "total")) {
    const Json* routed = array_of(*t, "routed");
    const Json* kept = array_of(*t, "kept");
    o += "<p>Over the run: " + cell(field(*t, "dropped")) + " assignments dropped (" +
         (has_num(*t, "drop_fraction") ? pct(num(*t, "drop_fraction")) : std::string("–")) +
         "); the busiest expert took " +
         (has_num(*t, "max_over_mean") ? fmt(num(*t, "max_over_mean"), "%.3g") : std::string("–")) +
         "× the mean.</p>\n";
    if (routed && kept && routed->size() == kept->size()) {
      o += "<table><tr><th>expert</th><th>routed</th><th>kept</th></tr>\n";
      for (std::size_t e = 0; e < routed->size(); ++e)
        o += "<tr><td class=\"num\">" + std::to_string(e) + "</td><td class=\"num\">" +
             cell(&(*routed)[e]) + "</td><td class=\"num\">" + cell(&(*kept)[e]) + "</td></tr>\n";
      o += "</table>\n";
    }
  }
  if (const Json* steps = array_of(m, "steps")) {
    o += "<table><tr><th>step</th><th>aux loss</th><th>dropped</th></tr>\n";
    for (const Json& s : *steps)
      o += "<tr><td class=\"num\">" + cell(field(s, "step")) + "</td><td class=\"num\">" +
           (has_num(s, "aux") ? fmt(num(s, "aux"), "%.4g") : std::string("–")) +
           "</td><td class=\"num\">" + cell(field(s, "dropped")) + "</td></tr>\n";
    o += "</table>\n";
  }
  return o;
}

std::string memory_section(const Json& rows, const std::string& id) {
  std::string o = memory_svg(rows, id);
  o += "<details><summary>bytes per rank</summary><table><tr><th>rank</th>";
  static constexpr std::array<const char*, 6> kCols{"params",      "grads",     "optimizer",
                                                    "activations", "temporary", "peak"};
  for (const char* c : kCols) o += std::string("<th>") + c + "</th>";
  o += "<th>peak phase</th></tr>\n";
  for (const Json& r : rows) {
    o += "<tr><td class=\"num\">" + cell(field(r, "rank")) + "</td>";
    for (const char* c : kCols)
      o += "<td class=\"num\">" + (has_num(r, c) ? escape(fmt_bytes(num(r, c))) : cell(nullptr)) +
           "</td>";
    o += "<td>" + cell(field(r, "peak_phase")) + "</td></tr>\n";
  }
  return o + "</table></details>\n";
}

std::string timeline_section(const Json& tl, const std::string& id) {
  std::string svg = timeline_svg(tl, id);
  if (svg.empty()) return "<p class=\"note\">timeline: not recorded</p>\n";
  if (const Json* m = object_of(tl, "memory")) svg += memory_step_svg(*m, id + "-mem");
  return svg;
}

std::string parity_section(const Json& parity, const std::string& idp) {
  std::string o =
      "<table class=\"parity\"><tr><th>configuration</th><th>strategy</th><th>ranks</th>"
      "<th>result</th><th>max rel. error</th><th>bound</th><th>per step "
      "(log\xE2\x82\x81\xE2\x82\x80 "
      "error)</th><th>wall</th><th>detail</th></tr>\n";
  std::string extra;  // per-configuration timing/timeline/memory, below the table
  std::size_t i = 0;
  for (const Json& row : parity) {
    const Json* pass = field(row, "pass");
    const Json* sup = field(row, "supported");
    const bool unsupported = sup && sup->is_boolean() && !sup->get<bool>();
    const bool ok = pass && pass->is_boolean() && pass->get<bool>();
    const char* cls = unsupported ? "unsupported" : ok ? "pass" : "fail";
    const char* result = unsupported ? "UNSUPPORTED"
                         : !pass     ? "\xE2\x80\x93"
                         : ok        ? "PASS"
                                     : "FAIL";
    o += std::string("<tr class=\"") + cls + "\"><td>" + cell(field(row, "config")) + "</td><td>" +
         cell(field(row, "strategy")) + "</td><td class=\"num\">" + cell(field(row, "world_size")) +
         "</td><td class=\"result\">" + result + "</td><td class=\"num\">" +
         (has_num(row, "max_rel_err") ? fmt(num(row, "max_rel_err"), "%.3e") : cell(nullptr)) +
         "</td><td class=\"num\">" +
         (has_num(row, "tolerance") ? fmt(num(row, "tolerance"), "%.2e") : cell(nullptr)) +
         "</td><td>";
    if (const Json* steps = array_of(row, "steps")) {
      o += error_sparkline(*steps, num(row, "tolerance", NAN));
      o += "<details class=\"steps\"><summary>" + std::to_string(steps->size()) +
           (steps->size() == 1 ? " step" : " steps") +
           "</summary><table><tr><th>step</th><th>loss</th><th>ref loss</th><th>max rel. "
           "error</th></tr>";
      for (const Json& s : *steps)
        o += "<tr><td class=\"num\">" + cell(field(s, "step")) + "</td><td class=\"num\">" +
             (has_num(s, "loss") ? fmt(num(s, "loss"), "%.10g") : cell(nullptr)) +
             "</td><td class=\"num\">" +
             (has_num(s, "ref_loss") ? fmt(num(s, "ref_loss"), "%.10g") : cell(nullptr)) +
             "</td><td class=\"num\">" +
             (has_num(s, "max_rel_err") ? fmt(num(s, "max_rel_err"), "%.3e") : cell(nullptr)) +
             "</td></tr>";
      o += "</table></details>";
    }
    o += "</td><td class=\"num\">" +
         (has_num(row, "wall_s") ? escape(fmt_seconds(num(row, "wall_s"))) : cell(nullptr)) +
         "</td><td>" + (str(row, "detail").empty() ? "" : escape(str(row, "detail"))) +
         "</td></tr>\n";

    const Json* t = object_of(row, "timing");
    const Json* tl = object_of(row, "timeline");
    const Json* mem = array_of(row, "memory");
    const Json* good = object_of(row, "goodput");
    const Json* phases = array_of(row, "phases_per_rank");
    if (t || tl || mem) {
      const std::string cid = idp + "cfg" + std::to_string(i);
      extra += "<details class=\"config\" id=\"" + cid + "\"><summary>" +
               cell(field(row, "config")) + ": " + (t ? "timing " : "") + (tl ? "timeline " : "") +
               (mem ? "memory" : "") + "</summary>\n";
      if (const Json* steps = array_of(row, "steps"); steps && !steps->empty())
        extra += "<h4>Loss and error per step</h4>\n" + loss_svg(*steps, cid + "-loss");
      if (t) extra += "<h4>Timing</h4>\n" + timing_table(*t);
      if (good) extra += "<h4>Goodput</h4>\n" + goodput_table(*good);
      if (phases) extra += "<h4>Step phases</h4>\n" + phases_svg(*phases, cid + "-phases");
      if (tl) extra += "<h4>Timeline</h4>\n" + timeline_section(*tl, cid + "-timeline");
      if (mem) extra += "<h4>Memory</h4>\n" + memory_section(*mem, cid + "-memory");
      extra += "</details>\n";
    }
    ++i;
  }
  return o + "</table>\n" + extra;
}

std::string faults_section(const Json& faults) {
  if (faults.empty()) return "<p>No faults recorded.</p>\n";
  std::string o;
  constexpr std::size_t kLastOps = 12;
  for (const Json& f : faults) {
    std::set<std::int64_t> culprits;
    if (const Json* r = field(f, "ranks")) {
      if (r->is_number_integer()) culprits.insert(r->get<std::int64_t>());
      if (r->is_array())
        for (const Json& v : *r)
          if (v.is_number_integer()) culprits.insert(v.get<std::int64_t>());
    }
    const Json* det = field(f, "detected");
    const bool detected = det && det->is_boolean() && det->get<bool>();
    o += "<article class=\"fault\"><h3>" + cell(field(f, "kind")) + " " +
         (det && det->is_boolean() ? (detected ? "<span class=\"badge pass\">detected</span>"
                                               : "<span class=\"badge fail\">not detected</span>")
                                   : std::string()) +
         "</h3>\n<table class=\"kv\">";
    for (const char* k : {"ranks", "op", "group", "seq", "step"})
      if (field(f, k))
        o += std::string("<tr><th>") + k + "</th><td>" + cell(field(f, k)) + "</td></tr>";
    o += "</table>\n";
    if (!str(f, "message").empty())
      o += "<pre class=\"message\">" + escape(str(f, "message")) + "</pre>\n";
    const Json* fr = array_of(f, "flight_records");
    if (!fr) {
      o += "</article>\n";
      continue;
    }
    o += "<h4>Flight recorder (last ops per rank)</h4><div class=\"records\">\n";
    constexpr std::size_t kMaxRanks = 32;  // culprits always shown, then the first others
    std::size_t others = 0, omitted = 0;
    for (const Json& rr : *fr) {
      const bool culprit = field(rr, "rank") && field(rr, "rank")->is_number_integer() &&
                           culprits.count(field(rr, "rank")->get<std::int64_t>());
      if (!culprit && ++others > kMaxRanks) {
        ++omitted;
        continue;
      }
      const Json* recs = field(rr, "records");
      const std::size_t n = recs && recs->is_array() ? recs->size() : 0;
      o += std::string("<table class=\"flight") + (culprit ? " culprit" : "") +
           "\"><caption>rank " + cell(field(rr, "rank")) + (culprit ? " (culprit)" : "") +
           (n > kLastOps ? " \xC2\xB7 last " + std::to_string(kLastOps) + " of " + std::to_string(n)
                         : "") +
           "</caption><tr><th>seq</th><th>group</th><th>op</th><th>dtype</th><th>count</"
           "th><th>root</th>"
           "<th>state</th><th>start</th><th>end</th><th>step</th></tr>\n";
      for (std::size_t k = n > kLastOps ? n - kLastOps : 0; k < n; ++k) {
        const Json& r = (*recs)[k];
        const std::string state = str(r, "state");
        o += std::string("<tr") + (state == "completed" ? "" : " class=\"open\"") + ">";
        for (const char* c : {"seq", "group", "op", "dtype", "count", "root", "state"})
          o += "<td>" + cell(field(r, c)) + "</td>";
        for (const char* c : {"start", "end"})
          o += "<td class=\"num\">" +
               (has_num(r, c) ? escape(fmt_seconds(num(r, c))) : cell(nullptr)) + "</td>";
        o += "<td>" + cell(field(r, "step")) + "</td></tr>\n";
      }
      o += "</table>\n";
    }
    o += "</div>\n";
    if (omitted)
      o += "<p class=\"note\">" + std::to_string(omitted) + " more ranks' records not shown.</p>\n";
    o += "</article>\n";
  }
  return o;
}

std::string drills_section(const Json& drills) {
  std::string o = "<table><tr><th>drill</th><th>result</th><th>detail</th></tr>\n";
  for (const Json& d : drills) {
    const Json* pass = field(d, "pass");
    const bool ok = pass && pass->is_boolean() && pass->get<bool>();
    o += std::string("<tr class=\"") + (ok ? "pass" : "fail") + "\"><td>" + cell(field(d, "name")) +
         "</td><td class=\"result\">" +
         (!pass ? "\xE2\x80\x93"
          : ok  ? "PASS"
                : "FAIL") +
         "</td><td>" + (str(d, "detail").empty() ? "" : escape(str(d, "detail"))) + "</td></tr>\n";
  }
  return o + "</table>\n";
}

std::string scaling_table(const Json& series, const char* title) {
  std::string o = std::string("<table><caption>") + title +
                  "</caption><tr><th>world size</th><th>step time</th><th>efficiency</th></tr>\n";
  for (const Json& p : series)
    o += "<tr><td class=\"num\">" + cell(field(p, "world_size")) + "</td><td class=\"num\">" +
         (has_num(p, "step_time_s") ? escape(fmt_seconds(num(p, "step_time_s"))) : cell(nullptr)) +
         "</td><td class=\"num\">" +
         (has_num(p, "efficiency") ? escape(pct(num(p, "efficiency"))) : cell(nullptr)) +
         "</td></tr>\n";
  return o + "</table>\n";
}

// A candidate's placement, compact: "tp 8 intra, dp 128 inter (16 nodes)".
std::string placement_cell(const Json& c) {
  const Json* place = array_of(c, "placement");
  if (!place) return cell(nullptr);
  std::string o;
  for (const Json& x : *place) {
    if (!o.empty()) o += ", ";
    o += str(x, "axis") + " " + fmt(num(x, "size"), "%.0f") + " " +
         (str(x, "link") == "inter_node"
              ? "inter (" + fmt(num(x, "nodes_spanned"), "%.0f") + " nodes)"
              : std::string("intra"));
  }
  return o.empty() ? "one rank" : escape(o);
}

std::string plan_section(const Json& plan, const std::string& idp) {
  std::string o;
  if (const Json* cands = array_of(plan, "candidates")) {
    o += "<h3>Candidate meshes</h3><table><tr><th>mesh</th><th>step time</th><th>memory/rank</th>"
         "<th>fits</th><th>tokens/s</th><th>MFU</th><th>links</th><th>note</th></tr>\n";
    for (const Json& c : *cands) {
      const Json* fits = field(c, "fits");
      const bool nofit = does_not_fit(fits);
      const Json* mesh = field(c, "mesh");
      o +=
          std::string("<tr") + (nofit ? " class=\"nofit\"" : "") + "><td>" +
          (mesh ? escape(fmt_mesh(*mesh)) : cell(nullptr)) + "</td><td class=\"num\">" +
          (has_num(c, "step_time_s") ? escape(fmt_seconds(num(c, "step_time_s"))) : cell(nullptr)) +
          "</td><td class=\"num\">" +
          (has_num(c, "memory_per_rank_bytes") ? escape(fmt_bytes(num(c, "memory_per_rank_bytes")))
                                               : cell(nullptr)) +
          "</td><td class=\"fits\">" + fits_cell(fits) + "</td><td class=\"num\">" +
          (has_num(c, "tokens_per_s") ? fmt(num(c, "tokens_per_s"), "%.4g") : cell(nullptr)) +
          "</td><td class=\"num\">" +
          (has_num(c, "mfu") ? escape(pct(num(c, "mfu"))) : cell(nullptr)) + "</td><td>" +
          placement_cell(c) + "</td><td>" + (str(c, "note").empty() ? "" : escape(str(c, "note"))) +
          "</td></tr>\n";
    }
    o += "</table>\n";
  }
  if (const Json* sc = object_of(plan, "scaling")) {
    o += "<h3>Scaling efficiency</h3>\n" + scaling_svg(*sc, idp + "scaling");
    o += "<div class=\"records\">";
    if (const Json* s = array_of(*sc, "strong")) o += scaling_table(*s, "strong scaling");
    if (const Json* w = array_of(*sc, "weak")) o += scaling_table(*w, "weak scaling");
    o += "</div>\n";
  }
  if (const Json* g = field(plan, "goodput")) {
    o += "<h3>Goodput</h3>\n";
    o += g->is_object() ? kv_table(*g, {}, {}) : "<p>" + cell(g) + "</p>\n";
  }
  std::set<std::string> known{"candidates", "scaling", "goodput"};
  bool other = false;
  for (const auto& [k, v] : plan.items()) other = other || !known.count(k);
  if (other) o += "<h3>Other plan fields</h3>\n" + kv_table(plan, {}, known);
  return o;
}

// One scenario's report: header with manifest, then each section that has data. `idp` prefixes
// element ids so a matrix page can hold several scenarios.
std::string scenario_body(const Json& r, const std::string& idp, int level) {
  const std::string h = "h" + std::to_string(level), h2 = "h" + std::to_string(level + 1);
  std::string o = "<header id=\"" + idp + "top\"><" + h + ">" +
                  (str(r, "scenario").empty() ? "(unnamed scenario)" : escape(str(r, "scenario"))) +
                  " " + badge(field(r, "pass")) + "</" + h + ">\n";
  if (!str(r, "description").empty()) o += "<p>" + escape(str(r, "description")) + "</p>\n";
  const Json* man = object_of(r, "manifest");
  const Json empty = Json::object();
  const Json& m = man ? *man : empty;
  o += "<dl class=\"facts\">";
  auto fact = [&](const char* label, const std::string& text) {
    if (!text.empty()) o += std::string("<dt>") + label + "</dt><dd>" + escape(text) + "</dd>";
  };
  fact("backend", str(r, "backend"));
  // Where the strategies' ranks computed, when not the CPU (the reference is always on the CPU).
  if (const std::string c = str(r, "compute"); !c.empty() && c != "cpu")
    fact("compute", c + " (strategy ranks; the reference on the CPU)");
  // A matrix is described by its configurations, not by the base block they inherit from.
  const Json* configs = array_of(m, "configs");
  if (configs && configs->front().is_object()) {
    double lo = INFINITY, hi = 0;
    for (const Json& c : *configs)
      if (c.is_object() && has_num(c, "world_size")) {
        lo = std::min(lo, num(c, "world_size"));
        hi = std::max(hi, num(c, "world_size"));
      }
    fact("configurations", std::to_string(configs->size()) +
                               (hi > 0 ? ", world size " + fmt(lo, "%.0f") +
                                             (hi > lo ? "\xE2\x80\x93" + fmt(hi, "%.0f") : "")
                                       : ""));
  } else {
    fact("world size", str(r, "world_size"));
    if (const Json* mesh = field(m, "mesh")) fact("mesh", fmt_mesh(*mesh));
    fact("order", str(m, "order"));
  }
  fact("precision", str(m, "precision"));
  fact("global batch", str(m, "global_batch_sequences").empty()
                           ? ""
                           : str(m, "global_batch_sequences") + " sequences");
  fact("seed", str(m, "seed"));
  fact("code version", str(m, "code_version"));
  fact("code commit", str(m, "code_commit"));
  o += "</dl>\n";
  if (const Json* groups = array_of(m, "groups")) {
    constexpr std::size_t kMaxRows = 4096;
    o += "<details><summary>rank \xE2\x86\x92 group table (" + std::to_string(groups->size()) +
         (groups->size() == 1 ? " rank" : " ranks") +
         ")</summary><table><tr><th>rank</th><th>dp</th><th>tp</th><th>pp</th><th>cp</th>"
         "<th>ep</th></tr>\n";
    for (std::size_t i = 0; i < groups->size() && i < kMaxRows; ++i) {
      const Json& g = (*groups)[i];
      o += "<tr><td class=\"num\">" + cell(field(g, "rank")) + "</td>";
      for (const char* a : {"dp", "tp", "pp", "cp", "ep"})
        o += "<td>" + cell(field(g, a)) + "</td>";
      o += "</tr>\n";
    }
    o += "</table>";
    if (groups->size() > kMaxRows)
      o += "<p class=\"note\">first " + std::to_string(kMaxRows) + " ranks shown</p>";
    o += "</details>\n";
  }

  // Sections in a fixed order; the nav says which were not recorded.
  struct Section {
    const char* id;
    const char* title;
    std::string html;
  };
  std::vector<Section> sections;
  if (const Json* p = field(r, "parity"); p && p->is_array())
    sections.push_back(
        {"parity", "Parity", p->empty() ? "<p>No configurations.</p>\n" : parity_section(*p, idp)});
  if (const Json* t = object_of(r, "timing"))
    sections.push_back({"timing", "Timing", timing_table(*t)});
  if (const Json* tl = object_of(r, "timeline"))
    sections.push_back({"timeline", "Timeline", timeline_section(*tl, idp + "timeline")});
  if (const Json* mem = array_of(r, "memory"))
    sections.push_back({"memory", "Memory per rank", memory_section(*mem, idp + "memory")});
  if (const Json* moe = object_of(r, "moe"))
    sections.push_back({"moe", "MoE load", moe_section(*moe)});
  if (const Json* f = field(r, "faults"); f && f->is_array())
    sections.push_back({"faults", "Faults and diagnosis", faults_section(*f)});
  if (const Json* d = array_of(r, "drills"))
    sections.push_back(
        {"drills", "Drills",
         drills_section(*d) + (object_of(r, "goodput") ? "<h3>Goodput of a restore</h3>\n" +
                                                             goodput_table(*object_of(r, "goodput"))
                                                       : "")});
  if (const Json* p = object_of(r, "plan"))
    sections.push_back({"plan", "Plan", plan_section(*p, idp)});
  if (const Json* p = object_of(r, "search"))
    sections.push_back({"search", "Plan search", search_section(*p)});

  o += "<nav>";
  for (const char* id :
       {"parity", "timing", "timeline", "memory", "moe", "faults", "drills", "plan", "search"}) {
    bool present = false;
    for (const Section& s : sections) present = present || std::string_view(s.id) == id;
    const std::string_view v(id);
    if (present)
      o += "<a href=\"#" + idp + id + "\">" + id + "</a>";
    else if (v != "drills" && v != "plan" && v != "search" && v != "moe")
      o += "<span class=\"absent\" title=\"not recorded in this report\">" + std::string(id) +
           "</span>";
  }
  o += "</nav></header>\n";
  for (const Section& s : sections)
    o += "<section id=\"" + idp + s.id + "\"><" + h2 + ">" + s.title + "</" + h2 + ">\n" + s.html +
         "</section>\n";
  return o;
}

constexpr const char* kStyle = R"(
:root{--ok:#1a7f37;--bad:#cf222e;--muted:#6e7781;--line:#d0d7de;--bg:#f6f8fa}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1f2328;
 max-width:1240px;margin:0 auto;padding:0 24px 48px}
header{border-bottom:1px solid var(--line);padding:14px 0 8px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:19px;margin:28px 0 8px;padding-bottom:4px;
 border-bottom:1px solid var(--line)}h3{font-size:15px;margin:16px 0 6px}h4{margin:12px 0 4px}
.badge{display:inline-block;padding:1px 10px;border-radius:12px;font-size:13px;font-weight:600;
 color:#fff;vertical-align:middle}.badge.pass{background:var(--ok)}.badge.fail{background:var(--bad)}
.badge.na{background:var(--muted)}
table{border-collapse:collapse;margin:6px 0;font-size:13px}caption{text-align:left;font-weight:600}
th,td{border:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top}
th{background:var(--bg);font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.pass td.result{color:var(--ok);font-weight:600}tr.fail td.result{color:var(--bad);font-weight:600}
tr.fail{background:#fff5f5}tr.unsupported{color:var(--muted)}tr.nofit{color:var(--muted)}
tr.nofit td.fits{color:var(--bad);font-weight:600}tr.open td{background:#fff8e5}
table.flight{font-size:12px}table.flight td,table.flight th{padding:1px 5px}
table.culprit{outline:2px solid var(--bad)}table.culprit caption{color:var(--bad)}
dl.facts{display:grid;grid-template-columns:max-content auto;gap:2px 16px;margin:8px 0}
dl.facts dt{color:var(--muted)}dl.facts dd{margin:0}
nav{display:flex;gap:14px;margin:8px 0;font-size:13px}nav a{color:#0969da;text-decoration:none}
nav .absent{color:var(--muted);text-decoration:line-through}
pre{background:var(--bg);border:1px solid var(--line);padding:8px;white-space:pre-wrap;
 overflow-wrap:anywhere;font-size:12px}
.scroll{overflow-x:auto;max-width:100%}.note{color:var(--muted);font-size:12px}
.records{display:flex;flex-wrap:wrap;gap:8px 16px;align-items:flex-start}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;margin:4px 0}
.swatch{display:inline-block;width:11px;height:11px;margin-right:4px;border-radius:2px;
 vertical-align:-1px}
details{margin:6px 0}summary{cursor:pointer}svg.spark{vertical-align:middle;margin-right:8px}
details.steps{display:inline-block;vertical-align:middle;margin:0}details.config{border:1px solid var(--line);
 border-radius:6px;padding:4px 10px}article.fault{margin-bottom:18px}
svg text{font:10px system-ui,sans-serif;fill:#1f2328}svg .axis{stroke:#8c959f;fill:none}
svg .grid{stroke:#eaeef2}svg .idle{fill:#eef1f4}svg .step{stroke:#57606a;stroke-dasharray:3 3}
svg .tol{stroke:var(--bad);stroke-dasharray:2 2}svg .peak{stroke:#1f2328;stroke-width:2}
svg text.in{fill:#fff}svg text.muted{fill:var(--muted)}
)";

}  // namespace

std::string render_html(const Json& report) {
  const Json* scenarios = array_of(report, "scenarios");
  std::string title = scenarios ? "matrix (" + std::to_string(scenarios->size()) + " scenarios)"
                                : str(report, "scenario");
  if (title.empty()) title = "report";
  const Json* pass = field(report, "pass");
  const char* verdict = !pass || !pass->is_boolean() ? ""
                        : pass->get<bool>()          ? " \xE2\x80\x94 PASS"
                                                     : " \xE2\x80\x94 FAIL";
  std::string o =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src "
      "'unsafe-inline'\">\n<title>shardcheck: " +
      escape(title) + verdict + "</title>\n<style>" + kStyle + "</style></head>\n<body>\n";
  if (!scenarios) {
    o += scenario_body(report, "", 1);
  } else {
    o += "<header><h1>shardcheck matrix " + badge(pass) +
         "</h1>\n<table><tr><th>scenario</th>"
         "<th>result</th><th>configurations</th></tr>\n";
    for (std::size_t i = 0; i < scenarios->size(); ++i) {
      const Json& s = (*scenarios)[i];
      const Json* p = field(s, "parity");
      o += "<tr><td><a href=\"#s" + std::to_string(i) + "-top\">" +
           (str(s, "scenario").empty() ? "(unnamed)" : escape(str(s, "scenario"))) +
           "</a></td><td>" + badge(field(s, "pass")) + "</td><td class=\"num\">" +
           (p && p->is_array() ? std::to_string(p->size()) : "\xE2\x80\x93") + "</td></tr>\n";
    }
    o += "</table></header>\n";
    for (std::size_t i = 0; i < scenarios->size(); ++i)
      o += "<section class=\"scenario\">\n" +
           scenario_body((*scenarios)[i], "s" + std::to_string(i) + "-", 2) + "</section>\n";
  }
  o += "<footer class=\"note\"><p>shardcheck report";
  if (const Json* m = object_of(report, "manifest"); m && !str(*m, "code_version").empty())
    o += " \xC2\xB7 code version " + escape(str(*m, "code_version"));
  o += "</p></footer>\n</body></html>\n";
  return o;
}

}  // namespace shardcheck::harness
