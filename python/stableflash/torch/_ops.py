"""The custom ops stableflash::attention_forward / attention_backward: torch.library.custom_op over
the C ABI (stableflash._capi), with fake implementations for torch.compile and the autograd formula.

The ops take q, k, v logically [B, H, T, D] with any strides (each goes to the C++ side with its
own; on the GPU rows must be aligned, which stableflash.torch.attention arranges: _layout). Outputs
come from PyTorch's caching allocator, dense in the layout closest to their input's (o like q, dq,
dk, dv like q, k, v); the C++ side runs on the caller's current CUDA stream and never synchronises.
`options` is "key=value;..." for attention::set_option (numerics, policy, delta_source, ...)."""
import torch

from .. import _capi
from . import _layout

_LIB = "stableflash"


def parse_options(options, causal, scale, device):
    """The (key, value) pairs for the C library's parser: the caller's, then causal, scale and device."""
    pairs = []
    for item in filter(None, options.split(";")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"stableflash options: '{item}' is not key=value (in '{options}')")
        if key in ("causal", "scale", "device"):
            raise ValueError(f"stableflash options: '{key}' is set by the op's own argument, not by options")
        pairs.append((key, value))
    pairs += [("causal", "true" if causal else "false"), ("scale", repr(float(scale))), ("device", device)]
    return _capi.options(tuple(pairs))


def _device_kind(x):
    return "cuda" if x.is_cuda else "cpu"


def _tensor(x):
    """The C view of a logically [B, H, T, D] tensor (None for an absent optional one)."""
    if x is None or x.numel() == 0:
        return None
    s = x.stride()
    return _capi.Tensor(x.data_ptr(), s[0], s[1], s[2])


def _shape(q, k):
    b, h, tq, d = q.shape
    return _capi.Shape(b, h, k.shape[1], tq, k.shape[2], d)


def _stream(x):
    return torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else None


class _on_device:
    """Makes x's GPU the current one for the C call (the kernels launch on the current device)."""

    def __init__(self, x):
        self.guard = torch.cuda.device(x.device) if x.is_cuda and x.device.index != torch.cuda.current_device() else None

    def __enter__(self):
        if self.guard:
            self.guard.__enter__()

    def __exit__(self, *exc):
        if self.guard:
            self.guard.__exit__(*exc)


def _forward_outputs(q, opts):
    """o (and o_residual) dense in the layout closest to q's, lse [B, H, Tq] FP32."""
    layout = _layout.order(q)
    o = _layout.empty(q.shape, layout, q.dtype, q.device)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    res = (_layout.empty(q.shape, layout, q.dtype, q.device) if opts.needs_residual
           else torch.empty(0, dtype=q.dtype, device=q.device))
    return o, lse, res


@torch.library.custom_op(f"{_LIB}::attention_forward", mutates_args=())
def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                      options: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns o, lse and o_residual (empty unless delta_source = compensated)."""
    opts = parse_options(options, causal, scale, _device_kind(q))
    o, lse, res = _forward_outputs(q, opts)  # laid out from the caller's q, as the fake implementation does
    # the kernels take every view whose rows they can address; the rest are copied once (the one rule)
    q, k, v = (_layout.for_kernels(x, _layout.FORWARD_ALIGN[n]) for n, x in (("q", q), ("k", k), ("v", v)))
    with _on_device(q):
        _capi.forward(_shape(q, k), opts, _stream(q), _tensor(q), _tensor(k), _tensor(v), _tensor(o), lse.data_ptr(),
                      _tensor(res))
    return o, lse, res


@attention_forward.register_fake
def _(q, k, v, causal, scale, options):
    # options are parsed here too (host only, cached), so a bad one fails at trace time
    return _forward_outputs(q, parse_options(options, causal, scale, _device_kind(q)))


def _backward_outputs(q, k, v):
    """dq, dk, dv dense in the layouts closest to q's, k's and v's."""
    return tuple(_layout.empty(x.shape, _layout.order(x), x.dtype, x.device) for x in (q, k, v))


@torch.library.custom_op(f"{_LIB}::attention_backward", mutates_args=())
def attention_backward(d_o: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                       lse: torch.Tensor, o_residual: torch.Tensor, causal: bool, scale: float,
                       options: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns dq, dk, dv, each dense in the layout closest to its input's."""
    opts = parse_options(options, causal, scale, _device_kind(q))
    dq, dk, dv = _backward_outputs(q, k, v)  # laid out from the caller's tensors, as the fake implementation does
    # dO (e.g. an expanded gradient of o.sum()) and the saved inputs go with their own strides; copied
    # only when the GPU cannot read their rows (the one rule). o and o_residual are the forward's own
    # dense outputs (aligned by the allocator), so they are not checked again.
    q, k, v, d_o = (_layout.for_kernels(x, _layout.BACKWARD_ALIGN[n]) for n, x in (("q", q), ("k", k), ("v", v), ("do", d_o)))
    with _on_device(q):
        _capi.backward(_shape(q, k), opts, _stream(q), _tensor(q), _tensor(k), _tensor(v), _tensor(o), lse.data_ptr(),
                       _tensor(o_residual), _tensor(d_o), _tensor(dq), _tensor(dk), _tensor(dv))
    return dq, dk, dv


@attention_backward.register_fake
def _(d_o, q, k, v, o, lse, o_residual, causal, scale, options):
    return _backward_outputs(q, k, v)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, options = inputs
    o, lse, res = output
    ctx.save_for_backward(q, k, v, o, lse, res)
    ctx.causal, ctx.scale, ctx.options = causal, scale, options
    # lse and o_residual are saved state: no gradient flows into them, and autograd must not fill
    # zeros for their (absent) gradients before each backward (a memset of o's size on the GPU)
    ctx.mark_non_differentiable(lse, res)
    ctx.set_materialize_grads(False)


def _backward(ctx, d_o, _d_lse, _d_res):
    # lse and o_residual are saved state, not results a caller differentiates (the public function
    # returns o only), so their incoming gradients are ignored.
    if d_o is None:  # o took no part in what is differentiated (set_materialize_grads(False))
        return None, None, None, None, None, None
    q, k, v, o, lse, res = ctx.saved_tensors
    dq, dk, dv = attention_backward(d_o, q, k, v, o, lse, res, ctx.causal, ctx.scale, ctx.options)
    return dq, dk, dv, None, None, None


attention_forward.register_autograd(_backward, setup_context=_setup_context)
