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

std::string npy_bytes(const HostArray& array) {
  std::string out = npy_header(array.descr(), array.shape);
  std::visit(
      [&](const auto& v) {
        out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(v[0]));
      },
      array.data);
  return out;
}

namespace {
void write_whole(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw std::runtime_error("cannot open " + path.string() + " for writing");
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();  // a full disk often shows only when the last buffer is flushed
  if (!f) throw std::runtime_error("failed writing " + path.string());
}
}  // namespace

void write_npy(const std::filesystem::path& path, const HostArray& array) {
  write_whole(path, npy_bytes(array));
}

TensorDumper::TensorDumper(std::filesystem::path dir) {
  std::filesystem::create_directories(dir);
  write_ = [dir](const std::string& file, const std::string& bytes) {
    write_whole(dir / file, bytes);
  };
}

TensorDumper::TensorDumper(Writer write) : write_(std::move(write)) {}

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
  write_(file, npy_bytes(array));
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
  std::ostringstream f;
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
  write_("index.json", f.str());
}

}  // namespace shardcheck::ref
