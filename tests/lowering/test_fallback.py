"""A kernel path that fails (it cannot import, compile or launch) hands the call to the next path: CuTe, then Triton,
then the reference. Each failure is logged once with its reason, the failed path is not retried for calls of the
same kind, a path the config forces raises, and running out of GPU memory is never hidden. The failures are made
on purpose here; CPU tensors stand in for CUDA ones, and Triton runs under the interpreter."""

from __future__ import annotations

import logging
import sys

import pytest
import torch
from gdpa_testing import INTERPRETING, randn, rel_err

from gdpa_inductor import gdpa, gdpa_varlen
from gdpa_inductor.lowering import dispatch, fallback, ops, varlen_ops

pytestmark = pytest.mark.skipif(not INTERPRETING, reason="Triton runs on CPU tensors under TRITON_INTERPRET=1")

# op -> (the module and name of its CuTe kernel, of its Triton kernel, the selector the op asks)
KERNELS = {
    "forward": ("gdpa_inductor.kernels.cute.gdpa_fwd.gdpa_fwd_cute_op",
                "gdpa_inductor.kernels.triton.gdpa_fwd.gdpa_fwd_triton", (ops, "select_forward_impl")),
    "backward": ("gdpa_inductor.kernels.cute.gdpa_bwd.gdpa_bwd_cute_op",
                 "gdpa_inductor.kernels.triton.gdpa_bwd.gdpa_bwd_triton", (ops, "select_backward_impl")),
    "varlen forward": ("gdpa_inductor.kernels.cute.varlen_fwd.gdpa_varlen_fwd_cute",
                       "gdpa_inductor.kernels.triton.varlen_fwd.gdpa_varlen_fwd_triton",
                       (varlen_ops, "select_varlen_forward_impl")),
    "varlen backward": ("gdpa_inductor.kernels.cute.varlen_bwd.gdpa_varlen_bwd_cute",
                        "gdpa_inductor.kernels.triton.varlen_bwd.gdpa_varlen_bwd_triton",
                        (varlen_ops, "select_varlen_backward_impl")),
}


@pytest.fixture(autouse=True)
def no_failures_yet(monkeypatch):
    monkeypatch.setattr(fallback, "_failed", {})


class Broken:
    """Stands in for a kernel launcher: raises ``error`` and counts its calls."""

    def __init__(self, error: Exception):
        self.error, self.calls = error, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        raise self.error


def _break(monkeypatch, target: str, error: Exception) -> Broken:
    broken = Broken(error)
    monkeypatch.setattr(target, broken)
    return broken


def _select_cute(monkeypatch, op: str):
    """The op picks CuTe for float32 calls; the float64 ones stay on the reference."""
    module, name = KERNELS[op][2]
    monkeypatch.setattr(module, name, lambda q, *args: "cute" if q.dtype == torch.float32 else "reference")


def _dense(gen):
    q, k, v = (randn(gen, 2, 2, 24, 16).requires_grad_() for _ in range(3))
    return (q, k, v), dict(activation="silu", scale=0.25, causal=True)


def _varlen(gen):
    cu = torch.tensor([0, 7, 24], dtype=torch.int32)
    q, k, v = (randn(gen, 24, 2, 16).requires_grad_() for _ in range(3))
    return (q, k, v, cu, cu, 17, 17), dict(activation="relu", causal=True)


def _run(op: str, gen) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The op's outputs (the forward, or the gradients) and the same in float64, which only the reference runs."""
    args, kw = _varlen(gen) if op.startswith("varlen") else _dense(gen)
    fn = gdpa_varlen if op.startswith("varlen") else gdpa
    results = []
    for inputs in (args, tuple(a.detach().double().requires_grad_() if torch.is_tensor(a) and a.is_floating_point()
                               else a for a in args)):
        out = fn(*inputs, **kw)
        if not op.endswith("backward"):
            results.append([out])
            continue
        grads = torch.autograd.grad(out, inputs[:3], torch.ones_like(out))
        results.append(list(grads))
    return results[0], results[1]


@pytest.mark.parametrize("op", KERNELS)
@pytest.mark.parametrize("error", [RuntimeError("the kernel did not compile"),
                                   ImportError("No module named 'cutlass'")], ids=["compile", "import"])
