// Test support for collectives: a plain serial definition of each reduction (the oracle), patterned
// inputs with exactly predictable results, and bitwise comparison. Independent of sim/kernels.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "comm/communicator.hpp"

namespace shardcheck::testing {

using comm::bf16;
using comm::f16;
using comm::ReduceOp;

template <class T>
struct OracleAcc {
  using type = T;
};
template <>
struct OracleAcc<bf16> {
  using type = float;
};
template <>
struct OracleAcc<f16> {
  using type = float;
};

template <class T>
auto to_acc(T v) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
    return static_cast<float>(v);
  else
    return v;
}
template <class T, class A>
T from_acc(A v) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
    return T(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

// The serial definition: out[k] = op(in[0][k], in[1][k], ...) folded left in rank order.
template <class T>
std::vector<T> serial_reduce(const std::vector<std::vector<T>>& in, ReduceOp op) {
  using A = typename OracleAcc<T>::type;
  const std::size_t count = in.empty() ? 0 : in[0].size();
  std::vector<T> out(count);
  for (std::size_t k = 0; k < count; ++k) {
    A acc = to_acc(in[0][k]);
    for (std::size_t r = 1; r < in.size(); ++r) {
      const A x = to_acc(in[r][k]);
      if constexpr (std::is_integral_v<A>) {
        using U = std::make_unsigned_t<A>;
        if (op == ReduceOp::sum || op == ReduceOp::avg) acc = static_cast<A>(U(acc) + U(x));
        if (op == ReduceOp::prod) acc = static_cast<A>(U(acc) * U(x));
        if (op == ReduceOp::max) acc = std::max(acc, x);
        if (op == ReduceOp::min) acc = std::min(acc, x);
      } else {
        if (op == ReduceOp::sum || op == ReduceOp::avg) acc = acc + x;
        if (op == ReduceOp::prod) acc = acc * x;
        if (op == ReduceOp::max)
          acc = (std::isnan(acc) || std::isnan(x)) ? NAN : (x > acc ? x : acc);
        if (op == ReduceOp::min)
          acc = (std::isnan(acc) || std::isnan(x)) ? NAN : (x < acc ? x : acc);
      }
    }
    if (op == ReduceOp::avg) {
      if constexpr (std::is_integral_v<A>)
        acc = static_cast<A>(static_cast<std::int64_t>(acc) / static_cast<std::int64_t>(in.size()));
      else
        acc = acc / static_cast<A>(in.size());
    }
    out[k] = from_acc<T>(acc);
  }
  return out;
}

// Small integers: every sum, product and average of them is exact in every dtype, so the expected
// value is known exactly whatever the order. Products stay tiny (mostly ones).
template <class T>
T pattern(int rank, std::size_t k, ReduceOp op) {
  const auto r = static_cast<std::size_t>(rank);
  int v;
  if (op == ReduceOp::prod) {
    v = (k + r) % 5 == 0 ? 2 : ((k + 2 * r) % 7 == 0 ? (std::is_unsigned_v<T> ? 3 : -1) : 1);
  } else if constexpr (std::is_unsigned_v<T>) {
    v = static_cast<int>((r * 7 + k * 3) % 11);
  } else {
    v = static_cast<int>((r * 7 + k * 3) % 11) - 5;
  }
  return from_acc<T>(static_cast<typename OracleAcc<T>::type>(v));
}

template <class T>
std::size_t count_bitwise_diff(const T* a, const T* b, std::size_t n) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (std::memcmp(a + i, b + i, sizeof(T)) != 0) ++wrong;
  return wrong;
}

inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max,
                                             ReduceOp::min, ReduceOp::prod};

}  // namespace shardcheck::testing
