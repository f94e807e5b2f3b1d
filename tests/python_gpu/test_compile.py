#!/usr/bin/env python3
"""torch.compile of code that calls stableflash.torch.attention: fullgraph=True (a graph break is an
error), static and dynamic shapes, forward and backward, bitwise equal to eager where the code
around the op is exact (views and copies), and a transformer block (LayerNorm, Linear, attention,
projection) that compiles whole and trains a step.

    PYTHONPATH=<wheel install dir> python3 tests/python_gpu/test_compile.py [--quick]
--quick: the static-shape full graph only (one compilation).
"""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runner import main, quick, test  # noqa: E402

from stableflash.torch import attention  # noqa: E402

H, D = 6, 64
C = H * D


def attend(qkv):
    """A transformer's attention on its fused qkv projection [B, T, 3C]: only views and the op."""
    b, t, _ = qkv.shape
    q, k, v = (z.view(b, t, H, D) for z in qkv.split(C, dim=2))
    return attention(q, k, v, causal=True, layout="bthd").reshape(b, t, C)


def eager_and_compiled(fn, compiled, t, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(2, t, 3 * C, generator=g, device="cuda").to(torch.bfloat16)
    d_y = torch.randn(2, t, C, generator=g, device="cuda").to(torch.bfloat16)
    out = []
    for f in (fn, compiled):
        xi = x.clone().requires_grad_()
        y = f(xi)
        out.append((y.detach(), torch.autograd.grad(y, xi, d_y)[0]))
    return out


@test
@quick
def fullgraph_static_shapes_bitwise_equal_to_eager():
    torch._dynamo.reset()
    compiled = torch.compile(attend, fullgraph=True)
    (y, g), (yc, gc) = eager_and_compiled(attend, compiled, 256, 1)
    assert torch.equal(y, yc), "compiled forward differs from eager"
    assert torch.equal(g, gc), "compiled backward differs from eager"


@test
def fullgraph_dynamic_shapes():
    torch._dynamo.reset()
    compiled = torch.compile(attend, fullgraph=True, dynamic=True)
    # the fake op is symbolic: one graph for all lengths on each side of delta_source auto's 128 keys
    # (the exact delta up to them, no o_residual; the compensated one above)
    for t, seed in ((128, 2), (200, 3), (512, 4)):
        (y, g), (yc, gc) = eager_and_compiled(attend, compiled, t, seed)
        assert torch.equal(y, yc) and torch.equal(g, gc), f"T = {t}: compiled differs from eager"


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fc2 = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        x = x + self.proj(attend(self.qkv(self.ln1(x))))
        return x + self.fc2(nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))


@test
def transformer_block_compiles_whole_and_trains():
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = Block().cuda()
    opt = torch.optim.AdamW(block.parameters(), lr=1e-3)
    step = torch.compile(block, fullgraph=True)
    x = torch.randn(4, 256, C, device="cuda")
    losses = []
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))), f"losses {losses}"
    assert losses[-1] < losses[0], f"three AdamW steps did not lower the loss: {losses}"
    print(f"    block losses {[round(l, 4) for l in losses]}")


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("0 passed, 0 failed, 1 skipped (no GPU)")
        sys.exit(0)
    main()
