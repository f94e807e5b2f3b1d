#include "stableflash/data/safetensors.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <optional>
#include <utility>

#include "stableflash/data/atomic_file.hpp"
#include "stableflash/data/file_checks.hpp"

namespace stableflash::data {
namespace {

using json = nlohmann::json;

constexpr std::array<std::pair<DType, std::string_view>, 13> kNames{{{DType::f64, "F64"},
                                                                   {DType::f32, "F32"},
                                                                   {DType::f16, "F16"},
                                                                   {DType::bf16, "BF16"},
                                                                   {DType::i64, "I64"},
                                                                   {DType::i32, "I32"},
                                                                   {DType::i16, "I16"},
                                                                   {DType::i8, "I8"},
                                                                   {DType::u8, "U8"},
                                                                   {DType::u16, "U16"},
                                                                   {DType::u32, "U32"},
                                                                   {DType::u64, "U64"},
                                                                   {DType::boolean, "BOOL"}}};

// Headers beyond this are refused rather than allocated (the reference implementation's limit).
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

[[noreturn]] void bad(const std::string& path, const std::string& what) { throw std::runtime_error(path + ": " + what); }

std::uint64_t read_le64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

DType parse_dtype(const std::string& path, const std::string& name, const std::string& s) {
  for (const auto& [t, n] : kNames)
    if (n == s) return t;
  bad(path, "tensor '" + name + "': unknown dtype '" + s + "'");
}

// The byte size of a tensor, or nothing when the element count times the element size does not fit
// in 64 bits (a header can claim any shape; the product must be checked before it is trusted).
std::optional<std::uint64_t> checked_bytes(const std::vector<std::int64_t>& shape, DType dtype) {
  std::uint64_t n = dtype_size(dtype);
  for (auto d : shape)
    if (d == 0) return 0;  // an empty tensor, whatever its other dimensions
  for (auto d : shape)
    if (d < 0 || __builtin_mul_overflow(n, std::uint64_t(d), &n)) return std::nullopt;
  return n;
}

}  // namespace

std::string_view dtype_name(DType t) {
  for (const auto& [d, n] : kNames)
    if (d == t) return n;
  return "?";
}

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: case DType::i64: case DType::u64: return 8;
    case DType::f32: case DType::i32: case DType::u32: return 4;
    case DType::f16: case DType::bf16: case DType::i16: case DType::u16: return 2;
    default: return 1;
  }
}

std::int64_t Tensor::elements() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::int64_t count_non_finite(const Tensor& t) {
  std::int64_t n = 0;
  auto count_bits = [&](auto word, unsigned exponent_mask) {
    for (const auto w : t.as<decltype(word)>()) n += (unsigned(w) & exponent_mask) == exponent_mask;  // all-ones exponent: Inf or NaN
  };
  switch (t.dtype) {
    case DType::bf16: count_bits(std::uint16_t{}, 0x7f80u); break;
    case DType::f16: count_bits(std::uint16_t{}, 0x7c00u); break;
    case DType::f32: for (const float v : t.as<float>()) n += !std::isfinite(v); break;
    case DType::f64: for (const double v : t.as<double>()) n += !std::isfinite(v); break;
    default: break;  // integers and booleans are always finite
  }
  return n;
}

const Tensor* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

