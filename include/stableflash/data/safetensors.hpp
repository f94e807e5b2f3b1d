// Reading and writing safetensors files (https://huggingface.co/docs/safetensors): an 8-byte
// little-endian header length, a JSON header naming each tensor's dtype, shape and byte range,
// then the raw little-endian data. Written by hand on nlohmann/json because no C++ safetensors
// library is packaged for Debian; the format is small and fully validated here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace stableflash::data {

enum class DType : std::uint8_t { f64, f32, f16, bf16, i64, i32, i16, i8, u8, u16, u32, u64, boolean };

std::string_view dtype_name(DType t);   // safetensors spelling: "F32", "BF16", ...
std::size_t dtype_size(DType t);

struct Tensor {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;

  std::int64_t elements() const;
  // A typed view; throws if the dtype's element size is not T's.
  template <class T>
  std::span<const T> as() const {
    if (dtype_size(dtype) != sizeof(T)) throw std::invalid_argument("tensor of dtype " + std::string(dtype_name(dtype)) + " viewed with a type of another size");
    return {reinterpret_cast<const T*>(bytes.data()), bytes.size() / sizeof(T)};
  }
  template <class T>
  static Tensor from(DType dtype, std::vector<std::int64_t> shape, std::span<const T> values) {
    Tensor t{dtype, std::move(shape), {}};
    t.bytes.resize(values.size_bytes());
    if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), values.size_bytes());
    return t;
  }
};

// Elements that are NaN or ±Inf in a floating tensor (BF16, F16, F32, F64); 0 for other dtypes.
std::int64_t count_non_finite(const Tensor& t);

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;  // the optional "__metadata__" string map

  // Reads and validates a whole file; errors name the file and what is wrong. Every size is
  // checked for 64-bit overflow, and the tensors must tile the data section exactly (no gap, no
  // trailing bytes), as in the reference implementation.
  static SafetensorsFile read(const std::string& path);
  // Writes atomically: a temporary file in the same directory, flushed, then renamed over `path`.
  void write(const std::string& path) const;

  const Tensor* find(const std::string& name) const;
};

}  // namespace stableflash::data
