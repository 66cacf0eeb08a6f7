// NcclCommunicator's operations: argument checks, staging, the NCCL call, the event.
#include "gpu/nccl_communicator.hpp"

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <thread>
#include <tuple>

#include "comm/ops.hpp"
#include "gpu/nccl_core.hpp"

namespace shardcheck::gpu {

using comm::Buffer;
using comm::ConstBuffer;
using comm::DType;
using comm::OpContext;
using comm::WorkPtr;
using detail::Core;
using detail::cuda_check;
using detail::NcclWork;
using detail::Staging;

namespace {

void require(bool ok, const OpContext& ctx, const std::string& what) {
  if (!ok) throw comm::InvalidArgument(ctx, what);
}

void same_dtype(const ConstBuffer& a, const Buffer& b, const OpContext& ctx) {
  require(a.dtype == b.dtype, ctx,
          "send dtype " + std::string(comm::name_of(a.dtype)) + " != recv dtype " +
              std::string(comm::name_of(b.dtype)));
}

bool is_half(DType t) {
  return t == DType::bf16 || t == DType::f16;
}

// The op's name in the op table (comm/ops.hpp), as the contexts and signature checks take it (the
// table's names are string literals, so null-terminated).
const char* op_name(comm::Op op) {
  return comm::name_of(op).data();
}
}  // namespace

NcclCommunicator::NcclCommunicator(void* nccl_comm, int device, std::string name,
                                   std::vector<int> members, std::shared_ptr<RankBooks> books,
                                   NcclOptions options, std::shared_ptr<std::atomic<bool>> cancel)
    : core_(std::make_shared<Core>()) {
  Core& c = *core_;
  c.comm = static_cast<ncclComm_t>(nccl_comm);
  c.device = device;
  c.name = std::move(name);
  c.members = std::move(members);
  c.options = options;
  if (const char* e = std::getenv("SHARDCHECK_NCCL_CHECK"); e != nullptr && e[0] == '1')
    c.options.check_signatures = true;
  c.books = std::move(books);
  c.cancel = std::move(cancel);
  const OpContext ctx{-1, c.name, "create", 0};
  cuda_check(cudaSetDevice(device), ctx, "cudaSetDevice");
  cuda_check(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking), ctx,
             "cudaStreamCreateWithFlags");
  c.nccl_check(ncclCommUserRank(c.comm, &c.rank), ctx, "ncclCommUserRank");
  c.nccl_check(ncclCommCount(c.comm, &c.size), ctx, "ncclCommCount");
  if (c.members.empty()) {
    c.members.resize(static_cast<std::size_t>(c.size));
    std::iota(c.members.begin(), c.members.end(), 0);
  }
  if (static_cast<int>(c.members.size()) != c.size)
    throw comm::InvalidArgument(ctx, "members list has " + std::to_string(c.members.size()) +
                                         " ranks, NCCL communicator " + std::to_string(c.size));
  if (!c.books) c.books = std::make_shared<RankBooks>(c.world_rank());
  const float one = 1.0F;
  cuda_check(cudaMallocAsync(&c.one, sizeof(float), c.stream), ctx, "cudaMallocAsync");
  cuda_check(cudaMemcpyAsync(c.one, &one, sizeof one, cudaMemcpyHostToDevice, c.stream), ctx,
             "cudaMemcpyAsync");
  cuda_check(cudaStreamSynchronize(c.stream), ctx, "cudaStreamSynchronize");
}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::rank() const {
  return core_->rank;
}
int NcclCommunicator::size() const {
  return core_->size;
}
const std::string& NcclCommunicator::name() const {
  return core_->name;
}
const std::vector<int>& NcclCommunicator::members() const {
  return core_->members;
}
int NcclCommunicator::device() const {
  return core_->device;
}
void* NcclCommunicator::stream() const {
  return core_->stream;
}
void* NcclCommunicator::nccl_comm() const {
  return core_->comm;
}
const NcclOptions& NcclCommunicator::options() const {
  return core_->options;
}
const RankBooks& NcclCommunicator::books() const {
  return *core_->books;
}
void NcclCommunicator::abort(const std::string& why) {
  core_->abort(why);
}
bool NcclCommunicator::aborted() const {
  return core_->is_aborted;
}

