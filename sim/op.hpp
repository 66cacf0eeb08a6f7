// The kinds of communication op the simulator knows and the descriptor members of a group must
// agree on. Shared by the rendezvous (state), the cost model (topology) and the fault injector.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "comm/communicator.hpp"

namespace shardcheck::sim {

enum class OpKind : std::uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  all_to_all,
  all_to_all_v,
  barrier,
  split,
  send,
  recv
};
std::string_view name_of(OpKind k);

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
