// One-GPU throughput: the measured cuBLAS matmul ceiling, and a transformer layer's GEMM step
// against it.
//
//   ceiling: the best of square bf16 GEMMs (f32 accumulate) at 4096..16384, and the same in f32
//            (plain SGEMM, no TF32) and TF32, in TFLOP/s.
//   layer step: forward + backward GEMMs of one dense layer of the reference model's shape
//            (q, k, v, o projections [h,h] and the MLP's up [h,4h] / down [4h,h]; y = x.W, dx =
//            dy.W^T, dW = x^T.dy), bf16 with f32 accumulate, at `--tokens` tokens. FLOPs =
//            6 x tokens x 12h^2. Prints tokens/s, TFLOP/s and the share of the bf16 ceiling.
//            Attention's score/softmax work and the pointwise ops are not in it: this is the
//            GEMM part of a step, the part the ceiling bounds.
//
// Usage: bench_gpu_gemm [--hidden H] [--tokens T] [--iters N] [--json FILE]
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace {

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_gpu_gemm: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void ok(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "bench_gpu_gemm: %s: cuBLAS status %d\n", what, static_cast<int>(s));
    std::exit(1);
  }
}

struct Gemm {
  cudaDataType_t ab;       // input type
  cublasComputeType_t cc;  // compute type
  const char* name;
};

void* dev_alloc(std::size_t bytes) {
  void* p = nullptr;
  ok(cudaMalloc(&p, bytes), "cudaMalloc");
  ok(cudaMemset(p, 0, bytes), "cudaMemset");  // zeros: no NaN/denormal effects on timing
  return p;
}

std::size_t elt(cudaDataType_t t) {
  return t == CUDA_R_16BF ? 2 : 4;
}

// Column-major C[m,n] = op(A) op(B); row-major callers swap operands (see gpu/ops.cu).
void gemm(cublasHandle_t h, const Gemm& g, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
          int k, const void* a, int lda, const void* b, int ldb, void* c, int ldc, float beta) {
  const float alpha = 1.0F;
  ok(cublasGemmEx(h, ta, tb, m, n, k, &alpha, a, g.ab, lda, b, g.ab, ldb, &beta, c, g.ab, ldc, g.cc,
                  CUBLAS_GEMM_DEFAULT),
     "cublasGemmEx");
}

