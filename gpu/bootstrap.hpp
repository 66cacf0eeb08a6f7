// Creating NCCL communicators. Two launches:
//   - one process per GPU under mpirun/srun: init_from_mpi() (gpu/mpi_bootstrap.hpp, built where
//     MPI is found): rank 0 creates the ncclUniqueId and broadcasts it with MPI_Bcast; each
//     process takes device local_rank % visible devices (device_for_local_rank).
//   - one process over all visible GPUs: run_all_gpus() creates one communicator per device in one
//     NCCL group and runs a function on one thread per GPU (world rank r = device r).
// Both make non-blocking communicators (see nccl_communicator.hpp for the timeout and abort).
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gpu/nccl_communicator.hpp"

namespace shardcheck::gpu {

// A rank's function failed in run_all_gpus: the first failure (the root cause; the others fail
// with AbortedError because the failing rank cancels the run).
class RankFailure : public std::runtime_error {
 public:
  RankFailure(int rank, const std::string& what, std::exception_ptr cause)
      : std::runtime_error("rank " + std::to_string(rank) + ": " + what),
        rank_(rank),
        cause_(std::move(cause)) {}
  int rank() const { return rank_; }
  const std::exception_ptr& cause() const { return cause_; }

 private:
  int rank_;
  std::exception_ptr cause_;
};

// Visible CUDA devices (0 without a driver or device).
int visible_devices();

// The CUDA device of a process that is `local_rank` among the processes of its node and sees
// `visible` devices: local_rank % visible. Every process seeing all of the node's GPUs (plain
// mpirun) gives device = local rank; a launcher giving each process its own GPU (srun
// --gpus-per-task=1, a wrapper setting CUDA_VISIBLE_DEVICES per process) gives device 0, its own.
// Two processes may land on one GPU (more processes than GPUs): shared_device() finds them.
// Throws std::runtime_error naming both numbers when visible <= 0 or local_rank < 0.
int device_for_local_rank(int local_rank, int visible);

// The first two entries (i < j) of `device_ids` (one per process of a node, e.g. PCI bus ids;
// empty = unknown, never equal) that name the same device, or {-1, -1}. NCCL refuses a
// communicator with one GPU twice.
std::pair<int, int> shared_device(const std::vector<std::string>& device_ids);

// The PCI bus id of CUDA device `device` ("0000:3b:00.0"), which identifies a GPU across
// processes whatever CUDA_VISIBLE_DEVICES each has. Throws std::runtime_error on a CUDA error.
std::string device_bus_id(int device);

// Creates a non-blocking communicator of `nranks` ranks from an ncclUniqueId (ncclUniqueId bytes,
// NCCL_UNIQUE_ID_BYTES long), on `device`, with this process's world rank `rank`. Collective
// over all ranks. Sets the device current.
std::unique_ptr<NcclCommunicator> init_rank(const std::vector<char>& unique_id, int nranks,
                                            int rank, int device, NcclOptions options = {},
                                            std::string name = "world");
// A fresh ncclUniqueId (ncclGetUniqueId), as bytes.
std::vector<char> new_unique_id();

// Runs fn(comm) on `n` threads, thread r on device r with world rank r (n <= visible devices;
// n <= 0 means all). Returns when every thread is done; throws RankFailure for the first failure,
// after the others were cancelled. Throws std::runtime_error when there are fewer devices.
void run_all_gpus(int n, const std::function<void(NcclCommunicator&)>& fn,
                  NcclOptions options = {});

}  // namespace shardcheck::gpu
