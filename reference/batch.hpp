// One packed training sequence and the per-step global batch, as the model consumes them.
// Produced by data.hpp (or by hand in tests); carries no model state.
#pragma once

#include <cstdint>
#include <vector>

namespace shardcheck::ref {

// All vectors have seq_len entries. Padding positions: token 0, target 0, loss_mask 0, doc_id -1,
// position 0. targets[t] is the next token of the same document; loss_mask[t] is 0 on a document's
// last token and on padding.
struct Sequence {
  std::vector<int32_t> tokens;
  std::vector<int32_t> targets;
  std::vector<int32_t> loss_mask;
  std::vector<int32_t> doc_ids;
  std::vector<int32_t> positions;
  int64_t index = 0;  // position in the step's global batch: keys dropout, independent of sharding
  int64_t sample = -1;  // dataset sample id (or -1), for sampler bookkeeping only

  int64_t mask_count() const {
    int64_t n = 0;
    for (int32_t m : loss_mask) n += m != 0;
    return n;
  }
};

using Batch = std::vector<Sequence>;

}  // namespace shardcheck::ref
