"""Sweeps the Triton kernels' tile configs at given shapes and prints the fastest (GPU only).

Each config is first checked against a float64 reference on a small batch, then timed at the full shape.
Used to set ``default_fwd_config`` / ``default_bwd_configs``; not part of the package's runtime.

    PYTHONPATH=$PWD python3 benchmarks/tune_triton.py --shapes 2048x2048 2048x256 --out tune.json
"""

from __future__ import annotations

import argparse
import itertools
import json
from functools import partial

import torch
import triton

from gdpa_inductor.kernels.reference import gdpa_reference, gdpa_reference_backward
from gdpa_inductor.kernels.triton.gdpa_bwd import BwdConfig, default_bwd_configs, gdpa_bwd_triton
from gdpa_inductor.kernels.triton.gdpa_fwd import FwdConfig, gdpa_fwd_triton

FWD_GRID = [FwdConfig(m, n, w, s) for m, n, w, s in itertools.product((64, 128), (64, 128), (4, 8), (2, 3))]
# The two backward kernels are independent: sweep one with the other at its default (coordinate descent).
KV_GRID = [BwdConfig(m, n, w, s) for m, n, w, s in itertools.product((32, 64), (64, 128), (4, 8), (2, 3))]
Q_GRID = [BwdConfig(m, n, w, s) for m, n, w, s in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3))]


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def _inputs(b, h, nq, nk, d, dtype):
    return [torch.randn(b, h, n, d, device="cuda", dtype=dtype) for n in (nq, nk, nk)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["2048x2048", "2048x256"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--activation", default="gelu_tanh")
    ap.add_argument("--what", nargs="+", default=["fwd", "bwd"])
    ap.add_argument("--bwd-grid", choices=["kv", "q", "all"], default="all",
                    help="kv: sweep the dK/dV kernel; q: sweep the dQ kernel")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
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
                    err = _rel(gdpa_fwd_triton(sq, sk, sv, None, act, 1.0, post, False, 0.01, cfg), ref)
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
            kv_default, q_default = default_bwd_configs(d, d, dtype, nk)
            candidates = []
            if args.bwd_grid in ("kv", "all"):
                candidates += [(c, q_default) for c in KV_GRID]
            if args.bwd_grid in ("q", "all"):
                candidates += [(kv_default, c) for c in Q_GRID]
            for cfgs in candidates:
                try:
                    g = gdpa_bwd_triton(sdo, sq, sk, sv, None, act, 1.0, post, False, 0.01, False, cfgs)
                    err = max(_rel(a, b) for a, b in zip(g[:3], ref_g[:3]))
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


if __name__ == "__main__":
    main()
