// run_pipeline on the simulator: a toy model (virtual stage vs multiplies by a known matrix W_vs,
// loss 0.5*|y|^2 on the last) gives the single-stage gradients for every schedule, p in {1, 2, 4}
// and v in {1, 2}; and the bubble measured on the simulator's timeline equals (p-1)/(v*m + p-1)
// with equal stage costs and free communication, and exceeds it when communication costs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "parallel/mp/pipeline.hpp"
#include "sim/world.hpp"

namespace shardcheck::parallel {
namespace {

// Toy model: activation entering virtual stage vs for microbatch mb is [rows(mb), width(vs)].
int64_t rows_of(int mb) {
  return 1 + mb % 3;
}
int64_t width_of(int vs) {
  return 2 + vs % 3;
}
template <class T>
ref::Tensor<T> weight(int vs) {  // [width(vs), width(vs+1)]
  ref::Tensor<T> w({width_of(vs), width_of(vs + 1)});
  for (int64_t i = 0; i < w.dim(0); ++i) {
    for (int64_t j = 0; j < w.dim(1); ++j) {
      w.at(i, j) =
          static_cast<T>((i == j ? 0.9 : 0.0) + 0.1 * ((i * 7 + j * 3 + vs * 5) % 11) / 11.0);
    }
  }
  return w;
}
template <class T>
ref::Tensor<T> input(int mb) {
  ref::Tensor<T> x({rows_of(mb), width_of(0)});
  for (int64_t r = 0; r < x.dim(0); ++r) {
    for (int64_t c = 0; c < x.dim(1); ++c)
      x.at(r, c) = static_cast<T>(0.3 * (mb + 1) - 0.1 * r + 0.05 * c);
  }
  return x;
}
// a [n, k] @ b [k, q], or a @ b^T when b_transposed (b [q, k]).
template <class T>
ref::Tensor<T> matmul(const ref::Tensor<T>& a, const ref::Tensor<T>& b, bool b_transposed) {
  const int64_t n = a.dim(0), k = a.dim(1), q = b_transposed ? b.dim(0) : b.dim(1);
  ref::Tensor<T> out({n, q});
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < q; ++j) {
      T acc = 0;
      for (int64_t t = 0; t < k; ++t) acc += a.at(i, t) * (b_transposed ? b.at(j, t) : b.at(t, j));
      out.at(i, j) = acc;
    }
  }
  return out;
}
// dW += x^T g.
template <class T>
void accumulate_xt_g(ref::Tensor<T>& dw, const ref::Tensor<T>& x, const ref::Tensor<T>& g) {
  for (int64_t r = 0; r < x.dim(0); ++r) {
    for (int64_t i = 0; i < x.dim(1); ++i) {
      for (int64_t j = 0; j < g.dim(1); ++j) dw.at(i, j) += x.at(r, i) * g.at(r, j);
    }
  }
}

template <class T>
struct Result {
  std::vector<ref::Tensor<T>> dw;  // per virtual stage
  std::vector<T> loss;             // per microbatch
};

template <class T>
Result<T> single_stage(int depth, int m) {
  Result<T> r;
  for (int vs = 0; vs < depth; ++vs) r.dw.emplace_back(ref::Shape{width_of(vs), width_of(vs + 1)});
  for (int mb = 0; mb < m; ++mb) {
    std::vector<ref::Tensor<T>> xs{input<T>(mb)};
    for (int vs = 0; vs < depth; ++vs) xs.push_back(matmul(xs.back(), weight<T>(vs), false));
    T loss = 0;
    for (const T y : xs.back().span()) loss += y * y / 2;
    r.loss.push_back(loss);
    ref::Tensor<T> g = xs.back();
    for (int vs = depth - 1; vs >= 0; --vs) {
      accumulate_xt_g(r.dw[static_cast<std::size_t>(vs)], xs[static_cast<std::size_t>(vs)], g);
      g = matmul(g, weight<T>(vs), true);
    }
  }
  return r;
}

