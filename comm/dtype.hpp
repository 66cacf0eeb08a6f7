// Element types carried by collectives, and the 16-bit float formats (bf16, f16) as plain structs.
// This is the one place that knows element sizes; buffers carry element counts and derive bytes
// here. Not a numeric library: bf16/f16 only convert to and from float (round to nearest even).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace shardcheck::comm {

enum class DType : std::uint8_t { f64, f32, bf16, f16, i32, i64, u8 };

inline constexpr DType kAllDTypes[] = {DType::f64, DType::f32, DType::bf16, DType::f16,
                                       DType::i32, DType::i64, DType::u8};

std::size_t size_of(DType t);
std::string_view name_of(DType t);
std::optional<DType> parse_dtype(std::string_view name);
bool is_floating(DType t);

// bfloat16: the upper 16 bits of an IEEE binary32. Conversion rounds to nearest even; NaN stays
// NaN.
struct bf16 {
  std::uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f);
  explicit operator float() const;
  static bf16 from_bits(std::uint16_t b) {
    bf16 v;
    v.bits = b;
    return v;
  }
  friend bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }
};

// IEEE binary16. Conversion rounds to nearest even, handles subnormals, overflow to inf and NaN.
struct f16 {
  std::uint16_t bits = 0;
  f16() = default;
  explicit f16(float f);
  explicit operator float() const;
  static f16 from_bits(std::uint16_t b) {
    f16 v;
    v.bits = b;
    return v;
  }
  friend bool operator==(f16 a, f16 b) { return a.bits == b.bits; }
};

template <class T>
struct dtype_of;
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<bf16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<f16> {
  static constexpr DType value = DType::f16;
};
template <>
struct dtype_of<std::int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<std::int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct dtype_of<std::uint8_t> {
  static constexpr DType value = DType::u8;
};

template <class T>
inline constexpr DType dtype_v = dtype_of<std::remove_cv_t<T>>::value;

// Calls f(T{}) with T the C++ type of `t`; the single switch every dtype dispatch goes through.
template <class F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f64:
      return f(double{});
    case DType::f32:
      return f(float{});
    case DType::bf16:
      return f(bf16{});
    case DType::f16:
      return f(f16{});
    case DType::i32:
      return f(std::int32_t{});
    case DType::i64:
      return f(std::int64_t{});
    case DType::u8:
      return f(std::uint8_t{});
  }
  return f(std::uint8_t{});  // unreachable: every enumerator is handled above
}

}  // namespace shardcheck::comm
