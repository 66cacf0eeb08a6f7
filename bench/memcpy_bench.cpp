// memcpy bandwidth of this machine, single-threaded and with T threads each copying its own
// buffers, for 1 MiB .. 64 MiB; the 64 MiB (beyond-cache) figure is "the limit" that
// scripts/compare-mpi uses for the all_reduce lower bound. Usage: bench_memcpy [THREADS] [--json
// FILE]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
volatile unsigned g_sink = 0;

struct Point {
  std::size_t bytes;
  int threads;
  double gbps;
};

// One measurement: `threads` threads each memcpy their own `bytes`-sized src -> dst `reps` times,
// started together; returns bytes copied (all threads) / wall seconds of the slowest thread.
double Measure(std::size_t bytes, int threads, int reps,
               std::vector<std::vector<unsigned char>>& src,
               std::vector<std::vector<unsigned char>>& dst) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<double> secs(static_cast<std::size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      auto& s = src[static_cast<std::size_t>(t)];
      auto& d = dst[static_cast<std::size_t>(t)];
      std::memcpy(d.data(), s.data(), bytes);  // warm the pages and the TLB
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      auto t0 = Clock::now();
      for (int r = 0; r < reps; ++r) {
        s[static_cast<std::size_t>(r) % bytes] = static_cast<unsigned char>(r);  // defeat elision
        std::memcpy(d.data(), s.data(), bytes);
      }
      secs[static_cast<std::size_t>(t)] = std::chrono::duration<double>(Clock::now() - t0).count();
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  // Read the destinations so that the copies are observable.
  for (int t = 0; t < threads; ++t) g_sink = g_sink + dst[static_cast<std::size_t>(t)][bytes / 2];
  double slowest = *std::max_element(secs.begin(), secs.end());
  return static_cast<double>(bytes) * reps * threads / slowest / 1e9;
}

// Best of three timed runs, each sized to about 0.1 s.
double Bandwidth(std::size_t bytes, int threads) {
  std::vector<std::vector<unsigned char>> src, dst;
  for (int t = 0; t < threads; ++t) {
    src.emplace_back(bytes, static_cast<unsigned char>(t + 1));
    dst.emplace_back(bytes, 0);
  }
  double probe = Measure(bytes, threads, 2, src, dst);  // GB/s, all threads together
  double per_copy_s = static_cast<double>(bytes) * threads / (probe * 1e9);
  int reps = static_cast<int>(std::clamp(0.1 / per_copy_s, 3.0, 1e6));
  double best = 0;
  for (int trial = 0; trial < 3; ++trial) {
    best = std::max(best, Measure(bytes, threads, reps, src, dst));
  }
  return best;
}

[[noreturn]] void Usage(const char* msg) {
  std::fprintf(stderr,
               "bench_memcpy: %s\nusage: bench_memcpy [THREADS (default 2)] [--json FILE]\n", msg);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") {
      if (i + 1 >= argc) Usage("missing value for --json");
      json = argv[++i];
    } else if (a == "-h" || a == "--help") {
      Usage("help");
    } else {
      char* end = nullptr;
      long v = std::strtol(a.c_str(), &end, 10);
      if (end == a.c_str() || *end != '\0' || v < 1 || v > 1024) Usage("THREADS must be 1..1024");
      threads = static_cast<int>(v);
    }
  }

  std::printf(
      "# bench_memcpy: GB/s = bytes copied per second (1e9); each copied byte is one read\n"
      "# and one write, so memory traffic is twice the figure. Each thread copies its own\n"
      "# buffers; best of 3 runs of ~0.1 s. hardware threads: %u\n",
      std::thread::hardware_concurrency());
  std::printf("#%11s%14s%14s\n", "size (B)", "1 thread",
              (std::to_string(threads) + " threads").c_str());
  std::vector<Point> points;
  for (std::size_t bytes = std::size_t{1} << 20; bytes <= std::size_t{64} << 20; bytes *= 2) {
    double one = Bandwidth(bytes, 1);
    points.push_back({bytes, 1, one});
    double many = one;
    if (threads > 1) {
      many = Bandwidth(bytes, threads);
      points.push_back({bytes, threads, many});
    }
    std::printf(" %11zu%14.2f%14.2f\n", bytes, one, many);
    std::fflush(stdout);
  }
  const Point& lim1 = threads > 1 ? points[points.size() - 2] : points.back();
  const Point& limt = points.back();
  std::printf(
      "# limit (64 MiB, beyond cache): %.2f GB/s with 1 thread, %.2f GB/s with %d threads\n",
      lim1.gbps, limt.gbps, threads);

  if (!json.empty()) {
    std::FILE* f = std::fopen(json.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "bench_memcpy: cannot write %s\n", json.c_str());
      return 2;
    }
    std::fprintf(f, "{\"memcpy\":[");
    for (std::size_t i = 0; i < points.size(); ++i) {
      std::fprintf(f, "%s{\"bytes\":%zu,\"threads\":%d,\"gbps\":%.4f}", i ? "," : "",
                   points[i].bytes, points[i].threads, points[i].gbps);
    }
    std::fprintf(f, "]}\n");
    if (std::fclose(f) != 0) {
      std::fprintf(stderr, "bench_memcpy: cannot write %s\n", json.c_str());
      return 2;
    }
  }
  return 0;
}
