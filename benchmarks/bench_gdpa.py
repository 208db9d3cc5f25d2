"""GDPA op vs the same math in eager PyTorch, under torch.compile (Inductor), and softmax SDPA.

All providers run in one process at the same shapes (Meta's: B=1152, H=4, D=128; q=kv in
{256, 512, 1024, 2048}; kv=256 with q in {512, 1024, 2048}), forward and forward+backward, bf16. Each
provider is checked against a float64 reference at the shape (small batch) before it is timed. Eager and
Inductor materialize N×N intermediates, so they run at a smaller batch where needed; rates are per FLOP
(fwd = 4·B·H·Nq·Nk·D, fwd+bwd = 3.5 × fwd), so the comparison is fair.

    PYTHONPATH=$PWD python3 benchmarks/bench_gdpa.py --out benchmarks/results/<run>/gdpa   # .json, .csv, .png
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton
from plotting import draw  # beside this file

from gdpa_inductor import gdpa
from gdpa_inductor.kernels.reference import gdpa_reference

META_SHAPES = [(256, 256), (512, 512), (1024, 1024), (2048, 2048), (512, 256), (1024, 256), (2048, 256)]
# Bytes allowed for one N×N bf16 intermediate of the eager/Inductor providers (several are alive at once).
NxN_BUDGET = 4 << 30


def gdpa_math(q, k, v, scale, post_scale, activation):
    """What a user writes today: the same math as plain torch ops."""
    s = q @ k.transpose(-2, -1) * scale
    if activation == "gelu_tanh":
        p = F.gelu(s, approximate="tanh")
    else:
        p = getattr(F, activation)(s)
    return (p * post_scale) @ v


def make_providers(activation: str, scale: float, post_scale: float) -> dict[str, Callable]:
    # A fresh Dynamo cache per shape: otherwise the recompile limit silently turns the Inductor provider
    # back into eager after a few shapes.
    torch._dynamo.reset()
    compiled = torch.compile(gdpa_math, dynamic=False)
    return {
        "gdpa": lambda q, k, v: gdpa(q, k, v, activation=activation, scale=scale, post_scale=post_scale),
        "eager": lambda q, k, v: gdpa_math(q, k, v, scale, post_scale, activation),
        "inductor": lambda q, k, v: compiled(q, k, v, scale, post_scale, activation),
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=scale),
    }


def reference(name, q, k, v, scale, post_scale, activation):
    q, k, v = q.double(), k.double(), v.double()
    if name == "sdpa":
        return torch.softmax(q @ k.transpose(-2, -1) * scale, -1) @ v
    return gdpa_reference(q, k, v, None, activation, scale, post_scale)


def rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def batch_for(name: str, batch: int, h: int, nq: int, nk: int) -> int:
    if name in ("eager", "inductor"):
        return max(1, min(batch, NxN_BUDGET // (h * nq * nk * 2)))
    return batch


def warm_up_gpu(seconds: float):
    """Runs bf16 matmuls for ``seconds`` so the first shape is not timed on a GPU still raising its clocks
    (the first provider of a fresh process read up to 30% low)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


# untimed run of each provider before its timing in ``median_over_rounds`` (the CuTe benchmarks): with 300 ms
# one kernel timed twice in a row after a heavy forward+backward read within 0.9%, without it up to 3% apart
SETTLE_MS = 300.0


