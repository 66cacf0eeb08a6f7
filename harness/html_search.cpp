// index.html's plan search section (`plan --search --report`): what was enumerated and what the
// engine does not build, the fastest candidates with their reasons, the best of each family with
// why it lost, and where the search spent its time. Reads report.json's `search` object only.
#include "harness/html.hpp"

namespace shardcheck::harness::html {

namespace {

std::string search_pct(const Json& c, const char* key) {
  return has_num(c, key) ? fmt(100 * num(c, key), "%.1f") + "%" : cell(nullptr);
}

// One candidate's cells: config, family, step, exposed, memory per rank, MFU, HFU.
std::string search_candidate_cells(const Json& c) {
  const auto seconds = [&](const char* key) {
    return has_num(c, key) ? escape(fmt_seconds(num(c, key))) : cell(nullptr);
  };
  return "<td><code>" + escape(str(c, "config")) + "</code></td><td>" + escape(str(c, "family")) +
         "</td><td class=\"num\">" + seconds("step_time_s") + "</td><td class=\"num\">" +
         seconds("exposed_comm_s") + "</td><td class=\"num\">" +
         (has_num(c, "memory_per_rank_bytes") ? escape(fmt_bytes(num(c, "memory_per_rank_bytes")))
                                              : cell(nullptr)) +
         "</td><td class=\"num\">" + search_pct(c, "mfu") + "</td><td class=\"num\">" +
         search_pct(c, "hfu") + "</td>";
}

constexpr const char* kSearchHead =
    "<th>config</th><th>family</th><th>step</th><th>exposed comm + bubble</th>"
    "<th>memory/rank</th><th>MFU</th><th>HFU</th>";

}  // namespace

std::string search_section(const Json& s) {
  std::string o =
      "<p>Every mesh of " + escape(str(s, "world_size")) + " ranks, global batch " +
      escape(str(s, "global_batch")) + " sequences, " +
      (has_num(s, "device_memory_bytes") ? escape(fmt_bytes(num(s, "device_memory_bytes")))
                                         : std::string("unrecorded")) +
      " per device.";
  if (const Json* best = field(s, "best"); best && best->is_string())
    o += " Best: <code>" + escape(best->get<std::string>()) + "</code>.";
  o += "</p>\n";
  if (const Json* m = object_of(s, "meshes")) o += "<h3>Meshes</h3>\n" + kv_table(*m, {}, {});
  if (const Json* c = object_of(s, "candidates"))
    o += "<h3>Candidates</h3>\n" + kv_table(*c, {}, {});
  if (const Json* top = array_of(s, "top")) {
    o += "<h3>Fastest that fit</h3><table><tr><th>rank</th>" + std::string(kSearchHead) +
         "<th>why</th></tr>\n";
    for (const Json& c : *top)
      o += "<tr><td class=\"num\">" + cell(field(c, "rank")) + "</td>" + search_candidate_cells(c) +
           "<td>" + escape(str(c, "reason")) + "</td></tr>\n";
    o += "</table>\n";
  } else {
    o += "<p class=\"note\">No candidate fits.</p>\n";
  }
  if (const Json* fams = array_of(s, "families")) {
    o += "<h3>The best of each family</h3><table><tr><th>family</th><th>candidates</th>"
         "<th>fits</th>" +
         std::string(kSearchHead) + "<th>why it lost</th></tr>\n";
    for (const Json& f : *fams) {
      const Json* c = object_of(f, "config");
      const Json* fits = field(f, "fits");
      const bool nofit = does_not_fit(fits);
      o += std::string("<tr") + (nofit ? " class=\"nofit\"" : "") + "><td>" +
           escape(str(f, "family")) + "</td><td class=\"num\">" + cell(field(f, "candidates")) +
           "</td><td class=\"fits\">" + fits_cell(fits) + "</td>" +
           (c ? search_candidate_cells(*c) : "<td colspan=\"7\">" + cell(nullptr) + "</td>") +
           "<td>" + escape(str(f, "why")) + "</td></tr>\n";
    }
    o += "</table>\n";
  }
  if (const Json* w = object_of(s, "wall_split_s")) {
    o += "<h3>Search time</h3><p>" +
         (has_num(s, "wall_s") ? escape(fmt_seconds(num(s, "wall_s"))) : cell(nullptr)) +
         " wall</p>\n" +
         kv_table(*w,
                  {{"enumerate_and_ledger", "enumeration and memory ledger", fmt_seconds},
                   {"bounds", "lower bounds", fmt_seconds},
                   {"timing", "clock", fmt_seconds}},
                  {});
  }
  return o;
}

}  // namespace shardcheck::harness::html
