// report.json, JUnit XML and the summary table for scenario runs.
#include "harness/report.hpp"

#include <algorithm>
#include <array>
#include <cmath>

#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "comm/mesh.hpp"
#include "comm/text.hpp"
#include "harness/build_info.hpp"
#include "harness/moe_load.hpp"
#include "harness/output.hpp"
#include "harness/provenance.hpp"
#include "harness/trace.hpp"
#include "sim/recorder.hpp"
#include "sim/topology.hpp"

namespace shardcheck::harness {

namespace {

nlohmann::json mesh_json(const ParallelSpec& p) {
  return {{"dp", p.mesh.dp},
          {"tp", p.mesh.tp},
          {"pp", p.mesh.pp},
          {"cp", p.mesh.cp},
          {"ep", p.mesh.ep},
          {"order", p.order},
          {"zero", p.zero_given()},
          {"fsdp", p.fsdp() ? nlohmann::json(std::string(parallel::name_of(p.fsdp()->sharding)))
                            : nlohmann::json(nullptr)}};
}

// DESIGN.md's memory rows: params .. temporary are the breakdown at the rank's peak.
nlohmann::json memory_json(const std::vector<RankMemory>& ranks) {
  nlohmann::json rows = nlohmann::json::array();
  for (const RankMemory& m : ranks) {
    nlohmann::json row{{"rank", m.rank}};
    for (std::size_t i = 0; i < comm::kMemCategories; ++i)
      row[std::string(comm::name_of(static_cast<comm::MemCategory>(i)))] = m.at_peak.bytes[i];
    row["peak"] = m.peak;
    row["peak_phase"] = m.peak_phase;
    row["resident"] = m.resident.total();
    rows.push_back(row);
  }
  return rows;
}

nlohmann::json flight_json(const std::vector<std::vector<sim::FlightRecord>>& ranks) {
  nlohmann::json out = nlohmann::json::array();
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    nlohmann::json recs = nlohmann::json::array();
    for (const sim::FlightRecord& f : ranks[r])
      recs.push_back({{"seq", f.seq},
                      {"group", f.group},
                      {"op", f.op},
                      {"dtype", std::string(comm::name_of(f.dtype))},
                      {"count", f.count},
                      {"root", f.root},
                      {"state", std::string(sim::name_of(f.state))},
                      {"step", f.step},
                      {"start", f.v_start},
                      {"end", f.v_end}});
    out.push_back({{"rank", r}, {"records", recs}});
  }
  return out;
}

nlohmann::json faults_json(const std::vector<FaultResult>& faults) {
  nlohmann::json out = nlohmann::json::array();
  for (const FaultResult& f : faults)
    out.push_back({{"kind", f.kind},
                   {"detected", f.detected},
                   {"ranks", f.ranks},
                   {"op", f.op},
                   {"group", f.group},
                   {"seq", f.seq},
                   {"step", f.step},
                   {"message", f.message},
                   {"phase", f.phase},
                   {"flight_records", flight_json(f.flight_records)}});
  return out;
}

}  // namespace

nlohmann::json goodput_json(const GoodputResult& g) {
  if (!g.valid) return nullptr;
  return {{"tokens_processed", g.tokens_processed},
          {"tokens_skipped", g.tokens_skipped},
          {"tokens_replayed", g.tokens_replayed},
          {"tokens_discarded", g.tokens_discarded},
          {"tokens_good", g.tokens_good},
          {"fraction", g.fraction},
          {"seconds", g.seconds},
          {"tokens_per_s", g.tokens_per_s},
          {"good_tokens_per_s", g.good_tokens_per_s}};
}

