// The op table's lookups by kind and by name (comm/ops.hpp), and the checks that its rows are in
// enum order.
#include "comm/ops.hpp"

namespace shardcheck::comm {

namespace {
constexpr bool rows_in_order() {
  for (std::size_t i = 0; i < kOps.size(); ++i)
    if (static_cast<std::size_t>(kOps[i].op) != i) return false;
  return true;
}
static_assert(rows_in_order(), "kOps: one row per Op, in enum order");
static_assert(kOps.size() == static_cast<std::size_t>(Op::begin_step) + 1, "kOps: a row per Op");
}  // namespace

std::string_view name_of(Op op) {
  const auto i = static_cast<std::size_t>(op);
  return i < kOps.size() ? kOps[i].name : "?";
}

std::optional<Op> op_named(std::string_view name) {
  for (const OpInfo& i : kOps)
    if (i.name == name) return i.op;
  return std::nullopt;
}

bool is_communication(Op op) {
  return info(op).communication;
}

}  // namespace shardcheck::comm
