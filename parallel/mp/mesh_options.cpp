// Between a ParallelConfig (parallel/config.hpp) and the engine's MeshOptions: mesh_options builds
// the options of a configuration, data_parallel_of reads their data-parallel part back as the
// configuration's variant, and data_parallel_rules takes the step's rules from it.
#include <numeric>

#include "parallel/mp/mesh_engine.hpp"

namespace shardcheck::parallel {

MeshOptions mesh_options(const ParallelConfig& c, int ranks_per_node) {
  MeshOptions o;
  o.shape = c.mesh;
  o.order = c.order;
  o.sequence_parallel = c.sequence_parallel;
  o.schedule = c.pp_schedule;
  o.virtual_stages = c.virtual_stages;
  o.cp_algo = c.cp_algo;
  o.zero = c.zero_given();
  o.bucket_elems = c.bucket_elems();
  if (const Ddp* d = c.ddp()) o.overlap = d->overlap;
  if (const Fsdp* f = c.fsdp()) {
    FsdpOptions resolved = *f;
    if (resolved.shard_group_size <= 0)
      resolved.shard_group_size = std::gcd(c.mesh.dp, ranks_per_node);
    o.fsdp = resolved;
  }
  return o;
}

DataParallel data_parallel_of(const MeshOptions& o) {
  if (o.fsdp) return *o.fsdp;
  if (o.zero != 0) return Zero{.stage = o.zero, .bucket_elems = o.bucket_elems};
  return Ddp{.bucket_elems = o.bucket_elems, .overlap = o.overlap};
}

DataParallelRules data_parallel_rules(const MeshOptions& o) {
  ParallelConfig c;
  c.data = data_parallel_of(o);
  DataParallelRules r;
  r.fsdp = o.fsdp.value_or(FsdpOptions{.prefetch = 0});
  r.no_shard = c.no_shard();
  r.zero = c.zero_stage();
  r.hybrid_shard = c.hybrid();
  r.keep_after_forward = c.keeps_params_after_forward();
  r.ddp_overlap = o.overlap && r.zero <= 1 && !r.no_shard;
  return r;
}

}  // namespace shardcheck::parallel
