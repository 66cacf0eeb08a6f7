// Tensor: a shape plus contiguous row-major host storage, and ParamMap, the ordered name -> tensor
// map the model exposes. Deliberately no views, strides or broadcasting: the reference stays plain.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "reference/check.hpp"

namespace shardcheck::ref {

using Shape = std::vector<int64_t>;

inline int64_t numel_of(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

template <class T>
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Shape shape, T fill = T{0})
      : shape_(std::move(shape)), data_(static_cast<size_t>(numel_of(shape_)), fill) {}
  Tensor(Shape shape, std::vector<T> data) : shape_(std::move(shape)), data_(std::move(data)) {
    REF_CHECK(static_cast<int64_t>(data_.size()) == numel_of(shape_), "data does not fit shape");
  }

  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_.at(static_cast<size_t>(i)); }
  int64_t numel() const { return static_cast<int64_t>(data_.size()); }

  T* data() { return data_.data(); }
  const T* data() const { return data_.data(); }
  std::span<T> span() { return data_; }
  std::span<const T> span() const { return data_; }
  std::vector<T>& vec() { return data_; }
  const std::vector<T>& vec() const { return data_; }

  T& operator[](int64_t i) { return data_[static_cast<size_t>(i)]; }
  const T& operator[](int64_t i) const { return data_[static_cast<size_t>(i)]; }
  // Row-major 2-D access; the ops treat every activation as [rows, features].
  T& at(int64_t r, int64_t c) { return data_[static_cast<size_t>(r * shape_.back() + c)]; }
  const T& at(int64_t r, int64_t c) const {
    return data_[static_cast<size_t>(r * shape_.back() + c)];
  }

  void fill(T v) { std::fill(data_.begin(), data_.end(), v); }

  template <class U>
  Tensor<U> cast() const {
    Tensor<U> out(shape_);
    for (int64_t i = 0; i < numel(); ++i) out[i] = static_cast<U>((*this)[i]);
    return out;
  }

 private:
  Shape shape_;
  std::vector<T> data_;
};

template <class T>
struct NamedTensor {
  std::string name;
  Tensor<T> value;
};

// Insertion-ordered (the canonical parameter order of param_shapes), so iteration order is stable
// and a parallel implementation can shard, reduce and compare parameters by name. Lookup by name
// is a hash of the name (O(1)); iteration visits the entries in insertion order. Entries may be
// modified through iteration, but their names must not be (the index would go stale).
template <class T>
class ParamMap {
 public:
  Tensor<T>& add(std::string name, Shape shape) {
    REF_CHECK(find(name) == nullptr, "duplicate parameter " + name);
    entries_.push_back({std::move(name), Tensor<T>(std::move(shape))});
    index_.emplace(entries_.back().name, entries_.size() - 1);
    return entries_.back().value;
  }
  Tensor<T>* find(std::string_view name) {
    const auto it = index_.find(name);
    return it == index_.end() ? nullptr : &entries_[it->second].value;
  }
  const Tensor<T>* find(std::string_view name) const {
    const auto it = index_.find(name);
    return it == index_.end() ? nullptr : &entries_[it->second].value;
  }
  Tensor<T>& operator[](std::string_view name) {
    Tensor<T>* t = find(name);
    REF_CHECK(t != nullptr, "no parameter " + std::string(name));
    return *t;
  }
  const Tensor<T>& operator[](std::string_view name) const {
    const Tensor<T>* t = find(name);
    REF_CHECK(t != nullptr, "no parameter " + std::string(name));
    return *t;
  }
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  size_t size() const { return entries_.size(); }
  auto begin() { return entries_.begin(); }
  auto end() { return entries_.end(); }
  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }

  // Same names and shapes, all zeros: the gradient buffer of a parameter set.
  ParamMap zeros_like() const {
    ParamMap out;
    for (const auto& e : entries_) out.add(e.name, e.value.shape());
    return out;
  }
  template <class U>
  ParamMap<U> cast() const {
    ParamMap<U> out;
    for (const auto& e : entries_) out.add(e.name, e.value.shape()) = e.value.template cast<U>();
    return out;
  }
  int64_t numel() const {
    int64_t n = 0;
    for (const auto& e : entries_) n += e.value.numel();
    return n;
  }

 private:
  // Transparent hashing: find(string_view) does not build a std::string.
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };
  std::vector<NamedTensor<T>> entries_;
  std::unordered_map<std::string, size_t, NameHash, std::equal_to<>> index_;  // name -> entry
};

}  // namespace shardcheck::ref
