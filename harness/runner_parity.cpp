// The scenario runner's parity measurement and verdict, shared by every backend's path: the
// single-device reference run (always on the CPU: it is the oracle), the error per step against
// it, the rates of a measured step time, and the rules that turn them into a verdict.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "checkpoint/shard_file.hpp"
#include "files/dir.hpp"
#include "harness/output.hpp"
#include "harness/runner_detail.hpp"
#include "parallel/flops.hpp"
#include "parallel/mp/mesh_engine.hpp"
#include "parallel/parity.hpp"
#include "reference/bf16.hpp"
#include "reference/compute.hpp"
#include "reference/model.hpp"
#include "reference/noise.hpp"
#include "reference/npy.hpp"

namespace shardcheck::harness::detail {

namespace {

// Elements of the gathered parameters, assembled from every rank's exported state pieces (the
// master weights in the bf16 recipe, as ref::Trainer::params()). No collective, so parity
// checking leaves the timeline and the faults' op counts untouched.
ref::ParamMap<double> assemble(const std::vector<const std::vector<parallel::StatePiece>*>& ranks,
                               const ref::ModelConfig& model, bool bf16) {
  ref::ParamMap<double> out;
  for (const auto& [name, shape] : ref::param_shapes(model)) out.add(name, shape);
  const std::string prefix = bf16 ? "master/" : "param/";
  for (const auto* pieces : ranks)
    for (const parallel::StatePiece& piece : *pieces) {
      if (piece.tensor.rfind(prefix, 0) != 0) continue;
      ref::Tensor<double>* t = out.find(piece.tensor.substr(prefix.size()));
      if (t == nullptr || piece.begin + piece.count > t->vec().size()) continue;
      comm::visit_dtype(piece.dtype, [&](auto tag) {
        using E = decltype(tag);
        for (std::size_t i = 0; i < piece.count; ++i) {
          E v;
          std::memcpy(&v, piece.bytes.data() + i * sizeof(E), sizeof(E));
          if constexpr (std::is_arithmetic_v<E>)
            t->vec()[piece.begin + i] = static_cast<double>(v);
          else
            t->vec()[piece.begin + i] = static_cast<double>(static_cast<float>(v));
        }
      });
    }
  return out;
}

// The largest error of the pieces' elements against `want` (each relative to its tensor's largest
// magnitude in `want`, as tensor_rel_err; a piece that names no tensor of `want` or reads as no
// number is infinitely wrong), and the tensor it is in.
std::pair<double, std::string> held_err(const std::vector<parallel::StatePiece>& held,
                                        const ref::ParamMap<double>& want) {
  std::pair<double, std::string> worst{0.0, ""};
  std::map<std::string, double> scales;  // per tensor, once: a TP rank holds it as many row pieces
  for (const parallel::StatePiece& piece : held) {
    const std::string name = piece.tensor.substr(piece.tensor.find('/') + 1);
    const ref::Tensor<double>* w = want.find(name);
    double err = INFINITY;
    if (w != nullptr && piece.begin + piece.count <= w->vec().size()) {
      auto [it, fresh] = scales.try_emplace(name, 0.0);
      if (fresh)
        for (const double v : w->vec()) it->second = std::max(it->second, std::abs(v));
      double diff = INFINITY;
      comm::visit_dtype(piece.dtype, [&](auto tag) {
        using E = decltype(tag);
        if constexpr (std::is_arithmetic_v<E>) {
          diff = 0.0;
          for (std::size_t i = 0; i < piece.count; ++i) {
            E v;
            std::memcpy(&v, piece.bytes.data() + i * sizeof(E), sizeof(E));
            const double d = std::abs(static_cast<double>(v) - w->vec()[piece.begin + i]);
            diff = d == d ? std::max(diff, d) : INFINITY;
          }
        }
      });
      err = it->second > 0.0 ? diff / it->second : diff;
    }
    if (worst.second.empty() || !(err <= worst.first)) worst = {err, name};
  }
  return worst;
}

// The first copy of `digests` whose checksum is not that of the same elements of `want` in the
// copy's dtype (a copy that names no tensor of `want`, or holds no numbers, differs): error
// INFINITY there (the size of the difference is known only where the copy is kept whole), else 0.
std::pair<double, std::string> digest_err(const std::vector<HeldDigest>& digests,
                                          const ref::ParamMap<double>& want) {
  for (const HeldDigest& d : digests) {
    const std::string name = d.tensor.substr(d.tensor.find('/') + 1);
    const ref::Tensor<double>* w = want.find(name);
    bool same = false;
    if (w != nullptr && d.begin + d.count <= w->vec().size()) {
      comm::visit_dtype(d.dtype, [&](auto tag) {
        using E = decltype(tag);
        if constexpr (std::is_arithmetic_v<E>) {
          std::vector<E> v(d.count);
          for (std::size_t i = 0; i < d.count; ++i) v[i] = static_cast<E>(w->vec()[d.begin + i]);
          same = checkpoint::xxh3(std::as_bytes(std::span<const E>(v))) == d.hash;
        }
      });
    }
    if (!same) return {INFINITY, name};
  }
  return {0.0, digests.empty()
                   ? ""
                   : digests.front().tensor.substr(digests.front().tensor.find('/') + 1)};
}

// The reference's parameters as its forward reads them (bf16: the master rounded to bf16).
ref::ParamMap<double> working_of(const ref::ParamMap<double>& master, bool bf16) {
  ref::ParamMap<double> working = master;
  if (bf16)
    for (auto& e : working)
      for (double& v : e.value.vec()) v = ref::round_to_bf16(static_cast<float>(v));
  return working;
}

// The four step scalars of `got` against `want`, noted under Measure::scalars.
void note_scalars(StepErrors& se, const ref::StepRecord& g, const ref::StepRecord& w,
                  const std::string& who) {
  se.note(Measure::scalars, parallel::rel_err(g.loss, w.loss), who + "loss");
  se.note(Measure::scalars, parallel::rel_err(g.grad_norm, w.grad_norm),
          who + "grad norm (before clipping)");
  se.note(Measure::scalars, parallel::rel_err(g.clip_factor, w.clip_factor), who + "clip factor");
  se.note(Measure::scalars, parallel::rel_err(g.lr, w.lr), who + "learning rate");
}

// Every tensor of `got` against `want`, max-abs and norm-wise, under the measures given.
void note_params(StepErrors& se, const ref::ParamMap<double>& got,
                 const ref::ParamMap<double>& want, Measure max, Measure norm,
                 const std::string& who, const std::string& what) {
  // Norm-wise over the whole model: a tensor of a few elements is as noisy as its max-abs (one
  // near-zero gradient whose sign flips moves Adam's first update by 2 lr); a systematic error in
  // many elements moves the whole model's norm.
  for (const auto& e : want) {
    const ref::Tensor<double>* t = got.find(e.name);
    se.note(max, t ? parallel::tensor_rel_err(*t, e.value) : INFINITY, who + e.name + what);
  }
  std::string part;
  const double err = parallel::model_norm_err(got, want, &part);
  se.note(norm, err, who + "all parameters" + what + ", most in " + part);
}

Trace train_reference(const Scenario& s, const ref::Dataset& ds,
                      const ref::TensorDumper::Writer& dump, ref::Compute* compute,
                      TiedRounding tied) {
  const ref::ComputeScope scope(compute);
  ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                  s.seed, s.data.drop_last);
  ref::Trainer trainer(s.model, s.train, s.seed);
  std::optional<ref::TensorDumper> dumper;
  if (dump) {
    dumper.emplace(dump);
    trainer.set_observer(
        [&](const std::string& name, const ref::HostArray& a) { dumper->add(name, a); });
  }
  Trace t;
  for (int n = 1; n <= s.train.steps; ++n) {
    trainer.round_tied_uses_apart(tied.at(n));
    t.steps.push_back(trainer.step(ref::gather_batch(ds, sampler.next_global_batch())));
    t.moe_load.push_back(trainer.last_moe_load());
    t.params.push_back(trainer.params());
  }
  if (dumper) dumper->write_index();
  return t;
}

}  // namespace

