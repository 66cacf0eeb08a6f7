// The names of the data-parallel strategies (data_parallel.hpp).
#include "parallel/data_parallel.hpp"

namespace shardcheck::parallel {

std::string_view name_of(Strategy s) {
  switch (s) {
    case Strategy::ddp:
      return "ddp";
    case Strategy::zero1:
      return "zero1";
    case Strategy::zero2:
      return "zero2";
    case Strategy::zero3:
      return "zero3";
    case Strategy::fsdp:
      return "fsdp";
  }
  return "?";
}

}  // namespace shardcheck::parallel
