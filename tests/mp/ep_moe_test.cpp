// Expert-parallel MoE against ref::moe_forward / ref::moe_backward on each full sequence: every DP
// rank holds a different sequence (split further over CP and, with SP, TP ranks); the EP group is
// carved out of the DP x CP ranks, so its members may hold different sequences or different CP
// shards of one. y, dx, aux and dropped per sequence, drouter summed over the sequence's ranks,
// and each expert's gradients summed over every sequence the EP group processed.
#include "parallel/mp/ep_moe.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include "comm/mesh.hpp"
#include "parallel/testing.hpp"
#include "sim/world.hpp"

namespace shardcheck::parallel {
namespace {

constexpr int64_t kSeq = 16, kHidden = 8, kFfn = 12;
constexpr double kAuxWeight = 0.5;

template <class T>
ref::Tensor<T> random_tensor(ref::Shape shape, std::mt19937_64& rng, double scale) {
  std::uniform_real_distribution<double> u(-scale, scale);
  ref::Tensor<T> t(std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<T>(u(rng));
  return t;
}

// Max |a - b| over max |b| (absolute when b is all zero).
template <class T>
double rel_err(const ref::Tensor<T>& a, const ref::Tensor<T>& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double num = 0, den = 0;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    den = std::max(den, std::abs(static_cast<double>(b[i])));
  }
  return den > 0 ? num / den : num;
}

struct Case {
  comm::MeshShape shape;
  bool sp = false;
  double capacity_factor = 1.0;
};

// One problem: a sequence per EP rank, shared router and experts, and the reference's answers.
template <class T>
struct Problem {
  ref::MoeSpec spec;
  std::vector<ref::Tensor<T>> x, dy;
  std::vector<std::vector<int32_t>> doc;
  ref::Tensor<T> router;
  std::vector<ref::Tensor<T>> w_up, w_down;
  // Reference.
  std::vector<ref::Tensor<T>> y, dx, drouter;
  std::vector<double> aux;
  std::vector<int64_t> dropped;
  std::vector<ref::Tensor<T>> dw_up, dw_down;  // summed over sequences
};

template <class T>
Problem<T> make_problem(int sequences, double capacity_factor, uint64_t seed) {
  Problem<T> p;
  p.spec = {.experts = 4, .top_k = 2, .capacity_factor = capacity_factor, .aux_coef = 0.1};
  std::mt19937_64 rng(seed);
  p.router = random_tensor<T>({kHidden, p.spec.experts}, rng, 1.0);
  for (int e = 0; e < p.spec.experts; ++e) {
    p.w_up.push_back(random_tensor<T>({kHidden, kFfn}, rng, 0.5));
    p.w_down.push_back(random_tensor<T>({kFfn, kHidden}, rng, 0.5));
    p.dw_up.emplace_back(ref::Shape{kHidden, kFfn});
    p.dw_down.emplace_back(ref::Shape{kFfn, kHidden});
  }
  std::vector<const ref::Tensor<T>*> up, down;
  std::vector<ref::Tensor<T>*> dup, ddown;
  for (int e = 0; e < p.spec.experts; ++e) {
    up.push_back(&p.w_up[e]);
    down.push_back(&p.w_down[e]);
    dup.push_back(&p.dw_up[e]);
    ddown.push_back(&p.dw_down[e]);
  }
  for (int q = 0; q < sequences; ++q) {
    p.x.push_back(random_tensor<T>({kSeq, kHidden}, rng, 1.0));
    p.dy.push_back(random_tensor<T>({kSeq, kHidden}, rng, 1.0));
    // Two documents and padding rows, placed differently per sequence (one inside a chunk).
    std::vector<int32_t> doc(static_cast<std::size_t>(kSeq));
    for (int64_t t = 0; t < kSeq; ++t) doc[static_cast<std::size_t>(t)] = t < 7 + q ? 0 : 1;
    doc[static_cast<std::size_t>(kSeq - 1)] = -1;
    doc[static_cast<std::size_t>(kSeq - 2)] = -1;
    doc[static_cast<std::size_t>(3 + q % 5)] = -1;
    p.doc.push_back(doc);
    ref::MoeCache<T> cache;
    double aux = 0;
    p.y.push_back(ref::moe_forward(p.x[q], doc, p.router, {}, up, down, p.spec, &cache, &aux));
    p.aux.push_back(aux);
    p.dropped.push_back(cache.routing.dropped);
    ref::Tensor<T> dr({kHidden, p.spec.experts});
    p.dx.push_back(ref::moe_backward(p.dy[q], p.x[q], p.router, {}, up, down, p.spec, cache,
                                     kAuxWeight, dr, {}, dup, ddown));
    p.drouter.push_back(std::move(dr));
  }
  return p;
}

// What the ranks computed, gathered per sequence / expert (rows land at their global positions).
template <class T>
struct Result {
  std::vector<ref::Tensor<T>> y, dx, drouter;
  std::vector<std::vector<double>> aux;  // per sequence, every rank's value
  std::vector<std::vector<int64_t>> dropped;
  std::vector<ref::Tensor<T>> dw_up, dw_down;
};

template <class T>
Result<T> run_ep(const Case& cs, const Problem<T>& p,
                 testing::Mutation planted = testing::Mutation::kNone) {
  const comm::DeviceMesh mesh(cs.shape, "tp-cp-ep-dp-pp");
  const int world = mesh.world_size(), ep = cs.shape.ep, e_n = p.spec.experts, epl = e_n / ep;
  const TokenLayout layout(kSeq, cs.shape.cp, cs.shape.tp, cs.sp);
  struct RankOut {
    std::vector<int64_t> rows;
    ref::Tensor<T> y, dx, drouter;
    double aux = 0;
    int64_t dropped = 0;
    std::vector<ref::Tensor<T>> dw_up, dw_down;
  };
  std::vector<RankOut> outs(static_cast<std::size_t>(world));
  sim::SimWorld(world).run([&](comm::Communicator& w) {
    comm::MeshGroups groups = comm::build_groups(mesh, w);
    const EpGroups g{.ep = groups.ep.get(), .cp = groups.cp.get(), .tp = groups.tp.get()};
    const int q = mesh.coord(w.rank(), comm::Axis::dp);  // the sequence this rank works on
    const int first = g.ep->rank() * epl;                // its first expert
    RankOut& o = outs[static_cast<std::size_t>(w.rank())];
    o.rows = layout.rows(g.cp->rank(), g.tp->rank());
    std::vector<const ref::Tensor<T>*> up, down;
    std::vector<ref::Tensor<T>*> dup, ddown;
    for (int j = 0; j < epl; ++j) {
      up.push_back(&p.w_up[static_cast<std::size_t>(first + j)]);
      down.push_back(&p.w_down[static_cast<std::size_t>(first + j)]);
      o.dw_up.emplace_back(ref::Shape{kHidden, kFfn});
      o.dw_down.emplace_back(ref::Shape{kFfn, kHidden});
    }
    for (int j = 0; j < epl; ++j) {
      dup.push_back(&o.dw_up[static_cast<std::size_t>(j)]);
      ddown.push_back(&o.dw_down[static_cast<std::size_t>(j)]);
    }
    EpMoeCache<T> cache;
    const auto qs = static_cast<std::size_t>(q);
    o.y = ep_moe_forward(g, layout, take_rows(p.x[qs], o.rows), p.doc[qs], p.router, {}, up, down,
                         p.spec, cache, &o.aux, &o.dropped, planted);
    o.drouter = ref::Tensor<T>({kHidden, e_n});
    o.dx = ep_moe_backward(g, take_rows(p.dy[qs], o.rows), cache, kAuxWeight, o.drouter, {}, dup,
                           ddown);
  });
  Result<T> r;
  const int sequences = cs.shape.dp;
  for (int q = 0; q < sequences; ++q) {
    r.y.emplace_back(ref::Shape{kSeq, kHidden});
    r.dx.emplace_back(ref::Shape{kSeq, kHidden});
    r.drouter.emplace_back(ref::Shape{kHidden, e_n});
  }
  r.aux.resize(static_cast<std::size_t>(sequences));
  r.dropped.resize(static_cast<std::size_t>(sequences));
  for (int e = 0; e < e_n; ++e) {
    r.dw_up.emplace_back(ref::Shape{kHidden, kFfn});
    r.dw_down.emplace_back(ref::Shape{kFfn, kHidden});
  }
  for (int rank = 0; rank < world; ++rank) {
    const RankOut& o = outs[static_cast<std::size_t>(rank)];
    const auto q = static_cast<std::size_t>(mesh.coord(rank, comm::Axis::dp));
    const int first = mesh.coord(rank, comm::Axis::ep) * epl;
    r.aux[q].push_back(o.aux);
    r.dropped[q].push_back(o.dropped);
    // Without SP the TP ranks hold replicas: count the sequence's rows once (TP rank 0).
    if (!cs.sp && mesh.coord(rank, comm::Axis::tp) != 0) continue;
    for (std::size_t i = 0; i < o.rows.size(); ++i)
      for (int64_t c = 0; c < kHidden; ++c) {
        r.y[q].at(o.rows[i], c) = o.y.at(static_cast<int64_t>(i), c);
        r.dx[q].at(o.rows[i], c) = o.dx.at(static_cast<int64_t>(i), c);
      }
    ref::add_inplace(r.drouter[q], o.drouter);
    for (int j = 0; j < epl; ++j) {
      const auto e = static_cast<std::size_t>(first + j);
      ref::add_inplace(r.dw_up[e], o.dw_up[static_cast<std::size_t>(j)]);
      ref::add_inplace(r.dw_down[e], o.dw_down[static_cast<std::size_t>(j)]);
    }
  }
  return r;
}

// Largest relative error over every compared tensor; aux/dropped mismatches are reported too.
template <class T>
double worst_error(const Problem<T>& p, const Result<T>& r, std::string* where) {
  double worst = 0;
  auto note = [&](double e, const std::string& name) {
    if (e > worst) {
      worst = e;
      *where = name;
    }
  };
  for (std::size_t q = 0; q < r.y.size(); ++q) {
    const std::string s = "seq " + std::to_string(q) + " ";
    note(rel_err(r.y[q], p.y[q]), s + "y");
    note(rel_err(r.dx[q], p.dx[q]), s + "dx");
    note(rel_err(r.drouter[q], p.drouter[q]), s + "drouter");
    for (const double a : r.aux[q])
      note(std::abs(a - p.aux[q]) / std::max(std::abs(p.aux[q]), 1e-300), s + "aux");
    for (const int64_t d : r.dropped[q]) note(d == p.dropped[q] ? 0.0 : 1.0, s + "dropped");
  }
  for (std::size_t e = 0; e < r.dw_up.size(); ++e) {
    note(rel_err(r.dw_up[e], p.dw_up[e]), "dw_up " + std::to_string(e));
    note(rel_err(r.dw_down[e], p.dw_down[e]), "dw_down " + std::to_string(e));
  }
  return worst;
}

template <class T>
void expect_parity(const Case& cs, double tol) {
  const Problem<T> p = make_problem<T>(cs.shape.dp, cs.capacity_factor, 7 + cs.shape.ep);
  const Result<T> r = run_ep(cs, p);
  std::string where;
  const double err = worst_error(p, r, &where);
  EXPECT_LE(err, tol) << "worst at " << where;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {.shape = {.ep = 1}},
      {.shape = {.dp = 2, .ep = 2}},
      {.shape = {.dp = 4, .ep = 4}},
      {.shape = {.dp = 2, .ep = 2}, .capacity_factor = 0.5},
      {.shape = {.dp = 4, .ep = 4}, .capacity_factor = 0.5},
      {.shape = {.dp = 2, .cp = 2, .ep = 2}},
      {.shape = {.dp = 2, .cp = 2, .ep = 2}, .capacity_factor = 0.5},
      {.shape = {.dp = 2, .tp = 2, .ep = 2}, .sp = true},
      {.shape = {.dp = 2, .tp = 2, .ep = 2}, .sp = true, .capacity_factor = 0.5},
      {.shape = {.dp = 2, .tp = 2, .cp = 2, .ep = 2}, .sp = true, .capacity_factor = 0.5},
      {.shape = {.dp = 2, .tp = 2, .ep = 2}, .sp = false, .capacity_factor = 0.5},
      // Capacity never binds.
      {.shape = {.dp = 4, .ep = 4}, .capacity_factor = 2.0},
      {.shape = {.dp = 2, .tp = 2, .cp = 2, .ep = 2}, .sp = true, .capacity_factor = 2.0},
      // EP folded over CP: one EP group of every DP and CP rank; the EP group is the CP group.
      {.shape = {.dp = 2, .cp = 2, .ep = 4}, .capacity_factor = 0.5},
      {.shape = {.dp = 2, .tp = 2, .cp = 2, .ep = 4}, .sp = true},
      {.shape = {.dp = 4, .cp = 2, .ep = 2}, .capacity_factor = 0.5},
      {.shape = {.dp = 1, .cp = 2, .ep = 2}},
  };
  return all;
}

std::string describe(const Case& c) {
  return "dp " + std::to_string(c.shape.dp) + " ep " + std::to_string(c.shape.ep) + " cp " +
         std::to_string(c.shape.cp) + " tp " + std::to_string(c.shape.tp) + (c.sp ? " sp" : "") +
         " capacity_factor " + std::to_string(c.capacity_factor);
}

TEST(EpMoe, CapacityBindsInTheDropCases) {
  // The parity cases with capacity_factor 0.5 must really drop (else the mutation test is empty);
  // with 2.0 nothing drops.
  for (const int ep : {2, 4}) {
    for (const int64_t d : make_problem<double>(ep, 2.0, 7 + ep).dropped) EXPECT_EQ(d, 0);
    const Problem<double> p = make_problem<double>(ep, 0.5, 7 + ep);
    for (const int64_t d : p.dropped) EXPECT_GT(d, 0);
    const Problem<double> loose = make_problem<double>(ep, 1.0, 7 + ep);
    int64_t any = 0;
    for (const int64_t d : loose.dropped) any += d;
    EXPECT_LT(any, std::accumulate(p.dropped.begin(), p.dropped.end(), int64_t{0}));
  }
}

TEST(EpMoe, MatchesReferenceF64) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(describe(c));
    expect_parity<double>(c, 1e-12);
  }
}