WorkPtr NcclCommunicator::reduce_common(const char* op, ConstBuffer send, Buffer recv,
                                        comm::ReduceOptions o, bool scatter) {
  Core& c = *core_;
  const OpContext ctx = c.begin(op);
  c.flush(ctx);
  same_dtype(send, recv, ctx);
  const std::size_t want = scatter ? recv.count * static_cast<std::size_t>(c.size) : recv.count;
  require(send.count == want, ctx,
          "send has " + std::to_string(send.count) + " elements, expected " + std::to_string(want));
  c.arrive(ctx, recv.count, recv.dtype, -1, static_cast<int>(o.op));
  Staging s;
  const void* sp = c.in(send, s, ctx);
  void* rp = c.out(recv, s, ctx);
  const std::size_t n = recv.count;
  const ncclRedOp_t rop = detail::nccl_op(o.op);
  auto call = [&](const void* a, void* b, ncclDataType_t t) {
    if (scatter)
      c.nccl_check(ncclReduceScatter(a, b, n, t, rop, c.comm, c.stream), ctx, "ncclReduceScatter");
    else
      c.nccl_check(ncclAllReduce(a, b, n, t, rop, c.comm, c.stream), ctx, "ncclAllReduce");
  };
  if (is_half(send.dtype) && c.options.exact_half) {
    auto* ws = static_cast<float*>(c.scratch(send.count * sizeof(float), s, ctx));
    auto* wr = static_cast<float*>(c.scratch(n * sizeof(float), s, ctx));
    cuda_check(detail::widen_to_f32(sp, send.dtype, ws, send.count, c.stream), ctx,
               "widen_to_f32 kernel launch");
    call(ws, wr, ncclFloat32);
    if (o.op == comm::ReduceOp::avg)
      cuda_check(detail::divide_inplace(wr, DType::f32, n, c.size, c.stream), ctx,
                 "divide kernel launch");
    cuda_check(detail::narrow_from_f32(wr, rp, recv.dtype, n, c.stream), ctx,
               "narrow_from_f32 kernel launch");
  } else {
    call(sp, rp, detail::nccl_type(send.dtype));
    if (o.op == comm::ReduceOp::avg)
      cuda_check(detail::divide_inplace(rp, recv.dtype, n, c.size, c.stream), ctx,
                 "divide kernel launch");
  }
  return std::make_shared<NcclWork>(core_, c.record(ctx), ctx, std::move(s));
}

WorkPtr NcclCommunicator::do_all_reduce(ConstBuffer send, Buffer recv, comm::ReduceOptions o) {
  return reduce_common(op_name(comm::Op::all_reduce), send, recv, o, false);
}

WorkPtr NcclCommunicator::do_reduce_scatter(ConstBuffer send, Buffer recv, comm::ReduceOptions o) {
  return reduce_common(op_name(comm::Op::reduce_scatter), send, recv, o, true);
}

WorkPtr NcclCommunicator::do_all_gather(ConstBuffer send, Buffer recv) {
  Core& c = *core_;
  const OpContext ctx = c.begin(op_name(comm::Op::all_gather));
  c.flush(ctx);
  same_dtype(send, recv, ctx);
  require(recv.count == send.count * static_cast<std::size_t>(c.size), ctx,
          "recv has " + std::to_string(recv.count) + " elements, expected send.count * size = " +
              std::to_string(send.count * static_cast<std::size_t>(c.size)));
  c.arrive(ctx, send.count, send.dtype, -1, -1);
  Staging s;
  const void* sp = c.in(send, s, ctx);
  void* rp = c.out(recv, s, ctx);
  c.nccl_check(ncclAllGather(sp, rp, send.count, detail::nccl_type(send.dtype), c.comm, c.stream),
               ctx, "ncclAllGather");
  return std::make_shared<NcclWork>(core_, c.record(ctx), ctx, std::move(s));
}

WorkPtr NcclCommunicator::do_broadcast(ConstBuffer send, Buffer recv, comm::BroadcastOptions o) {
  Core& c = *core_;
  const OpContext ctx = c.begin(op_name(comm::Op::broadcast));
  c.flush(ctx);
  require(
      o.root >= 0 && o.root < c.size, ctx,
      "root " + std::to_string(o.root) + " is not a rank of a group of " + std::to_string(c.size));
  const bool is_root = o.root == c.rank;
  if (is_root) {
    same_dtype(send, recv, ctx);
    require(
        send.count == recv.count, ctx,
        "send has " + std::to_string(send.count) + " elements, recv " + std::to_string(recv.count));
  }
  c.arrive(ctx, recv.count, recv.dtype, o.root, -1);
  Staging s;
  void* rp = c.out(recv, s, ctx);
  const void* sp = is_root ? c.in(send, s, ctx) : rp;
  c.nccl_check(
      ncclBroadcast(sp, rp, recv.count, detail::nccl_type(recv.dtype), o.root, c.comm, c.stream),
      ctx, "ncclBroadcast");
  return std::make_shared<NcclWork>(core_, c.record(ctx), ctx, std::move(s));
}