def test_a_failing_cute_kernel_hands_the_call_to_triton_once(monkeypatch, caplog, gen, op, error):
    _select_cute(monkeypatch, op)
    cute = _break(monkeypatch, KERNELS[op][0], error)
    with caplog.at_level(logging.WARNING, logger="gdpa_inductor"):
        for _ in range(2):
            out, ref = _run(op, gen)
            for o, r in zip(out, ref):
                assert rel_err(o, r) < 1e-5
    assert cute.calls == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"gdpa {op}: the cute kernel failed ({type(error).__name__}: {error})" in warnings[0]
    assert "run on triton" in warnings[0]


@pytest.mark.parametrize("op", KERNELS)
def test_a_failing_triton_kernel_hands_the_call_to_the_reference(monkeypatch, caplog, gen, op):
    triton_kernel = _break(monkeypatch, KERNELS[op][1], RuntimeError("out of shared memory"))
    with caplog.at_level(logging.WARNING, logger="gdpa_inductor"):
        out, ref = _run(op, gen)
    assert triton_kernel.calls == 1
    for o, r in zip(out, ref):
        assert rel_err(o, r) < 1e-5
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"gdpa {op}: the triton kernel failed (RuntimeError: out of shared memory); calls like this one run on "
        "reference from now on"]


def test_cute_then_triton_failing_ends_on_the_reference(monkeypatch, caplog, gen):
    _select_cute(monkeypatch, "forward")
    cute = _break(monkeypatch, KERNELS["forward"][0], RuntimeError("no sm_90 image"))
    triton_kernel = _break(monkeypatch, KERNELS["forward"][1], RuntimeError("ptxas failed"))
    with caplog.at_level(logging.WARNING, logger="gdpa_inductor"):
        out, ref = _run("forward", gen)
    assert rel_err(out[0], ref[0]) < 1e-5
    assert (cute.calls, triton_kernel.calls) == (1, 1)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2


def test_a_failure_is_remembered_per_kind_of_call(monkeypatch, gen):
    """Another activation is another kernel variant: it is tried on its own."""
    triton_kernel = _break(monkeypatch, KERNELS["forward"][1], RuntimeError("ptxas failed"))
    q, k, v = (randn(gen, 2, 2, 24, 16) for _ in range(3))
    for activation in ("silu", "silu", "relu"):
        gdpa(q, k, v, activation=activation)
    assert triton_kernel.calls == 2


@pytest.mark.parametrize("op", KERNELS)
def test_a_forced_path_raises_its_own_error(monkeypatch, gen, op):
    monkeypatch.setattr("gdpa_inductor.config.backend", "triton")
    _break(monkeypatch, KERNELS[op][1], RuntimeError("ptxas failed"))
    with pytest.raises(RuntimeError, match="ptxas failed"):
        _run(op, gen)


def test_running_out_of_gpu_memory_is_not_hidden(monkeypatch, gen):
    _break(monkeypatch, KERNELS["forward"][1], torch.cuda.OutOfMemoryError("CUDA out of memory"))
    with pytest.raises(torch.cuda.OutOfMemoryError):
        _run("forward", gen)
    assert not fallback._failed


def test_a_cute_module_that_cannot_import_is_not_selected(monkeypatch, caplog, gen):
    """The support check itself imports the CuTe modules: where they fail, the check says no and why."""
    monkeypatch.setattr(dispatch, "on_cuda", lambda q: True)
    monkeypatch.setitem(sys.modules, "gdpa_inductor.kernels.cute.fwd_support", None)
    q, k, v = (randn(gen, 2, 2, 24, 16) for _ in range(3))
    with caplog.at_level(logging.DEBUG, logger="gdpa_inductor"):
        assert dispatch.select_forward_impl(q, k, v, None, False, "silu") == "triton"
    assert any("the CuTe support check failed (ModuleNotFoundError" in r.getMessage() for r in caplog.records)


def test_a_compiled_graph_falls_back_too(monkeypatch, gen):
    _break(monkeypatch, KERNELS["forward"][1], RuntimeError("ptxas failed"))

    def attention(q, k, v):
        return torch.nn.functional.silu(q @ k.transpose(-2, -1) * 0.25) @ v

    q, k, v = (randn(gen, 2, 2, 24, 16) for _ in range(3))
    torch._dynamo.reset()
    before = torch._dynamo.utils.counters["gdpa"]["rewrites"]
    out = torch.compile(attention, backend="gdpa", fullgraph=True)(q, k, v)
    assert torch._dynamo.utils.counters["gdpa"]["rewrites"] == before + 1
    assert rel_err(out, attention(*(t.double() for t in (q, k, v)))) < 1e-5
