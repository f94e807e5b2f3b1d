"""The operators stableflash::attention_forward / attention_backward over the C ABI (stableflash._capi):
defined with torch.library.Library, a CPU and a CUDA kernel, fake implementations for torch.compile,
and the autograd formula.

The ops take q, k, v logically [B, H, T, D] with any strides (each goes to the C++ side with its
own; on the GPU rows must be aligned: _layout). Outputs come from PyTorch's caching allocator, dense
in the layout closest to their input's (o like q, dq, dk, dv like q, k, v); the C++ side runs on the
caller's current CUDA stream and never synchronises. `options` is "key=value;..." for
attention::set_option (numerics, policy, delta_source, ...).

What runs per call is kept short (issue 14: the op within 3% of calling the C ABI directly;
tests/python_cpu/host_cost.py measures it): in plain eager mode stableflash.torch.attention calls
the kernels without the dispatcher (forward() and _Attention below), the kernels are registered for
CPU and CUDA directly (no wrapper around them), parsed options are cached per (options, causal,
scale, device), a call's shape and tensors go to the library packed in one buffer, and the stream is
torch's raw current stream."""
import torch

from .. import _capi
from . import _layout

_NS = "stableflash"
_LIB = torch.library.Library(_NS, "DEF")  # noqa: TOR901 (the namespace is ours alone)
_TAGS = (torch.Tag.pt2_compliant_tag,)
_LIB.define("attention_forward(Tensor q, Tensor k, Tensor v, bool causal, float scale, str options) "
            "-> (Tensor, Tensor, Tensor)", tags=_TAGS)
_LIB.define("attention_backward(Tensor d_o, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor o_residual, "
            "bool causal, float scale, str options) -> (Tensor, Tensor, Tensor)", tags=_TAGS)
_FORWARD = torch.ops.stableflash.attention_forward.default
_BACKWARD = torch.ops.stableflash.attention_backward.default
_FORWARD_ALIGN = tuple(_layout.FORWARD_ALIGN[n] for n in ("q", "k", "v"))
_BACKWARD_ALIGN = tuple(_layout.BACKWARD_ALIGN[n] for n in ("q", "k", "v", "do"))


def _parse(options, causal, scale, device):
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


_PARSED = {}


def parse_options(options, causal, scale, device):
    """The C library's parsed options for the op's arguments (device "cpu" or "cuda"): parsed once
    per distinct (options, causal, scale, device), then a dictionary look-up."""
    key = (options, causal, scale, device)
    opts = _PARSED.get(key)
    if opts is None:
        opts = _parse(options, causal, scale, device)
        if len(_PARSED) >= 1024:  # a caller varying scale per call: bounded, not a leak
            _PARSED.clear()
        _PARSED[key] = opts
    return opts


def _shape(q, k):
    b, h, tq, d = q.shape
    return b, h, k.shape[1], tq, k.shape[2], d


def _tensor(x):
    """The C view of a logically [B, H, T, D] tensor: (data pointer, element strides of b, h, t)."""
    s = x.stride()
    return x.data_ptr(), s[0], s[1], s[2]


def _run(call, x, *args):
    """call(stream, *args) on x's device: the current CUDA stream of x's GPU, made the current device
    for the call when it is not already (the kernels launch on the current device)."""
    if not x.is_cuda:
        return call(None, *args)
    index = x.get_device()
    stream = torch._C._cuda_getCurrentRawStream(index)
    if index == torch._C._cuda_getDevice():
        return call(stream, *args)
    with torch.cuda.device(index):
        return call(stream, *args)


def _forward_outputs(q, needs_residual):
    """o (and o_residual) dense in the layout closest to q's, lse [B, H, Tq] FP32."""
    layout = _layout.order(q)
    o = _layout.empty(q, layout)
    b, h, t, _ = q.shape
    lse = q.new_empty_strided((b, h, t), (h * t, t, 1), dtype=torch.float32)
    res = _layout.empty(q, layout) if needs_residual else q.new_empty(0)
    return o, lse, res


def _forward_kernel(q, k, v, causal, scale, options):
    """Returns o, lse and o_residual (empty unless the δ source is compensated for these keys)."""
    cuda = q.is_cuda
    opts = parse_options(options, causal, scale, "cuda" if cuda else "cpu")
    residual = opts.needs_residual(k.shape[2])
    o, lse, res = _forward_outputs(q, residual)  # laid out from the caller's q, as the fake does
    # the kernels take every view whose rows they can address; the rest are copied once (the one rule)
    aq, ak, av = _FORWARD_ALIGN
    q, k, v = _layout.for_kernels(q, aq), _layout.for_kernels(k, ak), _layout.for_kernels(v, av)
    _run(_capi_forward, q, _shape(q, k), opts, q, k, v, o, lse, res if residual else None)
    return o, lse, res


