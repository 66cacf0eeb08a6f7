// reference/compute.hpp: a thread's Compute receives every heavy op of the model (so a strategy's
// rank computes wherever its thread's Compute does), declining falls back to the CPU loops, the
// scope is per thread and nests, and a wrong implementation shows in the model's results.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <map>
#include <string>
#include <thread>
#include <type_traits>

#include "reference/compute.hpp"
#include "reference/model.hpp"
#include "tests/reference/test_util.hpp"

namespace shardcheck::ref {
namespace {

// Runs each op on the CPU loops (its own scope uninstalls it), counting the calls per op name, and
// optionally scaling one element of linear_forward's output (a planted device bug).
class Delegating final : public Compute {
 public:
  std::map<std::string, int> calls;
  double perturb = 0.0;
  bool decline = false;

  std::string name() const override { return "delegating"; }

#define SC_BOTH(decl_d, decl_f, body) \
  bool decl_d override {              \
    return body;                      \
  }                                   \
  bool decl_f override {              \
    return body;                      \
  }

  SC_BOTH(linear_forward(const Tensor<double>& x, const Tensor<double>& w, Tensor<double>& y),
          linear_forward(const Tensor<float>& x, const Tensor<float>& w, Tensor<float>& y),
          run("linear_forward", [&] {
            y = ref::linear_forward(x, w);
            if (perturb != 0.0) y[0] = static_cast<std::decay_t<decltype(y[0])>>(y[0] * perturb);
          }))
  SC_BOTH(linear_backward(const Tensor<double>& dy, const Tensor<double>& x,
                          const Tensor<double>& w, Tensor<double>& dx, Tensor<double>& dw),
          linear_backward(const Tensor<float>& dy, const Tensor<float>& x, const Tensor<float>& w,
                          Tensor<float>& dx, Tensor<float>& dw),
          run("linear_backward", [&] { dx = ref::linear_backward(dy, x, w, dw); }))
  SC_BOTH(linear_t_forward(const Tensor<double>& x, const Tensor<double>& w, Tensor<double>& y),
          linear_t_forward(const Tensor<float>& x, const Tensor<float>& w, Tensor<float>& y),
          run("linear_t_forward", [&] { y = ref::linear_t_forward(x, w); }))
  SC_BOTH(linear_t_backward(const Tensor<double>& dy, const Tensor<double>& x,
                            const Tensor<double>& w, Tensor<double>& dx, Tensor<double>& dw),
          linear_t_backward(const Tensor<float>& dy, const Tensor<float>& x, const Tensor<float>& w,
                            Tensor<float>& dx, Tensor<float>& dw),
          run("linear_t_backward", [&] { dx = ref::linear_t_backward(dy, x, w, dw); }))
  SC_BOTH(rmsnorm_forward(const Tensor<double>& x, const Tensor<double>& w, Tensor<double>& y,
                          std::vector<double>* rstd),
          rmsnorm_forward(const Tensor<float>& x, const Tensor<float>& w, Tensor<float>& y,
                          std::vector<float>* rstd),
          run("rmsnorm_forward", [&] { y = ref::rmsnorm_forward(x, w, rstd); }))
  SC_BOTH(rmsnorm_backward(const Tensor<double>& dy, const Tensor<double>& x,
                           const Tensor<double>& w, const std::vector<double>& rstd,
                           Tensor<double>& dx, Tensor<double>& dw),
          rmsnorm_backward(const Tensor<float>& dy, const Tensor<float>& x, const Tensor<float>& w,
                           const std::vector<float>& rstd, Tensor<float>& dx, Tensor<float>& dw),
          run("rmsnorm_backward", [&] { dx = ref::rmsnorm_backward(dy, x, w, rstd, dw); }))
  SC_BOTH(gelu_forward(const Tensor<double>& x, Tensor<double>& y),
          gelu_forward(const Tensor<float>& x, Tensor<float>& y),
          run("gelu_forward", [&] { y = ref::gelu_forward(x); }))
  SC_BOTH(gelu_backward(const Tensor<double>& dy, const Tensor<double>& x, Tensor<double>& dx),
          gelu_backward(const Tensor<float>& dy, const Tensor<float>& x, Tensor<float>& dx),
          run("gelu_backward", [&] { dx = ref::gelu_backward(dy, x); }))
  SC_BOTH(cross_entropy_forward(const Tensor<double>& logits, std::span<const int32_t> targets,
                                std::span<const int32_t> mask, std::vector<double>& loss),
          cross_entropy_forward(const Tensor<float>& logits, std::span<const int32_t> targets,
                                std::span<const int32_t> mask, std::vector<double>& loss),
          run("cross_entropy_forward",
              [&] { loss = ref::cross_entropy_forward(logits, targets, mask); }))
  SC_BOTH(cross_entropy_backward(const Tensor<double>& logits, std::span<const int32_t> targets,
                                 std::span<const double> weight, Tensor<double>& d),
          cross_entropy_backward(const Tensor<float>& logits, std::span<const int32_t> targets,
                                 std::span<const double> weight, Tensor<float>& d),
          run("cross_entropy_backward",
              [&] { d = ref::cross_entropy_backward(logits, targets, weight); }))
  SC_BOTH(attention_forward(const Tensor<double>& q, const Tensor<double>& k,
                            const Tensor<double>& v, std::span<const int32_t> doc_ids,
                            AttentionShape shape, const AttentionDropout& dropout,
                            Tensor<double>& o, Tensor<double>* probs),
          attention_forward(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                            std::span<const int32_t> doc_ids, AttentionShape shape,
                            const AttentionDropout& dropout, Tensor<float>& o,
                            Tensor<float>* probs),
          run("attention_forward",
              [&] { o = ref::attention_forward(q, k, v, doc_ids, shape, dropout, probs); }))
  SC_BOTH(attention_backward(const Tensor<double>& dout, const Tensor<double>& q,
                             const Tensor<double>& k, const Tensor<double>& v, AttentionShape shape,
                             const AttentionDropout& dropout, const Tensor<double>& probs,
                             Tensor<double>& dq, Tensor<double>& dk, Tensor<double>& dv),
          attention_backward(const Tensor<float>& dout, const Tensor<float>& q,
                             const Tensor<float>& k, const Tensor<float>& v, AttentionShape shape,
                             const AttentionDropout& dropout, const Tensor<float>& probs,
                             Tensor<float>& dq, Tensor<float>& dk, Tensor<float>& dv),
          run("attention_backward",
              [&] { ref::attention_backward(dout, q, k, v, shape, dropout, probs, dq, dk, dv); }))
#undef SC_BOTH

