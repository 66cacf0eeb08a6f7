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
  std::array<bool, 5> seen{};
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
  int stride = 1;
  for (Axis a : order_) {
    stride_[idx(a)] = stride;
    stride *= shape_.size(a);
  }
}

std::string DeviceMesh::order_string() const {
  std::string s;
  for (Axis a : order_) {
    if (!s.empty()) s += '-';
    s += name_of(a);
  }
  return s;
}

int DeviceMesh::coord(int rank, Axis a) const {
  SC_CHECK(rank >= 0 && rank < world_size(),
           "rank " << rank << " outside mesh of " << world_size());
  return (rank / stride_[idx(a)]) % shape_.size(a);
}

std::vector<int> DeviceMesh::group(int rank, std::span<const Axis> axes) const {
  int base = rank;
  for (Axis a : axes) base -= coord(rank, a) * stride_[idx(a)];
  std::vector<int> members{base};
  for (Axis a : axes) {
    std::vector<int> next;
    for (int m : members)
      for (int c = 0; c < shape_.size(a); ++c) next.push_back(m + c * stride_[idx(a)]);
    members = std::move(next);
  }
  std::sort(members.begin(), members.end());
  return members;
}

int DeviceMesh::group_index(int rank, std::span<const Axis> axes) const {
  int index = 0;
  int radix = 1;
  for (Axis a : order_) {
    if (std::find(axes.begin(), axes.end(), a) != axes.end()) continue;
    index += coord(rank, a) * radix;
    radix *= shape_.size(a);
  }
  return index;
}

std::string DeviceMesh::table() const {
  std::ostringstream os;
  os << "mesh dp=" << shape_.dp << " tp=" << shape_.tp << " pp=" << shape_.pp << " cp=" << shape_.cp
     << " ep=" << shape_.ep << " order=" << order_string() << " world=" << world_size() << "\n";
  std::array<std::size_t, 5> width{};
  for (Axis a : kAllAxes) {
    width[idx(a)] = 8;  // "dp-group"
    for (int r = 0; r < world_size(); ++r)
      width[idx(a)] = std::max(width[idx(a)], rank_list(group(r, a)).size());
  }
  auto pad = [](std::string s, std::size_t w) { return s + std::string(w - s.size(), ' '); };
  os << "rank  dp tp pp cp ep";
  for (Axis a : kAllAxes) os << "  " << pad(std::string(name_of(a)) + "-group", width[idx(a)]);
  os << "\n";
  for (int r = 0; r < world_size(); ++r) {
    const std::string rs = std::to_string(r);
    os << std::string(rs.size() < 4 ? 4 - rs.size() : 0, ' ') << rs << " ";
    for (Axis a : kAllAxes) os << (coord(r, a) < 10 ? "  " : " ") << coord(r, a);
    for (Axis a : kAllAxes) os << "  " << pad(rank_list(group(r, a)), width[idx(a)]);
    os << "\n";
  }
  return os.str();
}

Communicator& MeshGroups::get(Axis a) {
  std::unique_ptr<Communicator>* slots[] = {&dp, &tp, &pp, &cp, &ep};
  SC_CHECK(*slots[idx(a)], "mesh group " << name_of(a) << " was not built");
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
