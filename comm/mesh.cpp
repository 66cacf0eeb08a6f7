// DeviceMesh coordinates, groups and the printed rank -> group table.
#include "comm/mesh.hpp"

#include <algorithm>
#include <sstream>

#include "comm/errors.hpp"

namespace shardcheck::comm {

std::string_view name_of(Axis a) {
  switch (a) {
    case Axis::dp:
      return "dp";
    case Axis::tp:
      return "tp";
    case Axis::pp:
      return "pp";
    case Axis::cp:
      return "cp";
    case Axis::ep:
      return "ep";
    case Axis::edp:
      return "edp";
  }
  return "?";
}

int MeshShape::size(Axis a) const {
  switch (a) {
    case Axis::dp:
      return dp;
    case Axis::tp:
      return tp;
    case Axis::pp:
      return pp;
    case Axis::cp:
      return cp;
    case Axis::ep:
      return ep;
    case Axis::edp:
      return ep > 0 ? dp * cp / ep : 0;
  }
  return 1;
}

namespace {
std::size_t idx(Axis a) {
  return static_cast<std::size_t>(a);
}
}  // namespace

DeviceMesh::DeviceMesh(MeshShape shape, std::string_view order) : shape_(shape) {
  for (Axis a : kAllAxes)
    if (shape_.size(a) < 1)
      throw MeshError("mesh axis " + std::string(name_of(a)) + " has size " +
                      std::to_string(shape_.size(a)) + "; expected an integer >= 1");
  if (shape_.world_size64() > kMaxWorldSize)
    throw MeshError("world size dp x tp x pp x cp = " + std::to_string(shape_.world_size64()) +
                    " is over the ceiling of " + std::to_string(kMaxWorldSize) + " ranks");
  if ((shape_.dp * shape_.cp) % shape_.ep != 0)
    throw MeshError("ep (" + std::to_string(shape_.ep) + ") must divide dp x cp (" +
                    std::to_string(shape_.dp) + " x " + std::to_string(shape_.cp) +
                    "): the expert-parallel ranks are carved out of the data- and "
                    "context-parallel ranks (world = dp x tp x pp x cp)");
  std::array<bool, 6> seen{};
  std::size_t n = 0;
  std::size_t pos = 0;
  while (!order.empty() && pos <= order.size()) {
    const std::size_t dash = order.find('-', pos);
    const std::string_view tok =
        order.substr(pos, dash == std::string_view::npos ? std::string_view::npos : dash - pos);
    auto it =
        std::find_if(kAllAxes.begin(), kAllAxes.end(), [&](Axis a) { return name_of(a) == tok; });
    if (it == kAllAxes.end())
      throw MeshError("order \"" + std::string(order) + "\": unknown axis \"" + std::string(tok) +
                      "\"; expected axes dp, tp, pp, cp, ep joined by '-'");
    if (seen[idx(*it)])
      throw MeshError("order \"" + std::string(order) + "\": axis " + std::string(tok) +
                      " appears twice");
    seen[idx(*it)] = true;
    order_[n++] = *it;
    if (dash == std::string_view::npos) break;
    pos = dash + 1;
  }
  for (Axis a : kAllAxes) {
    if (seen[idx(a)]) continue;
    if (shape_.size(a) != 1)
      throw MeshError("order \"" + std::string(order) + "\" leaves out axis " +
                      std::string(name_of(a)) + " of size " + std::to_string(shape_.size(a)));
    order_[n++] = a;
  }
  // The dense view skips ep; the expert view skips cp and reads the dp slot as edp.
  std::array<int, 6> expert{};
  int dense_stride = 1, expert_stride = 1;
  for (Axis a : order_) {
    if (a != Axis::ep) {
      stride_[idx(a)] = dense_stride;
      dense_stride *= shape_.size(a);
    }
    if (a != Axis::cp) {
      const Axis e = a == Axis::dp ? Axis::edp : a;
      expert[idx(e)] = expert_stride;
      expert_stride *= shape_.size(e);
    }
  }
  if (expert[idx(Axis::tp)] != stride_[idx(Axis::tp)] ||
      expert[idx(Axis::pp)] != stride_[idx(Axis::pp)])
    throw MeshError("order \"" + std::string(order) +
                    "\": with cp and ep both > 1, tp and pp may not lie between cp, ep and dp "
                    "(the dense view tp x cp x dp x pp and the expert view tp x ep x edp x pp "
                    "must give the same tp and pp groups)");
  stride_[idx(Axis::ep)] = expert[idx(Axis::ep)];
  stride_[idx(Axis::edp)] = expert[idx(Axis::edp)];
}

std::string DeviceMesh::order_string() const {
  std::string s;
  for (Axis a : order_) {
    if (!s.empty()) s += '-';
    s += name_of(a);
  }
  return s;
}

std::array<Axis, 4> DeviceMesh::view(std::span<const Axis> axes) const {
  const auto has = [&](Axis a) { return std::find(axes.begin(), axes.end(), a) != axes.end(); };
  const bool expert = has(Axis::ep) || has(Axis::edp);
  if (expert && (has(Axis::dp) || has(Axis::cp)))
    throw MeshError("a group may not mix the dense axes dp, cp with the expert axes ep, edp");
  std::array<Axis, 4> out{};
  std::size_t n = 0;
  for (Axis a : order_) {
    if (a == (expert ? Axis::cp : Axis::ep)) continue;
    out[n++] = expert && a == Axis::dp ? Axis::edp : a;
  }
  return out;
}

int DeviceMesh::coord(int rank, Axis a) const {
  SC_CHECK(rank >= 0 && rank < world_size(),
           "rank " << rank << " outside mesh of " << world_size());
  return (rank / stride_[idx(a)]) % shape_.size(a);
}

std::vector<int> DeviceMesh::group(int rank, std::span<const Axis> axes) const {
  SC_CHECK(rank >= 0 && rank < world_size(),
           "rank " << rank << " outside mesh of " << world_size());
  std::vector<Axis> vary;
  for (Axis a : view(axes))
    if (std::find(axes.begin(), axes.end(), a) != axes.end()) vary.push_back(a);
  int base = rank;
  for (Axis a : vary) base -= coord(rank, a) * stride_[idx(a)];
  std::vector<int> members{base};
  for (Axis a : vary) {
    std::vector<int> next;
    for (int m : members)
      for (int c = 0; c < shape_.size(a); ++c) next.push_back(m + c * stride_[idx(a)]);
    members = std::move(next);
  }
  std::sort(members.begin(), members.end());
  return members;
}

int DeviceMesh::group_index(int rank, std::span<const Axis> axes) const {
  SC_CHECK(rank >= 0 && rank < world_size(),
           "rank " << rank << " outside mesh of " << world_size());
  return group_indexer(axes).index(rank);
}

DeviceMesh::GroupIndexer DeviceMesh::group_indexer(std::span<const Axis> axes) const {
  GroupIndexer g;
  int radix = 1;
  for (Axis a : view(axes)) {
    if (std::find(axes.begin(), axes.end(), a) != axes.end()) continue;
    g.stride_[g.n_] = stride_[idx(a)];
    g.size_[g.n_] = shape_.size(a);
    g.radix_[g.n_++] = radix;
    radix *= shape_.size(a);
  }
  return g;
}

std::string DeviceMesh::table() const {
  std::ostringstream os;
  os << "mesh dp=" << shape_.dp << " tp=" << shape_.tp << " pp=" << shape_.pp << " cp=" << shape_.cp
     << " ep=" << shape_.ep << " (expert dp = dp x cp / ep = " << shape_.size(Axis::edp)
     << ") order=" << order_string() << " world=" << world_size() << "\n";
  // Columns: the five axes' groups, then the expert-data-parallel group (edp).
  const auto members = [&](int r, std::size_t col) {
    return group(r, col < kAllAxes.size() ? kAllAxes[col] : Axis::edp);
  };
  const std::size_t cols = kAllAxes.size() + 1;
  std::vector<std::size_t> width(cols, 8);  // "dp-group"
  width.back() = 9;                         // "edp-group"
  for (std::size_t col = 0; col < cols; ++col)
    for (int r = 0; r < world_size(); ++r)
      width[col] = std::max(width[col], rank_list(members(r, col)).size());
  auto pad = [](std::string s, std::size_t w) { return s + std::string(w - s.size(), ' '); };
  os << "rank  dp tp pp cp ep";
  for (std::size_t col = 0; col < cols; ++col)
    os << "  "
       << pad(std::string(col < kAllAxes.size() ? name_of(kAllAxes[col]) : "edp") + "-group",
              width[col]);
  os << "\n";
  for (int r = 0; r < world_size(); ++r) {
    const std::string rs = std::to_string(r);
    os << std::string(rs.size() < 4 ? 4 - rs.size() : 0, ' ') << rs << " ";
    for (Axis a : kAllAxes) os << (coord(r, a) < 10 ? "  " : " ") << coord(r, a);
    for (std::size_t col = 0; col < cols; ++col) {
      const std::string m = rank_list(members(r, col));
      os << "  " << (col + 1 < cols ? pad(m, width[col]) : m);  // no trailing blanks
    }
    os << "\n";
  }
  return os.str();
}

Communicator& MeshGroups::get(Axis a) {
  std::unique_ptr<Communicator>* slots[] = {&dp, &tp, &pp, &cp, &ep};
  SC_CHECK(idx(a) < kAllAxes.size() && *slots[idx(a)],
           "mesh group " << name_of(a) << " was not built");
  return **slots[idx(a)];
}

MeshGroups build_groups(const DeviceMesh& mesh, Communicator& world) {
  if (world.size() != mesh.world_size())
    throw InvalidArgument({world.world_rank(), world.name(), "build_groups", 0},
                          "mesh needs " + std::to_string(mesh.world_size()) +
                              " ranks but the communicator has " + std::to_string(world.size()));
  MeshGroups g;
  std::unique_ptr<Communicator>* slots[] = {&g.dp, &g.tp, &g.pp, &g.cp, &g.ep};
  const int r = world.rank();
  for (Axis a : kAllAxes) {
    const int color = mesh.group_index(r, std::span<const Axis>(&a, 1));
    *slots[idx(a)] = world.split(color, r, {.name = std::string(name_of(a))});
  }
  return g;
}

}  // namespace shardcheck::comm
