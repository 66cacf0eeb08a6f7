// index.html figures as inline SVG strings: the per-rank timeline (compute and comm rows, idle
// shaded, steps marked), memory bars per rank, scaling curves and the parity sparklines.
// Geometry only; the page, tables and escaping helpers are in html.cpp.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

#include "harness/html.hpp"

namespace shardcheck::harness::html {
namespace {

// A tick step of 1, 2 or 5 × 10^k that splits `span` into about `target` parts.
double nice_step(double span, int target) {
  if (!(span > 0) || !std::isfinite(span)) return 1;
  const double raw = span / target;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / p;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
}

std::string c(double v) {
  return fmt(v, "%.1f");
}  // an SVG coordinate

std::string svg_open(const std::string& id, const char* cls, double w, double h,
                     const std::string& label) {
  return "<div class=\"scroll\"><svg id=\"" + escape(id) + "\" class=\"" + cls + "\" width=\"" +
         c(w) + "\" height=\"" + c(h) + "\" viewBox=\"0 0 " + c(w) + " " + c(h) +
         "\" role=\"img\" aria-label=\"" + escape(label) + "\">\n";
}

std::string swatch(const std::string& colour, const std::string& label) {
  return "<span><span class=\"swatch\" style=\"background:" + colour + "\"></span>" +
         escape(label) + "</span>";
}

struct Event {
  int rank;
  int stream;  // 0 compute, 1 comm
  double start, end;
  std::size_t index;  // position in the report, the last tie-breaker
};

// Idle fraction of [t0, t1] not covered by the intervals (sorted by start).
double idle_fraction(const std::vector<const Event*>& evs, double t0, double t1) {
  double busy = 0, lo = 0, hi = -1;
  for (const Event* e : evs) {
    if (e->start > hi) {
      if (hi > lo) busy += hi - lo;
      lo = e->start;
      hi = e->end;
    } else {
      hi = std::max(hi, e->end);
    }
  }
  if (hi > lo) busy += hi - lo;
  return std::clamp(1.0 - busy / (t1 - t0), 0.0, 1.0);
}

}  // namespace

std::string timeline_svg(const Json& tl, const std::string& id) {
  constexpr int kMaxRanks = 64;
  constexpr std::size_t kMaxEvents = 20000;
  constexpr double kLeft = 64, kPlotW = 1000, kRight = 70, kTop = 24, kRow = 14, kGap = 7,
                   kLane = 2 * kRow + kGap, kAxis = 36;

  const Json* evs = array_of(tl, "events");
  // "tooltips": false (a report's one-step figure): no per-block details, which are in its trace.
  const Json* tips_field = field(tl, "tooltips");
  const bool tips = !(tips_field && tips_field->is_boolean() && !tips_field->get<bool>());
  std::vector<Event> events;
  std::size_t skipped = 0;
  double max_rank = -1;
  if (evs)
    for (std::size_t i = 0; i < evs->size(); ++i) {
      const Json& e = (*evs)[i];
      const double r = num(e, "rank", -1), s = num(e, "start", NAN), en = num(e, "end", NAN);
      // Virtual times beyond 1e9 s are nonsense; bounding them keeps the axis arithmetic finite.
      if (!(r >= 0 && r < 1e9 && r == std::floor(r) && std::fabs(s) < 1e9 && std::fabs(en) < 1e9 &&
            en >= s)) {
        ++skipped;
        continue;
      }
      max_rank = std::max(max_rank, r);
      events.push_back({static_cast<int>(r), str(e, "stream") == "comm" ? 1 : 0, s, en, i});
    }
  const double declared = num(tl, "ranks", 0);
  const double ranks = declared >= 1 && declared < 1e9 ? std::floor(declared) : max_rank + 1;
  if (ranks < 1) return "";
  const int shown = static_cast<int>(std::min<double>(ranks, kMaxRanks));
  std::erase_if(events, [&](const Event& e) { return e.rank >= shown; });
  const std::size_t in_shown = events.size();
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    if (a.start != b.start) return a.start < b.start;
    if (a.rank != b.rank) return a.rank < b.rank;
    if (a.stream != b.stream) return a.stream < b.stream;
    return a.index < b.index;
  });
  if (events.size() > kMaxEvents) events.resize(kMaxEvents);

  double t0 = 0, t1 = 0;
  for (const Event& e : events) {
    t0 = std::min(t0, e.start);
    t1 = std::max(t1, e.end);
  }
  if (!(t1 - t0 > 1e-9)) t1 = t0 + (events.empty() ? 1e-3 : 1e-9);
  const auto X = [&](double t) { return kLeft + (t - t0) / (t1 - t0) * kPlotW; };
  const double W = kLeft + kPlotW + kRight, H = kTop + shown * kLane + kAxis;
  const double bottom = kTop + shown * kLane - kGap;

  std::string o = svg_open(id, "timeline", W, H, "timeline of " + std::to_string(shown) + " ranks");
  // Grid and x axis in milliseconds.
  const double step_ms = nice_step((t1 - t0) * 1e3, 10);
  std::string axis;
  const double k0 = std::ceil(t0 * 1e3 / step_ms);
  for (double k = k0; k * step_ms <= t1 * 1e3 * (1 + 1e-9) && k < k0 + 100; k += 1) {
    const double x = X(k * step_ms / 1e3);
    o += "<line class=\"grid\" x1=\"" + c(x) + "\" x2=\"" + c(x) + "\" y1=\"" + c(kTop) +
         "\" y2=\"" + c(bottom) + "\"/>\n";
    axis += "<line class=\"axis\" x1=\"" + c(x) + "\" x2=\"" + c(x) + "\" y1=\"" + c(bottom) +
            "\" y2=\"" + c(bottom + 4) + "\"/><text x=\"" + c(x) + "\" y=\"" + c(bottom + 15) +
            "\" text-anchor=\"middle\">" + fmt(k * step_ms, "%.6g") + "</text>\n";
  }
  axis += "<line class=\"axis\" x1=\"" + c(kLeft) + "\" x2=\"" + c(kLeft + kPlotW) + "\" y1=\"" +
          c(bottom) + "\" y2=\"" + c(bottom) + "\"/><text x=\"" + c(kLeft + kPlotW / 2) +
          "\" y=\"" + c(bottom + 29) + "\" text-anchor=\"middle\">virtual time (ms)</text>\n";

  // Lanes: compute row above, comm row below; the shaded background is idle time.
  std::vector<std::vector<const Event*>> lanes(shown);
  for (const Event& e : events) lanes[e.rank].push_back(&e);
  std::map<std::string, std::string> legend;
  std::map<std::int64_t, double> step_start;
  for (int r = 0; r < shown; ++r) {
    const double y0 = kTop + r * kLane;
    std::vector<const Event*> rows[2];
    for (const Event* e : lanes[r]) rows[e->stream].push_back(e);
    const double idle_c = idle_fraction(rows[0], t0, t1), idle_m = idle_fraction(rows[1], t0, t1);
    // Lane r shows world rank lane_ranks[r] where the report picked the ranks (one per stage).
    const Json* picked = array_of(tl, "lane_ranks");
    const std::string rs =
        picked && static_cast<std::size_t>(r) < picked->size() &&
                (*picked)[static_cast<std::size_t>(r)].is_number_integer()
            ? std::to_string((*picked)[static_cast<std::size_t>(r)].get<long long>())
            : std::to_string(r);
    o += "<g class=\"lane\" data-rank=\"" + rs + "\"><title>rank " + rs + ": compute idle " +
         fmt(idle_c * 100, "%.1f") + " %, comm idle " + fmt(idle_m * 100, "%.1f") + " %</title>\n";
    o += "<text x=\"" + c(kLeft - 6) + "\" y=\"" + c(y0 + kRow + 3) +
         "\" text-anchor=\"end\">rank " + rs + "</text>";
    for (int s = 0; s < 2; ++s)
      o += "<rect class=\"idle\" x=\"" + c(kLeft) + "\" y=\"" + c(y0 + s * kRow) + "\" width=\"" +
           c(kPlotW) + "\" height=\"" + c(kRow - 1) + "\"/>";
    o += "<text class=\"muted\" x=\"" + c(kLeft + kPlotW + 6) + "\" y=\"" + c(y0 + kRow + 3) +
         "\">idle " + fmt(idle_c * 100, "%.0f") + "%</text>\n";
    for (const Event* e : lanes[r]) {
      const Json& src = (*evs)[e->index];
      const std::string kind = str(src, "kind"), name = str(src, "name");
      const std::string key = kind.empty() ? (name.empty() ? "event" : name) : kind;
      const std::string colour = colour_for(key);
      if (legend.size() < 32) legend.emplace(key, colour);
      if (has_num(src, "step") && std::fabs(num(src, "step")) < 1e15) {
        const auto st = static_cast<std::int64_t>(num(src, "step"));
        auto [it, fresh] = step_start.emplace(st, e->start);
        if (!fresh) it->second = std::min(it->second, e->start);
      }
      const double x = X(e->start), w = std::max(X(e->end) - x, 0.6), y = y0 + e->stream * kRow;
      std::string tip = "rank " + rs + " \xC2\xB7 " + (e->stream ? "comm" : "compute") +
                        " \xC2\xB7 " + key + (name.empty() || name == key ? "" : " " + name);
      for (const char* f : {"step", "group", "seq"})
        if (!str(src, f).empty() || (field(src, f) && field(src, f)->is_array()))
          tip += std::string(" \xC2\xB7 ") + f + " " + fmt_int_list(*field(src, f));
      if (has_num(src, "bytes")) tip += " \xC2\xB7 " + fmt_bytes(num(src, "bytes"));
      tip += "\n" + fmt(e->start * 1e3, "%.6g") + "\xE2\x80\x93" + fmt(e->end * 1e3, "%.6g") +
             " ms (" + fmt_seconds(e->end - e->start) + ")";
      o += "<rect x=\"" + c(x) + "\" y=\"" + c(y) + "\" width=\"" + c(w) + "\" height=\"" +
           c(kRow - 1) + "\" fill=\"" + colour +
           (tips ? "\"><title>" + escape(tip) + "</title></rect>" : "\"/>");
      // Label when it fits (about 5.6 px per character at 10 px).
      const std::string label = 5.6 * name.size() + 6 <= w  ? name
                                : 5.6 * key.size() + 6 <= w ? key
                                                            : "";
      if (!label.empty())
        o += "<text class=\"in\" x=\"" + c(x + 3) + "\" y=\"" + c(y + kRow - 4) + "\">" +
             escape(label) + "</text>";
      o += "\n";
    }
    o += "</g>\n";
  }
  for (const auto& [st, t] : step_start) {
    const double x = X(t);
    o += "<line class=\"step\" x1=\"" + c(x) + "\" x2=\"" + c(x) + "\" y1=\"" + c(kTop - 10) +
         "\" y2=\"" + c(bottom) + "\"/><text x=\"" + c(x + 3) + "\" y=\"" + c(kTop - 6) +
         "\">step " + std::to_string(st) + "</text>\n";
  }
  o += axis + "</svg></div>\n<div class=\"legend\">" + swatch("#eef1f4", "idle");
  for (const auto& [k, col] : legend) o += swatch(col, k);
  o += "</div>\n<p class=\"note\">Each lane is one rank: compute stream above, comm stream below; "
       "hover a block for its details. Idle % is the compute stream's.";
  if (ranks > shown)
    o += " Showing ranks 0\xE2\x80\x93" + std::to_string(shown - 1) + " of " + fmt(ranks, "%.0f") +
         ".";
  if (in_shown > events.size())
    o += " Showing the first " + std::to_string(events.size()) + " of " + std::to_string(in_shown) +
         " events (up to " + fmt(t1 * 1e3, "%.6g") + " ms).";
  if (skipped) o += " " + std::to_string(skipped) + " event(s) without rank/start/end skipped.";
  if (const std::string note = str(tl, "note"); !note.empty()) o += " " + escape(note);
  return o + "</p>\n";
}

