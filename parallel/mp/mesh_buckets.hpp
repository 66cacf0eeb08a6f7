// DDP overlap's gradient buckets on the mesh engine (PyTorch DDP's and Megatron's buckets, issued
// during the last microbatch's backward), written once for the engine (mesh_chunks.cpp) and the
// planner's timing-only run (mesh_timing.cpp). Gradients join the open bucket as the
// backward completes them (mesh_walk.hpp), in the rank's parameter order, once per step; those
// that need another sum first are left to the step's end (sync_gradients: the tied embedding
// under a pipeline, SP's TP-replicated parameters, kv heads replicated over TP ranks). The bucket
// goes once it holds bucket_elems elements, or at the end of a chunk's backward (flush).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "parallel/mp/mesh_params.hpp"

namespace shardcheck::parallel::mesh_detail {

class BucketFill {
 public:
  struct Rule {
    bool tied_across_stages = false;  // a tied embedding with pp > 1
    bool sequence_parallel = false;   // SP with tp > 1
    std::size_t bucket_elems = 0;
  };
  BucketFill() = default;
  explicit BucketFill(Rule rule) : rule_(rule) {}

  // A step's start on a rank holding `params` parameters: nothing bucketed yet.
  void clear(std::size_t params) {
    bucketed_.assign(params, false);
    bucket_.clear();
    fill_ = 0;
  }

  // The picked gradients of the rank's parameters (specs, as at clear) join the open bucket.
  // Returns the bucket (indices into specs, in order) when it goes, and a new one opens; else
  // nothing (empty).
  template <class Pick>
  std::vector<std::size_t> add(const std::vector<LocalParam>& specs, const Pick& pick, bool flush) {
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const LocalParam& p = specs[i];
      if (bucketed_[i] || !pick(p)) continue;
      bucketed_[i] = true;
      if (!alone(p)) continue;
      bucket_.push_back(i);
      fill_ += static_cast<std::size_t>(ref::numel_of(p.local_shape));
    }
    if (bucket_.empty() || (!flush && fill_ < rule_.bucket_elems)) return {};
    fill_ = 0;
    return std::exchange(bucket_, {});
  }

 private:
  // Summed only over its class's group (no other sum first).
  bool alone(const LocalParam& p) const {
    if (p.name == "embed.weight" && rule_.tied_across_stages) return false;
    return !(p.tp_replicated && rule_.sequence_parallel) && p.kv_replicas == 1;
  }

  Rule rule_;
  std::vector<bool> bucketed_;
  std::vector<std::size_t> bucket_;
  std::size_t fill_ = 0;
};

}  // namespace shardcheck::parallel::mesh_detail
