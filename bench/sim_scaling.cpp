// How the simulator's wall time grows with the rank count, in timing-only (meta) mode: a fixed
// FSDP-like program (per layer: all_gather of the parameters, forward compute; then per layer
// backward compute and reduce_scatter of the gradients) for a number of steps, at each rank
// count. Prints a Markdown table (wall seconds, wall per collective, virtual step time).
// A small program rather than Google Benchmark: one run at 1,024 ranks takes seconds.
//
//   bench_sim_scaling [--ranks 8,64,512,1024] [--layers 8] [--steps 10] [--repeat 3]
//   [--no-timeline]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "sim/world.hpp"

namespace {

using shardcheck::comm::Buffer;
using shardcheck::comm::Communicator;
using shardcheck::comm::DType;

struct Args {
  std::vector<int> ranks{8, 64, 512, 1024};
  int layers = 8;
  int steps = 10;
  int repeat = 3;
  bool timeline = true;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--ranks") {
      a.ranks.clear();
      std::stringstream ss(next());
      for (std::string x; std::getline(ss, x, ',');) a.ranks.push_back(std::stoi(x));
    } else if (k == "--layers") {
      a.layers = std::stoi(next());
    } else if (k == "--steps") {
      a.steps = std::stoi(next());
    } else if (k == "--repeat") {
      a.repeat = std::stoi(next());
    } else if (k == "--no-timeline") {
      a.timeline = false;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

// A 1B-parameter-class layer: 50M parameters in bf16, 4k tokens per rank per step.
void program(Communicator& c, const Args& a) {
  const std::size_t layer_params = 50'000'000;
  const std::size_t shard = layer_params / static_cast<std::size_t>(c.size());
  const std::size_t full = shard * static_cast<std::size_t>(c.size());
  const double tokens = 4096;
  const double flops = 2 * tokens * static_cast<double>(layer_params);
  for (int step = 1; step <= a.steps; ++step) {
    c.begin_step(step);
    for (int l = 0; l < a.layers; ++l) {
      c.all_gather(Buffer{nullptr, shard, DType::bf16, {}}, Buffer{nullptr, full, DType::bf16, {}})
          ->wait();
      c.compute({.name = "forward", .flops = flops, .bytes = 2.0 * layer_params});
    }
    for (int l = a.layers - 1; l >= 0; --l) {
      c.compute({.name = "backward", .flops = 2 * flops, .bytes = 4.0 * layer_params});
      c.reduce_scatter(Buffer{nullptr, full, DType::bf16, {}},
                       Buffer{nullptr, shard, DType::bf16, {}})
          ->wait();
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const int collectives = a.steps * a.layers * 2;
  std::printf(
      "program: %d steps x %d layers x (all_gather + reduce_scatter + 2 compute), meta "
      "mode, timeline %s; %d collectives per run\n\n",
      a.steps, a.layers, a.timeline ? "on" : "off", collectives);
  std::printf(
      "| ranks | wall s (median of %d) | min s | wall us per collective | "
      "timeline events | virtual step time |\n",
      a.repeat);
  std::printf("|---:|---:|---:|---:|---:|---:|\n");
  for (int n : a.ranks) {
    shardcheck::sim::SimOptions o;
    o.meta = true;
    o.record_timeline = a.timeline;
    shardcheck::sim::SimWorld w(n, o);
    std::vector<double> wall;
    for (int r = 0; r < a.repeat; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      w.run([&](Communicator& c) { program(c, a); });
      wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(wall.begin(), wall.end());
    const double med = wall[wall.size() / 2];
    const auto summary = shardcheck::sim::summarize(w.step_times());
    std::printf("| %d | %.3f | %.3f | %.0f | %zu | %s |\n", n, med, wall.front(),
                med / collectives * 1e6, w.timeline().size(),
                shardcheck::sim::format_seconds(summary.step_time).c_str());
    std::fflush(stdout);
  }
  return 0;
}
