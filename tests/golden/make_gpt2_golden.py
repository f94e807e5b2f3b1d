#!/usr/bin/env python3
"""Writes tests/golden/gpt2_tiny_golden.safetensors: a tiny GPT-2 (standard attention, no biases,
tied embeddings, vocab 60 padded to 64) computed by PyTorch in float64, for the C++ golden test.

Run once, with any PyTorch >= 2.0 (CPU is enough), and commit the output:
    python3 tests/golden/make_gpt2_golden.py tests/golden/gpt2_tiny_golden.safetensors

Contents (float64 unless noted):
  tokens [6, B, T+1] int32      six batches; inputs = [:, :, :-1], targets = [:, :, 1:]
  param.<hf name>               initial parameters (Hugging Face GPT-2 names, Conv1D [in, out] layout)
  logits [B, T, Vp], loss []    forward on batch 0
  grad.<hf name>                gradients of the mean loss on batch 0
  adamw.loss [6]                loss on batch k after k AdamW steps (step k trained on batch k)
  adamw.lr, adamw.grad_norm, adamw.grad_l1 [5]   per step: lr, norm before clipping, L1 norm after
  muon.param.<hf name>          parameters after one Muon step (batch 0) from the initial ones
  muon.loss_after []            loss on batch 1 after that step
The hyper-parameters are in the file's metadata; the C++ test reads them from there.
"""
import json
import math
import struct
import sys

import torch

torch.manual_seed(1234)
DT = torch.float64
CFG = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=60, padded_vocab_size=64, batch=2, seq_len=16)
ADAMW = dict(lr=1e-2, min_lr=1e-3, warmup_steps=2, decay_steps=5, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)
MUON = dict(lr=5e-3, weight_decay=0.01, momentum=0.95, nesterov=True, ns_steps=5)
L, H, C, Tm, V, Vp, B, T = (CFG[k] for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "padded_vocab_size", "batch", "seq_len"))


def init_params():
    """nanoGPT init: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), LayerNorm weights 1."""
    p = {}
    n = lambda *shape, std=0.02: torch.randn(*shape, dtype=DT) * std
    p["transformer.wte.weight"] = n(Vp, C)
    p["transformer.wpe.weight"] = n(Tm, C)
    for l in range(L):
        h = f"transformer.h.{l}."
        # LayerNorm weights perturbed from 1 so their gradients and the test are generic.
        p[h + "ln_1.weight"] = 1 + n(C, std=0.1)
        p[h + "attn.c_attn.weight"] = n(C, 3 * C)
        p[h + "attn.c_proj.weight"] = n(C, C, std=0.02 / math.sqrt(2 * L))
        p[h + "ln_2.weight"] = 1 + n(C, std=0.1)
        p[h + "mlp.c_fc.weight"] = n(C, 4 * C)
        p[h + "mlp.c_proj.weight"] = n(4 * C, C, std=0.02 / math.sqrt(2 * L))
    p["transformer.ln_f.weight"] = 1 + n(C, std=0.1)
    return p


def layernorm(x, w):
    return torch.nn.functional.layer_norm(x, (C,), w, None, 1e-5)


def forward(p, idx, targets=None):
    """GPT-2 with pre-LN blocks, tanh GELU, standard causal attention, tied head (nanoGPT, bias=False)."""
    x = p["transformer.wte.weight"][idx] + p["transformer.wpe.weight"][: idx.shape[1]]
    D = C // H
    mask = torch.ones(idx.shape[1], idx.shape[1], dtype=torch.bool).tril()
    for l in range(L):
        h = f"transformer.h.{l}."
        qkv = layernorm(x, p[h + "ln_1.weight"]) @ p[h + "attn.c_attn.weight"]  # [B, T, 3C]
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, -1, H, D).transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, -1, C)
        x = x + y @ p[h + "attn.c_proj.weight"]
        m = torch.nn.functional.gelu(layernorm(x, p[h + "ln_2.weight"]) @ p[h + "mlp.c_fc.weight"], approximate="tanh")
        x = x + m @ p[h + "mlp.c_proj.weight"]
    logits = layernorm(x, p["transformer.ln_f.weight"]) @ p["transformer.wte.weight"].T  # [B, T, Vp]
    loss = None if targets is None else torch.nn.functional.cross_entropy(logits.reshape(-1, Vp), targets.reshape(-1))
    return logits, loss


