// NCCL collective benchmark through gpu::NcclCommunicator (so the backend's own overhead counts):
// all_reduce, all_gather, reduce_scatter, broadcast, all_to_all on f32 device buffers, out of place
// and in place, with nccl-tests conventions: size = bytes of the larger buffer, algbw = size /
// time, busbw = algbw x (2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and
// all_to_all, 1 for broadcast), #wrong = elements differing from the expected result after one
// checked run with known data. time = max over ranks of the average per-op time.
//
// Launch: one process per GPU under `mpirun -np N bench_nccl_collectives ...` (where built with
// MPI), or one process over the visible GPUs: `bench_nccl_collectives --gpus N ...`.
// --json FILE writes the shape of bench_mpi_collectives --json (backend "nccl"), one op per file.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/ops.hpp"
#include "gpu/bootstrap.hpp"
#ifdef SHARDCHECK_HAVE_MPI
#include "gpu/mpi_bootstrap.hpp"
#endif

namespace {

using shardcheck::comm::Buffer;
using shardcheck::comm::ConstBuffer;
using shardcheck::comm::DType;
using shardcheck::gpu::NcclCommunicator;

const char* const kOps[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                            "all_to_all"};

struct Options {
  std::vector<std::string> ops{"all_reduce"};
  long long min_bytes = 8;
  long long max_bytes = 128LL << 20;
  int warmup = 5;
  int iters = 20;
  int gpus = 0;
  std::string json;  // with several ops: FILE is a prefix, one FILE.<op>.json each
};

struct Result {
  double time_us = 0, algbw = 0, busbw = 0;
  long long wrong = 0;
};

float v(int r, std::size_t i) {
  return static_cast<float>((static_cast<std::size_t>(r) * 3 + i) % 7 + 1);
}

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "bench_nccl_collectives: %s\nusage: [mpirun -np N] bench_nccl_collectives "
               "[--op all_reduce|all_gather|reduce_scatter|broadcast|all_to_all|all] "
               "[--min-bytes B] [--max-bytes B] [--iters N] [--warmup N] [--gpus N] "
               "[--json FILE]\n",
               msg);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") usage("help");
    if (i + 1 >= argc) usage(("missing value for " + a).c_str());
    const std::string val = argv[++i];
    if (a == "--op") {
      if (val == "all") {
        o.ops.assign(std::begin(kOps), std::end(kOps));
      } else {
        bool known = false;
        for (const char* k : kOps) known = known || val == k;
        if (!known) usage(("unknown op " + val).c_str());
        o.ops = {val};
      }
    } else if (a == "--min-bytes") {
      o.min_bytes = std::atoll(val.c_str());
    } else if (a == "--max-bytes") {
      o.max_bytes = std::atoll(val.c_str());
    } else if (a == "--iters") {
      o.iters = std::atoi(val.c_str());
    } else if (a == "--warmup") {
      o.warmup = std::atoi(val.c_str());
    } else if (a == "--gpus") {
      o.gpus = std::atoi(val.c_str());
    } else if (a == "--json") {
      o.json = val;
    } else {
      usage(("unknown option " + a).c_str());
    }
  }
  if (o.min_bytes <= 0 || o.max_bytes < o.min_bytes || o.iters <= 0 || o.warmup < 0)
    usage("sizes and counts must be positive, min <= max");
  return o;
}

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// A device array of floats on the calling thread's current device (the rank's: run_case sets it).
class Dev {
 public:
  explicit Dev(std::size_t n) : n_(n) {
    cuda_ok(cudaMalloc(&p_, (n == 0 ? 1 : n) * sizeof(float)), "cudaMalloc");
  }
  ~Dev() { cudaFree(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  float* f() { return static_cast<float*>(p_); }
  void put(const std::vector<float>& h) {
    if (h.size() > n_) throw std::runtime_error("Dev::put: more data than the buffer holds");
    cuda_ok(cudaMemcpy(p_, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice),
            "cudaMemcpy host to device");
    // The comm stream does not wait for the legacy default stream. Nothing of this rank is
    // queued on the comm stream here (every op was waited on), so this cannot block on peers.
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  std::vector<float> get(std::size_t off, std::size_t n) const {
    if (off + n > n_) throw std::runtime_error("Dev::get: past the end of the buffer");
    std::vector<float> h(n);
    cuda_ok(cudaMemcpy(h.data(), static_cast<const float*>(p_) + off, n * sizeof(float),
                       cudaMemcpyDeviceToHost),
            "cudaMemcpy device to host");
    return h;
  }

 private:
  void* p_ = nullptr;
  std::size_t n_;
};

// One (op, size, in-place) case on this rank: fills known data, times, checks.
Result run_case(NcclCommunicator& c, const std::string& op, std::size_t count, bool in_place,
                const Options& o) {
  const int n = c.size();
  const int me = c.rank();
  const auto un = static_cast<std::size_t>(n);
  const std::size_t chunk = count / un;
  const bool gathers = op == "all_gather";
  const bool scatters = op == "reduce_scatter";
  cuda_ok(cudaSetDevice(c.device()), "cudaSetDevice");  // Dev allocates on the current device
  const std::size_t send_n = gathers ? chunk : count;
  const std::size_t recv_n = scatters ? chunk : count;
  Dev big(count), small(op == "all_gather" || op == "reduce_scatter" ? chunk : count);
  const shardcheck::comm::Device dev{shardcheck::comm::DeviceKind::cuda, c.device()};
  // The buffer holding this rank's input, and where the result lands.
  std::vector<float> input(in_place ? count : send_n);
  const std::size_t input_off = in_place && gathers ? static_cast<std::size_t>(me) * chunk : 0;
  for (std::size_t i = 0; i < send_n; ++i) input[input_off + i] = v(me, i);
  auto issue = [&]() {
    const Buffer whole{big.f(), count, DType::f32, dev};
    if (in_place) {
      if (op == "all_reduce") return c.all_reduce(whole);
      if (op == "all_gather") return c.all_gather(whole);
      if (op == "reduce_scatter") return c.reduce_scatter(whole);
      if (op == "broadcast") return c.broadcast(whole);
      return c.all_to_all(whole);
    }
    const Buffer other{small.f(), gathers ? send_n : recv_n, DType::f32, dev};
    if (op == "all_reduce") return c.all_reduce(ConstBuffer(whole), other);
    if (op == "all_gather") return c.all_gather(ConstBuffer(other), whole);
    if (op == "reduce_scatter") return c.reduce_scatter(ConstBuffer(whole), other);
    if (op == "broadcast") return c.broadcast(ConstBuffer(whole), other);
    return c.all_to_all(ConstBuffer(whole), other);
  };
  // Out of place, the input lives in `big` except for all_gather (in `small`).
  auto fill = [&] { (!in_place && gathers ? small : big).put(input); };
  fill();
  for (int i = 0; i < o.warmup; ++i) issue()->wait();
  c.barrier()->wait();
  const auto t0 = std::chrono::steady_clock::now();
  shardcheck::comm::WorkPtr last;
  for (int i = 0; i < o.iters; ++i) last = issue();
  last->wait();
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / o.iters;
  fill();
  issue()->wait();
  // Where the result is and what it must be.
  const bool result_in_big = in_place || gathers;
  const std::size_t res_off = in_place && scatters ? static_cast<std::size_t>(me) * chunk : 0;
  const std::vector<float> got = (result_in_big ? big : small).get(res_off, recv_n);
  long long wrong = 0;
  for (std::size_t i = 0; i < recv_n; ++i) {
    float want = 0;
    if (op == "all_reduce" || scatters) {
      const std::size_t idx = scatters ? static_cast<std::size_t>(me) * chunk + i : i;
      for (int r = 0; r < n; ++r) want += v(r, idx);
    } else if (gathers) {
      want = v(static_cast<int>(i / chunk), i % chunk);
    } else if (op == "broadcast") {
      want = v(0, i);
    } else {
      want = v(static_cast<int>(i / chunk), static_cast<std::size_t>(me) * chunk + i % chunk);
    }
    wrong += got[i] != want ? 1 : 0;
  }
  std::vector<double> mx{secs};
  c.all_reduce(std::span<double>(mx), {shardcheck::comm::ReduceOp::max})->wait();
  std::vector<double> sw{static_cast<double>(wrong)};
  c.all_reduce(std::span<double>(sw))->wait();
  Result res;
  res.time_us = mx[0] * 1e6;
  res.algbw = static_cast<double>(count) * sizeof(float) / mx[0] / 1e9;
  // busbw factor from the op table (comm/ops.hpp); `op` is one of kOps, each a table name.
  res.busbw = res.algbw * shardcheck::comm::busbw_factor(*shardcheck::comm::op_named(op), n);
  res.wrong = static_cast<long long>(sw[0]);
  return res;
}

void bench(NcclCommunicator& c, const Options& o) {
  const bool lead = c.rank() == 0;
  const auto un = static_cast<long long>(c.size());
  for (const std::string& op : o.ops) {
    if (lead) {
      std::printf(
          "# bench_nccl_collectives: %s, %d ranks, float, time = max over ranks of the "
          "average per-op time (%d iterations, %d warm-up)\n",
          op.c_str(), c.size(), o.iters, o.warmup);
      std::printf("#%80s%33s\n", "out-of-place", "in-place");
      std::printf("#%11s%14s%8s%8s%6s%10s%8s%8s%7s%10s%8s%8s%7s\n", "size", "count", "type",
                  "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
                  "#wrong");
      std::printf("#%11s%14s%8s%8s%6s%10s%8s%8s%7s%10s%8s%8s%7s\n", "(B)", "(elements)", "", "", "",
                  "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    }
    std::FILE* json = nullptr;
    if (lead && !o.json.empty()) {
      const std::string path = o.ops.size() == 1 ? o.json : o.json + "." + op + ".json";
      json = std::fopen(path.c_str(), "w");
      if (json != nullptr)
        std::fprintf(json,
                     "{\"backend\":\"nccl\",\"ranks\":%d,\"op\":\"%s\",\"dtype\":\"f32\","
                     "\"rows\":[",
                     c.size(), op.c_str());
    }
    const char* redop = op == "all_reduce" || op == "reduce_scatter" ? "sum" : "none";
    const int root = op == "broadcast" ? 0 : -1;
    bool first = true;
    for (long long bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
      long long count = bytes / 4;
      count -= count % un;
      if (count == 0) continue;
      const Result oop = run_case(c, op, static_cast<std::size_t>(count), false, o);
      const Result ip = run_case(c, op, static_cast<std::size_t>(count), true, o);
      if (!lead) continue;
      std::printf(" %11lld%14lld%8s%8s%6d", count * 4, count, "float", redop, root);
      for (const Result* r : {&oop, &ip})
        std::printf("%10.1f%8.2f%8.2f%7lld", r->time_us, r->algbw, r->busbw, r->wrong);
      std::printf("\n");
      std::fflush(stdout);
      if (json != nullptr) {
        std::fprintf(json, "%s{\"bytes\":%lld,\"count\":%lld,\"type\":\"float\",\"redop\":\"%s\"",
                     first ? "" : ",", count * 4, count, redop);
        const char* names[] = {"out_of_place", "in_place"};
        const Result* res[] = {&oop, &ip};
        for (int k = 0; k < 2; ++k)
          std::fprintf(json,
                       ",\"%s\":{\"time_us\":%.3f,\"algbw_gbps\":%.4f,\"busbw_gbps\":%.4f,"
                       "\"wrong\":%lld}",
                       names[k], res[k]->time_us, res[k]->algbw, res[k]->busbw, res[k]->wrong);
        std::fprintf(json, "}");
      }
      first = false;
    }
    if (json != nullptr) {
      std::fprintf(json, "]}\n");
      std::fclose(json);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const bool under_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ||
                         std::getenv("PMIX_RANK") != nullptr || std::getenv("PMI_SIZE") != nullptr;
  try {
    if (shardcheck::gpu::visible_devices() == 0) {
      std::fprintf(stderr, "bench_nccl_collectives: no CUDA device visible; nothing to measure\n");
      return 3;
    }
    if (under_mpi) {
#ifdef SHARDCHECK_HAVE_MPI
      shardcheck::gpu::MpiSession mpi(&argc, &argv);
      try {
        auto comm = shardcheck::gpu::init_from_mpi();
        bench(*comm, o);
      } catch (const std::exception& e) {
        // Alone, this rank's exit would leave its peers in MPI_Bcast or NCCL until the timeout.
        if (mpi.place().size > 1)
          shardcheck::gpu::abort_job(1, "bench_nccl_collectives rank " +
                                            std::to_string(mpi.place().rank) + ": " + e.what());
        throw;
      }
      return 0;
#else
      std::fprintf(stderr, "bench_nccl_collectives: built without MPI; use --gpus N\n");
      return 2;
#endif
    }
    shardcheck::gpu::run_all_gpus(o.gpus, [&](NcclCommunicator& c) { bench(c, o); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_nccl_collectives: %s\n", e.what());
    return 1;
  }
  return 0;
}
