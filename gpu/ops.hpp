// CUDA versions of the reference model's ops (reference/ops.hpp), on device pointers, row-major
// [rows, features] like the reference, enqueued on the context's stream. Same math and the same
// conventions: backward functions return the input gradient in `dx` and ADD into parameter
// gradients. GEMMs are cuBLAS (f32 in pedantic math, no TF32, so f32 parity holds); the rest are
// kernels. f32 and f64. Errors throw std::runtime_error naming the op and the CUDA/cuBLAS error.
// Done: linear, linear_t, rmsnorm, gelu, embedding, cross-entropy, Philox draws, RoPE, attention
// (document mask, GQA, dropout), AdamW, gradient norm and clipping; bf16 rounding, conversions and
// tensor-core GEMMs (the bf16 section at the end). Not yet: MoE routing (see gpu/README.md).
#pragma once

#include <cstdint>

namespace shardcheck::gpu::ops {

// A cuBLAS handle bound to a device and a stream (nullptr: a new non-blocking stream).
class Context {
 public:
  explicit Context(int device = 0, void* stream = nullptr);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  void* stream() const { return stream_; }
  void* cublas() const { return handle_; }
  int device() const { return device_; }
  void synchronize() const;  // waits for the stream; throws on an asynchronous CUDA error

 private:
  int device_;
  void* stream_ = nullptr;
  void* handle_ = nullptr;
  bool owns_stream_ = false;
};

// y[rows,out] = x[rows,in] . w[in,out]
template <class T>
void linear_forward(Context& c, const T* x, const T* w, T* y, int64_t rows, int64_t in,
                    int64_t out);
// dx = dy . w^T; dw += x^T . dy
template <class T>
void linear_backward(Context& c, const T* dy, const T* x, const T* w, T* dx, T* dw, int64_t rows,
                     int64_t in, int64_t out);
// y[rows,out] = x[rows,in] . w^T, w [out,in] (the tied LM head)
template <class T>
void linear_t_forward(Context& c, const T* x, const T* w, T* y, int64_t rows, int64_t in,
                      int64_t out);
// dx = dy . w; dw += dy^T . x
template <class T>
void linear_t_backward(Context& c, const T* dy, const T* x, const T* w, T* dx, T* dw, int64_t rows,
                       int64_t in, int64_t out);

// y = x / sqrt(mean(x^2) + 1e-5) * w per row; rstd[rows] (may be null) = 1/sqrt(...)
template <class T>
void rmsnorm_forward(Context& c, const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t h);
template <class T>
void rmsnorm_backward(Context& c, const T* dy, const T* x, const T* w, const T* rstd, T* dx, T* dw,
                      int64_t rows, int64_t h);

// a[i] += b[i] (residual adds)
template <class T>
void add_inplace(Context& c, T* a, const T* b, int64_t n);

// gelu_tanh, elementwise over n
template <class T>
void gelu_forward(Context& c, const T* x, T* y, int64_t n);
template <class T>
void gelu_backward(Context& c, const T* dy, const T* x, T* dx, int64_t n);

// y[t] = table[tokens[t]], table [vocab, h]; dtable[tokens[t]] += dy[t] (atomic adds: the order
// of equal tokens' contributions is not fixed). Forward: a token outside [0, vocab) gives a zero
// row. Backward skips negative tokens but does not know vocab, so a token >= vocab writes past
// dtable: the reference throws on both, and callers must check tokens on the host first.
template <class T>
void embedding_forward(Context& c, const T* table, const int32_t* tokens, T* y, int64_t ntok,
                       int64_t vocab, int64_t h);
template <class T>
void embedding_backward(Context& c, const T* dy, const int32_t* tokens, T* dtable, int64_t ntok,
                        int64_t h);

// loss[r] = logsumexp(logits[r]) - logits[r][target[r]] (0 where mask[r] == 0), in f64.
template <class T>
void cross_entropy_forward(Context& c, const T* logits, const int32_t* targets, const int32_t* mask,
                           double* loss, int64_t rows, int64_t vocab);
// dlogits[r] = weight[r] * (softmax(logits[r]) - onehot(target[r])); rows with weight 0 are 0.
template <class T>
void cross_entropy_backward(Context& c, const T* logits, const int32_t* targets,
                            const double* weight, T* dlogits, int64_t rows, int64_t vocab);

// Counter-based draws identical to ref::RngStream{seed, stream, step} (stream = ref::stream_hash
// of the name) at indices first .. first+n-1: the 4 Philox words of each block (out: 4n words),
// uniforms in [0, 1) (bitwise equal), standard normals (equal up to the device's log/cos ulp).
void philox_blocks(Context& c, uint64_t seed, uint32_t stream, uint32_t step, uint64_t first,
                   uint32_t* out, int64_t n);
void rng_uniform(Context& c, uint64_t seed, uint32_t stream, uint32_t step, uint64_t first,
                 double* out, int64_t n);
void rng_normal(Context& c, uint64_t seed, uint32_t stream, uint32_t step, uint64_t first,
                double* out, int64_t n);

// In place on x [s, heads*d]: rotate pairs (2j, 2j+1) by positions[t] * 10000^(-2j/d) (inverse:
// the negative angle, the backward), as ref::rope_apply.
template <class T>
void rope_apply(Context& c, T* x, const int32_t* positions, int64_t s, int heads, int64_t d,
                bool inverse);

// Attention dropout, as ref::AttentionDropout: probability (head_offset + h, i, j) of sequence
// `sequence` is kept iff the uniform of stream "dropout/layers.<layer>" at `step`, index
// ((sequence * total_heads + head) * s + i) * s + j, is >= rate; kept ones scale by 1/(1-rate).
struct Dropout {
  double rate = 0.0;
  uint64_t seed = 0;
  int layer = 0;
  uint32_t step = 0;
  int64_t sequence = 0;
  int head_offset = 0;
  int total_heads = 0;  // 0: the local heads are all of them
};

// q [s, heads*d], k, v [s, kv_heads*d] (RoPE applied); key j visible to query i iff j <= i and
// doc_ids equal. o [s, heads*d]; probs [heads, s, s] (may be null) gets the pre-dropout
// probabilities. Backward needs them; it overwrites dq, dk, dv. Sequences up to 48 KiB of one
// probability row less the kernels' 32 static elements (12,256 f32 / 6,112 f64 positions).
template <class T>
void attention_forward(Context& c, const T* q, const T* k, const T* v, const int32_t* doc_ids,
                       int64_t s, int heads, int kv_heads, int64_t d, const Dropout& dropout, T* o,
                       T* probs);
template <class T>
void attention_backward(Context& c, const T* dout, const T* q, const T* k, const T* v,
                        const T* probs, int64_t s, int heads, int kv_heads, int64_t d,
                        const Dropout& dropout, T* dq, T* dk, T* dv);

// One AdamW update of t (1-based), as ref::AdamW::step: p *= 1 - lr*wd (matrices only);
// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps).
struct AdamWStep {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  int t = 1;
};
template <class T>
void adamw_update(Context& c, T* p, const T* g, T* m, T* v, int64_t n, bool is_matrix,
                  const AdamWStep& step);
// *out += sum of g^2, accumulated in f64 (for the global gradient norm; order differs from the
// reference's sequential sum, so equal within rounding, not bitwise).
template <class T>
void add_sum_of_squares(Context& c, const T* g, int64_t n, double* out);
// g = T(double(g) * factor) (gradient clipping).
template <class T>
void scale_inplace(Context& c, T* g, int64_t n, double factor);

// ---- bf16 mixed precision (gpu/bf16.cu) ------------------------------------------------------
// The reference's bf16 recipe (reference/bf16.hpp, reference/trainer.cpp): f32 master weights,
// forward/backward on bf16-rounded weights, each microbatch's gradients rounded to bf16 before
// they are accumulated in f32. bf16 device buffers are raw bits (uint16_t: the high half of the
// f32), so this header needs no CUDA header.

// x[i] = ref::round_to_bf16(x[i]) in place, bit for bit: round to nearest, ties to even; NaN kept
// as is; a value past the largest bf16 becomes +-inf.
void round_to_bf16(Context& c, float* x, int64_t n);
// y[i] = the bf16 bits of x[i], rounded as ref::round_to_bf16 (== comm::bf16(x[i]).bits): NaN
// becomes a quiet NaN with its sign (the f32 payload does not fit), everything else is the high
// half of round_to_bf16(x[i]).
void to_bf16(Context& c, const float* x, uint16_t* y, int64_t n);
// y[i] = the f32 whose bits are x[i] << 16 (exact).
void from_bf16(Context& c, const uint16_t* x, float* y, int64_t n);

// Tensor-core GEMMs (cublasGemmEx: bf16 inputs, f32 output, CUBLAS_COMPUTE_32F; the handle's
// pedantic math is lifted for the call only). Shapes and layouts as the f32 linear ops above.
// Stated bound (tests/gpu/bf16_test.cpp): every product of two bf16 values is exact in f32 and the
// k-term sum is accumulated in f32 (tensor-core adders may truncate: 2^-23 per addition at worst),
// so against the exact result of the same bf16 inputs each element satisfies
//   |gpu - exact| <= k * 2^-22 * (|a| . |b|)          (k the inner dimension; 2x margin)
// and against the exact product of the unrounded f32 inputs (each input rounded to bf16 moves by
// at most 2^-8 of itself)
//   |gpu - exact_f32_inputs| <= (2^-7 + 2^-14 + k * 2^-21) * (|a| . |b|).
// For dw (+=) the accumulated term counts as one more addend: k = rows + 1, |dw0| in the scale.
// y[rows,out] = x[rows,in] . w[in,out]
void linear_forward_bf16(Context& c, const uint16_t* x, const uint16_t* w, float* y, int64_t rows,
                         int64_t in, int64_t out);
// dx = dy . w^T (overwritten); dw += x^T . dy
void linear_backward_bf16(Context& c, const uint16_t* dy, const uint16_t* x, const uint16_t* w,
                          float* dx, float* dw, int64_t rows, int64_t in, int64_t out);
// y[rows,out] = x[rows,in] . w^T, w [out,in] (the tied LM head)
void linear_t_forward_bf16(Context& c, const uint16_t* x, const uint16_t* w, float* y, int64_t rows,
                           int64_t in, int64_t out);
// dx = dy . w (overwritten); dw += dy^T . x
void linear_t_backward_bf16(Context& c, const uint16_t* dy, const uint16_t* x, const uint16_t* w,
                            float* dx, float* dw, int64_t rows, int64_t in, int64_t out);

}  // namespace shardcheck::gpu::ops
