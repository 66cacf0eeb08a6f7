// SymmetricClock's splits (clock.hpp): a split's layout over its group's members (each colour's
// size, whether it crosses nodes, the slowest link), shared by clocks of the same program through
// a SplitMemo, and the group communicator of this rank's colour.
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/errors.hpp"
#include "sim/clock.hpp"
#include "sim/clock_state.hpp"

namespace shardcheck::sim {

namespace {

bool same_link(const sim::LinkCost& a, const sim::LinkCost& b) {
  return a.alpha == b.alpha && a.beta == b.beta;
}

}  // namespace

// One split of a group: every member's colour, and per colour (ascending) its size and whether it
// crosses nodes (sim::group_link: a member on another node than its first).
struct SplitGroup {
  int color = 0;
  std::size_t size = 0;
  int node = 0;
  bool inter = false;
};

struct SplitLayout {
  std::vector<int> colors;  // per member (group rank)
  std::vector<SplitGroup> groups;
  // Per colour asked for: its members' world ranks in key order, and the group's name.
  struct Own {
    std::vector<int> ranks;
    std::shared_ptr<const std::string> name;
  };
  std::map<int, Own> own;
  bool uneven = false;    // groups of different sizes or links
  sim::LinkCost worst{};  // the slowest group's link
  const SplitGroup* find(int color) const {
    const auto it = std::lower_bound(groups.begin(), groups.end(), color,
                                     [](const SplitGroup& g, int c) { return g.color < c; });
    return it != groups.end() && it->color == color ? &*it : nullptr;
  }
};

struct SplitMemo {
  // (the split's place in the program, the group it splits: null for the world, else the
  // SplitLayout::Own its members came from)
  std::map<std::pair<std::size_t, const void*>, SplitLayout> layouts;
};

std::shared_ptr<SplitMemo> make_split_memo() {
  return std::make_shared<SplitMemo>();
}

namespace {

// The colours once per member, in one pass: a vector of groups by colour when every colour is
// below the member count (a mesh's splits: group indices), else a map. Either way by ascending
// colour.
SplitLayout split_layout(const SplitRule& rule, const std::vector<int>& members,
                         const sim::Topology& topology) {
  SplitLayout out;
  const auto n = static_cast<int>(members.size());
  out.colors.resize(members.size());
  bool small = true;
  for (int r = 0; r < n; ++r) {
    const int c = rule.color(r);
    out.colors[static_cast<std::size_t>(r)] = c;
    small = small && c < n;
  }
  std::vector<SplitGroup> by_index(small ? members.size() : 0);
  std::map<int, SplitGroup> by_map;
  for (int r = 0; r < n; ++r) {
    const int c = out.colors[static_cast<std::size_t>(r)];
    if (c < 0) continue;
    const int node = sim::node_of(topology, members[static_cast<std::size_t>(r)]);
    SplitGroup& g = small ? by_index[static_cast<std::size_t>(c)] : by_map[c];
    if (g.size++ == 0) {
      g.color = c;
      g.node = node;
    }
    g.inter = g.inter || node != g.node;
  }
  for (const SplitGroup& g : by_index)
    if (g.size > 0) out.groups.push_back(g);
  for (const auto& [c, g] : by_map) out.groups.push_back(g);
  for (std::size_t i = 0; i < out.groups.size(); ++i) {
    const SplitGroup& g = out.groups[i];
    const sim::LinkCost l = sim::link_cost(topology, g.inter);
    if (i == 0) {
      out.worst = l;
    } else if (!same_link(l, out.worst) || g.size != out.groups.front().size) {
      out.uneven = true;
      if (l.beta > out.worst.beta || (l.beta == out.worst.beta && l.alpha > out.worst.alpha))
        out.worst = l;
    }
  }
  return out;
}

}  // namespace

void SymmetricClock::share_splits(std::shared_ptr<SplitMemo> memo) {
  // The memo keys a group by the memo's own entry (the world: none), so no group may exist yet.
  if (state_->split_calls > 0)
    throw std::logic_error("SymmetricClock: share_splits called after a split");
  state_->split_memo = std::move(memo);
}

std::unique_ptr<comm::Communicator> SymmetricClock::do_split(int color, int key,
                                                             const comm::SplitOptions& o) {
  ClockState& s = *state_;
  if (s.splits.empty())
    throw std::logic_error("SymmetricClock: split called without a SplitRule for it");
  const SplitRule rule = std::move(s.splits.front());
  s.splits.pop_front();
  const std::size_t place = s.split_calls++;
  if (rule.color(rank_) != color || rule.key(rank_) != key)
    throw std::logic_error("SymmetricClock: split arguments differ from the stated rule");
  // A split synchronises (SimWorld: a zero-cost collective whose end the compute clock joins).
  const double end = meet(s.now(), "split", o.name);
  s.comm_free = end;
  s.compute = std::max(s.compute, end);
  std::optional<SplitLayout> own_layout;
  SplitLayout* layout = nullptr;
  if (s.split_memo) {
    const auto k = std::pair{place, group_id_};
    auto it = s.split_memo->layouts.find(k);
    if (it == s.split_memo->layouts.end())
      it = s.split_memo->layouts.emplace(k, split_layout(rule, members_, s.topology)).first;
    layout = &it->second;
  } else {
    layout = &own_layout.emplace(split_layout(rule, members_, s.topology));
  }
  if (layout->uneven && s.asymmetry.empty())
    s.asymmetry = "split \"" + o.name + "\" makes groups of different sizes or links";
  if (color < 0) return nullptr;
  const auto own_of = [&] {
    std::vector<std::pair<int, int>> own;  // (key, group rank) of this rank's colour
    const int n = size();
    for (int r = 0; r < n; ++r)
      if (layout->colors[static_cast<std::size_t>(r)] == color) own.push_back({rule.key(r), r});
    std::sort(own.begin(), own.end());
    SplitLayout::Own out;
    out.ranks.reserve(own.size());
    for (const auto& [k, r] : own) out.ranks.push_back(members_[static_cast<std::size_t>(r)]);
    out.name = std::make_shared<const std::string>((o.name.empty() ? "split" : o.name) +
                                                   comm::rank_list(out.ranks));
    return out;
  };
  std::optional<SplitLayout::Own> own_here;
  const SplitLayout::Own* own = nullptr;
  if (s.split_memo) {
    auto it = layout->own.find(color);
    if (it == layout->own.end()) it = layout->own.emplace(color, own_of()).first;
    own = &it->second;
  } else {
    own = &own_here.emplace(own_of());
  }
  // Ranks differ: charge the slowest group (an upper bound).
  const sim::LinkCost link =
      layout->uneven ? layout->worst : sim::link_cost(s.topology, layout->find(color)->inter);
  const int me = world_rank();
  const std::vector<int>& mine = own->ranks;
  const int r = static_cast<int>(std::find(mine.begin(), mine.end(), me) - mine.begin());
  const bool listed = std::find(s.listed.begin(), s.listed.end(), o.name) != s.listed.end();
  auto group =
      std::unique_ptr<SymmetricClock>(new SymmetricClock(state_, mine, r, own->name, link, listed));
  if (s.split_memo) group->group_id_ = own;
  return group;
}

}  // namespace shardcheck::sim
