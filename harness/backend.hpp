// The backends `run` and `bench collectives` can use besides the simulator: what this build has
// and, for the NCCL backend (gpu/, cuda preset only), its rank runner and this process's place in
// an mpirun job. Every gpu/ dependency of the harness goes through here (backend.cpp), so the rest
// of harness/ compiles the same with and without it.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "reference/compute.hpp"

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
  int device = 0;    // under MPI: this process's GPU (node-local rank modulo its visible GPUs)
};
NcclPlace nccl_place();

// Runs fn on `ranks` NCCL ranks (gpu::run_nccl_ranks): under MPI this process's one rank (ranks
// must equal the MPI world size), otherwise one thread per GPU. Throws what the ranks threw
// (gpu::RankFailure in one process: the failing rank aborts the others' communicators) or
// std::runtime_error when not built. Under MPI with several processes a failing rank ends the job
// at once (gpu::abort_job: its diagnosis on stderr, exit status 3).
void run_nccl(int ranks, const std::function<void(comm::Communicator&)>& fn);

// `--compute cuda`: the strategies' ranks run the reference ops on GPUs (gpu::DeviceCompute:
// cuBLAS GEMMs and CUDA kernels). Why it cannot run here, or "" when it can: built without the
// GPU compute, or no CUDA device visible.
std::string cuda_compute_unavailable();

// The rank -> Compute factory of `--compute cuda` (harness::ComputeFactory). On the simulator
// (nccl = false) rank r computes on GPU r % visible GPUs; on the nccl backend each rank on its own
// device (one process over all GPUs: device = rank; under mpirun: this process's device). Throws
// std::runtime_error when cuda_compute_unavailable() is not "".
std::function<std::unique_ptr<ref::Compute>(int rank)> cuda_compute(bool nccl);

}  // namespace shardcheck::harness
