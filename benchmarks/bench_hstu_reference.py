"""HSTU attention as generative-recommenders' pure-PyTorch reference computes it, compiled by ``backend="gdpa"``
and by ``backend="inductor"``: forward + backward, same process, same inputs.

The model follows the reference's steps (written here, not imported): jagged q, k, v [L, H, D] padded to
[B, H, N, D] (pure-torch gathers stand in for fbgemm's jagged_to_padded_dense), ``einsum`` scores times alpha,
``silu(.) / N``, times the reference's mask built from ``arange``, ``eye`` and comparisons (causal, optionally
``max_attn_len``), ``einsum`` with V, and back to jagged rows. Lengths are uniform in [N/2, N]; H = 4, D = 128,
bf16. Both backends' outputs and q/k/v gradients are checked against float64 before timing.

    PYTHONPATH=$PWD python3 benchmarks/bench_hstu_reference.py --out benchmarks/results/<run>/hstu_reference.json
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import sys

import torch
import torch.nn.functional as F
import triton

import gdpa_inductor

H, D = 4, 128
SHAPES = [  # (batch, max length, max_attn_len)
    (64, 1024, 0),
    (64, 1024, 256),
    (128, 512, 0),
    (32, 2048, 0),
]


def padded(x: torch.Tensor, offsets: torch.Tensor, n: int) -> torch.Tensor:
    """[L, H, D] jagged rows -> [B, H, N, D], zeros past each sample's length."""
    lengths = offsets[1:] - offsets[:-1]
    pos = torch.arange(n, device=x.device)[None, :]
    src = (offsets[:-1, None] + pos).clamp(max=x.shape[0] - 1)
    valid = (pos < lengths[:, None])[..., None, None]
    return (x[src] * valid).transpose(1, 2)


def jagged(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """[B, H, N, V] -> [L, H, V]: the rows ``rows`` (flat b * N + i indices of the valid positions)."""
    b, h, n, v = x.shape
    return x.transpose(1, 2).reshape(b * n, h, v)[rows]


def valid_attn_mask(n: int, max_attn_len: int, device) -> torch.Tensor:
    ids = torch.arange(n, device=device)
    dist = ids.view(n, 1) - ids.view(1, n)
    mask = torch.logical_or(torch.eye(n, device=device, dtype=torch.bool), dist > 0)
    if max_attn_len > 0:
        mask = torch.logical_and(mask, dist <= max_attn_len)
    return mask.view(1, n, n)


def hstu_mha(q, k, v, offsets, rows, n: int, max_attn_len: int, alpha: float):
    qp, kp, vp = (padded(t, offsets, n) for t in (q, k, v))
    attn = torch.einsum("bhxa,bhya->bhxy", qp, kp) * alpha
    attn = F.silu(attn) / n
    attn = attn * valid_attn_mask(n, max_attn_len, q.device).unsqueeze(1)
    return jagged(torch.einsum("bhxd,bhdv->bhxv", attn, vp), rows)


def make_inputs(b: int, n: int, device, gen: torch.Generator):
    lengths = torch.randint(n // 2, n + 1, (b,), generator=gen)
    lengths[0] = n
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    rows = torch.cat([i * n + torch.arange(int(length)) for i, length in enumerate(lengths)])
    total = int(lengths.sum())
    qkv = [torch.randn(total, H, D, generator=gen).to(device, torch.bfloat16) for _ in range(3)]
    return qkv, offsets.to(device), rows.to(device)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach()).norm() / b.detach().norm().clamp_min(1e-30))


def bench_shape(b: int, n: int, max_attn_len: int, gen: torch.Generator) -> dict:
    (q, k, v), offsets, rows = make_inputs(b, n, "cuda", gen)
    fn = functools.partial(hstu_mha, offsets=offsets, rows=rows, n=n, max_attn_len=max_attn_len, alpha=D ** -0.5)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    dout = torch.randn(q.shape[0], H, D, generator=gen).to("cuda", torch.bfloat16)
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = fn(*ref_leaves)
    ref.backward(dout.double())
    eager_err = rel_err(fn(q, k, v), ref)
    row = dict(batch=b, max_len=n, max_attn_len=max_attn_len, eager_bf16_out_err=eager_err,
               fused=[line.strip() for line in str(gdpa_inductor.explain(fn, q, k, v)).splitlines()[1:]])
    for backend in ("inductor", "gdpa"):
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend=backend)

        def step(compiled=compiled):
            for t in leaves:
                t.grad = None
            out = compiled(*leaves)
            out.backward(dout)
            return out

        out = step()
        errs = [rel_err(out, ref)] + [rel_err(t.grad, r.grad) for t, r in zip(leaves, ref_leaves)]
        ms = triton.testing.do_bench(step, warmup=10, rep=100, return_mode="median")
        row[backend] = dict(ms=ms, rel_err=errs)
        print(f"B={b} N={n} max_attn_len={max_attn_len} {backend}: {ms:.3f} ms, errors {errs} "
              f"(eager bf16 out {eager_err:.2e})", flush=True)
    row["speedup"] = row["inductor"]["ms"] / row["gdpa"]["ms"]
    print(f"  gdpa vs inductor: {row['speedup']:.2f}x", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    rows_out = [bench_shape(b, n, max_attn_len, gen) for b, n, max_attn_len in SHAPES]
    if args.out:
        meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                    date=datetime.date.today().isoformat(), heads=H, head_dim=D, dtype="bfloat16",
                    command=" ".join(["python3 benchmarks/bench_hstu_reference.py", *sys.argv[1:]]))
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows_out), f, indent=1)


if __name__ == "__main__":
    main()