def _capi_forward(stream, shape, opts, q, k, v, o, lse, res):
    _capi.forward(shape, opts, stream, _tensor(q), _tensor(k), _tensor(v), _tensor(o), lse.data_ptr(),
                  None if res is None else _tensor(res))


def _forward_fake(q, k, v, causal, scale, options):
    # options are parsed here too (host only, cached), so a bad one fails at trace time
    return _forward_outputs(q, parse_options(options, causal, scale, "cuda" if q.is_cuda else "cpu").needs_residual(k.shape[2]))


def _backward_outputs(q, k, v):
    """dq, dk, dv dense in the layouts closest to q's, k's and v's."""
    return _layout.empty(q, _layout.order(q)), _layout.empty(k, _layout.order(k)), _layout.empty(v, _layout.order(v))


def _backward_kernel(d_o, q, k, v, o, lse, o_residual, causal, scale, options):
    """Returns dq, dk, dv, each dense in the layout closest to its input's."""
    cuda = q.is_cuda
    opts = parse_options(options, causal, scale, "cuda" if cuda else "cpu")
    dq, dk, dv = _backward_outputs(q, k, v)  # laid out from the caller's tensors, as the fake does
    # dO (e.g. an expanded gradient of o.sum()) and the saved inputs go with their own strides; copied
    # only when the GPU cannot read their rows (the one rule). o and o_residual are the forward's own
    # dense outputs (aligned by the allocator), so they are not checked again.
    aq, ak, av, ado = _BACKWARD_ALIGN
    q, k, v, d_o = _layout.for_kernels(q, aq), _layout.for_kernels(k, ak), _layout.for_kernels(v, av), _layout.for_kernels(d_o, ado)
    _run(_capi_backward, q, _shape(q, k), opts, q, k, v, o, lse, o_residual, d_o, dq, dk, dv)
    return dq, dk, dv


def _capi_backward(stream, shape, opts, q, k, v, o, lse, res, d_o, dq, dk, dv):
    _capi.backward(shape, opts, stream, _tensor(q), _tensor(k), _tensor(v), _tensor(o), lse.data_ptr(),
                   _tensor(res) if opts.needs_residual(shape[4]) else None, _tensor(d_o), _tensor(dq), _tensor(dk), _tensor(dv))


def _backward_fake(d_o, q, k, v, o, lse, o_residual, causal, scale, options):
    return _backward_outputs(q, k, v)


for _name, _kernel, _fake in (("attention_forward", _forward_kernel, _forward_fake),
                              ("attention_backward", _backward_kernel, _backward_fake)):
    _LIB.impl(_name, _kernel, "CPU")
    _LIB.impl(_name, _kernel, "CUDA")
    torch.library.register_fake(f"{_NS}::{_name}", _fake, lib=_LIB)


# Autograd. _Attention is the forward op's autograd formula. The dispatcher reaches it through the
# op's Autograd kernel (_forward_autograd: what torch.library.register_autograd installs, written
# out; register_autograd's generic wrapper cost about 10 µs per call and direction on the CPU, issue
# 14); its forward then re-dispatches below autograd, to the CPU or CUDA kernel, or to the fake one
# and the tracing modes under torch.compile.
#
# In plain eager mode (_plain) stableflash.torch.attention skips the dispatcher: forward() applies
# _PlainAttention, whose forward calls the kernel directly and returns o alone, and the backward
# calls the backward kernel directly too; the dispatcher's round trip into Python and back costs 10
# to 20 µs a call on the CPU (issue 14). Wherever anything could intercept the op (torch.compile, a
# tensor subclass such as FakeTensor or DTensor, a TorchDispatchMode or TorchFunctionMode,
# functorch's transforms, the profiler, the JIT tracer, create_graph), calls go through the
# dispatcher as before.
_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_below_autograd = torch._C._AutoDispatchBelowAutograd
_any_requires_grad = torch._C._any_requires_grad
_Tensor = torch.Tensor
# the thread's included dispatch keys with no mode, transform or Python dispatcher active; under
# torch.inference_mode without ADInplaceOrView
_PLAIN_INCLUDE = torch._C._dispatch_tls_local_include_set()
_PLAIN_INCLUDES = frozenset((_PLAIN_INCLUDE.raw_repr(),
                             _PLAIN_INCLUDE.remove(torch._C.DispatchKey.ADInplaceOrView).raw_repr()))
_include_set = torch._C._dispatch_tls_local_include_set
_function_mode = torch._C._is_torch_function_mode_enabled
_profiling = torch._C._autograd._profiler_enabled
_jit_tracing = torch._C._get_tracing_state


