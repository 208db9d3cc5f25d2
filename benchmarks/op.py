"""The GDPA op, dense: its performance targets against softmax attention (``bars``), and against the same math as a
user writes it, in eager PyTorch and under Inductor (``math``). GPU only.

    PYTHONPATH=$PWD python3 benchmarks/op.py <benchmark> [options]   # <benchmark> --help: what it measures
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton

from benchmarks.harness.checks import rel_err
from benchmarks.harness.cli import Benchmark, add_cute_options, command_line, main
from benchmarks.harness.operands import META_SHAPES, fresh_operands
from benchmarks.harness.plotting import draw
from benchmarks.harness.providers import fa4_function, gdpa_math
from benchmarks.harness.results import run_cute_bench, run_meta, write_csv, write_json
from benchmarks.harness.timing import median_over_rounds, warm_up_gpu
from gdpa_inductor import config, gdpa
from gdpa_inductor.kernels.cute.gdpa_fwd import gdpa_fwd_cute
from gdpa_inductor.kernels.reference import gdpa_reference, gdpa_reference_backward
from gdpa_inductor.kernels.triton.gdpa_bwd import gdpa_bwd_triton
from gdpa_inductor.kernels.triton.gdpa_fwd import gdpa_fwd_triton

# Bytes allowed for one N×N bf16 intermediate of the eager/Inductor providers (several are alive at once).
NxN_BUDGET = 4 << 30

# ---- bars ------------------------------------------------------------------------------------------------------------

FWD_TFLOPS_AT_2048 = 620.0
OVER_BEST_SOFTMAX = 1.05
FWD_OVER_FA4_AT_KV256 = 1.25
D64_FWD_TFLOPS = 450.0
SOFTMAX = ("sdpa", "fa4")


def check_shape(q, k, v, do, act, scale, post) -> dict:
    """Relative errors against float64 of the op's output and gradients and of eager bf16's, on two samples."""
    q, k, v, do = (t[:2].detach() for t in (q, k, v, do))
    ref = gdpa_reference(q.double(), k.double(), v.double(), None, act, scale, post)
    ref_grads = gdpa_reference_backward(do.double(), q.double(), k.double(), v.double(), None, act, scale, post)
    errs = {}
    for who, fn in (("op", lambda a, b, c: gdpa(a, b, c, activation=act, scale=scale, post_scale=post)),
                    ("eager", lambda a, b, c: gdpa_math(a, b, c, scale, post, act))):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o = fn(*leaves)
        grads = torch.autograd.grad(o, leaves, do)
        for name, got, want in zip(("o", "dq", "dk", "dv"), (o, *grads), (ref, *ref_grads[:3])):
            errs[f"{name}_{who}"] = rel_err(got, want)
    errs["passed"] = all(errs[f"{n}_op"] <= 2 * errs[f"{n}_eager"] + 1e-4 for n in ("o", "dq", "dk", "dv"))
    return errs


def inductor_operands(q, k, v, do) -> tuple:
    """The first samples of the operands, as many as keep one N×N bf16 intermediate within ``NxN_BUDGET``."""
    z, h, nq = q.shape[:3]
    zi = max(1, min(z, NxN_BUDGET // (h * nq * k.shape[2] * 2)))
    return tuple(t[:zi] for t in (q, k, v, do))


def forward_providers(q, k, v, act, scale, post, fa4, all_providers=False) -> dict:
    fns = {
        "gdpa": lambda: gdpa(q, k, v, activation=act, scale=scale, post_scale=post),
        "cute_kernel": lambda: gdpa_fwd_cute(q, k, v, act, scale, post, 0.01),
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, scale=scale),
    }
    if fa4 is not None:
        qb, kb, vb = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        fns["fa4"] = lambda: fa4(qb, kb, vb, softmax_scale=scale)
    if all_providers:
        fns["triton"] = lambda: gdpa_fwd_triton(q, k, v, None, act, scale, post, False, 0.01)
        qi, ki, vi, _ = inductor_operands(q, k, v, q)
        compiled = fresh_inductor()
        fns["inductor"] = lambda: compiled(qi, ki, vi, scale, post, act)
    return fns


def fresh_inductor():
    # a fresh Dynamo cache per shape: the recompile limit would otherwise turn it back into eager (``math``)
    torch._dynamo.reset()
    return torch.compile(gdpa_math, dynamic=False)


def forward_backward_providers(q, k, v, do, act, scale, post, fa4, all_providers=False) -> dict:
    # torch.autograd.grad, not .backward(): no adds into .grad after the first call (kernels.py bwd)
    def through_autograd(fn, leaves, grad_out):
        def step():
            o = fn(*leaves)
            torch.autograd.grad(o[0] if isinstance(o, tuple) else o, leaves, grad_out)
        return step

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    fns = {
        "gdpa": through_autograd(lambda a, b, c: gdpa(a, b, c, activation=act, scale=scale, post_scale=post),
                                 leaves, do),
        "sdpa": through_autograd(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, scale=scale), leaves, do),
    }
    if fa4 is not None:
        bshd = [t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v)]
        fns["fa4"] = through_autograd(lambda a, b, c: fa4(a, b, c, softmax_scale=scale), bshd,
                                      do.transpose(1, 2).contiguous())
    if all_providers:
        fns["triton"] = lambda: (gdpa_fwd_triton(q, k, v, None, act, scale, post, False, 0.01),
                                 gdpa_bwd_triton(do, q, k, v, None, act, scale, post, False, 0.01, False))
        qi, ki, vi, doi = inductor_operands(q, k, v, do)
        compiled = fresh_inductor()
        fns["inductor"] = through_autograd(lambda a, b, c: compiled(a, b, c, scale, post, act),
                                           [t.detach().requires_grad_() for t in (qi, ki, vi)], doi)
    return fns


def bench_bars_shape(rows, d, nq, nk, batch, heads, act, fa4, with_backward, rounds, settle_ms,
                     all_providers=False):
    z, q, k, v, do = fresh_operands(batch, heads, nq, nk, d, d)
    scale, post = d**-0.5, 1.0 / nk
    check = check_shape(q, k, v, do, act, scale, post)
    rows.append(dict(kind="check", d=d, nq=nq, nk=nk, **check))
    print(rows[-1], flush=True)
    if not check["passed"]:
        return
    flops = 4.0 * z * heads * nq * nk * d
    share = {"inductor": inductor_operands(q, k, v, do)[0].shape[0] / z}
    passes = [("fwd", lambda: forward_providers(q, k, v, act, scale, post, fa4, all_providers), 1.0)]
    if with_backward:
        passes.append(("fb", lambda: forward_backward_providers(q, k, v, do, act, scale, post, fa4, all_providers),
                       3.5))
    for kind, providers, factor in passes:
        row = dict(kind=kind, d=d, nq=nq, nk=nk, batch=z, heads=heads)
        if all_providers:
            row["inductor_batch"] = round(share["inductor"] * z)
        fns = providers()
        for name, ms in median_over_rounds(fns, rounds=rounds, settle_ms=settle_ms, warmup=25, rep=100).items():
            if ms is not None:
                row[name] = factor * flops * share.get(name, 1.0) / ms * 1e-9
        rows.append(with_ratios(row))
        print({k_: (round(v_, 3) if isinstance(v_, float) else v_) for k_, v_ in row.items()}, flush=True)


def with_ratios(row: dict) -> dict:
    """``row`` with the op's rate over the best softmax provider's and over flash-attn-4's, where both ran."""
    best = max((row[s] for s in SOFTMAX if s in row), default=None)
    if best is not None and "gdpa" in row:
        row["gdpa_vs_best_softmax"] = row["gdpa"] / best
    if "fa4" in row and "gdpa" in row:
        row["gdpa_vs_fa4"] = row["gdpa"] / row["fa4"]
    return row


