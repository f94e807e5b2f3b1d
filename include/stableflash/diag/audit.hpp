// The rounding-bias audit (docs/numerics-contract.md "The audit's measures"): generates attention inputs with
// tied row maxima, a controlled remainder mass and sign-skewed V and dO from a seed, runs every
// (numerics x policy x delta source), and measures the bias of O and of delta against the FP64
// reference.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "stableflash/attention/attention.hpp"
#include "stableflash/numerics/bf16.hpp"

namespace stableflash::diag {

// One generated input, described by parameters a user can read (docs/numerics-contract.md).
struct AuditCase {
  int ties = 2;               // keys sharing each row's maximum (exactly equal scores)
  double remainder = 1e-4;    // target FP64 softmax mass outside the ties, spread over the non-tied
                              // keys of the ties' tile(s)
  double v_neg = 0.9;         // probability that a V entry of a skewed feature is negative
  double do_neg = 0.9;        // the same for dO (the delta mechanism needs both)
  double logit_scale = 8.0;   // the typical row maximum of S
  double spread = 1.0;        // row maxima are spread uniformly over logit_scale +- spread/2
  int T = 256;                // query and key length
  int D = 64;                 // head dim (>= 5); the first D/2 features carry the sign skew
  int tile = 256;             // key-tile width Bc (and query tile)
  bool cross_tile = false;    // put each tied key in a different key tile
  int heads = 2;              // independent heads (rows = heads * T)
  std::uint64_t seed = 0;
};

// The variants run on every case.
struct AuditVariant {
  attention::Numerics numerics = attention::Numerics::paper;
  attention::ShiftPolicy policy = attention::ShiftPolicy::standard;
  attention::Normalizer normalizer = attention::Normalizer::fp32;
  int round_bits = 7;
  attention::Device device = attention::Device::cpu;  // cuda: the variant runs on the GPU (staged tensors)
};

struct AuditGrid {
  std::vector<int> ties, T, D, tile, heads;
  std::vector<double> remainder, v_neg, do_neg, logit_scale, spread;
  std::vector<bool> cross_tile;
  std::vector<attention::Numerics> numerics;
  std::vector<attention::ShiftPolicy> policies;
  std::vector<attention::Normalizer> normalizers;
  std::vector<int> round_bits;
  std::vector<attention::DeltaSource> delta_sources;
  attention::PolicyParams policy_params;
  std::uint64_t seed = 0;
  attention::Device device = attention::Device::cpu;  // where every variant runs

  static AuditGrid default_grid();  // small: finishes in under a minute on 2 cores
  static AuditGrid full_grid();     // the rest of the space
  std::vector<AuditCase> cases() const;
  std::vector<AuditVariant> variants() const;
  std::string describe() const;  // the grid as a user reads and overrides it (flags)
};

// Generated inputs of one case, [1, heads, T, D] head-major BF16.
struct AuditInputs {
  std::vector<bf16> q, k, v, d_o;
  attention::AttentionShape shape;
  double remainder_achieved = 0.0;  // mean over rows, FP64 from the actual BF16 inputs
};
AuditInputs generate_audit_inputs(const AuditCase& c);

// A bias summary: mean(e) / mean|e| over a selection; null when mean|e| is 0.
struct Bias {
  std::optional<double> value;
  std::optional<double> se;  // delta-method standard error over rows (ratio_standard_error); null below 2 rows
  std::int64_t count = 0;    // elements (O) or rows (delta) behind it
};

// The standard error of R = sum(a) / sum(b) with rows as the sampling unit (a_r = sum of e over
// the row's selected elements, b_r = sum of |e|): the delta method for a ratio estimator,
// SE = sqrt(n / (n - 1) * sum_r (a_r - R b_r)^2) / sum(b). Null when n < 2 or sum(b) = 0.
std::optional<double> ratio_standard_error(std::span<const double> a, std::span<const double> b);

struct DeltaMeasure {
  attention::DeltaSource source;
  Bias bias;                  // sign consistency of the error: scale-free
  double drift = 0.0;         // mean(e) / mean|delta_ref|: the systematic part training accumulates
  std::optional<double> drift_se;  // its standard error over rows (ratio_standard_error of e and |delta_ref|)
  double rel_l2 = 0.0;        // ||e|| / ||delta_ref||
};

struct AuditResult {
  AuditCase c;
  AuditVariant variant;
  attention::PolicyParams policy_params;
  double remainder_achieved = 0.0;
  Bias o_bias;                  // over the sign-skewed features
  double mean_err_ulp = 0.0;    // mean(e / ulp_bf16(O_ref)) over the same selection
  double rel_l2 = 0.0;          // ||e|| / ||O_ref|| over all of O
  std::int64_t nonfinite = 0;   // non-finite O elements
  std::int64_t zeroed_rows = 0; // rows whose |O| collapsed below 1e-6 of the reference row's
  attention::TieCounts ties;
  std::vector<DeltaMeasure> deltas;
};

// The measures of one output against the FP64 reference (docs/numerics-findings.md), shared by the
// audit and `audit --import` so that both tables come from the same code. Tensors are [rows, D].
struct OutputMeasure {
  Bias o_bias;                  // over the first `selected_features` features of every row
  double mean_err_ulp = 0.0;    // mean(e / ulp_bf16(O_ref)) over the same selection
  double rel_l2 = 0.0;          // ||e|| / ||O_ref|| over all finite elements
  std::int64_t nonfinite = 0;
  std::int64_t zeroed_rows = 0;
};
OutputMeasure measure_output(std::span<const double> o, std::span<const double> o_ref, int D, int selected_features);
// delta = rowsum(d_o * x) in FP64, d before d+1: the reference delta (x = O_ref) and the delta of a
// given output (x = its O).
std::vector<double> rowsum_products(std::span<const bf16> d_o, std::span<const double> x, int D);
// The delta measures over every row with a finite delta.
DeltaMeasure measure_delta(attention::DeltaSource source, std::span<const double> delta, std::span<const double> delta_ref);
// The features of O the O bias is taken over: the first D/2, where V carries the sign skew.
inline int skewed_features(int D) { return D / 2; }

// Runs the grid; `progress(done, total)` is called after each case.
std::vector<AuditResult> run_audit(const AuditGrid& grid, const std::function<void(int, int)>& progress = {});

// Runs one case in every given variant (shared by run_audit and the tests).
std::vector<AuditResult> audit_case(const AuditCase& c, const std::vector<AuditVariant>& variants,
                                    const std::vector<attention::DeltaSource>& delta_sources,
                                    const attention::PolicyParams& params);

// One JSON object per (result x delta source), as docs/numerics-contract.md lists the fields.
std::vector<std::string> to_json_lines(const AuditResult& r);
// A readable table of all results, grouped by case.
std::string format_table(const std::vector<AuditResult>& results);

}  // namespace stableflash::diag