std::string memory_svg(const Json& rows, const std::string& id) {
  constexpr std::size_t kMaxBars = 64;
  static constexpr const char* kCats[] = {"params", "grads", "optimizer", "activations",
                                          "temporary"};
  std::vector<const Json*> bars;
  for (const Json& r : rows)
    if (r.is_object() && bars.size() < kMaxBars) bars.push_back(&r);
  if (bars.empty()) return "<p class=\"note\">memory: not recorded</p>\n";
  double top = 0, max_peak = -1;
  std::size_t max_at = 0;
  for (std::size_t i = 0; i < bars.size(); ++i) {
    double sum = 0;
    for (const char* k : kCats) sum += std::max(0.0, num(*bars[i], k, 0));
    const double peak = num(*bars[i], "peak", 0);
    top = std::max({top, sum, std::isfinite(peak) ? peak : 0.0});
    if (std::isfinite(peak) && peak > max_peak) max_peak = peak, max_at = i;
  }
  if (!(top > 0) || !std::isfinite(top)) top = 1;
  // Y axis in the largest binary unit below the top value, ticks at nice steps of that unit.
  double unit = 1;
  while (unit * 1024 <= top && unit < 1024.0 * 1024 * 1024 * 1024) unit *= 1024;
  const double tick = nice_step(top / unit, 5) * unit;
  top = std::ceil(top / tick * (1 - 1e-12)) * tick;

  const double n = static_cast<double>(bars.size());
  const double slot = std::clamp(900.0 / n, 10.0, 56.0), bw = slot * 0.7;
  const double kLeft = 78, kTop = 18, kPlotH = 220;
  const double W = kLeft + n * slot + 16, H = kTop + kPlotH + 40;
  const auto Y = [&](double b) { return kTop + kPlotH - b / top * kPlotH; };
  std::string o = svg_open(id, "memory", W, H, "memory per rank");
  for (double v = 0; v <= top * (1 + 1e-9); v += tick)
    o += "<line class=\"grid\" x1=\"" + c(kLeft) + "\" x2=\"" + c(W - 8) + "\" y1=\"" + c(Y(v)) +
         "\" y2=\"" + c(Y(v)) + "\"/><text x=\"" + c(kLeft - 6) + "\" y=\"" + c(Y(v) + 3) +
         "\" text-anchor=\"end\">" + escape(fmt_bytes(v)) + "</text>\n";
  const std::size_t label_every = static_cast<std::size_t>(std::ceil(24.0 / slot));
  for (std::size_t i = 0; i < bars.size(); ++i) {
    const Json& r = *bars[i];
    const std::string rank = str(r, "rank").empty() ? std::to_string(i) : str(r, "rank");
    const double x = kLeft + i * slot + (slot - bw) / 2;
    o += "<g class=\"membar\" data-rank=\"" + escape(rank) + "\">";
    double acc = 0;
    for (const char* k : kCats) {
      const double v = std::max(0.0, num(r, k, 0));
      if (!(v > 0) || !std::isfinite(v)) continue;
      o += "<rect x=\"" + c(x) + "\" y=\"" + c(Y(acc + v)) + "\" width=\"" + c(bw) +
           "\" height=\"" + c(Y(acc) - Y(acc + v)) + "\" fill=\"" + colour_for(k) +
           "\"><title>rank " + escape(rank) + " " + k + ": " + fmt_bytes(v) + "</title></rect>";
      acc += v;
    }
    if (has_num(r, "peak") && std::isfinite(num(r, "peak"))) {
      const double py = Y(std::max(0.0, num(r, "peak")));
      const std::string phase = str(r, "peak_phase");
      o += "<line class=\"peak\" x1=\"" + c(x - 2) + "\" x2=\"" + c(x + bw + 2) + "\" y1=\"" +
           c(py) + "\" y2=\"" + c(py) + "\"><title>rank " + escape(rank) + " peak " +
           fmt_bytes(num(r, "peak")) + (phase.empty() ? "" : " during " + escape(phase)) +
           "</title></line>";
      if (i == max_at)
        o += "<text x=\"" + c(x + bw / 2) + "\" y=\"" + c(py - 4) +
             "\" text-anchor=\"middle\">max peak</text>";
    }
    if (i % label_every == 0)
      o += "<text x=\"" + c(x + bw / 2) + "\" y=\"" + c(kTop + kPlotH + 13) +
           "\" text-anchor=\"middle\">" + escape(rank) + "</text>";
    o += "</g>\n";
  }
  o += "<text x=\"" + c(kLeft + n * slot / 2) + "\" y=\"" + c(kTop + kPlotH + 30) +
       "\" text-anchor=\"middle\">rank</text></svg></div>\n<div class=\"legend\">";
  for (const char* k : kCats) o += swatch(colour_for(k), k);
  o += "<span><span class=\"swatch\" "
       "style=\"background:#1f2328;height:3px\"></span>peak</span></div>\n";
  if (rows.size() > bars.size())
    o += "<p class=\"note\">Showing the first " + std::to_string(bars.size()) + " of " +
         std::to_string(rows.size()) + " ranks.</p>\n";
  return o;
}

