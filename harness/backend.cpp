// The NCCL backend seen from the harness: the only file of harness/ that includes gpu/.
#include "harness/backend.hpp"

#include <stdexcept>

#ifdef SHARDCHECK_HAVE_NCCL
#include "gpu/bootstrap.hpp"
#include "gpu/device.hpp"
#ifdef SHARDCHECK_HAVE_NCCL_MPI
#include "gpu/mpi_bootstrap.hpp"
#endif
#endif

namespace shardcheck::harness {

#ifdef SHARDCHECK_HAVE_NCCL

bool nccl_built() {
  return true;
}

std::string nccl_unavailable() {
  const gpu::DeviceInfo d = gpu::probe();
  if (d.count > 0) return "";
  return "no CUDA device is visible" + (d.why_none.empty() ? "" : " (" + d.why_none + ")") +
         "; the NCCL backend needs at least one GPU";
}

NcclPlace nccl_place() {
  NcclPlace p;
#ifdef SHARDCHECK_HAVE_NCCL_MPI
  if (gpu::launched_by_mpi()) {
    // MPI_Finalize at exit, after every communicator of run_nccl is gone.
    static const gpu::MpiSession session(nullptr, nullptr);
    p.mpi = true;
    p.rank = session.place().rank;
    p.capacity = session.place().size;
    return p;
  }
#endif
  p.capacity = gpu::visible_devices();
  return p;
}

void run_nccl(int ranks, const std::function<void(comm::Communicator&)>& fn) {
#ifdef SHARDCHECK_HAVE_NCCL_MPI
  gpu::run_nccl_ranks(ranks, fn);
#else
  gpu::run_all_gpus(ranks, [&fn](gpu::NcclCommunicator& c) { fn(c); });
#endif
}

#else

namespace {
constexpr const char* kNotBuilt =
    "built without the NCCL backend: configure with the cuda preset (cmake --preset cuda) on a "
    "machine with CUDA and NCCL";
}  // namespace

bool nccl_built() {
  return false;
}
std::string nccl_unavailable() {
  return kNotBuilt;
}
NcclPlace nccl_place() {
  return {};
}
void run_nccl(int /*ranks*/, const std::function<void(comm::Communicator&)>& /*fn*/) {
  throw std::runtime_error(kNotBuilt);
}

#endif

}  // namespace shardcheck::harness
