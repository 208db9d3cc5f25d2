"""The gdpa custom ops: registration (opcheck), fakes, autograd, empty inputs, and the dispatch between the
Triton kernels and the reference."""

from __future__ import annotations

import logging

import pytest
import torch
from gdpa_testing import (
    INTERPRETING,
    KERNEL_OPCHECKS,
    assert_close_to_reference,
    default_scale,
    dtype_id,
    randn,
    reference64,
    requires_interpreter,
)
from torch._subclasses.fake_tensor import FakeTensorMode

from gdpa_inductor import gdpa
from gdpa_inductor.kernels.activations import ACTIVATION_NAMES
from gdpa_inductor.kernels.reference import gdpa_reference_backward
from gdpa_inductor.kernels.triton import gdpa_bwd as triton_bwd
from gdpa_inductor.kernels.triton import gdpa_fwd as triton_fwd
from gdpa_inductor.lowering import dispatch
from gdpa_inductor.lowering import ops as gdpa_ops

FWD = torch.ops.gdpa.attention_fwd_v1
BWD = torch.ops.gdpa.attention_bwd_v1
F64 = torch.float64

# The exp-based tanh of the interpreter path overflows to inf for large |x| by design.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

# name: (q shape, k shape, v shape, bias shape or None, causal)
OP_CASES = {
    "plain": ((2, 2, 6, 8), (2, 2, 7, 8), (2, 2, 7, 8), None, False),
    "bias_full_causal": ((2, 2, 6, 8), (2, 2, 9, 8), (2, 2, 9, 12), (2, 2, 6, 9), True),
    "gqa_bias_h_1_nk": ((2, 4, 6, 8), (2, 2, 7, 8), (2, 2, 7, 8), (4, 1, 7), False),
    "pma_q_batch1": ((1, 2, 5, 8), (3, 2, 7, 8), (3, 2, 7, 8), (5, 7), False),
    "causal_nq_gt_nk": ((2, 2, 9, 8), (2, 2, 5, 8), (2, 2, 5, 8), None, True),
}


def _case(gen, case, dtype, requires_grad=False):
    qs, ks, vs, bs, causal = OP_CASES[case]
    q, k, v = (randn(gen, *s, dtype=dtype).requires_grad_(requires_grad) for s in (qs, ks, vs))
    bias = randn(gen, *bs, dtype=dtype, scale=0.5).requires_grad_(requires_grad) if bs is not None else None
    return q, k, v, bias, causal


def _op_args(activation, d, causal):
    # (activation, scale, post_scale, causal, negative_slope) in the ops' positional order
    return (activation, default_scale(d), 0.6, causal, 0.2)


# ---- opcheck ----

def _opcheck(op, args, q, k, v, bias):
    """opcheck: every default check where the call runs the reference; where it runs the Triton kernels (float32
    under the interpreter), those whose outcome they decide."""
    on_triton, _ = dispatch.triton_support(q, k, v, bias)
    torch.library.opcheck(op, args, **(dict(test_utils=KERNEL_OPCHECKS) if on_triton else {}))