SafetensorsFile SafetensorsFile::read(const std::string& path) {
  require_readable_file(path, "safetensors file");
  std::ifstream in(path, std::ios::binary);
  if (!in) bad(path, std::string("cannot open safetensors file: ") + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::uint64_t file_size = static_cast<std::uint64_t>(in.tellg());
  in.seekg(0);
  if (file_size < 8) bad(path, "too short for a safetensors file (" + std::to_string(file_size) + " bytes; the header length alone is 8)");
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  const std::uint64_t header_len = read_le64(len_bytes);
  if (header_len > kMaxHeaderBytes || header_len > file_size - 8)
    bad(path, "header length " + std::to_string(header_len) + " does not fit in a file of " + std::to_string(file_size) + " bytes");
  std::string header(header_len, '\0');
  in.read(header.data(), std::streamsize(header_len));
  json j;
  try {
    j = json::parse(header);
  } catch (const json::parse_error& e) {
    bad(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) bad(path, "header must be a JSON object");
  const std::uint64_t data_len = file_size - 8 - header_len;
  std::vector<std::byte> data(data_len);
  in.read(reinterpret_cast<char*>(data.data()), std::streamsize(data_len));
  if (!in) bad(path, "could not read the data section");

  SafetensorsFile f;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (auto& [name, entry] : j.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) bad(path, "__metadata__ must be an object of strings");
      for (auto& [k, v] : entry.items()) {
        if (!v.is_string()) bad(path, "__metadata__['" + k + "'] must be a string");
        f.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
      bad(path, where + ": needs dtype, shape and data_offsets");
    if (!entry["dtype"].is_string()) bad(path, where + ": dtype must be a string");
    Tensor t;
    t.dtype = parse_dtype(path, name, entry["dtype"].get<std::string>());
    if (!entry["shape"].is_array()) bad(path, where + ": shape must be an array of non-negative integers");
    for (auto& d : entry["shape"]) {
      if (!d.is_number_unsigned()) bad(path, where + ": shape must be an array of non-negative integers");
      // Shapes are int64 in every reader (PyTorch, NumPy, ours): a larger dimension would turn negative.
      const auto dim = d.get<std::uint64_t>();
      if (dim > std::uint64_t(INT64_MAX))
        bad(path, where + ": dimension " + std::to_string(dim) + " exceeds 2^63-1, the largest a shape can hold");
      t.shape.push_back(std::int64_t(dim));
    }
    const auto& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad(path, where + ": data_offsets must be [begin, end]");
    const std::uint64_t begin = off[0].get<std::uint64_t>(), end = off[1].get<std::uint64_t>();
    if (begin > end || end > data_len)
      bad(path, where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] outside the " +
                    std::to_string(data_len) + "-byte data section");
    const auto expected = checked_bytes(t.shape, t.dtype);
    if (!expected)
      bad(path, where + ": its shape holds more than 2^64 bytes of " + std::string(dtype_name(t.dtype)) + " (" +
                    std::to_string(end - begin) + " bytes in the file)");
    if (end - begin != *expected)
      bad(path, where + ": " + std::to_string(end - begin) + " bytes for a shape that needs " + std::to_string(*expected));
    t.bytes.assign(data.begin() + std::ptrdiff_t(begin), data.begin() + std::ptrdiff_t(end));
    ranges.emplace_back(begin, end);
    f.tensors.emplace(name, std::move(t));
  }
  // The reference reader's rule: the tensors tile the data section exactly, no gap, no trailing
  // bytes, so every byte of the file is accounted for.
  std::sort(ranges.begin(), ranges.end());
  std::uint64_t covered = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin < covered) bad(path, "tensors overlap in the data section");
    if (begin > covered)
      bad(path, "bytes [" + std::to_string(covered) + ", " + std::to_string(begin) + ") of the data section belong to no tensor");
    covered = end;
  }
  if (covered != data_len)
    bad(path, std::to_string(data_len - covered) + " trailing bytes after the last tensor (the data section holds " +
                  std::to_string(data_len) + " bytes, the tensors " + std::to_string(covered) + ")");
  return f;
}

void SafetensorsFile::write(const std::string& path) const {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (checked_bytes(t.shape, t.dtype) != std::optional<std::uint64_t>(t.bytes.size()))
      throw std::invalid_argument(path + ": tensor '" + name + "' has " + std::to_string(t.bytes.size()) +
                                  " bytes for its shape");
    header[name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data 8-byte aligned, as the reference writer does
  write_file_atomically(path, [&](std::ostream& out) {
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(std::uint64_t(text.size()) >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(text.data(), std::streamsize(text.size()));
    for (const auto& [name, t] : tensors) out.write(reinterpret_cast<const char*>(t.bytes.data()), std::streamsize(t.bytes.size()));
  });
}

}  // namespace stableflash::data