double time_ms(const std::function<void()>& f, int iters) {
  cudaEvent_t a, b;
  ok(cudaEventCreate(&a), "cudaEventCreate");
  ok(cudaEventCreate(&b), "cudaEventCreate");
  f();  // warm up (and heuristics)
  f();
  ok(cudaEventRecord(a), "cudaEventRecord");
  for (int i = 0; i < iters; ++i) f();
  ok(cudaEventRecord(b), "cudaEventRecord");
  ok(cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0;
  ok(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iters;
}

double square_tflops(cublasHandle_t h, const Gemm& g, int n, int iters) {
  const std::size_t bytes = static_cast<std::size_t>(n) * n * elt(g.ab);
  void* a = dev_alloc(bytes);
  void* b = dev_alloc(bytes);
  void* c = dev_alloc(bytes);
  const double ms = time_ms(
      [&] { gemm(h, g, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, a, n, b, n, c, n, 0.0F); }, iters);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * n * static_cast<double>(n) * n / (ms * 1e-3) / 1e12;
}

}  // namespace

int main(int argc, char** argv) {
  int hidden = 4096;
  int tokens = 8192;
  int iters = 20;
  std::string json;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--hidden")
      hidden = std::atoi(argv[i + 1]);
    else if (a == "--tokens")
      tokens = std::atoi(argv[i + 1]);
    else if (a == "--iters")
      iters = std::atoi(argv[i + 1]);
    else if (a == "--json")
      json = argv[i + 1];
    else {
      std::fprintf(stderr,
                   "usage: bench_gpu_gemm [--hidden H] [--tokens T] [--iters N] [--json F]\n");
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "bench_gpu_gemm: no CUDA device visible; nothing to measure\n");
    return 3;
  }
  cudaDeviceProp prop{};
  ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  cublasHandle_t h;
  ok(cublasCreate(&h), "cublasCreate");
  const Gemm bf16{CUDA_R_16BF, CUBLAS_COMPUTE_32F, "bf16 (f32 accumulate)"};
  const Gemm tf32{CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, "tf32"};
  const Gemm f32{CUDA_R_32F, CUBLAS_COMPUTE_32F_PEDANTIC, "f32 (no TF32)"};

  std::printf("# bench_gpu_gemm on %s\n# %-24s %8s %10s\n", prop.name, "gemm", "n", "TFLOP/s");
  double ceiling = 0;
  for (const Gemm* g : {&bf16, &tf32, &f32}) {
    double best = 0;
    for (int n : {4096, 8192, 16384}) {
      if (g != &bf16 && n > 8192) continue;  // f32 is slow; 8192 is enough for its ceiling
      const double t = square_tflops(h, *g, n, g == &f32 ? 3 : iters);
      std::printf("  %-24s %8d %10.1f\n", g->name, n, t);
      best = std::max(best, t);
    }
    if (g == &bf16) ceiling = best;
  }

  // One layer's GEMMs, bf16, row-major x[T,h] . W[h,o]: column-major C^T = W^T x^T.
  const int T = tokens;
  const int ffn = 4 * hidden;
  struct Lin {
    int in, out;
  };
  const std::vector<Lin> lins = {{hidden, hidden}, {hidden, hidden}, {hidden, hidden},
                                 {hidden, hidden}, {hidden, ffn},    {ffn, hidden}};
  std::vector<void*> w, dw, x, y;
  for (const Lin& l : lins) {
    w.push_back(dev_alloc(static_cast<std::size_t>(l.in) * l.out * 2));
    dw.push_back(dev_alloc(static_cast<std::size_t>(l.in) * l.out * 2));
    x.push_back(dev_alloc(static_cast<std::size_t>(T) * l.in * 2));
    y.push_back(dev_alloc(static_cast<std::size_t>(T) * l.out * 2));
  }
  auto step = [&] {
    for (std::size_t i = 0; i < lins.size(); ++i) {  // forward: y = x W
      const Lin& l = lins[i];
      gemm(h, bf16, CUBLAS_OP_N, CUBLAS_OP_N, l.out, T, l.in, w[i], l.out, x[i], l.in, y[i], l.out,
           0.0F);
    }
    for (std::size_t i = lins.size(); i-- > 0;) {  // backward: dx = dy W^T, dW += x^T dy
      const Lin& l = lins[i];
      gemm(h, bf16, CUBLAS_OP_T, CUBLAS_OP_N, l.in, T, l.out, w[i], l.out, y[i], l.out, x[i], l.in,
           0.0F);
      gemm(h, bf16, CUBLAS_OP_N, CUBLAS_OP_T, l.out, l.in, T, y[i], l.out, x[i], l.in, dw[i], l.out,
           1.0F);
    }
  };
  const double ms = time_ms(step, iters);
  const double flops = 6.0 * T * 12.0 * hidden * static_cast<double>(hidden);
  const double tflops = flops / (ms * 1e-3) / 1e12;
  const double tok_s = T / (ms * 1e-3);
  std::printf("# layer GEMM step: hidden %d, ffn %d, %d tokens, bf16\n", hidden, ffn, T);
  std::printf("  step %.3f ms  tokens/s %.0f  TFLOP/s %.1f  of bf16 ceiling %.1f: %.0f%%\n", ms,
              tok_s, tflops, ceiling, 100.0 * tflops / ceiling);
  if (!json.empty()) {
    if (std::FILE* f = std::fopen(json.c_str(), "w")) {
      std::fprintf(f,
                   "{\"device\":\"%s\",\"bf16_ceiling_tflops\":%.2f,\"hidden\":%d,\"tokens\":%d,"
                   "\"step_ms\":%.4f,\"tokens_per_s\":%.1f,\"tflops\":%.2f,\"of_ceiling\":%.4f}\n",
                   prop.name, ceiling, hidden, T, ms, tok_s, tflops, tflops / ceiling);
      std::fclose(f);
    }
  }
  for (std::size_t i = 0; i < lins.size(); ++i) {
    cudaFree(w[i]);
    cudaFree(dw[i]);
    cudaFree(x[i]);
    cudaFree(y[i]);
  }
  cublasDestroy(h);
  return 0;
}
