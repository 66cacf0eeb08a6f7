// Communicator creation: from an ncclUniqueId (one process per GPU), or all visible GPUs in one
// process (one NCCL group of ncclCommInitRankConfig, then one thread per GPU).
#include "gpu/bootstrap.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include "comm/errors.hpp"
#include "gpu/nccl_core.hpp"

namespace shardcheck::gpu {

namespace {

// The NCCL error text and NCCL's last warning (read before anything else calls NCCL).
std::string nccl_text(ncclResult_t r, ncclComm_t c = nullptr) {
  std::string s = ncclGetErrorString(r);
  const char* last = ncclGetLastError(c);
  if (last != nullptr && last[0] != '\0') s += std::string(" (") + last + ")";
  return s;
}

[[noreturn]] void nccl_fail(const char* call, ncclResult_t r, const comm::OpContext& ctx) {
  throw comm::CommError(ctx, std::string(call) + ": " + nccl_text(r));
}

void cuda_ok(cudaError_t e, const char* call, const comm::OpContext& ctx,
             const std::string& where = "") {
  if (e != cudaSuccess)
    throw comm::CommError(ctx, std::string(call) + where + ": " + cudaGetErrorString(e));
}

comm::OpContext init_ctx(int rank, const std::string& group = "world") {
  return {rank, group, "init", 0};
}

std::string device_rank(int device, int rank, int nranks) {
  return " (device " + std::to_string(device) + ", rank " + std::to_string(rank) + " of " +
         std::to_string(nranks) + ")";
}

ncclConfig_t nonblocking() {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  return cfg;
}

// The communicators run_all_gpus created and has not handed to a rank's thread yet: aborted when
// this goes out of scope (a failed init, a thread that could not start).
class PendingComms {
 public:
  explicit PendingComms(int n) : comms_(static_cast<std::size_t>(n), nullptr) {}
  ~PendingComms() { abort_all(); }
  PendingComms(const PendingComms&) = delete;
  PendingComms& operator=(const PendingComms&) = delete;

  ncclComm_t& at(int i) { return comms_[static_cast<std::size_t>(i)]; }
  int size() const { return static_cast<int>(comms_.size()); }
  // Hands communicator i to its owner (the rank's thread; distinct elements, so no lock).
  ncclComm_t release(int i) { return std::exchange(at(i), nullptr); }
  void abort_all() noexcept {
    for (ncclComm_t& c : comms_)
      if (c != nullptr) ncclCommAbort(std::exchange(c, nullptr));
  }

 private:
  std::vector<ncclComm_t> comms_;
};

// Polls every communicator of one non-blocking init group until all are ready. Any one failing
// (its peers would wait for it until the timeout), or the timeout passing, aborts them all and
// throws naming the device and rank.
void settle_all(PendingComms& comms, std::chrono::milliseconds timeout) {
  const int n = comms.size();
  std::vector<bool> ready(static_cast<std::size_t>(n), false);
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    std::string waiting;
    int first_waiting = -1;
    for (int i = 0; i < n; ++i) {
      if (ready[static_cast<std::size_t>(i)]) continue;
      ncclResult_t a = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(comms.at(i), &a);
      if (q != ncclSuccess) a = q;
      if (a == ncclSuccess) {
        ready[static_cast<std::size_t>(i)] = true;
        continue;
      }
      if (a != ncclInProgress) {
        const std::string msg = nccl_text(a, comms.at(i));
        comms.abort_all();
        throw comm::CommError(init_ctx(i), "ncclCommInitRankConfig" + device_rank(i, i, n) + ": " +
                                               msg + "; every device's communicator was aborted");
      }
      if (first_waiting < 0) first_waiting = i;
      waiting += (waiting.empty() ? "" : ", ") + std::to_string(i);
    }
    if (first_waiting < 0) return;
    if (std::chrono::steady_clock::now() - start > timeout) {
      comms.abort_all();
      throw comm::PeerError(init_ctx(first_waiting),
                            "ncclCommInitRankConfig timed out; ranks not ready: " + waiting +
                                "; every device's communicator was aborted",
                            -1);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace

int visible_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // a failed probe must not be reported by a later launch check
    return 0;
  }
  return n;
}

int device_for_local_rank(int local_rank, int visible) {
  if (visible <= 0 || local_rank < 0)
    throw std::runtime_error("node-local rank " + std::to_string(local_rank) + " sees " +
                             std::to_string(visible) +
                             " CUDA devices: it needs at least one (one GPU per process)");
  return local_rank % visible;
}

std::pair<int, int> shared_device(const std::vector<std::string>& device_ids) {
  for (std::size_t j = 1; j < device_ids.size(); ++j) {
    if (device_ids[j].empty()) continue;
    for (std::size_t i = 0; i < j; ++i)
      if (device_ids[i] == device_ids[j]) return {static_cast<int>(i), static_cast<int>(j)};
  }
  return {-1, -1};
}

std::string device_bus_id(int device) {
  char id[64] = {};
  const cudaError_t e = cudaDeviceGetPCIBusId(id, static_cast<int>(sizeof id), device);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error("cudaDeviceGetPCIBusId (device " + std::to_string(device) +
                             "): " + cudaGetErrorString(e));
  }
  return id;
}

std::vector<char> new_unique_id() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) nccl_fail("ncclGetUniqueId", r, init_ctx(0));
  return {id.internal, id.internal + NCCL_UNIQUE_ID_BYTES};
}

