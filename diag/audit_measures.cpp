// Running one audit case in every variant and measuring it against the FP64 reference.
#include <algorithm>
#include <cmath>
#include <stdexcept>
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

// Sums of e and |e| over a selection, overall and per row (rows are the unit of the standard error).
struct BiasSum {
  double sum = 0.0, abs_sum = 0.0;
  std::int64_t count = 0;
  std::vector<double> row_sum, row_abs;
  double r_sum = 0.0, r_abs = 0.0;
  bool row_open = false;
  void add(double e) {
    sum += e, abs_sum += std::fabs(e), ++count;
    r_sum += e, r_abs += std::fabs(e), row_open = true;
  }
  void end_row() {
    if (row_open) row_sum.push_back(r_sum), row_abs.push_back(r_abs);
    r_sum = r_abs = 0.0, row_open = false;
  }
  Bias bias() const {
    Bias b;
    b.count = count;
    if (abs_sum > 0.0) b.value = sum / abs_sum, b.se = ratio_standard_error(row_sum, row_abs);
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

std::optional<double> ratio_standard_error(std::span<const double> a, std::span<const double> b) {
  const std::size_t n = a.size();
  if (n != b.size()) throw std::invalid_argument("ratio_standard_error: a and b differ in length");
  if (n < 2) return std::nullopt;
  double sa = 0.0, sb = 0.0;
  for (std::size_t r = 0; r < n; ++r) sa += a[r], sb += b[r];
  if (!(sb > 0.0)) return std::nullopt;
  const double R = sa / sb;
  double ss = 0.0;
  for (std::size_t r = 0; r < n; ++r) ss += (a[r] - R * b[r]) * (a[r] - R * b[r]);
  return std::sqrt(double(n) / double(n - 1) * ss) / sb;
}

OutputMeasure measure_output(std::span<const double> o, std::span<const double> o_ref, int D, int selected_features) {
  if (D < 1 || o.size() != o_ref.size() || o.size() % std::size_t(D) != 0)
    throw std::invalid_argument("measure_output: o and o_ref must both be [rows, D]");
  const std::size_t rows = o.size() / std::size_t(D);
  OutputMeasure m;
  BiasSum o_bias;
  double ulp_sum = 0.0, e2 = 0.0, ref2 = 0.0;
  for (std::size_t row = 0; row < rows; ++row) {
    double row_max = 0.0, ref_max = 0.0;
    for (int d = 0; d < D; ++d) {
      const double x = o[row * D + d], xr = o_ref[row * D + d];
      if (!std::isfinite(x)) {
        ++m.nonfinite;
        continue;
      }
      row_max = std::max(row_max, std::fabs(x)), ref_max = std::max(ref_max, std::fabs(xr));
      const double e = x - xr;
      e2 += e * e, ref2 += xr * xr;
      if (d < selected_features) {
        o_bias.add(e);
        ulp_sum += e / bf16_ulp(xr);
      }
    }
    o_bias.end_row();
    m.zeroed_rows += row_max < kCollapsed * ref_max;
  }
  m.o_bias = o_bias.bias();
  m.mean_err_ulp = o_bias.count ? ulp_sum / double(o_bias.count) : 0.0;
  m.rel_l2 = ref2 > 0.0 ? std::sqrt(e2 / ref2) : 0.0;
  return m;
}

std::vector<double> rowsum_products(std::span<const bf16> d_o, std::span<const double> x, int D) {
  if (D < 1 || d_o.size() != x.size() || x.size() % std::size_t(D) != 0)
    throw std::invalid_argument("rowsum_products: d_o and x must both be [rows, D]");
  const std::size_t rows = x.size() / std::size_t(D);
  std::vector<double> out(rows, 0.0);
  for (std::size_t r = 0; r < rows; ++r)
    for (int d = 0; d < D; ++d) out[r] += double(d_o[r * D + d].to_float()) * x[r * D + d];
  return out;
}

DeltaMeasure measure_delta(DeltaSource source, std::span<const double> delta, std::span<const double> delta_ref) {
  if (delta.size() != delta_ref.size()) throw std::invalid_argument("measure_delta: delta and delta_ref differ in length");
  BiasSum db;
  double de2 = 0.0, dref2 = 0.0, ref_abs = 0.0;
  std::vector<double> row_ref_abs;  // |delta_ref| of the rows behind db.row_sum (the drift's denominator)
  for (std::size_t row = 0; row < delta.size(); ++row) {
    if (!std::isfinite(delta[row])) continue;
    const double e = delta[row] - delta_ref[row];
    db.add(e);
    db.end_row();
    row_ref_abs.push_back(std::fabs(delta_ref[row]));
    de2 += e * e, dref2 += delta_ref[row] * delta_ref[row], ref_abs += std::fabs(delta_ref[row]);
  }
  DeltaMeasure m{source, db.bias(), ref_abs > 0.0 ? db.sum / ref_abs : 0.0, std::nullopt, dref2 > 0.0 ? std::sqrt(de2 / dref2) : 0.0};
  m.drift_se = ratio_standard_error(db.row_sum, row_ref_abs);
  return m;
}

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
  const std::vector<double> ref_delta = rowsum_products(in.d_o, ref.o, D);

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
    forward_on_device(fa, opt);  // on the GPU: the outputs of a call without counters (cuda.hpp)

    std::vector<double> o64(n);  // BF16 -> FP64 is exact
    for (std::size_t i = 0; i < n; ++i) o64[i] = o[i].to_float();
    const OutputMeasure m = measure_output(o64, ref.o, D, skewed_features(D));
    r.o_bias = m.o_bias, r.mean_err_ulp = m.mean_err_ulp, r.rel_l2 = m.rel_l2;
    r.nonfinite = m.nonfinite, r.zeroed_rows = m.zeroed_rows;

    for (DeltaSource src : delta_sources) {
      opt.delta_source = src;
      BackwardArgs ba;
      ba.shape = s;
      ba.q = in.q.data(), ba.k = in.k.data(), ba.v = in.v.data(), ba.o = o.data(), ba.lse = lse.data();
      ba.o_residual = residual.data(), ba.d_o = in.d_o.data();
      delta_on_device(ba, opt, delta.data());
      r.deltas.push_back(measure_delta(src, std::vector<double>(delta.begin(), delta.end()), ref_delta));
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace stableflash::diag
