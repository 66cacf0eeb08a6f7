// Scenario parsing and validation. Each section has a parser that reads every key it knows with
// type and range checks (unknown keys are errors), then cross-field checks name the JSON path of
// the value to change: heads not divisible by tp, experts by ep, layers fewer than stages, ...
#include "harness/scenario.hpp"

#include <algorithm>
#include <initializer_list>
#include <map>
#include <optional>

#include "comm/text.hpp"
#include "harness/plan_skeleton.hpp"
#include "parallel/mp/mesh_engine.hpp"
#include "sim/world.hpp"

namespace shardcheck::harness {

namespace {

constexpr int kBig = 1 << 30;

std::string num(int v) {
  return std::to_string(v);
}

ref::ModelConfig parse_model(ObjectReader o) {
  ref::ModelConfig m;
  m.vocab = o.integer("vocab", m.vocab, 2, kBig);
  m.vocab_pad_multiple =
      o.integer("vocab_pad_multiple", m.vocab_pad_multiple, 1, ref::kMaxVocabPadMultiple);
  m.hidden = o.integer("hidden", m.hidden, 1, kBig);
  m.layers = o.integer("layers", m.layers, 1, 100000);
  m.heads = o.integer("heads", m.heads, 1, 100000);
  m.kv_heads = o.integer("kv_heads", m.heads, 1, 100000);
  m.ffn = o.integer("ffn", m.ffn, 1, kBig);
  m.mlp = o.choice("mlp", "gelu", {"gelu", "swiglu"}) == "swiglu" ? ref::MlpKind::kSwiglu
                                                                  : ref::MlpKind::kGelu;
  m.seq_len = o.integer("seq_len", m.seq_len, 2, kBig);
  m.tie_embeddings = o.boolean("tie_embeddings", m.tie_embeddings);
  m.dropout = o.number("dropout", m.dropout, 0.0, 0.99);
  {
    ObjectReader r = o.object("rope");
    m.rope.theta = r.number("theta", m.rope.theta, 1.0 + 1e-9, 1e12);
    m.rope.layout = r.choice("layout", "interleaved", {"interleaved", "half"}) == "half"
                        ? ref::RopeLayout::kHalf
                        : ref::RopeLayout::kInterleaved;
    if (!r.is_null("scaling")) {
      ObjectReader sr = r.object("scaling");
      (void)sr.choice("rope_type", "llama3", {"llama3"});  // the one scaling built
      ref::RopeScaling sc;
      sc.factor = sr.number("factor", sc.factor, 1.0, 1e6);
      sc.low_freq_factor = sr.number("low_freq_factor", sc.low_freq_factor, 1e-6, 1e6);
      sc.high_freq_factor = sr.number("high_freq_factor", sc.high_freq_factor, 1e-6, 1e6);
      if (sc.high_freq_factor <= sc.low_freq_factor)
        throw ScenarioError(sr.at("high_freq_factor"),
                            "expected a number greater than low_freq_factor (" +
                                describe_json(sc.low_freq_factor) + ")");
      sc.original_max_positions =
          sr.integer("original_max_position_embeddings", sc.original_max_positions, 1, kBig);
      sr.finish();
      m.rope.scaling = sc;
    } else {
      r.raw("scaling");
    }
    r.finish();
  }
  if (!o.is_null("moe")) {
    ObjectReader mo = o.object("moe");
    ref::MoeConfig c;
    c.experts = mo.integer("experts", c.experts, 1, 100000);
    c.top_k = mo.integer("top_k", c.top_k, 1, c.experts);
    c.capacity_factor = mo.number("capacity_factor", c.capacity_factor, 1e-6, 1e6);
    c.every = mo.integer("every", c.every, 1, m.layers);
    c.aux_loss = mo.number("aux_loss", c.aux_loss, 0.0, 1e6);
    mo.finish();
    m.moe = c;
  } else {
    o.raw("moe");
  }
  o.finish();
  return m;
}

ref::TrainConfig parse_train(ObjectReader o) {
  ref::TrainConfig t;
  t.steps = o.integer("steps", t.steps, 1, 10000000);
  t.global_batch = o.integer("global_batch", t.global_batch, 1, kBig);
  t.micro_batch = o.integer("micro_batch", t.micro_batch, 1, t.global_batch);
  const std::string p = o.choice("precision", "f64", {"f64", "f32", "bf16"});
  t.precision = p == "f64"   ? ref::Precision::kF64
                : p == "f32" ? ref::Precision::kF32
                             : ref::Precision::kBf16;
  ObjectReader opt = o.object("optimizer");
  auto& oc = t.optimizer;
  oc.lr = opt.number("lr", oc.lr, 0.0, 10.0);
  const nlohmann::json& betas = opt.array("betas");
  if (!betas.empty()) {
    if (betas.size() != 2 || !betas[0].is_number() || !betas[1].is_number() ||
        betas[0].get<double>() < 0 || betas[0].get<double>() >= 1 || betas[1].get<double>() < 0 ||
        betas[1].get<double>() >= 1)
      throw ScenarioError(opt.at("betas"),
                          "expected two numbers in [0, 1), got " + describe_json(betas));
    oc.beta1 = betas[0].get<double>();
    oc.beta2 = betas[1].get<double>();
  }
  oc.eps = opt.number("eps", oc.eps, 1e-30, 1.0);
  oc.weight_decay = opt.number("weight_decay", oc.weight_decay, 0.0, 10.0);
  oc.warmup = opt.integer("warmup", oc.warmup, 0, t.steps);
  oc.min_lr = opt.number("min_lr", std::min(oc.min_lr, oc.lr), 0.0, oc.lr);
  opt.finish();
  t.clip_grad_norm = o.number("clip_grad_norm", t.clip_grad_norm, 0.0, 1e12);
  // false / true (= full, as PyTorch's checkpoint of every block), or the mode by name.
  if (const nlohmann::json* ac = o.raw("activation_checkpointing"); ac && ac->is_boolean()) {
    t.recompute = ac->get<bool>() ? ref::Recompute::kFull : ref::Recompute::kNone;
  } else if (ac && !ac->is_string()) {
    throw ScenarioError(
        o.at("activation_checkpointing"),
        "expected false, true, \"none\", \"selective\" or \"full\", got " + describe_json(*ac));
  } else if (ac) {
    const std::string mode =
        o.choice("activation_checkpointing", "none", {"none", "selective", "full"});
    t.recompute = mode == "selective" ? ref::Recompute::kSelective
                  : mode == "full"    ? ref::Recompute::kFull
                                      : ref::Recompute::kNone;
  }
  o.finish();
  return t;
}

ref::DataConfig parse_data(ObjectReader o) {
  ref::DataConfig d;
  d.documents = o.integer("documents", static_cast<int>(d.documents), 1, kBig);
  d.min_len = o.integer("min_len", d.min_len, 1, kBig);
  d.max_len = o.integer("max_len", std::max(d.max_len, d.min_len), d.min_len, kBig);
  d.packing = o.boolean("packing", d.packing);
  d.drop_last = o.boolean("drop_last", d.drop_last);
  o.finish();
  return d;
}

// A "parallel" object or matrix entry as written, before it becomes a ParallelConfig: "zero",
// "fsdp" and "bucket_elems" are separate keys that an entry inherits one by one from "parallel"
// ({"fsdp": null} over a base with FSDP and buckets is DDP with the base's buckets).
struct ParallelDraft {
  ParallelSpec spec;  // everything but the data-parallel strategy
  int zero = 0;
  std::optional<parallel::ShardingStrategy> fsdp;
  parallel::Fsdp fsdp_details;  // used when fsdp is set
  int bucket_elems = static_cast<int>(parallel::Ddp{}.bucket_elems);
};

template <typename E>
E enum_named(const std::string& name, std::initializer_list<E> all) {
  for (const E e : all)
    if (parallel::name_of(e) == name) return e;
  return *all.begin();  // unreachable: the reader's choice() checked the name
}

parallel::ShardingStrategy sharding_named(const std::string& name) {
  using S = parallel::ShardingStrategy;
  return enum_named(name, {S::full_shard, S::shard_grad_op, S::no_shard, S::hybrid_shard});
}

ParallelDraft parse_parallel(ObjectReader o, const ParallelDraft& base) {
  using parallel::name_of;
  ParallelDraft d = base;
  ParallelSpec& p = d.spec;
  p.mesh.dp = o.integer("dp", base.spec.mesh.dp, 1, 65536);
  p.mesh.tp = o.integer("tp", base.spec.mesh.tp, 1, 65536);
  p.mesh.pp = o.integer("pp", base.spec.mesh.pp, 1, 65536);
  p.mesh.cp = o.integer("cp", base.spec.mesh.cp, 1, 65536);
  p.mesh.ep = o.integer("ep", base.spec.mesh.ep, 1, 65536);
  p.order = o.text("order", base.spec.order);
  d.zero = o.integer("zero", base.zero, 0, 3);
  if (const nlohmann::json* f = o.raw("fsdp")) {
    if (f->is_null()) {
      d.fsdp.reset();  // an explicit null clears it
    } else if (f->is_object()) {
      ObjectReader fo = o.object("fsdp");
      parallel::Fsdp& x = d.fsdp_details;
      d.fsdp = sharding_named(fo.choice(
          "sharding", "full_shard", {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard"}));
      using W = parallel::WrapPolicy;
      x.wrap = enum_named(fo.choice("wrap", std::string(name_of(base.fsdp_details.wrap)),
                                    {"block", "layer_group", "whole_model"}),
                          {W::block, W::layer_group, W::whole_model});
      x.blocks_per_unit =
          fo.integer("blocks_per_unit", base.fsdp_details.blocks_per_unit, 1, 65536);
      x.reshard_after_forward =
          fo.boolean("reshard_after_forward", base.fsdp_details.reshard_after_forward);
      x.prefetch = fo.integer("prefetch", base.fsdp_details.prefetch, 0, 2);
      x.shard_group_size =
          fo.integer("shard_group_size", base.fsdp_details.shard_group_size, 0, 65536);
      fo.finish();
    } else {
      d.fsdp = sharding_named(
          o.choice("fsdp", "", {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard"}));
    }
  }
  d.bucket_elems = o.integer("bucket_elems", base.bucket_elems, 1, 1 << 30);
  p.sequence_parallel = o.boolean("sequence_parallel", base.spec.sequence_parallel);
  using S = parallel::PipeSchedule;
  p.pp_schedule = enum_named(o.choice("pp_schedule", std::string(name_of(base.spec.pp_schedule)),
                                      {"gpipe", "1f1b", "interleaved"}),
                             {S::gpipe, S::one_f_one_b, S::interleaved});
  p.virtual_stages = o.integer("virtual_stages", base.spec.virtual_stages, 1, 1024);
  using A = parallel::CpAlgo;
  p.cp_algo =
      enum_named(o.choice("cp_algo", std::string(name_of(base.spec.cp_algo)), {"ring", "ulysses"}),
                 {A::ring, A::ulysses});
  const bool world_given = o.raw("world_size") != nullptr;
  const int world = o.integer("world_size", 1, 1, static_cast<int>(comm::kMaxWorldSize));
  o.finish();
  if (world_given && world != p.mesh.world_size64())
    throw ScenarioError(o.at("world_size"), num(world) + " is not dp*tp*pp*cp = " +
                                                std::to_string(p.mesh.world_size64()));
  return d;
}

// The configuration a draft says: FSDP, else ZeRO, else DDP; a ZeRO stage beside FSDP is refused
// at path.fsdp (scenarios/README.md: fsdp "not with zero > 0").
ParallelSpec config_of(const ParallelDraft& d, const std::string& path) {
  ParallelSpec p = d.spec;
  const auto elems = static_cast<std::size_t>(d.bucket_elems);
  if (d.fsdp) {
    if (d.zero != 0)
      throw ScenarioError(path + ".fsdp",
                          "choose either zero (stage " + num(d.zero) + ") or fsdp (\"" +
                              std::string(parallel::name_of(*d.fsdp)) + "\"), not both");
    parallel::Fsdp f = d.fsdp_details;
    f.sharding = *d.fsdp;
    p.data = f;
  } else if (d.zero > 0) {
    p.data = parallel::Zero{.stage = d.zero, .bucket_elems = elems};
  } else {
    p.data = parallel::Ddp{.bucket_elems = elems};
  }
  return p;
}

// Checks one configuration against the model and batch with the engine's own rules
// (parallel::validate_mesh); `path` names where it came from. A valid combination that is not
// built yet loads (its row reports why); anything else is a ScenarioError at path.field.
void check_config(const ParallelSpec& p, const ref::ModelConfig& m, const ref::TrainConfig& t,
                  const std::string& path) {
  try {
    parallel::validate_mesh(m, t, parallel::mesh_options(p, 1));
  } catch (const parallel::MeshConfigError& e) {
    if (!e.not_built()) throw ScenarioError(path + "." + e.field(), e.what());
  }
}

// A fault at a step the run never reaches would never fire and the run would pass: refused.
FaultSpec parse_fault(ObjectReader o, int world, int steps) {
  FaultSpec f;
  f.kind = o.choice("kind", "",
                    {"straggler", "hang", "crash", "skip_collective", "mismatch", "nan_gradient",
                     "corrupt_payload", "memory_budget"});
  f.rank = o.integer_required("rank", 0, world - 1);
  f.step = o.integer(f.kind == "straggler" ? "from_step" : "step", 1, 1, steps);
  if (f.kind == "straggler") {
    f.slowdown = o.number("slowdown", 2.0, 1.0, 1e6);
  } else if (f.kind == "memory_budget") {
    f.bytes = o.integer_required("bytes", 1, kBig);
  } else if (f.kind == "hang" || f.kind == "crash") {
    f.op_index = o.integer("op_index", -1, -1, kBig);  // -1: at the step start
  } else if (f.kind != "nan_gradient") {               // an op's fault: which op is required
    f.op_index = o.integer_required("op_index", 0, kBig);
    if (f.kind == "mismatch") f.what = o.choice("what", "count", {"count", "dtype", "op"});
  }
  o.finish();
  return f;
}

// The largest configuration whose ops are counted at load (one thread per rank, no data): at most
// this many ranks, and ranks x counted steps x microbatches per rank x layers at most
// kMaxCountedWork (about 30 us each with TP, so ~15 s at the limit). A configuration beyond
// either with a fault at an op is refused, as the count cannot be made there in reasonable time.
constexpr int kMaxCountedWorld = 1024;
constexpr double kMaxCountedWork = 1 << 19;

// A fault at an op the rank never issues would never fire and the run would pass: refused. Each
// configuration the fault applies to (its rank inside the world) issues its steps' ops as the
// planner's skeleton does (harness/plan_skeleton.hpp, checked op for op against the engine by
// the conformance test) on a SimWorld in meta mode; each such fault becomes a marker at its
// (rank, step, op_index) that fires without effect (a corrupt_payload with no payload), and a
// marker that did not fire is a fault that cannot. Steps after the second issue what the second
// does, so only min(steps, 2) are run. Ops a checkpoint save adds (run --checkpoint-dir) are not
// counted: a fault is placed among the training step's own ops.
void check_faults_fire(const Scenario& sc) {
  std::vector<std::size_t> at_op;
  for (std::size_t i = 0; i < sc.faults.size(); ++i)
    if (sc.faults[i].op_index >= 0) at_op.push_back(i);
  if (at_op.empty()) return;
  const int steps = std::min(sc.train.steps, 2);
  for (std::size_t c = 0; c < sc.configs.size(); ++c) {
    const ParallelSpec& p = sc.configs[c];
    const int world = p.mesh.world_size();
    const std::string config = sc.has_matrix ? "$.matrix[" + std::to_string(c) + "]" : "$.parallel";
    std::vector<std::size_t> mine;
    sim::SimOptions so;
    so.meta = true;
    for (const std::size_t i : at_op) {
      const FaultSpec& f = sc.faults[i];
      if (f.rank >= world) continue;
      mine.push_back(i);
      sim::Fault marker;
      marker.kind = sim::FaultKind::corrupt_payload;
      marker.rank = f.rank;
      marker.step = std::min(f.step, steps);
      marker.op_index = f.op_index;
      so.faults.faults.push_back(marker);
    }
    if (mine.empty()) continue;
    const std::string first = "$.faults[" + std::to_string(mine.front()) + "]";
    const double work = static_cast<double>(world) * steps *
                        (sc.train.global_batch / p.mesh.dp / sc.train.micro_batch) *
                        sc.model.layers;
    if (world > kMaxCountedWorld || work > kMaxCountedWork)
      throw ScenarioError(
          first + ".op_index",
          "a fault at an op needs the rank's ops counted at load (a fault that cannot fire is "
          "refused), done for configurations of at most " +
              num(kMaxCountedWorld) + " ranks and " +
              std::to_string(static_cast<long>(kMaxCountedWork)) +
              " rank x step x microbatch x layer units; configuration " + config + " ('" +
              p.label() + "') has " + num(world) + " ranks and " +
              std::to_string(static_cast<long long>(work)) +
              " units: inject the fault at the step start (hang or crash, op_index -1) or in a "
              "smaller configuration");
    std::optional<Skeleton> skeleton;
    try {
      parallel::TimingSpec spec = skeleton_spec(sc, p, p.mesh.dp, sc.train.global_batch);
      spec.steps = steps;
      skeleton.emplace(std::move(spec));
    } catch (const std::exception&) {
      continue;  // not built, or not splittable: the run reports the row, no fault runs there
    }
    sim::SimWorld w(world, so);
    try {
      w.run([&](comm::Communicator& cm) { skeleton->run(cm); });
    } catch (const std::exception&) {
      continue;  // the skeleton could not run it: the engine reports the row itself
    }
    for (const std::size_t i : mine) {
      const FaultSpec& f = sc.faults[i];
      const int step = std::min(f.step, steps);
      const bool fired =
          std::any_of(w.fired_faults().begin(), w.fired_faults().end(), [&](const auto& ff) {
            return ff.fault.rank == f.rank && ff.step == step && ff.op_index == f.op_index;
          });
      if (fired) continue;
      const auto ops = std::count_if(w.timeline().begin(), w.timeline().end(), [&](const auto& e) {
        return e.rank == f.rank && e.step == step && e.stream == sim::Stream::comm;
      });
      throw ScenarioError(
          "$.faults[" + std::to_string(i) + "].op_index",
          "rank " + num(f.rank) + " issues " + std::to_string(ops) + " communication ops in step " +
              num(f.step) + " of configuration " + config + " ('" + p.label() + "')" +
              (ops > 0 ? ", op_index 0.." + std::to_string(ops - 1) : std::string()) + "; op " +
              num(f.op_index) +
              " is never reached, so the fault would never fire and the run would pass");
    }
  }
}

}  // namespace

TopologySpec parse_topology(ObjectReader topo) {
  TopologySpec t;
  t.ranks_per_node = topo.integer("ranks_per_node", t.ranks_per_node, 1, 1 << 20);
  for (const char* link : {"intra_node", "inter_node"}) {
    ObjectReader l = topo.object(link);
    LinkSpec& spec = std::string(link) == "intra_node" ? t.intra_node : t.inter_node;
    spec.bandwidth_gbps = l.number("bandwidth_gbps", spec.bandwidth_gbps, 1e-6, 1e9);
    spec.latency_us = l.number("latency_us", spec.latency_us, 0.0, 1e9);
    l.finish();
  }
  ObjectReader dev = topo.object("device");
  t.peak_tflops = dev.number("peak_tflops", t.peak_tflops, 1e-6, 1e9);
  t.hbm_gbps = dev.number("hbm_gbps", t.hbm_gbps, 1e-6, 1e9);
  t.memory_gib = dev.number("memory_gib", t.memory_gib, 1e-6, 1e9);
  t.sm_count = dev.integer("sm_count", t.sm_count, 0, 1 << 16);
  t.gemm_tile_m = dev.integer("gemm_tile_m", t.gemm_tile_m, 1, 4096);
  t.gemm_tile_n = dev.integer("gemm_tile_n", t.gemm_tile_n, 1, 4096);
  dev.finish();
  topo.finish();
  return t;
}

std::vector<FaultSpec> parse_faults(const nlohmann::json& faults, const std::string& path,
                                    int world, int steps) {
  std::vector<FaultSpec> out;
  for (std::size_t i = 0; i < faults.size(); ++i)
    out.push_back(
        parse_fault(ObjectReader(faults[i], path + "[" + std::to_string(i) + "]"), world, steps));
  return out;
}

HealthSpec parse_health(ObjectReader health) {
  HealthSpec h;
  h.payload_checksums = health.boolean("payload_checksums", false);
  h.nan_policy = health.choice("nan_policy", "skip_step", {"skip_step", "stop"});
  health.finish();
  return h;
}

Scenario parse_scenario(const nlohmann::json& j) {
  if (!j.is_object())
    throw ScenarioError("$",
                        "a scenario is a JSON object ({\"name\": ...}), got " + describe_json(j));
  ObjectReader o(j, "$");
  Scenario sc;
  sc.name = o.text("name", "");
  if (sc.name.empty()) throw ScenarioError("$.name", "missing; expected a non-empty string");
  // The name is printed in tables, logs and file names: a newline would forge a line of output,
  // an escape sequence drive the terminal.
  if (const comm::ControlChar c = comm::first_control(sc.name); !c.escaped.empty())
    throw ScenarioError("$.name", "holds a control character (" + c.escaped + " at byte " +
                                      std::to_string(c.offset) +
                                      "); a name may not, it is printed in tables and logs; got " +
                                      describe_json(j.at("name")));
  sc.description = o.text("description", "");
  if (const nlohmann::json* seed = o.raw("seed")) {  // may exceed int: read by hand
    const auto& s = *seed;
    if (!s.is_number_unsigned())
      throw ScenarioError("$.seed", "expected an integer >= 0, got " + describe_json(s));
    sc.seed = s.get<std::uint64_t>();
  }
  sc.model = parse_model(o.object("model"));
  sc.train = parse_train(o.object("train"));
  sc.data = parse_data(o.object("data"));
  try {  // the reference's own rules (reference/config.cpp), before any mesh rule reads them
    sc.model.validate();
    sc.train.validate();
    sc.data.validate(sc.model.vocab);
  } catch (const ref::ConfigError& e) {
    throw ScenarioError("$." + e.field(), e.what());
  }
  const ParallelDraft base = parse_parallel(o.object("parallel"), ParallelDraft{});
  sc.parallel = config_of(base, "$.parallel");
  check_config(sc.parallel, sc.model, sc.train, "$.parallel");
  const nlohmann::json& matrix = o.array("matrix");
  for (std::size_t i = 0; i < matrix.size(); ++i) {
    const std::string path = "$.matrix[" + std::to_string(i) + "]";
    ParallelSpec p = config_of(parse_parallel(ObjectReader(matrix[i], path), base), path);
    check_config(p, sc.model, sc.train, path);
    sc.configs.push_back(p);
  }
  sc.has_matrix = !sc.configs.empty();
  if (sc.configs.empty()) sc.configs.push_back(sc.parallel);
  // A configuration's label names its outputs (DIR/<label>/ under --checkpoint-dir, its trace,
  // its rows): two with one label would overwrite, or retire, each other's files.
  std::map<std::string, std::size_t> labels;
  for (std::size_t i = 0; i < sc.configs.size(); ++i) {
    const auto [it, fresh] = labels.emplace(sc.configs[i].label(), i);
    if (!fresh)
      throw ScenarioError("$.matrix[" + std::to_string(i) + "]",
                          "configuration label '" + it->first + "' is also $.matrix[" +
                              std::to_string(it->second) +
                              "]'s; labels name each configuration's outputs (checkpoints, "
                              "traces, report rows), so they must be unique: change or drop one");
  }

  sc.topology = parse_topology(o.object("topology"));
  int max_world = 0;
  for (const auto& c : sc.configs) max_world = std::max(max_world, c.mesh.world_size());
  sc.faults = parse_faults(o.array("faults"), "$.faults", max_world, sc.train.steps);
  sc.health = parse_health(o.object("health"));

  ObjectReader plan = o.object("plan");
  const nlohmann::json& sizes = plan.array("world_sizes");
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (!sizes[i].is_number_integer() || sizes[i].get<long long>() < 1 ||
        sizes[i].get<long long>() > (1 << 20))
      throw ScenarioError(plan.at("world_sizes") + "[" + std::to_string(i) + "]",
                          "expected an integer in [1, 1048576], got " + describe_json(sizes[i]));
    sc.plan.world_sizes.push_back(sizes[i].get<int>());
  }
  sc.plan.mtbf_gpu_hours = plan.number("mtbf_gpu_hours", sc.plan.mtbf_gpu_hours, 1e-3, 1e12);
  sc.plan.checkpoint_every_steps =
      plan.integer("checkpoint_every_steps", sc.plan.checkpoint_every_steps, 0, kBig);
  sc.plan.checkpoint_save_s = plan.number("checkpoint_save_s", sc.plan.checkpoint_save_s, 0, 1e9);
  sc.plan.restart_s = plan.number("restart_s", sc.plan.restart_s, 0, 1e9);
  sc.plan.attention_kernel = plan.choice("attention_kernel", "engine", {"engine", "flash"});
  sc.plan.moe_routing = plan.choice("moe_routing", "uniform", {"uniform", "capacity"});
  sc.plan.bf16_rounding = plan.choice("bf16_rounding", "sum_first", {"sum_first", "local"});
  plan.finish();

  ObjectReader ck = o.object("checkpoint");
  sc.checkpoint.every = ck.integer("every", 0, 0, kBig);
  sc.checkpoint.keep = ck.integer("keep", 2, 1, 1000);
  if (!ck.is_null("restore_parallel")) {
    sc.checkpoint.restore_parallel =
        config_of(parse_parallel(ck.object("restore_parallel"), base), ck.at("restore_parallel"));
    check_config(*sc.checkpoint.restore_parallel, sc.model, sc.train, ck.at("restore_parallel"));
  } else {
    ck.raw("restore_parallel");
  }
  ck.finish();

  const nlohmann::json& drills = o.array("drills");
  static const std::vector<std::string> known = {
      "restore_same",    "restore_resharded",   "missing_shard", "corrupt_shard",
      "truncated_shard", "crash_before_commit", "stale_marker",  "resume_exact"};
  for (std::size_t i = 0; i < drills.size(); ++i) {
    const std::string path = "$.drills[" + std::to_string(i) + "]";
    if (!drills[i].is_string() ||
        std::find(known.begin(), known.end(), drills[i].get<std::string>()) == known.end()) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      throw ScenarioError(path, "expected one of " + list + ", got " + describe_json(drills[i]));
    }
    sc.drills.push_back(drills[i].get<std::string>());
  }

  ObjectReader ex = o.object("expect");
  sc.expect_parity = ex.boolean("parity", true);
  if (!ex.is_null("fault"))
    sc.expect_fault = ex.choice(
        "fault", "",
        {"deadlock", "mismatch", "hang", "crash", "straggler", "nan", "corruption", "oom"});
  else
    ex.raw("fault");
  ex.finish();
  o.finish();
  check_faults_fire(sc);
  return sc;
}

namespace {
const JsonInput kScenarioInput{.file = "the scenario file", .noun = "a scenario"};
}  // namespace

Scenario load_scenario(const std::string& file) {
  return parse_scenario_text(read_input_file(file, kScenarioInput), file);
}

Scenario parse_scenario_text(std::string_view text, const std::string& origin_name) {
  const std::string origin = comm::printable(origin_name);  // a file name may hold anything
  const nlohmann::json j = parse_input_json(text, origin, kScenarioInput);
  try {
    return parse_scenario(j);
  } catch (const ScenarioError& e) {
    throw ScenarioError(origin + ": " + e.path(),
                        std::string(e.what()).substr(e.path().size() + 2));
  }
}

}  // namespace shardcheck::harness
