// The backends `run` and `bench collectives` can use besides the simulator: what this build has
// and, for the NCCL backend (gpu/, cuda preset only), its rank runner and this process's place in
// an mpirun job. Every gpu/ dependency of the harness goes through here (backend.cpp), so the rest
// of harness/ compiles the same with and without it.
#pragma once

#include <functional>
#include <string>

#include "comm/communicator.hpp"

namespace shardcheck::harness {

// True when this shardcheck was built with the gpu/ backend (SHARDCHECK_HAVE_NCCL).
bool nccl_built();

// Why `--backend nccl` cannot run here, or "" when it can: not built, or no CUDA device visible
// (the CUDA error). Cheap; starts no MPI.
std::string nccl_unavailable();

// Where this process sits: under mpirun/srun (with the MPI bootstrap built) one NCCL rank per
// process, MPI initialised on first use; otherwise one process holding every rank as threads.
struct NcclPlace {
  bool mpi = false;  // one rank per process
  int rank = 0;      // this process's world rank (0 without MPI)
  int capacity = 0;  // ranks a run can have: the MPI world size, or the visible GPUs
};
NcclPlace nccl_place();

// Runs fn on `ranks` NCCL ranks (gpu::run_nccl_ranks): under MPI this process's one rank (ranks
// must equal the MPI world size), otherwise one thread per GPU. Throws what the ranks threw
// (gpu::RankFailure in one process) or std::runtime_error when not built.
void run_nccl(int ranks, const std::function<void(comm::Communicator&)>& fn);

}  // namespace shardcheck::harness
