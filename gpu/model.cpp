// GpuModel: reference/blocks.cpp's order of operations with device buffers and gpu/ops.
#include "gpu/model.hpp"

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <type_traits>
#include <vector>

namespace shardcheck::gpu {

namespace {

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("GpuModel: ") + what + ": " + cudaGetErrorString(e));
}

// Device scratch for one step, from the stream's memory pool (cudaMallocAsync), freed in stream
// order at the end of it.
template <class T>
struct Scratch {
  cudaStream_t stream;
  std::vector<void*> ptrs;
  explicit Scratch(cudaStream_t s) : stream(s) {}
  ~Scratch() {
    for (void* p : ptrs) cudaFreeAsync(p, stream);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class U = T>
  U* get(std::size_t n) {
    void* p = nullptr;
    ok(cudaMallocAsync(&p, (n == 0 ? 1 : n) * sizeof(U), stream), "cudaMallocAsync");
    ptrs.push_back(p);
    return static_cast<U*>(p);
  }
  template <class U>
  U* upload(const std::vector<U>& h) {
    U* d = get<U>(h.size());
    ok(cudaMemcpyAsync(d, h.data(), h.size() * sizeof(U), cudaMemcpyHostToDevice, stream),
       "upload");
    return d;
  }
};

std::string lname(int layer, const char* what) {
  return "layers." + std::to_string(layer) + "." + what;
}

}  // namespace

template <class T>
GpuModel<T>::GpuModel(const ref::ModelConfig& cfg, const ref::ParamMap<T>& params, int device)
    : cfg_(cfg), shapes_(params.zeros_like()) {
  for (int l = 0; l < cfg.layers; ++l)
    if (cfg.is_moe_layer(l))
      throw std::invalid_argument("GpuModel: MoE layers are not implemented on the GPU yet");
  if (cfg.gated_mlp())  // the strategies' ref:: ops run SwiGLU on a device (DeviceCompute)
    throw std::invalid_argument("GpuModel: the SwiGLU MLP is not implemented on the GPU yet");
  if (!(cfg.rope == ref::RopeConfig{}))  // its kernel rotates interleaved pairs at theta 10000
    throw std::invalid_argument(
        "GpuModel: only the default RoPE (theta 10000, interleaved, unscaled) is implemented");
  ctx_ = std::make_unique<ops::Context>(device);
  try {
    for (const auto& e : params) {
      const std::size_t n = static_cast<std::size_t>(e.value.numel());
      T* p = alloc(n);
      T* g = alloc(n);
      ok(cudaMemcpy(p, e.value.data(), n * sizeof(T), cudaMemcpyHostToDevice), "upload");
      ok(cudaMemset(g, 0, n * sizeof(T)), "cudaMemset");
      params_[e.name] = p;
      grads_[e.name] = g;
    }
    // The copies above ran on the default stream; the ops' stream does not wait for it.
    ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  } catch (...) {  // no destructor runs for a throwing constructor: free what was allocated
    cudaDeviceSynchronize();
    for (void* p : allocations_) cudaFree(p);
    throw;
  }
}

template <class T>
GpuModel<T>::~GpuModel() {
  // Work still queued on the model's stream (round_grads_to_bf16 does not wait) may read these.
  cudaSetDevice(ctx_->device());
  cudaStreamSynchronize(static_cast<cudaStream_t>(ctx_->stream()));
  for (void* p : allocations_) cudaFree(p);
}

template <class T>
T* GpuModel<T>::alloc(std::size_t n) {
  void* p = nullptr;
  ok(cudaMalloc(&p, (n == 0 ? 1 : n) * sizeof(T)), "cudaMalloc");
  allocations_.push_back(p);
  return static_cast<T*>(p);
}

template <class T>
T* GpuModel<T>::param(const std::string& name) const {
  const auto it = params_.find(name);
  if (it == params_.end()) throw std::invalid_argument("GpuModel: no parameter " + name);
  return it->second;
}

template <class T>
T* GpuModel<T>::grad(const std::string& name) const {
  return grads_.at(name);
}

template <class T>
void GpuModel<T>::zero_grads() {
  // On the model's (non-blocking) stream, after the steps still queued there that add into them.
  ok(cudaSetDevice(ctx_->device()), "cudaSetDevice");
  auto* stream = static_cast<cudaStream_t>(ctx_->stream());
  for (const auto& e : shapes_)
    ok(cudaMemsetAsync(grads_.at(e.name), 0, static_cast<std::size_t>(e.value.numel()) * sizeof(T),
                       stream),
       "cudaMemsetAsync");
  ctx_->synchronize();
}

template <class T>
void GpuModel<T>::round_grads_to_bf16() {
  if constexpr (std::is_same_v<T, float>) {
    ok(cudaSetDevice(ctx_->device()), "cudaSetDevice");
    for (const auto& e : shapes_) ops::round_to_bf16(*ctx_, grads_.at(e.name), e.value.numel());
  } else {
    throw std::invalid_argument(
        "GpuModel::round_grads_to_bf16: the bf16 recipe is GpuModel<float>");
  }
}

