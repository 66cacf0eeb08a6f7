// Which slice of the vocabulary tensors each TP rank holds (parallel/mp/mesh_params.hpp) when the
// vocabulary is padded: the ranks' runs tile the logical [V, h] / [h, V] exactly once, and every
// other local element is padding (global_index -1), Vp - V rows (columns) in all.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/mesh.hpp"
#include "parallel/mp/mesh_params.hpp"
#include "reference/config.hpp"

namespace shardcheck::parallel {
namespace {

struct PadCase {
  int vocab, tp, multiple;
};

TEST(MeshParams, PaddedVocabularySlicesTileTheLogicalTensorsOnce) {
  for (const PadCase c : {PadCase{41, 4, 16}, PadCase{41, 2, 1}, PadCase{41, 4, 1},
                          PadCase{64, 4, 1}, PadCase{23, 4, 8}, PadCase{41, 1, 16}}) {
    for (const bool tied : {true, false}) {
      SCOPED_TRACE("V " + std::to_string(c.vocab) + " tp " + std::to_string(c.tp) + " x " +
                   std::to_string(c.multiple) + (tied ? " tied" : " untied"));
      ref::ModelConfig m;
      m.vocab = c.vocab;
      m.vocab_pad_multiple = c.multiple;
      m.tie_embeddings = tied;
      const comm::DeviceMesh mesh({.tp = c.tp});
      const int64_t h = m.hidden, vp = m.padded_vocab(c.tp);
      for (const std::string name : {"embed.weight", "lm_head.weight"}) {
        if (tied && name == "lm_head.weight") continue;
        std::vector<int> covered(static_cast<std::size_t>(m.vocab * h), 0);
        int64_t padding = 0;
        for (int rank = 0; rank < c.tp; ++rank) {
          for (const LocalParam& p : local_params(m, mesh, rank, 1)) {
            if (p.name != name) continue;
            EXPECT_EQ(p.local_shape, name == "embed.weight" ? ref::Shape({vp / c.tp, h})
                                                            : ref::Shape({h, vp / c.tp}));
            for (const LocalParam::Run& r : p.runs())
              for (int64_t i = 0; i < r.count; ++i) {
                ASSERT_LT(r.global + i, m.vocab * h);
                ++covered[static_cast<std::size_t>(r.global + i)];
                EXPECT_EQ(p.global_index(r.local + i), r.global + i);
              }
            int64_t pad_elems = 0;
            for (int64_t i = 0; i < ref::numel_of(p.local_shape); ++i)
              pad_elems += p.global_index(i) < 0;
            EXPECT_EQ(pad_elems, p.pad * h);
            padding += p.pad;
          }
        }
        EXPECT_EQ(padding, vp - m.vocab);
        for (std::size_t i = 0; i < covered.size(); ++i)
          ASSERT_EQ(covered[i], 1) << name << " element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace shardcheck::parallel
