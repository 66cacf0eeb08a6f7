// Internal to the mesh engine (mesh_chunks.cpp): the bf16 recipe's microbatch rounding on a mesh,
// which must round the same sums the reference rounds (ref::Trainer: each microbatch's whole
// gradient once, then summed in f32), and the expert-gradient parts that makes possible under EP.
#pragma once

#include <algorithm>
#include <iterator>
#include <memory>
#include <set>
#include <type_traits>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/mesh.hpp"
#include "parallel/mp/mesh_params.hpp"
#include "parallel/mp/mesh_rows.hpp"
#include "reference/bf16.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::parallel::mesh_detail {

// An expert's microbatch gradient on an EP rank sums the tokens of every EP peer, and the peers
// read different data ranks' microbatches, which the reference rounds apart. So the expert
// backward keeps one gradient per data rank of its EP group (a "part", ep_moe_backward's
// part_of_source); the ranks holding the same experts for the same data ranks (in the edp group:
// the CP ranks left out of the EP group) form `group`, over which each part is summed before it
// is rounded. Built for the bf16 recipe of a model with MoE layers.
struct ExpertParts {
  std::vector<int> part_of_source;  // per EP rank; empty where all peers read one data rank
  int parts = 1;
  std::unique_ptr<comm::Communicator> group;
};

// The data ranks `rank`'s EP group reads (its members' dp coordinates).
inline std::set<int> ep_data_ranks(const comm::DeviceMesh& mesh, int rank) {
  std::set<int> d;
  for (int m : mesh.group(rank, comm::Axis::ep)) d.insert(mesh.coord(m, comm::Axis::dp));
  return d;
}

// How many expert-gradient parts `rank` keeps in the bf16 recipe: 0 where its EP peers read one
// data rank (the gradients stay whole), else one per data rank.
inline int expert_part_count(const comm::DeviceMesh& mesh, int rank) {
  const auto n = static_cast<int>(ep_data_ranks(mesh, rank).size());
  return n > 1 ? n : 0;
}

// The expert-parts group of `rank`, as a split color: the expert-data-parallel ranks whose EP
// groups read the same data ranks as its own (one EP rank: its CP group), named by the first.
inline int expert_parts_color(const comm::DeviceMesh& mesh, int rank) {
  const std::set<int> mine = ep_data_ranks(mesh, rank);
  for (int m : mesh.group(rank, comm::Axis::edp))
    if (ep_data_ranks(mesh, m) == mine) return m;
  return rank;
}

// World rank r's parts, its group made by a split with expert_parts_color (mesh_groups.hpp).
inline ExpertParts expert_parts(const comm::DeviceMesh& mesh, int r,
                                std::unique_ptr<comm::Communicator> group) {
  using comm::Axis;
  const std::set<int> mine = ep_data_ranks(mesh, r);
  ExpertParts x;
  x.parts = static_cast<int>(mine.size());
  if (x.parts > 1)
    for (int m : mesh.group(r, Axis::ep))
      x.part_of_source.push_back(
          static_cast<int>(std::distance(mine.begin(), mine.find(mesh.coord(m, Axis::dp)))));
  x.group = std::move(group);
  return x;
}

// The summed picked gradients carried by the group's rank 0 alone (zero elsewhere), so a later
// sum over a group holding them adds them once.
template <class T, class Pick>
void carry_once(const std::vector<LocalParam>& specs, comm::Communicator& g, const Pick& pick,
                ref::ParamMap<T>& grads) {
  all_reduce_picked(specs, g, pick, grads);
  if (g.rank() != 0)
    for (const LocalParam& p : specs)
      if (pick(p)) grads[p.name].fill(T{0});
}

// The bf16 recipe rounds each microbatch's whole gradient once (ref::Trainer). Row partials of
// CP ranks (and under SP, tp non-null, of TP ranks for TP-replicated parameters; and of the TP
// ranks sharing a replicated kv head) are summed first, and one copy carries the sum; rounding
// the partials instead would differ from the reference by far more than rounding noise where
// they cancel. Expert gradients (experts: null without MoE) are summed over the expert-parts
// group and, under SP, over TP, then rounded, once per part (`parts` of them, at least 1).
// The order, written once for the engine (round_microbatch_gradient) and the planner's
// timing-only run: ops.sum(group, pick) for each sum (pick: a ParamPick) (a null group or one of
// one rank sums nothing), ops.round(false) after the dense sums, and per part ops.part(k), its
// sums, ops.round(true).
template <class Ops>
void microbatch_presums(comm::Communicator* cp, comm::Communicator* kv, comm::Communicator* tp,
                        comm::Communicator* experts, int parts, Ops&& ops) {
  const ParamPick dense = [](const LocalParam& p) { return !p.expert; };
  const ParamPick expert = [](const LocalParam& p) { return p.expert; };
  ops.sum(cp, dense);
  ops.sum(kv, [](const LocalParam& p) { return p.kv_replicas > 1; });
  ops.sum(tp, [](const LocalParam& p) { return p.tp_replicated && !p.expert; });
  ops.round(false);
  if (experts == nullptr) return;
  for (int k = 0; k < std::max(1, parts); ++k) {
    ops.part(k);
    ops.sum(experts, expert);
    ops.sum(tp, expert);
    ops.round(true);
  }
}

// The engine's: the parts' sums are added into grads and the parts left zero. `specs` may be any
// subset of the rank's parameters (ZeRO-3: one flat buffer's, mesh_grad_units.hpp): only those
// are touched, and every rank of each group passes the same subset.
template <class T>
void round_microbatch_gradient(const std::vector<LocalParam>& specs, comm::Communicator& cp,
                               comm::Communicator* kv, comm::Communicator* tp,
                               ref::ParamMap<T>& grads, const ExpertParts* experts,
                               std::vector<ref::ParamMap<T>>& parts) {
  if constexpr (std::is_same_v<T, float>) {
    struct Ops {
      const std::vector<LocalParam>& specs;
      ref::ParamMap<T>& grads;
      std::vector<ref::ParamMap<T>>& parts;
      ref::ParamMap<T>* target = &grads;  // the part being summed (grads without parts)
      void part(int k) { target = parts.empty() ? &grads : &parts[static_cast<std::size_t>(k)]; }
      void sum(comm::Communicator* g, ParamPick pick) {
        if (g != nullptr && g->size() > 1) carry_once(specs, *g, pick, *target);
      }
      void round(bool expert) {
        for (const LocalParam& p : specs) {
          if (p.expert != expert) continue;
          for (T& v : (*target)[p.name].vec()) v = ref::round_to_bf16(v);
          if (target == &grads) continue;
          ref::add_inplace(grads[p.name], (*target)[p.name]);
          (*target)[p.name].fill(T{0});
        }
      }
    };
    microbatch_presums(&cp, kv, tp, experts != nullptr ? experts->group.get() : nullptr,
                       static_cast<int>(parts.size()), Ops{specs, grads, parts});
  }
}

}  // namespace shardcheck::parallel::mesh_detail
