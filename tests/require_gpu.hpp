// The skip of the GPU tests (model, optimizer, trainer suites): where no CUDA device is visible a
// test reads as skipped in ctest (SKIP_REGULAR_EXPRESSION in their CMakeLists.txt), not as passed.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

namespace stableflash::testing {

inline bool has_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) return true;
  cudaGetLastError();  // the failed query's error is not the next test's
  return false;
}

}  // namespace stableflash::testing

#define SF_REQUIRE_GPU() \
  if (!::stableflash::testing::has_gpu()) GTEST_SKIP() << "no CUDA device"