// ncclReduce: recvbuff is used on the root only (nullptr elsewhere). Half types with exact_half
// reduce in f32 as reduce_common does; avg is a sum divided on the root.
WorkPtr NcclCommunicator::do_reduce(ConstBuffer send, Buffer recv, int root,
                                    comm::ReduceOptions o) {
  Core& c = *core_;
  const OpContext ctx = c.begin(op_name(comm::Op::reduce));
  c.flush(ctx);
  require(
      root >= 0 && root < c.size, ctx,
      "root " + std::to_string(root) + " is not a rank of a group of " + std::to_string(c.size));
  const bool is_root = root == c.rank;
  if (is_root) {
    same_dtype(send, recv, ctx);
    require(
        send.count == recv.count, ctx,
        "send has " + std::to_string(send.count) + " elements, recv " + std::to_string(recv.count));
  }
  c.arrive(ctx, send.count, send.dtype, root, static_cast<int>(o.op));
  Staging s;
  const void* sp = c.in(send, s, ctx);
  void* rp = is_root ? c.out(recv, s, ctx) : nullptr;
  const std::size_t n = send.count;
  const ncclRedOp_t rop = detail::nccl_op(o.op);
  if (is_half(send.dtype) && c.options.exact_half) {
    auto* ws = static_cast<float*>(c.scratch(n * sizeof(float), s, ctx));
    auto* wr = is_root ? static_cast<float*>(c.scratch(n * sizeof(float), s, ctx)) : nullptr;
    cuda_check(detail::widen_to_f32(sp, send.dtype, ws, n, c.stream), ctx,
               "widen_to_f32 kernel launch");
    c.nccl_check(ncclReduce(ws, wr, n, ncclFloat32, rop, root, c.comm, c.stream), ctx,
                 "ncclReduce");
    if (is_root) {
      if (o.op == comm::ReduceOp::avg)
        cuda_check(detail::divide_inplace(wr, DType::f32, n, c.size, c.stream), ctx,
                   "divide kernel launch");
      cuda_check(detail::narrow_from_f32(wr, rp, recv.dtype, n, c.stream), ctx,
                 "narrow_from_f32 kernel launch");
    }
  } else {
    c.nccl_check(ncclReduce(sp, rp, n, detail::nccl_type(send.dtype), rop, root, c.comm, c.stream),
                 ctx, "ncclReduce");
    if (is_root && o.op == comm::ReduceOp::avg)
      cuda_check(detail::divide_inplace(rp, recv.dtype, n, c.size, c.stream), ctx,
                 "divide kernel launch");
  }
  return std::make_shared<NcclWork>(core_, c.record(ctx), ctx, std::move(s));
}

WorkPtr NcclCommunicator::do_all_to_all(ConstBuffer send, Buffer recv) {
  Core& c = *core_;
  const OpContext ctx = c.begin(op_name(comm::Op::all_to_all));
  c.flush(ctx);
  same_dtype(send, recv, ctx);
  require(send.count == recv.count && send.count % static_cast<std::size_t>(c.size) == 0, ctx,
          "all_to_all needs equal send and recv counts divisible by the group size; got " +
              std::to_string(send.count) + " and " + std::to_string(recv.count));
  c.arrive(ctx, send.count, send.dtype, -1, -1);
  Staging s;
  const void* sp = c.in(send, s, ctx);
  void* rp = c.out(recv, s, ctx);
  if (sp == rp) {  // in place: NCCL's all-to-all needs distinct buffers
    void* copy = c.scratch(send.bytes(), s, ctx);
    cuda_check(cudaMemcpyAsync(copy, sp, send.bytes(), cudaMemcpyDeviceToDevice, c.stream), ctx,
               "cudaMemcpyAsync");
    sp = copy;
  }
  const std::size_t per = send.count / static_cast<std::size_t>(c.size);
  c.nccl_check(ncclAlltoAll(sp, rp, per, detail::nccl_type(send.dtype), c.comm, c.stream), ctx,
               "ncclAlltoAll");
  return std::make_shared<NcclWork>(core_, c.record(ctx), ctx, std::move(s));
}

