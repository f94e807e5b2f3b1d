// FP32 arithmetic with one rounding per operation, identical on the host and the device.
// nvcc contracts a*b+c into an FMA by default, which rounds once instead of twice and would make
// the GPU disagree with the CPU oracle at the rounding points that docs/numerics-contract.md pins down.
#pragma once

#include <cmath>

#include "stableflash/numerics/host_device.hpp"

namespace stableflash {

SF_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

SF_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

SF_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

SF_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// exp and log in full FP32 accuracy (never the fast approximations). The two sides may differ in
// the last bit; docs/numerics-contract.md allows that ("up to the exp accuracy").
SF_HD float exp_fp32(float x) { return expf(x); }
SF_HD float log_fp32(float x) { return logf(x); }

// 2^x for the fused kernels' softmax: the hardware exp2 on the GPU (relative error ~2^-22,
// subnormal results flushed to 0), exp2f on the host. Only `fused` numerics use it, where
// docs/numerics-contract.md allows the exp implementation to differ.
SF_HD float exp2_fast(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

}  // namespace stableflash
