// index.html text helpers: HTML escaping (with UTF-8 repair), never-throwing typed access to report
// fields, number/byte/time formatting and the fixed colour scheme. No page structure here.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string_view>
#include <vector>

#include "harness/html.hpp"

namespace shardcheck::harness::html {

namespace {
constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the valid UTF-8 sequence at p[0..n), or 0 when it is not one.
std::size_t utf8_len(const unsigned char* p, std::size_t n) {
  const unsigned char c = p[0];
  std::size_t len = 0;
  if (c >= 0xC2 && c <= 0xDF)
    len = 2;
  else if (c >= 0xE0 && c <= 0xEF)
    len = 3;
  else if (c >= 0xF0 && c <= 0xF4)
    len = 4;
  if (len == 0 || len > n) return 0;
  for (std::size_t k = 1; k < len; ++k)
    if ((p[k] & 0xC0) != 0x80) return 0;
  if ((c == 0xE0 && p[1] < 0xA0) || (c == 0xED && p[1] >= 0xA0)) return 0;  // overlong, surrogate
  if ((c == 0xF0 && p[1] < 0x90) || (c == 0xF4 && p[1] >= 0x90)) return 0;  // overlong, > U+10FFFF
  return len;
}
}  // namespace

std::string escape(const std::string& s) {
  std::string o;
  o.reserve(s.size() + s.size() / 8);
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = p[i];
    if (c >= 0x80) {
      const std::size_t len = utf8_len(p + i, s.size() - i);
      if (len == 0) {
        o += kReplacement;
        ++i;
      } else {
        o.append(s, i, len);
        i += len;
      }
      continue;
    }
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      case '\'':
        o += "&#39;";
        break;
      case '\n':
      case '\t':
        o += static_cast<char>(c);
        break;
      default:
        if (c < 0x20 || c == 0x7F)
          o += kReplacement;
        else
          o += static_cast<char>(c);
    }
    ++i;
  }
  return o;
}

const Json* field(const Json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  const auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

bool has_num(const Json& j, const char* key) {
  const Json* f = field(j, key);
  return f && f->is_number();
}

double num(const Json& j, const char* key, double fallback) {
  const Json* f = field(j, key);
  return f && f->is_number() ? f->get<double>() : fallback;
}

namespace {
std::string scalar_text(const Json& v) {
  if (v.is_string()) return v.get_ref<const std::string&>();
  if (v.is_number_unsigned()) return std::to_string(v.get<std::uint64_t>());
  if (v.is_number_integer()) return std::to_string(v.get<std::int64_t>());
  if (v.is_number_float()) return fmt(v.get<double>());
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  return "";
}

std::string dump(const Json& v) {
  return v.dump(-1, ' ', false, Json::error_handler_t::replace);
}
}  // namespace

std::string cell(const Json* v) {
  if (!v || v->is_null()) return "\xE2\x80\x93";
  if (v->is_array()) {
    bool scalars = true;
    for (const Json& e : *v) scalars = scalars && e.is_primitive();
    if (scalars) return escape(fmt_int_list(*v));
  }
  if (v->is_structured()) return escape(dump(*v));
  return escape(scalar_text(*v));
}

std::string str(const Json& j, const char* key) {
  const Json* f = field(j, key);
  return f ? scalar_text(*f) : "";
}

const Json* array_of(const Json& j, const char* key) {
  const Json* f = field(j, key);
  return f && f->is_array() && !f->empty() ? f : nullptr;
}

const Json* object_of(const Json& j, const char* key) {
  const Json* f = field(j, key);
  return f && f->is_object() ? f : nullptr;
}

std::string fmt(double v, const char* spec) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, spec, v);
  return buf;
}

std::string fmt_bytes(double b) {
  if (!std::isfinite(b)) return fmt(b);
  static constexpr std::array<const char*, 6> kUnits{"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  std::size_t u = 0;
  double v = b;
  while (std::fabs(v) >= 1024.0 && u + 1 < kUnits.size()) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) return fmt(v, "%.0f") + " B";
  const char* spec = std::fabs(v) < 10 ? "%.2f" : std::fabs(v) < 100 ? "%.1f" : "%.0f";
  return fmt(v, spec) + " " + kUnits[u];
}

