// Chrome Trace Event Format files and the one-step timeline of index.html (trace.hpp).
#include "harness/trace.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <vector>

#include "comm/mesh.hpp"
#include "sim/recorder.hpp"

namespace shardcheck::harness {
namespace {

// Letters, digits, '-' and '_' as they are; anything else '_' (no separators, no "..").
std::string file_safe(const std::string& s) {
  std::string o;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_';
    o += ok ? c : '_';
  }
  return o.empty() ? "_" : o;
}

bool is_p2p(const std::string& kind) {
  return kind == "send" || kind == "recv";
}

// The trace's threads: 0 compute, 1 collectives (each runs after the last on the comm stream),
// 2.. point-to-point: sends and receives in flight at once (a stage receives from one neighbour
// while it sends to the other) go on lanes of their own, so no two events of a thread overlap.
// trace_tids[i] is the thread of timeline event i; p2p_lanes[rank] how many p2p threads it has.
struct TraceThreads {
  std::vector<int> tid;
  std::map<int, int> p2p_lanes;
};
TraceThreads trace_threads(const std::vector<sim::TimelineEvent>& timeline) {
  TraceThreads t;
  t.tid.assign(timeline.size(), 0);
  std::vector<std::size_t> p2p;
  for (std::size_t i = 0; i < timeline.size(); ++i) {
    const sim::TimelineEvent& e = timeline[i];
    if (e.stream == sim::Stream::compute) continue;
    if (is_p2p(e.kind))
      p2p.push_back(i);
    else
      t.tid[i] = 1;
  }
  std::stable_sort(p2p.begin(), p2p.end(), [&](std::size_t a, std::size_t b) {
    if (timeline[a].rank != timeline[b].rank) return timeline[a].rank < timeline[b].rank;
    return timeline[a].start < timeline[b].start;
  });
  std::map<int, std::vector<double>> lane_end;  // per rank: where each lane is free again
  for (const std::size_t i : p2p) {
    std::vector<double>& ends = lane_end[timeline[i].rank];
    std::size_t lane = 0;
    while (lane < ends.size() && ends[lane] > timeline[i].start) ++lane;
    if (lane == ends.size()) ends.push_back(0);
    ends[lane] = timeline[i].end;
    t.tid[i] = 2 + static_cast<int>(lane);
  }
  for (const auto& [rank, ends] : lane_end) t.p2p_lanes[rank] = static_cast<int>(ends.size());
  return t;
}

constexpr const char* kCategories[] = {"compute", "collective", "p2p"};

// Memory over one step of the shown rank that holds the most in it: the step's span [t0, t1] in
// kBuckets equal parts, each the highest total held in it (the value carried from the last change
// where nothing changes). Null without samples.
nlohmann::json step_memory(const ConfigResult& c, const std::vector<int>& shown, int step,
                           double t0, double t1) {
  constexpr int kBuckets = 100;
  if (!(t1 > t0)) return nullptr;
  int best = -1;
  std::size_t best_peak = 0;
  for (int r : shown) {
    if (r < 0 || static_cast<std::size_t>(r) >= c.memory_series.size()) continue;
    for (const comm::MemorySample& m : c.memory_series[static_cast<std::size_t>(r)])
      if (m.step == step && (best < 0 || m.bytes > best_peak)) {
        best = r;
        best_peak = m.bytes;
      }
  }
  if (best < 0) return nullptr;
  const std::vector<comm::MemorySample>& s = c.memory_series[static_cast<std::size_t>(best)];
  std::size_t held = 0;  // what the rank holds: at first the last value before the step
  for (const comm::MemorySample& m : s)
    if (m.step < step) held = m.bytes;
  std::vector<std::size_t> bucket(kBuckets, 0);
  int at = 0;  // the bucket reached; each new one starts with what is held (the clock only grows)
  bucket[0] = held;
  for (const comm::MemorySample& m : s) {
    if (m.step != step) continue;
    const int b = std::clamp(static_cast<int>((m.t - t0) / (t1 - t0) * kBuckets), 0, kBuckets - 1);
    while (at < b) bucket[static_cast<std::size_t>(++at)] = held;
    bucket[static_cast<std::size_t>(b)] = std::max(bucket[static_cast<std::size_t>(b)], m.bytes);
    held = m.bytes;
  }
  while (at + 1 < kBuckets) bucket[static_cast<std::size_t>(++at)] = held;
  return {{"rank", best},
          {"peak", best_peak},
          {"step", step},
          {"span_s", t1 - t0},
          {"buckets", bucket}};
}

// Trace times are microseconds at whole nanoseconds: Perfetto's JSON importer reads a number's
// fraction digits into an int64 (more than about 18 overflow it) and keeps ns. Start and end are
// rounded, and a duration is the difference of the two, so events that do not overlap on the
// virtual clock do not overlap in the file either.
int64_t ns(double seconds) {
  return std::llround(seconds * 1e9);
}
double us(double seconds) {
  return static_cast<double>(ns(seconds)) / 1e3;
}
double us_between(double start, double end) {
  return static_cast<double>(std::max<int64_t>(0, ns(end) - ns(start))) / 1e3;
}

}  // namespace

