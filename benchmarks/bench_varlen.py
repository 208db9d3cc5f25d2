"""Jagged GDPA: the varlen op vs the padded dense op vs Inductor on the padded module (Meta's jagged shapes).

B = 1152 samples, H = 4, D = 128, bf16, self attention, lengths up to N in {256, 512, 1024, 2048} at
"sparsity" 1.0 (every sample full) and 0.5 (lengths uniform in [1, N]). Providers, one process:
- ``varlen``: ``gdpa_varlen`` on the jagged tokens (work follows the real tokens);
- ``padded_lengths``: ``gdpa_varlen`` on the padded [B, N, H, D] batch with per-sample valid lengths
  (``seqused``), what a padded model can be rewritten to;
- ``padded``: the dense op ``gdpa`` on the padded [B, H, N, D] batch (every padded row and column computed);
- ``inductor``: the padded module as users write it (``where(mask, act(QKᵀ·s)·post, 0) @ V`` with the
  validity mask built from the lengths), compiled by Inductor. Its N×N intermediates do not fit at B=1152,
  so it runs on a slice of the batch and its time is scaled to the whole batch (the padded work per sample
  is the same for every sample);
- ``backend_gdpa``: that module compiled with ``backend="gdpa"`` at the full batch (the length mask
  becomes the varlen op's per-sample lengths; ``backend_rewrites`` counts the rewrite).
The varlen op is checked against the float64 reference on 8 samples before timing. Each time is taken
twice (do_bench medians): launched from Python (triton.testing.do_bench:
includes the host's per-call dispatch, about 0.17 ms through the eager fast path, which bounds the shortest
calls) and replayed from a CUDA graph
(do_bench_cudagraph: the GPU's time, as under torch.compile's CUDA graphs). ``--quick``: a small grid.

    PYTHONPATH=$PWD python3 benchmarks/bench_varlen.py --out benchmarks/results/<run>/varlen   # .json, .csv, .png
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import types

import torch
import torch.nn.functional as F
import triton
from plotting import draw  # beside this file

from gdpa_inductor import gdpa, gdpa_varlen
from gdpa_inductor.kernels.reference_varlen import gdpa_varlen_reference

ACT, H, D = "gelu_tanh", 4, 128
SCALE, POST = D**-0.5, 1.0
INDUCTOR_SLICE = 64


def lengths_for(batch: int, max_len: int, sparsity: float, gen: torch.Generator) -> torch.Tensor:
    if sparsity >= 1.0:
        return torch.full((batch,), max_len, dtype=torch.int32)
    return torch.randint(1, max_len + 1, (batch,), generator=gen, dtype=torch.int32)


def padded_module(q, k, v, lengths):
    """HSTU-style padded attention as a user writes it: [B, H, N, D] with a validity mask built from the
    lengths, applied after the activation."""
    n = q.shape[-2]
    valid = torch.arange(n, device=q.device)[None, :] < lengths[:, None]
    mask = valid[:, None, :, None] & valid[:, None, None, :]
    p = F.gelu(q @ k.transpose(-2, -1) * SCALE, approximate="tanh") * POST
    return torch.where(mask, p, 0.0) @ v


def timed(fn, backward: bool, inputs, dout, graph: bool) -> float:
    """Milliseconds per call: launched from Python as a user would (``graph=False``: the host's dispatch
    cost included, which bounds short calls), or replayed from a CUDA graph (the GPU's time alone)."""
    def run():
        out = fn()
        if backward:
            torch.autograd.grad(out, inputs, dout)

    if graph:
        return triton.testing.do_bench_cudagraph(run, rep=60, return_mode="median")
    return triton.testing.do_bench(run, warmup=5, rep=60, return_mode="median")


def check_varlen(lengths, device) -> float:
    """Relative error of the varlen op (bf16) vs the float64 reference on the first 8 samples."""
    lens = lengths[:8]
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), lens.cumsum(0).to(torch.int32)]).to(device)
    t = int(lens.sum())
    q, k, v = (torch.randn(t, H, D, device=device, dtype=torch.float64) for _ in range(3))
    got = gdpa_varlen(q.bfloat16(), k.bfloat16(), v.bfloat16(), cu, cu, int(lens.max()), int(lens.max()),
                      activation=ACT, scale=SCALE, post_scale=POST)
    longest = int(lens.max())
    want = gdpa_varlen_reference(q, k, v, None, cu, cu, None, None, longest, longest, ACT, SCALE, POST, False,
                                 (-1, -1), 0.01)
    return ((got.double() - want).norm() / want.norm()).item()


