// Marks functions that compile for both the CPU oracle and the CUDA kernels.
// One definition of every rounding point and shift policy lives in headers that use this macro,
// so the CPU emulation and the GPU kernels run the very same code (docs/architecture.md).
#pragma once

#if defined(__CUDACC__)
#define SF_HD __host__ __device__ __forceinline__
#define SF_DEVICE_CODE 1
#else
#define SF_HD inline
#define SF_DEVICE_CODE 0
#endif
