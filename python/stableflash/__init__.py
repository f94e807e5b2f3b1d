"""stableflash: BF16 flash attention with a stabilized softmax (docs/python.md).

`stableflash.torch.attention` is the PyTorch op. This package module itself imports no torch, so
the C ABI loader (stableflash._capi) can be used and tested without PyTorch.
"""
__version__ = "0.1.0"
