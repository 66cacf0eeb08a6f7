// Engine state as neutral pieces for checkpoints: each piece is a flat C-order element range of
// one logical tensor, with its bytes. The checkpoint module can store and reshard these without
// knowing parallel/; an engine of any DP size or strategy reads back the ranges it needs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "comm/dtype.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::parallel {

// Tensor names: "param/<p>" (working parameters: f64/f32, or bf16 in the bf16 recipe),
// "master/<p>" (bf16 recipe: f32 master weights), "exp_avg/<p>", "exp_avg_sq/<p>" (moments, the
// master dtype), and scalars of shape {} (i64): "train/step" (steps taken, the LR schedule's
// position) and "optimizer/step" (AdamW updates applied; differs after skipped steps).
struct StatePiece {
  std::string tensor;
  ref::Shape shape;  // the logical (full) tensor's shape
  comm::DType dtype = comm::DType::f64;
  std::size_t begin = 0;         // first element, flat C order, of the logical tensor
  std::size_t count = 0;         // elements in this piece
  std::vector<std::byte> bytes;  // count * size_of(dtype), little-endian host order
};

// Fills out (count * size_of(dtype) bytes) with elements [begin, begin + count) of `tensor`, in
// the dtype the importing engine asks for (its own; a reader may convert or throw). Throws if the
// tensor is unknown.
using StateReader =
    std::function<void(const std::string& tensor, comm::DType dtype, std::size_t begin,
                       std::size_t count, std::span<std::byte> out)>;

}  // namespace shardcheck::parallel
