"""Shared test helpers (tolerances, seeded inputs, eager and float64 references, fixtures).

A module of its own, not conftest: tests/patterns has a conftest too, and ``from conftest import`` would
resolve to whichever was imported first."""

from __future__ import annotations

import math
import os
import zlib
from typing import Optional

import pytest
import torch
import torch.nn.functional as F

from gdpa_inductor.kernels.activations import ACTIVATION_NAMES
from gdpa_inductor.kernels.reference import gdpa_reference

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"

requires_interpreter = pytest.mark.skipif(
    not INTERPRETING, reason="runs the Triton kernels on CPU tensors, which needs TRITON_INTERPRET=1"
)

HALF_DTYPES = (torch.float16, torch.bfloat16)

# Relative-norm error allowed where no eager baseline is used: fp32 kernels accumulate in fp32 (a few ulps
# times sqrt(reduction length)), fp64 ones in fp64.
REL_TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
# Added to 2x the eager error for half precision, so that a degenerate case where eager happens to be exact
# does not demand exactness.
HALF_FLOOR = 1e-6


# torch.library.opcheck's checks whose outcome depends on the kernels that run: inputs neither mutated nor aliased by
# the outputs (test_schema), no output of the implementation itself that requires grad (test_autograd_registration),
# real outputs with the fake's shapes, strides and dtypes (test_faketensor). test_aot_dispatch_dynamic, the rest of
# the default set, traces the op with its fake and autograd formula (the same for every backend) and compares that run
# with an eager one on the same kernels: the reference backend's opchecks run it, and the Triton kernels' outputs and
# gradients are checked against float64 in tests/kernels. It runs the forward and the backward again, eager and
# traced: under the interpreter, most of an opcheck's time.
KERNEL_OPCHECKS = ("test_schema", "test_autograd_registration", "test_faketensor")


def dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@pytest.fixture
def gen(request) -> torch.Generator:
    """A generator seeded from the test id: each test draws its own fresh, reproducible inputs."""
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


def randn(gen: torch.Generator, *shape, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN if out has NaN, so every comparison with it fails)."""
    out64, ref64 = out.detach().to(torch.float64), ref.detach().to(torch.float64)
    assert out64.shape == ref64.shape, f"shape {tuple(out64.shape)} != reference {tuple(ref64.shape)}"
    num = (out64 - ref64).norm().item()
    den = ref64.norm().item()
    if den == 0.0:
        return num
    return num / den


def tolerance(dtype: torch.dtype, eager_err: Optional[float] = None) -> float:
    if dtype in HALF_DTYPES:
        assert eager_err is not None, "half precision is judged against eager PyTorch's own error"
        return 2.0 * eager_err + HALF_FLOOR
    return REL_TOL[dtype]


def assert_close_to_reference(
    out: torch.Tensor, ref64: torch.Tensor, *, dtype: torch.dtype, eager: Optional[torch.Tensor] = None, what: str = ""
) -> None:
    """The suite's accuracy standard: error vs a float64 reference at most 2x the error of eager PyTorch
    doing the same math in the same dtype (plus a tiny floor); fp32/fp64 use fixed relative thresholds."""
    err = rel_err(out, ref64)
    eager_err = rel_err(eager, ref64) if eager is not None else None
    tol = tolerance(dtype, eager_err)
    detail = f" (eager {dtype_id(dtype)} error {eager_err:.3g})" if eager_err is not None else ""
    assert err <= tol, f"{what}: relative error {err:.3g} > tolerance {tol:.3g}{detail}"


def eager_gdpa(q, k, v, bias=None, activation="gelu_tanh", scale=1.0, post_scale=1.0, causal=False,
               negative_slope=0.01):
    """GDPA as an unmodified model writes it, in the inputs' own dtype: repeat the kv heads for GQA, let
    the batch dims broadcast in the matmuls, mask after the activation."""
    group = q.shape[-3] // k.shape[-3]
    k = k.repeat_interleave(group, dim=-3)
    v = v.repeat_interleave(group, dim=-3)
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if bias is not None:
        s = s + bias
    p = EAGER_ACTIVATIONS[activation](s, negative_slope) * post_scale
    if causal:
        nq, nk = q.shape[-2], k.shape[-2]
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        p = p.masked_fill(j > i + (nk - nq), 0.0)
    return torch.matmul(p.to(v.dtype), v)


# What the model code would call, independent of the package's activation table.
EAGER_ACTIVATIONS = {
    "identity": lambda x, s: x,
    "relu": lambda x, s: F.relu(x),
    "relu_square": lambda x, s: F.relu(x) ** 2,
    "leaky_relu": lambda x, s: F.leaky_relu(x, s),
    "gelu": lambda x, s: F.gelu(x),
    "gelu_tanh": lambda x, s: F.gelu(x, approximate="tanh"),
    "silu": lambda x, s: F.silu(x),
    "sigmoid": lambda x, s: torch.sigmoid(x),
    "hardswish": lambda x, s: F.hardswish(x),
}
assert set(EAGER_ACTIVATIONS) == set(ACTIVATION_NAMES), "a new activation needs an eager form in tests/gdpa_testing.py"


def reference64(q, k, v, bias=None, **kw) -> torch.Tensor:
    """The package's reference evaluated in float64 (itself checked against a naive loop in
    tests/kernels/test_reference.py)."""
    d = lambda t: None if t is None else t.detach().to(torch.float64)  # noqa: E731
    return gdpa_reference(d(q), d(k), d(v), d(bias), **kw)


def default_scale(d: int) -> float:
    """Keeps the scores O(1) so that every activation is exercised on both sides of its kink."""
    return 1.0 / math.sqrt(d)


@pytest.fixture
def poison_empty(monkeypatch):
    """Makes ``torch.empty`` return NaN-filled floating tensors. torch.empty promises nothing about the
    contents, so correct code never reads an element it has not written; with this, a kernel that leaves
    part of an output unwritten (or accumulates into fresh memory) fails every time instead of only when
    the allocator happens to hand back dirty memory."""
    real_empty = torch.empty

    def nan_empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        if t.is_floating_point():
            with torch.no_grad():
                t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", nan_empty)


def wgmma_fragments_of(dq: torch.Tensor, query_tile: int) -> torch.Tensor:
    """dQ [Z, H, rows, D] (rows a whole number of ``query_tile``-row tiles) laid out as the 80-row CuTe backward leaves
    its fp32 sums, built from the PTX ISA's wgmma accumulator layout one (thread, value) at a time rather than from
    the launcher's permute: per tile, per warpgroup's 64 rows of dQᵀ (a half of D), per group of four values, per
    thread, its four values; thread 32 w + 4 g + t holds value c + 2 r + 4 j at row 16 w + 8 r + g (of D's half),
    column 8 j + 2 t + c (the tile's query)."""
    z, h, rows, d = dq.shape
    out = torch.empty(z, h, rows * d, dtype=dq.dtype)
    per_thread = query_tile * 64 // 128
    for tile in range(rows // query_tile):
        for half in range(d // 64):
            block = (tile * d // 64 + half) * query_tile * 64
            for thread in range(128):
                w, g, t = thread // 32, thread % 32 // 4, thread % 4
                for value in range(per_thread):
                    c, r, j = value % 2, value // 2 % 2, value // 4
                    out[:, :, block + (j * 128 + thread) * 4 + value % 4] = dq[
                        :, :, tile * query_tile + 8 * j + 2 * t + c, half * 64 + 16 * w + 8 * r + g]
    return out.view(z, h, rows, d)
