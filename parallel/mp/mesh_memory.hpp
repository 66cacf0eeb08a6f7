// What the mesh engine reports as activations: the elements a block's or the head's cache keeps
// from a chunk's forward to its backward (every tensor and vector it holds).
#pragma once

#include <cstddef>

#include "parallel/mp/tp_block.hpp"

namespace shardcheck::parallel {

template <class T>
std::size_t tensor_elems(const ref::Tensor<T>& t) {
  return static_cast<std::size_t>(t.numel());
}

// Elements a block's cache keeps for backward (every tensor and vector it holds).
template <class T>
std::size_t cache_elems(const MpBlockCache<T>& c) {
  std::size_t e = tensor_elems(c.x_in) + c.rstd1.size() + tensor_elems(c.a) +
                  tensor_elems(c.a_full) + tensor_elems(c.q) + tensor_elems(c.k) +
                  tensor_elems(c.v) + tensor_elems(c.o) + tensor_elems(c.x_mid) + c.rstd2.size() +
                  tensor_elems(c.b) + tensor_elems(c.b_full) + tensor_elems(c.mlp.gate) +
                  tensor_elems(c.mlp.up) + tensor_elems(c.mlp.act);
  e += tensor_elems(c.attn.q) + tensor_elems(c.attn.k) + tensor_elems(c.attn.v) +
       tensor_elems(c.attn.o) + c.attn.lse.size() + tensor_elems(c.attn.probs);
  e += tensor_elems(c.moe.x) + tensor_elems(c.moe.probs) + c.moe.gate.size() +
       tensor_elems(c.moe.out);
  for (const auto& t : c.moe.in) e += tensor_elems(t);
  for (const auto& m : c.moe.mlp)
    e += tensor_elems(m.gate) + tensor_elems(m.up) + tensor_elems(m.act);
  return e;
}

template <class T>
std::size_t cache_elems(const MpHeadCache<T>& c) {
  return tensor_elems(c.x) + c.rstd.size() + tensor_elems(c.y_full) + tensor_elems(c.vocab.logits) +
         c.vocab.row_max.size() + c.vocab.sum_exp.size();
}

}  // namespace shardcheck::parallel
