"""``python -m gdpa_inductor.demo``: compile a small recommendation model with backend="gdpa".

The model is a sequence encoder with HSTU-style silu attention (causal, divided by N) followed by PMA
pooling (learned seed queries shared by every sample). It calls the fused op ``gdpa_inductor.gdpa``;
its twin writes the same math as plain torch ops, which is what Inductor compiles today. The demo
checks the compiled model's outputs and gradients against eager, reports which GDPA implementation ran
and why, and on a GPU times a training step of both.

The automatic rewrite of unmodified models (the twin, compiled with backend="gdpa") arrives with the
pattern passes; until then the backend hands graphs to Inductor as they are.
"""

from __future__ import annotations

import argparse
import logging
import time

import torch
import torch.nn.functional as F
from torch import nn

from . import gdpa


class _Decisions(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.seen: dict[str, int] = {}

    def emit(self, record):
        msg = record.getMessage()
        self.seen[msg] = self.seen.get(msg, 0) + 1


class DemoRecModel(nn.Module):
    def __init__(self, dim: int, heads: int, seeds: int, fused: bool):
        super().__init__()
        self.heads, self.fused = heads, fused
        self.qkv = nn.Linear(dim, 3 * dim)
        self.seed = nn.Parameter(torch.randn(1, heads, seeds, dim // heads))
        self.pool_kv = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(seeds * dim, 1)

    def _split(self, x):
        b, n, _ = x.shape
        return x.view(b, n, self.heads, -1).transpose(1, 2)

    def _attend(self, q, k, v, **kw):
        if self.fused:
            return gdpa(q, k, v, **kw)
        s = q @ k.transpose(-2, -1) * kw.get("scale", 1.0)
        p = getattr(F, kw["activation"])(s) * kw.get("post_scale", 1.0)
        if kw.get("causal"):
            n = s.shape[-1]
            p = p * torch.ones(n, n, dtype=torch.bool, device=s.device).tril()
        return p @ v

    def forward(self, x):
        b, n, dim = x.shape
        q, k, v = (self._split(t) for t in self.qkv(x).chunk(3, dim=-1))
        h = self._attend(q, k, v, activation="silu", post_scale=1.0 / n, causal=True)
        x = x + h.transpose(1, 2).reshape(b, n, dim)
        pk, pv = (self._split(t) for t in self.pool_kv(x).chunk(2, dim=-1))
        pooled = self._attend(self.seed, pk, pv, activation="gelu", scale=(dim // self.heads) ** -0.5)
        return self.out(pooled.transpose(1, 2).reshape(b, -1))


def _step(model, x):
    loss = model(x).float().square().mean()
    loss.backward()
    return loss.detach()


def _time_step(model, x, iters=20):
    for _ in range(3):
        _step(model, x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        _step(model, x)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="default: bfloat16 on GPU, float32 on CPU")
    ap.add_argument("--batch", type=int, default=None, help="default: 256 on GPU, 4 on CPU")
    ap.add_argument("--seq", type=int, default=None, help="default: 512 on GPU, 64 on CPU")
    ap.add_argument("--dim", type=int, default=None, help="model width; default 512 on GPU, 64 on CPU")
    ap.add_argument("--heads", type=int, default=4)
    args = ap.parse_args(argv)
    gpu = args.device.startswith("cuda")
    dtype = getattr(torch, args.dtype or ("bfloat16" if gpu else "float32"))
    batch = args.batch or (256 if gpu else 4)
    seq = args.seq or (512 if gpu else 64)
    dim = args.dim or (512 if gpu else 64)

    decisions = _Decisions()
    log = logging.getLogger("gdpa_inductor")
    log.addHandler(decisions)
    log.setLevel(logging.DEBUG)

    torch.manual_seed(0)
    fused = DemoRecModel(dim, args.heads, seeds=4, fused=True).to(args.device, dtype)
    plain = DemoRecModel(dim, args.heads, seeds=4, fused=False).to(args.device, dtype)
    plain.load_state_dict(fused.state_dict())
    x = torch.randn(batch, seq, dim, device=args.device, dtype=dtype)
    print(f"model: silu attention (causal, /N) + PMA pooling; batch {batch}, seq {seq}, dim {dim}, "
          f"heads {args.heads}, {dtype}, {args.device}", flush=True)

    print("compiling with backend='gdpa' (Inductor compiles the rest; a few seconds on CPU)...", flush=True)
    compiled = torch.compile(fused, backend="gdpa")
    loss_c = _step(compiled, x)
    grads_c = [p.grad.clone() for p in fused.parameters()]
    fused.zero_grad()
    loss_e = _step(plain, x)
    grads_e = [p.grad for p in plain.parameters()]
    worst = max(((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()
                for a, b in zip(grads_c, grads_e))
    print(f"check vs eager (unfused math): loss {loss_c.item():.6g} vs {loss_e.item():.6g}; "
          f"worst gradient rel. error {worst:.1e}")

    print("GDPA calls in the compiled model:")
    for msg, count in sorted(decisions.seen.items()):
        print(f"  {count:3d} x {msg}")
    if not gpu:
        print("CPU: the fused op ran its pure-PyTorch reference path; timing needs a GPU (skipped).")
        return

    print("timing one training step (forward + backward), 20 iterations after warm-up...", flush=True)
    plain.zero_grad()
    t_inductor = _time_step(torch.compile(plain, backend="inductor"), x)
    t_gdpa = _time_step(compiled, x)
    print(f"| backend | model | step ms |\n|---|---|---|\n| inductor | plain torch math | {t_inductor:.2f} |"
          f"\n| gdpa | fused op | {t_gdpa:.2f} |\nspeed-up: {t_inductor / t_gdpa:.2f}x")


if __name__ == "__main__":
    main()
