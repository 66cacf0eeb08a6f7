// DeviceCompute (device_compute.hpp): stage, run the gpu::ops kernel, copy back, synchronise.
#include "gpu/device_compute.hpp"

#include <cuda_runtime_api.h>

#include <array>
#include <climits>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "gpu/ops.hpp"

namespace shardcheck::gpu {

namespace {

// Throws on an error, after clearing it from the thread's last error (so no later, unrelated
// cudaGetLastError reports it again).
void cuda_check(cudaError_t e, const char* op) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string("gpu::DeviceCompute::") + op + ": " +
                             cudaGetErrorString(e));
  }
}

template <class T>
bool is_2d(const ref::Tensor<T>& t) {
  return t.rank() == 2;
}

// Every dimension positive (no launch or cuBLAS call on an empty operand) and within int.
bool dims_ok(std::initializer_list<int64_t> dims) {
  for (const int64_t d : dims)
    if (d <= 0 || d > INT_MAX) return false;
  return true;
}

}  // namespace

struct DeviceCompute::Impl {
  explicit Impl(int device) : ctx(device) {}
  ~Impl() {
    cudaSetDevice(ctx.device());
    for (const Slot& s : slots)
      if (s.p != nullptr) cudaFree(s.p);
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  cudaStream_t stream() const { return static_cast<cudaStream_t>(ctx.stream()); }

  // Device scratch slot i with room for n elements of U (grow-only; earlier ops have finished).
  template <class U>
  U* slot(std::size_t i, std::size_t n, const char* op) {
    Slot& s = slots.at(i);
    const std::size_t bytes = n * sizeof(U);
    if (s.bytes < bytes) {
      if (s.p != nullptr) cuda_check(cudaFree(s.p), op);
      s.p = nullptr;
      s.bytes = 0;
      const std::size_t alloc = (bytes + 255) / 256 * 256;
      cuda_check(cudaMalloc(&s.p, alloc), op);
      s.bytes = alloc;
    }
    return static_cast<U*>(s.p);
  }
  template <class U>
  U* up(std::size_t i, const U* host, std::size_t n, const char* op) {
    U* d = slot<U>(i, n, op);
    if (n > 0)
      cuda_check(cudaMemcpyAsync(d, host, n * sizeof(U), cudaMemcpyHostToDevice, stream()), op);
    return d;
  }
  template <class T>
  T* up(std::size_t i, const ref::Tensor<T>& t, const char* op) {
    return up(i, t.data(), static_cast<std::size_t>(t.numel()), op);
  }
  template <class U>
  void down(U* host, const U* dev, std::size_t n, const char* op) {
    if (n > 0)
      cuda_check(cudaMemcpyAsync(host, dev, n * sizeof(U), cudaMemcpyDeviceToHost, stream()), op);
  }
  template <class T>
  void down(ref::Tensor<T>& t, const T* dev, const char* op) {
    down(t.data(), dev, static_cast<std::size_t>(t.numel()), op);
  }

  // Binds the device on this thread, runs fn (which enqueues uploads, kernels and downloads) and
  // waits for the stream. On an error the stream is drained first, so no copy touches host memory
  // after the exception leaves.
  template <class Fn>
  void run(const char* op, Fn&& fn) {
    // The thread's last error may hold a failure of an earlier, unrelated runtime call (a probe, a
    // bad device ordinal); gpu::ops reads cudaGetLastError after its launches, so clear it first.
    (void)cudaGetLastError();
    cuda_check(cudaSetDevice(ctx.device()), op);
    try {
      fn();
    } catch (...) {
      cudaStreamSynchronize(stream());
      throw;
    }
    cuda_check(cudaStreamSynchronize(stream()), op);
    cuda_check(cudaGetLastError(), op);
  }

  struct Slot {
    void* p = nullptr;
    std::size_t bytes = 0;
  };
  ops::Context ctx;
  std::array<Slot, 8> slots{};
};

DeviceCompute::DeviceCompute(int device) : device_(device) {
  cuda_check(cudaSetDevice(device), "DeviceCompute");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, device), "DeviceCompute");
  name_ = "cuda:" + std::to_string(device) + " (" + prop.name + ")";
  impl_ = std::make_unique<Impl>(device);
}

DeviceCompute::~DeviceCompute() = default;

std::string DeviceCompute::name() const {
  return name_;
}