std::string trace_file(const std::string& scenario, std::size_t index, const std::string& config) {
  char n[24];
  std::snprintf(n, sizeof n, "%02zu-", index);
  return "traces/" + file_safe(scenario) + "/" + n + file_safe(config) + ".json";
}

nlohmann::json chrome_trace(const ConfigResult& c, const std::string& scenario, int steps) {
  nlohmann::json ev = nlohmann::json::array();
  const int world = c.spec.mesh.world_size();
  const TraceThreads threads = trace_threads(c.timeline);
  std::optional<comm::DeviceMesh> mesh;
  try {
    mesh.emplace(c.spec.mesh, c.spec.order);
  } catch (const comm::MeshError&) {
  }
  for (int r = 0; r < world; ++r) {
    std::string name = "rank " + std::to_string(r);
    nlohmann::json coords = nlohmann::json::object();
    if (mesh) {
      std::string at;
      for (comm::Axis a : comm::kAllAxes) {
        if (mesh->size(a) == 1) continue;
        const int k = mesh->coord(r, a);
        coords[std::string(comm::name_of(a))] = k;
        at += (at.empty() ? "" : ", ") + std::string(comm::name_of(a)) + " " + std::to_string(k);
      }
      if (!at.empty()) name += " (" + at + ")";
    }
    ev.push_back({{"name", "process_name"},
                  {"ph", "M"},
                  {"pid", r},
                  {"tid", 0},
                  {"args", {{"name", name}}}});
    ev.push_back({{"name", "process_sort_index"},
                  {"ph", "M"},
                  {"pid", r},
                  {"tid", 0},
                  {"args", {{"sort_index", r}}}});
    ev.push_back({{"name", "process_labels"},
                  {"ph", "M"},
                  {"pid", r},
                  {"tid", 0},
                  {"args", {{"labels", coords.dump()}}}});
    const int lanes = std::max(1, threads.p2p_lanes.count(r) ? threads.p2p_lanes.at(r) : 0);
    for (int t = 0; t < 2 + lanes; ++t)
      ev.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", r},
                    {"tid", t},
                    {"args",
                     {{"name", t == 0   ? std::string("compute")
                               : t == 1 ? std::string("collectives (comm stream)")
                                        : "p2p (comm stream)" +
                                              (t > 2 ? " " + std::to_string(t - 1) : "")}}}});
  }
  // Each rank's step starts: its first event of the step.
  std::map<std::pair<int, int>, double> step_start;  // (rank, step)
  std::map<int, double> rank_end;
  for (std::size_t i = 0; i < c.timeline.size(); ++i) {
    const sim::TimelineEvent& e = c.timeline[i];
    const int tid = threads.tid[i], t = std::min(tid, 2);  // t: the category
    nlohmann::json args = {{"step", e.step}, {"stream", std::string(sim::name_of(e.stream))}};
    if (mesh) args["stage"] = mesh->coord(e.rank, comm::Axis::pp);
    if (e.scope.pass != comm::WorkScope::Pass::none) {
      args["pass"] = e.scope.pass == comm::WorkScope::Pass::forward ? "forward" : "backward";
      args["microbatch"] = e.scope.microbatch;
      args["chunk"] = e.scope.chunk;
    }
    if (t == 0) {
      args["bytes_moved"] = e.bytes;
    } else {
      args["op"] = e.kind;
      args["group"] = e.group;
      args["seq"] = e.seq;
      args["bytes"] = e.bytes;
      args["state"] = "completed";
    }
    ev.push_back({{"name", t == 0 ? e.name : e.kind},
                  {"cat", kCategories[t]},
                  {"ph", "X"},
                  {"ts", us(e.start)},
                  {"dur", us_between(e.start, e.end)},
                  {"pid", e.rank},
                  {"tid", tid},
                  {"args", args}});
    if (e.step >= 1) {
      auto [it, fresh] = step_start.try_emplace({e.rank, e.step}, e.start);
      if (!fresh) it->second = std::min(it->second, e.start);
    }
    rank_end[e.rank] = std::max(rank_end[e.rank], e.end);
  }
  for (const auto& [key, t] : step_start)
    ev.push_back({{"name", key.second > steps ? std::string("after the last step: the harness "
                                                            "gathers every rank's parameters")
                                              : "step " + std::to_string(key.second)},
                  {"cat", "step"},
                  {"ph", "i"},
                  {"s", "p"},
                  {"ts", us(t)},
                  {"pid", key.first},
                  {"tid", 0},
                  {"args", {{"step", key.second}}}});
  // Memory per rank as a counter track: the tracked total after each allocate and release; where
  // several change it at one instant, the highest value and then the last.
  for (std::size_t r = 0; r < c.memory_series.size(); ++r) {
    const std::vector<comm::MemorySample>& s = c.memory_series[r];
    std::size_t shown = std::numeric_limits<std::size_t>::max();  // the value drawn last
    const auto counter = [&](double t, std::size_t bytes, int step) {
      if (bytes == shown) return;
      shown = bytes;
      ev.push_back({{"name", "memory"},
                    {"cat", "memory"},
                    {"ph", "C"},
                    {"ts", us(t)},
                    {"pid", static_cast<int>(r)},
                    {"tid", 0},
                    {"args", {{"bytes", bytes}, {"step", step}}}});
    };
    for (std::size_t i = 0; i < s.size();) {
      std::size_t j = i, hi = s[i].bytes;
      while (j + 1 < s.size() && s[j + 1].t == s[i].t) hi = std::max(hi, s[++j].bytes);
      counter(s[i].t, hi, s[i].step);
      counter(s[i].t, s[j].bytes, s[j].step);
      i = j + 1;
    }
  }
  double last = 0;
  for (const auto& [r, t] : rank_end) last = std::max(last, t);
  for (const FaultResult& f : c.faults) {
    const nlohmann::json args = {
        {"kind", f.kind}, {"op", f.op},       {"group", f.group},     {"seq", f.seq},
        {"step", f.step}, {"ranks", f.ranks}, {"message", f.message}, {"detected", f.detected}};
    const std::vector<int> at = f.ranks.empty() ? std::vector<int>{0} : f.ranks;
    for (int r : at)  // where the rank stopped: its last event's end
      ev.push_back({{"name", "fault: " + f.kind},
                    {"cat", "fault"},
                    {"ph", "i"},
                    {"s", f.ranks.empty() ? "g" : "p"},
                    {"ts", us(rank_end.count(r) ? rank_end[r] : last)},
                    {"pid", r},
                    {"tid", 0},
                    {"args", args}});
    for (std::size_t r = 0; r < f.flight_records.size(); ++r)
      for (const sim::FlightRecord& fr : f.flight_records[r]) {
        if (fr.state == sim::OpState::completed) continue;
        ev.push_back({{"name", fr.op + " (" + std::string(sim::name_of(fr.state)) + ")"},
                      {"cat", "flight recorder"},
                      {"ph", "i"},
                      {"s", "t"},
                      {"ts", us(fr.v_issued)},
                      {"pid", static_cast<int>(r)},
                      {"tid", 1},
                      {"args",
                       {{"op", fr.op},
                        {"group", fr.group},
                        {"seq", fr.seq},
                        {"state", std::string(sim::name_of(fr.state))},
                        {"dtype", std::string(comm::name_of(fr.dtype))},
                        {"count", fr.count},
                        {"step", fr.step}}}});
      }
  }
  return {{"traceEvents", ev},
          {"displayTimeUnit", "ms"},
          {"otherData",
           {{"scenario", scenario},
            {"config", c.config},
            {"world_size", world},
            {"clock", "virtual (the simulator's cost model over the scenario's topology)"}}}};
}

