"""Running a zoo model eagerly or compiled, in training or inference, and collecting everything to compare:
the outputs and (training) the gradients of every floating input and parameter."""

from __future__ import annotations

import contextlib
import copy
import functools
from typing import Any, Callable, Optional

import torch
import torch.nn as nn
from torch._dynamo.utils import counters

from gdpa_inductor.backend import gdpa_backend
from gdpa_inductor.patterns.rewrite import CandidateReport, rewrite_gdpa

# AOT autograd without Inductor: the rewrite and the fused op's autograd are exercised, compiles are fast.
AOT_EAGER_GDPA = functools.partial(gdpa_backend, inner="aot_eager")

# bf16-autocast accuracy: compiled error vs a float64 eager run may be at most 2x eager-autocast's own error
# plus this floor. The floor is a quarter of bf16's unit roundoff (2^-9 ~ 2e-3): it only matters when eager
# happens to be (nearly) exact for some value, e.g. a gradient computed entirely in fp32, and it is far
# below the error of a wrong rewrite (a missing scale, mask or activation is an O(1) relative error).
BF16_FLOOR = 1e-3
# fp32: the fused op's CPU path is a pure-PyTorch reference; differences are reassociation only.
FP32_RTOL = 1e-5


def reset() -> None:
    torch._dynamo.reset()
    counters.clear()


def rewrites() -> int:
    return counters["gdpa"]["rewrites"]


def _flatten(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flatten(o)]
    raise TypeError(f"unexpected model output {type(out)}")


def cotangent(out: torch.Tensor, index: int) -> torch.Tensor:
    """A fixed random dO per output, rounded to bf16 so that every dtype sees the same values exactly."""
    gen = torch.Generator().manual_seed(1234 + index)
    g = torch.randn(out.shape, generator=gen).to(torch.bfloat16).to(torch.float64)
    return g.to(out.dtype)


def run(model: nn.Module, inputs: tuple, *, train: bool, autocast: bool = False,
        compile_with: Optional[Callable] = None, dynamic: bool = False) -> dict[str, torch.Tensor]:
    """{name: tensor} of the outputs and, when training, the gradients of the floating inputs and of the
    parameters. The model and inputs are not modified (inputs are cloned; parameter grads are reset)."""
    inputs = tuple(t.detach().clone().requires_grad_(train and t.is_floating_point()) for t in inputs)
    model.zero_grad(set_to_none=True)
    fn = model if compile_with is None else torch.compile(model, backend=compile_with, dynamic=dynamic)
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with torch.enable_grad() if train else torch.no_grad():
        with amp:
            outs = _flatten(fn(*inputs))
        results = {f"output[{i}]": o.detach() for i, o in enumerate(outs)}
        if train:
            pairs = [(o, cotangent(o, i)) for i, o in enumerate(outs) if o.requires_grad]
            assert pairs, "training run without a differentiable output"
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
            for i, t in enumerate(inputs):
                if t.requires_grad:
                    results[f"grad input[{i}]"] = t.grad
            for name, p in model.named_parameters():
                results[f"grad {name}"] = p.grad
    model.zero_grad(set_to_none=True)
    return results


def as_float64(model: nn.Module, inputs: tuple) -> tuple[nn.Module, tuple]:
    m = copy.deepcopy(model).double()
    return m, tuple(t.double() if t.is_floating_point() else t for t in inputs)


def rel_err(out: Optional[torch.Tensor], ref: Optional[torch.Tensor]) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN if out has NaN)."""
    assert (out is None) == (ref is None), "a gradient exists in only one of the runs"
    if out is None:
        return 0.0
    o, r = out.detach().double(), ref.detach().double()
    assert o.shape == r.shape, f"shape {tuple(o.shape)} != {tuple(r.shape)}"
    num, den = (o - r).norm().item(), r.norm().item()
    return num if den == 0.0 else num / den


def assert_fp32_close(got: dict, want: dict, what: str = "") -> None:
    assert got.keys() == want.keys(), f"{what}: results {sorted(got)} != {sorted(want)}"
    bad = {k: rel_err(got[k], want[k]) for k in want}
    bad = {k: e for k, e in bad.items() if not e <= FP32_RTOL}
    assert not bad, f"{what}: relative error above {FP32_RTOL}: " + ", ".join(f"{k}: {e:.3g}" for k, e in bad.items())


def assert_bf16_close(got: dict, eager: dict, ref64: dict, what: str = "") -> None:
    assert got.keys() == eager.keys() == ref64.keys(), f"{what}: results differ: {sorted(got)} / {sorted(ref64)}"
    bad = []
    for k in ref64:
        err, eager_err = rel_err(got[k], ref64[k]), rel_err(eager[k], ref64[k])
        tol = 2.0 * eager_err + BF16_FLOOR
        if not err <= tol:
            bad.append(f"{k}: {err:.3g} > {tol:.3g} (eager autocast {eager_err:.3g})")
    assert not bad, f"{what}: error vs float64 above 2x eager-autocast + {BF16_FLOOR}: " + "; ".join(bad)


class Recorder:
    """A recording backend. ``then_backend=True``: reports what the GDPA pass would do (dry run), then hands the
    graph to the real ``gdpa_backend(inner="aot_eager")``, which rewrites and counts. ``then_backend=False``:
    runs the pass itself (rewriting), records the rewritten code of every graph, and runs the graph as is."""

    def __init__(self, then_backend: bool = True):
        self.then_backend = then_backend
        self.reports: list[CandidateReport] = []
        self.codes: list[str] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        if self.then_backend:
            self.reports += rewrite_gdpa(gm, example_inputs, dry_run=True)
            return AOT_EAGER_GDPA(gm, example_inputs)
        self.reports += rewrite_gdpa(gm, example_inputs)
        self.codes.append(gm.code.strip())
        return gm.forward
