#include "cpu_kernels_common.hpp"

namespace stableflash::attention::detail {

HeadMajor::HeadMajor(const bf16* src, const HeadStrides& st, int batch, int heads_, int len_, int dim_)
    : values(std::size_t(batch) * heads_ * len_ * dim_), heads(heads_), len(len_), dim(dim_) {
  float* out = values.data();
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads_; ++h)
      for (int t = 0; t < len_; ++t)
        for (int d = 0; d < dim_; ++d) *out++ = src[st.at(b, h, t) + d].to_float();
}

}  // namespace stableflash::attention::detail
