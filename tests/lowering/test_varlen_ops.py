"""The varlen custom ops: opcheck (schema, fakes, autograd registration) in every layout, and the dispatch
(Triton under the interpreter or on CUDA, else the reference)."""

from __future__ import annotations

import logging

import pytest
import torch
from gdpa_testing import INTERPRETING, KERNEL_OPCHECKS
from varlen_testing import LAYOUTS, make_case

from gdpa_inductor import config
from gdpa_inductor.kernels.reference_varlen import bias_shape, varlen_batch
from gdpa_inductor.lowering import varlen_ops

FWD = torch.ops.gdpa.varlen_fwd_v2.default
BWD = torch.ops.gdpa.varlen_bwd_v2.default


def _opcheck(op, args, backend):
    """opcheck: every default check on the reference; on the Triton kernels, those whose outcome they decide."""
    torch.library.opcheck(op, args, **(dict(test_utils=KERNEL_OPCHECKS) if backend == "triton" else {}))


def _bias(case, q, k, gen, shared: bool):
    """A relative-position-like bias shared by the samples ([H, max_q, max_k]) or one per sample."""
    kw = case.kwargs
    full = bias_shape(q, k, kw["cu_seqlens_q"], kw["cu_seqlens_k"], kw["max_seqlen_q"], kw["max_seqlen_k"],
                      varlen_batch(q, k, kw["cu_seqlens_q"], kw["cu_seqlens_k"]))
    return torch.randn(full[1:] if shared else full, generator=gen, dtype=q.dtype)


def _args(case, dtype, causal=True, window=(3, -1), bias=None):
    kw = case.kwargs
    q, k, v = case.inputs(dtype)
    return (q, k, v, bias, kw["cu_seqlens_q"], kw["cu_seqlens_k"], kw["seqused_q"], kw["seqused_k"],
            kw["max_seqlen_q"], kw["max_seqlen_k"], "silu", 0.3, 0.7, causal, *window, 0.01)


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_opcheck_fwd(layout, backend, gen, monkeypatch):
    if backend == "triton" and not INTERPRETING:
        pytest.skip("needs TRITON_INTERPRET=1 on CPU")
    monkeypatch.setattr(config, "backend", backend)
    dtype = torch.float64 if backend == "reference" else torch.float32
    _opcheck(FWD, _args(make_case(layout, gen), dtype), backend)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_opcheck_bwd(layout, gen, monkeypatch):
    monkeypatch.setattr(config, "backend", "reference")
    case = make_case(layout, gen)
    args = _args(case, torch.float64)
    out = FWD(*args)
    dout = torch.randn(out.shape, dtype=torch.float64, generator=gen)
    torch.library.opcheck(BWD, (dout, *[a.detach() if isinstance(a, torch.Tensor) else a for a in args], False))


@pytest.mark.parametrize("shared", [True, False], ids=["shared_bias", "per_sample_bias"])
@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_opcheck_with_bias(layout, backend, shared, gen, monkeypatch):
    """Forward with a bias, and (on the reference) the autograd registration with the bias's gradient (opcheck's
    test_aot_dispatch runs the backward through it)."""
    if backend == "triton" and not INTERPRETING:
        pytest.skip("needs TRITON_INTERPRET=1 on CPU")
    monkeypatch.setattr(config, "backend", backend)
    dtype = torch.float64 if backend == "reference" else torch.float32
    case = make_case(layout, gen)
    q, k, _ = case.inputs(dtype)
    bias = _bias(case, q, k, gen, shared).requires_grad_()
    _opcheck(FWD, _args(case, dtype, bias=bias), backend)


def test_fake_matches_real_shapes(gen):
    case = make_case("pma", gen)
    args = _args(case, torch.float32)
    real = FWD(*args)
    with torch._subclasses.FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake = FWD(*fake_args)
    assert fake.shape == real.shape == (len(case.lq), 7, 4, 24)


def test_dispatch_logs_the_reason(gen, caplog, monkeypatch):
    monkeypatch.setattr(config, "backend", "auto")
    case = make_case("self", gen)
    with caplog.at_level(logging.DEBUG, logger="gdpa_inductor"):
        varlen_ops.varlen_fwd(*_args(case, torch.float64))
    assert any("varlen forward: reference (dtype torch.float64" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_gradients_are_contiguous_for_strided_inputs(backend, gen, monkeypatch):
    """A padded model hands the op [B, N, H, D] views of [B, H, N, D] tensors: the real gradients must have
    the fake's (contiguous) strides, or Inductor's stride assertions fail."""
    if backend == "triton" and not INTERPRETING:
        pytest.skip("needs TRITON_INTERPRET=1 on CPU")
    monkeypatch.setattr(config, "backend", backend)
    case = make_case("padded", gen)
    args = list(_args(case, torch.float32))
    args[:3] = [t.detach().transpose(1, 2).contiguous().transpose(1, 2) for t in args[:3]]
    out = FWD(*args)
    dout = torch.randn(out.shape, generator=gen).transpose(1, 2).contiguous().transpose(1, 2)
    grads = BWD(dout, *args, False)
    for g, x in zip(grads, args[:3]):
        assert g.shape == x.shape and g.is_contiguous(), (g.shape, g.stride())
    _opcheck(BWD, (dout, *args, False), backend)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("layout", ["self", "padded_self"])
def test_one_rows_tensor_reaches_both_passes_as_one(layout, compiled, gen, monkeypatch):
    """The CuTe kernels take a causal varlen call only where both sides' rows come from one tensor
    (``varlen_causal_support``): that tensor reaches the forward's and the backward's kernel choice as one tensor,
    through the eager fast path and through a torch.compile'd graph (its saved tensors included)."""
    seen = []
    for name in ("select_varlen_forward_impl", "select_varlen_backward_impl"):
        select = getattr(varlen_ops, name)

        def spy(*args, select=select, name=name):
            rows = args[7]  # (q, k, v, bias, causal, window, activation, rows[, bias_grad])
            seen.append((name, rows[0] is rows[1] and rows[2] is rows[3]))
            return select(*args)

        monkeypatch.setattr(varlen_ops, name, spy)
    case = make_case(layout, gen, h=2, hkv=2, d=16, dv=16)
    q, k, v = case.inputs(torch.float32)

    def run(q, k, v):
        from gdpa_inductor import gdpa_varlen

        return gdpa_varlen(q, k, v, **case.kwargs, causal=True, activation="silu")

    out = (torch.compile(run, backend="inductor", fullgraph=True) if compiled else run)(q, k, v)
    out.sum().backward()
    assert seen == [("select_varlen_forward_impl", True), ("select_varlen_backward_impl", True)]