TEST(EpMoe, MatchesReferenceF32) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(describe(c));
    expect_parity<float>(c, 2e-5);
  }
}

TEST(EpMoe, OutputsAndAuxAreBitwiseTheReferences) {
  // Per-row work (router softmax, expert MLP, combine in choice order) is the reference's code in
  // the reference's order, so y and aux match exactly; only cross-row sums (weight gradients) may
  // be summed in another order.
  for (const Case& c : {cases()[4], cases()[9], cases()[13]}) {
    SCOPED_TRACE(describe(c));
    const Problem<double> p = make_problem<double>(c.shape.dp, c.capacity_factor, 3);
    const Result<double> r = run_ep(c, p);
    for (std::size_t q = 0; q < r.y.size(); ++q) {
      EXPECT_EQ(r.y[q].vec(), p.y[q].vec());
      for (const double a : r.aux[q]) EXPECT_EQ(a, p.aux[q]);
    }
  }
}

TEST(EpMoe, MutationRouteDroppedTokensIsCaught) {
  for (const Case& c : {cases()[3], cases()[6], cases()[8], cases()[13], cases()[15]}) {
    SCOPED_TRACE(describe(c));
    const Problem<double> p = make_problem<double>(c.shape.dp, c.capacity_factor, 7 + c.shape.ep);
    const Result<double> r = run_ep(c, p, testing::Mutation::kRouteDroppedTokens);
    double y_err = 0;
    for (std::size_t q = 0; q < r.y.size(); ++q) y_err = std::max(y_err, rel_err(r.y[q], p.y[q]));
    EXPECT_GT(y_err, 1e-3) << "the planted bug went unnoticed";
  }
}

TEST(EpMoe, ExpertsNotDivisibleByEpAreNamed) {
  const Problem<double> p = make_problem<double>(3, 1.0, 1);
  const TokenLayout layout(kSeq, 1, 1, false);
  std::string message;
  try {
    sim::SimWorld(3).run([&](comm::Communicator& w) {
      EpMoeCache<double> cache;
      const EpGroups g{.ep = &w, .cp = nullptr, .tp = nullptr};
      const std::vector<const ref::Tensor<double>*> one = {&p.w_up[0]};
      (void)ep_moe_forward(g, layout, p.x[0], p.doc[0], p.router, {}, one, one, p.spec, cache,
                           nullptr, nullptr);
    });
  } catch (const sim::RankFailure& f) {
    try {
      f.rethrow_cause();
    } catch (const LayoutError& e) {
      message = e.what();
    }
  }
  EXPECT_NE(message.find("4 experts"), std::string::npos) << message;
  EXPECT_NE(message.find("ep = 3"), std::string::npos) << message;
}

}  // namespace
}  // namespace shardcheck::parallel
