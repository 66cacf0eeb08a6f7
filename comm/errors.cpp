// Messages of the typed communication errors and of SC_CHECK.
#include "comm/errors.hpp"

namespace shardcheck::comm {

std::string OpContext::describe() const {
  std::ostringstream os;
  os << "rank " << rank << ", group " << group << ", op " << op << ", seq " << seq;
  return os.str();
}

CommError::CommError(OpContext ctx, const std::string& what)
    : std::runtime_error("[" + ctx.describe() + "] " + what), ctx_(std::move(ctx)) {}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s + "]";
}

namespace detail {
void check_failed(const char* file, int line, const char* expr, const std::string& msg) {
  std::ostringstream os;
  os << file << ":" << line << ": check failed: " << expr;
  if (!msg.empty()) os << ": " << msg;
  throw InvariantError(os.str());
}
}  // namespace detail

}  // namespace shardcheck::comm