// One stage's callbacks: keeps each (mb, chunk) input for its backward and its weight gradients.
template <class T>
PipeStage<T> toy_stage(comm::Communicator& pp, int v, Result<T>& out) {
  const int p = pp.size(), s = pp.rank(), depth = p * v;
  auto saved = std::make_shared<std::map<std::pair<int, int>, ref::Tensor<T>>>();
  PipeStage<T> st;
  st.activation_shape = [](int mb, int vs) { return ref::Shape{rows_of(mb), width_of(vs)}; };
  st.forward = [=, &pp, &out](int mb, int chunk, ref::Tensor<T> in) {
    const int vs = chunk * p + s;
    EXPECT_EQ(in.numel() == 0, vs == 0);
    if (vs == 0) in = input<T>(mb);
    ref::Tensor<T> y = matmul(in, weight<T>(vs), false);
    pp.compute({.name = "toy forward", .flops = 2.0 * static_cast<double>(y.numel() * in.dim(1))});
    (*saved)[{mb, chunk}] = std::move(in);
    if (vs == depth - 1) {
      T loss = 0;
      for (const T yv : y.span()) loss += yv * yv / 2;
      out.loss[static_cast<std::size_t>(mb)] = loss;
      (*saved)[{mb, -1}] = y;  // dL/dy = y
    }
    return y;
  };
  st.backward = [=, &pp, &out](int mb, int chunk, ref::Tensor<T> g) {
    const int vs = chunk * p + s;
    EXPECT_EQ(g.numel() == 0, vs == depth - 1);
    if (vs == depth - 1) g = saved->at({mb, -1});
    const ref::Tensor<T>& x = saved->at({mb, chunk});
    accumulate_xt_g(out.dw[static_cast<std::size_t>(vs)], x, g);
    ref::Tensor<T> dx = matmul(g, weight<T>(vs), true);
    pp.compute({.name = "toy backward", .flops = 4.0 * static_cast<double>(g.numel() * x.dim(1))});
    return dx;
  };
  return st;
}

template <class T>
void expect_parity(PipeSchedule s, int p, int v, int m) {
  SCOPED_TRACE(std::string(name_of(s)) + " p=" + std::to_string(p) + " v=" + std::to_string(v) +
               " m=" + std::to_string(m));
  const int depth = p * v;
  const Result<T> want = single_stage<T>(depth, m);
  Result<T> got;
  for (int vs = 0; vs < depth; ++vs)
    got.dw.emplace_back(ref::Shape{width_of(vs), width_of(vs + 1)});
  got.loss.assign(static_cast<std::size_t>(m), T{-1});
  // Each rank writes only its own virtual stages' slots and the last stage's losses.
  sim::SimWorld(p).run(
      [&](comm::Communicator& pp) { run_pipeline<T>(pp, s, m, v, toy_stage<T>(pp, v, got)); });
  const double tol = std::is_same_v<T, double> ? 1e-12 : 1e-5;
  for (int mb = 0; mb < m; ++mb) {
    const auto i = static_cast<std::size_t>(mb);
    EXPECT_NEAR(got.loss[i], want.loss[i], tol * std::abs(want.loss[i])) << "mb " << mb;
  }
  for (int vs = 0; vs < depth; ++vs) {
    const auto& g = got.dw[static_cast<std::size_t>(vs)];
    const auto& w = want.dw[static_cast<std::size_t>(vs)];
    for (int64_t i = 0; i < w.numel(); ++i) {
      EXPECT_NEAR(g[i], w[i], tol * (1 + std::abs(w[i]))) << "vs " << vs << " element " << i;
    }
  }
}

template <class T>
class PipelineRun : public ::testing::Test {};
using Types = ::testing::Types<double, float>;
TYPED_TEST_SUITE(PipelineRun, Types);

TYPED_TEST(PipelineRun, EveryScheduleGivesTheSingleStageGradients) {
  for (const int p : {1, 2, 4}) {
    for (const int m : {p, 2 * p, 2 * p + 1}) {
      expect_parity<TypeParam>(PipeSchedule::gpipe, p, 1, m);
      expect_parity<TypeParam>(PipeSchedule::one_f_one_b, p, 1, m);
      if (m % p == 0) expect_parity<TypeParam>(PipeSchedule::interleaved, p, 2, m);
    }
  }
}

TEST(PipelineRunErrors, WrongOutputShapeIsNamed) {
  try {
    sim::SimWorld(2).run([&](comm::Communicator& pp) {
      PipeStage<double> st;
      st.activation_shape = [](int, int) { return ref::Shape{2, 2}; };
      st.forward = [](int, int, ref::Tensor<double>) { return ref::Tensor<double>({2, 3}); };
      st.backward = [](int, int, ref::Tensor<double>) { return ref::Tensor<double>({2, 2}); };
      run_pipeline<double>(pp, PipeSchedule::one_f_one_b, 2, 1, st);
    });
    ADD_FAILURE() << "no error";
  } catch (const sim::RankFailure& e) {
    EXPECT_NE(
        std::string(e.what()).find("returned shape [2, 3], but activation_shape(0, 1) is [2, 2]"),
        std::string::npos)
        << e.what();
  }
}

