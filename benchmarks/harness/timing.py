"""The timing protocol: a warmed-up GPU, then each provider's do_bench median over rounds of rotated order, each
provider first running untimed so the clocks settle to its own load."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import triton

# untimed run of each provider before its timing in ``median_over_rounds`` (the CuTe benchmarks): with 300 ms
# one kernel timed twice in a row after a heavy forward+backward read within 0.9%, without it up to 3% apart
SETTLE_MS = 300.0


def warm_up_gpu(seconds: float):
    """Runs bf16 matmuls for ``seconds`` so the first shape is not timed on a GPU still raising its clocks
    (the first provider of a fresh process read up to 30% low)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


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


def time_by_pass(row: dict, fns: dict[str, Callable], flops: dict[str, float], settle_ms: float) -> dict:
    """Times ``fns`` (names "<provider>_<pass>[_variant]") by ``median_over_rounds`` and writes each one's TF/s
    into ``row`` from ``flops`` of its pass; prints the row and returns it."""
    for name, ms in median_over_rounds(fns, settle_ms=settle_ms, warmup=25, rep=100).items():
        if ms is not None:
            row[name] = flops[name.split("_")[1]] / ms * 1e-9
    print({k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    return row
