// ParallelConfig's derived properties, its label and validate(): the one place each rule about a
// parallel configuration on its own is written (config.hpp).
#include "parallel/config.hpp"

#include <sstream>
#include <type_traits>

namespace shardcheck::parallel {

namespace {

std::string num(int64_t v) {
  return std::to_string(v);
}

}  // namespace

std::string_view name_of(PipeSchedule s) {
  switch (s) {
    case PipeSchedule::gpipe:
      return "gpipe";
    case PipeSchedule::one_f_one_b:
      return "1f1b";
    case PipeSchedule::interleaved:
      return "interleaved";
  }
  return "?";
}

std::string_view name_of(CpAlgo a) {
  switch (a) {
    case CpAlgo::ring:
      return "ring";
    case CpAlgo::ulysses:
      return "ulysses";
  }
  return "?";
}

int ParallelConfig::zero_stage() const {
  if (const Zero* z = zero()) return z->stage;
  if (fsdp()) return no_shard() ? 0 : 3;
  return 0;
}

bool ParallelConfig::shards_params() const {
  return zero_stage() == 3;
}

bool ParallelConfig::no_shard() const {
  return fsdp() && fsdp()->sharding == ShardingStrategy::no_shard;
}

bool ParallelConfig::hybrid() const {
  return fsdp() && fsdp()->sharding == ShardingStrategy::hybrid_shard;
}

bool ParallelConfig::keeps_params_after_forward() const {
  const Fsdp* f = fsdp();
  return f && (f->sharding == ShardingStrategy::shard_grad_op || !f->reshard_after_forward);
}

std::size_t ParallelConfig::bucket_elems() const {
  if (const Zero* z = zero()) return z->bucket_elems;
  if (const Ddp* d = ddp()) return d->bucket_elems;
  return Ddp{}.bucket_elems;
}

std::string ParallelConfig::strategy_name() const {
  if (fsdp()) return "fsdp";
  const int z = zero_given();
  return z == 0 ? "ddp" : "zero" + num(z);
}

std::string ParallelConfig::data_parallel_words() const {
  if (const Fsdp* f = fsdp()) return "fsdp " + std::string(name_of(f->sharding));
  return "zero " + num(zero_given());
}

std::string ParallelConfig::label() const {
  std::string s;
  for (comm::Axis a : comm::kAllAxes)
    if (mesh.size(a) > 1)
      s += (s.empty() ? "" : "-") + std::string(comm::name_of(a)) + num(mesh.size(a));
  if (s.empty()) s = "single";
  if (zero_given() > 0) s += "-zero" + num(zero_given());
  if (const Fsdp* f = fsdp()) {
    s += "-fsdp_" + std::string(name_of(f->sharding));
    if (f->wrap == WrapPolicy::layer_group) s += "-wrap" + num(f->blocks_per_unit);
    if (f->wrap == WrapPolicy::whole_model) s += "-wrapall";
    if (!f->reshard_after_forward) s += "-noreshard";
    if (f->prefetch != 1) s += "-pf" + num(f->prefetch);
    if (hybrid() && f->shard_group_size > 0) s += "-sg" + num(f->shard_group_size);
  }
  if (sequence_parallel) s += "-sp";
  if (mesh.pp > 1 || virtual_stages > 1)
    s += "-" + std::string(name_of(pp_schedule)) +
         (virtual_stages > 1 ? "x" + num(virtual_stages) : "");
  if (mesh.cp > 1) s += "-" + std::string(name_of(cp_algo));
  // An order that lays the ranks out otherwise than the default: "-order_pp_tp_dp" (its axes
  // of size > 1, fastest first).
  const auto laid = [&](const std::string& o) {
    std::string out;
    std::stringstream in(comm::DeviceMesh(mesh, o).order_string());
    for (std::string axis; std::getline(in, axis, '-');)
      for (comm::Axis a : comm::kAllAxes)
        if (comm::name_of(a) == axis && mesh.size(a) > 1) out += "_" + axis;
    return out;
  };
  try {
    const std::string mine = laid(order);
    if (mine != laid(std::string(kDefaultOrder))) s += "-order" + mine;
  } catch (const comm::MeshError&) {  // an invalid mesh or order: validation names it
  }
  return s;
}

std::optional<ConfigError> validate(const ParallelConfig& c) {
  const comm::MeshShape& s = c.mesh;
  for (const comm::Axis a : comm::kAllAxes) {
    const std::string axis(comm::name_of(a));
    if (s.size(a) < 1) return ConfigError{axis, axis + " must be >= 1"};
  }
  if (s.world_size64() > comm::kMaxWorldSize)
    return ConfigError{"world_size", "world size dp*tp*pp*cp = " + num(s.world_size64()) +
                                         " is over the ceiling of " + num(comm::kMaxWorldSize) +
                                         " ranks"};
  if (s.ep > 1 && (static_cast<int64_t>(s.dp) * s.cp) % s.ep != 0)
    return ConfigError{"ep", "ep " + num(s.ep) + " does not divide dp*cp (" + num(s.dp) + "*" +
                                 num(s.cp) +
                                 "): the expert-parallel ranks are carved out of the data- and "
                                 "context-parallel ranks (world = dp*tp*pp*cp), so {\"dp\": 8, "
                                 "\"ep\": 4} is 8 ranks"};
  try {
    const comm::DeviceMesh mesh(s, c.order);
  } catch (const comm::MeshError& e) {
    return ConfigError{"order", e.what()};
  }
  if (const Zero* z = c.zero(); z && (z->stage < 1 || z->stage > 3))
    return ConfigError{"zero", "zero " + num(z->stage) + " is not a ZeRO stage (0..3)"};
  if (const Fsdp* f = c.fsdp()) {
    if (f->sharding == ShardingStrategy::no_shard && c.model_parallel())
      return ConfigError{
          "fsdp", "fsdp \"no_shard\" is built only on a data-parallel mesh (tp = pp = cp = ep = 1)",
          /*not_built=*/true};
    if (f->prefetch < 0 || f->prefetch > 2)
      return ConfigError{"fsdp.prefetch",
                         "fsdp.prefetch " + num(f->prefetch) + " is not 0, 1 or 2"};
    if (f->wrap == WrapPolicy::layer_group && f->blocks_per_unit < 1)
      return ConfigError{"fsdp.blocks_per_unit",
                         "fsdp.blocks_per_unit " + num(f->blocks_per_unit) + " must be >= 1"};
    if (f->sharding == ShardingStrategy::hybrid_shard) {
      const int sg = f->shard_group_size;  // 0: ranks per node, resolved by mesh_options
      if (sg < 0 || (sg > 0 && s.dp % sg != 0))
        return ConfigError{
            "fsdp.shard_group_size",
            "shard_group_size " + num(sg) + " must be >= 1 and divide dp (" + num(s.dp) + ")"};
    }
  }
  if (c.virtual_stages < 1) return ConfigError{"virtual_stages", "virtual_stages must be >= 1"};
  if (c.virtual_stages != 1 && c.pp_schedule != PipeSchedule::interleaved)
    return ConfigError{"virtual_stages", "virtual_stages " + num(c.virtual_stages) +
                                             " needs pp_schedule \"interleaved\""};
  if (c.pp_schedule == PipeSchedule::interleaved && c.virtual_stages < 2)
    return ConfigError{"virtual_stages", "the interleaved schedule needs virtual_stages >= 2"};
  return std::nullopt;
}

}  // namespace shardcheck::parallel
