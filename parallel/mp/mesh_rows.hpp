// Internal to the mesh engine (mesh_engine.cpp): the group split over mesh axes, the row movers
// between a microbatch and its sequences, and what a pipeline chunk keeps from forward to backward.
#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/memory.hpp"
#include "comm/mesh.hpp"
#include "parallel/mp/tp_block.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::parallel::mesh_detail {

using ref::Tensor;

inline std::unique_ptr<comm::Communicator> split_over(comm::Communicator& world,
                                                      const comm::DeviceMesh& mesh,
                                                      std::vector<comm::Axis> axes,
                                                      const char* name) {
  return world.split(mesh.group_index(world.rank(), axes), world.rank(), {.name = name});
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
