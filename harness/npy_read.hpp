// A strict NumPy .npy reader for `shardcheck compare` (format versions 1.0 and 2.0): little-endian,
// C-order arrays of float64, float32, float16, int32 or int64, read into doubles. Anything else —
// another dtype, a big-endian or Fortran-order array, a malformed header, a file shorter or longer
// than its shape says — is an NpyError naming the file and the problem, never a guess. Standard
// library only; the writer is reference/npy.hpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardcheck::harness {

// A .npy file that cannot be read; the message starts with the file's path.
class NpyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What the header says, checked against the file's size.
struct NpyHeader {
  std::string descr;            // "<f8", "<f4", "<f2", "<i4" or "<i8"
  std::string dtype;            // NumPy's name: "float64", "float32", "float16", "int32", "int64"
  std::vector<int64_t> shape;   // () for a scalar
  std::size_t item_bytes = 0;   // 8, 4 or 2
  std::size_t data_offset = 0;  // where the data starts in the file
  std::size_t numel = 0;        // the product of shape (1 for a scalar)
  bool integer() const { return dtype == "int32" || dtype == "int64"; }
};

struct NpyArray {
  NpyHeader header;
  std::vector<double> values;  // every element, C order, converted exactly to double
  std::vector<int64_t> ints;   // integer dtypes only: the exact values (int64 may exceed 2^53)
};

// The header only (the file's size is checked against it; the data is not read).
NpyHeader read_npy_header(const std::filesystem::path& file);
// Header and data. Throws NpyError.
NpyArray read_npy(const std::filesystem::path& file);

// "[2, 3]"; "[]" for a scalar.
std::string shape_text(const std::vector<int64_t>& shape);

}  // namespace shardcheck::harness
