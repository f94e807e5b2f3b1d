// The audit's two outputs: JSON Lines for machines, a grouped table for people.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "stableflash/diag/audit.hpp"

namespace stableflash::diag {
namespace {

using json = nlohmann::json;
using namespace stableflash::attention;

json bias_json(const Bias& b) { return b.value ? json(*b.value) : json(nullptr); }

std::string fmt_bias(const Bias& b) {
  char buf[16];
  if (!b.value) return "   null";
  std::snprintf(buf, sizeof buf, "%+7.3f", *b.value);
  return buf;
}

std::string pct(std::int64_t n, std::int64_t total) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%5.1f%%", total ? 100.0 * double(n) / double(total) : 0.0);
  return buf;
}

bool same_case(const AuditCase& a, const AuditCase& b) {
  return a.ties == b.ties && a.remainder == b.remainder && a.v_neg == b.v_neg && a.do_neg == b.do_neg &&
         a.logit_scale == b.logit_scale && a.spread == b.spread && a.T == b.T && a.D == b.D && a.tile == b.tile &&
         a.cross_tile == b.cross_tile && a.heads == b.heads && a.seed == b.seed;
}

}  // namespace

std::vector<std::string> to_json_lines(const AuditResult& r) {
  std::vector<std::string> lines;
  const double rows = double(r.ties.rows ? r.ties.rows : 1);
  for (const DeltaMeasure& d : r.deltas) {
    json j = {{"numerics", to_string(r.variant.numerics)},
              {"policy", to_string(r.variant.policy)},
              {"delta_source", to_string(d.source)},
              {"normalizer", to_string(r.variant.normalizer)},
              {"round_bits", r.variant.round_bits},
              {"beta", r.policy_params.beta},
              {"eps", r.policy_params.eps},
              {"ties", r.c.ties},
              {"remainder", r.c.remainder},
              {"remainder_achieved", r.remainder_achieved},
              {"v_neg", r.c.v_neg},
              {"do_neg", r.c.do_neg},
              {"logit_scale", r.c.logit_scale},
              {"spread", r.c.spread},
              {"T", r.c.T},
              {"D", r.c.D},
              {"tile", r.c.tile},
              {"cross_tile", r.c.cross_tile},
              {"heads", r.c.heads},
              {"seed", r.c.seed},
              {"o_bias", bias_json(r.o_bias)},
              {"o_bias_se", r.o_bias.se ? json(*r.o_bias.se) : json(nullptr)},
              {"o_bias_count", r.o_bias.count},
              {"delta_bias", bias_json(d.bias)},
              {"delta_bias_se", d.bias.se ? json(*d.bias.se) : json(nullptr)},
              {"delta_bias_count", d.bias.count},
              {"delta_drift", d.drift},
              {"delta_drift_se", d.drift_se ? json(*d.drift_se) : json(nullptr)},
              {"delta_rel_l2", d.rel_l2},
              {"mean_err_ulp", r.mean_err_ulp},
              {"rel_l2", r.rel_l2},
              {"nonfinite", r.nonfinite},
              {"zeroed_rows", r.zeroed_rows},
              {"tie_rows", double(r.ties.tie_event_rows) / rows},
              {"repeated_max_rows", double(r.ties.repeated_max_rows) / rows},
              {"fallback_rows", double(r.ties.fallback_rows) / rows},
              {"rows", r.ties.rows}};
    lines.push_back(j.dump());
  }
  return lines;
}

std::string format_table(const std::vector<AuditResult>& results) {
  std::ostringstream out;
  const AuditResult* prev = nullptr;
  char line[512];
  for (const AuditResult& r : results) {
    if (!prev || !same_case(prev->c, r.c)) {
      std::snprintf(line, sizeof line,
                    "\nties=%d remainder=%g (achieved %.3g) logit_scale=%g spread=%g T=%d D=%d tile=%d%s v_neg=%g "
                    "do_neg=%g heads=%d seed=%llu\n",
                    r.c.ties, r.c.remainder, r.remainder_achieved, r.c.logit_scale, r.c.spread, r.c.T, r.c.D, r.c.tile,
                    r.c.cross_tile ? " cross-tile" : "", r.c.v_neg, r.c.do_neg, r.c.heads,
                    static_cast<unsigned long long>(r.c.seed));
      out << line;
      out << "  numerics  policy         norm bits   O bias  err ulp    rel L2 |";
      for (const DeltaMeasure& d : r.deltas) {
        std::snprintf(line, sizeof line, " delta %-11s        |", std::string(to_string(d.source)).c_str());
        out << line;
      }
      out << " nonfin zeroed  tie rows  rep.max  fallback\n";
      out << "                                                             |";
      for (std::size_t i = 0; i < r.deltas.size(); ++i) out << "    bias    drift      |";
      out << "\n";
    }
    std::snprintf(line, sizeof line, "  %-8s  %-13s  %-4s %4d  %s %+8.3f  %8.2e |", std::string(to_string(r.variant.numerics)).c_str(),
                  std::string(to_string(r.variant.policy)).c_str(), std::string(to_string(r.variant.normalizer)).c_str(),
                  r.variant.round_bits, fmt_bias(r.o_bias).c_str(), r.mean_err_ulp, r.rel_l2);
    out << line;
    for (const DeltaMeasure& d : r.deltas) {
      std::snprintf(line, sizeof line, " %s  %+9.2e |", fmt_bias(d.bias).c_str(), d.drift);
      out << line;
    }
    std::snprintf(line, sizeof line, " %6lld %6lld    %s   %s    %s\n",
                  static_cast<long long>(r.nonfinite), static_cast<long long>(r.zeroed_rows),
                  pct(r.ties.tie_event_rows, r.ties.rows).c_str(), pct(r.ties.repeated_max_rows, r.ties.rows).c_str(),
                  pct(r.ties.fallback_rows, r.ties.rows).c_str());
    out << line;
    prev = &r;
  }
  return out.str();
}

}  // namespace stableflash::diag
