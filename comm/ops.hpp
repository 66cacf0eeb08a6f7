// The op table: every kind of op a program issues through comm::Communicator (collectives, point
// to point, barrier, split) and the other records of an op log (compute, wait, step start), each
// described once, as nccl-tests describes a collective once in its testColl: the name, what the op
// takes (a reduction, a root, a peer), its buffer layout (send count against receive count, and
// where the in-place form keeps its data), the bytes the simulator's cost model charges for it, its
// latency and bandwidth terms on a link, and the busbw factor of a benchmark row. The simulator
// (sim::OpKind, its rendezvous and clock), the op log and replay (OpRecord::Kind) and the
// benchmarks read this table instead of each keeping a list. Adding a collective: one enumerator
// and one row here, then the Communicator method and each backend's implementation.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace shardcheck::comm {

// Every kind of op and op-log record. The order is the op log's (OpRecord::Kind is this enum).
enum class Op : std::uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  reduce,
  all_to_all,
  all_to_all_v,
  send,
  recv,
  barrier,
  split,
  compute,
  wait,  // an op-log record: the first wait() on the Work of an earlier record
  begin_step
};

// How an op's send and receive counts relate to the buffer count nccl-tests sizes by (the larger
// buffer, `count` below), and where the in-place form keeps this rank's data.
enum class Layout : std::uint8_t {
  none,     // no data (barrier, split, compute, ...) or one side only (send, recv)
  same,     // send = recv = count; in place: send.data == recv.data (all_reduce, broadcast,
            // reduce: its recv on the root only)
  chunks,   // send = recv = count, in group-size chunks; in place: send.data == recv.data
  gather,   // send = count / n, recv = count; in place: send.data == recv.data + rank * send
  scatter,  // send = count, recv = count / n; in place: recv.data == send.data + rank * recv
  varies,   // per-peer counts given by the caller (all_to_all_v); in place: send.data == recv.data
};

// A factor of the group size n used by the cost and bandwidth rules.
enum class Share : std::uint8_t {
  zero,      // 0
  one,       // 1
  frac,      // (n - 1) / n
  two_frac,  // 2 (n - 1) / n
};

// The latency term of an op on a link of per-message latency alpha: this many alphas.
enum class Steps : std::uint8_t {
  zero,     // 0
  one,      // 1 (a point-to-point message)
  pm1,      // n - 1
  two_pm1,  // 2 (n - 1)
};

// What the simulator charges as an op's bytes (Slot::cost_bytes, the timeline's byte column),
// from the count in the op's descriptor (the receive count of reduce_scatter, the send count of
// all_gather and all_to_all, the buffer's of all_reduce, broadcast and reduce) and the element
// size.
enum class CostBytes : std::uint8_t {
  zero,     // barrier, split
  count,    // count x elem (all_reduce, broadcast, reduce; all_to_all_v: the most any member
            // exchanges)
  times_n,  // count x elem x n: the whole buffer (reduce_scatter, all_gather)
  frac,     // count x elem x (n - 1) / n: what leaves each rank (all_to_all)
  message,  // the message's bytes (send, recv)
};

struct OpInfo {
  Op op;
  std::string_view name;
  bool communication;   // an op of a group (collective, point to point, barrier), kept by cost_view
  bool collective;      // every member of the group takes part (a rendezvous in the simulator)
  bool reduces;         // takes a ReduceOptions
  bool rooted;          // takes a root (broadcast: BroadcastOptions; reduce: its root argument)
  bool point_to_point;  // takes a peer and a tag
  Layout layout;
  CostBytes cost_bytes;
  Steps latency;    // simulator: time = latency x alpha + bandwidth x bytes x beta
  Share bandwidth;  //   (bytes: cost_bytes; n <= 1: no time)
  Share busbw;      // nccl-tests: busbw = algbw x this; algbw = bytes of `count` / time
};

