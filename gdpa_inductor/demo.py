"""``python -m gdpa_inductor.demo``: compile a small recommendation model with backend="gdpa".

The model is plain PyTorch, written as recommendation models write it, on a jagged batch (histories of
different lengths, padded, with a validity mask built from the lengths): a sequence encoder with HSTU-style
silu attention (relative bias, causal mask, divided by N), a PFFN whose per-sample weights come from user
features, and PMA pooling (learned seed queries shared by every sample). The demo prints what the backend
fuses (``gdpa_inductor.explain``), checks the compiled model's loss and gradients against eager, and on a
GPU times a training step against backend="inductor".
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from .backend_comparison import compare_backends
from .explain import explain


class DemoRecModel(nn.Module):
    def __init__(self, dim: int, heads: int, seeds: int, dff: int, max_len: int):
        super().__init__()
        self.heads, self.dff = heads, dff
        self.qkv = nn.Linear(dim, 3 * dim)
        self.rel_bias = nn.Parameter(torch.randn(heads, max_len, max_len) * 0.02)
        self.user_to_w1 = nn.Linear(dim, dim * dff)
        self.user_to_w2 = nn.Linear(dim, dff * dim)
        self.seed = nn.Parameter(torch.randn(1, heads, seeds, dim // heads))
        self.pool_kv = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(seeds * dim, 1)

    def forward(self, x, lengths, user):
        b, n, dim = x.shape
        h, hd = self.heads, dim // self.heads
        valid = torch.arange(n, device=x.device)[None, :] < lengths[:, None]  # the padded batch's tokens
        # HSTU-style silu attention: relative bias, causal, / N, padding masked out
        q, k, v = self.qkv(x).view(b, n, 3, h, hd).permute(2, 0, 3, 1, 4).unbind(0)
        causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=x.device))
        p = F.silu(q @ k.transpose(-2, -1) / hd**0.5 + self.rel_bias[:, :n, :n]) / n
        p = torch.where(valid[:, None, :, None] & valid[:, None, None, :], p.masked_fill(~causal, 0), 0.0)
        x = x + (p @ v).transpose(1, 2).reshape(b, n, dim)
        # PFFN: per-sample (and per-head) weights generated from the user features
        w1 = self.user_to_w1(user).view(b, h, self.dff, hd)
        w2 = self.user_to_w2(user).view(b, h, self.dff, hd)
        xh = x.view(b, n, h, hd).transpose(1, 2)
        x = x + (F.gelu(xh @ w1.transpose(-2, -1) * hd**-0.5) @ w2 / self.dff).transpose(1, 2).reshape(b, n, dim)
        # PMA pooling: learned seed queries attend to each sample's tokens
        pk, pv = self.pool_kv(x).view(b, n, 2, h, hd).permute(2, 0, 3, 1, 4).unbind(0)
        s = self.seed.expand(b, -1, -1, -1) @ pk.transpose(-2, -1) * hd**-0.5
        s = s.masked_fill(~valid[:, None, None, :], -torch.finfo(s.dtype).max)
        pooled = F.gelu(s, approximate="tanh") / n @ pv
        return self.out(pooled.transpose(1, 2).reshape(b, -1))


def make_batch(batch: int, seq: int, dim: int, device, dtype) -> tuple:
    """Histories with lengths uniform in [1, seq], padded with zeros to the longest (seq)."""
    lengths = torch.randint(1, seq + 1, (batch,))
    lengths[0] = seq
    x = torch.randn(batch, seq, dim) * (torch.arange(seq)[None, :] < lengths[:, None]).unsqueeze(-1)
    user = torch.randn(batch, dim)
    return x.to(device, dtype), lengths.to(device), user.to(device, dtype)


def _loss(model, batch):
    return model(*batch).float().square().mean()


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="default: bfloat16 on GPU, float32 on CPU")
    ap.add_argument("--batch", type=int, default=None, help="default: 1024 on GPU, 4 on CPU")
    ap.add_argument("--seq", type=int, default=None, help="default: 512 on GPU, 32 on CPU")
    ap.add_argument("--dim", type=int, default=None, help="model width; default 512 on GPU, 64 on CPU")
    ap.add_argument("--heads", type=int, default=4)
    args = ap.parse_args(argv)
    gpu = args.device.startswith("cuda")
    dtype = getattr(torch, args.dtype or ("bfloat16" if gpu else "float32"))
    batch = args.batch or (1024 if gpu else 4)
    seq = args.seq or (512 if gpu else 32)
    dim = args.dim or (512 if gpu else 64)

    torch.manual_seed(0)
    model = DemoRecModel(dim, args.heads, seeds=4, dff=64, max_len=seq).to(args.device, dtype)
    batch_inputs = make_batch(batch, seq, dim, args.device, dtype)
    print(f"model: HSTU silu attention + PFFN + PMA pooling, plain PyTorch; batch {batch}, histories of 1..{seq} "
          f"tokens (padded), dim {dim}, heads {args.heads}, {dtype}, {args.device}", flush=True)

    print("what backend='gdpa' fuses:", flush=True)
    print(explain(model, *batch_inputs))

    print("compiling with backend='gdpa' (Inductor compiles the rest; seconds on CPU)...", flush=True)
    torch._dynamo.reset()
    loss_c = _loss(torch.compile(model, backend="gdpa"), batch_inputs)
    loss_c.backward()
    grads_c = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    loss_e = _loss(model, batch_inputs)
    loss_e.backward()
    worst = max(_rel(a, p.grad) for a, p in zip(grads_c, model.parameters()))
    model.zero_grad()
    print(f"check vs eager: loss {loss_c.item():.6g} vs {loss_e.item():.6g}; worst gradient rel. error {worst:.1e}")
    if not gpu:
        print("CPU: the fused op ran its pure-PyTorch reference path; timing needs a GPU (skipped).")
        return

    print("training step (forward, backward, SGD), backend='inductor' vs backend='gdpa':", flush=True)
    comparison = compare_backends(model, [batch_inputs] * 3, _loss)
    print(comparison)
    print("GDPA kernels in one step (forward and backward):")
    for name, us in comparison.runs["gdpa"].gdpa_kernels.items():
        print(f"  {name}: {us / 1e3:.2f} ms")


if __name__ == "__main__":
    main()
