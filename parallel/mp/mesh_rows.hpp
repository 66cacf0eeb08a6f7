// Internal to the mesh engine (mesh_impl.hpp): hybrid shard's group colours (the splits are
// mesh_groups.hpp's), a gradient sum over a group, checkpoint scalars, the row movers between a
// microbatch and its sequences, and what a pipeline chunk keeps from forward to backward.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/memory.hpp"
#include "comm/mesh.hpp"
#include "parallel/mp/mesh_params.hpp"
#include "parallel/mp/tp_block.hpp"
#include "parallel/state.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::parallel::mesh_detail {

using ref::Tensor;

// The name of the TP ranks sharing one replicated kv head (split from the tp group).
inline constexpr const char* kTpKvGroup = "tp-kv";

// hybrid_shard over a parameter class's gradient-sum group (the ranks along `axes`, the first
// fastest): each rank's position in it is cut into shard groups of `s` consecutive positions and
// replica groups (the same position modulo s), as torchtitan's dp_shard x dp_replicate. Dense:
// axes {cp, dp} and s = shard_group_size * cp (each shard group holds every CP rank); experts:
// axes {edp}.
struct HybridColors {
  int shard = 0, replicas = 0;  // split colours of world rank `rank`
};
inline HybridColors hybrid_colors(const comm::DeviceMesh& mesh, const std::vector<comm::Axis>& axes,
                                  int s, int rank) {
  const int base = mesh.group_index(rank, axes);
  int pos = 0, n = 1;
  for (comm::Axis a : axes) {
    pos += mesh.coord(rank, a) * n;
    n *= mesh.size(a);
  }
  return {base * (n / s) + pos / s, base * s + pos % s};
}
struct HybridGroups {
  std::unique_ptr<comm::Communicator> shard, replicas;
};
// The picked parameters' gradients summed over group, in one all_reduce (specs order).
template <class T, class Pick>
void all_reduce_picked(const std::vector<LocalParam>& specs, comm::Communicator& group,
                       const Pick& pick, ref::ParamMap<T>& grads, comm::ReduceOptions op = {}) {
  if (group.size() == 1) return;
  std::vector<T> flat;
  for (const LocalParam& p : specs) {
    if (!pick(p)) continue;
    const auto& v = grads[p.name].vec();
    flat.insert(flat.end(), v.begin(), v.end());
  }
  if (flat.empty()) return;
  group.all_reduce(std::span<T>(flat), op)->wait();
  std::size_t at = 0;
  for (const LocalParam& p : specs) {
    if (!pick(p)) continue;
    auto& v = grads[p.name].vec();
    std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(at), v.size(), v.begin());
    at += v.size();
  }
}

// A predicate over the rank's parameters that captures nothing (the sums' orders below and
// mesh_bf16.hpp's).
using ParamPick = bool (*)(const LocalParam&);

// The sums a class's reduction needs first, in order: under SP (sp_tp non-null) the
// TP-replicated parameters' partial gradients over TP, then the kv heads replicated over TP ranks
// over those ranks (kv non-null). At the step's end (sync_gradients) and before a ZeRO-3 buffer's
// reduce_scatter; written once for the engine and the planner's timing-only run, which run them
// as ops.sum(group, pick) (a null group sums nothing).
template <class Ops>
void replica_sums(comm::Communicator* sp_tp, comm::Communicator* kv, Ops&& ops) {
  ops.sum(sp_tp, [](const LocalParam& p) { return p.tp_replicated; });
  ops.sum(kv, [](const LocalParam& p) { return p.kv_replicas > 1; });
}

// FSDP no_shard: each microbatch's gradient summed after its backward, the dense parameters over
// the dense group (dp x cp), then the experts' over the expert group (edp).
template <class Ops>
void no_shard_sums(comm::Communicator* dense, comm::Communicator* expert, Ops&& ops) {
  ops.sum(dense, [](const LocalParam& p) { return !p.expert; });
  ops.sum(expert, [](const LocalParam& p) { return p.expert; });
}

// The tied embedding's gradient between the first and the last stage (sync_tied_embedding): the
// stage this one exchanges its copy with, -1 for none (one stage, untied, or no copy here).
inline int tied_embedding_peer(const ref::ModelConfig& m, const StagePlan& plan, int stages) {
  if (stages == 1 || !m.tie_embeddings || !(plan.has_embed || plan.has_head)) return -1;
  return plan.has_embed ? stages - 1 : 0;
}
// Sends this stage's copy to the peer (tag 7) and receives the peer's.
inline void exchange_tied_embedding(comm::Communicator& pp, int peer, comm::ConstBuffer mine,
                                    comm::Buffer theirs) {
  comm::WorkPtr s = pp.send(mine, peer, {.tag = 7});
  pp.recv(theirs, peer, {.tag = 7})->wait();
  s->wait();
}

// A checkpoint scalar ("train/step", "optimizer/step").
inline StatePiece scalar_piece(const std::string& name, int64_t v) {
  StatePiece p{name, {}, comm::DType::i64, 0, 1, std::vector<std::byte>(sizeof(int64_t))};
  std::memcpy(p.bytes.data(), &v, sizeof v);
  return p;
}

template <class T>
std::vector<Tensor<T>> split_rows(const Tensor<T>& x, int parts) {
  std::vector<Tensor<T>> out;
  const int64_t c = x.shape().back();
  const int64_t n = x.numel() / c / parts;
  for (int i = 0; i < parts; ++i) {
    Tensor<T> t({n, c});
    std::copy_n(x.data() + i * n * c, n * c, t.data());
    out.push_back(std::move(t));
  }
  return out;
}

template <class T>
Tensor<T> concat_rows(const std::vector<Tensor<T>>& xs) {
  const int64_t c = xs.front().shape().back();
  int64_t n = 0;
  for (const auto& x : xs) n += x.numel() / c;
  Tensor<T> out({n, c});
  int64_t at = 0;
  for (const auto& x : xs) {
    std::copy_n(x.data(), x.numel(), out.data() + at);
    at += x.numel();
  }
  return out;
}

template <class T>
struct ChunkCache {
  std::vector<std::vector<MpBlockCache<T>>> blocks;  // [sequence][layer - first]
  std::vector<MpHeadCache<T>> heads;
  comm::TrackedBytes held;  // activations, from the chunk's forward to its backward
};

}  // namespace shardcheck::parallel::mesh_detail
