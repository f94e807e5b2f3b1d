"""How callers hold q, k, v ([B, H, T, D] logically) for the stride tests of stableflash.torch
(tests/python_cpu/test_op_cpu.py on the CPU, tests/python_gpu/test_op.py on the GPU): each built
from dense bhtd values, so results can be compared with the contiguous call bit for bit, and each a
view of a larger buffer, as the caller's code would make it."""
import torch


def nanogpt(q, k, v):
    """nanoGPT: qkv = x @ W [B, T, 3C]; q, k, v = qkv.split(C, dim=2), .view(B, T, H, D).transpose(1, 2)."""
    b, h, t, d = q.shape
    c = h * d
    qkv = torch.cat([x.transpose(1, 2).reshape(b, t, c) for x in (q, k, v)], dim=2)
    return [z.view(b, t, h, d).transpose(1, 2) for z in qkv.split(c, dim=2)]


def interleaved_heads(q, k, v):
    """[B, T, H, 3, D] storage (q, k, v of a head side by side)."""
    buf = torch.stack([x.transpose(1, 2) for x in (q, k, v)], dim=3)  # [B, T, H, 3, D]
    return [buf[:, :, :, i].transpose(1, 2) for i in range(3)]


def bthd(q, k, v):
    """Each dense in [B, T, H, D] storage (separate projections, .view(B, T, H, D).transpose(1, 2))."""
    return [x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v)]


def mixed(q, k, v):
    """q dense bhtd, k dense bthd, v a view of [T, B, H, D] storage."""
    return [q.contiguous(), k.transpose(1, 2).contiguous().transpose(1, 2), v.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)]


def wide_rows(q, k, v):
    """Every tensor the first D of rows 2D wide (a view no dense layout describes; rows aligned)."""
    return [torch.cat([x, torch.zeros_like(x)], dim=-1)[..., : x.shape[-1]] for x in (q, k, v)]


def odd_offsets(q, k, v):
    """Rows that start 2 bytes off (a storage offset of 1): the CPU reads them as they are, the GPU
    path copies them (the CUDA kernels need 16-byte aligned rows)."""
    out = []
    for x in (q, k, v):
        flat = torch.zeros(x.numel() + 1, dtype=x.dtype, device=x.device)
        view = flat[1:].view(x.shape)
        view.copy_(x)
        out.append(view)
    return out


ARRANGEMENTS = {"nanogpt": nanogpt, "interleaved_heads": interleaved_heads, "bthd": bthd, "mixed": mixed,
                "wide_rows": wide_rows, "odd_offsets": odd_offsets}
# the ones the GPU takes without a copy (odd_offsets is copied there)
ALIGNED = ("nanogpt", "interleaved_heads", "bthd", "mixed", "wide_rows")