std::string fmt_seconds(double s) {
  if (!std::isfinite(s)) return fmt(s);
  const double a = std::fabs(s);
  if (a == 0) return "0 s";
  if (a >= 1) return fmt(s, "%.4g") + " s";
  if (a >= 1e-3) return fmt(s * 1e3, "%.4g") + " ms";
  return fmt(s * 1e6, "%.4g") + " \xC2\xB5s";
}

std::string fmt_int_list(const Json& j) {
  if (!j.is_array()) return scalar_text(j);
  std::string o;
  for (const Json& v : j) o += (o.empty() ? "" : ", ") + scalar_text(v);
  return o;
}

std::string fmt_mesh(const Json& mesh) {
  if (!mesh.is_object()) return scalar_text(mesh);
  std::string o;
  for (const char* axis : {"dp", "tp", "pp", "cp", "ep"})
    if (num(mesh, axis, 1) > 1)
      o += (o.empty() ? "" : " \xC3\x97 ") + std::string(axis) + str(mesh, axis);
  if (o.empty()) o = "1 rank";
  if (num(mesh, "zero", 0) > 0) o += " \xC2\xB7 ZeRO-" + str(mesh, "zero");
  if (const Json* f = field(mesh, "fsdp"); f && !f->is_null() && !(f->is_boolean() && !*f))
    o += " \xC2\xB7 FSDP" + (f->is_string() ? " " + f->get<std::string>() : std::string());
  return o;
}

std::string kv_table(const Json& obj, const std::vector<Row>& rows,
                     const std::set<std::string>& skip, const std::string& more_rows) {
  if (!obj.is_object()) return "<p class=\"note\">not recorded</p>\n";
  std::string o = "<table class=\"kv\">\n";
  std::set<std::string> done = skip;
  for (const Row& r : rows) {
    done.insert(r.key);
    const Json* v = field(obj, r.key);
    if (!v) continue;
    const std::string text =
        v->is_number() && r.format ? escape(r.format(v->get<double>())) : cell(v);
    o += "<tr><th>" + escape(r.label) + "</th><td class=\"num\">" + text + "</td></tr>\n";
  }
  o += more_rows;
  for (const auto& [k, v] : obj.items()) {
    if (done.count(k)) continue;
    if (v.is_object()) {
      for (const auto& [k2, v2] : v.items())
        o += "<tr><th>" + escape(k + "." + k2) + "</th><td>" + cell(&v2) + "</td></tr>\n";
    } else {
      o += "<tr><th>" + escape(k) + "</th><td>" + cell(&v) + "</td></tr>\n";
    }
  }
  return o + "</table>\n";
}

bool does_not_fit(const Json* fits) {
  return fits && fits->is_boolean() && !fits->get<bool>();
}

std::string fits_cell(const Json* fits) {
  if (!fits || !fits->is_boolean()) return cell(fits);
  return fits->get<bool>() ? "yes" : "no";
}

std::string colour_for(const std::string& kind) {
  static constexpr std::array<std::pair<std::string_view, const char*>, 20> kKnown{{
      {"forward", "#4e79a7"},     {"backward", "#2b5c8a"},       {"optimizer", "#59a14f"},
      {"compute", "#4e79a7"},     {"recompute", "#76b7b2"},      {"all_reduce", "#f28e2b"},
      {"all_gather", "#e15759"},  {"reduce_scatter", "#b07aa1"}, {"all_to_all", "#d4a017"},
      {"broadcast", "#9c755f"},   {"send", "#ff9da7"},           {"recv", "#e377c2"},
      {"barrier", "#bab0ac"},     {"params", "#4e79a7"},         {"grads", "#f28e2b"},
      {"activations", "#e15759"}, {"temporary", "#b07aa1"},      {"comm", "#f28e2b"},
      {"idle", "#eef1f4"},        {"exposed_comm", "#c0392b"},
  }};
  for (const auto& [k, c] : kKnown)
    if (k == kind) return c;
  static constexpr std::array<const char*, 8> kPalette{"#8cd17d", "#86bcb6", "#f1ce63", "#499894",
                                                       "#d37295", "#a0cbe8", "#ffbe7d", "#79706e"};
  std::uint32_t h = 2166136261u;  // FNV-1a: stable across runs and platforms
  for (unsigned char c : kind) h = (h ^ c) * 16777619u;
  return kPalette[h % kPalette.size()];
}

}  // namespace shardcheck::harness::html
