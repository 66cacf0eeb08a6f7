// The state behind NcclCommunicator: checked calls, polling with timeout and abort, host staging,
// held point-to-point groups, and the Work.
#include "gpu/nccl_core.hpp"

#include <algorithm>
#include <thread>

namespace shardcheck::gpu::detail {

using comm::DType;
using comm::OpContext;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f64:
      return ncclFloat64;
    case DType::f32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(comm::ReduceOp op) {
  switch (op) {
    case comm::ReduceOp::sum:
    case comm::ReduceOp::avg:
      return ncclSum;
    case comm::ReduceOp::max:
      return ncclMax;
    case comm::ReduceOp::min:
      return ncclMin;
    case comm::ReduceOp::prod:
      return ncclProd;
  }
  return ncclSum;
}

void cuda_check(cudaError_t e, const OpContext& ctx, const char* call) {
  if (e == cudaSuccess) return;
  throw comm::CommError(ctx, std::string("CUDA error in ") + call + ": " + cudaGetErrorName(e) +
                                 " (" + cudaGetErrorString(e) + ")");
}

namespace {
// How long a raised cancel flag waits for the op in flight to complete on its own.
constexpr std::chrono::milliseconds kCancelGrace{1000};
}  // namespace

DeviceGuard::DeviceGuard(int device) {
  if (cudaGetDevice(&saved_) != cudaSuccess) saved_ = -1;
  if (saved_ != device) cudaSetDevice(device);
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (saved_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != saved_) cudaSetDevice(saved_);
}

void settle_comm(ncclComm_t c, const OpContext& ctx, const char* call,
                 std::chrono::milliseconds timeout, const std::atomic<bool>* cancel) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    ncclResult_t a = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(c, &a);
    if (q != ncclSuccess) a = q;
    if (a == ncclSuccess) return;
    if (a != ncclInProgress) {
      ncclCommAbort(c);
      throw comm::CommError(ctx, std::string(call) + ": " + ncclGetErrorString(a));
    }
    if (std::chrono::steady_clock::now() - start > timeout) {
      ncclCommAbort(c);
      throw comm::PeerError(ctx, std::string(call) + " timed out (a member never joined)", -1);
    }
    if (cancel != nullptr && cancel->load()) {
      ncclCommAbort(c);
      throw comm::AbortedError(ctx, std::string(call) + " cancelled: another rank failed");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

Launch::~Launch() {
  if (event != nullptr) cudaEventDestroy(event);
}

Core::~Core() {
  const DeviceGuard guard(device);  // a Work may release the last reference on another thread
  if (one != nullptr) cudaFreeAsync(one, stream);
  for (const Scratch& sc : held_scratch) cudaFreeAsync(sc.ptr, stream);  // never launched
  if (comm != nullptr && !is_aborted) {
    // Finalize flushes outstanding work; a peer that never comes would hang it, so poll with the
    // timeout and abort past it. Destructors do not throw.
    ncclResult_t r = ncclCommFinalize(comm);
    const auto start = std::chrono::steady_clock::now();
    while (r == ncclSuccess || r == ncclInProgress) {
      ncclResult_t a = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &a) != ncclSuccess || a != ncclInProgress) {
        r = a;
        break;
      }
      if (std::chrono::steady_clock::now() - start > options.timeout ||
          (cancel && cancel->load())) {
        r = ncclInternalError;
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (r == ncclSuccess)
      ncclCommDestroy(comm);
    else
      ncclCommAbort(comm);
  }
  if (stream != nullptr) cudaStreamDestroy(stream);
}

OpContext Core::begin(const char* op) {
  OpContext ctx{world_rank(), name, op, seq};
  if (is_aborted) throw comm::AbortedError(ctx, "communicator was aborted: " + abort_reason);
  if (cancel && cancel->load()) {
    abort("another rank failed");
    throw comm::AbortedError(ctx, "communicator was aborted: " + abort_reason);
  }
  use_device(ctx);
  (void)cudaGetLastError();  // a stale error of an unrelated call is not this op's
  return ctx;
}

OpContext Core::begin_p2p(bool is_send, int peer) {
  const bool known = peer >= 0 && peer < size;
  std::string op = std::string(is_send ? "send to rank " : "recv from rank ") +
                   std::to_string(known ? members[static_cast<std::size_t>(peer)] : peer);
  OpContext ctx = begin(op.c_str());
  ctx.seq = known ? p2p_seq[{peer, is_send}]++ : 0;
  return ctx;
}

void Core::arrive(const OpContext& ctx, std::size_t count, DType t, int root, int redop) {
  ++seq;
  check_signature(ctx, count, t, root, redop);
}

void Core::use_device(const OpContext& ctx) const {
  cuda_check(cudaSetDevice(device), ctx, "cudaSetDevice");
}

void Core::abort(const std::string& why) {
  if (is_aborted) return;
  is_aborted = true;
  abort_reason = why;
  if (cancel) cancel->store(true);
  if (comm != nullptr) ncclCommAbort(comm);
  comm = nullptr;
}

void Core::fail(ncclResult_t r, const OpContext& ctx, const char* call, int peer) {
  const std::string what =
      std::string("NCCL error in ") + call + ": " + ncclGetErrorString(r) +
      (comm != nullptr ? std::string(" (") + ncclGetLastError(comm) + ")" : "");
  abort(what);
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      throw comm::InvalidArgument(ctx, what);
    case ncclRemoteError:
      throw comm::PeerError(ctx, what, peer);
    default:
      throw comm::CommError(ctx, what);
  }
}

void Core::nccl_check(ncclResult_t r, const OpContext& ctx, const char* call, int peer) {
  if (r == ncclSuccess) return;
  if (r == ncclInProgress) return settle(ctx, call);
  fail(r, ctx, call, peer);
}

void Core::settle(const OpContext& ctx, const char* call) {
  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point cancel_since{};
  for (int spins = 0;; ++spins) {
    ncclResult_t a = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm, &a);
    if (q != ncclSuccess) fail(q, ctx, "ncclCommGetAsyncError", -1);
    if (a == ncclSuccess) return;
    if (a != ncclInProgress) fail(a, ctx, call, -1);
    if (cancelled(cancel_since)) {
      abort("another rank failed");
      throw comm::AbortedError(ctx, std::string(call) + " cancelled: another rank failed");
    }
    if (std::chrono::steady_clock::now() - start > options.timeout) {
      abort(std::string(call) + " timed out");
      throw comm::PeerError(ctx,
                            std::string(call) + " still in progress after " +
                                std::to_string(options.timeout.count()) +
                                " ms; communicator aborted",
                            -1);
    }
    if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

bool Core::poll_event(cudaEvent_t ev) {
  if (is_aborted) return true;
  const cudaError_t e = cudaEventQuery(ev);
  if (e != cudaErrorNotReady) return true;
  ncclResult_t a = ncclSuccess;
  if (ncclCommGetAsyncError(comm, &a) != ncclSuccess) return true;
  return a != ncclSuccess && a != ncclInProgress;
}

bool Core::cancelled(std::chrono::steady_clock::time_point& cancel_since) const {
  if (!cancel || !cancel->load()) return false;
  const auto now = std::chrono::steady_clock::now();
  if (cancel_since == std::chrono::steady_clock::time_point{}) cancel_since = now;
  return now - cancel_since > std::min(kCancelGrace, options.timeout);
}

void Core::wait_event(cudaEvent_t ev, const OpContext& ctx, int peer) {
  if (is_aborted) throw comm::AbortedError(ctx, "communicator was aborted: " + abort_reason);
  use_device(ctx);
  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point cancel_since{};
  for (int spins = 0;; ++spins) {
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) {
      abort(std::string("cudaEventQuery: ") + cudaGetErrorString(e));
      cuda_check(e, ctx, "cudaEventQuery");
    }
    ncclResult_t a = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm, &a);
    if (q != ncclSuccess) fail(q, ctx, "ncclCommGetAsyncError", peer);
    if (a != ncclSuccess && a != ncclInProgress) fail(a, ctx, "the op (asynchronous error)", peer);
    if (cancelled(cancel_since)) {
      abort("another rank failed");
      throw comm::AbortedError(ctx, "communicator was aborted: another rank failed");
    }
    if (std::chrono::steady_clock::now() - start > options.timeout) {
      const std::string who = peer >= 0 ? "peer " + std::to_string(peer) : "a peer";
      abort(ctx.op + " timed out");
      throw comm::PeerError(ctx,
                            ctx.op + " did not complete within " +
                                std::to_string(options.timeout.count()) + " ms (" + who +
                                " hung or left); communicator aborted",
                            peer);
    }
    if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::shared_ptr<Launch> Core::record(const OpContext& ctx) {
  auto l = std::make_shared<Launch>();
  cuda_check(cudaEventCreateWithFlags(&l->event, cudaEventDisableTiming), ctx, "cudaEventCreate");
  cuda_check(cudaEventRecord(l->event, stream), ctx, "cudaEventRecord");
  l->launched = true;
  return l;
}

void Core::flush(const OpContext& ctx) {
  if (held.empty()) return;
  std::vector<HeldP2P> ops;
  ops.swap(held);
  auto launch = std::move(held_launch);
  if (is_aborted) throw comm::AbortedError(ctx, "communicator was aborted: " + abort_reason);
  use_device(ctx);
  nccl_check(ncclGroupStart(), held_ctx, "ncclGroupStart");
  for (const HeldP2P& p : ops) {
    const int w = members[static_cast<std::size_t>(p.peer)];
    const ncclResult_t r = p.is_send ? ncclSend(p.send, p.count, p.type, p.peer, comm, stream)
                                     : ncclRecv(p.recv, p.count, p.type, p.peer, comm, stream);
    if (r != ncclSuccess && r != ncclInProgress)
      fail_in_group(r, held_ctx, p.is_send ? "ncclSend" : "ncclRecv", w);
  }
  nccl_check(ncclGroupEnd(), held_ctx, "ncclGroupEnd (point to point)");
  cuda_check(cudaEventCreateWithFlags(&launch->event, cudaEventDisableTiming), held_ctx,
             "cudaEventCreate");
  cuda_check(cudaEventRecord(launch->event, stream), held_ctx, "cudaEventRecord");
  launch->launched = true;
  Staging dropped;  // scratch of dropped p2p Works: freed after the ops now on the stream
  dropped.free_after_wait.swap(held_scratch);
  release(dropped);
}

void Core::fail_in_group(ncclResult_t r, const OpContext& ctx, const char* call, int peer) {
  (void)ncclGroupEnd();  // closes this thread's group; its result repeats r
  fail(r, ctx, call, peer);
}

void Core::check_signature(const OpContext& ctx, std::size_t count, DType t, int root, int redop) {
  if (!options.check_signatures) return;
  std::uint64_t op_hash = 1469598103934665603ULL;  // FNV-1a of the op name (unsigned: wraps)
  for (const char ch : ctx.op)
    op_hash = (op_hash ^ static_cast<unsigned char>(ch)) * 1099511628211ULL;
  constexpr std::size_t kFields = 5;
  const std::int64_t mine[kFields] = {static_cast<std::int64_t>(op_hash >> 1),
                                      static_cast<std::int64_t>(count),
                                      static_cast<std::int64_t>(t), root, redop};
  const auto p = static_cast<std::size_t>(size);
  const std::vector<std::int64_t> all =
      exchange(mine, kFields, ctx, "ncclAllGather (signature check)");
  static constexpr const char* kNames[kFields] = {"op", "count", "dtype", "root", "reduce op"};
  for (std::size_t r = 1; r < p; ++r)
    for (std::size_t f = 0; f < kFields; ++f)
      if (all[kFields * r + f] != all[f]) {
        const std::string what = std::string("collective mismatch at seq ") +
                                 std::to_string(ctx.seq) + ": ranks " + std::to_string(members[0]) +
                                 " and " + std::to_string(members[r]) + " disagree on the " +
                                 kNames[f] + " (" + std::to_string(all[f]) + " vs " +
                                 std::to_string(all[kFields * r + f]) + ")";
        abort(what);
        throw comm::MismatchError(ctx, what, {members[0], members[r]});
      }
}

std::vector<std::int64_t> Core::exchange(const std::int64_t* mine, std::size_t n,
                                         const OpContext& ctx, const char* call) {
  std::vector<std::int64_t> all(n * static_cast<std::size_t>(size));
  Staging s;
  struct Release {
    Core& core;
    Staging& staging;
    ~Release() { core.release(staging); }
  } const guard{*this, s};
  auto* d = static_cast<std::int64_t*>(scratch(all.size() * sizeof(std::int64_t), s, ctx));
  std::int64_t* slot = d + n * static_cast<std::size_t>(rank);
  cuda_check(cudaMemcpyAsync(slot, mine, n * sizeof(std::int64_t), cudaMemcpyHostToDevice, stream),
             ctx, "cudaMemcpyAsync");
  nccl_check(ncclAllGather(slot, d, n, ncclInt64, comm, stream), ctx, call);
  const auto launch = record(ctx);
  wait_event(launch->event, ctx, -1);
  cuda_check(cudaMemcpy(all.data(), d, all.size() * sizeof(std::int64_t), cudaMemcpyDeviceToHost),
             ctx, "cudaMemcpy device to host");
  return all;
}

void* Core::scratch(std::size_t bytes, Staging& s, const OpContext& ctx) {
  void* p = nullptr;
  cuda_check(cudaMallocAsync(&p, bytes == 0 ? 1 : bytes, stream), ctx, "cudaMallocAsync");
  s.free_after_wait.push_back({p, bytes});
  return p;
}

const void* Core::in(const comm::ConstBuffer& b, Staging& s, const OpContext& ctx) {
  if (b.device.kind == comm::DeviceKind::cuda) {
    if (b.device.index != device)
      throw comm::InvalidArgument(
          ctx, "buffer on cuda:" + std::to_string(b.device.index) +
                   " but this communicator is on cuda:" + std::to_string(device));
    return b.data;
  }
  void* d = scratch(b.bytes(), s, ctx);
  if (b.bytes() > 0)
    cuda_check(cudaMemcpyAsync(d, b.data, b.bytes(), cudaMemcpyHostToDevice, stream), ctx,
               "cudaMemcpyAsync host to device");
  return d;
}

void* Core::out(const comm::Buffer& b, Staging& s, const OpContext& ctx) {
  if (b.device.kind == comm::DeviceKind::cuda) {
    in(b, s, ctx);  // the device check
    return b.data;
  }
  void* d = scratch(b.bytes(), s, ctx);
  s.copy_out.push_back({b.data, d, b.bytes()});
  return d;
}

void Core::release(Staging& s) noexcept {
  if (s.free_after_wait.empty()) return;
  const DeviceGuard guard(device);
  for (const Scratch& sc : s.free_after_wait) cudaFreeAsync(sc.ptr, stream);
  s.free_after_wait.clear();
  s.copy_out.clear();
}

NcclWork::~NcclWork() {
  if (!launch_->launched && !core_->is_aborted && !staging_.free_after_wait.empty()) {
    // A p2p op still held: its scratch is freed after the flush enqueues the op, not now.
    auto& h = core_->held_scratch;
    h.insert(h.end(), staging_.free_after_wait.begin(), staging_.free_after_wait.end());
    staging_.free_after_wait.clear();
    return;
  }
  core_->release(staging_);
}

void NcclWork::wait() {
  if (done_) {
    if (error_) std::rethrow_exception(error_);
    return;
  }
  try {
    if (!launch_->launched) core_->flush(ctx_);
    core_->wait_event(launch_->event, ctx_, peer_);
    for (const CopyOut& c : staging_.copy_out)
      if (c.bytes > 0)
        cuda_check(cudaMemcpy(c.host, c.dev, c.bytes, cudaMemcpyDeviceToHost), ctx_,
                   "cudaMemcpy device to host");
    core_->release(staging_);
    done_ = true;
  } catch (...) {
    error_ = std::current_exception();
    done_ = true;
    throw;
  }
}

bool NcclWork::is_completed() {
  if (done_) return true;
  if (!launch_->launched) {
    try {
      core_->flush(ctx_);
    } catch (...) {
      return true;  // wait() will throw
    }
  }
  return core_->poll_event(launch_->event);
}

}  // namespace shardcheck::gpu::detail
