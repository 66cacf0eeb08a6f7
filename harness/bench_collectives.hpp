// The collective benchmark behind `shardcheck bench collectives`: nccl-tests conventions (size,
// count, type, time, algbw, busbw, #wrong; out-of-place and in-place), on any backend that can run
// a function on every rank. #wrong counts elements that differ from an exactly predictable result.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/ops.hpp"

namespace shardcheck::harness {

// A benchmarked collective: an op of the op table (comm/ops.hpp) with a fixed buffer layout
// (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast). Its name is comm::name_of's.
using BenchOp = comm::Op;
// Whether `op` has a benchmark row (a collective whose counts follow from the buffer's).
bool is_bench_op(BenchOp op);
bool parse_bench_op(std::string_view s, BenchOp& out);
// busbw = algbw x this factor (nccl-tests, the op table's comm::busbw_factor): 2(n-1)/n for
// all_reduce, (n-1)/n for all_gather, reduce_scatter and all_to_all, 1 for broadcast.
double bus_factor(BenchOp op, int n);

struct BenchRow;

struct BenchOptions {
  BenchOp op = BenchOp::all_reduce;
  comm::DType dtype = comm::DType::f32;
  comm::ReduceOp redop = comm::ReduceOp::sum;
  std::size_t min_bytes = 4096;
  std::size_t max_bytes = std::size_t{64} << 20;
  int warmup = 2;
  int iters = 0;  // 0: chosen per size so that a size takes about target_seconds
  double target_seconds = 0.2;
  std::function<void(const BenchRow&)> on_row;  // called as each size completes (progress)
};

struct BenchCell {
  double time_us = 0, algbw_gbps = 0, busbw_gbps = 0;
  std::uint64_t wrong = 0;
};

struct BenchRow {
  std::size_t bytes = 0, count = 0;  // of the buffer nccl-tests sizes by (the full one)
  BenchCell out_of_place, in_place;
};

struct BenchResult {
  std::string backend;
  int ranks = 0;
  BenchOptions options;
  std::vector<BenchRow> rows;
  std::uint64_t total_wrong() const;
};

// Runs `fn` on every rank of some backend and returns when all are done (throws on failure).
using RankRunner = std::function<void(const std::function<void(comm::Communicator&)>&)>;

BenchResult bench_collectives(const RankRunner& run, const std::string& backend, int ranks,
                              const BenchOptions& options);

// The element count of every size bench_collectives runs, smallest first: sizes double from
// min_bytes to max_bytes, each rounded down to whole elements (and, for the ops that split the
// buffer over the ranks, to a multiple of `ranks`); a size that holds no element is skipped, so
// an empty list means the range prints no row.
std::vector<std::size_t> bench_counts(const BenchOptions& options, int ranks);

// The table in nccl-tests layout: header, one row per size, footer (wrong count, avg busbw).
// The header and each row are flushed as written, so a long run shows its progress (and what
// it had done when killed).
void print_header(std::ostream& os, const std::string& backend, int ranks, const BenchOptions& o);
void print_row(std::ostream& os, const BenchOptions& o, const BenchRow& row);
void print_footer(std::ostream& os, const BenchResult& r);
void print_table(std::ostream& os, const BenchResult& r);

}  // namespace shardcheck::harness
