// The analytic memory ledger of the mesh engine (mesh_engine.hpp), one rank at a time, for any
// mesh, by the engine's own rules and not by running it: the rank's parameter slices
// (local_params), their flat buffers and shards (flat_classes, shard_elems), the ZeRO-3 / FSDP
// residency replayed over the rank's pipeline schedule (mesh_residency.hpp), and the activations
// each (microbatch, chunk) keeps from its forward to its backward. Activations per block follow
// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models") as
// this engine holds them: the norms' inputs and outputs and the residual stream on the rank's own
// rows (divided by TP under sequence parallelism), the TP-split projections and MLP on the CP
// rank's rows, the attention core's probabilities [heads / tp, s, s] (Ulysses: heads / tp / cp)
// unless recomputed, and under full recomputation only each block's input. Dense layers are
// exact; MoE layers an upper bound (every routed assignment kept, capacity permitting).
#pragma once

#include <span>
#include <vector>

#include "parallel/ledger.hpp"
#include "parallel/mp/mesh_engine.hpp"
#include "reference/config.hpp"

namespace shardcheck::parallel {

// World rank world_rank of options.shape's mesh: model state when the optimizer starts, the
// peak of gathered units beyond it, and the activation peak (bytes, the recipe of
// train.precision). Throws MeshConfigError as validate_mesh does.
LedgerRow mesh_ledger(const ref::ModelConfig& model, const ref::TrainConfig& train,
                      const MeshOptions& options, int world_rank);
// The same under each recompute mode of `modes` (train.recompute is not read), in their order: the
// model state and the residency replay are shared, only the activations differ.
std::vector<LedgerRow> mesh_ledger_modes(const ref::ModelConfig& model,
                                         const ref::TrainConfig& train, const MeshOptions& options,
                                         int world_rank, std::span<const ref::Recompute> modes);

// The rank holding the most at once (LedgerRow::total) and its row. Ranks at data-parallel
// position 0 stand for the others, which hold the same amounts (their shards are padded alike).
struct RankLedger {
  int rank = 0;
  LedgerRow row;
};
RankLedger mesh_ledger_fullest(const ref::ModelConfig& model, const ref::TrainConfig& train,
                               const MeshOptions& options);
// The fullest rank of each pipeline stage, in stage order (stages hold different layers, the
// embedding and the head, and keep different numbers of microbatches in flight).
std::vector<RankLedger> mesh_ledger_stages(const ref::ModelConfig& model,
                                           const ref::TrainConfig& train,
                                           const MeshOptions& options);
// The same under each recompute mode of `modes`: [mode][stage].
std::vector<std::vector<RankLedger>> mesh_ledger_stages_modes(
    const ref::ModelConfig& model, const ref::TrainConfig& train, const MeshOptions& options,
    std::span<const ref::Recompute> modes);
// The fullest of mesh_ledger_stages' rows (the first of equals); `stages` not empty.
RankLedger fullest_of(const std::vector<RankLedger>& stages);

// Every rank's row, in world-rank order.
std::vector<LedgerRow> mesh_ledger_ranks(const ref::ModelConfig& model,
                                         const ref::TrainConfig& train, const MeshOptions& options);

// Activation elements one sequence keeps for one block's backward on a rank of this mesh (see
// above), for the recompute mode.
double mesh_block_activation_elems(const ref::ModelConfig& model, const MeshOptions& options,
                                   int layer, ref::Recompute recompute);

}  // namespace shardcheck::parallel
