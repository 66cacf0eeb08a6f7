// Open MPI comparison benchmark: times MPI_Allreduce / MPI_Allgather / MPI_Reduce_scatter_block on
// MPI_FLOAT under `mpirun -np N`, out-of-place and in-place, and prints an nccl-tests-style table.
// --json writes the same shape as `shardcheck bench collectives --json`; scripts/compare-mpi joins
// them. Only the C API is used: skip the deprecated C++ bindings, whose header warns under -Wextra.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>
#include <vector>

#include "comm/ops.hpp"

namespace {

// The op table's kinds (comm/ops.hpp): names, busbw factors and buffer layouts come from there.
using Op = shardcheck::comm::Op;

struct Options {
  Op op = Op::all_reduce;
  std::int64_t min_bytes = 4096;
  std::int64_t max_bytes = 67108864;
  std::string json;
};

struct Result {
  double time_us = 0;
  double algbw = 0;
  double busbw = 0;
  long long wrong = 0;
};

struct Row {
  std::int64_t bytes = 0;
  std::int64_t count = 0;
  Result oop, ip;
};

// The ops this program times through MPI.
constexpr Op kBenchOps[] = {Op::all_reduce, Op::all_gather, Op::reduce_scatter};
const char* OpName(Op op) {
  return shardcheck::comm::name_of(op).data();  // the table's names are string literals
}

[[noreturn]] void Usage(int rank, const char* msg) {
  if (rank == 0) {
    std::fprintf(stderr,
                 "bench_mpi_collectives: %s\nusage: mpirun -np N bench_mpi_collectives "
                 "[--op all_reduce|all_gather|reduce_scatter] [--min-bytes B] [--max-bytes B] "
                 "[--json FILE]\n",
                 msg);
  }
  MPI_Finalize();
  std::exit(2);
}

std::int64_t ParseBytes(int rank, const char* s) {
  char* end = nullptr;
  long long v = std::strtoll(s, &end, 10);
  if (end == s || *end != '\0' || v <= 0) Usage(rank, "byte counts must be positive integers");
  return v;
}

Options Parse(int argc, char** argv, int rank) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") Usage(rank, "help");
    if (i + 1 >= argc) Usage(rank, ("missing value for " + a).c_str());
    const char* v = argv[++i];
    if (a == "--op") {
      auto it = std::find_if(std::begin(kBenchOps), std::end(kBenchOps),
                             [&](Op op) { return shardcheck::comm::name_of(op) == v; });
      if (it == std::end(kBenchOps)) Usage(rank, ("unknown op " + std::string(v)).c_str());
      o.op = *it;
    } else if (a == "--min-bytes") {
      o.min_bytes = ParseBytes(rank, v);
    } else if (a == "--max-bytes") {
      o.max_bytes = ParseBytes(rank, v);
    } else if (a == "--json") {
      o.json = v;
    } else {
      Usage(rank, ("unknown option " + a).c_str());
    }
  }
  if (o.min_bytes > o.max_bytes) Usage(rank, "--min-bytes exceeds --max-bytes");
  return o;
}

// Small integers: every partial sum of N of them is exact in float, whatever the reduction order.
float Pattern(int rank, std::int64_t i) {
  return static_cast<float>((rank * 7 + i) % 13 + 1);
}

class Bench {
 public:
  Bench(Op op, int rank, int n, std::int64_t max_elems)
      : op_(op), rank_(rank), n_(n), send_(max_elems), recv_(max_elems) {}

