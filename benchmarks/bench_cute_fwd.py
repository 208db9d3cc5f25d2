"""CuTe-DSL Hopper forward vs the Triton forward vs softmax SDPA (and flash-attn-4's SM90 forward when it
imports), one process, same shapes, bf16 (GPU only; needs nvidia-cutlass-dsl, and flash-attn-4 for its provider).

First a correctness sweep of the CuTe kernel against a float64 reference (every activation, ragged lengths,
GQA, D in {64, 128}, fp16/bf16), next to the Triton kernel's error at the same inputs; then forward TF/s at
Meta's shapes (B=1152, H=4; D=128 and D=64): each provider's do_bench median in three rounds of rotated order,
each provider first running untimed for ``SETTLE_MS`` so the clocks settle to its own load, the median of those
(``median_over_rounds``).

    PYTHONPATH=$PWD python3 benchmarks/bench_cute_fwd.py --out benchmarks/results/<run>/cute_fwd   # .json, .png
"""

from __future__ import annotations

import argparse
import datetime
import json
import time

import torch
import torch.nn.functional as F
import triton
from bench_gdpa import SETTLE_MS, median_over_rounds, warm_up_gpu  # beside this file
from plotting import draw

from gdpa_inductor.kernels.cute.gdpa_fwd import SUPPORTED_ACTIVATIONS, compile_fwd, fwd_supported, gdpa_fwd_cute
from gdpa_inductor.kernels.reference import gdpa_reference
from gdpa_inductor.kernels.triton.gdpa_fwd import gdpa_fwd_triton

META_SHAPES = [(256, 256), (512, 512), (1024, 1024), (2048, 2048), (512, 256), (1024, 256), (2048, 256)]


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


# (activation, dtype, Z, H, Hkv, Nq, Nk, D): every activation ragged, fp16, GQA, D=64, tiny and long rows
CHECK_CASES = [(act, torch.bfloat16, 2, 4, 4, 300, 300, 128) for act in SUPPORTED_ACTIVATIONS] + [
    ("gelu_tanh", torch.float16, 2, 4, 4, 257, 129, 128),
    ("silu", torch.bfloat16, 2, 8, 2, 128, 1000, 128),
    ("silu", torch.bfloat16, 3, 4, 4, 1, 17, 64),
    ("gelu_tanh", torch.bfloat16, 2, 4, 1, 2048, 2048, 64),
    ("sigmoid", torch.bfloat16, 1, 2, 2, 17, 2048, 128),
]


def correctness(rows):
    torch.manual_seed(0)
    ok = True
    for act, dtype, z, h, hkv, nq, nk, d in CHECK_CASES:
        q = torch.randn(z, h, nq, d, device="cuda", dtype=dtype)
        k = torch.randn(z, hkv, nk, d, device="cuda", dtype=dtype)
        v = torch.randn(z, hkv, nk, d, device="cuda", dtype=dtype)
        scale, post = d**-0.5, 1.0 / nk
        supported, why = fwd_supported(q, k, v, None, False, act)
        ref = gdpa_reference(q.double(), k.double(), v.double(), None, act, scale, post)
        tri = _rel(gdpa_fwd_triton(q, k, v, None, act, scale, post, False, 0.01), ref)
        err = _rel(gdpa_fwd_cute(q, k, v, act, scale, post, 0.01), ref) if supported else float("nan")
        passed = supported and err <= 2 * tri + 1e-4
        ok &= passed
        row = dict(kind="check", act=act, dtype=str(dtype), z=z, h=h, hkv=hkv, nq=nq, nk=nk, d=d,
                   cute_err=err, triton_err=tri, passed=passed, why=why)
        rows.append(row)
        print(row, flush=True)
    # NaN/Inf inputs as in the Triton kernel (a non-finite query row must not leak into padded keys)
    q = torch.randn(1, 2, 130, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 2, 200, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q[0, 0, 3, 5] = float("inf")
    a = gdpa_fwd_cute(q, k, v, "relu", 1.0, 1.0, 0.01)
    b = gdpa_fwd_triton(q, k, v, None, "relu", 1.0, 1.0, False, 0.01)
    same_nan = torch.equal(a.isnan(), b.isnan()) and torch.equal(a.isinf(), b.isinf())
    ok &= same_nan
    rows.append(dict(kind="check_nonfinite", same_nan_inf_pattern=same_nan))
    print("non-finite pattern equal:", same_nan, flush=True)
    return ok


def fa4_function(name: str = "flash_attn_func"):
    """flash-attn-4's ``name`` from its interface (its SM90 kernels on Hopper), or None where it does not
    import."""
    try:
        from flash_attn.cute import interface
    except Exception as e:  # not staged, or no SM90 build
        print("flash-attn-4 unavailable:", type(e).__name__, e, flush=True)
        return None
    return getattr(interface, name)


def timing(rows, batch, heads, act):
    fa4 = fa4_function()
    for d in (128, 64):
        for nq, nk in META_SHAPES:
            q = torch.randn(batch, heads, nq, d, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(batch, heads, nk, d, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            flops = 4.0 * batch * heads * nq * nk * d
            scale, post = d**-0.5, 1.0 / nk
            providers = {
                "cute": lambda: gdpa_fwd_cute(q, k, v, act, scale, post, 0.01),
                "triton": lambda: gdpa_fwd_triton(q, k, v, None, act, scale, post, False, 0.01),
                "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, scale=scale),
            }
            if fa4 is not None:
                qb, kb, vb = (t.transpose(1, 2).contiguous() for t in (q, k, v))
                providers["fa4"] = lambda: fa4(qb, kb, vb, softmax_scale=scale)
            row = dict(kind="fwd", d=d, nq=nq, nk=nk, batch=batch, heads=heads)
            for name, ms in median_over_rounds(providers, settle_ms=SETTLE_MS).items():
                if ms is not None:
                    row[name] = flops / ms * 1e-9
            for other in ("triton", "sdpa", "fa4"):
                if "cute" in row and other in row:
                    row[f"cute_vs_{other}"] = row["cute"] / row[other]
            rows.append(row)
            print({k_: (round(v_, 3) if isinstance(v_, float) else v_) for k_, v_ in row.items()}, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1152)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--activation", default="gelu_tanh")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    t = time.time()
    compile_fwd(torch.bfloat16, 128, args.activation)
    rows.append(dict(kind="compile_s", seconds=time.time() - t))
    print("compile", time.time() - t, flush=True)
    ok = True if args.skip_check else correctness(rows)
    print("CORRECT" if ok else "MISMATCH", flush=True)
    warm_up_gpu(3.0)
    timing(rows, args.batch, args.heads, args.activation)
    if args.out:
        results = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                       date=datetime.date.today().isoformat(), benchmark="bench_cute_fwd", activation=args.activation,
                       rows=rows)
        with open(args.out + ".json", "w") as f:
            json.dump(results, f, indent=1)
        draw(results, args.out + ".png")


if __name__ == "__main__":
    main()