 private:
  template <class F>
  bool run(const std::string& op, F&& f) {
    ++calls[op];
    if (decline) return false;
    const ComputeScope cpu(nullptr);
    f();
    return true;
  }
};

struct Step {
  LossParts parts;
  ParamMap<double> grads;
};

Step model_step(const ModelConfig& cfg) {
  const Batch batch = test::tiny_batch(cfg, 2);
  const ParamMap<double> params = test::random_params(cfg, 11);
  StepContext ctx = test::global_context(batch);
  ctx.seed = 3;
  ctx.step = 2;
  Step s{{}, params.zeros_like()};
  s.parts = forward_backward(cfg, params, std::span<const Sequence>(batch), ctx, &s.grads);
  return s;
}

ModelConfig dropout_moe() {
  ModelConfig cfg = test::tiny_moe();
  cfg.dropout = 0.2;
  return cfg;
}

void expect_bitwise(const Step& a, const Step& b) {
  EXPECT_EQ(a.parts.loss(), b.parts.loss());
  for (const auto& e : a.grads)
    for (int64_t i = 0; i < e.value.numel(); ++i)
      ASSERT_EQ(e.value[i], b.grads[e.name][i]) << e.name << "[" << i << "]";
}

TEST(Compute, EveryHeavyOpOfTheModelIsDispatchedToTheThreadsCompute) {
  for (bool tied : {true, false}) {
    ModelConfig cfg = dropout_moe();
    cfg.tie_embeddings = tied;
    const Step cpu = model_step(cfg);
    Delegating dev;
    Step routed;
    {
      const ComputeScope scope(&dev);
      EXPECT_EQ(thread_compute(), &dev);
      routed = model_step(cfg);
    }
    EXPECT_EQ(thread_compute(), nullptr);
    for (const char* op :
         {"linear_forward", "linear_backward", "rmsnorm_forward", "rmsnorm_backward",
          "gelu_forward", "gelu_backward", "cross_entropy_forward", "cross_entropy_backward",
          "attention_forward", "attention_backward"})
      EXPECT_GT(dev.calls[op], 0) << op;
    // The tied head reads the embedding transposed.
    EXPECT_EQ(dev.calls["linear_t_forward"] > 0, tied);
    EXPECT_EQ(dev.calls["linear_t_backward"] > 0, tied);
    int64_t total = 0;
    for (const auto& [op, n] : dev.calls) total += n;
    EXPECT_EQ(dev.ops_run(), total);  // every one counted as computed there
    EXPECT_EQ(dev.ops_declined(), 0);
    expect_bitwise(cpu, routed);  // the same loops ran, only elsewhere
  }
}

TEST(Compute, DecliningFallsBackToTheCpuLoops) {
  const Step cpu = model_step(dropout_moe());
  Delegating dev;
  dev.decline = true;
  const ComputeScope scope(&dev);
  const Step declined = model_step(dropout_moe());
  EXPECT_GT(dev.calls["linear_forward"], 0);
  EXPECT_EQ(dev.ops_run(), 0);
  EXPECT_GT(dev.ops_declined(), 0);
  expect_bitwise(cpu, declined);
}

TEST(Compute, TheScopeIsPerThreadAndNests) {
  Delegating outer, inner;
  const ComputeScope a(&outer);
  {
    const ComputeScope b(&inner);
    EXPECT_EQ(thread_compute(), &inner);
    Compute* seen = &inner;
    std::thread([&] { seen = thread_compute(); }).join();
    EXPECT_EQ(seen, nullptr);  // another thread (a rank) has its own
  }
  EXPECT_EQ(thread_compute(), &outer);
  // f32 ops reach the same object.
  const Tensor<float> x({2, 3}, 1.0f), w({3, 4}, 0.5f);
  const Tensor<float> y = linear_forward(x, w);
  EXPECT_EQ(outer.calls["linear_forward"], 1);
  EXPECT_EQ(y[0], 1.5f);
}

// A device GEMM off by 0.1% in one element: the loss and the gradients move, so a parity check
// against the CPU reference sees it.
TEST(Compute, AWrongDeviceOpChangesTheResults) {
  const Step cpu = model_step(dropout_moe());
  Delegating dev;
  dev.perturb = 1.001;
  const ComputeScope scope(&dev);
  const Step bad = model_step(dropout_moe());
  EXPECT_GT(std::abs(bad.parts.loss() - cpu.parts.loss()), 1e-9);
  double worst = 0.0;
  for (const auto& e : cpu.grads)
    for (int64_t i = 0; i < e.value.numel(); ++i)
      worst = std::max(worst, std::abs(e.value[i] - bad.grads[e.name][i]));
  EXPECT_GT(worst, 1e-9);
}

}  // namespace
}  // namespace shardcheck::ref
