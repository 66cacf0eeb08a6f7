// index.html: renders a report.json document (one scenario, or a matrix with "scenarios") as one
// self-contained page (inline CSS and SVG, no script, no network). Every field is optional; missing
// or mistyped fields are shown as "not recorded" or left out, never thrown about.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace shardcheck::harness {

// Deterministic: the same report always gives the same bytes. Never throws on report content.
std::string render_html(const nlohmann::json& report);

// Pieces shared by html.cpp (page, tables), html_svg.cpp (charts) and html_text.cpp (escaping,
// field access, formatting); not a public API.
namespace html {

using Json = nlohmann::json;

// Text for HTML content and attribute values: escapes & < > " ', replaces invalid UTF-8 and
// control characters (other than tab and newline) with U+FFFD.
std::string escape(const std::string& s);

// Typed, never-throwing field access: nullptr / nullopt-like defaults when absent or mistyped.
const Json* field(const Json& j, const char* key);
bool has_num(const Json& j, const char* key);
double num(const Json& j, const char* key, double fallback = 0.0);
std::string str(const Json& j, const char* key);  // strings as is, numbers/bools printed, else ""
std::string cell(const Json* v);  // escaped text of any value for a table cell; "–" when absent
const Json* array_of(const Json& j, const char* key);   // non-empty array or nullptr
const Json* object_of(const Json& j, const char* key);  // object or nullptr

std::string fmt(double v, const char* spec = "%.4g");
std::string fmt_bytes(double bytes);
std::string fmt_seconds(double s);
std::string fmt_int_list(const Json& j);  // [0,1,2] -> "0, 1, 2"
std::string fmt_mesh(const Json& mesh);   // {"dp":2,"tp":2,...} -> "dp2 × tp2"; strings as is

// A two-column table of an object's fields: known keys (rows) with labels and formatters first,
// then every other field not in skip as it is, so fields added later still show.
struct Row {
  const char* key;
  const char* label;
  std::string (*format)(double);
};
std::string kv_table(const Json& obj, const std::vector<Row>& rows,
                     const std::set<std::string>& skip, const std::string& more_rows = "");

// A plan candidate's `fits`: false only when recorded false; its cell "yes" / "no", else as is.
bool does_not_fit(const Json* fits);
std::string fits_cell(const Json* fits);

// The plan search section (html_search.cpp): report.json's `search` object.
std::string search_section(const Json& search);

// A fill colour for an event or memory category, fixed for known names, hashed otherwise.
std::string colour_for(const std::string& kind);

// SVG figures (html_svg.cpp). `id` must be unique within the page.
std::string timeline_svg(const Json& timeline, const std::string& id);
std::string memory_svg(const Json& memory_rows, const std::string& id);
std::string phases_svg(const Json& phase_rows, const std::string& id);
std::string scaling_svg(const Json& scaling, const std::string& id);
std::string error_sparkline(const Json& steps, double tolerance);
// Loss of the run and of the reference per step (report.json's `steps`), and each step's error
// against its bound on a log scale.
std::string loss_svg(const Json& steps, const std::string& id);
// Memory over one step of one rank (step_timeline's `memory`: equal buckets of the step, the most
// held in each).
std::string memory_step_svg(const Json& memory, const std::string& id);

}  // namespace html
}  // namespace shardcheck::harness