def _plain(*xs):
    """Whether calling the kernels directly is what the dispatcher would do: plain tensors, and nothing
    active that intercepts operators (see above). Under torch.compile, False at once."""
    if torch.compiler.is_compiling():
        return False
    for x in xs:
        if type(x) is not _Tensor:
            return False
    return _include_set().raw_repr() in _PLAIN_INCLUDES and not (_function_mode() or _profiling() or _jit_tracing())


def _gradients(ctx, d_o):
    """dq, dk, dv for both Functions' backward from what their forward saved (q, k, v, o, lse,
    o_residual; ctx.args = causal, scale, options): the backward kernel directly in plain eager
    mode, else through the op (create_graph, grad mode on here, goes through it too: its Autograd
    kernel refuses double backward)."""
    q, k, v, o, lse, res = ctx.saved_tensors
    args = (d_o, q, k, v, o, lse, res, *ctx.args)
    return _backward_kernel(*args) if not torch.is_grad_enabled() and _plain(d_o, q, k, v) else _BACKWARD(*args)


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, keyset, q, k, v, causal, scale, options):
        # keyset: the op's dispatch keys, from its Autograd kernel
        with _below_autograd():
            o, lse, res = _FORWARD.redispatch(keyset & _AFTER_AUTOGRAD, q, k, v, causal, scale, options)
        ctx.save_for_backward(q, k, v, o, lse, res)
        ctx.args = (causal, scale, options)
        # lse and o_residual are saved state, not results a caller differentiates (the public
        # function returns o only): no gradient flows into them, and autograd must not fill zeros
        # for their absent gradients before each backward (a memset of o's size on the GPU)
        ctx.mark_non_differentiable(lse, res)
        ctx.set_materialize_grads(False)
        return o, lse, res

    @staticmethod
    def backward(ctx, d_o, _d_lse, _d_res):
        if d_o is None:  # o took no part in what is differentiated (no zeros materialised)
            return None, None, None, None, None, None, None
        dq, dk, dv = _gradients(ctx, d_o)
        return None, dq, dk, dv, None, None, None


class _PlainAttention(torch.autograd.Function):
    """_Attention for plain eager mode (forward() below), lighter on the host: o is its only output
    and lse, o_residual are saved as intermediates (neither inputs nor outputs; this function is
    differentiable once, see _NoDoubleBackward), so autograd wraps, marks and routes gradients for
    one output instead of three."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, options):
        o, lse, res = _forward_kernel(q, k, v, causal, scale, options)
        ctx.save_for_backward(q, k, v, o, lse, res)
        ctx.args = (causal, scale, options)
        ctx.set_materialize_grads(False)
        return o

    @staticmethod
    def backward(ctx, d_o):
        if d_o is None:  # no gradient reached o (none materialised)
            return None, None, None, None, None, None
        dq, dk, dv = _gradients(ctx, d_o)
        return dq, dk, dv, None, None, None


def forward(q, k, v, causal, scale, options):
    """o of stableflash::attention_forward(q, k, v, causal, scale, options), differentiable in q, k, v:
    in plain eager mode without the dispatcher (_plain), else through it."""
    if not _plain(q, k, v):
        return _FORWARD(q, k, v, causal, scale, options)[0]
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _PlainAttention.apply(q, k, v, causal, scale, options)
    return _forward_kernel(q, k, v, causal, scale, options)[0]


def _forward_autograd(keyset, q, k, v, causal, scale, options):
    if torch.is_grad_enabled() and _any_requires_grad(q, k, v):
        return _Attention.apply(keyset, q, k, v, causal, scale, options)
    with _below_autograd():
        return _FORWARD.redispatch(keyset & _AFTER_AUTOGRAD, q, k, v, causal, scale, options)


class _NoDoubleBackward(torch.autograd.Function):
    """The backward op where its result is differentiated again (create_graph=True): it runs, and
    differentiating its gradients raises."""

    @staticmethod
    def forward(ctx, keyset, *args):
        with _below_autograd():
            return _BACKWARD.redispatch(keyset & _AFTER_AUTOGRAD, *args)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("stableflash attention: double backward (differentiating the gradients) is not supported")


def _backward_autograd(keyset, *args):
    if torch.is_grad_enabled() and _any_requires_grad(*args):
        return _NoDoubleBackward.apply(keyset, *args)
    with _below_autograd():
        return _BACKWARD.redispatch(keyset & _AFTER_AUTOGRAD, *args)


_LIB.impl("attention_forward", _forward_autograd, "Autograd", with_keyset=True)
_LIB.impl("attention_backward", _backward_autograd, "Autograd", with_keyset=True)
