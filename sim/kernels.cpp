// Rank-order reductions over tiles: load the first contribution, fold the rest in rank order in
// the accumulator type, then store to every destination. Tiled so the accumulator stays in cache.
#include "sim/kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "sim/testing.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace shardcheck::sim {

void copy_bytes(void* dst, const void* src, std::size_t bytes, bool stream) {
  if (bytes == 0 || dst == src) return;
#if defined(__SSE2__)
  if (stream) {
    auto* d = static_cast<std::byte*>(dst);
    const auto* s = static_cast<const std::byte*>(src);
    const std::size_t head = std::min(bytes, (16 - reinterpret_cast<std::uintptr_t>(d) % 16) % 16);
    std::memcpy(d, s, head);
    d += head;
    s += head;
    bytes -= head;
    const std::size_t vecs = bytes / 16;
    for (std::size_t i = 0; i < vecs; ++i)
      _mm_stream_si128(reinterpret_cast<__m128i*>(d) + i,
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(s) + i));
    std::memcpy(d + vecs * 16, s + vecs * 16, bytes - vecs * 16);
    return;
  }
#endif
  (void)stream;
  std::memcpy(dst, src, bytes);
}

void copy_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

Range chunk(std::size_t count, int n, int i) {
  const auto nn = static_cast<std::size_t>(n);
  const auto ii = static_cast<std::size_t>(i);
  Range r{count / nn * ii + std::min(ii, count % nn), 0};
  r.end = r.begin + count / nn + (ii < count % nn ? 1 : 0);
  return r;
}

namespace {

using comm::ReduceOp;

// Accumulator type per element type: floats reduce in f32 or better, integers wrap (unsigned).
template <class T>
struct Acc {
  using type = T;
};
template <>
struct Acc<comm::bf16> {
  using type = float;
};
template <>
struct Acc<comm::f16> {
  using type = float;
};

template <class T>
typename Acc<T>::type load(T v) {
  if constexpr (std::is_same_v<T, comm::bf16> || std::is_same_v<T, comm::f16>)
    return static_cast<float>(v);
  else
    return v;
}
template <class T, class A>
T store(A v) {
  if constexpr (std::is_same_v<T, comm::bf16> || std::is_same_v<T, comm::f16>)
    return T(v);
  else
    return static_cast<T>(v);
}

template <class A>
A combine(ReduceOp op, A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
      case ReduceOp::prod:
        return static_cast<A>(static_cast<U>(a) * static_cast<U>(b));
      case ReduceOp::max:
        return b > a ? b : a;
      case ReduceOp::min:
        return b < a ? b : a;
    }
  } else {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        return a + b;
      case ReduceOp::prod:
        return a * b;
      case ReduceOp::max:
        return (std::isnan(a) || std::isnan(b)) ? a + b : (b > a ? b : a);
      case ReduceOp::min:
        return (std::isnan(a) || std::isnan(b)) ? a + b : (b < a ? b : a);
    }
  }
  return a;
}

template <class A>
A finish(ReduceOp op, A v, int n) {
  if (op != ReduceOp::avg) return v;
  if constexpr (std::is_integral_v<A>) {
    return static_cast<A>(static_cast<std::int64_t>(v) / n);
  } else {
    return v / static_cast<A>(n);
  }
}

constexpr std::size_t kTile = 2048;

template <class T>
void reduce_typed(ReduceOp op, std::span<const void* const> srcs, std::span<void* const> dsts,
                  std::size_t count, int chunk_index, testing::Mutation planted) {
  using A = typename Acc<T>::type;
  const int n = static_cast<int>(srcs.size());
  const bool reversed =
      planted == testing::Mutation::reverse_order_on_odd_chunks && (chunk_index % 2) == 1;
  if (planted == testing::Mutation::skip_last_element_of_chunk && count > 0) --count;
  A acc[kTile];
  T out[kTile];
  const bool stream = count * sizeof(T) >= kStreamBytes;
  for (std::size_t base = 0; base < count; base += kTile) {
    const std::size_t len = std::min(kTile, count - base);
    const int first = reversed ? n - 1 : 0;
    const T* s0 = static_cast<const T*>(srcs[static_cast<std::size_t>(first)]) + base;
    for (std::size_t k = 0; k < len; ++k) acc[k] = load(s0[k]);
    for (int step = 1; step < n; ++step) {
      const int r = reversed ? n - 1 - step : step;
      const T* s = static_cast<const T*>(srcs[static_cast<std::size_t>(r)]) + base;
      if constexpr (std::is_same_v<A, T> && std::is_floating_point_v<T>) {
        if (op == ReduceOp::sum || op == ReduceOp::avg) {  // the hot path: let it vectorise
          for (std::size_t k = 0; k < len; ++k) acc[k] += s[k];
          continue;
        }
      }
      for (std::size_t k = 0; k < len; ++k) acc[k] = combine<A>(op, acc[k], load(s[k]));
    }
    if (stream) {  // stage the tile, then write it to every output without reading them first
      for (std::size_t k = 0; k < len; ++k) out[k] = store<T>(finish<A>(op, acc[k], n));
      for (void* d : dsts) copy_bytes(static_cast<T*>(d) + base, out, len * sizeof(T), true);
      continue;
    }
    T* d0 = static_cast<T*>(dsts[0]) + base;
    for (std::size_t k = 0; k < len; ++k) d0[k] = store<T>(finish<A>(op, acc[k], n));
    for (std::size_t d = 1; d < dsts.size(); ++d) {
      T* dst = static_cast<T*>(dsts[d]) + base;
      if (dst != d0) std::memcpy(dst, d0, len * sizeof(T));
    }
  }
  if (stream) copy_fence();
}

}  // namespace

void reduce_into(comm::DType dtype, comm::ReduceOp op, std::span<const void* const> srcs,
                 std::span<void* const> dsts, std::size_t count, int chunk_index,
                 testing::Mutation planted) {
  if (count == 0 || srcs.empty() || dsts.empty()) return;
  comm::visit_dtype(dtype, [&](auto tag) {
    reduce_typed<decltype(tag)>(op, srcs, dsts, count, chunk_index, planted);
  });
}

}  // namespace shardcheck::sim
