// The NCCL backend and the GPU compute seen from the harness: the only file of harness/ that
// includes gpu/.
#include "harness/backend.hpp"

#include <stdexcept>

#ifdef SHARDCHECK_HAVE_NCCL
#include "gpu/bootstrap.hpp"
#include "gpu/device.hpp"
#ifdef SHARDCHECK_HAVE_NCCL_MPI
#include "gpu/mpi_bootstrap.hpp"
#endif
#ifdef SHARDCHECK_HAVE_GPU_COMPUTE
#include "gpu/device_compute.hpp"
#endif
#endif

namespace shardcheck::harness {

#ifdef SHARDCHECK_HAVE_NCCL

namespace {
// "" with a visible device; otherwise why there is none and `what` needs at least one.
std::string no_device(const std::string& what, const std::string& then = "") {
  const gpu::DeviceInfo d = gpu::probe();
  if (d.count > 0) return "";
  return "no CUDA device is visible" + (d.why_none.empty() ? "" : " (" + d.why_none + ")") + "; " +
         what + " needs at least one GPU" + then;
}
}  // namespace

bool nccl_built() {
  return true;
}

std::string nccl_unavailable() {
  return no_device("the NCCL backend");
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
    p.device = session.place().device;
    return p;
  }
#endif
  p.capacity = gpu::visible_devices();
  return p;
}

void run_nccl(int ranks, const std::function<void(comm::Communicator&)>& fn) {
#ifdef SHARDCHECK_HAVE_NCCL_MPI
  // Under mpirun a rank that fails ends the whole job at once (its diagnosis on stderr, exit
  // status 3: the run broke) rather than leaving its peers in NCCL until their timeout.
  gpu::run_nccl_ranks(ranks, fn, {}, 3);
#else
  gpu::run_all_gpus(ranks, [&fn](gpu::NcclCommunicator& c) { fn(c); });
#endif
}

#ifdef SHARDCHECK_HAVE_GPU_COMPUTE

std::string cuda_compute_unavailable() {
  return no_device("computing on GPUs", " (--compute cpu trains on the CPU)");
}

std::function<std::unique_ptr<ref::Compute>(int)> cuda_compute(bool nccl) {
  if (nccl) {
    const NcclPlace place = nccl_place();
    if (place.mpi)
      return [device = place.device](int /*rank*/) -> std::unique_ptr<ref::Compute> {
        return std::make_unique<gpu::DeviceCompute>(device);
      };
    return [](int rank) -> std::unique_ptr<ref::Compute> {
      return std::make_unique<gpu::DeviceCompute>(rank);
    };
  }
  const int devices = gpu::visible_devices();
  if (devices <= 0) throw std::runtime_error("--compute cuda: " + cuda_compute_unavailable());
  return [devices](int rank) -> std::unique_ptr<ref::Compute> {
    return std::make_unique<gpu::DeviceCompute>(rank % devices);
  };
}

#endif  // SHARDCHECK_HAVE_GPU_COMPUTE

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

#endif  // SHARDCHECK_HAVE_NCCL

#ifndef SHARDCHECK_HAVE_GPU_COMPUTE
std::string cuda_compute_unavailable() {
  return "this build has no GPU compute (gpu/ with its CUDA ops and DeviceCompute): configure with "
         "the cuda preset (cmake --preset cuda) on a machine with CUDA and NCCL, or train on the "
         "CPU with --compute cpu";
}
std::function<std::unique_ptr<ref::Compute>(int)> cuda_compute(bool /*nccl*/) {
  throw std::runtime_error("--compute cuda: " + cuda_compute_unavailable());
}
#endif

}  // namespace shardcheck::harness