std::unique_ptr<NcclCommunicator> init_rank(const std::vector<char>& unique_id, int nranks,
                                            int rank, int device, NcclOptions options,
                                            std::string name) {
  const comm::OpContext ctx = init_ctx(rank, name);
  const std::string where = device_rank(device, rank, nranks);
  if (unique_id.size() != NCCL_UNIQUE_ID_BYTES)
    throw comm::InvalidArgument(ctx, "ncclUniqueId has " + std::to_string(unique_id.size()) +
                                         " bytes, not " + std::to_string(NCCL_UNIQUE_ID_BYTES));
  if (nranks < 1 || rank < 0 || rank >= nranks || device < 0)
    throw comm::InvalidArgument(ctx, "init_rank" + where + ": bad rank, size or device");
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  cuda_ok(cudaSetDevice(device), "cudaSetDevice", ctx, where);
  ncclConfig_t cfg = nonblocking();
  ncclComm_t c = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&c, nranks, id, rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    const std::string msg = nccl_text(r, c);
    if (c != nullptr) ncclCommAbort(c);  // a non-blocking init may have created the handle
    throw comm::CommError(ctx, "ncclCommInitRankConfig" + where + ": " + msg);
  }
  // Aborts c itself on an error or the timeout.
  detail::settle_comm(c, ctx, "ncclCommInitRankConfig", options.timeout);
  // From here the communicator's core owns c (a throwing constructor finalizes it).
  return std::make_unique<NcclCommunicator>(c, device, std::move(name), std::vector<int>{}, nullptr,
                                            options);
}

void run_all_gpus(int n, const std::function<void(NcclCommunicator&)>& fn, NcclOptions options) {
  const int have = visible_devices();
  if (n <= 0) n = have;
  if (n <= 0 || n > have)
    throw std::runtime_error("run_all_gpus: " + std::to_string(n) + " ranks asked, " +
                             std::to_string(have) + " CUDA devices visible");
  // The init loop moves this thread's current device; it comes back on every return and throw.
  const detail::DeviceGuard restore_device(0);
  // One NCCL group creates every device's communicator (ncclCommInitAll, with a config).
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) nccl_fail("ncclGetUniqueId", r, init_ctx(0));
  PendingComms comms(n);  // declared before the group: aborted only after it is closed
  ncclConfig_t cfg = nonblocking();
  r = ncclGroupStart();
  if (r != ncclSuccess) nccl_fail("ncclGroupStart (init)", r, init_ctx(0));
  try {
    for (int i = 0; i < n; ++i) {
      cuda_ok(cudaSetDevice(i), "cudaSetDevice", init_ctx(i), device_rank(i, i, n));
      r = ncclCommInitRankConfig(&comms.at(i), n, id, i, &cfg);
      if (r != ncclSuccess && r != ncclInProgress) {
        const std::string msg = nccl_text(r, comms.at(i));
        throw comm::CommError(init_ctx(i),
                              "ncclCommInitRankConfig" + device_rank(i, i, n) + ": " + msg);
      }
    }
  } catch (...) {
    // Close this thread's NCCL group (it would capture every later NCCL call on the thread);
    // its result is this failure again. Then abort what the group created.
    ncclGroupEnd();
    comms.abort_all();
    throw;
  }
  r = ncclGroupEnd();
  if (r != ncclSuccess && r != ncclInProgress) {
    const std::string msg = nccl_text(r);
    comms.abort_all();
    throw comm::CommError(init_ctx(0),
                          "ncclGroupEnd (init of " + std::to_string(n) + " devices): " + msg);
  }
  settle_all(comms, options.timeout);

  auto cancel = std::make_shared<std::atomic<bool>>(false);
  std::mutex mu;
  int first_rank = -1;
  std::exception_ptr first;
  std::string first_what;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  const auto rank_main = [&](int i) {
    try {
      // The communicator's core owns the handle from here (the constructor binds device i to
      // this thread; a throwing constructor finalizes the handle).
      NcclCommunicator comm(comms.release(i), i, "world", {}, nullptr, options, cancel);
      try {
        fn(comm);
      } catch (...) {
        comm.abort("rank " + std::to_string(i) + " failed");
        throw;
      }
    } catch (const std::exception& e) {
      cancel->store(true);
      const std::lock_guard<std::mutex> lock(mu);
      // The root cause is the first failure that is not a consequence of the cancel.
      const bool consequence = dynamic_cast<const comm::AbortedError*>(&e) != nullptr;
      if (!first || (first_what.empty() && !consequence)) {
        first = std::current_exception();
        first_rank = i;
        first_what = consequence ? "" : e.what();
      }
    } catch (...) {
      cancel->store(true);
      const std::lock_guard<std::mutex> lock(mu);
      if (!first) {
        first = std::current_exception();
        first_rank = i;
        first_what = "unknown exception";
      }
    }
  };
  try {
    for (int i = 0; i < n; ++i) threads.emplace_back(rank_main, i);
  } catch (...) {
    // A thread that cannot start: cancel the started ranks (they would wait for it in NCCL), join
    // them; the communicators of the ranks never started are aborted by comms' destructor.
    cancel->store(true);
    for (std::thread& t : threads) t.join();
    throw;
  }
  for (std::thread& t : threads) t.join();
  if (first) {
    std::string what = first_what;
    try {
      std::rethrow_exception(first);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    throw RankFailure(first_rank, what, first);
  }
}

}  // namespace shardcheck::gpu
