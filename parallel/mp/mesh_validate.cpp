// validate_mesh: every rule a parallel configuration must meet against the model and the batch,
// written once. The scenario loader (with the JSON path of field()), the engine, the ledger and
// the CLI's "not built" rows all call it. Each message names the value and what it must divide.
#include <algorithm>
#include <iterator>
#include <map>
#include <memory>
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
  for (const comm::Axis a : comm::kAllAxes) {
    const std::string axis(comm::name_of(a));
    require(s.size(a) >= 1, axis.c_str(), axis + " must be >= 1");
  }
  require(s.world_size64() <= comm::kMaxWorldSize, "world_size",
          "world size dp*tp*pp*cp = " + n(s.world_size64()) + " is over the ceiling of " +
              n(comm::kMaxWorldSize) + " ranks");
  require(m.heads % s.tp == 0, "tp",
          "tp " + n(s.tp) + " does not divide model.heads (" + n(m.heads) + ")");
  require(m.kv_heads % s.tp == 0 || s.tp % m.kv_heads == 0, "tp",
          "tp " + n(s.tp) + " and model.kv_heads (" + n(m.kv_heads) +
              ") must divide one another (kv heads split over TP, or each replicated on "
              "tp / kv_heads ranks)");
  require(m.ffn % s.tp == 0, "tp",
          "tp " + n(s.tp) + " does not divide model.ffn (" + n(m.ffn) + ")");
  require(m.vocab % s.tp == 0, "tp",
          "tp " + n(s.tp) + " does not divide model.vocab (" + n(m.vocab) +
              ") for the vocab-parallel embedding and LM head");
  if (s.ep > 1) {
    require(m.moe.has_value(), "ep", "ep = " + n(s.ep) + " needs a model with moe experts");
    require(m.moe->experts % s.ep == 0, "ep",
            "ep " + n(s.ep) + " does not divide model.moe.experts (" + n(m.moe->experts) + ")");
    require((s.dp * s.cp) % s.ep == 0, "ep",
            "ep " + n(s.ep) + " does not divide dp*cp (" + n(s.dp) + "*" + n(s.cp) +
                "): the expert-parallel ranks are carved out of the data- and context-parallel "
                "ranks (world = dp*tp*pp*cp), so {\"dp\": 8, \"ep\": 4} is 8 ranks");
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
  } catch (const comm::MeshError& e) {
    require(false, "order", e.what());
  }
  require(o.zero >= 0 && o.zero <= 3, "zero", "zero " + n(o.zero) + " is not a ZeRO stage (0..3)");
  if (o.fsdp) {
    const FsdpOptions& f = *o.fsdp;
    if (f.sharding == ShardingStrategy::no_shard && (s.tp > 1 || s.pp > 1 || s.cp > 1 || s.ep > 1))
      throw MeshConfigError(
          "fsdp", "fsdp \"no_shard\" is built only on a data-parallel mesh (tp = pp = cp = ep = 1)",
          /*not_built=*/true);
    require(o.zero == 0 || (o.zero == 3 && f.sharding != ShardingStrategy::no_shard), "fsdp",
            "choose either zero (stage " + n(o.zero) + ") or fsdp (\"" +
                std::string(name_of(f.sharding)) + "\"), not both");
    require(f.prefetch >= 0 && f.prefetch <= 2, "fsdp.prefetch",
            "fsdp.prefetch " + n(f.prefetch) + " is not 0, 1 or 2");
    require(f.wrap != WrapPolicy::layer_group || f.blocks_per_unit >= 1, "fsdp.blocks_per_unit",
            "fsdp.blocks_per_unit " + n(f.blocks_per_unit) + " must be >= 1");
    if (f.sharding == ShardingStrategy::hybrid_shard) {
      const int sg = f.shard_group_size;
      require(sg >= 1 && s.dp % sg == 0, "fsdp.shard_group_size",
              "shard_group_size " + n(sg) + " must be >= 1 and divide dp (" + n(s.dp) + ")");
    }
  }
  require(o.virtual_stages >= 1, "virtual_stages", "virtual_stages must be >= 1");
  require(o.virtual_stages == 1 || o.schedule == PipeSchedule::interleaved, "virtual_stages",
          "virtual_stages " + n(o.virtual_stages) + " needs pp_schedule \"interleaved\"");
  require(o.schedule != PipeSchedule::interleaved || o.virtual_stages >= 2, "virtual_stages",
          "the interleaved schedule needs virtual_stages >= 2");
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