def median_over_rounds(
    fns: dict[str, Callable], rounds: int = 3, settle_ms: float = 0.0, **bench
) -> dict[str, float | None]:
    """Median ms of each provider over ``rounds`` rounds, each provider timed once per round (a do_bench
    median), every round in a rotated order. Under load the GPU sits at its power cap and lowers its clocks
    (H200: 1.5-1.8 GHz against 1.98 idle), so a provider's rate depends on what ran just before it; rotating
    gives each provider each place in the order, but not another predecessor. ``settle_ms``: each provider
    first runs untimed for that long, so the clocks settle to its own load whatever ran before it. A provider
    that fails is reported once and gives None."""
    names = list(fns)
    times: dict[str, list[float] | None] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            if times[name] is None:
                continue
            try:
                _run_for(fns[name], settle_ms)
                times[name].append(triton.testing.do_bench(fns[name], return_mode="median", **bench))
            except Exception as e:  # noqa: BLE001
                print(name, "failed:", type(e).__name__, str(e)[:300], flush=True)
                times[name] = None
    return {n: (sorted(t)[len(t) // 2] if t else None) for n, t in times.items()}


def _run_for(fn: Callable, ms: float):
    """Calls ``fn`` until ``ms`` milliseconds of wall time have passed (none when ms <= 0)."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        # a few calls per check keep the GPU as busy as do_bench's back-to-back calls do
        for _ in range(5):
            fn()
        torch.cuda.synchronize()


def time_provider(fn, q, k, v, do) -> tuple[float, float]:
    """Median ms of the forward and of forward+backward (gradients of q, k, v)."""
    fwd_ms = triton.testing.do_bench(lambda: fn(q, k, v), warmup=50, rep=300, return_mode="median")
    fb_ms = triton.testing.do_bench(
        lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), do), warmup=50, rep=300, return_mode="median"
    )
    return fwd_ms, fb_ms


def bench_shape(providers, args, nq, nk, dtype):
    rows = []
    h, d = args.heads, args.head_dim
    for name, fn in providers.items():
        if args.providers and name not in args.providers:
            continue
        # correctness at the shape, small batch, fresh random inputs, forward and gradients
        qs, ks, vs = (torch.randn(2, h, n, d, device="cuda", dtype=dtype, requires_grad=True) for n in (nq, nk, nk))
        out = fn(qs, ks, vs)
        err = rel_err(out, reference(name, qs, ks, vs, args.scale, 1.0 / nk, args.activation))
        b = batch_for(name, args.batch, h, nq, nk)
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dtype, requires_grad=True) for n in (nq, nk, nk))
        do = torch.randn(b, h, nq, d, device="cuda", dtype=dtype)
        flops = 4.0 * b * h * nq * nk * d
        fwd_ms, fb_ms = time_provider(fn, q, k, v, do)
        rows.append(dict(provider=name, q_len=nq, kv_len=nk, batch=b, rel_err=err, fwd_ms=fwd_ms, fwd_bwd_ms=fb_ms,
                         fwd_tflops=flops / fwd_ms * 1e-9, fwd_bwd_tflops=3.5 * flops / fb_ms * 1e-9))
        print(f"  {name:9s} q={nq:5d} kv={nk:5d} B={b:5d} err={err:.1e} fwd {rows[-1]['fwd_tflops']:6.1f} TF/s"
              f"  fwd+bwd {rows[-1]['fwd_bwd_tflops']:6.1f} TF/s", flush=True)
        del q, k, v, do
        torch.cuda.empty_cache()
    return rows


def print_table(rows):
    by = {}
    for r in rows:
        by.setdefault((r["q_len"], r["kv_len"]), {})[r["provider"]] = r
    print("\n| q | kv | " + " | ".join(f"{p} fwd | {p} f+b" for p in next(iter(by.values()))) +
          " | gdpa/inductor fwd | gdpa/inductor f+b |")
    for (nq, nk), ps in by.items():
        cells = " | ".join(f"{r['fwd_tflops']:.0f} | {r['fwd_bwd_tflops']:.0f}" for r in ps.values())
        ratio = ""
        if "gdpa" in ps and "inductor" in ps:
            g, i = ps["gdpa"], ps["inductor"]
            ratio = f" | {g['fwd_tflops'] / i['fwd_tflops']:.2f}x | {g['fwd_bwd_tflops'] / i['fwd_bwd_tflops']:.2f}x"
        print(f"| {nq} | {nk} | {cells}{ratio} |")


def cute_bench_parser(activation: str) -> argparse.ArgumentParser:
    """The options the CuTe benchmarks share: batch, heads, activation (default ``activation``), settle time and output
    prefix."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1152)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--activation", default=activation)
    ap.add_argument("--settle-ms", type=float, default=SETTLE_MS, help="untimed run of each provider before its timing")
    ap.add_argument("--out", default=None, help="path prefix for the .json results and their .png plot")
    return ap


def run_cute_bench(args, run: Callable[[list], None], benchmark: str, **meta) -> None:
    """A CuTe benchmark's main after ``cute_bench_parser``: warms the GPU up, ``run(rows)`` and writes the rows with
    the device, the versions, the date, ``benchmark`` (the script's name) and ``meta`` to ``--out``.json, and their
    plot to ``--out``.png."""
    rows = []
    warm_up_gpu(3.0)
    run(rows)
    if args.out:
        meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                    date=datetime.date.today().isoformat(), benchmark=benchmark) | meta
        with open(args.out + ".json", "w") as f:
            json.dump(dict(meta, rows=rows), f, indent=1)
        draw(dict(meta, rows=rows), args.out + ".png")


def time_by_pass(row: dict, fns: dict[str, Callable], flops: dict[str, float], settle_ms: float) -> dict:
    """Times ``fns`` (names "<provider>_<pass>[_variant]") by ``median_over_rounds`` and writes each one's TF/s
    into ``row`` from ``flops`` of its pass; prints the row and returns it."""
    for name, ms in median_over_rounds(fns, settle_ms=settle_ms, warmup=25, rep=100).items():
        if ms is not None:
            row[name] = flops[name.split("_")[1]] / ms * 1e-9
    print({k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1152)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--activation", default="gelu_tanh")
    ap.add_argument("--shapes", nargs="*", default=[f"{a}x{b}" for a, b in META_SHAPES])
    ap.add_argument("--providers", nargs="*", default=None)
    ap.add_argument("--out", default=None, help="path prefix for .json/.csv/.png")
    ap.add_argument("--warmup-s", type=float, default=3.0, help="seconds of matmuls before the first shape")
    args = ap.parse_args()
    args.scale = 1.0 / math.sqrt(args.head_dim)
    if not torch.cuda.is_available():
        raise SystemExit("bench_gdpa.py needs a CUDA GPU")
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                date=datetime.date.today().isoformat(), benchmark="bench_gdpa",
                command="python3 benchmarks/bench_gdpa.py " + " ".join(__import__("sys").argv[1:]))
    rows = []
    warm_up_gpu(args.warmup_s)
    for shape in args.shapes:
        nq, nk = map(int, shape.split("x"))
        providers = make_providers(args.activation, args.scale, 1.0 / nk)
        rows += bench_shape(providers, args, nq, nk, torch.bfloat16)
    print_table(rows)
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
        with open(args.out + ".csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        draw(dict(meta=meta, rows=rows), args.out + ".png")


if __name__ == "__main__":
    main()