// Tokens, FLOPs and MFU of a step. FLOPs = 3 x forward (parallel/flops.hpp: matmuls and attention
// products, backward 2x forward) over every position of the global batch, padding included as
// dense kernels compute it; recomputation under activation checkpointing is not counted.
GoodputResult goodput_of(const Trace& want, const RankTrace& rank0, double seconds) {
  GoodputResult g;
  for (std::size_t i = 0; i < rank0.steps.size(); ++i) {
    const auto k = static_cast<std::size_t>(rank0.first_step - 1) + i;  // into the reference
    if (k >= want.steps.size()) break;
    const auto tokens = static_cast<double>(want.steps[k].non_padding_tokens);
    g.tokens_processed += tokens;
    if (i < rank0.health.size() && rank0.health[i].skipped) g.tokens_skipped += tokens;
  }
  g.valid = g.tokens_processed > 0;
  g.tokens_good = g.tokens_processed - g.tokens_skipped - g.tokens_replayed - g.tokens_discarded;
  g.fraction = g.valid ? g.tokens_good / g.tokens_processed : 0.0;
  g.seconds = seconds;
  if (seconds > 0) {
    g.tokens_per_s = g.tokens_processed / seconds;
    g.good_tokens_per_s = g.tokens_good / seconds;
  }
  return g;
}

