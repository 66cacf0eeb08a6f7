// MPI bootstrap: the ncclUniqueId travels by MPI_Bcast; the device is the node-local rank.
// Only the C API of MPI is used (the C++ bindings' header warns under -Wextra).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include "gpu/mpi_bootstrap.hpp"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/bootstrap.hpp"

namespace shardcheck::gpu {

namespace {
void mpi_ok(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string(call) + ": " +
                           std::string(msg, static_cast<std::size_t>(len)));
}
}  // namespace

MpiPlace mpi_place() {
  MpiPlace p;
  mpi_ok(MPI_Comm_rank(MPI_COMM_WORLD, &p.rank), "MPI_Comm_rank");
  mpi_ok(MPI_Comm_size(MPI_COMM_WORLD, &p.size), "MPI_Comm_size");
  MPI_Comm node = MPI_COMM_NULL;
  mpi_ok(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, p.rank, MPI_INFO_NULL, &node),
         "MPI_Comm_split_type");
  mpi_ok(MPI_Comm_rank(node, &p.local_rank), "MPI_Comm_rank (node)");
  mpi_ok(MPI_Comm_size(node, &p.local_size), "MPI_Comm_size (node)");
  MPI_Comm_free(&node);
  p.device = p.local_rank;
  return p;
}

MpiSession::MpiSession(int* argc, char*** argv) {
  int inited = 0;
  mpi_ok(MPI_Initialized(&inited), "MPI_Initialized");
  if (inited == 0) {
    mpi_ok(MPI_Init(argc, argv), "MPI_Init");
    owns_ = true;
  }
  place_ = mpi_place();
}

MpiSession::~MpiSession() {
  if (owns_) MPI_Finalize();
}

std::unique_ptr<NcclCommunicator> init_from_mpi(NcclOptions options) {
  const MpiPlace p = mpi_place();
  const int devices = visible_devices();
  if (p.local_rank >= devices)
    throw std::runtime_error("rank " + std::to_string(p.rank) + ": node-local rank " +
                             std::to_string(p.local_rank) + " but only " + std::to_string(devices) +
                             " CUDA devices are visible (one process per GPU)");
  std::vector<char> id(128);
  if (p.rank == 0) id = new_unique_id();
  id.resize(128);
  mpi_ok(MPI_Bcast(id.data(), static_cast<int>(id.size()), MPI_BYTE, 0, MPI_COMM_WORLD),
         "MPI_Bcast (ncclUniqueId)");
  return init_rank(id, p.size, p.rank, p.device, options);
}

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr ||
         std::getenv("PMI_SIZE") != nullptr;
}

void abort_job(int code, const std::string& why) {
  std::fprintf(stderr, "shardcheck: %s; aborting the MPI job\n", why.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort does not return; should it, end this process at least
}

void run_nccl_ranks(int ranks, const std::function<void(comm::Communicator&)>& fn,
                    NcclOptions options, int abort_code) {
  if (!launched_by_mpi()) {
    run_all_gpus(
        ranks, [&fn](NcclCommunicator& c) { fn(c); }, options);
    return;
  }
  int inited = 0;
  mpi_ok(MPI_Initialized(&inited), "MPI_Initialized");
  if (inited == 0) {
    mpi_ok(MPI_Init(nullptr, nullptr), "MPI_Init");
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized == 0) MPI_Finalize();
    });
  }
  const MpiPlace p = mpi_place();
  if (ranks != 0 && ranks != p.size)  // the same on every process: each throws, none waits
    throw std::runtime_error("--ranks " + std::to_string(ranks) + " but mpirun started " +
                             std::to_string(p.size) + " processes (one rank per process)");
  // A rank that fails here alone leaves its peers blocked in NCCL (init or a collective) until
  // their timeout: with peers, end the job now, naming the rank and the error.
  const auto fail = [&](const std::string& what) {
    if (p.size > 1)
      abort_job(abort_code, "rank " + std::to_string(p.rank) + " of " + std::to_string(p.size) +
                                " failed: " + what);
  };
  std::unique_ptr<NcclCommunicator> comm;
  try {
    comm = init_from_mpi(options);
    fn(*comm);
  } catch (const std::exception& e) {
    fail(e.what());
    throw;
  } catch (...) {
    fail("unknown exception");
    throw;
  }
}

}  // namespace shardcheck::gpu
