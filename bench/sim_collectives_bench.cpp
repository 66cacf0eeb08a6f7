// Google Benchmark of the simulator's collectives: all_reduce, all_gather, reduce_scatter on f32,
// 4 KiB .. 64 MiB per rank, N = 2, 4, 8 ranks. Manual time covers only the op (between barriers),
// not thread start-up. Counters: algbw and busbw in GB/s with the nccl-tests factors.
#include <benchmark/benchmark.h>

#include <chrono>
#include <vector>

#include "comm/ops.hpp"
#include "sim/world.hpp"

namespace {

using shardcheck::comm::Communicator;
using Op = shardcheck::comm::Op;  // the op table's kinds (comm/ops.hpp): busbw factors from there

void run_collective(benchmark::State& state, Op op) {
  const int n = static_cast<int>(state.range(0));
  const auto bytes = static_cast<std::size_t>(state.range(1));
  const std::size_t count = bytes / sizeof(float);
  const std::size_t per_rank = count / static_cast<std::size_t>(n);
  std::vector<std::vector<float>> in(static_cast<std::size_t>(n), std::vector<float>(count, 1.0f));
  std::vector<std::vector<float>> out(static_cast<std::size_t>(n), std::vector<float>(count));
  shardcheck::sim::SimWorld world(n);
  double seconds = 0;
  for (auto _ : state) {
    world.run([&](Communicator& c) {
      auto& i = in[static_cast<std::size_t>(c.rank())];
      auto& o = out[static_cast<std::size_t>(c.rank())];
      c.barrier()->wait();
      const auto t0 = std::chrono::steady_clock::now();
      if (op == Op::all_reduce) {
        c.all_reduce(std::span<const float>(i), std::span<float>(o))->wait();
      } else if (op == Op::all_gather) {
        c.all_gather(shardcheck::comm::cview(std::span<const float>(i.data(), per_rank)),
                     shardcheck::comm::view(
                         std::span<float>(o.data(), per_rank * static_cast<std::size_t>(n))))
            ->wait();
      } else {
        c.reduce_scatter(shardcheck::comm::cview(std::span<const float>(
                             i.data(), per_rank * static_cast<std::size_t>(n))),
                         shardcheck::comm::view(std::span<float>(o.data(), per_rank)))
            ->wait();
      }
      c.barrier()->wait();
      if (c.rank() == 0)
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
    state.SetIterationTime(seconds);
  }
  const double factor = shardcheck::comm::busbw_factor(op, n);
  state.counters["algbw_GBps"] = benchmark::Counter(static_cast<double>(bytes) * 1e-9,
                                                    benchmark::Counter::kIsIterationInvariantRate);
  state.counters["busbw_GBps"] = benchmark::Counter(static_cast<double>(bytes) * 1e-9 * factor,
                                                    benchmark::Counter::kIsIterationInvariantRate);
}

void args(benchmark::internal::Benchmark* b) {
  for (int n : {2, 4, 8})
    for (std::int64_t bytes = 4096; bytes <= (std::int64_t{64} << 20); bytes *= 4)
      b->Args({n, bytes});
  b->ArgNames({"ranks", "bytes"})->UseManualTime()->Unit(benchmark::kMicrosecond);
}

void BM_AllReduce(benchmark::State& s) {
  run_collective(s, Op::all_reduce);
}
void BM_AllGather(benchmark::State& s) {
  run_collective(s, Op::all_gather);
}
void BM_ReduceScatter(benchmark::State& s) {
  run_collective(s, Op::reduce_scatter);
}
BENCHMARK(BM_AllReduce)->Apply(args);
BENCHMARK(BM_AllGather)->Apply(args);
BENCHMARK(BM_ReduceScatter)->Apply(args);

}  // namespace

BENCHMARK_MAIN();