WorkPtr NcclCommunicator::do_all_to_all_v(ConstBuffer send,
                                          std::span<const std::size_t> send_counts, Buffer recv,
                                          std::span<const std::size_t> recv_counts) {
  Core& c = *core_;
  const OpContext ctx = c.begin(op_name(comm::Op::all_to_all_v));
  c.flush(ctx);
  same_dtype(send, recv, ctx);
  const auto p = static_cast<std::size_t>(c.size);
  require(send_counts.size() == p && recv_counts.size() == p, ctx,
          "send_counts and recv_counts need one entry per rank (" + std::to_string(p) + ")");
  const std::size_t ssum = std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0});
  const std::size_t rsum = std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0});
  require(ssum <= send.count && rsum <= recv.count, ctx,
          "counts sum to " + std::to_string(ssum) + " sent / " + std::to_string(rsum) +
              " received, buffers hold " + std::to_string(send.count) + " / " +
              std::to_string(recv.count));
  c.arrive(ctx, 0, send.dtype, -1, -1);  // counts are checked below
  Staging s;
  if (c.options.check_all_to_all_v) {
    // Every rank gathers every rank's send and recv counts and checks all pairs, so all members
    // raise the same MismatchError instead of some of them hanging.
    std::vector<std::int64_t> mine(2 * p);
    for (std::size_t j = 0; j < p; ++j) {
      mine[j] = static_cast<std::int64_t>(send_counts[j]);
      mine[p + j] = static_cast<std::int64_t>(recv_counts[j]);
    }
    const std::vector<std::int64_t> all =
        c.exchange(mine.data(), 2 * p, ctx, "ncclAllGather (all_to_all_v counts)");
    for (std::size_t i = 0; i < p; ++i)
      for (std::size_t j = 0; j < p; ++j) {
        const std::int64_t recv_ij = all[2 * p * i + p + j];  // rank i expects from j
        const std::int64_t send_ji = all[2 * p * j + i];      // rank j sends to i
        if (recv_ij != send_ji) {
          const std::string what =
              "all_to_all_v counts disagree: rank " + std::to_string(c.members[i]) + " expects " +
              std::to_string(recv_ij) + " elements from rank " + std::to_string(c.members[j]) +
              ", which sends " + std::to_string(send_ji);
          c.abort(what);  // every member saw it: all leave, none waits for the data
          throw comm::MismatchError(ctx, what, {c.members[i], c.members[j]});
        }
      }
  }
  const void* sp = c.in(send, s, ctx);
  void* rp = c.out(recv, s, ctx);
  if (sp == rp) {
    void* copy = c.scratch(send.bytes(), s, ctx);
    cuda_check(cudaMemcpyAsync(copy, sp, send.bytes(), cudaMemcpyDeviceToDevice, c.stream), ctx,
               "cudaMemcpyAsync");
    sp = copy;
  }
  const std::size_t es = comm::size_of(send.dtype);
  const ncclDataType_t t = detail::nccl_type(send.dtype);
  c.nccl_check(ncclGroupStart(), ctx, "ncclGroupStart");
  std::size_t so = 0;
  std::size_t ro = 0;
  for (std::size_t j = 0; j < p; ++j) {
    const int peer = static_cast<int>(j);
    ncclResult_t r = ncclSuccess;
    if (send_counts[j] > 0)
      r = ncclSend(static_cast<const std::byte*>(sp) + so * es, send_counts[j], t, peer, c.comm,
                   c.stream);
    if (r != ncclSuccess && r != ncclInProgress) c.fail_in_group(r, ctx, "ncclSend", c.members[j]);
    if (recv_counts[j] > 0)
      r = ncclRecv(static_cast<std::byte*>(rp) + ro * es, recv_counts[j], t, peer, c.comm,
                   c.stream);
    if (r != ncclSuccess && r != ncclInProgress) c.fail_in_group(r, ctx, "ncclRecv", c.members[j]);
    so += send_counts[j];
    ro += recv_counts[j];
  }
  c.nccl_check(ncclGroupEnd(), ctx, "ncclGroupEnd (all_to_all_v)");
  return std::make_shared<NcclWork>(core_, c.record(ctx), ctx, std::move(s));
}

