// validate_mesh: every divisibility rule of the mesh, with the field and the numbers named.
#include <algorithm>
#include <string>

#include "parallel/mp/mesh_engine.hpp"
#include "parallel/mp/tokens.hpp"

namespace shardcheck::parallel {
namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw MeshConfigError(what);
}
std::string n(int64_t v) {
  return std::to_string(v);
}

}  // namespace

void validate_mesh(const ref::ModelConfig& m, const ref::TrainConfig& t, const MeshOptions& o) {
  const comm::MeshShape& s = o.shape;
  for (const comm::Axis a : comm::kAllAxes) {
    require(s.size(a) >= 1, std::string(comm::name_of(a)) + " must be >= 1");
  }
  require(m.heads % s.tp == 0, "model.heads " + n(m.heads) + " is not divisible by tp " + n(s.tp));
  require(m.kv_heads % s.tp == 0 || s.tp % m.kv_heads == 0,
          "model.kv_heads " + n(m.kv_heads) + " and tp " + n(s.tp) +
              " must divide one another (kv heads split over TP, or each replicated on "
              "tp / kv_heads ranks)");
  require(m.ffn % s.tp == 0, "model.ffn " + n(m.ffn) + " is not divisible by tp " + n(s.tp));
  require(m.vocab % s.tp == 0, "model.vocab " + n(m.vocab) + " is not divisible by tp " + n(s.tp) +
                                   " (vocab-parallel embedding and LM head)");
  if (s.ep > 1) {
    require(m.moe.has_value(), "ep " + n(s.ep) + " needs an MoE model (model.moe)");
    require((s.dp * s.cp) % s.ep == 0,
            "ep " + n(s.ep) + " must divide dp x cp (" + n(s.dp) + " x " + n(s.cp) +
                "): the expert-parallel ranks are carved out of the data- and context-parallel "
                "ranks (world = dp x tp x pp x cp)");
    require(m.moe->experts % s.ep == 0,
            "model.moe.experts " + n(m.moe->experts) + " is not divisible by ep " + n(s.ep));
  }
  require(o.zero >= 0 && o.zero <= 3, "zero " + n(o.zero) + " is not a ZeRO stage (0..3)");
  if (o.fsdp) {
    const FsdpOptions& f = *o.fsdp;
    require(f.sharding != ShardingStrategy::no_shard ||
                (s.tp == 1 && s.pp == 1 && s.cp == 1 && s.ep == 1),
            "fsdp \"no_shard\" is built only on a data-parallel mesh (tp = pp = cp = ep = 1)");
    require(o.zero == 0 || (o.zero == 3 && f.sharding != ShardingStrategy::no_shard),
            "fsdp \"" + std::string(name_of(f.sharding)) +
                "\" sets the sharding itself, but zero " + n(o.zero) + " was also asked for");
    require(f.prefetch >= 0 && f.prefetch <= 2,
            "fsdp.prefetch " + n(f.prefetch) + " is not 0, 1 or 2");
    require(f.wrap != WrapPolicy::layer_group || f.blocks_per_unit >= 1,
            "fsdp.blocks_per_unit " + n(f.blocks_per_unit) + " must be >= 1");
    if (f.sharding == ShardingStrategy::hybrid_shard) {
      const int sg = f.shard_group_size;
      require(sg >= 1 && s.dp % sg == 0,
              "fsdp.shard_group_size " + n(sg) + " must be >= 1 and divide dp " + n(s.dp));
    }
  }
  require(o.virtual_stages >= 1, "virtual_stages must be >= 1");
  require(o.virtual_stages == 1 || o.schedule == PipeSchedule::interleaved,
          "virtual_stages " + n(o.virtual_stages) + " needs pp_schedule \"interleaved\"");
  require(m.layers >= s.pp * o.virtual_stages,
          "model.layers " + n(m.layers) + " is fewer than the pipeline's " +
              n(s.pp * o.virtual_stages) + " (virtual) stages");
  try {
    const TokenLayout layout(m.seq_len, s.cp, s.tp, o.sequence_parallel);
  } catch (const LayoutError& e) {
    throw MeshConfigError(std::string("model.seq_len: ") + e.what());
  }
  if (o.cp_algo == CpAlgo::ulysses && s.cp > 1) {
    const int hl = m.heads / s.tp, kvl = std::max(1, m.kv_heads / s.tp);  // replicated kv: 1
    require(hl % s.cp == 0 && kvl % s.cp == 0, "cp_algo \"ulysses\" needs the heads per TP rank (" +
                                                   n(hl) + " query, " + n(kvl) +
                                                   " kv) divisible by cp " + n(s.cp));
  }
  const int64_t data = s.dp;
  require(t.global_batch % data == 0,
          "train.global_batch " + n(t.global_batch) + " is not divisible by dp " + n(data));
  const int64_t local = t.global_batch / data;
  require(local % t.micro_batch == 0, "train.micro_batch " + n(t.micro_batch) +
                                          " does not divide the " + n(local) +
                                          " sequences per data-parallel rank");
  const int64_t microbatches = local / t.micro_batch;
  if (s.pp > 1) {
    require(microbatches >= s.pp, "pipeline: " + n(microbatches) +
                                      " microbatches per step are fewer than pp " + n(s.pp) +
                                      " stages (raise train.global_batch or lower micro_batch)");
  }
  if (o.schedule == PipeSchedule::interleaved && s.pp > 1) {
    require(microbatches % s.pp == 0, "interleaved pipeline: " + n(microbatches) +
                                          " microbatches are not a multiple of pp " + n(s.pp));
  }
}

}  // namespace shardcheck::parallel