def schedule(c, it):
    if it < c["warmup_steps"]:
        return c["lr"] * (it + 1) / (c["warmup_steps"] + 1)
    if it > c["decay_steps"]:
        return c["min_lr"]
    ratio = (it - c["warmup_steps"]) / (c["decay_steps"] - c["warmup_steps"])
    return c["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (c["lr"] - c["min_lr"])


def leaf_copy(p):
    return {k: v.clone().requires_grad_(True) for k, v in p.items()}


def is_hidden(name):
    return name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))


def adamw_groups(params, wd):
    decay = [v for v in params.values() if v.dim() >= 2]
    no_decay = [v for v in params.values() if v.dim() < 2]
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def newton_schulz(g, steps, eps=1e-7):
    """torch.optim.Muon's _zeropower_via_newtonschulz without its BF16 cast."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.clone()
    if g.size(0) > g.size(1):
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if g.size(0) > g.size(1) else x


def main(out_path):
    p0 = init_params()
    tokens = torch.randint(0, V, (6, B, T + 1), dtype=torch.int64)
    inputs, targets = tokens[:, :, :-1], tokens[:, :, 1:]
    out = {"tokens": tokens.to(torch.int32)}
    for k, v in p0.items():
        out["param." + k] = v

    # Forward and gradients on batch 0.
    p = leaf_copy(p0)
    logits, _ = forward(p, inputs[0])
    _, loss = forward(p, inputs[0], targets[0])
    loss.backward()
    out["logits"], out["loss"] = logits.detach(), loss.detach()
    for k, v in p.items():
        out["grad." + k] = v.grad.detach().clone()

    # Five AdamW steps with the paper's schedule and clipping; weight decay on 2-D tensors only.
    p = leaf_copy(p0)
    opt = torch.optim.AdamW(adamw_groups(p, ADAMW["weight_decay"]), lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"])
    losses, lrs, norms, l1s = [], [], [], []
    for step in range(5):
        opt.zero_grad()
        _, loss = forward(p, inputs[step], targets[step])
        loss.backward()
        losses.append(loss.item())
        norms.append(torch.nn.utils.clip_grad_norm_(list(p.values()), ADAMW["grad_clip"]).item())
        l1s.append(sum(v.grad.abs().sum().item() for v in p.values()))
        lr = schedule(ADAMW, step)
        lrs.append(lr)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
    with torch.no_grad():
        losses.append(forward(p, inputs[5], targets[5])[1].item())
    out["adamw.loss"], out["adamw.lr"] = torch.tensor(losses, dtype=DT), torch.tensor(lrs, dtype=DT)
    out["adamw.grad_norm"], out["adamw.grad_l1"] = torch.tensor(norms, dtype=DT), torch.tensor(l1s, dtype=DT)

    # One Muon step (torch.optim.Muon's rule, adjust_lr_fn="match_rms_adamw") on the hidden
    # matrices; AdamW with the same lr and betas on embeddings and 1-D tensors. No clipping.
    p = leaf_copy(p0)
    _, loss = forward(p, inputs[0], targets[0])
    loss.backward()
    lr = MUON["lr"]
    rest = {k: v for k, v in p.items() if not is_hidden(k)}
    adam = torch.optim.AdamW(adamw_groups(rest, MUON["weight_decay"]), lr=lr, betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"])
    adam.step()
    with torch.no_grad():
        for k, v in p.items():
            if not is_hidden(k):
                continue
            g = v.grad
            buf = torch.zeros_like(g).lerp_(g, 1 - MUON["momentum"])
            update = g.lerp(buf, MUON["momentum"]) if MUON["nesterov"] else buf
            update = newton_schulz(update, MUON["ns_steps"])
            v.mul_(1 - lr * MUON["weight_decay"])
            v.add_(update, alpha=-lr * 0.2 * math.sqrt(max(v.shape)))
        out["muon.loss_after"] = forward(p, inputs[1], targets[1])[1].detach()
    for k, v in p.items():
        out["muon.param." + k] = v.detach().clone()

    meta = {k: str(v) for k, v in CFG.items()}
    meta.update({"adamw." + k: repr(v) for k, v in ADAMW.items()})
    meta.update({"muon." + k: repr(v) for k, v in MUON.items()})
    meta["generator"] = f"tests/golden/make_gpt2_golden.py, torch {torch.__version__}"
    write_safetensors(out_path, out, meta)


def write_safetensors(path, tensors, metadata):
    names = {torch.float64: "F64", torch.int32: "I32"}
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        raw = t.numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden/gpt2_tiny_golden.safetensors")
