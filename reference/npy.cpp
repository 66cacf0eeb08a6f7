// .npy 1.0 writer and the dump directory's index.json, formatted by hand (names are plain ASCII
// tensor names; quotes and backslashes are escaped anyway).
#include "reference/npy.hpp"

#include <bit>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace shardcheck::ref {

static_assert(std::endian::native == std::endian::little, "the .npy writer assumes little-endian");

std::string HostArray::descr() const {
  static const char* names[] = {"<f8", "<f4", "<i4", "<i8"};
  return names[data.index()];
}

std::string HostArray::dtype() const {
  static const char* names[] = {"float64", "float32", "int32", "int64"};
  return names[data.index()];
}

std::string npy_header(std::string_view descr, const Shape& shape) {
  std::ostringstream dict;
  dict << "{'descr': '" << descr << "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) dict << (i ? ", " : "") << shape[i];
  if (shape.size() == 1) dict << ",";  // a 1-tuple needs its comma
  dict << "), }";
  std::string body = dict.str();
  const size_t prefix = 10;  // magic (6) + version (2) + header length (2)
  const size_t total = ((prefix + body.size() + 1 + 63) / 64) * 64;
  body.append(total - prefix - body.size() - 1, ' ');
  body.push_back('\n');
  const auto len = static_cast<uint16_t>(body.size());
  std::string out = "\x93NUMPY";
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(len & 0xFF));
  out.push_back(static_cast<char>(len >> 8));
  return out + body;
}

void write_npy(const std::filesystem::path& path, const HostArray& array) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw std::runtime_error("cannot open " + path.string() + " for writing");
  const std::string header = npy_header(array.descr(), array.shape);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  std::visit(
      [&](const auto& v) {
        f.write(reinterpret_cast<const char*>(v.data()),
                static_cast<std::streamsize>(v.size() * sizeof(v[0])));
      },
      array.data);
  f.close();  // a full disk often shows only when the last buffer is flushed
  if (!f) throw std::runtime_error("failed writing " + path.string());
}

TensorDumper::TensorDumper(std::filesystem::path dir) : dir_(std::move(dir)) {
  std::filesystem::create_directories(dir_);
}

std::string TensorDumper::file_name(std::string_view tensor_name) {
  std::string out;
  for (char c : tensor_name) {
    if (c == '/')
      out += "__";
    else
      out.push_back(c);
  }
  return out + ".npy";
}

void TensorDumper::add(const std::string& name, const HostArray& array) {
  const std::string file = file_name(name);
  write_npy(dir_ / file, array);
  entries_.push_back({name, file, array.dtype(), array.shape});
}

namespace {
std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}
}  // namespace

void TensorDumper::write_index() const {
  std::ofstream f(dir_ / "index.json", std::ios::trunc);
  if (!f) throw std::runtime_error("cannot write " + (dir_ / "index.json").string());
  f << "[\n";
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    f << "  {\"name\": " << json_string(e.name) << ", \"file\": " << json_string(e.file)
      << ", \"shape\": [";
    for (size_t d = 0; d < e.shape.size(); ++d) f << (d ? ", " : "") << e.shape[d];
    f << "], \"dtype\": " << json_string(e.dtype) << "}" << (i + 1 < entries_.size() ? "," : "")
      << "\n";
  }
  f << "]\n";
  f.close();
  if (!f) throw std::runtime_error("failed writing " + (dir_ / "index.json").string());
}

}  // namespace shardcheck::ref