void fill_rates(const Scenario& s, const ParallelSpec& p, const Trace& want, TimingResult& t) {
  if (!t.valid || t.step_time_s <= 0) return;
  double tokens = 0;
  for (const auto& rec : want.steps) tokens += static_cast<double>(rec.non_padding_tokens);
  t.tokens_per_step = tokens / static_cast<double>(want.steps.size());
  t.tokens_per_s = t.tokens_per_step / t.step_time_s;
  t.flops_per_step = 3.0 * parallel::model_forward_flops(s.model, s.model.seq_len) *
                     static_cast<double>(s.train.global_batch);
  t.mfu = t.flops_per_step / (t.step_time_s * p.mesh.world_size() * s.topology.peak_tflops * 1e12);
}

// Writes the dump's files into `sub` below the --dump-tensors directory (files::Dir: nothing below
// it is followed if it is a symlink); an empty writer when there is no dump.
ref::TensorDumper::Writer dump_writer(const std::shared_ptr<files::Dir>& root,
                                      const std::filesystem::path& sub) {
  if (!root) return {};
  return [root, sub](const std::string& file, const std::string& bytes) {
    write_output_in(*root, sub / file, bytes, "--dump-tensors");
  };
}

Trace reference_run(const Scenario& s, const ref::Dataset& ds, const std::string& dump_dir,
                    TiedRounding tied) {
  std::shared_ptr<files::Dir> root;
  if (!dump_dir.empty()) root = std::make_shared<files::Dir>(files::Dir::open(dump_dir, true));
  Trace t = train_reference(s, ds, dump_writer(root, ""), nullptr, tied);  // the oracle, on the CPU
  t.tied = tied;
  t.noise = noise_floor(s, ds, t, dump_writer(root, "noise"));
  return t;
}

// The probe's errors against `want`, per step and measure.
std::vector<std::array<double, kMeasures>> probe_errors(const Trace& probe, const Trace& want) {
  std::vector<std::array<double, kMeasures>> out;
  for (std::size_t k = 0; k < want.steps.size(); ++k) {
    StepErrors se;
    note_scalars(se, probe.steps[k], want.steps[k], "");
    note_params(se, probe.params[k], want.params[k], Measure::master_max, Measure::master_norm, "",
                "");
    out.push_back(se.err);
  }
  return out;
}

NoiseFloor noise_floor(const Scenario& s, const ref::Dataset& ds, const Trace& want,
                       const ref::TensorDumper::Writer& dump) {
  NoiseFloor out;
  double n_params = 0;
  for (const auto& e : want.params.front()) n_params += static_cast<double>(e.value.numel());
  out.floor = noise_floors(s.train.precision, n_params);
  out.unit = out.floor[static_cast<std::size_t>(Measure::master_max)];
  ref::RoundingNoise noise(s.seed ^ 0x6e6f697365ULL);
  out.probe = probe_errors(train_reference(s, ds, dump, &noise, want.tied), want);
  return out;
}

ConfigResult config_row(const Scenario& s, const ParallelSpec& p) {
  ConfigResult r;
  r.config = p.label();
  r.spec = p;
  r.detail = unsupported(s, p);
  r.supported = r.detail.empty();
  return r;
}

