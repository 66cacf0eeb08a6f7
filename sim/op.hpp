// The kinds of communication op the simulator knows (the op table's, comm/ops.hpp) and the
// descriptor members of a group must agree on. Shared by the rendezvous (state), the cost model
// (topology) and the fault injector.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "comm/communicator.hpp"
#include "comm/ops.hpp"

namespace shardcheck::sim {

// The op table's kinds (comm/ops.hpp); the simulator issues the communication ops and split.
using OpKind = comm::Op;
using comm::name_of;

// What every member of a group must agree on at one sequence number.
struct OpDesc {
  OpKind kind = OpKind::barrier;
  comm::DType dtype = comm::DType::u8;
  std::size_t count = 0;
  comm::ReduceOp redop = comm::ReduceOp::sum;
  int root = 0;
  friend bool operator==(const OpDesc&, const OpDesc&) = default;
  std::string describe() const;
};

}  // namespace shardcheck::sim