def check_bars(rows) -> list[dict]:
    """The targets against the timed ``rows``: one entry per bar and shape with the figure this run measured, what
    the bar needs and whether it is met. A shape or provider that has no figure (its check failed,
    flash-attn-4 did not import) fails the bars that need it."""
    bars = []

    def add(bar, shape, value, need):
        bars.append(dict(bar=bar, shape=shape, value=value, need=need, met=value is not None and value >= need))

    def timed(kind, d):
        return {(r["nq"], r["nk"]): r for r in rows if r["kind"] == kind and r["d"] == d}

    fwd, fb, fwd64 = timed("fwd", 128), timed("fb", 128), timed("fwd", 64)
    add("D=128 forward TF/s", "2048x2048", fwd.get((2048, 2048), {}).get("gdpa"), FWD_TFLOPS_AT_2048)
    for label, table in (("D=128 forward / best softmax", fwd), ("D=128 forward+backward / best softmax", fb)):
        for nq, nk in META_SHAPES:
            add(label, f"{nq}x{nk}", table.get((nq, nk), {}).get("gdpa_vs_best_softmax"), OVER_BEST_SOFTMAX)
    for nq, nk in META_SHAPES:
        if nk == 256:
            add("D=128 forward / flash-attn-4", f"{nq}x{nk}", fwd.get((nq, nk), {}).get("gdpa_vs_fa4"),
                FWD_OVER_FA4_AT_KV256)
    best64 = max(fwd64.items(), key=lambda item: item[1].get("gdpa", 0.0), default=None)
    add("D=64 forward TF/s (best shape)", f"{best64[0][0]}x{best64[0][1]}" if best64 else "-",
        best64[1].get("gdpa") if best64 else None, D64_FWD_TFLOPS)
    return bars


def print_bars(bars):
    for b in bars:
        value = "none" if b["value"] is None else f"{b['value']:.3f}"
        print(f"{'MET   ' if b['met'] else 'MISSED'} {b['bar']:<40} {b['shape']:<10} {value:>8} (needs {b['need']})")
    print(f"{sum(b['met'] for b in bars)} of {len(bars)} bars met", flush=True)


def bars_options(ap):
    add_cute_options(ap, "gelu_tanh")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--all-providers", action="store_true",
                    help="also the Triton kernels and Inductor on the same math (not in the bars)")


