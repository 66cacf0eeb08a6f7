// Engine state <-> checkpoint (see checkpointing.hpp).
#include "harness/checkpointing.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>

#include "harness/build_info.hpp"
#include "reference/config.hpp"
#include "reference/model.hpp"

namespace shardcheck::harness {

namespace {

using nlohmann::json;

json rope_json(const ref::RopeConfig& r) {
  json j{{"theta", r.theta}, {"layout", ref::to_string(r.layout)}, {"scaling", nullptr}};
  if (r.scaling)
    j["scaling"] = {{"rope_type", "llama3"},
                    {"factor", r.scaling->factor},
                    {"low_freq_factor", r.scaling->low_freq_factor},
                    {"high_freq_factor", r.scaling->high_freq_factor},
                    {"original_max_position_embeddings", r.scaling->original_max_positions}};
  return j;
}

json optimizer_json(const Scenario& s) {
  const auto& o = s.train.optimizer;
  return {{"name", "adamw"},
          {"lr", o.lr},
          {"beta1", o.beta1},
          {"beta2", o.beta2},
          {"eps", o.eps},
          {"weight_decay", o.weight_decay},
          {"clip_grad_norm", s.train.clip_grad_norm}};
}

json lr_schedule_json(const Scenario& s, std::uint64_t step) {
  const auto& o = s.train.optimizer;
  return {{"step", step},
          {"total_steps", s.train.steps},
          {"lr", o.lr},
          {"warmup", o.warmup},
          {"min_lr", o.min_lr}};
}

json sampler_json(const ref::SamplerState& st) {
  return {{"epoch", st.epoch},
          {"offset", st.offset},
          {"steps", st.steps},
          {"padded", st.padded},
          {"drop_last", st.drop_last}};
}

[[noreturn]] void refuse(const std::string& what,
                         checkpoint::Reason why = checkpoint::Reason::bad_manifest,
                         const std::string& tensor = {}) {
  throw checkpoint::RestoreError(why, what, "", tensor);
}

// A value as a message shows it (a JSON null reads as "null", a missing one as "absent").
std::string shown(const json* v) {
  return v ? v->dump() : "absent";
}

// The scenario's JSON path of a manifest field compared against it.
std::string scenario_path(const std::string& manifest_path) {
  static const std::pair<const char*, const char*> kRenamed[] = {
      {"$.training.precision", "$.train.precision"},
      {"$.training.global_batch", "$.train.global_batch"},
      {"$.training.micro_batch", "$.train.micro_batch"},
      {"$.training.steps", "$.train.steps"},
      {"$.optimizer.name", "(AdamW, the only optimizer)"},
      {"$.optimizer.beta1", "$.train.optimizer.betas[0]"},
      {"$.optimizer.beta2", "$.train.optimizer.betas[1]"},
      {"$.optimizer.clip_grad_norm", "$.train.clip_grad_norm"},
      {"$.lr_schedule.total_steps", "$.train.steps"},
      {"$.lr_schedule.step", "the checkpoint's own $.step"}};
  for (const auto& [from, to] : kRenamed)
    if (manifest_path == from) return to;
  for (const auto& [prefix, to] : {std::pair<std::string, std::string>{"$.training.", "$."},
                                   {"$.optimizer.", "$.train.optimizer."},
                                   {"$.lr_schedule.", "$.train.optimizer."}})
    if (manifest_path.starts_with(prefix)) return to + manifest_path.substr(prefix.size());
  return manifest_path;
}

// The checkpoint's section `got` equals the run's `want`, key by key: a field absent from the
// checkpoint (one written before it was recorded), one this version does not record, or a
// different value is refused naming its JSON path in the manifest and both values.
void same(const json* got, const json& want, const std::string& path) {
  if (want.is_object() && got && got->is_object()) {
    for (const auto& [key, value] : want.items()) {
      const auto it = got->find(key);
      same(it == got->end() ? nullptr : &*it, value, path + "." + key);
    }
    for (const auto& [key, value] : got->items())
      if (!want.contains(key))
        refuse(path + "." + key + " is " + value.dump() +
               " in the checkpoint, a field this version does not record: another recipe");
    return;
  }
  if (got && *got == want) return;  // numbers by value: 0 and 0.0 are the same
  const std::string where = scenario_path(path);
  refuse(path + " is " + shown(got) + " in the checkpoint, " + want.dump() + " in this run (" +
         where + ")" +
         (got ? ": a checkpoint of another recipe"
              : ": a checkpoint written before it was recorded cannot be checked"));
}

std::string number_text(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

// The manifest's optimizer and LR schedule values are within what a scenario accepts (the same
// bounds as harness/scenario.cpp; NaN and infinities never are), checked before they are compared
// so that a hostile value is named as such.
void check_ranges(const checkpoint::RunState& st) {
  struct Bound {
    const json* section;
    const char* path;
    const char* key;
    double lo, hi;
    bool integer, hi_open;
  };
  const Bound bounds[] = {
      {&st.optimizer, "$.optimizer", "lr", 0.0, 10.0, false, false},
      {&st.optimizer, "$.optimizer", "beta1", 0.0, 1.0, false, true},
      {&st.optimizer, "$.optimizer", "beta2", 0.0, 1.0, false, true},
      {&st.optimizer, "$.optimizer", "eps", 1e-30, 1.0, false, false},
      {&st.optimizer, "$.optimizer", "weight_decay", 0.0, 10.0, false, false},
      {&st.optimizer, "$.optimizer", "clip_grad_norm", 0.0, 1e12, false, false},
      {&st.lr_schedule, "$.lr_schedule", "lr", 0.0, 10.0, false, false},
      {&st.lr_schedule, "$.lr_schedule", "min_lr", 0.0, 10.0, false, false},
      {&st.lr_schedule, "$.lr_schedule", "total_steps", 1, 10000000, true, false},
      {&st.lr_schedule, "$.lr_schedule", "warmup", 0, 10000000, true, false},
      {&st.training, "$.training", "steps", 1, 10000000, true, false}};
  for (const Bound& b : bounds) {
    if (!b.section->is_object() || !b.section->contains(b.key)) continue;  // same() names it
    const json& v = b.section->at(b.key);
    const std::string path = std::string(b.path) + "." + b.key;
    const std::string range =
        "[" + number_text(b.lo) + ", " + number_text(b.hi) + (b.hi_open ? ")" : "]");
    if (!v.is_number() || (b.integer && !v.is_number_integer()))
      refuse(path + " is " + v.dump() + ", expected " + (b.integer ? "an integer" : "a number") +
             " in " + range);
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < b.lo || x > b.hi || (b.hi_open && x == b.hi))
      refuse(path + " is " + v.dump() + ", outside " + range + " (what a scenario accepts)");
  }
  const auto& s = st.lr_schedule;
  if (s.is_object() && s.contains("min_lr") && s.contains("lr") &&
      s.at("min_lr").get<double>() > s.at("lr").get<double>())
    refuse("$.lr_schedule.min_lr is " + s.at("min_lr").dump() + ", above $.lr_schedule.lr " +
           s.at("lr").dump());
  if (s.is_object() && s.contains("warmup") && s.contains("total_steps") &&
      s.at("warmup").get<double>() > s.at("total_steps").get<double>())
    refuse("$.lr_schedule.warmup is " + s.at("warmup").dump() +
           ", past $.lr_schedule.total_steps " + s.at("total_steps").dump());
}

// The manifest's sampler.<key>: an integer in [lo, hi].
std::int64_t sampler_int(const json& j, const char* key, std::int64_t lo, std::int64_t hi) {
  const std::string field = std::string("$.sampler.") + key;
  if (!j.contains(key)) refuse(field + " is missing");
  const json& v = j.at(key);
  if (!v.is_number_integer()) refuse(field + " is " + v.dump() + ", expected an integer");
  // JSON's non-negative integers parse as unsigned: both bounds apply to either form.
  const bool fits = v.is_number_unsigned()
                        ? v.get<std::uint64_t>() <= static_cast<std::uint64_t>(hi) &&
                              (lo <= 0 || v.get<std::uint64_t>() >= static_cast<std::uint64_t>(lo))
                        : v.get<std::int64_t>() >= lo && v.get<std::int64_t>() <= hi;
  if (!fits)
    refuse(field + " is " + v.dump() + ", expected " + std::to_string(lo) + ".." +
           std::to_string(hi));
  return v.get<std::int64_t>();
}

std::string shape_text(const checkpoint::Shape& shape) {
  return json(shape).dump();
}

}  // namespace

// What must match between the saving and the restoring run, whatever the mesh: everything that
// changes the trajectory besides the optimizer and the LR schedule (their own sections). Not in it:
// activation recomputation (the same bits by design) and the mesh (resharding is the point).
json run_identity(const Scenario& s) {
  const ref::ModelConfig& m = s.model;
  json model{{"vocab", m.vocab},
             {"hidden", m.hidden},
             {"layers", m.layers},
             {"heads", m.heads},
             {"kv_heads", m.kv_heads},
             {"ffn", m.ffn},
             {"mlp", ref::to_string(m.mlp)},
             {"rope", rope_json(m.rope)},
             {"seq_len", m.seq_len},
             {"tie_embeddings", m.tie_embeddings},
             {"dropout", m.dropout},
             {"moe", nullptr}};
  if (m.moe)
    model["moe"] = {{"experts", m.moe->experts},
                    {"top_k", m.moe->top_k},
                    {"capacity_factor", m.moe->capacity_factor},
                    {"every", m.moe->every},
                    {"aux_loss", m.moe->aux_loss}};
  const ref::DataConfig& d = s.data;
  return {{"model", model},
          {"precision", ref::to_string(s.train.precision)},
          {"seed", s.seed},
          {"global_batch", s.train.global_batch},
          // Microbatches are accumulated in order (and rounded each in the bf16 recipe).
          {"micro_batch", s.train.micro_batch},
          {"steps", s.train.steps},
          {"data",
           {{"documents", d.documents},
            {"min_len", d.min_len},
            {"max_len", d.max_len},
            {"packing", d.packing},
            {"drop_last", d.drop_last}}}};
}

TrainCursor resume_cursor(const checkpoint::RunState& st, const Scenario& s,
                          std::int64_t dataset_samples) {
  check_ranges(st);
  same(&st.training, run_identity(s), "$.training");
  same(&st.optimizer, optimizer_json(s), "$.optimizer");
  same(&st.lr_schedule, lr_schedule_json(s, st.step), "$.lr_schedule");
  const auto steps = static_cast<std::uint64_t>(s.train.steps);
  if (st.step > steps)
    refuse("$.step " + std::to_string(st.step) + " is past the scenario's train.steps " +
           std::to_string(steps));
  const auto batch = static_cast<std::uint64_t>(s.train.global_batch);
  if (st.consumed_samples != st.step * batch)
    refuse("$.consumed_samples " + std::to_string(st.consumed_samples) + " is not step " +
           std::to_string(st.step) + " x global_batch " + std::to_string(batch));
  if (st.consumed_tokens > st.consumed_samples * static_cast<std::uint64_t>(s.model.seq_len))
    refuse("$.consumed_tokens " + std::to_string(st.consumed_tokens) + " exceeds " +
           std::to_string(st.consumed_samples) + " samples of seq_len " +
           std::to_string(s.model.seq_len));
  const json& j = st.sampler;
  if (!j.is_object()) refuse("$.sampler is " + j.dump() + ", expected an object");
  TrainCursor c;
  c.step = static_cast<int>(st.step);
  c.consumed_samples = static_cast<std::int64_t>(st.consumed_samples);
  c.consumed_tokens = static_cast<std::int64_t>(st.consumed_tokens);
  const std::int64_t k = c.step, b = s.train.global_batch;
  ref::SamplerState& sp = c.sampler;
  if (!j.contains("drop_last") || !j.at("drop_last").is_boolean())
    refuse("$.sampler.drop_last is missing or not a boolean");
  sp.drop_last = j.at("drop_last").get<bool>();
  if (sp.drop_last != s.data.drop_last)
    refuse(std::string("$.sampler.drop_last is ") + (sp.drop_last ? "true" : "false") +
           ", the scenario's data.drop_last is " + (s.data.drop_last ? "true" : "false"));
  // One global batch per step; an epoch begins at most once per batch; the offset lies inside
  // the epoch's permutation (past its end by less than a batch when the remainder is padded).
  sp.steps = sampler_int(j, "steps", k, k);
  sp.epoch = sampler_int(j, "epoch", 0, k);
  sp.offset = sampler_int(j, "offset", 0, dataset_samples + (sp.drop_last ? 0 : b));
  sp.padded = sampler_int(j, "padded", 0, k * b);
  return c;
}

std::vector<NeededTensor> needed_tensors(const Scenario& s) {
  // As MeshOptimizer::import_pieces reads them: the working parameters (the f32 masters in the
  // bf16 recipe, whose bf16 working copy is rounded from them), both moments in the master dtype,
  // and the two step counters.
  const ref::Precision p = s.train.precision;
  const comm::DType master = p == ref::Precision::kF64 ? comm::DType::f64 : comm::DType::f32;
  const std::string weights = p == ref::Precision::kBf16 ? "master/" : "param/";
  std::vector<NeededTensor> out;
  for (const auto& [name, shape] : ref::param_shapes(s.model)) {
    checkpoint::Shape dims;
    for (const auto d : shape) dims.push_back(static_cast<std::uint64_t>(d));
    for (const std::string& kind : {weights, std::string("exp_avg/"), std::string("exp_avg_sq/")})
      out.push_back({kind + name, master, dims});
  }
  out.push_back({"train/step", comm::DType::i64, {}});
  out.push_back({"optimizer/step", comm::DType::i64, {}});
  return out;
}

void check_tensors(const checkpoint::Manifest& m, const Scenario& s) {
  for (const NeededTensor& need : needed_tensors(s)) {
    const checkpoint::TensorRecord* t = checkpoint::find_tensor(m, need.name);
    const std::string wanted =
        std::string(comm::name_of(need.dtype)) + " of shape " + shape_text(need.shape);
    if (!t)
      refuse("$.tensors lacks '" + need.name + "' (" + wanted + "), which this run's engine reads",
             checkpoint::Reason::incomplete_coverage, need.name);
    if (t->dtype != need.dtype || t->shape != need.shape)
      refuse("$.tensors holds it as " + std::string(comm::name_of(t->dtype)) + " of shape " +
                 shape_text(t->shape) + ", this run's engine reads " + wanted,
             checkpoint::Reason::bad_tensor, need.name);
  }
}

ResumePoint open_resume(const std::filesystem::path& dir, const Scenario& s,
                        std::int64_t dataset_samples) {
  std::vector<checkpoint::StepDir> steps = checkpoint::list_steps(dir);
  std::erase_if(steps, [](const checkpoint::StepDir& d) { return !d.committed; });
  if (steps.empty())
    throw checkpoint::RestoreError(checkpoint::Reason::no_checkpoint,
                                   "no committed step-N in " + dir.string());
  const auto usable = [&](const std::filesystem::path& step_dir) {
    checkpoint::Checkpoint ck = checkpoint::Checkpoint::open(step_dir);
    const TrainCursor from = resume_cursor(ck.manifest().state, s, dataset_samples);
    check_tensors(ck.manifest(), s);
    return ResumePoint{std::move(ck), from};
  };
  try {
    return usable(steps.back().path);
  } catch (const checkpoint::RestoreError& e) {
    // The newest older checkpoint that passes the same checks, offered but never taken.
    std::string previous;
    for (auto it = steps.rbegin() + 1; it != steps.rend() && previous.empty(); ++it) {
      try {
        usable(it->path);
        previous = it->path.string();
      } catch (const checkpoint::RestoreError&) {
      }
    }
    throw checkpoint::RestoreError(
        checkpoint::RestoreError(e.reason(),
                                 steps.back().path.filename().string() + ": " + e.detail(),
                                 e.file(), e.tensor()),
        previous);
  }
}

std::filesystem::path config_checkpoint_dir(const Scenario& s, const ParallelSpec& p,
                                            const std::filesystem::path& dir) {
  return s.configs.size() == 1 ? dir : dir / p.label();
}

checkpoint::SaveResult save_training(comm::Communicator& world, const parallel::MeshEngine& engine,
                                     const Scenario& s, const ParallelSpec& p,
                                     const TrainCursor& cursor, const std::filesystem::path& dir,
                                     const checkpoint::SaveOptions& opts) {
  const std::vector<parallel::StatePiece> pieces = engine.export_state();
  checkpoint::SaveRequest req;
  req.dir = dir;
  checkpoint::RunState& st = req.state;
  st.step = static_cast<std::uint64_t>(cursor.step);
  st.consumed_samples = static_cast<std::uint64_t>(cursor.consumed_samples);
  st.consumed_tokens = static_cast<std::uint64_t>(cursor.consumed_tokens);
  // The vocabulary padding is a layout of the saving mesh, as the axes are: the tensors hold the
  // logical [V, h] rows, so a restore onto another tp pads anew.
  st.mesh = {{"dp", p.mesh.dp},
             {"tp", p.mesh.tp},
             {"pp", p.mesh.pp},
             {"cp", p.mesh.cp},
             {"ep", p.mesh.ep},
             {"config", p.label()},
             {"vocab",
              {{"logical", s.model.vocab},
               {"padded", s.model.padded_vocab(p.mesh.tp)},
               {"pad_multiple", s.model.vocab_pad_multiple}}}};
  st.order = p.order;
  st.code_version = code_version();
  st.code_commit = code_commit();
  st.data_cursor = {{"consumed_samples", cursor.consumed_samples}, {"step", cursor.step}};
  st.sampler = sampler_json(cursor.sampler);
  st.lr_schedule = lr_schedule_json(s, st.step);
  st.optimizer = optimizer_json(s);
  st.training = run_identity(s);
  st.model = st.training.at("model");
  // Randomness is counter-based, keyed by (seed, stream, global index, step): the step and seed
  // are the whole RNG state of every rank.
  req.rank_state = {{"rng", "counter-based (seed, stream, index, step)"},
                    {"seed", s.seed},
                    {"step", cursor.step},
                    {"rank", world.rank()}};
  for (const parallel::StatePiece& piece : pieces) {
    checkpoint::ShardPiece sp;
    sp.tensor = piece.tensor;
    for (auto d : piece.shape) sp.shape.push_back(static_cast<std::uint64_t>(d));
    sp.dtype = piece.dtype;
    sp.slice = checkpoint::FlatRange{piece.begin, piece.count};
    sp.bytes = std::span<const std::byte>(piece.bytes);
    req.pieces.push_back(std::move(sp));
  }
  return checkpoint::save(world, req, opts);
}

TrainCursor restore_training(comm::Communicator& world, parallel::MeshEngine& engine,
                             const Scenario& s, std::int64_t dataset_samples,
                             const std::filesystem::path& step_dir) {
  const checkpoint::Checkpoint ck = checkpoint::Checkpoint::open_collective(world, step_dir);
  const TrainCursor c = resume_cursor(ck.manifest().state, s, dataset_samples);
  check_tensors(ck.manifest(), s);
  engine.import_state([&](const std::string& tensor, comm::DType dtype, std::size_t begin,
                          std::size_t count, std::span<std::byte> out) {
    const checkpoint::TensorRecord& t = ck.tensor(tensor);
    if (t.dtype != dtype)
      throw checkpoint::RestoreError(checkpoint::Reason::bad_tensor,
                                     "stored as " + std::string(comm::name_of(t.dtype)) +
                                         ", the engine needs " + std::string(comm::name_of(dtype)) +
                                         " (another precision recipe)",
                                     "", tensor);
    ck.read(tensor, checkpoint::FlatRange{begin, count}, out);
  });
  return c;
}

}  // namespace shardcheck::harness