std::string phases_svg(const Json& rows, const std::string& id) {
  // The step partitioned: compute by phase, communication compute waited for, idle (bubble).
  static constexpr const char* kParts[] = {"forward",   "backward",     "recompute",
                                           "optimizer", "exposed_comm", "idle"};
  constexpr std::size_t kMaxBars = 64;
  std::vector<const Json*> bars;
  for (const Json& r : rows)
    if (r.is_object() && bars.size() < kMaxBars) bars.push_back(&r);
  if (bars.empty()) return "<p class=\"note\">phases: not recorded</p>\n";
  double top = 0;
  for (const Json* r : bars) {
    double sum = 0;
    for (const char* k : kParts) sum += std::max(0.0, num(*r, k, 0));
    if (std::isfinite(sum)) top = std::max(top, sum);
  }
  if (!(top > 0)) top = 1;
  constexpr double kLeft = 64, kPlotW = 700, kTop = 8, kBar = 12, kGap = 4;
  const double W = kLeft + kPlotW + 90, H = kTop + bars.size() * (kBar + kGap) + 30;
  const auto X = [&](double v) { return kLeft + v / top * kPlotW; };
  std::string o = svg_open(id, "phases", W, H, "step phases per rank");
  for (std::size_t i = 0; i < bars.size(); ++i) {
    const Json& r = *bars[i];
    const std::string rank = str(r, "rank").empty() ? std::to_string(i) : str(r, "rank");
    const double y = kTop + i * (kBar + kGap);
    o += "<g class=\"phasebar\" data-rank=\"" + escape(rank) + "\"><text x=\"" + c(kLeft - 6) +
         "\" y=\"" + c(y + kBar - 2) + "\" text-anchor=\"end\">rank " + escape(rank) + "</text>";
    double acc = 0;
    for (const char* k : kParts) {
      const double v = std::max(0.0, num(r, k, 0));
      if (!(v > 0) || !std::isfinite(v)) continue;
      o += "<rect x=\"" + c(X(acc)) + "\" y=\"" + c(y) + "\" width=\"" + c(X(acc + v) - X(acc)) +
           "\" height=\"" + c(kBar) + "\" fill=\"" + colour_for(k) + "\"><title>rank " +
           escape(rank) + " " + k + ": " + fmt_seconds(v) + " per step</title></rect>";
      acc += v;
    }
    o += "<text class=\"muted\" x=\"" + c(X(acc) + 4) + "\" y=\"" + c(y + kBar - 2) + "\">" +
         escape(fmt_seconds(acc)) + "</text></g>\n";
  }
  o += "</svg></div>\n<div class=\"legend\">";
  for (const char* k : kParts) o += swatch(colour_for(k), k);
  o += "</div>\n<p class=\"note\">Each rank's step (mean over steps): its compute by phase, the "
       "communication its compute stream waited for (exposed), and the time neither stream was "
       "busy (idle: on a pipeline, mostly its bubble).";
  if (rows.size() > bars.size())
    o += " Showing the first " + std::to_string(bars.size()) + " of " +
         std::to_string(rows.size()) + " ranks.";
  return o + "</p>\n";
}

