#!/usr/bin/env python3
"""stableflash.torch.attention on the CPU (torch's CPU build is enough): strided views run without
copies and give bitwise the outputs and gradients of contiguous inputs; outputs come back dense in the
layout closest to their input's; the op's alignment rule (_layout.rows_aligned, which decides what the
GPU path copies) agrees with the C++ check (cuda::check_supported_args through the C ABI's
sf_attention_*_check, which needs no GPU); opcheck and torch.compile(fullgraph=True) on the views.

    STABLEFLASH_C_LIB=build-cuda/capi/libstableflash_c.so PYTHONPATH=python:<torch> python3 tests/python_cpu/test_op_cpu.py
Exits 77 (ctest: skipped) when torch is not importable, 1 on any failure.
"""
import itertools
import os
import sys

try:
    import torch
except ImportError:
    print("torch is not importable here: skipped (STABLEFLASH_TORCH_PYTHONPATH names a folder holding it)")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python_gpu"))
from arrangements import ARRANGEMENTS, nanogpt, odd_offsets, wide_rows  # noqa: E402
from routes import count_dispatches  # noqa: E402
from runner import Skip, main, test  # noqa: E402

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from stableflash import _capi  # noqa: E402
from stableflash.torch import _layout, _ops, attention  # noqa: E402

torch.manual_seed(0)


