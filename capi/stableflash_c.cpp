// The C ABI (include/stableflash/capi/stableflash_c.h) over attention::attention_forward/backward:
// options through attention::set_option, each tensor's strides passed through (ForwardStrides /
// BackwardStrides), and every exception turned into a return code and a message.
#include "stableflash/capi/stableflash_c.h"

#include <cstdio>
#include <exception>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "stableflash/attention/attention.hpp"
#include "stableflash/attention/cuda.hpp"
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

// A required tensor argument: present, with a pointer.
const sf_tensor& required(const char* name, const sf_tensor* t) {
  if (!t || !t->data) throw std::invalid_argument(std::string(name) + ": required, got NULL");
  return *t;
}

// An optional tensor argument (o_residual): absent or with NULL data means not passed.
bool present(const sf_tensor* t) { return t && t->data; }

// Each tensor's own strides go through to the C++ entry points (ForwardStrides / BackwardStrides):
// any strided view runs as it is, on the CPU; the CUDA kernels' alignment rules are
// cuda::check_supported_args's (docs/cuda-kernels.md, "Strided tensors"), which names the field it refuses.
sa::HeadStrides strides_of(const sf_tensor& t) { return {t.stride_b, t.stride_h, t.stride_t}; }

std::string strides_text(const sa::HeadStrides& s) {
  return "(" + std::to_string(s.b) + ", " + std::to_string(s.h) + ", " + std::to_string(s.t) + ")";
}

// The C++ side addresses o_residual with o's strides (dimensions of extent 1 aside: never stepped).
void check_follows_o(const sf_tensor& r, const sf_tensor& o, const sa::AttentionShape& s) {
  if ((s.batch == 1 || r.stride_b == o.stride_b) && (s.heads == 1 || r.stride_h == o.stride_h) &&
      (s.q_len == 1 || r.stride_t == o.stride_t))
    return;
  throw std::invalid_argument("o_residual: element strides (b, h, t) " + strides_text(strides_of(r)) + " differ from o's " +
                              strides_text(strides_of(o)) + "; o_residual is addressed with o's strides");
}

// The layout of args.layout: only a fallback for dimensions of extent 1, whose strides the C++ side
// replaces by the packed ones (resolve_strides); q's order of the head and token strides, so that
// the replacement matches q's neighbours.
sa::Layout layout_of(const sf_tensor& q) { return q.stride_t > q.stride_h ? sa::Layout::bthd : sa::Layout::bhtd; }

template <class T>
T* data_of(const sf_tensor* t) {
  return t ? static_cast<T*>(t->data) : nullptr;
}

const sa::AttentionOptions& options_of(const sf_options* o) {
  if (!o) throw std::invalid_argument("options: NULL (create them with sf_options_create)");
  return o->options;
}

// The C++ arguments of one call: shape and options checked first (their messages say more than a
// stride's), then each tensor present, with its own strides.
sa::ForwardArgs forward_args(const sf_shape* shape, const sa::AttentionOptions& opt, const sf_tensor* q,
                             const sf_tensor* k, const sf_tensor* v, const sf_tensor* o, float* lse,
                             const sf_tensor* o_residual) {
  sa::ForwardArgs a;
  a.shape = to_shape(shape);
  opt.validate(a.shape);
  const sf_tensor &tq = required("q", q), &tk = required("k", k), &tv = required("v", v), &to = required("o", o);
  if (!lse) throw std::invalid_argument("lse: required, got NULL");
  a.layout = layout_of(tq);
  a.q = data_of<const stableflash::bf16>(q), a.k = data_of<const stableflash::bf16>(k), a.v = data_of<const stableflash::bf16>(v);
  a.o = data_of<stableflash::bf16>(o), a.lse = lse;
  a.o_residual = present(o_residual) ? data_of<stableflash::bf16>(o_residual) : nullptr;
  if (a.o_residual) check_follows_o(*o_residual, to, a.shape);
  a.strides.q = strides_of(tq), a.strides.k = strides_of(tk), a.strides.v = strides_of(tv), a.strides.o = strides_of(to);
  return a;
}

