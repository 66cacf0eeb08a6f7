// One-GPU model step: gpu::GpuModel<float> (the reference model's ops on the GPU, f32 without
// TF32, the parity configuration) forward + backward over packed sequences; tokens/s and achieved
// TFLOP/s against the measured f32 cuBLAS ceiling (SGEMM, pedantic math, 4096^3) on the same
// device. FLOPs = 6 x tokens x (matmul parameters, LM head included) + 12 x layers x s^2 x h per
// sequence for attention (dense count, as is conventional; the causal kernel skips half).
// The attention kernels are written for parity, not speed, so this measures the parity path.
//
// Usage: bench_gpu_model [--hidden H] [--layers L] [--seq S] [--steps N] [--json FILE]
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "gpu/model.hpp"
#include "reference/model.hpp"

namespace {

double f32_ceiling_tflops() {
  const int n = 4096;
  void *va = nullptr, *vb = nullptr, *vc = nullptr;
  const std::size_t bytes = static_cast<std::size_t>(n) * n * sizeof(float);
  if (cudaMalloc(&va, bytes) != cudaSuccess || cudaMalloc(&vb, bytes) != cudaSuccess ||
      cudaMalloc(&vc, bytes) != cudaSuccess)
    return 0;
  auto* a = static_cast<float*>(va);
  auto* b = static_cast<float*>(vb);
  auto* c = static_cast<float*>(vc);
  cudaMemset(a, 0, bytes);
  cudaMemset(b, 0, bytes);
  cublasHandle_t h;
  cublasCreate(&h);
  cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);
  const float one = 1, zero = 0;
  auto run = [&] {
    cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n);
  };
  run();
  cudaDeviceSynchronize();
  const int iters = 5;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) run();
  cudaDeviceSynchronize();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * n * static_cast<double>(n) * n * iters / s / 1e12;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace shardcheck;
  ref::ModelConfig cfg;
  cfg.vocab = 8192;
  cfg.hidden = 1024;
  cfg.layers = 4;
  cfg.heads = 16;
  cfg.kv_heads = 4;
  cfg.ffn = 4096;
  cfg.seq_len = 512;
  int steps = 5;
  std::string json;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (a == "--hidden") {
      cfg.hidden = v;
      cfg.ffn = 4 * v;
    } else if (a == "--layers") {
      cfg.layers = v;
    } else if (a == "--seq") {
      cfg.seq_len = v;
    } else if (a == "--steps") {
      steps = v;
    } else if (a == "--json") {
      json = argv[i + 1];
    } else {
      std::fprintf(stderr,
                   "usage: bench_gpu_model [--hidden H] [--layers L] [--seq S] "
                   "[--steps N] [--json FILE]\n");
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "bench_gpu_model: no CUDA device visible; nothing to measure\n");
    return 3;
  }
  try {
    cfg.validate();
    const auto params = ref::init_params<float>(cfg, 7);
    ref::Sequence seq;
    for (int t = 0; t < cfg.seq_len; ++t) {  // one document: the densest attention
      seq.tokens.push_back((t * 31) % cfg.vocab);
      seq.targets.push_back(((t + 1) * 31) % cfg.vocab);
      seq.loss_mask.push_back(t + 1 < cfg.seq_len ? 1 : 0);
      seq.doc_ids.push_back(0);
      seq.positions.push_back(t);
    }
    ref::StepContext ctx;
    ctx.token_weight = 1.0 / static_cast<double>(seq.mask_count());
    gpu::GpuModel<float> model(cfg, params, 0);
    model.step(seq, ctx, true);  // warm up
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) model.step(seq, ctx, true);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
    const double h = cfg.hidden, s = cfg.seq_len, d = cfg.head_dim();
    const double per_layer = h * cfg.heads * d * 2 + h * cfg.kv_heads * d * 2 + 2 * h * cfg.ffn;
    const double matmul_params = cfg.layers * per_layer + h * cfg.vocab;
    const double flops = 6 * s * matmul_params + 12 * cfg.layers * s * s * h;
    const double tflops = flops / secs / 1e12;
    const double ceiling = f32_ceiling_tflops();
    std::printf(
        "# bench_gpu_model: GpuModel<float>, hidden %d, layers %d, heads %d/%d, ffn %d, "
        "vocab %d, seq %d\n",
        cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn, cfg.vocab, cfg.seq_len);
    std::printf("  step %.2f ms  tokens/s %.0f  TFLOP/s %.2f  of f32 ceiling %.1f: %.0f%%\n",
                secs * 1e3, s / secs, tflops, ceiling, ceiling > 0 ? 100 * tflops / ceiling : 0.0);
    if (!json.empty())
      if (std::FILE* f = std::fopen(json.c_str(), "w")) {
        std::fprintf(f,
                     "{\"step_ms\":%.4f,\"tokens_per_s\":%.1f,\"tflops\":%.3f,"
                     "\"f32_ceiling_tflops\":%.2f}\n",
                     secs * 1e3, s / secs, tflops, ceiling);
        std::fclose(f);
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_model: %s\n", e.what());
    return 1;
  }
  return 0;
}