namespace {

// Per phase: p50 / p95 / max over ranks of its seconds per step, and the rank with the most.
nlohmann::json phases_json(const StepPhases& ph) {
  if (!ph.valid) return nullptr;
  nlohmann::json j = nlohmann::json::object();
  for (int p = 0; p < kPhases; ++p) {
    const PhaseStats& s = ph.stats[static_cast<std::size_t>(p)];
    j[phase_key(static_cast<Phase>(p))] = {
        {"p50", s.p50}, {"p95", s.p95}, {"max", s.max}, {"slowest_rank", s.slowest_rank}};
  }
  return j;
}

double bubble_of(const ConfigResult& c) {
  if (!c.pipeline) return 0.0;
  return c.pipeline->schedule_bubble >= 0 ? c.pipeline->schedule_bubble : c.pipeline->measured;
}

nlohmann::json pipeline_json(const std::optional<PipelineResult>& p) {
  if (!p) return nullptr;
  return {{"schedule", p->schedule},
          {"stages", p->stages},
          {"virtual_stages", p->virtual_stages},
          {"microbatches", p->microbatches},
          {"bubble_formula", p->formula},
          // the schedule's own bubble (the run replayed with free links), and what the compute
          // stream idled beyond it as the run went (waiting on p2p and collectives)
          {"bubble_schedule",
           p->schedule_bubble >= 0 ? nlohmann::json(p->schedule_bubble) : nlohmann::json(nullptr)},
          {"bubble_measured", p->measured},
          {"exposed_comm_wait", p->schedule_bubble >= 0
                                    ? nlohmann::json(p->measured - p->schedule_bubble)
                                    : nlohmann::json(nullptr)},
          {"stage_bubble", p->stage_bubble}};
}

// bubble: the pipeline's bubble (pp > 1: the schedule's, else as measured on the run), else 0.
nlohmann::json timing_json(const TimingResult& t, bool wall, double bubble = 0.0) {
  if (!t.valid) return nullptr;
  nlohmann::json j{{"step_time_s", t.step_time_s},
                   {"rank_step_time_s", {{"p50", t.p50}, {"p95", t.p95}, {"max", t.max}}},
                   {"slowest_rank", t.slowest_rank},
                   {"tokens_per_step", t.tokens_per_step},
                   {"tokens_per_s", t.tokens_per_s},
                   {"flops_per_step", t.flops_per_step},
                   {"mfu", t.mfu},
                   {"mfu_formula",
                    "3 x forward FLOPs (matmuls + attention products, backward = 2 x forward) over "
                    "every position of the global batch, recomputation not counted, / (step time "
                    "x ranks x device peak)"},
                   {"bubble_fraction", bubble},
                   {"time", wall ? "wall (measured on each rank: its step() from batch to "
                                   "updated parameters)"
                                 : "virtual (simulator cost model over the scenario's topology)"}};
  if (t.scaling_efficiency >= 0) {
    j["scaling_efficiency"] = t.scaling_efficiency;
    j["scaling_baseline"] = t.scaling_baseline;
  } else {
    j["scaling_efficiency"] = nullptr;
  }
  return j;
}

}  // namespace

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
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
        o += "&apos;";
        break;
      default:
        // XML 1.0 has no other control characters than tab and newlines.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r')
          o += ' ';
        else
          o += c;
    }
  }
  return o;
}

nlohmann::json manifest_json(const Scenario& s, const std::string& run_id) {
  const auto per_rank = [&](int n) { return n / s.parallel.mesh.dp; };
  return {{"run_id", run_id.empty() ? nlohmann::json(nullptr) : nlohmann::json(run_id)},
          {"scenario", s.name},
          {"mesh", mesh_json(s.parallel)},
          {"world_size", s.parallel.mesh.world_size()},
          {"order", comm::DeviceMesh(s.parallel.mesh, s.parallel.order).order_string()},
          {"groups", groups_json(s.parallel)},
          {"configs",
           [&] {
             nlohmann::json c = nlohmann::json::array();
             for (const ParallelSpec& p : s.configs)
               c.push_back({{"config", p.label()},
                            {"world_size", p.mesh.world_size()},
                            {"mesh", mesh_json(p)},
                            {"groups", groups_json(p)}});
             return c;
           }()},
          {"seed", s.seed},
          {"precision", ref::to_string(s.train.precision)},
          {"global_batch_sequences", s.train.global_batch},
          {"micro_batch_sequences", s.train.micro_batch},
          {"sequences_per_dp_rank", per_rank(s.train.global_batch)},
          {"seq_len", s.model.seq_len},
          {"steps", s.train.steps},
          {"model", model_manifest(s)},
          {"data", data_manifest(s, ref::build_dataset(s.data, s.model, s.seed))},
          {"checkpoint", checkpoint_policy(s)},
          {"code_version", code_version()},
          {"code_commit", code_commit()}};
}

