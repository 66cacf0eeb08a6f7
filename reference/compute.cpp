// The calling thread's Compute (reference/compute.hpp).
#include "reference/compute.hpp"

namespace shardcheck::ref {

namespace {
thread_local Compute* t_compute = nullptr;
}

Compute* thread_compute() {
  return t_compute;
}

ComputeScope::ComputeScope(Compute* compute) : previous_(t_compute) {
  t_compute = compute;
}

ComputeScope::~ComputeScope() {
  t_compute = previous_;
}

}  // namespace shardcheck::ref