// Timing runs: every forward costs `fwd_flops`, every backward twice that; activations are
// [rows, cols] doubles. Returns each stage's measured bubble over the step [first start, last end].
std::vector<double> timed_bubbles(PipeSchedule s, int p, int v, int m, sim::Topology topo,
                                  double fwd_flops, int64_t rows = 1, int64_t cols = 1) {
  sim::SimWorld world(p, sim::SimOptions{.topology = topo, .record_timeline = true});
  world.run([&](comm::Communicator& pp) {
    PipeStage<double> st;
    st.activation_shape = [=](int, int) { return ref::Shape{rows, cols}; };
    st.forward = [&, rows, cols](int, int, ref::Tensor<double>) {
      pp.compute({.name = "forward", .flops = fwd_flops});
      return ref::Tensor<double>({rows, cols});
    };
    st.backward = [&, rows, cols](int, int, ref::Tensor<double>) {
      pp.compute({.name = "backward", .flops = 2 * fwd_flops});
      return ref::Tensor<double>({rows, cols});
    };
    pp.begin_step(1);
    run_pipeline<double>(pp, s, m, v, st);
  });
  double start = 1e300, end = -1e300;
  for (const sim::StepTime& t : world.step_times()) {
    start = std::min(start, t.start);
    end = std::max(end, t.end);
  }
  std::vector<std::vector<Interval>> busy(static_cast<std::size_t>(p));
  for (const sim::TimelineEvent& e : world.timeline()) {
    if (e.stream == sim::Stream::compute)
      busy[static_cast<std::size_t>(e.rank)].push_back({e.start, e.end});
  }
  std::vector<double> out;
  for (const auto& b : busy) out.push_back(measured_bubble(b, start, end));
  return out;
}

sim::Topology free_communication() {
  sim::Topology t;
  t.intra_node = {1e30, 0};
  t.inter_node = {1e30, 0};
  return t;
}

TEST(PipelineBubbleOnSim, EqualCostsAndFreeCommunicationGiveTheFormula) {
  struct Case {
    PipeSchedule s;
    int p, v, m;
  };
  const std::vector<Case> cases{
      {PipeSchedule::gpipe, 4, 1, 4},       {PipeSchedule::gpipe, 4, 1, 8},
      {PipeSchedule::one_f_one_b, 4, 1, 4}, {PipeSchedule::one_f_one_b, 4, 1, 8},
      {PipeSchedule::interleaved, 2, 2, 8}, {PipeSchedule::interleaved, 4, 2, 8},
      {PipeSchedule::interleaved, 4, 2, 4},  // m == p: Megatron's all-warmup order
      {PipeSchedule::interleaved, 4, 3, 8}, {PipeSchedule::one_f_one_b, 1, 1, 3},
  };
  for (const Case& c : cases) {
    const double want = bubble_formula(c.p, c.m, c.v);
    const auto got = timed_bubbles(c.s, c.p, c.v, c.m, free_communication(), 1e12);
    for (int r = 0; r < c.p; ++r) {
      EXPECT_NEAR(got[static_cast<std::size_t>(r)], want, 1e-9)
          << name_of(c.s) << " p=" << c.p << " v=" << c.v << " m=" << c.m << " stage " << r;
    }
  }
  // Interleaving shrinks the bubble: p = 4, m = 8 goes from 3/11 to 3/19.
  EXPECT_LT(timed_bubbles(PipeSchedule::interleaved, 4, 2, 8, free_communication(), 1e12)[0],
            timed_bubbles(PipeSchedule::one_f_one_b, 4, 1, 8, free_communication(), 1e12)[0]);
}

TEST(PipelineBubbleOnSim, CommunicationCostsShow) {
  // Default topology (NVLink: 3 us latency, 450 GB/s); forward ~10 us, activations 32 KiB.
  for (const PipeSchedule s : {PipeSchedule::gpipe, PipeSchedule::one_f_one_b}) {
    const auto got = timed_bubbles(s, 4, 1, 8, sim::Topology{}, 9.89e9, 64, 64);
    for (const double b : got) EXPECT_GT(b, bubble_formula(4, 8, 1) + 0.01) << name_of(s);
  }
  const auto got =
      timed_bubbles(PipeSchedule::interleaved, 4, 2, 8, sim::Topology{}, 9.89e9, 64, 64);
  for (const double b : got) EXPECT_GT(b, bubble_formula(4, 8, 2) + 0.01);
}

}  // namespace
}  // namespace shardcheck::parallel