nlohmann::json step_timeline(const ConfigResult& c, const std::string& trace, int steps,
                             int max_ranks, std::size_t max_events) {
  if (c.timeline.empty()) return nullptr;
  int step = 0;
  for (const sim::TimelineEvent& e : c.timeline)
    if (e.step <= steps) step = std::max(step, e.step);
  // The ranks shown: one per pipeline stage (the ranks of one TP / DP / CP / EP group do alike
  // work; stages do not), else the first two.
  std::vector<int> shown;
  try {
    const comm::DeviceMesh mesh(c.spec.mesh, c.spec.order);
    shown = c.spec.mesh.pp > 1 ? mesh.group(0, comm::Axis::pp) : std::vector<int>{0};
  } catch (const comm::MeshError&) {
    shown = {0};
  }
  if (shown.size() == 1 && c.spec.mesh.world_size() > 1) shown.push_back(1);
  if (shown.size() > static_cast<std::size_t>(max_ranks))
    shown.resize(static_cast<std::size_t>(max_ranks));
  std::map<int, int> lane_of;
  for (std::size_t i = 0; i < shown.size(); ++i) lane_of[shown[i]] = static_cast<int>(i);
  std::vector<const sim::TimelineEvent*> pick;
  double t0 = std::numeric_limits<double>::infinity(), t1 = -t0;
  for (const sim::TimelineEvent& e : c.timeline)
    if (e.step == step && lane_of.count(e.rank)) {
      pick.push_back(&e);
      t0 = std::min(t0, e.start);
      t1 = std::max(t1, e.end);
    }
  std::stable_sort(pick.begin(), pick.end(), [](const auto* a, const auto* b) {
    if (a->rank != b->rank) return a->rank < b->rank;
    if (a->stream != b->stream) return a->stream < b->stream;
    return a->start < b->start;
  });
  struct Block {
    const sim::TimelineEvent* first;
    double start, end;
    std::size_t bytes;
    int merged;
  };
  // Two pixels of the 1000-pixel figure: merged blocks still show every idle gap one can see.
  const double gap = (t1 - t0) / 500;
  std::vector<Block> blocks;
  for (const sim::TimelineEvent* e : pick) {
    if (!blocks.empty()) {
      Block& b = blocks.back();
      if (b.first->rank == e->rank && b.first->stream == e->stream && b.first->kind == e->kind &&
          e->start - b.end <= gap) {
        b.end = std::max(b.end, e->end);
        b.bytes += e->bytes;
        ++b.merged;
        continue;
      }
    }
    blocks.push_back({e, e->start, e->end, e->bytes, 1});
  }
  const std::size_t all_blocks = blocks.size();
  if (blocks.size() > max_events) {  // the earliest, over every lane
    std::stable_sort(blocks.begin(), blocks.end(),
                     [](const Block& a, const Block& b) { return a.start < b.start; });
    blocks.resize(max_events);
  }
  nlohmann::json events = nlohmann::json::array();
  for (const Block& b : blocks) {
    nlohmann::json e = {
        {"rank", lane_of.at(b.first->rank)},
        {"stream", std::string(sim::name_of(b.first->stream))},
        {"kind", b.first->kind},
        {"name",
         b.merged > 1 ? b.first->kind + " \xC3\x97" + std::to_string(b.merged) : b.first->name},
        {"step", step},
        {"start", b.start},
        {"end", b.end},
        {"bytes", b.bytes}};
    if (b.first->stream == sim::Stream::comm && b.merged == 1) {
      e["group"] = b.first->group;
      e["seq"] = b.first->seq;
    }
    events.push_back(e);
  }
  std::string note = "Step " + std::to_string(step) + " only, " +
                     (c.spec.mesh.pp > 1 ? "one rank per pipeline stage" : "two ranks") + ": " +
                     std::to_string(pick.size()) +
                     " events, neighbours of one kind closer than two pixels drawn as one block";
  if (all_blocks > blocks.size())
    note += ", the first " + std::to_string(blocks.size()) + " of " + std::to_string(all_blocks) +
            " blocks";
  note += ". The whole run of every rank: " + trace + " (Perfetto, chrome://tracing).";
  nlohmann::json out = {{"ranks", static_cast<int>(shown.size())},
                        {"lane_ranks", shown},
                        {"tooltips", false},
                        {"events", events},
                        {"note", note}};
  if (nlohmann::json m = step_memory(c, shown, step, t0, t1); !m.is_null()) out["memory"] = m;
  return out;
}

}  // namespace shardcheck::harness