namespace {

using Impl = DeviceCompute::Impl;

// The ops proper: false when the device op does not apply (shape, size), else computed.
template <class T>
bool linear_fwd(Impl& m, const ref::Tensor<T>& x, const ref::Tensor<T>& w, ref::Tensor<T>& y,
                bool transposed) {
  if (!is_2d(x) || !is_2d(w) || !is_2d(y)) return false;
  const int64_t rows = x.dim(0), in = x.dim(1), out = transposed ? w.dim(0) : w.dim(1);
  if ((transposed ? w.dim(1) : w.dim(0)) != in || y.dim(0) != rows || y.dim(1) != out) return false;
  if (!dims_ok({rows, in, out})) return false;
  const char* op = transposed ? "linear_t_forward" : "linear_forward";
  m.run(op, [&] {
    const T* dx = m.up(0, x, op);
    const T* dw = m.up(1, w, op);
    T* dy = m.slot<T>(2, static_cast<std::size_t>(y.numel()), op);
    if (transposed)
      ops::linear_t_forward(m.ctx, dx, dw, dy, rows, in, out);
    else
      ops::linear_forward(m.ctx, dx, dw, dy, rows, in, out);
    m.down(y, dy, op);
  });
  return true;
}

template <class T>
bool linear_bwd(Impl& m, const ref::Tensor<T>& dy, const ref::Tensor<T>& x, const ref::Tensor<T>& w,
                ref::Tensor<T>& dx, ref::Tensor<T>& dw, bool transposed) {
  if (!is_2d(dy) || !is_2d(x) || !is_2d(w) || !is_2d(dx) || dw.shape() != w.shape()) return false;
  const int64_t rows = x.dim(0), in = x.dim(1), out = transposed ? w.dim(0) : w.dim(1);
  if ((transposed ? w.dim(1) : w.dim(0)) != in || dy.dim(0) != rows || dy.dim(1) != out ||
      dx.shape() != x.shape())
    return false;
  if (!dims_ok({rows, in, out})) return false;
  const char* op = transposed ? "linear_t_backward" : "linear_backward";
  m.run(op, [&] {
    const T* d_dy = m.up(0, dy, op);
    const T* d_x = m.up(1, x, op);
    const T* d_w = m.up(2, w, op);
    T* d_dx = m.slot<T>(3, static_cast<std::size_t>(dx.numel()), op);
    T* d_dw = m.up(4, dw, op);  // the kernel adds into it
    if (transposed)
      ops::linear_t_backward(m.ctx, d_dy, d_x, d_w, d_dx, d_dw, rows, in, out);
    else
      ops::linear_backward(m.ctx, d_dy, d_x, d_w, d_dx, d_dw, rows, in, out);
    m.down(dx, d_dx, op);
    m.down(dw, d_dw, op);
  });
  return true;
}

template <class T>
bool rmsnorm_fwd(Impl& m, const ref::Tensor<T>& x, const ref::Tensor<T>& w, ref::Tensor<T>& y,
                 std::vector<T>* rstd) {
  if (!is_2d(x) || y.shape() != x.shape()) return false;
  const int64_t rows = x.dim(0), h = x.dim(1);
  if (w.numel() != h || !dims_ok({rows, h})) return false;
  if (rstd != nullptr && static_cast<int64_t>(rstd->size()) != rows) return false;
  const char* op = "rmsnorm_forward";
  m.run(op, [&] {
    const T* d_x = m.up(0, x, op);
    const T* d_w = m.up(1, w, op);
    T* d_y = m.slot<T>(2, static_cast<std::size_t>(y.numel()), op);
    T* d_r = rstd != nullptr ? m.slot<T>(3, rstd->size(), op) : nullptr;
    ops::rmsnorm_forward(m.ctx, d_x, d_w, d_y, d_r, rows, h);
    m.down(y, d_y, op);
    if (rstd != nullptr) m.down(rstd->data(), d_r, rstd->size(), op);
  });
  return true;
}

template <class T>
bool rmsnorm_bwd(Impl& m, const ref::Tensor<T>& dy, const ref::Tensor<T>& x,
                 const ref::Tensor<T>& w, const std::vector<T>& rstd, ref::Tensor<T>& dx,
                 ref::Tensor<T>& dw) {
  if (!is_2d(x) || dy.shape() != x.shape() || dx.shape() != x.shape()) return false;
  const int64_t rows = x.dim(0), h = x.dim(1);
  if (w.numel() != h || dw.numel() != h || static_cast<int64_t>(rstd.size()) != rows ||
      !dims_ok({rows, h}))
    return false;
  const char* op = "rmsnorm_backward";
  m.run(op, [&] {
    const T* d_dy = m.up(0, dy, op);
    const T* d_x = m.up(1, x, op);
    const T* d_w = m.up(2, w, op);
    const T* d_r = m.up(3, rstd.data(), rstd.size(), op);
    T* d_dx = m.slot<T>(4, static_cast<std::size_t>(dx.numel()), op);
    T* d_dw = m.up(5, dw, op);  // the kernel adds into it
    ops::rmsnorm_backward(m.ctx, d_dy, d_x, d_w, d_r, d_dx, d_dw, rows, h);
    m.down(dx, d_dx, op);
    m.down(dw, d_dw, op);
  });
  return true;
}

template <class T>
bool gelu_fwd(Impl& m, const ref::Tensor<T>& x, ref::Tensor<T>& y) {
  const int64_t n = x.numel();
  if (y.numel() != n || n <= 0) return false;
  const char* op = "gelu_forward";
  m.run(op, [&] {
    const T* d_x = m.up(0, x, op);
    T* d_y = m.slot<T>(1, static_cast<std::size_t>(n), op);
    ops::gelu_forward(m.ctx, d_x, d_y, n);
    m.down(y, d_y, op);
  });
  return true;
}

template <class T>
bool gelu_bwd(Impl& m, const ref::Tensor<T>& dy, const ref::Tensor<T>& x, ref::Tensor<T>& dx) {
  const int64_t n = x.numel();
  if (dy.numel() != n || dx.numel() != n || n <= 0) return false;
  const char* op = "gelu_backward";
  m.run(op, [&] {
    const T* d_dy = m.up(0, dy, op);
    const T* d_x = m.up(1, x, op);
    T* d_dx = m.slot<T>(2, static_cast<std::size_t>(n), op);
    ops::gelu_backward(m.ctx, d_dy, d_x, d_dx, n);
    m.down(dx, d_dx, op);
  });
  return true;
}

template <class T>
bool xent_fwd(Impl& m, const ref::Tensor<T>& logits, std::span<const int32_t> targets,
              std::span<const int32_t> mask, std::vector<double>& loss) {
  if (!is_2d(logits)) return false;
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  const auto r = static_cast<std::size_t>(rows);
  if (!dims_ok({rows, vocab}) || targets.size() < r || mask.size() < r || loss.size() != r)
    return false;
  const char* op = "cross_entropy_forward";
  m.run(op, [&] {
    const T* d_l = m.up(0, logits, op);
    const int32_t* d_t = m.up(1, targets.data(), r, op);
    const int32_t* d_m = m.up(2, mask.data(), r, op);
    double* d_loss = m.slot<double>(3, r, op);
    ops::cross_entropy_forward(m.ctx, d_l, d_t, d_m, d_loss, rows, vocab);
    m.down(loss.data(), d_loss, r, op);
  });
  return true;
}

template <class T>
bool xent_bwd(Impl& m, const ref::Tensor<T>& logits, std::span<const int32_t> targets,
              std::span<const double> weight, ref::Tensor<T>& dlogits) {
  if (!is_2d(logits) || dlogits.shape() != logits.shape()) return false;
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  const auto r = static_cast<std::size_t>(rows);
  if (!dims_ok({rows, vocab}) || targets.size() < r || weight.size() < r) return false;
  const char* op = "cross_entropy_backward";
  m.run(op, [&] {
    const T* d_l = m.up(0, logits, op);
    const int32_t* d_t = m.up(1, targets.data(), r, op);
    const double* d_w = m.up(2, weight.data(), r, op);
    T* d_d = m.slot<T>(3, static_cast<std::size_t>(dlogits.numel()), op);
    ops::cross_entropy_backward(m.ctx, d_l, d_t, d_w, d_d, rows, vocab);
    m.down(dlogits, d_d, op);
  });
  return true;
}

ops::Dropout dropout_of(const ref::AttentionDropout& d) {
  return {d.rate, d.seed, d.layer, d.step, d.sequence, d.head_offset, d.total_heads};
}

// s, d of q/k/v [s, heads*d], [s, kv*d] as the kernels take them, or false.
template <class T>
bool attention_dims(const ref::Tensor<T>& q, const ref::Tensor<T>& k, const ref::Tensor<T>& v,
                    ref::AttentionShape shape, int64_t& s, int64_t& d) {
  const int a = shape.heads, kv = shape.kv_heads;
  if (a <= 0 || kv <= 0 || a % kv != 0 || !is_2d(q) || !is_2d(k) || !is_2d(v)) return false;
  s = q.dim(0);
  if (q.dim(1) % a != 0) return false;
  d = q.dim(1) / a;
  if (!dims_ok({s, d, s * a, q.dim(1)})) return false;
  if (k.dim(0) != s || v.dim(0) != s || k.dim(1) != kv * d || v.dim(1) != kv * d) return false;
  return static_cast<std::size_t>(s) * sizeof(T) <= kMaxAttentionRowBytes;
}

template <class T>
bool attn_fwd(Impl& m, const ref::Tensor<T>& q, const ref::Tensor<T>& k, const ref::Tensor<T>& v,
              std::span<const int32_t> doc_ids, ref::AttentionShape shape,
              const ref::AttentionDropout& dropout, ref::Tensor<T>& o, ref::Tensor<T>* probs) {
  int64_t s = 0, d = 0;
  if (!attention_dims(q, k, v, shape, s, d)) return false;
  const auto su = static_cast<std::size_t>(s);
  if (doc_ids.size() < su || o.shape() != q.shape()) return false;
  if (probs != nullptr && probs->numel() != shape.heads * s * s) return false;
  const char* op = "attention_forward";
  m.run(op, [&] {
    const T* d_q = m.up(0, q, op);
    const T* d_k = m.up(1, k, op);
    const T* d_v = m.up(2, v, op);
    const int32_t* d_doc = m.up(3, doc_ids.data(), su, op);
    T* d_o = m.slot<T>(4, static_cast<std::size_t>(o.numel()), op);
    T* d_p =
        probs != nullptr ? m.slot<T>(5, static_cast<std::size_t>(probs->numel()), op) : nullptr;
    ops::attention_forward(m.ctx, d_q, d_k, d_v, d_doc, s, shape.heads, shape.kv_heads, d,
                           dropout_of(dropout), d_o, d_p);
    m.down(o, d_o, op);
    if (probs != nullptr) m.down(*probs, d_p, op);
  });
  return true;
}

template <class T>
bool attn_bwd(Impl& m, const ref::Tensor<T>& dout, const ref::Tensor<T>& q, const ref::Tensor<T>& k,
              const ref::Tensor<T>& v, ref::AttentionShape shape,
              const ref::AttentionDropout& dropout, const ref::Tensor<T>& probs, ref::Tensor<T>& dq,
              ref::Tensor<T>& dk, ref::Tensor<T>& dv) {
  int64_t s = 0, d = 0;
  if (!attention_dims(q, k, v, shape, s, d)) return false;
  if (dout.shape() != q.shape() || dq.shape() != q.shape() || dk.shape() != k.shape() ||
      dv.shape() != v.shape() || probs.numel() != shape.heads * s * s)
    return false;
  const char* op = "attention_backward";
  m.run(op, [&] {
    const T* d_do = m.up(0, dout, op);
    const T* d_q = m.up(1, q, op);
    const T* d_k = m.up(2, k, op);
    const T* d_v = m.up(3, v, op);
    const T* d_p = m.up(4, probs, op);
    T* d_dq = m.slot<T>(5, static_cast<std::size_t>(dq.numel()), op);
    T* d_dk = m.slot<T>(6, static_cast<std::size_t>(dk.numel()), op);
    T* d_dv = m.slot<T>(7, static_cast<std::size_t>(dv.numel()), op);
    ops::attention_backward(m.ctx, d_do, d_q, d_k, d_v, d_p, s, shape.heads, shape.kv_heads, d,
                            dropout_of(dropout), d_dq, d_dk, d_dv);
    m.down(dq, d_dq, op);
    m.down(dk, d_dk, op);
    m.down(dv, d_dv, op);
  });
  return true;
}

}  // namespace

