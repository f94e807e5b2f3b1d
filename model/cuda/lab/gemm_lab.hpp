// gemm_lab (bench only): what the host part (gemm_lab.cpp) and the kernels (gemm_lab_kernels.cu)
// share: the input values, the same on host and device, and the launchers.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDACC__)
#define SF_LAB_HD __host__ __device__
#else
#define SF_LAB_HD
#endif

namespace gemm_lab {

SF_LAB_HD inline std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The value at a storage offset: an integer in [-half, half] (half <= 255: 8 significant bits)
// times a power of two, exact in BF16, FP16 and FP32, so every storage type holds the same number.
struct Gen {
  std::uint32_t seed = 0;
  int half = 127;
  float scale = 1.0f / 128;
};
SF_LAB_HD inline float gen_value(std::uint32_t seed, int half, float scale, std::uint64_t offset) {
  const std::uint64_t h = mix((std::uint64_t(seed) << 40) ^ offset);
  return float(int(h % std::uint64_t(2 * half + 1)) - half) * scale;
}

// Types by cudaDataType_t value: CUDA_R_16BF, CUDA_R_16F or CUDA_R_32F. All launches on `stream`.
// A column-major rows x cols matrix with leading dimension ld (the padding is left alone).
void fill(int type, void* p, std::int64_t rows, std::int64_t cols, std::int64_t ld, const Gen& g, cudaStream_t stream);
// out[i] = src[offsets[i]] as float.
void gather(int type, const void* src, const std::int64_t* offsets, int count, float* out, cudaStream_t stream);
// Row sums (and sums of absolute values) of a column-major BF16 [rows, cols] matrix, in FP64.
void row_sums(const void* d, std::int64_t rows, std::int64_t cols, std::int64_t ld, double* sum, double* sum_abs, cudaStream_t stream);
// BF16 element-wise passes over count8 * 8 contiguous values, FP32 math, GPT-2's tanh GELU:
// out = dout * GELU'(pre) (out may be dout), and out = GELU(pre).
void dgelu(void* out, const void* dout, const void* pre, std::int64_t count8, int blocks, cudaStream_t stream);
void gelu(void* out, const void* pre, std::int64_t count8, int blocks, cudaStream_t stream);

}  // namespace gemm_lab
