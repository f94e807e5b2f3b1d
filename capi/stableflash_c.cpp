// The C ABI (include/stableflash/capi/stableflash_c.h) over attention::attention_forward/backward:
// options through attention::set_option, tensor strides checked against what the C++ entry points
// take, and every exception turned into a return code and a message.
#include "stableflash/capi/stableflash_c.h"

#include <array>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "stableflash/attention/attention.hpp"
#include "stableflash/attention/option_text.hpp"

namespace sa = stableflash::attention;

struct sf_options {
  sa::AttentionOptions options;
};

namespace {

void put_error(char* err, std::size_t err_size, const std::string& message) {
  if (err && err_size > 0) std::snprintf(err, err_size, "%s", message.c_str());
}

// Runs f, mapping exceptions to the ABI's codes (nothing C++ may unwind through extern "C").
template <class F>
int guarded(char* err, std::size_t err_size, F&& f) {
  try {
    f();
    return SF_OK;
  } catch (const std::invalid_argument& e) {
    put_error(err, err_size, e.what());
    return SF_INVALID_ARGUMENT;
  } catch (const std::exception& e) {
    put_error(err, err_size, e.what());
    return SF_RUNTIME_ERROR;
  } catch (...) {
    put_error(err, err_size, "unknown error");
    return SF_RUNTIME_ERROR;
  }
}

sa::AttentionShape to_shape(const sf_shape* s) {
  if (!s) throw std::invalid_argument("shape: NULL");
  sa::AttentionShape out;
  out.batch = s->batch, out.heads = s->heads, out.kv_heads = s->kv_heads;
  out.q_len = s->q_len, out.k_len = s->k_len, out.head_dim = s->head_dim;
  if (out.batch < 1 || out.heads < 1 || out.q_len < 1 || out.k_len < 1 || out.head_dim < 1 || out.kv_heads < 0)
    throw std::invalid_argument("shape: batch, heads, q_len, k_len and head_dim must be >= 1 and kv_heads >= 0, got batch " +
                                std::to_string(out.batch) + ", heads " + std::to_string(out.heads) + ", kv_heads " +
                                std::to_string(out.kv_heads) + ", q_len " + std::to_string(out.q_len) + ", k_len " +
                                std::to_string(out.k_len) + ", head_dim " + std::to_string(out.head_dim));
  return out;
}

// One tensor argument: its name, pointer and strides, and the [B, heads, len, D] it must span.
struct Operand {
  const char* name;
  const sf_tensor* t;
  int heads, len;
};

std::string strides_text(std::int64_t b, std::int64_t h, std::int64_t t) {
  return "(" + std::to_string(b) + ", " + std::to_string(h) + ", " + std::to_string(t) + ")";
}

// A stride of a dimension of size 1 is never used, so it may be anything (as in PyTorch).
bool has_layout(const Operand& x, const sa::AttentionShape& s, sa::Layout layout) {
  const sa::HeadStrides want = sa::HeadStrides::of(layout, x.heads, x.len, s.head_dim);
  return (s.batch == 1 || x.t->stride_b == want.b) && (x.heads == 1 || x.t->stride_h == want.h) &&
         (x.len == 1 || x.t->stride_t == want.t);
}

// TODO(strides): the C++ attention takes one dense layout (bhtd or bthd) shared by every tensor
// of a call; once AttentionArgs carries per-tensor strides (another branch adds them), pass each
// operand's strides through instead of this check, and drop the copies the Python package makes.
sa::Layout common_layout(const std::vector<Operand>& xs, const sa::AttentionShape& s) {
  for (const Operand& x : xs)
    if (!x.t || !x.t->data) throw std::invalid_argument(std::string(x.name) + ": required, got NULL");
  for (sa::Layout layout : {sa::Layout::bhtd, sa::Layout::bthd}) {
    bool all = true;
    for (const Operand& x : xs) all = all && has_layout(x, s, layout);
    if (all) return layout;
  }
  const sa::Layout layout = has_layout(xs[0], s, sa::Layout::bthd) ? sa::Layout::bthd : sa::Layout::bhtd;
  for (const Operand& x : xs) {
    if (has_layout(x, s, layout)) continue;
    const sa::HeadStrides want = sa::HeadStrides::of(layout, x.heads, x.len, s.head_dim);
    throw std::invalid_argument(std::string(x.name) + ": element strides (b, h, t) " +
                                strides_text(x.t->stride_b, x.t->stride_h, x.t->stride_t) + " are not the dense " +
                                std::string(sa::to_string(layout)) + " layout " + strides_text(want.b, want.h, want.t) +
                                " of " + xs[0].name + "; the attention takes one dense layout, bhtd or bthd, for all "
                                "its tensors for now");
  }
  return layout;  // unreachable: some operand failed above
}

template <class T>
T* data_of(const sf_tensor* t) {
  return t ? static_cast<T*>(t->data) : nullptr;
}

const sa::AttentionOptions& options_of(const sf_options* o) {
  if (!o) throw std::invalid_argument("options: NULL (create them with sf_options_create)");
  return o->options;
}

}  // namespace

