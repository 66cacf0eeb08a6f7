// The data-parallel view of a configuration: which strategy (DDP, ZeRO-1/2/3, FSDP) and its
// settings, as the analytic ledger (ledger.hpp) and the planner's timing skeleton read them. The
// engine that trains every configuration is the mesh engine (mp/mesh_engine.hpp; a data-parallel
// mesh is tp = pp = cp = ep = 1), whose MeshOptions carry the same settings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "parallel/fsdp.hpp"
#include "parallel/step.hpp"
#include "parallel/testing.hpp"

namespace shardcheck::parallel {

enum class Strategy : std::uint8_t { ddp, zero1, zero2, zero3, fsdp };
std::string_view name_of(Strategy s);

struct DataParallelOptions {
  Strategy strategy = Strategy::ddp;
  // DDP and ZeRO-1 all-reduce gradients in buckets of about this many elements.
  std::size_t bucket_elems = std::size_t{1} << 20;
  FsdpOptions fsdp{};  // Strategy::fsdp only
  // DDP / ZeRO-1: issue each bucket's all_reduce during the last microbatch's backward as soon as
  // its gradients are complete (PyTorch DDP order); false: all after backward.
  bool overlap = true;
  // What the tests' data-parallel runs hand the engine too (parallel/step.hpp, testing.hpp).
  GradHealthOptions health{};
  GradHook grad_hook{};
  testing::Mutation planted = testing::Mutation::kNone;
};

}  // namespace shardcheck::parallel