// The verdict. With expect.fault set, the configuration passes when that fault was detected
// (parity is reported, not required: a fault may change the numbers on purpose). Without it, a
// detected fault that breaks runs (FaultResult::breaks_run) means exit 3; otherwise parity decides.
void decide(const Scenario& s, ConfigResult& r) {
  if (s.expect_fault) {
    const auto hit = std::find_if(r.faults.begin(), r.faults.end(), [&](const FaultResult& f) {
      return f.detected && f.kind == *s.expect_fault;
    });
    r.pass = hit != r.faults.end();
    if (r.pass) {
      r.detail = "expected fault '" + *s.expect_fault + "' detected (ranks " +
                 comm::rank_list(hit->ranks) + ")";
    } else {
      std::string seen;
      for (const auto& f : r.faults) seen += (seen.empty() ? "" : ", ") + f.kind;
      r.detail = "expected fault '" + *s.expect_fault + "' was not detected" +
                 (seen.empty() ? "" : " (found: " + seen + ")");
    }
    return;
  }
  for (const FaultResult& f : r.faults)
    if (f.detected && f.breaks_run) r.broke = true;
  r.pass = !r.broke && (r.parity_pass || !s.expect_parity);
}

std::vector<HeldDigest> digest_held(const std::vector<parallel::StatePiece>& held) {
  std::vector<HeldDigest> out;
  out.reserve(held.size());
  for (const parallel::StatePiece& p : held)
    out.push_back({p.tensor, p.dtype, p.begin, p.count, checkpoint::xxh3(p.bytes)});
  return out;
}

void note_compute(const std::vector<RankTrace>& got, ConfigResult& r) {
  r.compute = got.empty() ? "" : "cpu";
  r.device_ops = 0;
  for (const RankTrace& t : got) {
    if (t.compute != "cpu" && r.compute == "cpu") r.compute = t.compute;
    r.device_ops += t.device_ops;
  }
}