extern "C" {

int sf_abi_version(void) { return SF_C_ABI_VERSION; }

sf_options* sf_options_create(const char* const* keys, const char* const* values, int n, char* err, size_t err_size) {
  sf_options* out = nullptr;
  const int rc = guarded(err, err_size, [&] {
    auto o = std::make_unique<sf_options>();
    o->options.device = sa::Device::cuda;
    if (n < 0 || (n > 0 && (!keys || !values))) throw std::invalid_argument("options: n < 0 or NULL keys/values");
    for (int i = 0; i < n; ++i) {
      if (!keys[i] || !values[i]) throw std::invalid_argument("options: key or value " + std::to_string(i) + " is NULL");
      sa::set_option(o->options, keys[i], values[i], "stableflash attention option");
    }
    out = o.release();
  });
  return rc == SF_OK ? out : nullptr;
}

void sf_options_destroy(sf_options* options) { delete options; }

int sf_options_needs_residual(const sf_options* options) {
  return options && options->options.delta_source == sa::DeltaSource::compensated ? 1 : 0;
}

int sf_attention_forward(const sf_shape* shape, const sf_options* options, void* stream, const sf_tensor* q,
                         const sf_tensor* k, const sf_tensor* v, const sf_tensor* o, float* lse,
                         const sf_tensor* o_residual, char* err, size_t err_size) {
  return guarded(err, err_size, [&] {
    sa::AttentionOptions opt = options_of(options);
    opt.cuda_stream = stream;
    sa::ForwardArgs a;
    a.shape = to_shape(shape);
    opt.validate(a.shape);  // shape and options first: their messages say more than a stride's
    const sa::AttentionShape& s = a.shape;
    const int kv = s.resolved_kv_heads();
    std::vector<Operand> xs = {{"q", q, s.heads, s.q_len}, {"k", k, kv, s.k_len}, {"v", v, kv, s.k_len},
                               {"o", o, s.heads, s.q_len}};
    const bool residual = o_residual && o_residual->data;
    if (residual) xs.push_back({"o_residual", o_residual, s.heads, s.q_len});
    if (!lse) throw std::invalid_argument("lse: required, got NULL");
    a.layout = common_layout(xs, s);
    a.q = data_of<const stableflash::bf16>(q), a.k = data_of<const stableflash::bf16>(k), a.v = data_of<const stableflash::bf16>(v);
    a.o = data_of<stableflash::bf16>(o), a.lse = lse;
    a.o_residual = residual ? data_of<stableflash::bf16>(o_residual) : nullptr;
    sa::attention_forward(a, opt);
  });
}

int sf_attention_backward(const sf_shape* shape, const sf_options* options, void* stream, const sf_tensor* q,
                          const sf_tensor* k, const sf_tensor* v, const sf_tensor* o, const float* lse,
                          const sf_tensor* o_residual, const sf_tensor* d_o, const sf_tensor* dq,
                          const sf_tensor* dk, const sf_tensor* dv, char* err, size_t err_size) {
  return guarded(err, err_size, [&] {
    sa::AttentionOptions opt = options_of(options);
    opt.cuda_stream = stream;
    sa::BackwardArgs a;
    a.shape = to_shape(shape);
    opt.validate(a.shape);  // shape and options first: their messages say more than a stride's
    const sa::AttentionShape& s = a.shape;
    const int kv = s.resolved_kv_heads();
    std::vector<Operand> xs = {{"q", q, s.heads, s.q_len},   {"k", k, kv, s.k_len},   {"v", v, kv, s.k_len},
                               {"o", o, s.heads, s.q_len},   {"do", d_o, s.heads, s.q_len},
                               {"dq", dq, s.heads, s.q_len}, {"dk", dk, kv, s.k_len}, {"dv", dv, kv, s.k_len}};
    const bool residual = o_residual && o_residual->data;
    if (residual) xs.push_back({"o_residual", o_residual, s.heads, s.q_len});
    if (!lse) throw std::invalid_argument("lse: required, got NULL");
    a.layout = common_layout(xs, s);
    a.q = data_of<const stableflash::bf16>(q), a.k = data_of<const stableflash::bf16>(k), a.v = data_of<const stableflash::bf16>(v);
    a.o = data_of<const stableflash::bf16>(o), a.lse = lse, a.d_o = data_of<const stableflash::bf16>(d_o);
    a.o_residual = residual ? data_of<const stableflash::bf16>(o_residual) : nullptr;
    a.dq = data_of<stableflash::bf16>(dq), a.dk = data_of<stableflash::bf16>(dk), a.dv = data_of<stableflash::bf16>(dv);
    sa::attention_backward(a, opt);
  });
}

}  // extern "C"
