"""Sweeps of the Triton kernels' tile configs: the dense kernels (``triton``) and the varlen backward (``varlen``). GPU
only; not part of the package's runtime.

    PYTHONPATH=$PWD python3 benchmarks/tune.py <benchmark> [options]   # <benchmark> --help: what it sweeps
"""

from __future__ import annotations

import itertools
import json
from functools import partial

import torch
import triton

from benchmarks.harness.checks import rel_err
from benchmarks.harness.cli import Benchmark, main
from benchmarks.harness.operands import lengths_for
from gdpa_inductor.kernels.common.varlen_rows import with_tensor
from gdpa_inductor.kernels.reference import gdpa_reference, gdpa_reference_backward
from gdpa_inductor.kernels.triton.gdpa_bwd import gdpa_bwd_triton
from gdpa_inductor.kernels.triton.gdpa_fwd import gdpa_fwd_triton
from gdpa_inductor.kernels.triton.tile_configs import (
    BwdConfig,
    FwdConfig,
    default_bwd_configs,
    default_varlen_bwd_configs,
    tile_capability,
)
from gdpa_inductor.kernels.triton.varlen_bwd import gdpa_varlen_bwd_triton
from gdpa_inductor.lowering.varlen_ops import sides

# ---- triton ----------------------------------------------------------------------------------------------------------


FWD_GRID = [FwdConfig(m, n, w, s) for m, n, w, s in itertools.product((64, 128), (64, 128), (4, 8), (2, 3))]
# The two backward kernels are independent: sweep one with the other at its default (coordinate descent).
KV_GRID = [BwdConfig(m, n, w, s) for m, n, w, s in itertools.product((32, 64), (64, 128), (4, 8), (2, 3))]
Q_GRID = [BwdConfig(m, n, w, s) for m, n, w, s in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3))]


def _inputs(b, h, nq, nk, d, dtype):
    return [torch.randn(b, h, n, d, device="cuda", dtype=dtype) for n in (nq, nk, nk)]


