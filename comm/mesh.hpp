// DeviceMesh: the parallel axes (dp, tp, pp, cp, ep) laid over world ranks by an order string,
// Megatron-style: "tp-cp-ep-dp-pp" lists axes from fastest-varying (adjacent ranks) to slowest.
// Expert parallelism is carved out of the data- and context-parallel ranks, as in Megatron-Core
// ("MoE parallel folding": two rank generators over one world) and torchtitan: world =
// dp * tp * pp * cp, ep divides dp * cp, and {"dp": 8, "ep": 4} is 8 ranks. The same ranks are
// read two ways: the dense layers' view tp x cp x dp x pp (the order string without ep) and the
// experts' view tp x ep x edp x pp (the order string without cp, "dp" standing for edp =
// dp * cp / ep, the expert-data-parallel size). Both views must give the same tp and pp groups.
// Builds each rank's process groups; no backend code.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.hpp"

namespace shardcheck::comm {

// The mesh's five axes, and edp: the experts' data-parallel axis (dp * cp / ep ranks), whose group
// is the expert parameters' gradient-sum group (Megatron's expert data parallel). dp and cp belong
// to the dense view, ep and edp to the expert view, tp and pp to both.
enum class Axis : std::uint8_t { dp, tp, pp, cp, ep, edp };
inline constexpr std::array<Axis, 5> kAllAxes = {Axis::dp, Axis::tp, Axis::pp, Axis::cp, Axis::ep};
std::string_view name_of(Axis a);

// The most ranks a mesh may have (2^20): sizes and their products are checked against it in 64
// bits before any int arithmetic on them.
inline constexpr std::int64_t kMaxWorldSize = std::int64_t{1} << 20;

struct MeshShape {
  int dp = 1, tp = 1, pp = 1, cp = 1, ep = 1;  // ep divides dp * cp (DeviceMesh checks)
  int size(Axis a) const;                      // edp: dp * cp / ep
  // dp * tp * pp * cp in 64 bits (any sizes); world_size() once it is known to be <= kMaxWorldSize.
  std::int64_t world_size64() const {
    return std::int64_t{dp} * std::int64_t{tp} * std::int64_t{pp} * std::int64_t{cp};
  }
  int world_size() const { return static_cast<int>(world_size64()); }
  bool operator==(const MeshShape&) const = default;
};

// A mesh the caller asked for that cannot exist (bad order string, size < 1).
class MeshError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class DeviceMesh {
 public:
  // order: axes joined by '-', each at most once; axes of size 1 may be left out (they are
  // appended, slowest). Throws MeshError naming what is wrong.
  explicit DeviceMesh(MeshShape shape, std::string_view order = "tp-cp-ep-dp-pp");

  const MeshShape& shape() const { return shape_; }
  int world_size() const { return shape_.world_size(); }
  int size(Axis a) const { return shape_.size(a); }
  std::string order_string() const;  // the full order, all five axes

  // The rank's index along a (in the dense view for dp and cp, the expert view for ep and edp).
  int coord(int rank, Axis a) const;
  // World ranks of the group of `rank` that varies along `axes` (the other axes of the same view
  // fixed), ascending. axes may not mix dp or cp with ep or edp (throws MeshError).
  std::vector<int> group(int rank, std::span<const Axis> axes) const;
  std::vector<int> group(int rank, Axis a) const {
    return group(rank, std::span<const Axis>(&a, 1));
  }
  // Which group of that kind `rank` is in: 0 .. world/prod(sizes of axes) - 1. Used as split color.
  int group_index(int rank, std::span<const Axis> axes) const;
  // group_index for one `axes`, with the view worked out once: index(rank) for every rank of the
  // mesh (a split rule's color, evaluated for each member).
  class GroupIndexer {
   public:
    int index(int rank) const {
      int out = 0;
      for (std::size_t i = 0; i < n_; ++i) out += (rank / stride_[i]) % size_[i] * radix_[i];
      return out;
    }

   private:
    friend class DeviceMesh;
    std::array<int, 4> stride_{}, size_{}, radix_{};
    std::size_t n_ = 0;
  };
  GroupIndexer group_indexer(std::span<const Axis> axes) const;

  // The rank -> group table: one line per rank with its coordinates, each axis group and the
  // expert-data-parallel group (edp).
  std::string table() const;

 private:
  // The four axes of the view `axes` belong to (dense: tp, cp, dp, pp; expert: tp, ep, edp, pp),
  // fastest first.
  std::array<Axis, 4> view(std::span<const Axis> axes) const;
  MeshShape shape_;
  std::array<Axis, 5> order_{};  // the order string's axes (dp, tp, pp, cp, ep), fastest first
  std::array<int, 6> stride_{};  // indexed by Axis: dp, cp in the dense view, ep, edp the expert
};

// One communicator per axis for the calling rank, built by splitting `world` (a collective: every
// rank of `world` must call it, in the same order as every other collective).
struct MeshGroups {
  std::unique_ptr<Communicator> dp, tp, pp, cp, ep;
  Communicator& get(Axis a);
};
MeshGroups build_groups(const DeviceMesh& mesh, Communicator& world);

}  // namespace shardcheck::comm
