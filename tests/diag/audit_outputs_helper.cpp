// `audit_outputs_helper DIR NAME NUMERICS POLICY`: writes our CPU outputs for an export in the
// import layout, for the command-line test of `audit --import`.
#include <cstdio>
#include <exception>

#include "audit_own_outputs.hpp"
#include "stableflash/attention/modes.hpp"

int main(int argc, char** argv) {
  using namespace stableflash;
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s DIR NAME NUMERICS POLICY\n", argv[0]);
    return 2;
  }
  const auto n = attention::parse_numerics(argv[3]);
  const auto p = attention::parse_shift_policy(argv[4]);
  if (!n || !p) {
    std::fprintf(stderr, "bad numerics or policy\n");
    return 2;
  }
  try {
    diag::AuditVariant var;
    var.numerics = *n, var.policy = *p;
    diag::testing::write_own_outputs(argv[1], argv[2], var);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
