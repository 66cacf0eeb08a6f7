// Which slice of which parameter a rank of a DP x TP x PP x CP x EP mesh holds (Megatron-Core
// rules), how it maps to the full tensor, and which ranks must sum its gradient.
//
//   embed.weight    [V, h]    vocab rows split over TP; on the stage holding virtual stage 0, and
//                             (tied) a copy on the stage holding the last one (pp > 1)
//   attn.wq/wk/wv   [h, *]    columns split over TP (heads, then kv heads: kv_heads % tp == 0;
//                             tp > kv_heads: each kv head replicated on tp / kv_heads ranks)
//   attn.wo         [a*d, h]  rows split over TP
//   mlp.w_up        [h, f]    columns over TP;  mlp.w_down [f, h] rows over TP
//   mlp.w_gate      [h, f]    (SwiGLU) columns over TP, as w_up
//   norms, router             replicated over TP
//   moe.experts.<j>           experts split over EP (EP rank e holds j in [e*E/ep, (e+1)*E/ep)),
//                             not split over TP
//   lm_head.weight  [h, V]    columns over TP, on the last stage
// The embedding and the head are split over the padded vocabulary (ModelConfig::padded_vocab):
// their local slices end in `pad` rows/columns past the full tensor, zero and never updated.
// Layers go to pipeline chunks by partition_layers over a FLOP profile (virtual stage c*pp + s
// is chunk c of stage s).
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm/mesh.hpp"
#include "parallel/mp/vocab_parallel.hpp"
#include "parallel/testing.hpp"
#include "reference/config.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::parallel {

// A mesh the model or batch cannot be laid over (heads % tp, experts % ep, layers < stages, ...),
// or a combination not built yet. field(): the parallel-configuration key to change ("tp",
// "fsdp.shard_group_size", ...; scenarios name it as a JSON path under the configuration).
class MeshConfigError : public std::invalid_argument {
 public:
  MeshConfigError(std::string field, const std::string& what, bool not_built = false)
      : std::invalid_argument(what), field_(std::move(field)), not_built_(not_built) {}
  const std::string& field() const { return field_; }
  bool not_built() const { return not_built_; }  // valid, but this combination is not built

 private:
  std::string field_;
  bool not_built_;
};

struct LocalParam {
  std::string name;
  // Its layerwise unit (parallel/layerwise.hpp's unit_of: 0 the embedding, 1 + layer a block's,
  // layers + 1 the head's), set once from the part param_shapes lists it in (-1: not set).
  int unit = -1;
  ref::Shape global_shape;
  ref::Shape local_shape;
  TpSplit split = TpSplit::replicated;
  int64_t offset = 0;  // first global row (rows) or column (columns) of the slice
  // Trailing local rows (rows) or columns (columns) past the full tensor: vocabulary padding.
  int64_t pad = 0;
  bool expert = false;         // gradient summed over the expert-DP group (edp), not dp x cp
  bool tp_replicated = false;  // same value on every TP rank (norms, router, experts)
  bool tied_copy = false;      // the last stage's copy of the tied embedding (pp > 1)
  // wk / wv when tp > kv_heads: the TP ranks holding the same kv head (tp / kv_heads of them,
  // consecutive); their gradients are summed over them and the first counts the slice.
  int kv_replicas = 1;
  // Flat index in the full tensor; -1 for a padding element.
  int64_t global_index(int64_t local_flat) const;
  // The slice as runs of elements contiguous in both the local and the full tensor (one run for
  // replicated and row slices, one per row for column slices), padding left out.
  struct Run {
    int64_t local = 0, global = 0, count = 0;
  };
  std::vector<Run> runs() const;
};

struct StagePlan {
  std::vector<std::pair<int, int>> chunk_layers;  // per local chunk: [first, last) layers
  bool has_embed = false;                         // holds virtual stage 0
  bool has_head = false;                          // holds the last virtual stage
};

// Layer ranges of every virtual stage (pp * virtual_stages of them), by FLOP profile.
std::vector<std::pair<int, int>> virtual_stage_layers(const ref::ModelConfig& model, int pp,
                                                      int virtual_stages);
StagePlan stage_plan(const ref::ModelConfig& model, int pp, int virtual_stages, int stage);
// Whether the backward of local chunk `chunk` (virtual stage vs of last_vs) writes p's gradient
// for the last time in a microbatch: its layers, the embedding on virtual stage 0, the head on the
// last (and the tied embedding, unless the stage also holds virtual stage 0, which writes it
// later).
bool chunk_writes(const ref::ModelConfig& model, const StagePlan& plan, int chunk, int vs,
                  int last_vs, const LocalParam& p);

// This rank's parameters, in the reference's canonical order.
// planted = kGqaWrongHeadMapping (tests) maps a rank's query heads to the wrong kv head.
std::vector<LocalParam> local_params(const ref::ModelConfig& model, const comm::DeviceMesh& mesh,
                                     int world_rank, int virtual_stages,
                                     testing::Mutation planted = testing::Mutation::kNone);
// local_params (nothing planted), remembered per thread (up to 2^18 parameters) for the last model
// by what it reads (the tp, ep and pp sizes, the rank's coordinates on them, virtual stages): a
// search asks for the same parameters for every order, dp x cp split, ZeRO, schedule, micro batch
// and recompute setting of a mesh and for each stage bound, and building them (names, shapes) was
// most of a ledger's and a skeleton's set-up.
std::shared_ptr<const std::vector<LocalParam>> shared_local_params(const ref::ModelConfig& model,
                                                                   const comm::DeviceMesh& mesh,
                                                                   int world_rank,
                                                                   int virtual_stages);

}  // namespace shardcheck::parallel
