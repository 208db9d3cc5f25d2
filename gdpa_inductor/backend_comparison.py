"""Train one model a few steps under several ``torch.compile`` backends and compare them.

The demo, the examples and the model-level benchmark all ask the same question: does ``backend="gdpa"``
train the model exactly as ``backend="inductor"`` does, and how much faster? Each backend starts from the
same weights and sees the same batches; the report gives the loss of every step, the step time on a GPU
(forward, backward and optimizer step, after warm-up) and the GDPA kernels the profiler saw.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch

LossFn = Callable[[torch.nn.Module, tuple], torch.Tensor]


@dataclass
class BackendRun:
    backend: str
    losses: list[float]
    step_ms: Optional[float] = None
    compile_s: float = 0.0
    gdpa_kernels: dict[str, float] = field(default_factory=dict)
    error: Optional[str] = None


@dataclass
class Comparison:
    runs: dict[str, BackendRun]
    baseline: str = "inductor"

    def loss_rel_diff(self, backend: str = "gdpa") -> float:
        """Largest relative difference between ``backend``'s and the baseline's per-step losses."""
        a, b = self.runs[backend].losses, self.runs[self.baseline].losses
        return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))

    def speedup(self, backend: str = "gdpa") -> Optional[float]:
        t, base = self.runs[backend].step_ms, self.runs[self.baseline].step_ms
        return None if t is None or base is None else base / t

    def __str__(self) -> str:
        lines = ["| backend | compile s | losses (first → last) | step ms |", "|---|---|---|---|"]
        for run in self.runs.values():
            losses = f"{run.losses[0]:.6g} → {run.losses[-1]:.6g}" if run.losses else "—"
            step = run.error or ("—" if run.step_ms is None else f"{run.step_ms:.2f}")
            lines.append(f"| {run.backend} | {run.compile_s:.1f} | {losses} | {step} |")
        base_trained = bool(self.runs[self.baseline].losses)
        for b in [b for b in self.runs if b != self.baseline and self.runs[b].losses and base_trained]:
            line = f"{b} vs {self.baseline}: largest per-step loss difference {self.loss_rel_diff(b):.1e} (relative)"
            if self.speedup(b) is not None:
                line += f"; step {self.speedup(b):.2f}x faster"
            lines.append(line)
        return "\n".join(lines)


def train_steps(model: torch.nn.Module, batches: Sequence[tuple], loss_fn: LossFn, lr: float) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for batch in batches:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model, batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def time_step_ms(model: torch.nn.Module, batch: tuple, loss_fn: LossFn, lr: float, iters: int = 10,
                 repeats: int = 3) -> float:
    """Median over ``repeats`` of the mean wall time of ``iters`` CUDA training steps (fwd, bwd, SGD step)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model, batch).backward()
        opt.step()

    for _ in range(2):
        step()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / iters * 1e3)
    return statistics.median(times)


def gdpa_kernels(model: torch.nn.Module, batch: tuple, loss_fn: LossFn) -> dict[str, float]:
    """The GDPA kernels of one training step, by readable name (``kernels.names``), with their CUDA time in µs."""
    from torch.profiler import ProfilerActivity, profile

    from .kernels.names import kernel_name

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        loss_fn(model, batch).backward()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    for event in prof.key_averages():
        name = kernel_name(event.key)
        if name is not None:
            times[name] = round(times.get(name, 0.0) + event.device_time_total, 1)
    return times


def compare_backends(model: torch.nn.Module, batches: Sequence[tuple], loss_fn: LossFn, *,
                     backends: Sequence[str] = ("inductor", "gdpa"), lr: float = 1e-3, time_it: Optional[bool] = None,
                     iters: int = 10, progress: Callable[[str], None] = print) -> Comparison:
    """Train a copy of ``model`` on ``batches`` under each backend; on CUDA also time a step on ``batches[0]``.

    ``loss_fn(model, batch)`` returns the scalar loss. A backend that runs out of GPU memory is reported
    with the error instead of a time.
    """
    from .isolated_compile import dropping_new_cache_entries, on_fresh_code

    cuda = next(model.parameters()).is_cuda
    time_it = cuda if time_it is None else time_it
    runs = {}
    for backend in backends:
        # a copy whose forward runs on its own copy of the code: compiled afresh, and its cache entries dropped
        # after, leaving the user's own compiles of the model (and the other backends') alone
        copied = copy.deepcopy(model)
        copied.forward = on_fresh_code(copied.forward)
        with dropping_new_cache_entries():
            compiled = torch.compile(copied, backend=backend)
            progress(f"[{backend}] compiling and training {len(batches)} step(s)...")
            run = BackendRun(backend, losses=[])
            try:
                t0 = time.perf_counter()
                run.losses = train_steps(compiled, batches[:1], loss_fn, lr)
                run.compile_s = time.perf_counter() - t0
                run.losses += train_steps(compiled, batches[1:], loss_fn, lr)
                if time_it:
                    progress(f"[{backend}] timing a training step...")
                    run.step_ms = time_step_ms(compiled, batches[0], loss_fn, lr, iters)
                    run.gdpa_kernels = gdpa_kernels(compiled, batches[0], loss_fn)
            except torch.cuda.OutOfMemoryError as e:
                run.error = f"out of memory ({str(e).splitlines()[0][:80]})"
            del compiled
        del copied.forward, copied  # the bound forward refers back to the copy: freed here, not by a later collection
        if cuda:
            torch.cuda.empty_cache()
        runs[backend] = run
    return Comparison(runs, baseline=backends[0])


def add_run_options(ap: argparse.ArgumentParser) -> None:
    """The options every example shares: device, dtype, training steps, backends."""
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="default: bfloat16 on GPU, float32 on CPU")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--backends", default="inductor,gdpa", help="comma-separated; the first is the baseline")


def explain_and_compare(model: torch.nn.Module, batches: Sequence[tuple], loss_fn: LossFn, example_inputs: tuple,
                        backends: str) -> tuple:
    """What an example prints: the explain report on ``example_inputs``, then the backends' comparison.
    Returns (report, comparison)."""
    from .explain import explain

    report = explain(model, *example_inputs)
    print(report, flush=True)
    comparison = compare_backends(model, batches, loss_fn, backends=backends.split(","))
    print(comparison)
    if not next(model.parameters()).is_cuda:
        print("CPU: the fused ops ran their pure-PyTorch reference path; timing needs a GPU.")
    return report, comparison
