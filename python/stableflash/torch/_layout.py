"""Memory layouts the C++ attention takes: every tensor of a call dense in one of bhtd or bthd.
Tensors here are logically [B, H, T, D] (the op's dim order); "bthd" memory is such a tensor whose
storage is [B, T, H, D], as `x.view(B, T, H, D).transpose(1, 2)` gives in a transformer block."""
import torch


def memory_layout(x):
    """'bhtd' or 'bthd' when x is dense in that layout (bhtd first, as the C library tries), else None."""
    if x.is_contiguous():
        return "bhtd"
    if x.transpose(1, 2).is_contiguous():
        return "bthd"
    return None


def dense_in(x, layout):
    """x itself when it is already dense in `layout`, else one copy into it."""
    if layout == "bhtd":
        return x.contiguous()
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def empty(shape, layout, dtype, device):
    """An uninitialised [B, H, T, D] tensor dense in `layout`, from PyTorch's caching allocator."""
    b, h, t, d = shape
    if layout == "bhtd":
        return torch.empty((b, h, t, d), dtype=dtype, device=device)
    return torch.empty((b, t, h, d), dtype=dtype, device=device).transpose(1, 2)