// The overrides (ref::on_device counts what they computed and what they declined).

#define SC_DEVICE_COMPUTE_DEFINE(T)                                                              \
  bool DeviceCompute::linear_forward(const ref::Tensor<T>& x, const ref::Tensor<T>& w,           \
                                     ref::Tensor<T>& y) {                                        \
    return (linear_fwd(*impl_, x, w, y, false));                                                 \
  }                                                                                              \
  bool DeviceCompute::linear_backward(const ref::Tensor<T>& dy, const ref::Tensor<T>& x,         \
                                      const ref::Tensor<T>& w, ref::Tensor<T>& dx,               \
                                      ref::Tensor<T>& dw) {                                      \
    return (linear_bwd(*impl_, dy, x, w, dx, dw, false));                                        \
  }                                                                                              \
  bool DeviceCompute::linear_t_forward(const ref::Tensor<T>& x, const ref::Tensor<T>& w,         \
                                       ref::Tensor<T>& y) {                                      \
    return (linear_fwd(*impl_, x, w, y, true));                                                  \
  }                                                                                              \
  bool DeviceCompute::linear_t_backward(const ref::Tensor<T>& dy, const ref::Tensor<T>& x,       \
                                        const ref::Tensor<T>& w, ref::Tensor<T>& dx,             \
                                        ref::Tensor<T>& dw) {                                    \
    return (linear_bwd(*impl_, dy, x, w, dx, dw, true));                                         \
  }                                                                                              \
  bool DeviceCompute::rmsnorm_forward(const ref::Tensor<T>& x, const ref::Tensor<T>& w,          \
                                      ref::Tensor<T>& y, std::vector<T>* rstd) {                 \
    return (rmsnorm_fwd(*impl_, x, w, y, rstd));                                                 \
  }                                                                                              \
  bool DeviceCompute::rmsnorm_backward(const ref::Tensor<T>& dy, const ref::Tensor<T>& x,        \
                                       const ref::Tensor<T>& w, const std::vector<T>& rstd,      \
                                       ref::Tensor<T>& dx, ref::Tensor<T>& dw) {                 \
    return (rmsnorm_bwd(*impl_, dy, x, w, rstd, dx, dw));                                        \
  }                                                                                              \
  bool DeviceCompute::gelu_forward(const ref::Tensor<T>& x, ref::Tensor<T>& y) {                 \
    return (gelu_fwd(*impl_, x, y));                                                             \
  }                                                                                              \
  bool DeviceCompute::gelu_backward(const ref::Tensor<T>& dy, const ref::Tensor<T>& x,           \
                                    ref::Tensor<T>& dx) {                                        \
    return (gelu_bwd(*impl_, dy, x, dx));                                                        \
  }                                                                                              \
  bool DeviceCompute::cross_entropy_forward(                                                     \
      const ref::Tensor<T>& logits, std::span<const int32_t> targets,                            \
      std::span<const int32_t> mask, std::vector<double>& loss) {                                \
    return (xent_fwd(*impl_, logits, targets, mask, loss));                                      \
  }                                                                                              \
  bool DeviceCompute::cross_entropy_backward(                                                    \
      const ref::Tensor<T>& logits, std::span<const int32_t> targets,                            \
      std::span<const double> weight, ref::Tensor<T>& dlogits) {                                 \
    return (xent_bwd(*impl_, logits, targets, weight, dlogits));                                 \
  }                                                                                              \
  bool DeviceCompute::attention_forward(                                                         \
      const ref::Tensor<T>& q, const ref::Tensor<T>& k, const ref::Tensor<T>& v,                 \
      std::span<const int32_t> doc_ids, ref::AttentionShape shape,                               \
      const ref::AttentionDropout& dropout, ref::Tensor<T>& o, ref::Tensor<T>* probs) {          \
    return (attn_fwd(*impl_, q, k, v, doc_ids, shape, dropout, o, probs));                       \
  }                                                                                              \
  bool DeviceCompute::attention_backward(                                                        \
      const ref::Tensor<T>& dout, const ref::Tensor<T>& q, const ref::Tensor<T>& k,              \
      const ref::Tensor<T>& v, ref::AttentionShape shape, const ref::AttentionDropout& dropout,  \
      const ref::Tensor<T>& probs, ref::Tensor<T>& dq, ref::Tensor<T>& dk, ref::Tensor<T>& dv) { \
    return (attn_bwd(*impl_, dout, q, k, v, shape, dropout, probs, dq, dk, dv));                 \
  }

SC_DEVICE_COMPUTE_DEFINE(double)
SC_DEVICE_COMPUTE_DEFINE(float)
#undef SC_DEVICE_COMPUTE_DEFINE

}  // namespace shardcheck::gpu
