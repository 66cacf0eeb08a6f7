// MPI bootstrap: the ncclUniqueId travels by MPI_Bcast; the device is the node-local rank modulo
// the devices this process sees.
// Only the C API of MPI is used (the C++ bindings' header warns under -Wextra).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include "gpu/mpi_bootstrap.hpp"

#include <mpi.h>
#include <nccl.h>

#include <climits>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/bootstrap.hpp"

namespace shardcheck::gpu {

static_assert(sizeof(ncclUniqueId) == NCCL_UNIQUE_ID_BYTES,
              "the ncclUniqueId is broadcast as NCCL_UNIQUE_ID_BYTES bytes");

namespace {

void mpi_ok(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string(call) + ": " +
                           std::string(msg, static_cast<std::size_t>(len)));
}

// The processes of this node (MPI_COMM_TYPE_SHARED), freed on scope exit.
class NodeComm {
 public:
  explicit NodeComm(int world_rank) {
    mpi_ok(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL,
                               &comm_),
           "MPI_Comm_split_type");
  }
  ~NodeComm() {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  NodeComm(const NodeComm&) = delete;
  NodeComm& operator=(const NodeComm&) = delete;
  MPI_Comm get() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// Collective over MPI_COMM_WORLD: when any rank has an error, every rank throws the error of the
// lowest such rank (a rank throwing alone would leave its peers waiting in MPI forever).
void agree(int rank, const std::string& local_error) {
  int mine = local_error.empty() ? INT_MAX : rank;
  int first = INT_MAX;
  mpi_ok(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce");
  if (first == INT_MAX) return;
  std::string msg = local_error;
  int len = static_cast<int>(msg.size());
  mpi_ok(MPI_Bcast(&len, 1, MPI_INT, first, MPI_COMM_WORLD), "MPI_Bcast (error length)");
  msg.resize(static_cast<std::size_t>(len));
  mpi_ok(MPI_Bcast(msg.data(), len, MPI_CHAR, first, MPI_COMM_WORLD), "MPI_Bcast (error)");
  throw std::runtime_error("rank " + std::to_string(first) + ": " + msg);
}

}  // namespace

MpiPlace mpi_place() {
  MpiPlace p;
  mpi_ok(MPI_Comm_rank(MPI_COMM_WORLD, &p.rank), "MPI_Comm_rank");
  mpi_ok(MPI_Comm_size(MPI_COMM_WORLD, &p.size), "MPI_Comm_size");
  const NodeComm node(p.rank);
  mpi_ok(MPI_Comm_rank(node.get(), &p.local_rank), "MPI_Comm_rank (node)");
  mpi_ok(MPI_Comm_size(node.get(), &p.local_size), "MPI_Comm_size (node)");
  p.visible_devices = visible_devices();
  p.device = p.visible_devices > 0 ? device_for_local_rank(p.local_rank, p.visible_devices) : -1;
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
  int finalized = 0;
  // Another owner (run_nccl_ranks' exit handler) may have finalised already: twice is an error.
  if (owns_ && MPI_Finalized(&finalized) == MPI_SUCCESS && finalized == 0) MPI_Finalize();
}

std::unique_ptr<NcclCommunicator> init_from_mpi(NcclOptions options) {
  const MpiPlace p = mpi_place();
  // Every check before NCCL is agreed by all ranks, so they all throw the same error together.
  std::string error;
  std::string bus_id;
  try {
    device_for_local_rank(p.local_rank, p.visible_devices);  // throws naming both numbers
    bus_id = device_bus_id(p.device);
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Two processes of this node on one GPU (more processes than GPUs on a node where each sees
  // them all): NCCL would refuse the communicator later; name both ranks now.
  {
    const NodeComm node(p.rank);
    constexpr int kIdChars = 64;
    std::vector<char> mine(kIdChars, '\0');
    bus_id.copy(mine.data(), kIdChars - 1);
    std::vector<char> all(static_cast<std::size_t>(kIdChars) *
                          static_cast<std::size_t>(p.local_size));
    mpi_ok(
        MPI_Allgather(mine.data(), kIdChars, MPI_CHAR, all.data(), kIdChars, MPI_CHAR, node.get()),
        "MPI_Allgather (bus ids)");
    std::vector<int> world(static_cast<std::size_t>(p.local_size));
    mpi_ok(MPI_Allgather(&p.rank, 1, MPI_INT, world.data(), 1, MPI_INT, node.get()),
           "MPI_Allgather (ranks)");
    std::vector<std::string> ids;
    for (int i = 0; i < p.local_size; ++i)
      ids.emplace_back(all.data() + static_cast<std::ptrdiff_t>(i) * kIdChars);
    const auto [a, b] = shared_device(ids);
    if (error.empty() && a >= 0)
      error = "ranks " + std::to_string(world[static_cast<std::size_t>(a)]) + " and " +
              std::to_string(world[static_cast<std::size_t>(b)]) + " (node-local " +
              std::to_string(a) + " and " + std::to_string(b) + " of " +
              std::to_string(p.local_size) + ") would share GPU " +
              ids[static_cast<std::size_t>(a)] + " (rank " + std::to_string(p.rank) + " sees " +
              std::to_string(p.visible_devices) +
              " CUDA devices): start one process per GPU of the node";
  }
  agree(p.rank, error);
  std::vector<char> id(NCCL_UNIQUE_ID_BYTES, '\0');
  if (p.rank == 0) {
    try {
      id = new_unique_id();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree(p.rank, error);
  mpi_ok(MPI_Bcast(id.data(), NCCL_UNIQUE_ID_BYTES, MPI_BYTE, 0, MPI_COMM_WORLD),
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