// The noise probe the bounds come from (parity_bound.hpp): per step, its error of each measure.
nlohmann::json noise_json(const NoiseFloor& n) {
  nlohmann::json steps = nlohmann::json::array();
  for (std::size_t k = 0; k < n.probe.size(); ++k) {
    nlohmann::json row = {{"step", k + 1}};
    for (int m = 0; m < kMeasures; ++m) row[measure_key(static_cast<Measure>(m))] = n.probe[k][m];
    steps.push_back(row);
  }
  return {{"unit", n.unit},
          {"margin_factor", kNoiseMargin},
          {"device_factor", kDeviceFactor},
          {"probe", steps}};
}

nlohmann::json report_json(const RunResult& r, const std::string& backend,
                           const std::string& run_id) {
  const Scenario& s = r.scenario;
  nlohmann::json parity = nlohmann::json::array();
  for (std::size_t index = 0; index < r.configs.size(); ++index) {
    const ConfigResult& c = r.configs[index];
    nlohmann::json steps = nlohmann::json::array();
    for (const StepParity& sp : c.steps)
      steps.push_back({{"step", sp.step},
                       {"loss", sp.loss},
                       {"ref_loss", sp.ref_loss},
                       {"max_rel_err", sp.max_rel_err},
                       {"bound", sp.bound},
                       {"measure", sp.measure}});
    parity.push_back(
        {{"config", c.config},
         {"mesh", mesh_json(c.spec)},
         {"world_size", c.spec.mesh.world_size()},
         {"strategy", c.strategy},
         {"supported", c.supported},
         {"steps", steps},
         {"max_rel_err", c.max_rel_err},
         {"tolerance", c.tolerance},
         {"measure", c.measure},
         {"reference", c.tied_apart_reference ? "tied embedding uses rounded apart" : "the recipe"},
         {"measures",
          [&] {
            nlohmann::json m = nlohmann::json::object();
            for (int i = 0; i < kMeasures; ++i) {
              const auto& x = c.measures[static_cast<std::size_t>(i)];
              if (x.where.empty()) continue;
              m[measure_key(static_cast<Measure>(i))] = {
                  {"error", x.err}, {"bound", x.bound}, {"where", x.where}};
            }
            return m;
          }()},
         // bound / error: null when exact (or not run); 0: over a bound of 0, or NaN
         {"margin", c.steps.empty() || !std::isfinite(c.margin) ? nlohmann::json(nullptr)
                                                                : nlohmann::json(c.margin)},
         {"pass", c.pass},
         {"detail", c.detail},
         {"wall_s", c.wall_seconds},
         {"compute", c.compute},
         {"device_ops", c.device_ops},
         {"memory", memory_json(c.memory)},
         {"parity_pass", c.parity_pass},
         {"resumed_from", c.resumed_from},
         {"broke", c.broke},
         {"faults", faults_json(c.faults)},
         {"timing", timing_json(c.timing, c.wall_timing, bubble_of(c))},
         {"goodput", goodput_json(c.goodput)},
         {"phases", phases_json(c.phases)},
         {"pipeline", pipeline_json(c.pipeline)},
         // Rows that did not train the whole run have no load.
         {"ep_load", c.supported && c.resumed_from.empty() && !c.steps.empty() && !c.broke
                         ? ep_load_json(s, c.spec, r.reference_moe_load)
                         : nlohmann::json(nullptr)},
         {"trace", c.timeline.empty()
                       ? nlohmann::json(nullptr)
                       : nlohmann::json{{"file", trace_file(s.name, index, c.config)},
                                        {"events", c.timeline.size()},
                                        {"format", "Chrome Trace Event Format"}}}});
  }
  return {
      {"pass", r.pass()},
      {"scenario", s.name},
      {"description", s.description},
      {"backend", backend},
      {"compute", r.compute},
      {"world_size", s.parallel.mesh.world_size()},
      {"manifest", manifest_json(s, run_id)},
      {"parity", parity},
      {"noise", noise_json(r.noise)},
      {"moe", moe_load_json(s, r.reference_steps, r.reference_moe_load)},
      {"noise_tied_apart",
       r.noise_tied_apart ? noise_json(*r.noise_tied_apart) : nlohmann::json(nullptr)},
      // The first configuration's ranks (each parity row carries its own).
      {"memory", r.configs.empty() ? nlohmann::json::array() : memory_json(r.configs[0].memory)},
      {"timing", r.configs.empty() ? nlohmann::json(nullptr)
                                   : timing_json(r.configs[0].timing, r.configs[0].wall_timing,
                                                 bubble_of(r.configs[0]))},
      {"faults",
       [&] {
         nlohmann::json all = nlohmann::json::array();
         for (const ConfigResult& c : r.configs)
           for (auto f : faults_json(c.faults)) {
             f["config"] = c.config;
             all.push_back(f);
           }
         return all;
       }()},
      {"expect",
       {{"parity", s.expect_parity},
        {"fault", s.expect_fault ? nlohmann::json(*s.expect_fault) : nlohmann::json(nullptr)}}},
      {"broke", r.broke()}};
}

