// The reference transformer (dense and MoE) of DESIGN.md: parameter names and shapes, counter-based
// initialisation, and forward + backward over a list of sequences. No optimizer, no data (see
// optim.hpp, data.hpp); no parallelism (parallel/ shards these same parameters by name).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "reference/batch.hpp"
#include "reference/blocks.hpp"
#include "reference/config.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::ref {

// Canonical parameter list in model order: embed.weight, then per layer i
// layers.<i>.attn_norm.weight [h], .attn.wq [h, a*d], .attn.wk [h, kv*d], .attn.wv [h, kv*d],
// .attn.wo [a*d, h], .mlp_norm.weight [h], then either .mlp.w_up [h, ffn], .mlp.w_down [ffn, h] or
// .moe.router [h, E], .moe.experts.<j>.w_up [h, ffn], .moe.experts.<j>.w_down [ffn, h], with a
// SwiGLU MLP (ModelConfig::mlp) a .w_gate [h, ffn] before each w_up;
// then final_norm.weight [h] and, when untied, lm_head.weight [h, V].
std::vector<std::pair<std::string, Shape>> param_shapes(const ModelConfig& cfg);
// One part of that list, so a layer's shapes cost O(1) layers, not O(layers): part -1 the
// embedding, 0..layers-1 block i, `layers` the final norm and the untied head.
std::vector<std::pair<std::string, Shape>> part_param_shapes(const ModelConfig& cfg, int part);

// Initial value of element `index` (flat C order) of parameter `name`: norms 1; wo and every w_down
// normal(0, 0.02 / sqrt(2 * layers)); everything else (w_gate included) normal(0, 0.02). The normal
// draw is RngStream::of(seed, name).normal(index), so any slice can be initialised on its own.
double init_value(const ModelConfig& cfg, uint64_t seed, std::string_view name, int64_t index);

// Fills out with elements [begin, begin + out.size()) of parameter `name`.
template <class T>
void init_param_slice(const ModelConfig& cfg, uint64_t seed, std::string_view name, int64_t begin,
                      std::span<T> out);

template <class T>
ParamMap<T> init_params(const ModelConfig& cfg, uint64_t seed);

// Numerators and denominators kept apart, so sums over microbatches and ranks stay exact.
struct LossParts {
  double loss_sum = 0.0;
  int64_t tokens = 0;
  double aux_sum = 0.0;
  int64_t sequences = 0;
  std::vector<MoeLoad> moe_load;  // summed over the sequences, one per MoE layer
  std::vector<SequenceLoss> per_sequence;

  void merge(const LossParts& other);
  // loss_sum / tokens + aux_sum / sequences (the global loss once every microbatch is merged).
  double loss() const;
};

// Forward (and, when grads is non-null, backward, adding into *grads) over the sequences. With a
// tied embedding and `tied_head`, the head's use of the embedding adds into *tied_head instead of
// (*grads)["embed.weight"] (the embedding's own use still adds there).
template <class T>
LossParts forward_backward(const ModelConfig& cfg, const ParamMap<T>& params,
                           std::span<const Sequence> sequences, const StepContext& ctx,
                           std::type_identity_t<ParamMap<T>>* grads = nullptr,
                           std::type_identity_t<Tensor<T>>* tied_head = nullptr);

}  // namespace shardcheck::ref
