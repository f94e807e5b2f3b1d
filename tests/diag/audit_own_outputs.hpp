// Test helper: our own CPU attention run on an export's inputs and written in the import layout
// (DIR/NAME/<case>.safetensors, o BF16 [1, heads, T, D]), as an outside implementation would.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "stableflash/attention/attention.hpp"
#include "stableflash/data/safetensors.hpp"
#include "stableflash/diag/audit_io.hpp"

namespace stableflash::diag::testing {

inline void write_own_outputs(const std::string& dir, const std::string& name, const AuditVariant& var,
                              const attention::PolicyParams& params = {}) {
  namespace fs = std::filesystem;
  fs::create_directories(fs::path(dir) / name);
  for (const ExportedCase& e : read_manifest(dir).cases) {
    const auto in = data::SafetensorsFile::read((fs::path(dir) / e.inputs).string());
    const auto q = in.find("q")->as<bf16>(), k = in.find("k")->as<bf16>(), v = in.find("v")->as<bf16>();
    attention::AttentionOptions opt;  // as audit_case sets them
    opt.tile_q = opt.tile_k = e.c.tile;
    opt.numerics = var.numerics, opt.policy = var.policy, opt.policy_params = params;
    opt.normalizer = var.normalizer, opt.round_bits = var.round_bits;
    attention::ForwardArgs fa;
    fa.shape = {1, e.c.heads, e.c.T, e.c.T, e.c.D};
    std::vector<bf16> o(q.size()), residual(q.size());
    std::vector<float> lse(std::size_t(e.c.heads) * e.c.T);
    attention::TieCounts ties;
    fa.q = q.data(), fa.k = k.data(), fa.v = v.data();
    fa.o = o.data(), fa.lse = lse.data(), fa.o_residual = residual.data(), fa.ties = &ties;
    attention::attention_forward(fa, opt);
    data::SafetensorsFile out;
    out.tensors["o"] = data::Tensor::from<bf16>(data::DType::bf16, {1, e.c.heads, e.c.T, e.c.D}, o);
    out.write(output_path(dir, name, e.id));
  }
}

}  // namespace stableflash::diag::testing