void write_junit(const std::vector<RunResult>& runs, const std::string& file) {
  std::ostringstream f;
  std::size_t tests = 0, failures = 0;
  for (const auto& r : runs)
    for (const auto& c : r.configs) {
      ++tests;
      failures += !c.pass;
    }
  f << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  f << "<testsuites tests=\"" << tests << "\" failures=\"" << failures << "\">\n";
  for (const auto& r : runs) {
    std::size_t fails = 0;
    for (const auto& c : r.configs) fails += !c.pass;
    f << "  <testsuite name=\"" << xml_escape(r.scenario.name) << "\" tests=\"" << r.configs.size()
      << "\" failures=\"" << fails << "\">\n";
    for (const auto& c : r.configs) {
      f << "    <testcase classname=\"parity." << xml_escape(r.scenario.name) << "\" name=\""
        << xml_escape(c.config) << "\" time=\"" << c.wall_seconds << "\">";
      if (!c.pass) {
        const std::string msg = c.supported ? "max_rel_err " + std::to_string(c.max_rel_err) +
                                                  " > bound " + std::to_string(c.tolerance)
                                            : "unsupported: " + c.detail;
        f << "<failure message=\"" << xml_escape(msg) << "\">" << xml_escape(c.detail)
          << "</failure>";
      }
      f << "</testcase>\n";
    }
    f << "  </testsuite>\n";
  }
  f << "</testsuites>\n";
  write_output(file, f.str(), "--junit");
}