  // `total` = elements of the buffer that defines the size (all_reduce buffer, all_gather output,
  // reduce_scatter input); a multiple of n_ for the two scattering ops.
  void Run(std::int64_t total, bool in_place) {
    int c = static_cast<int>(total);
    int per = static_cast<int>(total / n_);
    float* s = send_.data();
    float* r = recv_.data();
    switch (op_) {
      case Op::all_reduce:
        MPI_Allreduce(in_place ? MPI_IN_PLACE : s, r, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
      case Op::all_gather:
        if (in_place) {
          MPI_Allgather(MPI_IN_PLACE, 0, MPI_FLOAT, r, per, MPI_FLOAT, MPI_COMM_WORLD);
        } else {
          MPI_Allgather(s, per, MPI_FLOAT, r, per, MPI_FLOAT, MPI_COMM_WORLD);
        }
        break;
      case Op::reduce_scatter:
        // In place: the input is the whole of r, and this rank's block lands at r[0..per).
        MPI_Reduce_scatter_block(in_place ? MPI_IN_PLACE : s, r, per, MPI_FLOAT, MPI_SUM,
                                 MPI_COMM_WORLD);
        break;
      default:  // not in kBenchOps
        break;
    }
  }

  // One run with patterned inputs; returns the wrong elements summed over ranks (valid on rank 0).
  long long Check(std::int64_t total, bool in_place) {
    std::int64_t per = total / n_;
    float* in = in_place ? recv_.data() : send_.data();
    std::fill_n(recv_.begin(), total, -1.0f);
    switch (op_) {
      case Op::all_reduce:
      case Op::reduce_scatter:
        for (std::int64_t i = 0; i < total; ++i) in[i] = Pattern(rank_, i);
        break;
      case Op::all_gather:
        // This rank's contribution is element j of its block; in place it sits at offset rank*per.
        for (std::int64_t j = 0; j < per; ++j) {
          in[(in_place ? rank_ * per : 0) + j] = Pattern(rank_, j);
        }
        break;
      default:
        break;
    }
    Run(total, in_place);
    long long wrong = 0;
    const float* out = recv_.data();
    switch (op_) {
      case Op::all_reduce:
        for (std::int64_t i = 0; i < total; ++i) wrong += out[i] != SumAt(i);
        break;
      case Op::reduce_scatter:
        for (std::int64_t j = 0; j < per; ++j) wrong += out[j] != SumAt(rank_ * per + j);
        break;
      case Op::all_gather:
        for (std::int64_t i = 0; i < total; ++i) wrong += out[i] != Pattern(int(i / per), i % per);
        break;
      default:
        break;
    }
    long long sum = 0;
    MPI_Reduce(&wrong, &sum, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    return sum;
  }

  // Average seconds per op, max over ranks (valid on rank 0).
  double Time(std::int64_t total, bool in_place) {
    std::fill_n(send_.begin(), total, 0.0f);  // zeros: repeated in-place sums stay finite
    std::fill_n(recv_.begin(), total, 0.0f);
    for (int i = 0; i < 2; ++i) Run(total, in_place);  // warmup
    // Size the timed loop from one probe op so that it takes about 0.15 s (at least 3 iterations);
    // all ranks must agree on the count, hence the all-reduce of the probe time.
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    Run(total, in_place);
    double probe = MPI_Wtime() - t0, probe_max = 0;
    MPI_Allreduce(&probe, &probe_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int iters = static_cast<int>(std::clamp(0.15 / std::max(probe_max, 1e-7), 3.0, 100000.0));
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) Run(total, in_place);
    double avg = (MPI_Wtime() - t0) / iters, avg_max = 0;
    MPI_Reduce(&avg, &avg_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    return avg_max;
  }

 private:
  float SumAt(std::int64_t i) const {
    float s = 0;
    for (int q = 0; q < n_; ++q) s += Pattern(q, i);
    return s;
  }

  Op op_;
  int rank_, n_;
  std::vector<float> send_, recv_;
};

Result Measure(Bench& b, Op op, int n, std::int64_t total, bool in_place) {
  Result r;
  double secs = b.Time(total, in_place);
  r.wrong = b.Check(total, in_place);
  double bytes = static_cast<double>(total) * sizeof(float);
  r.time_us = secs * 1e6;
  r.algbw = bytes / secs / 1e9;
  r.busbw = r.algbw * shardcheck::comm::busbw_factor(op, n);
  return r;
}

void PrintHeader(Op op, int n) {
  std::printf(
      "# bench_mpi_collectives: %s, %d ranks, MPI_FLOAT, time = max over ranks of the "
      "average per-op time\n",
      OpName(op), n);
  std::printf("#%80s%33s\n", "out-of-place", "in-place");
  std::printf("#%11s%14s%8s%8s%6s%10s%8s%8s%7s%10s%8s%8s%7s\n", "size", "count", "type", "redop",
              "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  std::printf("#%11s%14s%8s%8s%6s%10s%8s%8s%7s%10s%8s%8s%7s\n", "(B)", "(elements)", "", "", "",
              "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

void PrintRow(const Row& row, const char* redop) {
  std::printf(" %11lld%14lld%8s%8s%6d", static_cast<long long>(row.bytes),
              static_cast<long long>(row.count), "float", redop, -1);
  for (const Result* r : {&row.oop, &row.ip}) {
    std::printf("%10.1f%8.2f%8.2f%7lld", r->time_us, r->algbw, r->busbw, r->wrong);
  }
  std::printf("\n");
  std::fflush(stdout);
}

bool WriteJson(const std::string& path, Op op, int n, const char* redop,
               const std::vector<Row>& rows) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  std::fprintf(f, "{\"backend\":\"mpi\",\"ranks\":%d,\"op\":\"%s\",\"dtype\":\"f32\",\"rows\":[", n,
               OpName(op));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    std::fprintf(f, "%s{\"bytes\":%lld,\"count\":%lld,\"type\":\"float\",\"redop\":\"%s\"",
                 i ? "," : "", static_cast<long long>(row.bytes), static_cast<long long>(row.count),
                 redop);
    const char* names[] = {"out_of_place", "in_place"};
    const Result* res[] = {&row.oop, &row.ip};
    for (int k = 0; k < 2; ++k) {
      std::fprintf(f,
                   ",\"%s\":{\"time_us\":%.3f,\"algbw_gbps\":%.4f,\"busbw_gbps\":%.4f,"
                   "\"wrong\":%lld}",
                   names[k], res[k]->time_us, res[k]->algbw, res[k]->busbw, res[k]->wrong);
    }
    std::fprintf(f, "}");
  }
  std::fprintf(f, "]}\n");
  return std::fclose(f) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  Options o = Parse(argc, argv, rank);
  const char* redop = shardcheck::comm::info(o.op).reduces ? "sum" : "none";

  // Element counts per size: bytes/4, rounded down to a multiple of n for the scattering ops (as
  // nccl-tests does); the reported bytes are those of the rounded count.
  auto elems_for = [&](std::int64_t bytes) {
    std::int64_t e = bytes / static_cast<std::int64_t>(sizeof(float));
    return shardcheck::comm::splits_by_rank(o.op) ? e / n * n : e;
  };
  if (elems_for(o.max_bytes) > INT32_MAX) Usage(rank, "--max-bytes too large for an int count");
  Bench bench(o.op, rank, n, std::max<std::int64_t>(elems_for(o.max_bytes), 1));

  if (rank == 0) PrintHeader(o.op, n);
  std::vector<Row> rows;
  double bus_sum = 0;
  for (std::int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
    std::int64_t total = elems_for(bytes);
    if (total == 0) continue;
    Row row;
    row.count = total;
    row.bytes = total * static_cast<std::int64_t>(sizeof(float));
    row.oop = Measure(bench, o.op, n, total, false);
    row.ip = Measure(bench, o.op, n, total, true);
    if (rank == 0) PrintRow(row, redop);
    bus_sum += row.oop.busbw + row.ip.busbw;
    rows.push_back(row);
  }

  int rc = 0;
  if (rank == 0) {
    long long wrong = 0;
    for (const Row& r : rows) wrong += r.oop.wrong + r.ip.wrong;
    std::printf("# Out of bounds values : %lld %s\n", wrong, wrong ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %.4f GB/s\n",
                rows.empty() ? 0.0 : bus_sum / (2.0 * static_cast<double>(rows.size())));
    if (!o.json.empty() && !WriteJson(o.json, o.op, n, redop, rows)) {
      std::fprintf(stderr, "bench_mpi_collectives: cannot write %s\n", o.json.c_str());
      rc = 2;
    }
    if (wrong && rc == 0) rc = 1;
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return rc;
}