inline constexpr std::array<OpInfo, 14> kOps{{
    // op, name, communication, collective, reduces, rooted, point_to_point, layout, cost_bytes,
    // latency, bandwidth, busbw
    {Op::all_reduce, "all_reduce", true, true, true, false, false, Layout::same, CostBytes::count,
     Steps::two_pm1, Share::two_frac, Share::two_frac},
    {Op::reduce_scatter, "reduce_scatter", true, true, true, false, false, Layout::scatter,
     CostBytes::times_n, Steps::pm1, Share::frac, Share::frac},
    {Op::all_gather, "all_gather", true, true, false, false, false, Layout::gather,
     CostBytes::times_n, Steps::pm1, Share::frac, Share::frac},
    {Op::broadcast, "broadcast", true, true, false, true, false, Layout::same, CostBytes::count,
     Steps::pm1, Share::one, Share::one},
    // reduce: broadcast run backwards, as NCCL runs it (a ring / chain pipeline towards the
    // root): every link carries the whole buffer once, so n - 1 latency steps and the buffer's
    // bytes once (cost_bytes count, bandwidth one); nccl-tests' busbw factor for reduce is 1, as
    // for broadcast. all_reduce (a reduce_scatter then an all_gather) charges 2(n-1) steps and
    // 2(n-1)/n of the bytes.
    {Op::reduce, "reduce", true, true, true, true, false, Layout::same, CostBytes::count,
     Steps::pm1, Share::one, Share::one},
    {Op::all_to_all, "all_to_all", true, true, false, false, false, Layout::chunks, CostBytes::frac,
     Steps::pm1, Share::one, Share::frac},
    {Op::all_to_all_v, "all_to_all_v", true, true, false, false, false, Layout::varies,
     CostBytes::count, Steps::pm1, Share::one, Share::frac},
    {Op::send, "send", true, false, false, false, true, Layout::none, CostBytes::message,
     Steps::one, Share::one, Share::one},
    {Op::recv, "recv", true, false, false, false, true, Layout::none, CostBytes::message,
     Steps::one, Share::one, Share::one},
    {Op::barrier, "barrier", true, true, false, false, false, Layout::none, CostBytes::zero,
     Steps::two_pm1, Share::zero, Share::zero},
    {Op::split, "split", false, true, false, false, false, Layout::none, CostBytes::zero,
     Steps::zero, Share::zero, Share::zero},
    {Op::compute, "compute", false, false, false, false, false, Layout::none, CostBytes::zero,
     Steps::zero, Share::zero, Share::zero},
    {Op::wait, "wait", false, false, false, false, false, Layout::none, CostBytes::zero,
     Steps::zero, Share::zero, Share::zero},
    {Op::begin_step, "begin_step", false, false, false, false, false, Layout::none, CostBytes::zero,
     Steps::zero, Share::zero, Share::zero},
}};

constexpr const OpInfo& info(Op op) {
  return kOps[static_cast<std::size_t>(op)];
}

std::string_view name_of(Op op);
// The op of this name, or none.
std::optional<Op> op_named(std::string_view name);
// An op of a group, as opposed to split, compute, wait and begin_step (OpInfo::communication).
bool is_communication(Op op);

// The send and receive element counts of this rank for a buffer of `count` elements (the larger
// one, as nccl-tests sizes a row) over n ranks; for layouts none and varies, count and count.
struct Counts {
  std::size_t send = 0, recv = 0;
};
constexpr Counts counts_for(Op op, std::size_t count, int n) {
  const auto un = static_cast<std::size_t>(n);
  switch (info(op).layout) {
    case Layout::gather:
      return {count / un, count};
    case Layout::scatter:
      return {count, count / un};
    default:
      return {count, count};
  }
}
// Whether the buffer count must be a multiple of the group size (the op splits it by rank).
constexpr bool splits_by_rank(Op op) {
  const Layout l = info(op).layout;
  return l == Layout::gather || l == Layout::scatter || l == Layout::chunks;
}

// nccl-tests' bus bandwidth factor: 2(n-1)/n for all_reduce, (n-1)/n for reduce_scatter,
// all_gather and all_to_all, 1 for broadcast and reduce.
constexpr double busbw_factor(Op op, int n) {
  switch (info(op).busbw) {
    case Share::two_frac:
      return 2.0 * (n - 1) / n;
    case Share::frac:
      return static_cast<double>(n - 1) / n;
    case Share::one:
      return 1.0;
    case Share::zero:
      return 0.0;
  }
  return 0.0;
}

// The bytes the simulator charges (CostBytes) for a descriptor count of `count` elements of
// `elem` bytes over p ranks; for send and recv, count x elem; for all_to_all_v, pass as count the
// most elements any member sends to, or receives from, the others.
constexpr double cost_bytes(Op op, double count, double elem, double p) {
  switch (info(op).cost_bytes) {
    case CostBytes::zero:
      return 0;
    case CostBytes::count:
    case CostBytes::message:
      return count * elem;
    case CostBytes::times_n:
      return count * elem * p;
    case CostBytes::frac:
      return count * elem * (p - 1) / p;
  }
  return 0;
}

// The simulator's alpha-beta time of an op over p ranks that moves `bytes` (cost_bytes) on a link
// of latency alpha seconds and beta seconds per byte: latency x alpha + bandwidth x bytes x beta;
// 0 for a group of one.
constexpr double link_seconds(Op op, int p, double bytes, double alpha, double beta) {
  if (p <= 1) return 0;
  const double pm1 = p - 1;
  const double frac = pm1 / p;
  const OpInfo& i = info(op);
  double steps = 0;
  switch (i.latency) {
    case Steps::zero:
      steps = 0;
      break;
    case Steps::one:
      steps = 1;
      break;
    case Steps::pm1:
      steps = pm1;
      break;
    case Steps::two_pm1:
      steps = 2 * pm1;
      break;
  }
  double band = 0;
  switch (i.bandwidth) {
    case Share::zero:
      return steps * alpha;
    case Share::one:
      band = 1;
      break;
    case Share::frac:
      band = frac;
      break;
    case Share::two_frac:
      band = 2 * frac;
      break;
  }
  return steps * alpha + band * bytes * beta;
}

}  // namespace shardcheck::comm
