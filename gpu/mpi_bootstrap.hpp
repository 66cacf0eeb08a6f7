// One process per GPU under mpirun (or srun with PMIx): MPI carries the ncclUniqueId, NCCL the
// data. Built into shardcheck_gpu_mpi where MPI is found.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "gpu/nccl_communicator.hpp"

namespace shardcheck::gpu {

// Where this process sits in the MPI job.
struct MpiPlace {
  int rank = 0;             // MPI_COMM_WORLD rank = NCCL world rank
  int size = 1;             // MPI_COMM_WORLD size
  int local_rank = 0;       // rank among the processes of this node (MPI_COMM_TYPE_SHARED)
  int local_size = 1;       // processes on this node
  int visible_devices = 0;  // CUDA devices this process sees
  // CUDA device this process uses: device_for_local_rank(local_rank, visible_devices), that is
  // local_rank % visible_devices (the local rank where each process sees all of the node's GPUs,
  // 0 where the launcher gives each process its own, e.g. srun --gpus-per-task=1); -1 when no
  // device is visible.
  int device = -1;
};

// MPI_Init on construction (unless already initialised), MPI_Finalize on destruction (unless
// finalised already). Destroy every NcclCommunicator made under it first.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  const MpiPlace& place() const { return place_; }

 private:
  bool owns_ = false;
  MpiPlace place_;
};

// Collective over MPI_COMM_WORLD: rank 0 calls ncclGetUniqueId and MPI_Bcasts it; every rank
// selects device local_rank % visible devices (MpiPlace::device) and creates its NCCL rank. MPI
// must be initialised (MpiSession).
// Failures: the checks before NCCL (a process that sees no device, two processes of a node on one
// GPU, rank 0 failing to make the id) are agreed over MPI, so every rank throws the same
// std::runtime_error ("rank r: ...") and none is left waiting. A failure in NCCL's init on one rank
// (it throws comm::CommError) leaves its peers in theirs until NcclOptions::timeout (then they
// throw comm::PeerError); likewise a failure later, in the caller's code. So with more than one
// process a caller should end the job on any exception (abort_job), as run_nccl_ranks and
// bench_nccl_collectives do; this function never aborts the job itself.
std::unique_ptr<NcclCommunicator> init_from_mpi(NcclOptions options = {});

// The place of this process (MPI must be initialised).
MpiPlace mpi_place();

// True when this process was started by mpirun or srun (OMPI_COMM_WORLD_SIZE, PMIX_RANK or
// PMI_SIZE in the environment).
bool launched_by_mpi();

// The backend-neutral entry the harness uses (a harness::RankRunner): runs fn on this process's
// NCCL ranks and returns when they are done. Under mpirun/srun: one rank, this process's, with the
// MPI bootstrap (MPI is initialised on first use and finalised at exit); `ranks` must be 0 or the
// MPI world size. Otherwise: `ranks` threads over the visible GPUs (run_all_gpus; 0 = all).
// Failures rethrow as in run_all_gpus (RankFailure). Under MPI with more than one process, a rank
// whose bootstrap or fn throws cannot tell its peers (they would wait in NCCL until the timeout):
// it prints its diagnosis and ends the job with abort_job(abort_code); with one process the
// rank's own exception is rethrown.
void run_nccl_ranks(int ranks, const std::function<void(comm::Communicator&)>& fn,
                    NcclOptions options = {}, int abort_code = 3);

// Ends every process of the MPI job now: prints "shardcheck: <why>; aborting the MPI job" to
// stderr and calls MPI_Abort(MPI_COMM_WORLD, code) (mpirun then exits with `code`). MPI must be
// initialised.
[[noreturn]] void abort_job(int code, const std::string& why);

}  // namespace shardcheck::gpu