WorkPtr NcclCommunicator::do_send(ConstBuffer buf, int peer, comm::P2POptions /*o*/) {
  Core& c = *core_;
  const OpContext ctx = c.begin_p2p(true, peer);
  require(peer >= 0 && peer < c.size, ctx, "peer " + std::to_string(peer) + " is out of range");
  Staging s;
  const void* sp = c.in(buf, s, ctx);
  if (c.held.empty()) {
    c.held_launch = std::make_shared<detail::Launch>();
    c.held_ctx = ctx;
  }
  c.held.push_back({true, sp, nullptr, buf.count, detail::nccl_type(buf.dtype), peer});
  return std::make_shared<NcclWork>(core_, c.held_launch, ctx, std::move(s),
                                    c.members[static_cast<std::size_t>(peer)]);
}

WorkPtr NcclCommunicator::do_recv(Buffer buf, int peer, comm::P2POptions /*o*/) {
  Core& c = *core_;
  const OpContext ctx = c.begin_p2p(false, peer);
  require(peer >= 0 && peer < c.size, ctx, "peer " + std::to_string(peer) + " is out of range");
  Staging s;
  void* rp = c.out(buf, s, ctx);
  if (c.held.empty()) {
    c.held_launch = std::make_shared<detail::Launch>();
    c.held_ctx = ctx;
  }
  c.held.push_back({false, nullptr, rp, buf.count, detail::nccl_type(buf.dtype), peer});
  return std::make_shared<NcclWork>(core_, c.held_launch, ctx, std::move(s),
                                    c.members[static_cast<std::size_t>(peer)]);
}

WorkPtr NcclCommunicator::do_barrier() {
  Core& c = *core_;
  const OpContext ctx = c.begin(op_name(comm::Op::barrier));
  c.flush(ctx);
  c.arrive(ctx, 0, comm::DType::f32, -1, -1);
  c.nccl_check(ncclAllReduce(c.one, c.one, 1, ncclFloat32, ncclMax, c.comm, c.stream), ctx,
               "ncclAllReduce (barrier)");
  return std::make_shared<NcclWork>(core_, c.record(ctx), ctx, Staging{});
}

std::unique_ptr<comm::Communicator> NcclCommunicator::do_split(int color, int key,
                                                               const comm::SplitOptions& o) {
  Core& c = *core_;
  const OpContext ctx = c.begin(op_name(comm::Op::split));
  c.flush(ctx);
  c.arrive(ctx, 0, comm::DType::i32, -1, -1);
  // Learn every member's (color, key) so the new group's world ranks are known here.
  const auto p = static_cast<std::size_t>(c.size);
  const std::int64_t mine[2] = {color < 0 ? -1 : color, key};
  const std::vector<std::int64_t> all = c.exchange(mine, 2, ctx, "ncclAllGather (split colors)");

  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t nc = nullptr;
  const ncclResult_t r =
      ncclCommSplit(c.comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &nc, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) c.fail(r, ctx, "ncclCommSplit", -1);
  c.settle(ctx, "ncclCommSplit");
  if (color < 0) return nullptr;
  if (nc == nullptr) throw comm::CommError(ctx, "ncclCommSplit returned no communicator");
  detail::settle_comm(nc, ctx, "ncclCommSplit (new communicator)", c.options.timeout,
                      c.cancel.get());

  std::vector<std::tuple<int, int, int>> order;  // (key, group rank, world rank)
  for (std::size_t r2 = 0; r2 < p; ++r2)
    if (all[2 * r2] == color)
      order.emplace_back(static_cast<int>(all[2 * r2 + 1]), static_cast<int>(r2), c.members[r2]);
  std::sort(order.begin(), order.end());
  std::vector<int> members;
  for (const auto& e : order) members.push_back(std::get<2>(e));
  std::string name = o.name.empty() ? c.name + "/" + std::to_string(color) : o.name;
  return std::make_unique<NcclCommunicator>(nc, c.device, std::move(name), std::move(members),
                                            c.books, c.options, c.cancel);
}

void NcclCommunicator::do_compute(const comm::ComputeCost& cost) {
  RankBooks& b = *core_->books;
  if (b.computes.size() >= RankBooks::kMaxComputes) b.computes.erase(b.computes.begin());
  b.computes.push_back({std::string(cost.name), cost.flops, cost.bytes, b.step});
}

void NcclCommunicator::do_begin_step(int step) {
  core_->books->step = step;
}

comm::MemoryTracker& NcclCommunicator::do_memory() {
  return core_->books->memory;
}

}  // namespace shardcheck::gpu
