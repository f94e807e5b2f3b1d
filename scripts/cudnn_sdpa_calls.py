"""Calls of cuDNN's attention through PyTorch's SDPA, for a profiler to time (profile-attention.sh,
attention-cycles.sh): random BF16 q, k, v of [B, H, T, D], the forward (and with `backward` its
backward too) N times in a row, so that the profiler can skip the first launches as warm-up.

    python3 scripts/cudnn_sdpa_calls.py B H T D causal|full forward|backward N
"""
import sys


def main(argv):
    if len(argv) != 7 or argv[4] not in ("causal", "full") or argv[5] not in ("forward", "backward"):
        sys.exit("usage: cudnn_sdpa_calls.py B H T D causal|full forward|backward N")
    b, h, t, d, n = (int(argv[i]) for i in (0, 1, 2, 3, 6))
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(n):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=argv[4] == "causal")
            if argv[5] == "backward":
                o.backward(torch.randn_like(o))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1:])
