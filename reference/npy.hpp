// NumPy .npy (format 1.0) writing and the --dump-tensors directory (one .npy per tensor plus
// index.json), standard library only. Not a reader for general .npy files and not a JSON library.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "reference/tensor.hpp"

namespace shardcheck::ref {

// A named tensor handed to observers: shape plus host data in one of the dumped dtypes.
struct HostArray {
  Shape shape;
  std::variant<std::vector<double>, std::vector<float>, std::vector<int32_t>, std::vector<int64_t>>
      data;

  std::string descr() const;  // NumPy descr: "<f8", "<f4", "<i4", "<i8"
  std::string dtype() const;  // NumPy name: "float64", "float32", "int32", "int64"
  int64_t numel() const { return numel_of(shape); }

  template <class T>
  static HostArray of(const Tensor<T>& t) {
    return {t.shape(), t.vec()};
  }
};

// The complete header: magic, version 1.0, length, the dict padded with spaces and ended by '\n'
// so that the data starts at a multiple of 64 bytes.
std::string npy_header(std::string_view descr, const Shape& shape);

// A little-endian, C-order .npy file's bytes.
std::string npy_bytes(const HostArray& array);
// Writes a little-endian, C-order .npy file. Throws std::runtime_error on I/O failure.
void write_npy(const std::filesystem::path& path, const HostArray& array);

// Collects named tensors into DIR: NAME with '/' replaced by "__" plus ".npy", and index.json, a
// JSON list of {"name", "file", "shape", "dtype"} in the order received.
class TensorDumper {
 public:
  // Writes one file of the dump whole: its name in DIR and its bytes.
  using Writer = std::function<void(const std::string& file, const std::string& bytes)>;
  explicit TensorDumper(std::filesystem::path dir);  // plain files in DIR (made if missing)
  explicit TensorDumper(Writer write);               // the caller's writer (the CLI's confined one)
  void add(const std::string& name, const HostArray& array);
  void write_index() const;  // rewrites DIR/index.json; call after the run (or at any point)
  static std::string file_name(std::string_view tensor_name);

 private:
  struct Entry {
    std::string name, file, dtype;
    Shape shape;
  };
  Writer write_;
  std::vector<Entry> entries_;
};

}  // namespace shardcheck::ref