def randn(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


def run(q, k, v, d_o, **kw):
    """o, dq, dk, dv of the op on leaves arranged as given (gradients taken w.r.t. the views)."""
    xs = [x.detach().requires_grad_() for x in (q, k, v)]
    o = attention(*xs, **kw)
    grads = torch.autograd.grad(o, xs, d_o)
    return [o.detach()] + list(grads), o, grads


def bitwise(name, a, b):
    if not torch.equal(a.view(torch.int16), b.contiguous().view(torch.int16)):
        diff = (a.float() - b.float()).abs().max().item()
        raise AssertionError(f"{name}: not bitwise equal to the contiguous call (max diff {diff:.3g})")


CONFIGS = [dict(causal=True),  # the defaults (DEFAULTS): standard shift, auto (exact at these <= 128 keys)
           dict(causal=True, delta_source="compensated"),
           dict(causal=True, policy="hashed_offset"),
           dict(causal=False, policy="standard", delta_source="rounded"),
           dict(causal=True, numerics="paper", policy="paper", delta_source="exact")]


@test
def strided_views_give_the_bits_of_contiguous_inputs():
    b, h, t, d = 2, 3, 45, 64
    q, k, v, d_o = (randn(b, h, t, d) for _ in range(4))
    for cfg in CONFIGS:
        want, _, _ = run(q, k, v, d_o, **cfg)
        for name, arrange in ARRANGEMENTS.items():
            got, _, _ = run(*arrange(q, k, v), d_o, **cfg)
            for what, g, w in zip(("o", "dq", "dk", "dv"), got, want):
                bitwise(f"{name} {cfg} {what}", g, w)


@test
def strided_output_gradients_give_the_same_bits():
    # dO as autograd hands it over from y.transpose(1, 2).reshape(B, T, C) and from a wide view
    b, h, t, d = 2, 2, 33, 64
    q, k, v, d_o = (randn(b, h, t, d) for _ in range(4))
    # and the gradient of o.sum(): one value expanded over every element (all strides 0), copied
    for strided in (d_o.transpose(1, 2).contiguous().transpose(1, 2), wide_rows(d_o, d_o, d_o)[0],
                    odd_offsets(d_o, d_o, d_o)[0], d_o[:, :1].expand(b, h, t, d),
                    torch.ones((), dtype=torch.bfloat16).expand(b, h, t, d)):
        want, _, _ = run(q, k, v, strided.contiguous(), causal=True)
        got, _, _ = run(*nanogpt(q, k, v), strided, causal=True)
        for what, g, w in zip(("o", "dq", "dk", "dv"), got, want):
            bitwise(f"dO strides {strided.stride()} {what}", g, w)


@test
def bthd_layout_argument_with_views():
    # layout="bthd": the caller's [B, T, H, D] views of qkv.view(B, T, 3, H, D), no transposes
    b, h, t, d = 2, 4, 50, 128
    q, k, v, d_o = (randn(b, h, t, d) for _ in range(4))
    want, _, _ = run(q, k, v, d_o, causal=True)
    qkv = torch.stack([x.transpose(1, 2) for x in (q, k, v)], dim=2)  # [B, T, 3, H, D]
    views = [qkv[:, :, i] for i in range(3)]
    xs = [x.detach().requires_grad_() for x in views]
    o = attention(*xs, causal=True, layout="bthd")
    grads = torch.autograd.grad(o, xs, d_o.transpose(1, 2))
    for what, g, w in zip(("o", "dq", "dk", "dv"), [o.detach()] + list(grads), want):
        bitwise(f"bthd views {what}", g.transpose(1, 2), w)


@test
def grouped_query_views():
    b, h, kvh, t, d = 1, 4, 2, 30, 64
    q, d_o = randn(b, h, t, d), randn(b, h, t, d)
    k, v = randn(b, kvh, t, d), randn(b, kvh, t, d)
    want, _, _ = run(q, k, v, d_o, causal=True)
    # Llama-style fused projection: [B, T, H + 2 H_kv, D]
    buf = torch.cat([x.transpose(1, 2) for x in (q, k, v)], dim=2)
    views = [buf[:, :, :h].transpose(1, 2), buf[:, :, h:h + kvh].transpose(1, 2), buf[:, :, h + kvh:].transpose(1, 2)]
    got, _, _ = run(*views, d_o, causal=True)
    for what, g, w in zip(("o", "dq", "dk", "dv"), got, want):
        bitwise(f"GQA views {what}", g, w)


@test
def views_reach_the_library_without_copies():
    b, h, t, d = 2, 3, 20, 64
    q, k, v, d_o = (randn(b, h, t, d) for _ in range(4))
    seen = {}
    forward, backward = _capi.forward, _capi.backward

    def spy_forward(shape, opts, stream, q_, k_, v_, o_, lse_ptr, res_):
        seen["forward"] = [x[0] for x in (q_, k_, v_)]
        return forward(shape, opts, stream, q_, k_, v_, o_, lse_ptr, res_)

    def spy_backward(shape, opts, stream, q_, k_, v_, o_, lse_ptr, res_, do_, dq_, dk_, dv_):
        seen["backward"] = [x[0] for x in (q_, k_, v_, do_)]
        return backward(shape, opts, stream, q_, k_, v_, o_, lse_ptr, res_, do_, dq_, dk_, dv_)

    _capi.forward, _capi.backward = spy_forward, spy_backward
    try:
        views = [x.detach().requires_grad_() for x in nanogpt(q, k, v)]
        o = attention(*views, causal=True)
        d_o_view = wide_rows(d_o, d_o, d_o)[0]
        torch.autograd.grad(o, views, d_o_view)
    finally:
        _capi.forward, _capi.backward = forward, backward
    assert seen["forward"] == [x.data_ptr() for x in views], "the forward got copies of the views"
    assert seen["backward"] == [x.data_ptr() for x in views] + [d_o_view.data_ptr()], "the backward got copies"


@test
def outputs_are_dense_in_the_layout_closest_to_their_inputs():
    b, h, t, d = 2, 3, 20, 64
    q, k, v, d_o = (randn(b, h, t, d) for _ in range(4))

    def layout_of(x):
        return "bhtd" if x.is_contiguous() else "bthd" if x.transpose(1, 2).is_contiguous() else "other"

    for name, want in (("nanogpt", ["bthd"] * 4), ("bthd", ["bthd"] * 4), ("mixed", ["bhtd", "bhtd", "bthd", "bthd"]),
                       ("wide_rows", ["bhtd"] * 4)):
        xs = [x.detach().requires_grad_() for x in ARRANGEMENTS[name](q, k, v)]
        o = attention(*xs, causal=True)
        got = [layout_of(o)] + [layout_of(g) for g in torch.autograd.grad(o, xs, d_o)]
        assert got == want, f"{name}: o, dq, dk, dv came back {got}, expected {want}"
    with torch.no_grad():
        xs = [x.detach() for x in nanogpt(q, k, v)]
        o = attention(*xs, causal=True)
    assert o.transpose(1, 2).reshape(b, t, h * d).data_ptr() == o.data_ptr(), "nanoGPT's reshape would copy o"


@test
def backward_fills_no_zero_gradients():
    # lse and o_residual are outputs of the forward op that no caller differentiates: autograd must
    # not materialise zero gradients for them before each backward (on the GPU a memset of o's size
    # per call, issue 14), and they do not require grad
    q, k, v = (randn(1, 2, 16, 64).requires_grad_() for _ in range(3))
    o, lse, res = torch.ops.stableflash.attention_forward(q, k, v, True, 0.0, "delta_source=compensated")
    assert o.requires_grad and not lse.requires_grad and not res.requires_grad
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.autograd.grad(o, (q, k, v), randn(1, 2, 16, 64))
    ops = {e.name for e in prof.events()}
    assert "stableflash::attention_backward" in ops, sorted(ops)
    filled = ops & {"aten::zeros", "aten::zeros_like", "aten::zero_", "aten::fill_"}
    assert not filled, f"the backward filled zero gradients: {sorted(filled)}"


class _OpNames(TorchDispatchMode):
    """Records the operators dispatched while it is active."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@test
def eager_calls_skip_the_dispatcher_only_where_nothing_intercepts():
    # stableflash.torch.attention calls the kernels directly in plain eager mode (_ops._plain) and the
    # op through the dispatcher wherever something could intercept it (issue 14): both routes give
    # the same bits, and modes, subclasses, transforms and the profiler see the op
    q, k, v, d_o = (randn(2, 3, 24, 64) for _ in range(4))
    want, _, _ = run(q, k, v, d_o, causal=True)
    xs = [x.detach().requires_grad_() for x in (q, k, v)]
    o = torch.ops.stableflash.attention_forward(*xs, True, 0.0, attention_text())[0]
    for what, g, w in zip(("o", "dq", "dk", "dv"), [o.detach()] + list(torch.autograd.grad(o, xs, d_o)), want):
        bitwise(f"the dispatcher's route: {what}", g, w)
    assert _ops._plain(q, k, v)
    assert not _ops._plain(q, torch.nn.Parameter(k), v)  # a subclass
    with count_dispatches() as counts:
        run(q, k, v, d_o, causal=True)
        with torch.inference_mode():
            assert _ops._plain(q, k, v)
            assert torch.equal(attention(q, k, v, causal=True), want[0])
    assert counts == {"forward": 0, "backward": 0}, f"plain eager calls went through the dispatcher: {counts}"
    with _OpNames() as mode, count_dispatches() as counts:
        assert not _ops._plain(q, k, v)
        got, _, _ = run(q, k, v, d_o, causal=True)
    assert counts == {"forward": 1, "backward": 1}, counts
    assert "stableflash.attention_forward" in mode.names and "stableflash.attention_backward" in mode.names, mode.names
    for what, g, w in zip(("o", "dq", "dk", "dv"), got, want):
        bitwise(f"under a TorchDispatchMode: {what}", g, w)
    with torch.overrides.TorchFunctionMode():
        assert not _ops._plain(q, k, v)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        assert not _ops._plain(q, k, v)
        run(q, k, v, d_o, causal=True)
    names = {e.name for e in prof.events()}
    assert {"stableflash::attention_forward", "stableflash::attention_backward"} <= names, sorted(names)
    seen = []
    torch.func.vmap(lambda x: (seen.append(_ops._plain(x, x, x)), x)[1])(q)
    assert seen == [False], "functorch's vmap looked plain"
    views = nanogpt(q, k, v)
    with FakeTensorMode() as fake_mode:
        fq, fk, fv = (fake_mode.from_tensor(x) for x in views)
        assert not _ops._plain(fq, fk, fv)
        fo = attention(fq, fk, fv, causal=True)
    assert fo.shape == q.shape and fo.stride() == attention(*views, causal=True).stride()


def attention_text():
    """The options string attention() sends with its defaults."""
    from stableflash.torch import _text, DEFAULTS
    return _text(DEFAULTS["numerics"], DEFAULTS["policy"], DEFAULTS["delta_source"], False, None)


@test
def the_default_saves_a_residual_only_above_one_key_block():
    # delta_source auto: the exact delta up to 128 keys (no o_residual), the compensated one above;
    # the op's outputs follow it, and the gradients are those of naming the source it resolves to
    q, d_o = randn(1, 2, 60, 64), randn(1, 2, 60, 64)
    for t_k, source in ((128, "exact"), (129, "compensated")):
        k, v = randn(1, 2, t_k, 64), randn(1, 2, t_k, 64)
        o, lse, res = torch.ops.stableflash.attention_forward(q, k, v, True, 0.0, attention_text())
        assert res.shape == ((0,) if source == "exact" else q.shape), (t_k, res.shape)
        want, _, _ = run(q, k, v, d_o, causal=True, delta_source=source)
        got, _, _ = run(q, k, v, d_o, causal=True)
        for what, g, w in zip(("o", "dq", "dk", "dv"), got, want):
            bitwise(f"Tk {t_k} auto against {source}: {what}", g, w)


@test
def double_backward_raises_and_create_graph_runs():
    q, k, v, d_o = (randn(1, 2, 16, 64) for _ in range(4))
    want, _, _ = run(q, k, v, d_o, causal=True)
    xs = [x.detach().requires_grad_() for x in (q, k, v)]
    o = attention(*xs, causal=True)
    grads = torch.autograd.grad(o, xs, d_o, create_graph=True)  # first order with a graph: runs
    for what, g, w in zip(("dq", "dk", "dv"), grads, want[1:]):
        bitwise(f"create_graph {what}", g.detach(), w)
    assert grads[0].requires_grad
    try:
        torch.autograd.grad(grads[0].sum(), xs)
    except RuntimeError as e:
        assert "double backward" in str(e), str(e)
    else:
        raise AssertionError("differentiating the gradients did not raise")


# ---------------------------------------------------------------------------------------------
# The alignment rule against the C++ check. Each case perturbs one tensor of an otherwise aligned
# call; the Python rule (every tensor rows_aligned with its table entry) and the C ABI's check with
# device=cuda (cuda::check_supported_args, no GPU needed) must agree, and a refusal must name the tensor.

def perturbations(shape):
    """(label, make(x) -> a view holding x's values) for a tensor of `shape` [B, H, T, D]."""
    b, h, t, d = shape

    def offset(elements):
        def make(x):
            flat = torch.zeros(x.numel() + elements, dtype=x.dtype)
            view = flat[elements:].view(x.shape)
            view.copy_(x)
            return view
        return make

    def padded(dim, extra):  # rows of dim `dim` (0 b, 1 h, 2 t) `extra` elements further apart
        def make(x):
            if dim == 2:  # token rows of D + extra
                buf = torch.zeros(b, h, t, d + extra, dtype=x.dtype)
                view = buf[..., :d]
            elif dim == 1:  # head blocks of T*D + extra
                buf = torch.zeros(b, h, t * d + extra, dtype=x.dtype)
                view = buf[:, :, : t * d].view(b, h, t, d)
            else:  # batch blocks of H*T*D + extra
                buf = torch.zeros(b, h * t * d + extra, dtype=x.dtype)
                view = buf[:, : h * t * d].view(b, h, t, d)
            view.copy_(x)
            return view
        return make

    def bthd_(x):
        return x.transpose(1, 2).contiguous().transpose(1, 2)

    def split(x):  # one third of a [B, T, 3C] product
        c = h * d
        buf = torch.zeros(b, t, 3 * c, dtype=x.dtype)
        view = buf[:, :, c:2 * c].view(b, t, h, d).transpose(1, 2)
        view.copy_(x)
        return view

    def ones_odd_strides(x):  # extent-1 dimensions with strides no layout has (never stepped)
        return torch.as_strided(x.contiguous(), x.shape, (x.stride(0) if b > 1 else 3, x.stride(1) if h > 1 else 5, x.stride(2) if t > 1 else 7, 1))

    out = [("dense", lambda x: x.contiguous()), ("bthd", bthd_), ("split", split), ("extent-1 strides", ones_odd_strides)]
    out += [(f"offset {e}", offset(e)) for e in (1, 2, 4, 8)]
    out += [(f"{'bht'[dim]} stride +{e}", padded(dim, e)) for dim in (0, 1, 2) for e in (1, 2, 4, 8)]
    return out


def c_tensor(x):
    return _capi.Tensor(x.data_ptr(), x.stride(0), x.stride(1), x.stride(2))


def agreement_cases(direction, shape):
    """Yields (label, tensor name, python verdict, C++ message or None)."""
    names = list(_layout.FORWARD_ALIGN if direction == "forward" else _layout.BACKWARD_ALIGN)
    table = _layout.FORWARD_ALIGN if direction == "forward" else _layout.BACKWARD_ALIGN
    b, h, t, d = shape
    opts = _ops.parse_options("delta_source=compensated", True, 0.0, "cuda")  # cuda: the GPU path's rules
    lse = torch.zeros(b, h, t)
    base = {n: randn(*shape) for n in names}
    for name in names:
        for label, make in perturbations(shape):
            xs = dict(base)
            xs[name] = make(base[name])
            python_ok = all(_layout.rows_aligned(x, table[n]) for n, x in xs.items())
            t_ = {n: c_tensor(x) for n, x in xs.items()}
            if name != "o_residual" and name != "o":  # o_residual takes o's strides: move them together
                pass
            elif name == "o":
                t_["o_residual"] = c_tensor(make(base["o_residual"]))
                python_ok = python_ok and _layout.rows_aligned(make(base["o_residual"]), table["o_residual"])
            else:
                t_["o"] = c_tensor(make(base["o"]))
                python_ok = python_ok and _layout.rows_aligned(make(base["o"]), table["o"])
            sh = _capi.Shape(b, h, h, t, t, d)
            if direction == "forward":
                msg = _capi.check("forward", sh, opts, t_["q"], t_["k"], t_["v"], t_["o"], lse.data_ptr(), t_["o_residual"])
            else:
                msg = _capi.check("backward", sh, opts, t_["q"], t_["k"], t_["v"], t_["o"], lse.data_ptr(), t_["o_residual"],
                                  t_["do"], t_["dq"], t_["dk"], t_["dv"])
            yield label, name, python_ok, msg, xs


@test
def alignment_rule_agrees_with_the_cpp_check():
    msg = _capi.check("forward", _capi.Shape(1, 1, 1, 8, 8, 64), _ops.parse_options("", False, 0.0, "cuda"),
                      *[c_tensor(randn(1, 1, 8, 64)) for _ in range(4)], torch.zeros(8).data_ptr(), None)
    if msg and "built without CUDA" in msg:
        raise Skip("this library was built without CUDA (the C++ check's rules are not in it)")
    assert msg is None, f"an aligned call was refused: {msg}"
    counts = {"accepted": 0, "refused": 0}
    for direction, shape in itertools.product(("forward", "backward"), ((2, 3, 16, 64), (1, 2, 9, 128), (2, 1, 1, 64))):
        for label, name, python_ok, msg, xs in agreement_cases(direction, shape):
            where = f"{direction} {shape} {name} {label}"
            assert python_ok == (msg is None), f"{where}: the Python rule says {'aligned' if python_ok else 'copy'}, " \
                                               f"the C++ check {msg or 'accepts'}"
            if msg is not None:
                # o and o_residual move together (o_residual takes o's strides): either may be named
                named = {"o": ("o", "o_residual"), "o_residual": ("o", "o_residual")}.get(name, (name,))
                fields = {"do": "d_o", "o_residual": "o"}
                assert any(f" {n} must be" in msg or f"strides.{fields.get(n, n)}." in msg for n in named), \
                    f"{where}: the refusal does not name the tensor: {msg}"
            counts["accepted" if python_ok else "refused"] += 1
            # what the op does with a refused tensor: one copy the C++ check accepts
            fixed = _layout.dense_copy(xs[name], _layout.order(xs[name]))
            assert _layout.rows_aligned(fixed, 16), f"{where}: the copy is not aligned"
    assert counts["accepted"] > 20 and counts["refused"] > 20, counts
    print(f"    {counts['accepted']} arrangements accepted and {counts['refused']} refused by both")


# ---------------------------------------------------------------------------------------------

@test
def opcheck_on_views():
    op = torch.ops.stableflash.attention_forward.default
    b, h, t, d = 2, 3, 24, 64
    for name in ("nanogpt", "mixed", "wide_rows"):
        q, k, v = (x.detach().requires_grad_() for x in ARRANGEMENTS[name](*(randn(b, h, t, d) for _ in range(3))))
        torch.library.opcheck(op, (q, k, v, True, 0.0, "numerics=fused;policy=hashed_offset;delta_source=compensated"))


@test
def compile_fullgraph_on_views_is_bitwise_eager():
    # aot_eager: Dynamo's full graph and AOTAutograd's fake tensors (the op's fake layouts against the
    # real ones) without Inductor's code generation, which the GPU tests run
    h, d = 3, 64
    c = h * d

    def attend(qkv):
        b_, t_, _ = qkv.shape
        q, k, v = (z.view(b_, t_, h, d).transpose(1, 2) for z in qkv.split(c, dim=2))
        return attention(q, k, v, causal=True).transpose(1, 2).reshape(b_, t_, c)

    for dynamic in (False, True):
        torch._dynamo.reset()
        compiled = torch.compile(attend, fullgraph=True, backend="aot_eager", dynamic=dynamic)
        # dynamic: lengths on both sides of delta_source auto's 128 keys (no o_residual up to them)
        for t in ((40,) if not dynamic else (40, 57, 150)):
            x = randn(2, t, 3 * c)
            d_y = randn(2, t, c)
            out = []
            for f in (attend, compiled):
                xi = x.clone().requires_grad_()
                y = f(xi)
                out.append((y.detach(), torch.autograd.grad(y, xi, d_y)[0]))
            assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1]), \
                f"dynamic={dynamic} T={t}: compiled differs from eager"


if __name__ == "__main__":
    print(f"torch {torch.__version__}, library {_capi.library_path()}")
    main()
