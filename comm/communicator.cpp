// The in-place overloads whose layouts need the group size, and reduce-op names.
#include "comm/communicator.hpp"

#include "comm/errors.hpp"

namespace shardcheck::comm {

std::string_view name_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
    case ReduceOp::prod:
      return "prod";
  }
  return "?";
}

namespace {
void require_divisible(const Communicator& c, const Buffer& b, const char* op) {
  if (b.count % static_cast<std::size_t>(c.size()) != 0)
    throw InvalidArgument({c.world_rank(), c.name(), op, 0},
                          "in-place buffer of " + std::to_string(b.count) +
                              " elements is not divisible by the group size " +
                              std::to_string(c.size()));
}
}  // namespace

WorkPtr Communicator::reduce_scatter(Buffer inout, ReduceOptions o) {
  require_divisible(*this, inout, "reduce_scatter");
  const std::size_t c = inout.count / static_cast<std::size_t>(size());
  return do_reduce_scatter(inout, inout.slice(static_cast<std::size_t>(rank()) * c, c), o);
}

WorkPtr Communicator::all_gather(Buffer inout) {
  require_divisible(*this, inout, "all_gather");
  const std::size_t c = inout.count / static_cast<std::size_t>(size());
  return do_all_gather(inout.slice(static_cast<std::size_t>(rank()) * c, c), inout);
}

}  // namespace shardcheck::comm