def run_bars(args):
    """The GDPA op's performance targets in one run: the op on its CuTe-DSL Hopper kernels (``gdpa``, backend forced to
    "cute") against softmax attention's best (``F.scaled_dot_product_attention`` and flash-attn-4's SM90 kernels where
    they import) at Meta's shapes, forward and forward+backward in one process, then every target ("bar") checked
    against this run's own figures (GPU only; needs nvidia-cutlass-dsl, and flash-attn-4 for its provider).

    bf16, H=4, ``gelu_tanh(q kᵀ / sqrt(D)) / Nk @ v``, B=1152 (a quarter of it past 1024², ``fresh_operands``): D=128
    forward and forward+backward at every Meta shape, D=64 forward. Each shape first checks the op's output and
    gradients on two samples against float64, next to the same math in eager bf16 (a shape whose check fails is not
    timed, and its bars fail). Times: each provider's do_bench median in ``--rounds`` rounds of rotated order, each
    provider first running untimed so the clocks settle to its own load (``median_over_rounds``); forward+backward
    through autograd for every provider (``torch.autograd.grad``). "CuTe kernel" is the forward kernel called
    directly, to show what the op's host dispatch costs; the bars read the op's figures.

        PYTHONPATH=$PWD python3 benchmarks/op.py bars --out benchmarks/results/<run>/cute_bars
        PYTHONPATH=$PWD python3 benchmarks/op.py bars --all-providers --rounds 3 \\
            --out benchmarks/results/<run>/cute_bars_all_providers
    """

    def run(rows):
        config.backend = "cute"
        fa4 = fa4_function()
        for d, with_backward in ((128, True), (64, False)):
            for nq, nk in META_SHAPES:
                bench_bars_shape(rows, d, nq, nk, args.batch, args.heads, args.activation, fa4, with_backward,
                                 args.rounds, args.settle_ms, args.all_providers)
        print_bars(check_bars(rows))

    run_cute_bench(args, run, activation=args.activation, rounds=args.rounds, all_providers=args.all_providers,
                   command=command_line())


# ---- math ------------------------------------------------------------------------------------------------------------


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


def batch_for(name: str, batch: int, h: int, nq: int, nk: int) -> int:
    if name in ("eager", "inductor"):
        return max(1, min(batch, NxN_BUDGET // (h * nq * nk * 2)))
    return batch


def time_provider(fn, q, k, v, do) -> tuple[float, float]:
    """Median ms of the forward and of forward+backward (gradients of q, k, v)."""
    fwd_ms = triton.testing.do_bench(lambda: fn(q, k, v), warmup=50, rep=300, return_mode="median")
    fb_ms = triton.testing.do_bench(
        lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), do), warmup=50, rep=300, return_mode="median"
    )
    return fwd_ms, fb_ms


def bench_math_shape(providers, args, nq, nk, dtype):
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


def math_options(ap):
    ap.add_argument("--batch", type=int, default=1152)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--activation", default="gelu_tanh")
    ap.add_argument("--shapes", nargs="*", default=[f"{a}x{b}" for a, b in META_SHAPES])
    ap.add_argument("--providers", nargs="*", default=None)
    ap.add_argument("--out", default=None, help="path prefix for .json/.csv/.png")
    ap.add_argument("--warmup-s", type=float, default=3.0, help="seconds of matmuls before the first shape")


def run_math(args):
    """GDPA op vs the same math in eager PyTorch, under torch.compile (Inductor), and softmax SDPA.

    All providers run in one process at the same shapes (Meta's: B=1152, H=4, D=128; q=kv in
    {256, 512, 1024, 2048}; kv=256 with q in {512, 1024, 2048}), forward and forward+backward, bf16. Each
    provider is checked against a float64 reference at the shape (small batch) before it is timed. Eager and
    Inductor materialize N×N intermediates, so they run at a smaller batch where needed; rates are per FLOP
    (fwd = 4·B·H·Nq·Nk·D, fwd+bwd = 3.5 × fwd), so the comparison is fair.

        PYTHONPATH=$PWD python3 benchmarks/op.py math --out benchmarks/results/<run>/gdpa   # .json, .csv, .png
    """
    args.scale = 1.0 / math.sqrt(args.head_dim)
    if not torch.cuda.is_available():
        raise SystemExit("op.py math needs a CUDA GPU")
    meta = run_meta(benchmark=args.benchmark, command=command_line())
    rows = []
    warm_up_gpu(args.warmup_s)
    for shape in args.shapes:
        nq, nk = map(int, shape.split("x"))
        providers = make_providers(args.activation, args.scale, 1.0 / nk)
        rows += bench_math_shape(providers, args, nq, nk, torch.bfloat16)
    print_table(rows)
    if args.out:
        write_json(args.out + ".json", dict(meta=meta, rows=rows))
        write_csv(args.out + ".csv", rows, list(rows[0]))
        draw(dict(meta=meta, rows=rows), args.out + ".png")


BENCHMARKS = {
    "bars": Benchmark(run_bars, bars_options, writes="bench_cute_bars"),
    "math": Benchmark(run_math, math_options, writes="bench_gdpa"),
}

if __name__ == "__main__":
    main(__doc__, BENCHMARKS)
