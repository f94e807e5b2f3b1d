// Per-tensor strides of ForwardArgs / BackwardArgs: an unset field is the packed `layout`.
#include "stableflash/attention/attention.hpp"

namespace stableflash::attention {

HeadStrides resolve_strides(const std::optional<HeadStrides>& set, Layout layout, int batch, int heads, int len, int head_dim) {
  const HeadStrides packed = HeadStrides::of(layout, heads, len, head_dim);
  if (!set) return packed;
  HeadStrides s = *set;
  if (batch == 1) s.b = packed.b;  // a dimension of extent 1 is never stepped
  if (heads == 1) s.h = packed.h;
  if (len == 1) s.t = packed.t;
  return s;
}

namespace {
// Query-side tensors: [B, H, Tq, D]; key-side: [B, H_kv, Tk, D].
HeadStrides query_side(const std::optional<HeadStrides>& set, Layout layout, const AttentionShape& s) {
  return resolve_strides(set, layout, s.batch, s.heads, s.q_len, s.head_dim);
}
HeadStrides key_side(const std::optional<HeadStrides>& set, Layout layout, const AttentionShape& s) {
  return resolve_strides(set, layout, s.batch, s.resolved_kv_heads(), s.k_len, s.head_dim);
}
}  // namespace

HeadStrides ForwardArgs::q_strides() const { return query_side(strides.q, layout, shape); }
HeadStrides ForwardArgs::k_strides() const { return key_side(strides.k, layout, shape); }
HeadStrides ForwardArgs::v_strides() const { return key_side(strides.v, layout, shape); }
HeadStrides ForwardArgs::o_strides() const { return query_side(strides.o, layout, shape); }

HeadStrides BackwardArgs::q_strides() const { return query_side(strides.q, layout, shape); }
HeadStrides BackwardArgs::k_strides() const { return key_side(strides.k, layout, shape); }
HeadStrides BackwardArgs::v_strides() const { return key_side(strides.v, layout, shape); }
HeadStrides BackwardArgs::o_strides() const { return query_side(strides.o, layout, shape); }
HeadStrides BackwardArgs::d_o_strides() const { return query_side(strides.d_o, layout, shape); }
HeadStrides BackwardArgs::dq_strides() const { return query_side(strides.dq, layout, shape); }
HeadStrides BackwardArgs::dk_strides() const { return key_side(strides.dk, layout, shape); }
HeadStrides BackwardArgs::dv_strides() const { return key_side(strides.dv, layout, shape); }

}  // namespace stableflash::attention
