// `stableflash attention IN.safetensors -o OUT.safetensors`: runs attention on tensors from a file.
#include <cstdio>
#include <stdexcept>
#include <string>

#include "attention_flags.hpp"
#include "commands.hpp"
#include "stableflash/attention/attention.hpp"
#include "stableflash/attention/cuda.hpp"
#include "stableflash/data/file_checks.hpp"
#include "stableflash/data/safetensors.hpp"

namespace stableflash::cli {
namespace {

using namespace stableflash::attention;
using data::DType;
using data::SafetensorsFile;
using data::Tensor;

struct AttentionCommand {
  std::string input, output;
  AttentionFlags flags;
  bool strict = false;
};

// "o 64, lse 1" for the tensors of `f` holding NaN or Inf, and their total.
std::pair<std::int64_t, std::string> non_finite_summary(const SafetensorsFile& f) {
  std::int64_t total = 0;
  std::string where;
  for (const auto& [name, t] : f.tensors)
    if (const std::int64_t n = data::count_non_finite(t); n > 0)
      total += n, where += (where.empty() ? "" : ", ") + name + " " + std::to_string(n);
  return {total, where};
}

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

const Tensor& bf16_rank4(const SafetensorsFile& f, const std::string& file, const std::string& name, const char* dims) {
  const Tensor* t = f.find(name);
  if (!t) throw std::invalid_argument(file + ": missing tensor '" + name + "' (expected BF16 " + dims + ")");
  if (t->dtype != DType::bf16)
    throw std::invalid_argument(file + ": tensor '" + name + "' has dtype " + std::string(data::dtype_name(t->dtype)) +
                                ", expected BF16 (e.g. x.to(torch.bfloat16))");
  if (t->shape.size() != 4)
    throw std::invalid_argument(file + ": tensor '" + name + "' has shape " + shape_str(t->shape) + ", expected rank 4 " + dims);
  return *t;
}

// Reads the shape from q and k in the given layout and checks v and do against it. k and v may
// have fewer heads than q (grouped-query / multi-query attention) when their count divides q's.
AttentionShape infer_shape(const SafetensorsFile& f, const std::string& file, Layout layout) {
  const bool bthd = layout == Layout::bthd;
  const char* qdims = bthd ? "[B, Tq, H, D]" : "[B, H, Tq, D]";
  const char* kdims = bthd ? "[B, Tk, H_kv, D]" : "[B, H_kv, Tk, D]";
  const Tensor& q = bf16_rank4(f, file, "q", qdims);
  const Tensor& k = bf16_rank4(f, file, "k", kdims);
  const Tensor& v = bf16_rank4(f, file, "v", kdims);
  const int t_axis = bthd ? 1 : 2, h_axis = bthd ? 2 : 1;
  AttentionShape s{int(q.shape[0]), int(q.shape[h_axis]), int(q.shape[t_axis]), int(k.shape[t_axis]), int(q.shape[3])};
  s.kv_heads = int(k.shape[h_axis]);
  if (k.shape[0] != q.shape[0] || k.shape[3] != q.shape[3])
    throw std::invalid_argument(file + ": tensor 'k' has shape " + shape_str(k.shape) + ", which does not match q " +
                                shape_str(q.shape) + " in B or D (layout " + std::string(to_string(layout)) + ")");
  if (k.shape[h_axis] < 1 || q.shape[h_axis] % k.shape[h_axis] != 0)
    throw std::invalid_argument(file + ": tensor 'k' has " + std::to_string(k.shape[h_axis]) + " heads, which does not divide q's " +
                                std::to_string(q.shape[h_axis]) + " (grouped-query attention needs kv_heads dividing heads; shapes k " +
                                shape_str(k.shape) + ", q " + shape_str(q.shape) + ", layout " + std::string(to_string(layout)) + ")");
  if (v.shape != k.shape)
    throw std::invalid_argument(file + ": tensor 'v' has shape " + shape_str(v.shape) + ", expected k's " + shape_str(k.shape));
  if (const Tensor* d = f.find("do")) {
    bf16_rank4(f, file, "do", qdims);
    if (d->shape != q.shape)
      throw std::invalid_argument(file + ": tensor 'do' has shape " + shape_str(d->shape) + ", expected q's " + shape_str(q.shape));
  }
  return s;
}

template <class T>
Tensor tensor_of(DType dt, std::vector<std::int64_t> shape, const std::vector<T>& values) {
  return Tensor::from<T>(dt, std::move(shape), std::span<const T>(values));
}

int run(const AttentionCommand& cmd) {
  const AttentionOptions opt = to_options(cmd.flags);
  const Layout layout = to_layout(cmd.flags);
  data::refuse_output_over_input(cmd.output, {cmd.input}, "-o");
  const SafetensorsFile in = SafetensorsFile::read(cmd.input);
  const AttentionShape s = infer_shape(in, cmd.input, layout);
  opt.validate(s);
  const auto& q_shape = in.find("q")->shape;
  const auto& k_shape = in.find("k")->shape;
  const std::vector<std::int64_t> lse_shape{s.batch, s.heads, s.q_len};
  const Tensor* d_o = in.find("do");

  ForwardArgs fa;
  fa.shape = s, fa.layout = layout;
  fa.q = in.find("q")->as<bf16>().data(), fa.k = in.find("k")->as<bf16>().data(), fa.v = in.find("v")->as<bf16>().data();
  BackwardArgs ba;
  ba.shape = s, ba.layout = layout, ba.q = fa.q, ba.k = fa.k, ba.v = fa.v;
  if (d_o) ba.d_o = d_o->as<bf16>().data();

  // --device cuda: the tensors are staged to the GPU and back (the library takes device pointers)
  const bool gpu = opt.device == Device::cuda;
  if (gpu && opt.numerics == Numerics::reference)
    throw std::invalid_argument("--device cuda: 'reference' numerics is the FP64 oracle and runs on the CPU");
  auto forward = [&](const ForwardArgs& a) { gpu ? cuda::forward_from_host(a, opt) : attention_forward(a, opt); };
  auto backward = [&](const BackwardArgs& a) { gpu ? cuda::backward_from_host(a, opt) : attention_backward(a, opt); };

  SafetensorsFile out;
  out.metadata = {{"numerics", std::string(to_string(opt.numerics))}, {"policy", std::string(to_string(opt.policy))},
                  {"layout", std::string(to_string(layout))},        {"causal", opt.causal ? "true" : "false"},
                  {"tile", std::to_string(opt.resolved_tile_q()) + "x" + std::to_string(opt.resolved_tile_k())},
                  {"delta_source", std::string(to_string(opt.resolved_delta_source(s)))},  // what ran
                  {"round_bits", std::to_string(opt.round_bits)},
                  {"normalizer", std::string(to_string(opt.normalizer))},
                  {"device", gpu ? cuda::device_name() : std::string("cpu")}};
  if (opt.numerics == Numerics::reference) {
    const ReferenceForward f = reference_forward(fa, opt);
    out.tensors["o"] = tensor_of(DType::f64, q_shape, f.o);
    out.tensors["lse"] = tensor_of(DType::f64, lse_shape, f.lse);
    if (d_o) {
      const ReferenceBackward b = reference_backward(ba, opt);
      out.tensors["dq"] = tensor_of(DType::f64, q_shape, b.dq);
      out.tensors["dk"] = tensor_of(DType::f64, k_shape, b.dk);
      out.tensors["dv"] = tensor_of(DType::f64, k_shape, b.dv);
      out.tensors["delta"] = tensor_of(DType::f64, lse_shape, b.delta);
    }
  } else {
    std::vector<bf16> o(std::size_t(s.q_elements())), residual(opt.needs_residual(s) ? o.size() : 0);
    std::vector<float> lse(std::size_t(s.rows()));
    TieCounts ties;
    fa.o = o.data(), fa.lse = lse.data(), fa.o_residual = residual.empty() ? nullptr : residual.data(), fa.ties = &ties;
    forward(fa);
    out.tensors["o"] = tensor_of(DType::bf16, q_shape, o);
    out.tensors["lse"] = tensor_of(DType::f32, lse_shape, lse);
    if (!residual.empty()) out.tensors["o_residual"] = tensor_of(DType::bf16, q_shape, residual);
    if (d_o) {
      std::vector<bf16> dq(o.size()), dk(std::size_t(s.k_elements())), dv(dk.size());
      std::vector<float> delta(lse.size());
      ba.o = o.data(), ba.lse = lse.data(), ba.o_residual = fa.o_residual;
      ba.dq = dq.data(), ba.dk = dk.data(), ba.dv = dv.data(), ba.delta = delta.data();
      backward(ba);
      out.tensors["dq"] = tensor_of(DType::bf16, q_shape, dq);
      out.tensors["dk"] = tensor_of(DType::bf16, k_shape, dk);
      out.tensors["dv"] = tensor_of(DType::bf16, k_shape, dv);
      out.tensors["delta"] = tensor_of(DType::f32, lse_shape, delta);
    }
    std::fprintf(stderr, "rows: %lld, tie events: %lld, repeated maxima: %lld, policy fallbacks: %lld, fully masked: %lld\n",
                 static_cast<long long>(ties.rows), static_cast<long long>(ties.tie_event_rows),
                 static_cast<long long>(ties.repeated_max_rows), static_cast<long long>(ties.fallback_rows),
                 static_cast<long long>(ties.masked_rows));
  }
  // NaN/Inf come from non-finite inputs or from finite inputs whose logits overflow FP32; either
  // way the user is told, since a NaN tensor in a file otherwise looks like any other.
  const auto [bad_out, bad_out_where] = non_finite_summary(out);
  if (bad_out > 0) {
    const auto [bad_in, bad_in_where] = non_finite_summary(in);
    const std::string what = std::to_string(bad_out) + " non-finite output values (" + bad_out_where + "); " +
                             (bad_in > 0 ? "the input holds " + std::to_string(bad_in) + " (" + bad_in_where + ")"
                                         : std::string("the inputs are finite, so some logits overflow FP32 (scale q or k down)"));
    if (cmd.strict) throw std::runtime_error(cmd.input + ": " + what + "; --strict: " + cmd.output + " not written");
    std::fprintf(stderr, "stableflash: warning: %s\n", what.c_str());
  }
  out.write(cmd.output);
  std::string names;
  for (const auto& [name, t] : out.tensors) names += (names.empty() ? "" : ", ") + name;
  std::printf("wrote %s to %s (%s numerics, %s policy, tile %dx%d), non-finite outputs: %lld\n", names.c_str(), cmd.output.c_str(),
              std::string(to_string(opt.numerics)).c_str(), std::string(to_string(opt.policy)).c_str(),
              opt.resolved_tile_q(), opt.resolved_tile_k(), static_cast<long long>(bad_out));
  return 0;
}

}  // namespace

Runner add_attention_command(CLI::App& app) {
  auto cmd = std::make_shared<AttentionCommand>();
  CLI::App* sub = app.add_subcommand(
      "attention", "Attention forward (and backward when the input holds 'do') on q, k, v from a safetensors file");
  sub->add_option("input", cmd->input, "Input safetensors with BF16 q, k, v (and optional do)")->required()->check(CLI::ExistingFile);
  sub->add_option("-o,--output", cmd->output, "Output safetensors: o, lse (and dq, dk, dv, delta)")->required();
  sub->add_flag("--strict", cmd->strict, "Fail (exit 1, nothing written) when an output holds NaN or Inf, instead of a warning");
  add_attention_flags(*sub, cmd->flags);
  return [cmd] { return run(*cmd); };
}

}  // namespace stableflash::cli
