// The audit's grids: the small default (under a minute on 2 cores) and the full one, and their
// expansion into cases and variants.
#include <sstream>

#include "stableflash/diag/audit.hpp"

namespace stableflash::diag {

using namespace stableflash::attention;

AuditGrid AuditGrid::default_grid() {
  AuditGrid g;
  g.ties = {1, 2, 3, 4};
  g.remainder = {0.0, 1e-4, 1e-2};
  g.v_neg = {0.9};
  g.do_neg = {0.9};
  g.logit_scale = {8.0, 60.0, 1e4};
  g.spread = {1.0};
  g.T = {256};
  g.D = {64};
  g.tile = {256, 64};
  g.cross_tile = {false};
  g.heads = {2};
  g.numerics = {Numerics::paper, Numerics::fused};
  g.policies = {ShiftPolicy::standard, ShiftPolicy::paper, ShiftPolicy::hashed_offset};
  g.normalizers = {Normalizer::fp32};
  g.round_bits = {7};
  g.delta_sources = {DeltaSource::rounded, DeltaSource::compensated, DeltaSource::exact};
  return g;
}

AuditGrid AuditGrid::full_grid() {
  AuditGrid g = default_grid();
  g.remainder = {0.0, 1e-5, 1e-4, 1e-3, 1e-2, 0.1};
  g.logit_scale = {-60.0, 0.0, 8.0, 60.0, 1e4};
  g.spread = {0.0, 1.0};
  g.D = {64, 128};
  g.cross_tile = {false, true};
  g.policies = {ShiftPolicy::standard, ShiftPolicy::paper, ShiftPolicy::hashed_offset, ShiftPolicy::fixed_offset};
  g.normalizers = {Normalizer::fp32, Normalizer::bf16};
  return g;
}

std::vector<AuditCase> AuditGrid::cases() const {
  std::vector<AuditCase> out;
  for (int t : T)
    for (int d : D)
      for (int bc : tile)
        for (bool cross : cross_tile)
          for (int n : ties) {
            // cross-tile placement needs one tie per tile, in distinct tiles
            if (cross && (n < 2 || bc >= t || std::int64_t(n - 1) * bc >= t)) continue;
            for (double sp : spread)
              for (double L : logit_scale)
                for (double rem : remainder)
                  for (double vn : v_neg)
                    for (double dn : do_neg)
                      for (int hh : heads) {
                        AuditCase c;
                        c.ties = n, c.remainder = rem, c.v_neg = vn, c.do_neg = dn, c.logit_scale = L;
                        c.spread = sp, c.T = t, c.D = d, c.tile = bc, c.cross_tile = cross, c.heads = hh, c.seed = seed;
                        out.push_back(c);
                      }
          }
  return out;
}

std::vector<AuditVariant> AuditGrid::variants() const {
  std::vector<AuditVariant> out;
  for (Numerics n : numerics)
    for (ShiftPolicy p : policies)
      for (Normalizer norm : normalizers) {
        // the normalizer is a knob of fused numerics only
        if (n != Numerics::fused && norm != Normalizer::fp32) continue;
        for (int bits : round_bits) out.push_back({n, p, norm, bits, device});
      }
  return out;
}

namespace {

template <class T, class F>
std::string join(const std::vector<T>& xs, F fmt) {
  std::ostringstream s;
  for (std::size_t i = 0; i < xs.size(); ++i) s << (i ? "," : "") << fmt(xs[i]);
  return s.str();
}

std::string plain(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

}  // namespace

std::string AuditGrid::describe() const {
  auto num = [](auto x) { return plain(double(x)); };
  auto name = [](auto x) { return std::string(to_string(x)); };
  std::ostringstream s;
  s << "--ties " << join(ties, num) << " --remainder " << join(remainder, num) << " --v-neg " << join(v_neg, num)
    << " --do-neg " << join(do_neg, num) << " --logit-scale " << join(logit_scale, num) << " --spread "
    << join(spread, num) << " --T " << join(T, num) << " --D " << join(D, num) << " --tile " << join(tile, num)
    << " --cross-tile " << join(cross_tile, [](bool b) { return b ? "yes" : "no"; }) << " --heads " << join(heads, num)
    << " --numerics " << join(numerics, name) << " --policy " << join(policies, name) << " --normalizer "
    << join(normalizers, name) << " --round-bits " << join(round_bits, num) << " --delta-source "
    << join(delta_sources, name) << " --beta " << plain(policy_params.beta) << " --eps " << plain(policy_params.eps)
    << " --seed " << seed;
  if (device != Device::cpu) s << " --device " << to_string(device);
  return s.str();
}

std::vector<AuditResult> run_audit(const AuditGrid& grid, const std::function<void(int, int)>& progress) {
  const std::vector<AuditCase> cs = grid.cases();
  const std::vector<AuditVariant> vs = grid.variants();
  std::vector<AuditResult> out;
  int done = 0;
  for (const AuditCase& c : cs) {
    for (AuditResult& r : audit_case(c, vs, grid.delta_sources, grid.policy_params)) out.push_back(std::move(r));
    if (progress) progress(++done, int(cs.size()));
  }
  return out;
}

}  // namespace stableflash::diag