sa::BackwardArgs backward_args(const sf_shape* shape, const sa::AttentionOptions& opt, const sf_tensor* q,
                               const sf_tensor* k, const sf_tensor* v, const sf_tensor* o, const float* lse,
                               const sf_tensor* o_residual, const sf_tensor* d_o, const sf_tensor* dq,
                               const sf_tensor* dk, const sf_tensor* dv) {
  sa::BackwardArgs a;
  a.shape = to_shape(shape);
  opt.validate(a.shape);
  const sf_tensor &tq = required("q", q), &tk = required("k", k), &tv = required("v", v), &to = required("o", o);
  const sf_tensor &tdo = required("do", d_o), &tdq = required("dq", dq), &tdk = required("dk", dk), &tdv = required("dv", dv);
  if (!lse) throw std::invalid_argument("lse: required, got NULL");
  a.layout = layout_of(tq);
  a.q = data_of<const stableflash::bf16>(q), a.k = data_of<const stableflash::bf16>(k), a.v = data_of<const stableflash::bf16>(v);
  a.o = data_of<const stableflash::bf16>(o), a.lse = lse, a.d_o = data_of<const stableflash::bf16>(d_o);
  a.o_residual = present(o_residual) ? data_of<const stableflash::bf16>(o_residual) : nullptr;
  if (a.o_residual) check_follows_o(*o_residual, to, a.shape);
  a.dq = data_of<stableflash::bf16>(dq), a.dk = data_of<stableflash::bf16>(dk), a.dv = data_of<stableflash::bf16>(dv);
  a.strides.q = strides_of(tq), a.strides.k = strides_of(tk), a.strides.v = strides_of(tv), a.strides.o = strides_of(to);
  a.strides.d_o = strides_of(tdo), a.strides.dq = strides_of(tdq), a.strides.dk = strides_of(tdk), a.strides.dv = strides_of(tdv);
  return a;
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

int32_t sf_options_residual_above_keys(const sf_options* options) {
  return options ? options->options.residual_above_keys() : std::numeric_limits<int32_t>::max();
}

const char* sf_recommended_options(void) {
  static const std::string text = [] {
    std::string t;
    for (const auto& [name, value] : sa::recommended_settings()) t += (t.empty() ? "" : ";") + name + "=" + value;
    return t;
  }();
  return text.c_str();
}

int sf_attention_forward(const sf_shape* shape, const sf_options* options, void* stream, const sf_tensor* q,
                         const sf_tensor* k, const sf_tensor* v, const sf_tensor* o, float* lse,
                         const sf_tensor* o_residual, char* err, size_t err_size) {
  return guarded(err, err_size, [&] {
    sa::AttentionOptions opt = options_of(options);
    opt.cuda_stream = stream;
    sa::attention_forward(forward_args(shape, opt, q, k, v, o, lse, o_residual), opt);
  });
}

int sf_attention_backward(const sf_shape* shape, const sf_options* options, void* stream, const sf_tensor* q,
                          const sf_tensor* k, const sf_tensor* v, const sf_tensor* o, const float* lse,
                          const sf_tensor* o_residual, const sf_tensor* d_o, const sf_tensor* dq,
                          const sf_tensor* dk, const sf_tensor* dv, char* err, size_t err_size) {
  return guarded(err, err_size, [&] {
    sa::AttentionOptions opt = options_of(options);
    opt.cuda_stream = stream;
    sa::attention_backward(backward_args(shape, opt, q, k, v, o, lse, o_residual, d_o, dq, dk, dv), opt);
  });
}

int sf_attention_forward_check(const sf_shape* shape, const sf_options* options, const sf_tensor* q,
                               const sf_tensor* k, const sf_tensor* v, const sf_tensor* o, const float* lse,
                               const sf_tensor* o_residual, char* err, size_t err_size) {
  return guarded(err, err_size, [&] {
    const sa::AttentionOptions& opt = options_of(options);
    const sa::ForwardArgs a = forward_args(shape, opt, q, k, v, o, const_cast<float*>(lse), o_residual);
    if (opt.device == sa::Device::cuda) sa::cuda::check_supported_args(a, opt);
  });
}

int sf_attention_backward_check(const sf_shape* shape, const sf_options* options, const sf_tensor* q,
                                const sf_tensor* k, const sf_tensor* v, const sf_tensor* o, const float* lse,
                                const sf_tensor* o_residual, const sf_tensor* d_o, const sf_tensor* dq,
                                const sf_tensor* dk, const sf_tensor* dv, char* err, size_t err_size) {
  return guarded(err, err_size, [&] {
    const sa::AttentionOptions& opt = options_of(options);
    const sa::BackwardArgs a = backward_args(shape, opt, q, k, v, o, lse, o_residual, d_o, dq, dk, dv);
    if (opt.device == sa::Device::cuda) sa::cuda::check_supported_args(a, opt);
  });
}

}  // extern "C"
