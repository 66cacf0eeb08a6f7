// Known bugs a test can plant in the strategies, so parity tests can prove they catch them
// (DESIGN.md "Parity rule"). A planted bug travels in the options of the engine or piece it breaks
// (DataParallelOptions::planted, MeshOptions::planted, BlockEnv::planted, ...; for internal use by
// tests, as gloo's max segment size), never in process-wide state: production code paths see
// kNone unless a caller asks otherwise, and concurrent runs cannot plant bugs in each other.
#pragma once

namespace shardcheck::parallel::testing {

enum class Mutation {
  kNone,
  kMeanOfRankMeans,  // each rank normalises its loss locally; the step averages rank means
  kLocalNormClip,    // clip by the local norm (ZeRO-2/3: own shard; DDP/ZeRO-1: before reduce)
  kSkipBucket,  // the gradient reduction of one bucket (DDP/ZeRO-1) or unit (others) is left out
  kWrongShardOffset,  // ZeRO: the owner reads its gradient shard at r*floor(N/D), not r*S
  kSameSamples,       // sampler bug: every rank reads DP rank 0's slice of the global batch
  kSkipReplicaSum,    // hybrid_shard (mesh engine): the gradient shard is not summed over replicas
  // Model parallel (parallel/mp/):
  kRowParallelNotReduced,  // TP: a row-parallel output (wo / w_down) is not summed over TP ranks
  kGqaWrongHeadMapping,    // TP: a rank's query heads use kv head (local q head) / group of rank 0
  kCpRopeChunkOffset,      // CP: RoPE position of a row = its offset from its chunk's start
  kRingDiagonalUnmasked,   // CP ring: the causal/document mask is left off the diagonal block
  kSkipTiedEmbeddingSync,  // PP: first/last stage do not sum the tied embedding's gradient
  kRouteDroppedTokens,     // EP: assignments over capacity are computed instead of dropped
  kAuxPerRankMean,         // EP: aux loss normalised by this rank's sequences, not the global batch
  kExpertSumOverDenseGroup,  // EP: expert gradients summed over dp x cp, not expert DP (edp)
  kVocabTargetNotReduced,    // vocab-parallel CE: the target logit is not summed over TP ranks
  kVocabPadNotMasked,        // vocab-parallel CE: the padded columns enter the softmax
  // Data parallel, every mesh: the gradient reduction averages (ReduceOp::avg) where the loss is
  // already normalised by the global token count, so every gradient is 1/D of the reference's.
  // Under clipping and AdamW the parameters barely move (the update is nearly scale-invariant);
  // the gradient norm shows it.
  kGradAveragedNotSummed,
  // TP: ranks other than TP rank 0 leave their copies of the TP-replicated parameters (norms,
  // router) as they were; the exported copy (TP rank 0's) is right, the others' forward is stale.
  kReplicaNotUpdated,
  // The gradient norm over the wrong group: every TP rank counts its copy of the TP-replicated
  // parameters (norms, router; Megatron counts them on TP rank 0 only), so they weigh tp times.
  kNormOverWrongGroup,
  // bf16 recipe: the working weights are the f32 master itself, never rounded to bf16 (the model
  // silently trains in f32); ZeRO-3 / FSDP gathers still round (their all_gather is in bf16).
  kBf16WorkingLeftInF32,
  // bf16 recipe, EP: an expert's microbatch gradient is rounded once over the tokens of every EP
  // peer, where the reference rounds each data rank's microbatch apart.
  kBf16ExpertsRoundedTogether,
  // ZeRO-3 / FSDP (mesh_grad_units.hpp): a unit's per-microbatch reduce_scatter is issued one
  // backward step before the backward has finished writing its gradient.
  kUnitReducedEarly,
  // TP, SwiGLU: ranks other than TP rank 0 take their gate shard for the up projection and the up
  // shard for the gate, as a fused [gate | up] column shard read in the wrong chunk order after a
  // TP reshard (the loss jumps after loading on another GPU count).
  kGateUpSwapped,
};

}  // namespace shardcheck::parallel::testing
