// validate_mesh: every rule a parallel configuration must meet against the model and the batch,
// written once (its rules on its own: parallel/config.cpp's validate). The scenario loader (with
// the JSON path of field()), the engine, the ledger and the CLI's "not built" rows all call it.
// Each message names the value and what it must divide.
#include <algorithm>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/mesh.hpp"
#include "parallel/mp/mesh_engine.hpp"
#include "parallel/mp/tokens.hpp"

namespace shardcheck::parallel {
namespace {

std::string n(int64_t v) {
  return std::to_string(v);
}

struct Rules {
  void operator()(bool ok, const char* field, const std::string& what) const {
    if (!ok) throw MeshConfigError(field, what);
  }
};

}  // namespace

void validate_mesh(const ref::ModelConfig& m, const ref::TrainConfig& t, const MeshOptions& o) {
  const Rules require;
  const comm::MeshShape& s = o.shape;
  // The configuration's own rules (parallel/config.hpp), then the options' zero beside fsdp, then
  // the model's and the batch's.
  ParallelConfig c;
  c.mesh = o.shape;
  c.order = o.order;
  c.data = data_parallel_of(o);
  c.sequence_parallel = o.sequence_parallel;
  c.pp_schedule = o.schedule;
  c.virtual_stages = o.virtual_stages;
  c.cp_algo = o.cp_algo;
  if (const std::optional<ConfigError> e = validate(c))
    throw MeshConfigError(e->field, e->what, e->not_built);
  require(o.zero >= 0 && o.zero <= 3, "zero", "zero " + n(o.zero) + " is not a ZeRO stage (0..3)");
  if (o.fsdp)
    require(o.zero == 0 || (o.zero == 3 && o.fsdp->sharding != ShardingStrategy::no_shard), "fsdp",
            "choose either zero (stage " + n(o.zero) + ") or fsdp (\"" +
                std::string(name_of(o.fsdp->sharding)) + "\"), not both");
  // Options carry the shard group resolved (mesh_options): 0 is no longer "ranks per node".
  if (o.fsdp && o.fsdp->sharding == ShardingStrategy::hybrid_shard)
    require(o.fsdp->shard_group_size >= 1, "fsdp.shard_group_size",
            "shard_group_size " + n(o.fsdp->shard_group_size) + " must be >= 1 and divide dp (" +
                n(s.dp) + ")");
  require(m.heads % s.tp == 0, "tp",
          "tp " + n(s.tp) + " does not divide model.heads (" + n(m.heads) + ")");
  require(m.kv_heads % s.tp == 0 || s.tp % m.kv_heads == 0, "tp",
          "tp " + n(s.tp) + " and model.kv_heads (" + n(m.kv_heads) +
              ") must divide one another (kv heads split over TP, or each replicated on "
              "tp / kv_heads ranks)");
  require(m.ffn % s.tp == 0, "tp",
          "tp " + n(s.tp) + " does not divide model.ffn (" + n(m.ffn) + ")");
  // A vocabulary tp does not divide is padded (ModelConfig::padded_vocab); token ids stay int32.
  require(m.padded_vocab(s.tp) <= std::numeric_limits<int32_t>::max(), "tp",
          "model.vocab (" + n(m.vocab) + ") padded to a multiple of tp " + n(s.tp) +
              " x model.vocab_pad_multiple (" + n(m.vocab_pad_multiple) +
              ") exceeds 2^31 - 1 rows");
  if (s.ep > 1) {
    require(m.moe.has_value(), "ep", "ep = " + n(s.ep) + " needs a model with moe experts");
    require(m.moe->experts % s.ep == 0, "ep",
            "ep " + n(s.ep) + " does not divide model.moe.experts (" + n(m.moe->experts) + ")");
  }
  try {
    const comm::DeviceMesh mesh(s, o.order);
    // The bf16 recipe rounds an expert's gradient once per data rank (mesh_bf16.hpp): the ranks
    // holding an expert must split the data ranks into groups of equal sets (the EP groups of an
    // expert-DP group read the same data ranks, or none of one another's). Checked on one TP/PP
    // slice (the others repeat it), for the meshes small enough to run.
    if (t.precision == ref::Precision::kBf16 && m.moe && s.ep > 1 && s.dp * s.cp <= 4096) {
      // The data ranks an EP group reads, by world rank: the slice's ranks, each EP group once.
      std::map<int, std::shared_ptr<const std::vector<int>>> read_by;
      const auto data_ranks = [&](int rank) -> const std::vector<int>& {
        std::shared_ptr<const std::vector<int>>& slot = read_by[rank];
        if (slot) return *slot;
        const std::vector<int> group = mesh.group(rank, comm::Axis::ep);
        std::vector<int> d;
        for (int r : group) d.push_back(mesh.coord(r, comm::Axis::dp));
        std::sort(d.begin(), d.end());
        d.erase(std::unique(d.begin(), d.end()), d.end());
        auto shared = std::make_shared<const std::vector<int>>(std::move(d));
        for (int r : group) read_by[r] = shared;
        return *shared;
      };
      for (int r : mesh.group(0, std::vector<comm::Axis>{comm::Axis::ep, comm::Axis::edp})) {
        const std::vector<int>& mine = data_ranks(r);
        for (int other : mesh.group(r, comm::Axis::edp)) {
          const std::vector<int>& theirs = data_ranks(other);
          std::vector<int> both;
          std::set_intersection(mine.begin(), mine.end(), theirs.begin(), theirs.end(),
                                std::back_inserter(both));
          if (!both.empty() && theirs != mine)
            throw MeshConfigError(
                "ep",
                "in the bf16 recipe the EP groups of ranks " + n(r) + " and " + n(other) +
                    " read overlapping but different data ranks (cp " + n(s.cp) + ", ep " +
                    n(s.ep) + ", order " + o.order +
                    "), so an expert's gradient of one data rank would be rounded in two pieces "
                    "(not built); make ep a multiple of cp, or let the order put ep over dp",
                /*not_built=*/true);
        }
      }
    }
  } catch (const comm::MeshError& e) {  // validate() named an invalid order already
    require(false, "order", e.what());
  }
  require(m.layers >= s.pp * o.virtual_stages, "pp",
          "model.layers (" + n(m.layers) + ") is fewer than the pipeline stages (pp " + n(s.pp) +
              " x virtual_stages " + n(o.virtual_stages) + ")");
  try {
    const TokenLayout layout(m.seq_len, s.cp, s.tp, o.sequence_parallel);
  } catch (const LayoutError& e) {
    bool plain = true;  // does the layout fit without sequence parallelism?
    try {
      const TokenLayout without(m.seq_len, s.cp, s.tp, false);
    } catch (const LayoutError&) {
      plain = false;
    }
    require(false, plain ? "sequence_parallel" : "cp", std::string("model.seq_len: ") + e.what());
  }
  if (o.cp_algo == CpAlgo::ulysses && s.cp > 1) {
    const int hl = m.heads / s.tp, kvl = std::max(1, m.kv_heads / s.tp);  // replicated kv: 1
    require(hl % s.cp == 0 && kvl % s.cp == 0, "cp_algo",
            "cp_algo \"ulysses\" needs the heads per TP rank (" + n(hl) + " query, " + n(kvl) +
                " kv) divisible by cp (" + n(s.cp) + ")");
  }
  const int64_t per_step = static_cast<int64_t>(s.dp) * t.micro_batch;
  require(t.global_batch % per_step == 0, "dp",
          "train.global_batch (" + n(t.global_batch) + ") is not divisible by dp*micro_batch (" +
              n(per_step) + ")");
  const int64_t microbatches = t.global_batch / per_step;
  require(s.pp == 1 || microbatches >= s.pp, "pp",
          n(microbatches) + " microbatches per step (global_batch / (dp*micro_batch)) are fewer " +
              "than the " + n(s.pp) + " pipeline stages");
  require(s.pp == 1 || o.schedule != PipeSchedule::interleaved || microbatches % s.pp == 0, "pp",
          "the interleaved schedule needs the " + n(microbatches) +
              " microbatches per step to be a multiple of pp (" + n(s.pp) + ")");
}

}  // namespace shardcheck::parallel