template <class T>
ref::ParamMap<T> GpuModel<T>::grads() const {
  ok(cudaSetDevice(ctx_->device()), "cudaSetDevice");
  ctx_->synchronize();
  ref::ParamMap<T> out = shapes_.zeros_like();
  for (auto& e : out)
    ok(cudaMemcpy(e.value.data(), grads_.at(e.name),
                  static_cast<std::size_t>(e.value.numel()) * sizeof(T), cudaMemcpyDeviceToHost),
       "download");
  return out;
}

template <class T>
ref::SequenceLoss GpuModel<T>::step(const ref::Sequence& seq, const ref::StepContext& sctx,
                                    bool backward) {
  ref::check_sequence(seq);
  // The reference throws on these; on the device a token >= vocab would make embedding_backward
  // add past the gradient table, and a bad target would give a NaN loss.
  for (std::size_t t = 0; t < seq.tokens.size(); ++t) {
    if (seq.tokens[t] < 0 || seq.tokens[t] >= cfg_.vocab)
      throw std::invalid_argument("GpuModel: token out of vocabulary");
    if (seq.loss_mask[t] != 0 && (seq.targets[t] < 0 || seq.targets[t] >= cfg_.vocab))
      throw std::invalid_argument("GpuModel: target out of vocabulary");
  }
  ok(cudaSetDevice(ctx_->device()), "cudaSetDevice");  // the thread may not be the constructor's
  ops::Context& c = *ctx_;
  const auto st = static_cast<cudaStream_t>(c.stream());
  const int64_t s = static_cast<int64_t>(seq.tokens.size());
  const int64_t h = cfg_.hidden, V = cfg_.vocab, F = cfg_.ffn, d = cfg_.head_dim();
  const int A = cfg_.heads, KV = cfg_.kv_heads;
  const auto n = [](int64_t x) { return static_cast<std::size_t>(x); };
  Scratch<T> m(st);
  const int32_t* tokens = m.upload(seq.tokens);
  const int32_t* targets = m.upload(seq.targets);
  const int32_t* mask = m.upload(seq.loss_mask);
  const int32_t* docs = m.upload(seq.doc_ids);
  const int32_t* pos = m.upload(seq.positions);

  struct Layer {
    T *x_in, *rstd1, *a, *q, *k, *v, *probs, *o, *x_mid, *rstd2, *b, *up, *act;
  };
  std::vector<Layer> L(static_cast<std::size_t>(cfg_.layers));
  T* x = m.get(n(s * h));
  ops::embedding_forward(c, param("embed.weight"), tokens, x, s, V, h);
  for (int l = 0; l < cfg_.layers; ++l) {
    Layer& y = L[static_cast<std::size_t>(l)];
    const ops::Dropout drop{cfg_.dropout, sctx.seed, l, sctx.step, seq.index, 0, 0};
    y.x_in = x;
    y.rstd1 = m.get(n(s));
    y.a = m.get(n(s * h));
    y.q = m.get(n(s * A * d));
    y.k = m.get(n(s * KV * d));
    y.v = m.get(n(s * KV * d));
    y.probs = m.get(n(A * s * s));
    y.o = m.get(n(s * A * d));
    y.x_mid = m.get(n(s * h));
    y.rstd2 = m.get(n(s));
    y.b = m.get(n(s * h));
    y.up = m.get(n(s * F));
    y.act = m.get(n(s * F));
    ops::rmsnorm_forward(c, y.x_in, param(lname(l, "attn_norm.weight")), y.a, y.rstd1, s, h);
    ops::linear_forward(c, y.a, param(lname(l, "attn.wq")), y.q, s, h, A * d);
    ops::linear_forward(c, y.a, param(lname(l, "attn.wk")), y.k, s, h, KV * d);
    ops::linear_forward(c, y.a, param(lname(l, "attn.wv")), y.v, s, h, KV * d);
    ops::rope_apply(c, y.q, pos, s, A, d, false);
    ops::rope_apply(c, y.k, pos, s, KV, d, false);
    ops::attention_forward(c, y.q, y.k, y.v, docs, s, A, KV, d, drop, y.o, y.probs);
    ops::linear_forward(c, y.o, param(lname(l, "attn.wo")), y.x_mid, s, A * d, h);
    ops::add_inplace(c, y.x_mid, y.x_in, s * h);
    ops::rmsnorm_forward(c, y.x_mid, param(lname(l, "mlp_norm.weight")), y.b, y.rstd2, s, h);
    ops::linear_forward(c, y.b, param(lname(l, "mlp.w_up")), y.up, s, h, F);
    ops::gelu_forward(c, y.up, y.act, s * F);
    T* out = m.get(n(s * h));
    ops::linear_forward(c, y.act, param(lname(l, "mlp.w_down")), out, s, F, h);
    ops::add_inplace(c, out, y.x_mid, s * h);
    x = out;
  }
  T* hrstd = m.get(n(s));
  T* hy = m.get(n(s * h));
  T* logits = m.get(n(s * V));
  ops::rmsnorm_forward(c, x, param("final_norm.weight"), hy, hrstd, s, h);
  if (cfg_.tie_embeddings)
    ops::linear_t_forward(c, hy, param("embed.weight"), logits, s, h, V);
  else
    ops::linear_forward(c, hy, param("lm_head.weight"), logits, s, h, V);
  double* dloss = m.template get<double>(n(s));
  ops::cross_entropy_forward(c, logits, targets, mask, dloss, s, V);
  ref::SequenceLoss loss;
  loss.token_loss.resize(n(s));
  ok(cudaMemcpyAsync(loss.token_loss.data(), dloss, n(s) * sizeof(double), cudaMemcpyDeviceToHost,
                     st),
     "download");

  std::vector<double> weight;  // outlives its upload (freed after the synchronize below)
  if (backward) {
    weight.assign(n(s), 0.0);
    for (std::size_t t = 0; t < weight.size(); ++t)
      weight[t] = seq.loss_mask[t] != 0 ? sctx.token_weight : 0.0;
    const double* dweight = m.upload(weight);
    T* dlogits = m.get(n(s * V));
    ops::cross_entropy_backward(c, logits, targets, dweight, dlogits, s, V);
    T* dy = m.get(n(s * h));
    if (cfg_.tie_embeddings)
      ops::linear_t_backward(c, dlogits, hy, param("embed.weight"), dy, grad("embed.weight"), s, h,
                             V);
    else
      ops::linear_backward(c, dlogits, hy, param("lm_head.weight"), dy, grad("lm_head.weight"), s,
                           h, V);
    T* dx = m.get(n(s * h));
    ops::rmsnorm_backward(c, dy, x, param("final_norm.weight"), hrstd, dx,
                          grad("final_norm.weight"), s, h);
    T* tmp = m.get(n(s * h));
    T* dact = m.get(n(s * F));
    T* dup = m.get(n(s * F));
    T* db = m.get(n(s * h));
    T* d_o = m.get(n(s * A * d));
    T* dq = m.get(n(s * A * d));
    T* dk = m.get(n(s * KV * d));
    T* dv = m.get(n(s * KV * d));
    T* da = m.get(n(s * h));
    for (int l = cfg_.layers - 1; l >= 0; --l) {
      const Layer& y = L[static_cast<std::size_t>(l)];
      const ops::Dropout drop{cfg_.dropout, sctx.seed, l, sctx.step, seq.index, 0, 0};
      ops::linear_backward(c, dx, y.act, param(lname(l, "mlp.w_down")), dact,
                           grad(lname(l, "mlp.w_down")), s, F, h);
      ops::gelu_backward(c, dact, y.up, dup, s * F);
      ops::linear_backward(c, dup, y.b, param(lname(l, "mlp.w_up")), db, grad(lname(l, "mlp.w_up")),
                           s, h, F);
      ops::rmsnorm_backward(c, db, y.x_mid, param(lname(l, "mlp_norm.weight")), y.rstd2, tmp,
                            grad(lname(l, "mlp_norm.weight")), s, h);
      ops::add_inplace(c, dx, tmp, s * h);
      ops::linear_backward(c, dx, y.o, param(lname(l, "attn.wo")), d_o, grad(lname(l, "attn.wo")),
                           s, A * d, h);
      ops::attention_backward(c, d_o, y.q, y.k, y.v, y.probs, s, A, KV, d, drop, dq, dk, dv);
      ops::rope_apply(c, dq, pos, s, A, d, true);
      ops::rope_apply(c, dk, pos, s, KV, d, true);
      ops::linear_backward(c, dq, y.a, param(lname(l, "attn.wq")), da, grad(lname(l, "attn.wq")), s,
                           h, A * d);
      ops::linear_backward(c, dk, y.a, param(lname(l, "attn.wk")), tmp, grad(lname(l, "attn.wk")),
                           s, h, KV * d);
      ops::add_inplace(c, da, tmp, s * h);
      ops::linear_backward(c, dv, y.a, param(lname(l, "attn.wv")), tmp, grad(lname(l, "attn.wv")),
                           s, h, KV * d);
      ops::add_inplace(c, da, tmp, s * h);
      ops::rmsnorm_backward(c, da, y.x_in, param(lname(l, "attn_norm.weight")), y.rstd1, tmp,
                            grad(lname(l, "attn_norm.weight")), s, h);
      ops::add_inplace(c, dx, tmp, s * h);
    }
    ops::embedding_backward(c, dx, tokens, grad("embed.weight"), s, h);
  }
  c.synchronize();  // also keeps the scratch alive until the kernels are done
  loss.tokens = seq.mask_count();
  for (double t : loss.token_loss) loss.loss_sum += t;
  return loss;
}

template class GpuModel<float>;
template class GpuModel<double>;

}  // namespace shardcheck::gpu
