"""Sweeps the varlen backward kernels' tile configs on Meta's jagged shapes and prints the fastest (GPU only).

Coordinate descent as in ``tune_triton.py``: the dK/dV grid with the dQ kernel at its default, then the dQ grid
with the best dK/dV config; the best few pairs are then re-timed at the other shapes. Each config's gradients
are compared with the default config's (bf16 relative error) before it counts. Times are the GPU's
(``do_bench_cudagraph``) for the two backward kernels, on the schedule the op would use.

    PYTHONPATH=$PWD python3 benchmarks/tune_varlen.py --out tune_varlen.json
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import triton

from gdpa_inductor.kernels.common.varlen_rows import with_tensor
from gdpa_inductor.kernels.triton.gdpa_bwd import BwdConfig
from gdpa_inductor.kernels.triton.varlen_bwd import default_varlen_bwd_configs, gdpa_varlen_bwd_triton
from gdpa_inductor.lowering.varlen_ops import _sides

H, D, BATCH, ACT = 4, 128, 1152, "gelu_tanh"
KV_GRID = [BwdConfig(m, n, w, s) for m, n, w, s in itertools.product((16, 32, 64), (32, 64, 128), (4, 8), (2, 3))]
Q_GRID = [BwdConfig(m, n, w, s) for m, n, w, s in itertools.product((32, 64, 128), (32, 64), (4, 8), (2, 3))]


def _problem(max_len: int, sparsity: float, gen):
    if sparsity >= 1.0:
        lengths = torch.full((BATCH,), max_len, dtype=torch.int32)
    else:
        lengths = torch.randint(1, max_len + 1, (BATCH,), generator=gen, dtype=torch.int32)
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).to(torch.int32)]).cuda()
    total = int(lengths.sum())
    q, k, v, do = (torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    _, qs, ks, order = _sides(q, k, v, cu, cu, None, None, max_len, max_len)
    return qs, ks, v, with_tensor(qs, do), order


def _bwd(problem, cfgs):
    qs, ks, v, dos, order = problem
    return gdpa_varlen_bwd_triton(dos, qs, ks, v, None, order, ACT, D**-0.5, 1.0, False, (-1, -1), 0.01, False, cfgs)


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _time(problem, cfgs, expected) -> float | None:
    try:
        got = _bwd(problem, cfgs)
        err = max(_rel(a, b) for a, b in zip(got[:3], expected[:3]))
        if err > 1e-2:
            print(f"  {cfgs}: wrong (rel err {err:.1e})")
            return None
        return triton.testing.do_bench_cudagraph(lambda: _bwd(problem, cfgs), rep=40)
    except Exception as e:  # out of shared memory / registers for this tile
        print(f"  {cfgs}: failed {type(e).__name__}")
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["256:0.5", "256:1.0", "512:0.5"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    shapes = [(int(s.split(":")[0]), float(s.split(":")[1])) for s in args.shapes]
    problems = {s: _problem(*s, gen) for s in shapes}
    first = shapes[0]
    default = default_varlen_bwd_configs(D, D, torch.bfloat16, first[0])
    expected = {s: _bwd(p, default) for s, p in problems.items()}
    rows = []

    def record(shape, cfgs):
        ms = _time(problems[shape], cfgs, expected[shape])
        if ms is not None:
            rows.append(dict(shape=list(shape), kv=cfgs[0].__dict__, q=cfgs[1].__dict__, ms=ms))
            print(f"{shape} kv={cfgs[0]} q={cfgs[1]}: {ms:.4f} ms", flush=True)
        return ms

    base = record(first, default)
    kv_times = [(record(first, (c, default[1])), c) for c in KV_GRID]
    best_kv = min(((t, c) for t, c in kv_times if t is not None), key=lambda tc: tc[0])[1]
    q_times = [(record(first, (best_kv, c)), c) for c in Q_GRID]
    ranked = sorted(((t, c) for t, c in q_times if t is not None), key=lambda tc: tc[0])[:3]
    print(f"default {default}: {base:.4f} ms; best dK/dV {best_kv}; best dQ {[c for _, c in ranked]}")
    for shape in shapes[1:]:
        record(shape, default)
        for _, c in ranked:
            record(shape, (best_kv, c))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(rows=rows, device=torch.cuda.get_device_name(), triton=triton.__version__), f, indent=1)


if __name__ == "__main__":
    main()