def triton_options(ap):
    ap.add_argument("--shapes", nargs="+", default=["2048x2048", "2048x256"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--activation", default="gelu_tanh")
    ap.add_argument("--what", nargs="+", default=["fwd", "bwd"])
    ap.add_argument("--bwd-grid", choices=["kv", "q", "all"], default="all",
                    help="kv: sweep the dK/dV kernel; q: sweep the dQ kernel")
    ap.add_argument("--out", default=None)


def run_triton(args):
    """Sweeps the Triton kernels' tile configs at given shapes and prints the fastest (GPU only).

    Each config is first checked against a float64 reference on a small batch, then timed at the full shape.
    Used to set ``default_fwd_config`` / ``default_bwd_configs``; not part of the package's runtime.

        PYTHONPATH=$PWD python3 benchmarks/tune.py triton --shapes 2048x2048 2048x256 --out tune.json
    """
    dtype, act, d = torch.bfloat16, args.activation, args.head_dim
    results = []
    for shape in args.shapes:
        nq, nk = map(int, shape.split("x"))
        flops = 4.0 * args.batch * args.heads * nq * nk * d
        q, k, v = _inputs(args.batch, args.heads, nq, nk, d, dtype)
        do = torch.randn_like(q)
        sq, sk, sv = _inputs(2, args.heads, nq, nk, d, dtype)
        sdo = torch.randn_like(sq)
        post = 1.0 / nk
        ref = gdpa_reference(sq.double(), sk.double(), sv.double(), None, act, 1.0, post)
        ref_g = gdpa_reference_backward(sdo.double(), sq.double(), sk.double(), sv.double(), None, act, 1.0, post)
        if "fwd" in args.what:
            best = None
            for cfg in FWD_GRID:
                try:
                    err = rel_err(gdpa_fwd_triton(sq, sk, sv, None, act, 1.0, post, False, 0.01, cfg), ref)
                    ms = triton.testing.do_bench(
                        partial(gdpa_fwd_triton, q, k, v, None, act, 1.0, post, False, 0.01, cfg), return_mode="median")
                except Exception as e:  # out of shared memory / registers for this tile
                    print(f"fwd {shape} {cfg}: failed {type(e).__name__}")
                    continue
                tf = flops / ms * 1e-9
                results.append(dict(kind="fwd", shape=shape, cfg=cfg.__dict__, ms=ms, tflops=tf, err=err))
                print(f"fwd {shape} {cfg} {tf:7.1f} TF/s err {err:.1e}", flush=True)
                if err < 2e-2 and (best is None or tf > best[0]):
                    best = (tf, cfg)
            print(f"BEST fwd {shape}: {best}", flush=True)
        if "bwd" in args.what:
            best = None
            kv_default, q_default = default_bwd_configs(d, d, dtype, nk,
                                                        capability=tile_capability(torch.device("cuda")))
            candidates = []
            if args.bwd_grid in ("kv", "all"):
                candidates += [(c, q_default) for c in KV_GRID]
            if args.bwd_grid in ("q", "all"):
                candidates += [(kv_default, c) for c in Q_GRID]
            for cfgs in candidates:
                try:
                    g = gdpa_bwd_triton(sdo, sq, sk, sv, None, act, 1.0, post, False, 0.01, False, cfgs)
                    err = max(rel_err(a, b) for a, b in zip(g[:3], ref_g[:3]))
                    ms = triton.testing.do_bench(
                        partial(gdpa_bwd_triton, do, q, k, v, None, act, 1.0, post, False, 0.01, False, cfgs),
                        return_mode="median")
                except Exception as e:
                    print(f"bwd {shape} {cfgs}: failed {type(e).__name__}")
                    continue
                tf = 2.5 * flops / ms * 1e-9
                results.append(dict(kind="bwd", shape=shape, kv=cfgs[0].__dict__, q=cfgs[1].__dict__, ms=ms,
                                    tflops=tf, err=err))
                print(f"bwd {shape} {cfgs[0]} {cfgs[1]} {tf:7.1f} TF/s err {err:.1e}", flush=True)
                if err < 2e-2 and (best is None or tf > best[0]):
                    best = (tf, cfgs)
            print(f"BEST bwd {shape}: {best}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


# ---- varlen ----------------------------------------------------------------------------------------------------------


# the jagged shapes' heads, head dim, batch and activation
H, D, BATCH, ACT = 4, 128, 1152, "gelu_tanh"
VARLEN_KV_GRID = [BwdConfig(m, n, w, s)
                  for m, n, w, s in itertools.product((16, 32, 64), (32, 64, 128), (4, 8), (2, 3))]
VARLEN_Q_GRID = [BwdConfig(m, n, w, s)
                 for m, n, w, s in itertools.product((32, 64, 128), (32, 64), (4, 8), (2, 3))]


def _problem(max_len: int, sparsity: float, gen):
    lengths = lengths_for(BATCH, max_len, sparsity, gen)
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).to(torch.int32)]).cuda()
    total = int(lengths.sum())
    q, k, v, do = (torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    _, qs, ks, order = sides(q, k, cu, cu, None, None, max_len, max_len, False)
    return qs, ks, v, with_tensor(qs, do), order


def _bwd(problem, cfgs):
    qs, ks, v, dos, order = problem
    return gdpa_varlen_bwd_triton(dos, qs, ks, v, None, order, ACT, D**-0.5, 1.0, False, (-1, -1), 0.01, False, cfgs)


def float_rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _time(problem, cfgs, expected) -> float | None:
    try:
        got = _bwd(problem, cfgs)
        err = max(float_rel_err(a, b) for a, b in zip(got[:3], expected[:3]))
        if err > 1e-2:
            print(f"  {cfgs}: wrong (rel err {err:.1e})")
            return None
        return triton.testing.do_bench_cudagraph(lambda: _bwd(problem, cfgs), rep=40)
    except Exception as e:  # out of shared memory / registers for this tile
        print(f"  {cfgs}: failed {type(e).__name__}")
        return None


def varlen_options(ap):
    ap.add_argument("--shapes", nargs="+", default=["256:0.5", "256:1.0", "512:0.5"])
    ap.add_argument("--out", default=None)


def run_varlen(args):
    """Sweeps the varlen backward kernels' tile configs on Meta's jagged shapes and prints the fastest (GPU only).

    Coordinate descent as in ``triton``: the dK/dV grid with the dQ kernel at its default, then the dQ grid
    with the best dK/dV config; the best few pairs are then re-timed at the other shapes. Each config's gradients
    are compared with the default config's (bf16 relative error) before it counts. Times are the GPU's
    (``do_bench_cudagraph``) for the two backward kernels, on the schedule the op would use.

        PYTHONPATH=$PWD python3 benchmarks/tune.py varlen --out tune_varlen.json
    """
    gen = torch.Generator().manual_seed(0)
    shapes = [(int(s.split(":")[0]), float(s.split(":")[1])) for s in args.shapes]
    problems = {s: _problem(*s, gen) for s in shapes}
    first = shapes[0]
    default = default_varlen_bwd_configs(D, D, torch.bfloat16, first[0],
                                         capability=tile_capability(torch.device("cuda")))
    expected = {s: _bwd(p, default) for s, p in problems.items()}
    rows = []

    def record(shape, cfgs):
        ms = _time(problems[shape], cfgs, expected[shape])
        if ms is not None:
            rows.append(dict(shape=list(shape), kv=cfgs[0].__dict__, q=cfgs[1].__dict__, ms=ms))
            print(f"{shape} kv={cfgs[0]} q={cfgs[1]}: {ms:.4f} ms", flush=True)
        return ms

    base = record(first, default)
    kv_times = [(record(first, (c, default[1])), c) for c in VARLEN_KV_GRID]
    best_kv = min(((t, c) for t, c in kv_times if t is not None), key=lambda tc: tc[0])[1]
    q_times = [(record(first, (best_kv, c)), c) for c in VARLEN_Q_GRID]
    ranked = sorted(((t, c) for t, c in q_times if t is not None), key=lambda tc: tc[0])[:3]
    print(f"default {default}: {base:.4f} ms; best dK/dV {best_kv}; best dQ {[c for _, c in ranked]}")
    for shape in shapes[1:]:
        record(shape, default)
        for _, c in ranked:
            record(shape, (best_kv, c))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(rows=rows, device=torch.cuda.get_device_name(), triton=triton.__version__), f, indent=1)


BENCHMARKS = {
    "triton": Benchmark(run_triton, triton_options),
    "varlen": Benchmark(run_varlen, varlen_options),
}

if __name__ == "__main__":
    main(__doc__, BENCHMARKS)