// Names and messages reach the terminal with their control characters escaped (comm/text.hpp):
// a newline in a name would forge a line of the summary, an escape sequence drive the terminal.
// Messages of several lines written here keep their newlines.
void print_summary(std::ostream& os, const RunResult& r) {
  os << "# scenario " << comm::printable(r.scenario.name) << ": " << r.configs.size()
     << " configuration(s), " << ref::to_string(r.scenario.train.precision) << ", "
     << r.scenario.train.steps << " steps"
     << (r.compute == "cpu" ? ""
                            : ", ranks compute on " + r.compute + " (the reference on the CPU)")
     << "\n";
  char line[512];
  int width = 34;  // the config column: the longest label
  for (const auto& c : r.configs)
    width = std::max(width, static_cast<int>(comm::printable(c.config).size()));
  std::snprintf(line, sizeof line, "  %-*s %-7s %6s %12s %10s %8s  %s\n", width, "config",
                "strategy", "ranks", "max_rel_err", "bound", "margin", "result");
  os << line;
  for (const auto& c : r.configs) {
    char margin[32] = "-";
    if (c.supported && !c.steps.empty())
      std::snprintf(margin, sizeof margin, c.max_rel_err == 0.0 ? "exact" : "%.3gx", c.margin);
    std::snprintf(line, sizeof line, "  %-*s %-7s %6d %12.3e %10.2e %8s  %s\n", width,
                  comm::printable(c.config).c_str(),
                  c.strategy.empty() ? "-" : comm::printable(c.strategy).c_str(),
                  c.spec.mesh.world_size(), c.max_rel_err, c.tolerance, margin,
                  c.pass        ? "PASS"
                  : c.broke     ? "BROKE"
                  : c.supported ? "FAIL"
                                : "UNSUPPORTED");
    os << line;
    if (!c.pass || !c.faults.empty()) os << "      " << comm::printable_lines(c.detail) << "\n";
    if (!c.compute.empty() && c.compute != "cpu")
      os << "      computed on " << c.compute << ": "
         << (c.device_ops > 0 ? std::to_string(c.device_ops) + " ops there"
                              : std::string("no op ran there (every op fell back to the CPU)"))
         << "\n";
    if (c.wall_timing && c.timing.valid) {
      std::snprintf(line, sizeof line,
                    "      wall %.2f s; step %.4f s (rank p50 %.4f, p95 %.4f, max %.4f), "
                    "%.0f tokens/s, MFU %.2f%%\n",
                    c.wall_seconds, c.timing.step_time_s, c.timing.p50, c.timing.p95, c.timing.max,
                    c.timing.tokens_per_s, 100 * c.timing.mfu);
      os << line;
    }
    if (c.phases.valid && c.spec.mesh.world_size() > 1) {
      // Where the step went on its slowest rank for each phase (seconds per step, max over ranks).
      std::string ph = "      phases per step, max over ranks:";
      for (const Phase p : {Phase::forward, Phase::backward, Phase::recompute, Phase::optimizer,
                            Phase::exposed_comm, Phase::idle}) {
        const PhaseStats& st = c.phases.stats[static_cast<std::size_t>(p)];
        if (!(st.max > 0)) continue;
        ph += std::string(" ") + phase_key(p) + " " + sim::format_seconds(st.max) + " (rank " +
              std::to_string(st.slowest_rank) + "),";
      }
      ph.back() = '\n';
      os << ph;
    }
    if (c.pipeline) {
      const PipelineResult& pl = *c.pipeline;
      const std::string v = pl.virtual_stages > 1 ? " v" + std::to_string(pl.virtual_stages) : "";
      if (pl.schedule_bubble >= 0)
        std::snprintf(line, sizeof line,
                      "      pipeline %s pp%d%s m%d: bubble %.3f (schedule, free links; %.3f by "
                      "(p-1)/(v*m+p-1)), compute idle %.3f as run (%.3f waiting on "
                      "communication)\n",
                      pl.schedule.c_str(), pl.stages, v.c_str(), pl.microbatches,
                      pl.schedule_bubble, pl.formula, pl.measured,
                      pl.measured - pl.schedule_bubble);
      else
        std::snprintf(line, sizeof line,
                      "      pipeline %s pp%d%s m%d: compute idle %.3f as run, %.3f by "
                      "(p-1)/(v*m+p-1)\n",
                      pl.schedule.c_str(), pl.stages, v.c_str(), pl.microbatches, pl.measured,
                      pl.formula);
      os << line;
    }
    for (const FaultResult& f : c.faults) {
      os << "      fault " << f.kind << (f.detected ? "" : " (NOT detected)") << ": ranks "
         << comm::rank_list(f.ranks) << "\n";
      if (f.message != c.detail) {
        std::string msg = comm::printable_lines(f.message);
        for (std::size_t at = 0; (at = msg.find('\n', at)) != std::string::npos; at += 9)
          msg.replace(at, 1, "\n        ");
        os << "        " << msg << "\n";
      }
    }
  }
}

}  // namespace shardcheck::harness
