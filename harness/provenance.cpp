// Run provenance (provenance.hpp).
#include "harness/provenance.hpp"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "checkpoint/shard_file.hpp"
#include "comm/mesh.hpp"
#include "harness/checkpointing.hpp"

namespace shardcheck::harness {

namespace {

std::string hash_text(std::uint64_t h) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "xxh3:%016llx", static_cast<unsigned long long>(h));
  return buf;
}

void append(std::vector<std::byte>& out, const std::vector<int32_t>& v) {
  const auto bytes = std::as_bytes(std::span<const int32_t>(v));
  out.insert(out.end(), bytes.begin(), bytes.end());
}

}  // namespace

std::string new_run_id() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char when[32];
  std::strftime(when, sizeof when, "%Y%m%dT%H%M%SZ", &utc);
  std::random_device rd;
  char id[64];
  std::snprintf(id, sizeof id, "%s-%08x", when, static_cast<unsigned>(rd()));
  return id;
}

nlohmann::json model_manifest(const Scenario& s) {
  const nlohmann::json model = run_identity(s).at("model");
  const std::string text = model.dump();
  return {{"config", model},
          {"hash", hash_text(checkpoint::xxh3(std::as_bytes(std::span<const char>(text))))}};
}

nlohmann::json data_manifest(const Scenario& s, const ref::Dataset& ds) {
  std::vector<std::byte> stream;
  for (const ref::Sequence& q : ds.samples) {
    append(stream, q.tokens);
    append(stream, q.targets);
    append(stream, q.loss_mask);
    append(stream, q.doc_ids);    // the attention's document mask
    append(stream, q.positions);  // RoPE's
  }
  return {{"config", run_identity(s).at("data")},
          {"seed", s.seed},
          {"documents", ds.documents},
          {"sequences", ds.samples.size()},
          {"tokens", ds.tokens},
          {"hash", hash_text(checkpoint::xxh3(stream))}};
}

nlohmann::json checkpoint_policy(const Scenario& s) {
  const CheckpointSpec& c = s.checkpoint;
  return {{"every", c.every},
          {"keep", c.keep},
          {"restore_parallel", c.restore_parallel ? nlohmann::json(c.restore_parallel->label())
                                                  : nlohmann::json(nullptr)},
          {"drills", s.drills}};
}

nlohmann::json groups_json(const ParallelSpec& p) {
  const comm::DeviceMesh mesh(p.mesh, p.order);
  nlohmann::json groups = nlohmann::json::array();
  for (int r = 0; r < mesh.world_size(); ++r) {
    nlohmann::json g{{"rank", r}};
    for (comm::Axis a : comm::kAllAxes) g[std::string(comm::name_of(a))] = mesh.group(r, a);
    // The expert parameters' gradient-sum group: dp x cp / ep ranks (Megatron's expert DP).
    g["edp"] = mesh.group(r, comm::Axis::edp);
    groups.push_back(g);
  }
  return groups;
}

std::string groups_line(const ParallelSpec& p) {
  const comm::DeviceMesh mesh(p.mesh, p.order);
  const int n = mesh.world_size();
  std::string out = p.label() + " (" + std::to_string(n) + (n == 1 ? " rank" : " ranks") +
                    ", order " + mesh.order_string() + "):";
  std::vector<comm::Axis> axes(comm::kAllAxes.begin(), comm::kAllAxes.end());
  if (p.mesh.ep > 1) axes.push_back(comm::Axis::edp);
  const char* sep = " ";
  for (comm::Axis a : axes) {
    if (mesh.size(a) < 2) continue;
    out += sep + std::string(comm::name_of(a));
    std::set<std::vector<int>> seen;
    for (int r = 0; r < mesh.world_size(); ++r) {
      const std::vector<int> g = mesh.group(r, a);
      if (!seen.insert(g).second) continue;
      out += " [";
      for (std::size_t i = 0; i < g.size(); ++i) out += (i ? " " : "") + std::to_string(g[i]);
      out += "]";
    }
    sep = "; ";
  }
  if (mesh.world_size() == 1) out += " one rank";
  return out;
}

}  // namespace shardcheck::harness