void measure_parity(const Scenario& s, const Trace& want, const std::vector<RankTrace>& got,
                    ConfigResult& r) {
  const NoiseFloor& noise = want.noise;
  const bool bf16 = s.train.precision == ref::Precision::kBf16;
  const bool device = !r.compute.empty() && r.compute != "cpu";
  double worst = -1;                         // the largest error / bound of the run
  std::array<double, kMeasures> worst_of{};  // ... of each measure
  worst_of.fill(-1);
  // Judges one step's errors against their bounds: the step's record shows its worst measure.
  const auto judge = [&](int step, const StepErrors& se, StepParity& sp) {
    double step_worst = -1;
    for (int m = 0; m < kMeasures; ++m) {
      const auto i = static_cast<std::size_t>(m);
      if (se.where[i].empty()) continue;  // not measured at this step
      const double b = noise.bound(step, static_cast<Measure>(m), device);
      const double ratio = se.err[i] == 0.0 ? 0.0 : se.err[i] / b;
      const double q = ratio == ratio ? ratio : INFINITY;
      if (q > worst_of[i]) {
        worst_of[i] = q;
        r.measures[i] = {se.err[i], b, "step " + std::to_string(step) + " " + se.where[i]};
      }
      if (q > step_worst) {
        step_worst = q;
        sp.max_rel_err = se.err[i];
        sp.bound = b;
        sp.measure = measure_name(static_cast<Measure>(m));
      }
      if (q > worst) {
        worst = q;
        r.max_rel_err = se.err[i];
        r.tolerance = b;
        r.measure = measure_name(static_cast<Measure>(m));
        r.detail = "largest error for its bound: step " + std::to_string(step) + " " + se.where[i] +
                   " (" + measure_name(static_cast<Measure>(m)) + ")";
      }
    }
  };
  std::vector<const std::vector<parallel::StatePiece>*> pieces(got.size());
  const int first = got[0].first_step;
  for (int k = first - 1; k < s.train.steps; ++k) {
    const auto uk = static_cast<std::size_t>(k);              // into the reference trace
    const auto ug = static_cast<std::size_t>(k - first + 1);  // into the ranks' traces
    StepParity sp{k + 1, got[0].steps[ug].loss, want.steps[uk].loss, 0, 0, ""};
    StepErrors se;
    // The step's scalars on every rank: the loss, and what the update was made of (a gradient
    // off by a constant factor barely moves AdamW's parameters under clipping; its norm shows it).
    for (std::size_t rank = 0; rank < got.size(); ++rank) {
      const std::string who = "rank " + std::to_string(rank) + " ";
      note_scalars(se, got[rank].steps[ug], want.steps[uk], who);
      // The reference never skips an update (its gradients are finite): a skipped step is wrong.
      if (ug < got[rank].health.size() && got[rank].health[ug].skipped)
        se.note(Measure::scalars, INFINITY, who + "skipped-step flag (the reference updated)");
      pieces[rank] = &got[rank].pieces[ug];
    }
    const ref::ParamMap<double> owners = assemble(pieces, s.model, bf16);
    note_params(se, owners, want.params[uk], Measure::master_max, Measure::master_norm, "",
                " (owner shards)");
    if (k + 1 < s.train.steps && ug < got[0].held_digests.size()) {
      // every copy each rank computes with against its owner master (bf16: as the forward reads
      // it), by checksum: a replica that stops updating is caught at the step it goes stale
      const ref::ParamMap<double> working = working_of(owners, bf16);
      for (std::size_t rank = 0; rank < got.size(); ++rank) {
        const auto [e, name] = digest_err(got[rank].held_digests[ug], working);
        se.note(Measure::replicas, e,
                "rank " + std::to_string(rank) + " " + name +
                    (e == 0.0 ? " (the rank's own copy, checksum)"
                              : " (the rank's own copy: its checksum differs from the owner's)"));
      }
    }
    if (k + 1 == s.train.steps) {  // every rank's own view of the final parameters
      for (std::size_t rank = 0; rank < got.size(); ++rank)
        note_params(se, got[rank].final_params, want.params[uk], Measure::master_max,
                    Measure::master_norm, "rank " + std::to_string(rank) + " ",
                    " (gathered by the rank)");
      // ... and every copy each rank computes with (TP, kv, tied and DP replicas) against the
      // owner master it derives from (bf16: rounded as the forward reads it): exactly equal.
      const ref::ParamMap<double> working = working_of(owners, bf16);
      for (std::size_t rank = 0; rank < got.size(); ++rank) {
        const auto [e, name] = held_err(got[rank].held, working);
        se.note(Measure::replicas, e,
                "rank " + std::to_string(rank) + " " + name + " (the rank's own copy)");
      }
    }
    judge(k + 1, se, sp);
    r.steps.push_back(sp);
  }
  if (first > s.train.steps && first > 1) {
    // Resumed after the last step: nothing left to train, so check that the restored parameters
    // (every rank's gathered view) are the reference's after that step.
    const auto uk = static_cast<std::size_t>(first - 2);
    StepParity sp{first - 1, NAN, want.steps[uk].loss, 0, 0, ""};
    StepErrors se;
    for (std::size_t rank = 0; rank < got.size(); ++rank) {
      note_params(se, got[rank].final_params, want.params[uk], Measure::master_max,
                  Measure::master_norm, "rank " + std::to_string(rank) + " ",
                  " (gathered by the rank)");
      // every copy the restored rank would compute with, against its own restored master
      const auto [e, name] = held_err(got[rank].held, working_of(got[rank].final_params, bf16));
      se.note(Measure::replicas, e,
              "rank " + std::to_string(rank) + " " + name + " (the rank's own copy)");
    }
    judge(first - 1, se, sp);
    r.steps.push_back(sp);
    r.detail = "resumed after the last step: restored parameters checked (" + r.detail + ")";
  }
  // Exact (error 0): an infinite margin; an error over a bound of 0, an infinite error, or not a
  // number: 0.
  r.margin = r.max_rel_err == 0.0 ? INFINITY
             : r.max_rel_err > 0.0 && r.max_rel_err < INFINITY && r.tolerance > 0.0
                 ? r.tolerance / r.max_rel_err
                 : 0.0;
  r.parity_pass = worst <= 1.0;
}

// The health check's verdict (the same on every rank): the first step with non-finite gradients.
std::optional<FaultResult> nan_result(const RankTrace& rank0) {
  for (std::size_t k = 0; k < rank0.health.size(); ++k) {
    const parallel::StepHealth& h = rank0.health[k];
    if (h.nonfinite_ranks.empty()) continue;
    FaultResult f;
    f.kind = "nan";
    f.ranks = h.nonfinite_ranks;
    f.step = static_cast<int>(k) + 1;
    f.message = "non-finite gradient at step " + std::to_string(k + 1) + " on rank(s) " +
                comm::rank_list(h.nonfinite_ranks) +
                (h.skipped ? "; every rank skipped the update of that step" : "");
    return f;
  }
  return std::nullopt;
}

}  // namespace shardcheck::harness::detail
