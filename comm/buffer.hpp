// Typed buffer views passed to collectives: {pointer, element count, dtype, device}.
// Counts are always elements; byte sizes are derived here and nowhere else. Views never own memory.
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>

#include "comm/dtype.hpp"

namespace shardcheck::comm {

enum class DeviceKind : std::uint8_t { host, cuda };

struct Device {
  DeviceKind kind = DeviceKind::host;
  int index = 0;
  friend bool operator==(const Device&, const Device&) = default;
};

// A mutable view: the receive side of a collective.
struct Buffer {
  void* data = nullptr;
  std::size_t count = 0;  // elements, not bytes
  DType dtype = DType::f32;
  Device device{};

  std::size_t bytes() const { return count * size_of(dtype); }
  // Elements [offset, offset + n) of this view (a null view's slices are null: meta mode).
  Buffer slice(std::size_t offset, std::size_t n) const {
    if (data == nullptr) return {nullptr, n, dtype, device};
    return {static_cast<std::byte*>(data) + offset * size_of(dtype), n, dtype, device};
  }
};

// A read-only view: the send side of a collective.
struct ConstBuffer {
  const void* data = nullptr;
  std::size_t count = 0;  // elements, not bytes
  DType dtype = DType::f32;
  Device device{};

  ConstBuffer() = default;
  ConstBuffer(const void* d, std::size_t n, DType t, Device dev = {})
      : data(d), count(n), dtype(t), device(dev) {}
  ConstBuffer(const Buffer& b)  // NOLINT(google-explicit-constructor): a writable view is readable
      : data(b.data), count(b.count), dtype(b.dtype), device(b.device) {}

  std::size_t bytes() const { return count * size_of(dtype); }
  ConstBuffer slice(std::size_t offset, std::size_t n) const {
    if (data == nullptr) return {nullptr, n, dtype, device};
    return {static_cast<const std::byte*>(data) + offset * size_of(dtype), n, dtype, device};
  }
};

template <class T>
requires(!std::is_const_v<T>) Buffer view(std::span<T> s, Device dev = {}) {
  return {s.data(), s.size(), dtype_v<T>, dev};
}

template <class T>
ConstBuffer cview(std::span<const T> s, Device dev = {}) {
  return {s.data(), s.size(), dtype_v<T>, dev};
}

// True when the two views start at the same address: the in-place form of a call.
inline bool same_start(const ConstBuffer& a, const Buffer& b) {
  return a.data == b.data;
}

}  // namespace shardcheck::comm