def bench_shape(batch: int, max_len: int, sparsity: float, device, gen) -> dict:
    lengths = lengths_for(batch, max_len, sparsity, gen)
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).to(torch.int32)]).to(device)
    total = int(lengths.sum())
    row = dict(max_len=max_len, sparsity=sparsity, batch=batch, tokens=total,
               varlen_rel_err=check_varlen(lengths, device))
    mk = lambda *shape: torch.randn(*shape, device=device, dtype=torch.bfloat16, requires_grad=True)  # noqa: E731
    q, k, v = mk(total, H, D), mk(total, H, D), mk(total, H, D)
    dout = torch.randn(total, H, D, device=device, dtype=torch.bfloat16)
    used = lengths.to(device)
    qp, kp, vp = mk(batch, max_len, H, D), mk(batch, max_len, H, D), mk(batch, max_len, H, D)
    dp = torch.randn(batch, max_len, H, D, device=device, dtype=torch.bfloat16)
    providers = {
        "varlen": (lambda: gdpa_varlen(q, k, v, cu, cu, max_len, max_len, activation=ACT, scale=SCALE,
                                       post_scale=POST), (q, k, v), dout, 1.0),
        "padded_lengths": (lambda: gdpa_varlen(qp, kp, vp, None, None, max_len, max_len, activation=ACT, scale=SCALE,
                                               post_scale=POST, seqused_q=used, seqused_k=used),
                           (qp, kp, vp), dp, 1.0),
        "padded": (lambda: gdpa(qp.transpose(1, 2), kp.transpose(1, 2), vp.transpose(1, 2), activation=ACT,
                                scale=SCALE, post_scale=POST), (qp, kp, vp), dp.transpose(1, 2), 1.0),
    }
    b_ind = min(batch, INDUCTOR_SLICE)
    qi, ki, vi = (t[:b_ind].transpose(1, 2).detach().requires_grad_() for t in (qp, kp, vp))
    compiled = torch.compile(padded_module)
    providers["inductor"] = (lambda: compiled(qi, ki, vi, used[:b_ind]), (qi, ki, vi), dp[:b_ind].transpose(1, 2),
                             batch / b_ind)
    for name, (fn, inputs, d, factor) in providers.items():
        for backward in (False, True):
            for graph in (False, True):
                key = f"{name}_{'fwd_bwd' if backward else 'fwd'}{'_graph' if graph else ''}_ms"
                row[key] = timed(fn, backward, inputs, d, graph) * factor
    # The same module through backend="gdpa" (its length mask becomes the varlen op's per-sample lengths),
    # compiled from its own copy of the code so that its Dynamo cache is apart from Inductor's. Launch-timed
    # only: its compiled backward did not capture into a CUDA graph.
    own_code = padded_module.__code__.replace(co_name="padded_module_gdpa")
    via_backend = torch.compile(types.FunctionType(own_code, padded_module.__globals__), backend="gdpa")
    qb, kb, vb = (t.transpose(1, 2) for t in (qp, kp, vp))
    torch._dynamo.utils.counters.clear()
    via_backend(qb, kb, vb, used)
    row["backend_rewrites"] = torch._dynamo.utils.counters["gdpa"]["rewrites"]
    for backward in (False, True):
        key = f"backend_gdpa_{'fwd_bwd' if backward else 'fwd'}_ms"
        row[key] = timed(lambda: via_backend(qb, kb, vb, used), backward, (qp, kp, vp), dp.transpose(1, 2), False)
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="results/varlen")
    parser.add_argument("--quick", action="store_true", help="a small batch and two lengths")
    args = parser.parse_args()
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    batch, lens = (128, (256, 1024)) if args.quick else (1152, (256, 512, 1024, 2048))
    rows = []
    for max_len in lens:
        for sparsity in (1.0, 0.5):
            row = bench_shape(batch, max_len, sparsity, device, gen)
            rows.append(row)
            torch.cuda.empty_cache()
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    for row in rows:
        if row["sparsity"] < 1.0:
            full = next(r for r in rows if r["max_len"] == row["max_len"] and r["sparsity"] == 1.0)
            for what in ("fwd", "fwd_bwd", "fwd_graph", "fwd_bwd_graph"):
                row[f"varlen_{what}_vs_own_full"] = row[f"varlen_{what}_ms"] / full[f"varlen_{what}_ms"]
                row[f"padded_over_varlen_{what}"] = row[f"padded_{what}_ms"] / row[f"varlen_{what}_ms"]
                row[f"inductor_over_varlen_{what}"] = row[f"inductor_{what}_ms"] / row[f"varlen_{what}_ms"]
            for what in ("fwd", "fwd_bwd"):
                row[f"inductor_over_backend_gdpa_{what}"] = row[f"inductor_{what}_ms"] / row[f"backend_gdpa_{what}_ms"]
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                date=datetime.date.today().isoformat(), command="python3 benchmarks/bench_varlen.py"
                + (" --quick" if args.quick else ""), activation=ACT, heads=H, head_dim=D, dtype="bfloat16",
                benchmark="bench_varlen")
    with open(f"{args.out}.json", "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    with open(f"{args.out}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=sorted({k for r in rows for k in r}))
        writer.writeheader()
        writer.writerows(rows)
    draw(dict(meta=meta, rows=rows), f"{args.out}.png")


if __name__ == "__main__":
    main()
