// Running one audit case in every variant and measuring it against the FP64 reference.
#include <algorithm>
#include <cmath>
#include <vector>

#include "stableflash/attention/cuda.hpp"
#include "stableflash/diag/audit.hpp"
#include "stableflash/numerics/exact_ops.hpp"

namespace stableflash::diag {
namespace {

using namespace stableflash::attention;

// A row "collapsed to zero" when its output is below this fraction of the reference's: the
// published policy's underflow under the 1e-10 clamp leaves outputs ~1e-16 of the true ones.
constexpr double kCollapsed = 1e-6;

struct BiasSum {
  double sum = 0.0, abs_sum = 0.0;
  std::int64_t count = 0;
  void add(double e) { sum += e, abs_sum += std::fabs(e), ++count; }
  Bias bias() const {
    Bias b;
    b.count = count;
    if (abs_sum > 0.0) b.value = sum / abs_sum;
    return b;
  }
};

// The GPU path takes device pointers: there the host tensors are staged (attention/cuda.hpp).
void forward_on_device(const ForwardArgs& a, const AttentionOptions& opt) {
  opt.device == Device::cuda ? cuda::forward_from_host(a, opt) : attention_forward(a, opt);
}
void delta_on_device(const BackwardArgs& a, const AttentionOptions& opt, float* delta) {
  opt.device == Device::cuda ? cuda::delta_from_host(a, opt, delta) : attention_delta(a, opt, delta);
}

}  // namespace

std::vector<AuditResult> audit_case(const AuditCase& c, const std::vector<AuditVariant>& variants,
                                    const std::vector<DeltaSource>& delta_sources, const PolicyParams& params) {
  const AuditInputs in = generate_audit_inputs(c);
  const AttentionShape& s = in.shape;
  const int D = s.head_dim;
  const std::size_t n = std::size_t(s.q_elements()), rows = std::size_t(s.rows());

  AttentionOptions base;
  base.tile_q = base.tile_k = c.tile;
  ForwardArgs fa;
  fa.shape = s;
  fa.q = in.q.data(), fa.k = in.k.data(), fa.v = in.v.data();
  const ReferenceForward ref = reference_forward(fa, base);
  std::vector<double> ref_delta(rows, 0.0);
  for (std::size_t r = 0; r < rows; ++r)
    for (int d = 0; d < D; ++d) ref_delta[r] += double(in.d_o[r * D + d].to_float()) * ref.o[r * D + d];

  std::vector<AuditResult> out;
  std::vector<bf16> o(n), residual(n);
  std::vector<float> lse(rows), delta(rows);
  for (const AuditVariant& var : variants) {
    AttentionOptions opt = base;
    opt.numerics = var.numerics, opt.policy = var.policy, opt.policy_params = params;
    opt.normalizer = var.normalizer, opt.round_bits = var.round_bits, opt.device = var.device;
    AuditResult r;
    r.c = c, r.variant = var, r.policy_params = params, r.remainder_achieved = in.remainder_achieved;
    fa.o = o.data(), fa.lse = lse.data(), fa.o_residual = residual.data(), fa.ties = &r.ties;
    forward_on_device(fa, opt);

    BiasSum o_bias;
    double ulp_sum = 0.0, e2 = 0.0, ref2 = 0.0;
    for (std::size_t row = 0; row < rows; ++row) {
      double row_max = 0.0, ref_max = 0.0;
      for (int d = 0; d < D; ++d) {
        const double x = o[row * D + d].to_float(), xr = ref.o[row * D + d];
        if (!std::isfinite(x)) {
          ++r.nonfinite;
          continue;
        }
        row_max = std::max(row_max, std::fabs(x)), ref_max = std::max(ref_max, std::fabs(xr));
        const double e = x - xr;
        e2 += e * e, ref2 += xr * xr;
        if (d < D / 2) {
          o_bias.add(e);
          ulp_sum += e / bf16_ulp(xr);
        }
      }
      r.zeroed_rows += row_max < kCollapsed * ref_max;
    }
    r.o_bias = o_bias.bias();
    r.mean_err_ulp = o_bias.count ? ulp_sum / double(o_bias.count) : 0.0;
    r.rel_l2 = ref2 > 0.0 ? std::sqrt(e2 / ref2) : 0.0;

    for (DeltaSource src : delta_sources) {
      opt.delta_source = src;
      BackwardArgs ba;
      ba.shape = s;
      ba.q = in.q.data(), ba.k = in.k.data(), ba.v = in.v.data(), ba.o = o.data(), ba.lse = lse.data();
      ba.o_residual = residual.data(), ba.d_o = in.d_o.data();
      delta_on_device(ba, opt, delta.data());
      BiasSum db;
      double de2 = 0.0, dref2 = 0.0, ref_abs = 0.0;
      for (std::size_t row = 0; row < rows; ++row) {
        if (!std::isfinite(delta[row])) continue;
        const double e = double(delta[row]) - ref_delta[row];
        db.add(e);
        de2 += e * e, dref2 += ref_delta[row] * ref_delta[row], ref_abs += std::fabs(ref_delta[row]);
      }
      r.deltas.push_back({src, db.bias(), ref_abs > 0.0 ? db.sum / ref_abs : 0.0, dref2 > 0.0 ? std::sqrt(de2 / dref2) : 0.0});
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace stableflash::diag
