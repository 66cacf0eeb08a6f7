// Communicator creation: from an ncclUniqueId (one process per GPU), or all visible GPUs in one
// process (one NCCL group of ncclCommInitRankConfig, then one thread per GPU).
#include "gpu/bootstrap.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "comm/errors.hpp"
#include "gpu/nccl_core.hpp"

namespace shardcheck::gpu {

namespace {

[[noreturn]] void nccl_fail(const char* call, ncclResult_t r, int rank) {
  throw comm::CommError({rank, "world", "init", 0},
                        std::string(call) + ": " + ncclGetErrorString(r));
}

void cuda_ok(cudaError_t e, const char* call, int rank) {
  if (e != cudaSuccess)
    throw comm::CommError({rank, "world", "init", 0},
                          std::string(call) + ": " + cudaGetErrorString(e));
}

ncclConfig_t nonblocking() {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  return cfg;
}

}  // namespace

int visible_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

std::vector<char> new_unique_id() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) nccl_fail("ncclGetUniqueId", r, 0);
  return {id.internal, id.internal + NCCL_UNIQUE_ID_BYTES};
}

std::unique_ptr<NcclCommunicator> init_rank(const std::vector<char>& unique_id, int nranks,
                                            int rank, int device, NcclOptions options,
                                            std::string name) {
  if (unique_id.size() != NCCL_UNIQUE_ID_BYTES)
    throw comm::InvalidArgument({rank, name, "init", 0}, "ncclUniqueId has the wrong size");
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  cuda_ok(cudaSetDevice(device), "cudaSetDevice", rank);
  ncclConfig_t cfg = nonblocking();
  ncclComm_t c = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&c, nranks, id, rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) nccl_fail("ncclCommInitRankConfig", r, rank);
  detail::settle_comm(c, {rank, "world", "init", 0}, "ncclCommInitRankConfig", options.timeout);
  return std::make_unique<NcclCommunicator>(c, device, std::move(name), std::vector<int>{}, nullptr,
                                            options);
}

void run_all_gpus(int n, const std::function<void(NcclCommunicator&)>& fn, NcclOptions options) {
  const int have = visible_devices();
  if (n <= 0) n = have;
  if (n <= 0 || n > have)
    throw std::runtime_error("run_all_gpus: " + std::to_string(n) + " ranks asked, " +
                             std::to_string(have) + " CUDA devices visible");
  // One NCCL group creates every device's communicator (ncclCommInitAll, with a config).
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) nccl_fail("ncclGetUniqueId", r, 0);
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(n), nullptr);
  ncclConfig_t cfg = nonblocking();
  r = ncclGroupStart();
  if (r != ncclSuccess) nccl_fail("ncclGroupStart", r, 0);
  for (int i = 0; i < n; ++i) {
    cuda_ok(cudaSetDevice(i), "cudaSetDevice", i);
    r = ncclCommInitRankConfig(&comms[static_cast<std::size_t>(i)], n, id, i, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) nccl_fail("ncclCommInitRankConfig", r, i);
  }
  r = ncclGroupEnd();
  if (r != ncclSuccess && r != ncclInProgress) nccl_fail("ncclGroupEnd (init)", r, 0);
  for (int i = 0; i < n; ++i)
    detail::settle_comm(comms[static_cast<std::size_t>(i)], {i, "world", "init", 0},
                        "ncclCommInitRankConfig", options.timeout);

  auto cancel = std::make_shared<std::atomic<bool>>(false);
  std::mutex mu;
  int first_rank = -1;
  std::exception_ptr first;
  std::string first_what;
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      try {
        NcclCommunicator comm(comms[static_cast<std::size_t>(i)], i, "world", {}, nullptr, options,
                              cancel);
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
          if (consequence) first_what.clear();
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
    });
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