std::string scaling_svg(const Json& scaling, const std::string& id) {
  struct Series {
    const char* name;
    const char* colour;
    std::vector<std::pair<double, double>> pts;
  };
  std::vector<Series> series{{"strong", "#4e79a7", {}}, {"weak", "#f28e2b", {}}};
  double xmin = INFINITY, xmax = 0, ymax = 1;
  for (Series& s : series)
    if (const Json* a = array_of(scaling, s.name))
      for (const Json& p : *a) {
        const double x = num(p, "world_size", NAN), y = num(p, "efficiency", NAN);
        if (!(x > 0) || !std::isfinite(x) || !std::isfinite(y)) continue;
        s.pts.emplace_back(x, y);
        xmin = std::min(xmin, x);
        xmax = std::max(xmax, x);
        ymax = std::max(ymax, y);
      }
  if (xmax <= 0) return "<p class=\"note\">scaling: not recorded</p>\n";
  const bool logx = xmax / xmin >= 4;
  const auto tx = [&](double v) { return logx ? std::log2(v) : v; };
  double lo = tx(xmin), hi = tx(xmax);
  if (hi <= lo) lo -= 1, hi += 1;
  ymax = std::min(ymax * 1.05, 10.0);
  constexpr double kLeft = 52, kTop = 14, kW = 480, kH = 220;
  const auto X = [&](double v) { return kLeft + (tx(v) - lo) / (hi - lo) * kW; };
  const auto Y = [&](double e) { return kTop + kH - std::clamp(e, 0.0, ymax) / ymax * kH; };
  std::string o = svg_open(id, "scaling", kLeft + kW + 20, kTop + kH + 40, "scaling efficiency");
  const double ys = nice_step(ymax, 8);
  for (double v = 0; v <= ymax * (1 + 1e-9); v += ys)
    o += "<line class=\"grid\" x1=\"" + c(kLeft) + "\" x2=\"" + c(kLeft + kW) + "\" y1=\"" +
         c(Y(v)) + "\" y2=\"" + c(Y(v)) + "\"/><text x=\"" + c(kLeft - 6) + "\" y=\"" +
         c(Y(v) + 3) + "\" text-anchor=\"end\">" + fmt(v * 100, "%.0f") + "%</text>\n";
  o += "<line class=\"tol\" x1=\"" + c(kLeft) + "\" x2=\"" + c(kLeft + kW) + "\" y1=\"" + c(Y(1)) +
       "\" y2=\"" + c(Y(1)) + "\"><title>ideal (100 %)</title></line>\n";
  std::vector<double> xt;  // x ticks: the world sizes themselves (deduplicated, capped)
  for (const Series& s : series)
    for (const auto& p : s.pts) xt.push_back(p.first);
  std::sort(xt.begin(), xt.end());
  xt.erase(std::unique(xt.begin(), xt.end()), xt.end());
  double last = -1e9;
  for (double v : xt)
    if (X(v) - last >= 28) {
      last = X(v);
      o += "<text x=\"" + c(X(v)) + "\" y=\"" + c(kTop + kH + 14) + "\" text-anchor=\"middle\">" +
           fmt(v, "%.0f") + "</text>";
    }
  o += "\n<line class=\"axis\" x1=\"" + c(kLeft) + "\" x2=\"" + c(kLeft + kW) + "\" y1=\"" +
       c(kTop + kH) + "\" y2=\"" + c(kTop + kH) + "\"/><text x=\"" + c(kLeft + kW / 2) + "\" y=\"" +
       c(kTop + kH + 30) + "\" text-anchor=\"middle\">world size (ranks" +
       (logx ? ", log scale" : "") + ")</text>\n";
  for (Series& s : series) {
    if (s.pts.empty()) continue;
    std::stable_sort(s.pts.begin(), s.pts.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::string pts;
    for (const auto& [x, y] : s.pts) pts += c(X(x)) + "," + c(Y(y)) + " ";
    o += "<polyline fill=\"none\" stroke-width=\"2\" stroke=\"" + std::string(s.colour) +
         "\" points=\"" + pts + "\"/>";
    for (const auto& [x, y] : s.pts)
      o += "<circle r=\"3.5\" cx=\"" + c(X(x)) + "\" cy=\"" + c(Y(y)) + "\" fill=\"" + s.colour +
           "\"><title>" + s.name + " scaling, " + fmt(x, "%.0f") +
           " ranks: " + fmt(y * 100, "%.1f") + " %</title></circle>";
    o += "\n";
  }
  return o + "</svg></div>\n<div class=\"legend\">" + swatch("#4e79a7", "strong scaling") +
         swatch("#f28e2b", "weak scaling") + "<span>dashed: ideal (100 %)</span></div>\n";
}

std::string error_sparkline(const Json& steps, double tol) {
  constexpr double kLo = -17, kBar = 7, kH = 26;
  constexpr std::size_t kMaxBars = 200;  // the per-step table below it has every step
  double hi = kLo + 4;
  for (const Json& s : steps)
    if (has_num(s, "max_rel_err") && num(s, "max_rel_err") > 0)
      hi = std::max(hi, std::ceil(std::log10(num(s, "max_rel_err"))));
  // Headroom above the tolerance, so errors far below it still show as bars of some height.
  if (std::isfinite(tol) && tol > 0) hi = std::max(hi, std::ceil(std::log10(tol)) + 2);
  hi = std::clamp(hi, kLo + 4, 300.0);
  const auto Y = [&](double e) {
    const double l =
        e > 0 && std::isfinite(e) ? std::clamp(std::log10(e), kLo, hi) : (e > 0 ? hi : kLo);
    return kH - 1 - (l - kLo) / (hi - kLo) * (kH - 3);
  };
  const std::size_t bars = std::min(steps.size(), kMaxBars);
  const double W = std::max(40.0, bars * (kBar + 2) + 2);
  std::string o = "<svg class=\"spark\" width=\"" + c(W) + "\" height=\"" + c(kH) +
                  "\" viewBox=\"0 0 " + c(W) + " " + c(kH) + "\">";
  double x = 1;
  for (std::size_t i = 0; i < bars; ++i) {
    const Json& s = steps[i];
    const double e = num(s, "max_rel_err", NAN);
    const bool bad = std::isnan(e) || (std::isfinite(tol) && e > tol);
    const double y = std::isnan(e) ? 1 : Y(e);
    o += "<rect x=\"" + c(x) + "\" y=\"" + c(y) + "\" width=\"" + c(kBar) + "\" height=\"" +
         c(kH - 1 - y) + "\" fill=\"" + (bad ? "#cf222e" : "#1a7f37") + "\"><title>step " +
         escape(str(s, "step")) + ": max rel. error " + fmt(e, "%.3e") + "</title></rect>";
    x += kBar + 2;
  }
  if (std::isfinite(tol) && tol > 0)
    o += "<line class=\"tol\" x1=\"0\" x2=\"" + c(W) + "\" y1=\"" + c(Y(tol)) + "\" y2=\"" +
         c(Y(tol)) + "\"><title>bound " + fmt(tol, "%.2e") + "</title></line>";
  return o + "</svg>";
}

namespace {

// A polyline through (X(i), Y(v_i)) of the finite values.
std::string polyline(const std::vector<double>& xs, const std::vector<double>& ys,
                     const std::string& colour, const std::string& extra = "") {
  std::string pts;
  for (std::size_t i = 0; i < xs.size() && i < ys.size(); ++i)
    if (std::isfinite(xs[i]) && std::isfinite(ys[i])) pts += c(xs[i]) + "," + c(ys[i]) + " ";
  return "<polyline fill=\"none\" stroke=\"" + colour + "\" stroke-width=\"1.5\" " + extra +
         "points=\"" + pts + "\"/>";
}

}  // namespace

std::string loss_svg(const Json& steps, const std::string& id) {
  constexpr std::size_t kMaxSteps = 500;
  std::vector<double> step, loss, ref, err, bound;
  for (const Json& s : steps) {
    if (!s.is_object() || step.size() >= kMaxSteps) continue;
    step.push_back(num(s, "step", NAN));
    loss.push_back(num(s, "loss", NAN));
    ref.push_back(num(s, "ref_loss", NAN));
    err.push_back(num(s, "max_rel_err", NAN));
    bound.push_back(num(s, "bound", NAN));
  }
  if (step.empty()) return "";
  double lo = INFINITY, hi = -INFINITY, elo = INFINITY, ehi = -INFINITY;
  for (std::size_t i = 0; i < step.size(); ++i) {
    for (double v : {loss[i], ref[i]})
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
    for (double v : {err[i], bound[i]})
      if (std::isfinite(v) && v > 0) elo = std::min(elo, v), ehi = std::max(ehi, v);
  }
  if (!(hi >= lo)) lo = 0, hi = 1;
  if (hi - lo < 1e-12 * std::max(1.0, std::fabs(hi))) lo -= 0.5, hi += 0.5;
  if (!(ehi >= elo)) elo = 1e-16, ehi = 1;
  elo = std::floor(std::log10(elo)), ehi = std::max(std::ceil(std::log10(ehi)), elo + 1);
  constexpr double kLeft = 56, kW = 300, kH = 110, kTop = 10, kGap = 90;
  const double W = kLeft + kW + kGap + kW + 16, H = kTop + kH + 34;
  const double s0 = step.front(), s1 = std::max(step.back(), s0 + 1);
  const auto X = [&](double x0, double s) { return x0 + (s - s0) / (s1 - s0) * kW; };
  const auto YL = [&](double v) { return kTop + kH - (v - lo) / (hi - lo) * kH; };
  const auto YE = [&](double v) -> double {
    if (!(v > 0) || !std::isfinite(v)) return NAN;
    return kTop + kH - (std::clamp(std::log10(v), elo, ehi) - elo) / (ehi - elo) * kH;
  };
  std::string o = svg_open(id, "loss", W, H, "loss and error per step");
  const double x2 = kLeft + kW + kGap;
  for (double x0 : {kLeft, x2})
    o += "<rect class=\"frame\" x=\"" + c(x0) + "\" y=\"" + c(kTop) + "\" width=\"" + c(kW) +
         "\" height=\"" + c(kH) + "\" fill=\"none\" stroke=\"#d0d7de\"/>";
  std::vector<double> xs1, xs2, yl, yr, ye, yb;
  for (std::size_t i = 0; i < step.size(); ++i) {
    xs1.push_back(X(kLeft, step[i]));
    xs2.push_back(X(x2, step[i]));
    yl.push_back(YL(loss[i]));
    yr.push_back(YL(ref[i]));
    ye.push_back(YE(err[i]));
    yb.push_back(YE(bound[i]));
  }
  o += polyline(xs1, yr, "#8c959f", "stroke-dasharray=\"5 3\" class=\"ref\" ");
  o += polyline(xs1, yl, "#0969da", "class=\"run\" ");
  o += polyline(xs2, yb, "#cf222e", "stroke-dasharray=\"5 3\" class=\"bound\" ");
  o += polyline(xs2, ye, "#1a7f37", "class=\"err\" ");
  const auto label = [&](double x, double y, const std::string& t, const char* anchor) {
    return "<text x=\"" + c(x) + "\" y=\"" + c(y) + "\" text-anchor=\"" + anchor + "\">" +
           escape(t) + "</text>";
  };
  o += label(kLeft - 4, kTop + 8, fmt(hi, "%.6g"), "end");
  o += label(kLeft - 4, kTop + kH, fmt(lo, "%.6g"), "end");
  o += label(x2 - 4, kTop + 8, "1e" + fmt(ehi, "%.0f"), "end");
  o += label(x2 - 4, kTop + kH, "1e" + fmt(elo, "%.0f"), "end");
  for (double x0 : {kLeft, x2}) {
    o += label(x0, kTop + kH + 14, "step " + fmt(s0, "%.0f"), "start");
    o += label(x0 + kW, kTop + kH + 14, "step " + fmt(step.back(), "%.0f"), "end");
  }
  o +=
      label(kLeft + kW / 2, kTop + kH + 28, "loss: run (blue), reference (grey, dashed)", "middle");
  o += label(x2 + kW / 2, kTop + kH + 28, "max rel. error (green), bound (red, dashed), log",
             "middle");
  return o + "</svg></div>\n";
}

std::string memory_step_svg(const Json& m, const std::string& id) {
  const Json* b = field(m, "buckets");
  if (!b || !b->is_array() || b->empty()) return "";
  std::vector<double> v;
  for (const Json& x : *b) v.push_back(x.is_number() ? x.get<double>() : NAN);
  double top = 0;
  for (double x : v)
    if (std::isfinite(x)) top = std::max(top, x);
  if (!(top > 0)) top = 1;
  constexpr double kLeft = 64, kW = 700, kH = 80, kTop = 8;
  const double W = kLeft + kW + 16, H = kTop + kH + 30, dx = kW / static_cast<double>(v.size());
  std::string o = svg_open(id, "memstep", W, H, "memory over the step");
  o += "<rect x=\"" + c(kLeft) + "\" y=\"" + c(kTop) + "\" width=\"" + c(kW) + "\" height=\"" +
       c(kH) + "\" fill=\"none\" stroke=\"#d0d7de\"/>";
  std::string path;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) continue;
    const double y = kTop + kH - v[i] / top * kH;
    path +=
        (path.empty() ? "M" : "L") + c(kLeft + i * dx) + "," + c(y) + "H" + c(kLeft + (i + 1) * dx);
  }
  o += "<path fill=\"none\" stroke=\"" + colour_for("activations") +
       "\" stroke-width=\"1.5\" d=\"" + path + "\"><title>rank " + escape(str(m, "rank")) +
       ", peak " + escape(fmt_bytes(num(m, "peak", 0))) + "</title></path>";
  o += "<text x=\"" + c(kLeft - 4) + "\" y=\"" + c(kTop + 8) + "\" text-anchor=\"end\">" +
       escape(fmt_bytes(top)) + "</text><text x=\"" + c(kLeft - 4) + "\" y=\"" + c(kTop + kH) +
       "\" text-anchor=\"end\">0</text>";
  o += "<text x=\"" + c(kLeft) + "\" y=\"" + c(kTop + kH + 14) + "\">0</text><text x=\"" +
       c(kLeft + kW) + "\" y=\"" + c(kTop + kH + 14) + "\" text-anchor=\"end\">" +
       escape(fmt_seconds(num(m, "span_s", 0))) + "</text>";
  o += "<text x=\"" + c(kLeft + kW / 2) + "\" y=\"" + c(kTop + kH + 28) +
       "\" text-anchor=\"middle\">tracked memory of rank " + escape(str(m, "rank")) +
       " over step " + escape(str(m, "step")) + " (the most held in each 1/" +
       std::to_string(v.size()) + " of it)</text>";
  return o + "</svg></div>\n";
}

}  // namespace shardcheck::harness::html