@pytest.mark.parametrize("case", OP_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
def test_opcheck_fwd(dtype, case, gen):
    q, k, v, bias, causal = _case(gen, case, dtype, requires_grad=True)
    _opcheck(FWD, (q, k, v, bias, *_op_args("gelu", q.shape[-1], causal)), q, k, v, bias)


@pytest.mark.parametrize("bias_grad", [True, False], ids=["dbias", "no_dbias"])
@pytest.mark.parametrize("case", OP_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
def test_opcheck_bwd(dtype, case, bias_grad, gen):
    q, k, v, bias, causal = _case(gen, case, dtype)
    batch = torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    dout = randn(gen, *batch, q.shape[-3], q.shape[-2], v.shape[-1], dtype=dtype)
    _opcheck(BWD, (dout, q, k, v, bias, *_op_args("silu", q.shape[-1], causal), bias_grad), q, k, v, bias)


# ---- autograd through the public function ----

@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
def test_gradcheck_fp64(activation, gen, backend):
    """Finite differences of the op itself: checks the registered backward independently of the
    reference's hand-written one."""
    backend("reference")
    # Small, since every input element is perturbed: GQA, a broadcast batch and a causal mask with Nq < Nk.
    q = randn(gen, 1, 4, 3, 4, dtype=F64).requires_grad_()
    k = randn(gen, 2, 2, 5, 4, dtype=F64).requires_grad_()
    v = randn(gen, 2, 2, 5, 3, dtype=F64).requires_grad_()
    bias = randn(gen, 4, 1, 5, dtype=F64, scale=0.5).requires_grad_()
    kw = dict(activation=activation, scale=0.5, post_scale=0.6, causal=True, negative_slope=0.2)
    assert torch.autograd.gradcheck(lambda q, k, v, b: gdpa(q, k, v, bias=b, **kw), (q, k, v, bias))


@pytest.mark.parametrize("case", ["bias_full_causal", "gqa_bias_h_1_nk", "pma_q_batch1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
def test_public_grads_vs_reference(activation, dtype, case, gen):
    q, k, v, bias, causal = _case(gen, case, dtype, requires_grad=True)
    kw = dict(activation=activation, scale=default_scale(q.shape[-1]), post_scale=0.6, causal=causal,
              negative_slope=0.2)
    out = gdpa(q, k, v, bias=bias, **kw)
    dout = randn(gen, *out.shape, dtype=dtype)
    grads = torch.autograd.grad(out, (q, k, v, bias), dout)
    expected = gdpa_reference_backward(
        *(t.detach().to(F64) for t in (dout, q, k, v, bias)), bias_requires_grad=True, **kw
    )
    assert_close_to_reference(out, reference64(q, k, v, bias, **kw), dtype=dtype, what="out")
    for name, g, e, leaf in zip(("dq", "dk", "dv", "dbias"), grads, expected, (q, k, v, bias)):
        assert g.shape == leaf.shape and g.dtype == dtype, name
        assert_close_to_reference(g, e, dtype=dtype, what=name)


@pytest.mark.parametrize("path", ["eager_fast_path", "custom_op"])
@pytest.mark.parametrize("bias_requires_grad", [True, False], ids=["bias_requires_grad", "bias_constant"])
def test_bias_grad_only_when_required(bias_requires_grad, path, gen, monkeypatch):
    calls = []
    real_bwd = gdpa_ops.backward_impl

    def spy(*args):
        calls.append(args[-1])
        return real_bwd(*args)

    monkeypatch.setattr(gdpa_ops, "backward_impl", spy)
    q, k, v, bias, causal = _case(gen, "gqa_bias_h_1_nk", F64, requires_grad=True)
    bias.requires_grad_(bias_requires_grad)
    if path == "custom_op":
        out = gdpa_ops.attention_fwd(q, k, v, bias, "gelu", 1.0, 1.0, False, 0.01)
    else:
        out = gdpa(q, k, v, bias=bias, activation="gelu")
    out.sum().backward()
    assert calls == [bias_requires_grad], "the backward must be asked for dbias exactly when bias needs it"
    assert all(t.grad is not None for t in (q, k, v))
    if bias_requires_grad:
        assert bias.grad is not None and bias.grad.shape == bias.shape
        assert bias.grad.abs().sum() > 0
    else:
        assert bias.grad is None


def test_only_bias_requires_grad(gen):
    q, k, v, bias, causal = _case(gen, "bias_full_causal", F64)
    bias.requires_grad_()
    kw = dict(activation="silu", scale=0.3, post_scale=0.6, causal=causal, negative_slope=0.01)
    out = gdpa(q, k, v, bias=bias, **kw)
    dout = randn(gen, *out.shape, dtype=F64)
    (dbias,) = torch.autograd.grad(out, bias, dout)
    expected = gdpa_reference_backward(dout, q, k, v, bias.detach(), bias_requires_grad=True, **kw)[3]
    assert_close_to_reference(dbias, expected, dtype=F64, what="dbias")


# ---- fakes ----

def _fake_vs_real(op, args):
    real = op(*args)
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake = op(*fake_args)
    real = real if isinstance(real, tuple) else (real,)
    fake = fake if isinstance(fake, tuple) else (fake,)
    assert len(real) == len(fake)
    for i, (r, f) in enumerate(zip(real, fake)):
        assert (tuple(f.shape), f.stride(), f.dtype, f.device) == (tuple(r.shape), r.stride(), r.dtype, r.device), (
            f"output {i}: fake {tuple(f.shape)} {f.stride()} {f.dtype}, real {tuple(r.shape)} {r.stride()} {r.dtype}"
        )


def _strided_case(gen, dtype):
    """Non-contiguous inputs: q from a [B, N, H, D] projection, k every other row, bias stored transposed."""
    q = randn(gen, 2, 6, 2, 8, dtype=dtype).permute(0, 2, 1, 3)
    k = randn(gen, 2, 2, 14, 8, dtype=dtype)[..., ::2, :]
    v = randn(gen, 2, 2, 7, 8, dtype=dtype)
    bias = randn(gen, 2, 2, 7, 6, dtype=dtype).transpose(-2, -1)
    return q, k, v, bias, True


FAKE_CASES = list(OP_CASES) + ["strided"]


def _fake_case(gen, case, dtype):
    return _strided_case(gen, dtype) if case == "strided" else _case(gen, case, dtype)


@pytest.mark.parametrize("case", FAKE_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
def test_fake_fwd_matches_real(dtype, case, gen):
    q, k, v, bias, causal = _fake_case(gen, case, dtype)
    _fake_vs_real(FWD, (q, k, v, bias, *_op_args("relu", q.shape[-1], causal)))


@pytest.mark.parametrize("bias_grad", [True, False], ids=["dbias", "no_dbias"])
@pytest.mark.parametrize("case", FAKE_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
def test_fake_bwd_matches_real(dtype, case, bias_grad, gen):
    q, k, v, bias, causal = _fake_case(gen, case, dtype)
    out = FWD(q, k, v, bias, *_op_args("relu", q.shape[-1], causal))
    dout = randn(gen, *out.shape, dtype=dtype)
    _fake_vs_real(BWD, (dout, q, k, v, bias, *_op_args("relu", q.shape[-1], causal), bias_grad))


# ---- empty inputs ----

EMPTY_CASES = {
    "nq0": ((2, 2, 0, 8), (2, 2, 5, 8), (2, 2, 5, 6)),
    "nk0": ((2, 2, 4, 8), (2, 2, 0, 8), (2, 2, 0, 6)),
    "batch0": ((0, 2, 4, 8), (0, 2, 5, 8), (0, 2, 5, 6)),
    "heads0": ((2, 0, 4, 8), (2, 0, 5, 8), (2, 0, 5, 6)),
}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", EMPTY_CASES)
@pytest.mark.parametrize(
    "forced, dtype",
    [("auto", torch.float32), ("auto", torch.float64), ("reference", torch.float64), ("triton", torch.float32)],
    ids=["auto-float32", "auto-float64", "reference-float64", "triton-float32"],
)
def test_empty_inputs(forced, dtype, case, causal, gen, backend):
    """Nothing to compute is not an error, even with the Triton backend forced (for a dtype it supports):
    the output has the right shape and is 0 (an empty sum), and every gradient is 0."""
    backend(forced)
    qs, ks, vs = EMPTY_CASES[case]
    q, k, v = (randn(gen, *s, dtype=dtype).requires_grad_() for s in (qs, ks, vs))
    bias = randn(gen, qs[-2], ks[-2], dtype=dtype).requires_grad_()
    out = gdpa(q, k, v, bias=bias, activation="sigmoid", causal=causal)
    batch = torch.broadcast_shapes(qs[:-3], ks[:-3])
    assert out.shape == (*batch, qs[-3], qs[-2], vs[-1])
    assert torch.equal(out, torch.zeros_like(out))
    out.backward(torch.ones_like(out))
    for name, t in (("q", q), ("k", k), ("v", v), ("bias", bias)):
        assert t.grad is not None and t.grad.shape == t.shape, name
        assert torch.equal(t.grad, torch.zeros_like(t)), name


# ---- dispatch ----

def _small(gen, dtype, d=8):
    return (randn(gen, 1, 2, 5, d, dtype=dtype) for _ in range(3))


@pytest.fixture
def debug_log(caplog):
    caplog.set_level(logging.DEBUG, logger="gdpa_inductor")
    return caplog


def test_cpu_without_interpreter_uses_reference(gen, backend, monkeypatch, debug_log):
    backend("auto")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, k, v = _small(gen, torch.float32)
    assert dispatch.triton_support(q, k, v, None) == (False, "device cpu (Triton needs CUDA, or TRITON_INTERPRET=1)")
    assert dispatch.select_impl(q, k, v, None, "forward") == "reference"
    assert "reference (device cpu" in debug_log.text


def test_cpu_without_interpreter_forced_triton_raises(gen, backend, monkeypatch):
    backend("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, k, v = _small(gen, torch.float32)
    with pytest.raises(ValueError, match=r"config\.backend='triton' cannot run this call: device cpu"):
        dispatch.select_impl(q, k, v, None, "forward")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16, torch.float64], ids=dtype_id)
def test_forced_reference(dtype, gen, backend, monkeypatch, debug_log):
    backend("reference")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, k, v = _small(gen, dtype)
    assert dispatch.select_impl(q, k, v, None, "backward") == "reference"
    assert "reference (forced by config)" in debug_log.text


@pytest.mark.parametrize(
    "dtype, reason",
    [(torch.float32, None), (torch.float16, None), (torch.bfloat16, "bfloat16 under TRITON_INTERPRET"),
     (torch.float64, "dtype torch.float64")],
    ids=["float32", "float16", "bfloat16", "float64"],
)
def test_auto_with_interpreter(dtype, reason, gen, backend, monkeypatch, debug_log):
    backend("auto")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, k, v = _small(gen, dtype)
    expected = "triton" if reason is None else "reference"
    assert dispatch.select_impl(q, k, v, None, "forward") == expected
    if reason is not None:
        assert reason in debug_log.text


def test_auto_head_dim_above_limit_uses_reference(gen, backend, monkeypatch, debug_log):
    backend("auto")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, k, v = _small(gen, torch.float32, d=dispatch.TRITON_MAX_HEAD_DIM + 8)
    assert dispatch.select_impl(q, k, v, None, "forward") == "reference"
    assert "head dims (264, 264) above 256" in debug_log.text


@pytest.mark.parametrize(
    "dtype, reason",
    [(torch.bfloat16, "bfloat16 under TRITON_INTERPRET"), (torch.float64, "dtype torch.float64")],
    ids=["bfloat16", "float64"],
)
def test_forced_triton_unsupported_dtype_raises(dtype, reason, gen, backend, monkeypatch):
    backend("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, k, v = _small(gen, dtype)
    with pytest.raises(ValueError, match=reason):
        dispatch.select_impl(q, k, v, None, "forward")
    with pytest.raises(ValueError, match=reason):
        gdpa(q, k, v)


@requires_interpreter
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=dtype_id)
def test_forced_triton_runs_the_kernels(dtype, gen, backend, monkeypatch):
    """config.backend='triton' on CPU with the interpreter: both passes go through the Triton launchers."""
    backend("triton")
    launched = []
    for module, name in ((triton_fwd, "gdpa_fwd_triton"), (triton_bwd, "gdpa_bwd_triton")):
        real = getattr(module, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            launched.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    q, k, v, bias, causal = _case(gen, "bias_full_causal", dtype, requires_grad=True)
    gdpa(q, k, v, bias=bias, causal=causal, activation="gelu").sum().backward()
    assert launched == ["gdpa_fwd_triton", "gdpa_bwd_triton"]


@requires_interpreter
@pytest.mark.parametrize("case", ["bias_full_causal", "gqa_bias_h_1_nk", "pma_q_batch1"])
def test_triton_backend_equals_reference_backend(case, gen, backend):
    """The public function end to end (fp32, interpreter): forced Triton and forced reference agree."""
    results = {}
    for name in ("triton", "reference"):
        backend(name)
        q, k, v, bias, causal = (t.detach().clone().requires_grad_() if isinstance(t, torch.Tensor) else t
                                 for t in _case(torch.Generator().manual_seed(1), case, torch.float32))
        out = gdpa(q, k, v, bias=bias, causal=causal, activation="gelu_tanh", scale=0.35, post_scale=0.5)
        out.backward(torch.ones_like(out))
        results[name] = (out, q.grad, k.grad, v.grad, bias.grad)
    for what, t, r in zip(("out", "dq", "dk", "dv", "dbias"), results["triton"], results["reference"]):
        assert_close_to_reference(t, r, dtype=torch.float32, what=what)


def test_interpreter_is_on_for_this_suite():
    """The conftest turns the interpreter on where there is no GPU, before triton is imported: otherwise
    the Triton tests would silently skip, or the kernels would be compiled (impossible without a GPU)."""
    assert INTERPRETING or torch.cuda.is_available()
    if INTERPRETING:
        from triton.runtime.interpreter import InterpretedFunction

        for kernel in (triton_fwd.gdpa_fwd_kernel, triton_bwd.gdpa_bwd_dkdv_kernel, triton_bwd.gdpa_bwd_dq_kernel):
            assert isinstance(kernel, InterpretedFunction), kernel
