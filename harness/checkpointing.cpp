// Engine state <-> checkpoint (see checkpointing.hpp).
#include "harness/checkpointing.hpp"

#include <cstring>
#include <nlohmann/json.hpp>

#include "harness/build_info.hpp"
#include "reference/config.hpp"

namespace shardcheck::harness {

namespace {

// What must match between the saving and the restoring run, whatever the mesh.
nlohmann::json identity(const Scenario& s) {
  const ref::ModelConfig& m = s.model;
  nlohmann::json model{{"vocab", m.vocab},       {"hidden", m.hidden},
                       {"layers", m.layers},     {"heads", m.heads},
                       {"kv_heads", m.kv_heads}, {"ffn", m.ffn},
                       {"seq_len", m.seq_len},   {"tie_embeddings", m.tie_embeddings}};
  if (m.moe)
    model["moe"] = {{"experts", m.moe->experts},
                    {"top_k", m.moe->top_k},
                    {"capacity_factor", m.moe->capacity_factor},
                    {"every", m.moe->every}};
  return {{"model", model},
          {"precision", ref::to_string(s.train.precision)},
          {"seed", s.seed},
          {"global_batch", s.train.global_batch},
          {"steps", s.train.steps}};
}

nlohmann::json sampler_json(const ref::SamplerState& st) {
  return {{"epoch", st.epoch},
          {"offset", st.offset},
          {"steps", st.steps},
          {"padded", st.padded},
          {"drop_last", st.drop_last}};
}

[[noreturn]] void refuse(const std::string& what) {
  throw checkpoint::RestoreError(checkpoint::Reason::bad_manifest, what, "manifest.json");
}

// The manifest's sampler.<key>: an integer in [lo, hi].
std::int64_t sampler_int(const nlohmann::json& j, const char* key, std::int64_t lo,
                         std::int64_t hi) {
  const std::string field = std::string("sampler.") + key;
  if (!j.contains(key)) refuse(field + " is missing");
  const nlohmann::json& v = j.at(key);
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

}  // namespace

TrainCursor resume_cursor(const checkpoint::RunState& st, const Scenario& s,
                          std::int64_t dataset_samples) {
  const nlohmann::json want = identity(s);
  for (const char* key : {"model", "precision", "seed", "global_batch"})
    if (!st.training.contains(key) || st.training.at(key) != want.at(key))
      refuse(std::string("the checkpoint's training.") + key + " " +
             (st.training.contains(key) ? st.training.at(key).dump() : "(absent)") +
             " differs from the scenario's " + want.at(key).dump());
  const auto steps = static_cast<std::uint64_t>(s.train.steps);
  if (st.step > steps)
    refuse("step " + std::to_string(st.step) + " is past the scenario's train.steps " +
           std::to_string(steps));
  const auto batch = static_cast<std::uint64_t>(s.train.global_batch);
  if (st.consumed_samples != st.step * batch)
    refuse("consumed_samples " + std::to_string(st.consumed_samples) + " is not step " +
           std::to_string(st.step) + " x global_batch " + std::to_string(batch));
  if (st.consumed_tokens > st.consumed_samples * static_cast<std::uint64_t>(s.model.seq_len))
    refuse("consumed_tokens " + std::to_string(st.consumed_tokens) + " exceeds " +
           std::to_string(st.consumed_samples) + " samples of seq_len " +
           std::to_string(s.model.seq_len));
  const nlohmann::json& j = st.sampler;
  if (!j.is_object()) refuse("sampler is " + j.dump() + ", expected an object");
  TrainCursor c;
  c.step = static_cast<int>(st.step);
  c.consumed_samples = static_cast<std::int64_t>(st.consumed_samples);
  c.consumed_tokens = static_cast<std::int64_t>(st.consumed_tokens);
  const std::int64_t k = c.step, b = s.train.global_batch;
  ref::SamplerState& sp = c.sampler;
  if (!j.contains("drop_last") || !j.at("drop_last").is_boolean())
    refuse("sampler.drop_last is missing or not a boolean");
  sp.drop_last = j.at("drop_last").get<bool>();
  if (sp.drop_last != s.data.drop_last)
    refuse(std::string("sampler.drop_last is ") + (sp.drop_last ? "true" : "false") +
           ", the scenario's data.drop_last is " + (s.data.drop_last ? "true" : "false"));
  // One global batch per step; an epoch begins at most once per batch; the offset lies inside
  // the epoch's permutation (past its end by less than a batch when the remainder is padded).
  sp.steps = sampler_int(j, "steps", k, k);
  sp.epoch = sampler_int(j, "epoch", 0, k);
  sp.offset = sampler_int(j, "offset", 0, dataset_samples + (sp.drop_last ? 0 : b));
  sp.padded = sampler_int(j, "padded", 0, k * b);
  return c;
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
  st.mesh = {{"dp", p.mesh.dp}, {"tp", p.mesh.tp}, {"pp", p.mesh.pp},
             {"cp", p.mesh.cp}, {"ep", p.mesh.ep}, {"config", p.label()}};
  st.order = p.order;
  st.code_version = code_version();
  st.code_commit = code_commit();
  st.data_cursor = {{"consumed_samples", cursor.consumed_samples}, {"step", cursor.step}};
  st.sampler = sampler_json(cursor.sampler);
  const auto& o = s.train.optimizer;
  st.lr_schedule = {{"step", cursor.step},
                    {"total_steps", s.train.steps},
                    {"lr", o.lr},
                    {"warmup", o.warmup},
                    {"min_lr", o.min_lr}};
  st.optimizer = {{"name", "adamw"},
                  {"lr", o.lr},
                  {"beta1", o.beta1},
                  {"beta2", o.beta2},
                  {"eps", o.eps},
                  {"weight_decay", o.weight_decay},
                  {"clip_grad_norm", s.train.clip_grad_norm}};
  st.training = identity(s);
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
