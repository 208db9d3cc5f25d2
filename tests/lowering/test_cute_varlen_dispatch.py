"""Which path the varlen forward and backward take: the CuTe-DSL varlen forward where it covers the call (under
"auto" and "cute"), the CuTe-DSL varlen backward likewise but only under "cute" (level with Triton's, measured),
else the usual choice, with the reason in the support check. CPU tensors stand in for an sm_90 GPU's;
the op itself then runs as before (the reference here), whatever the selector says for the GPU."""

from __future__ import annotations

import pytest
import torch

from gdpa_inductor.kernels.cute import varlen_bwd as cute_varlen_bwd
from gdpa_inductor.kernels.cute import varlen_fwd as cute_varlen
from gdpa_inductor.kernels.cute.gdpa_fwd import cute_dsl_available
from gdpa_inductor.lowering.dispatch import select_impl, select_varlen_backward_impl, select_varlen_forward_impl

needs_cute_dsl = pytest.mark.skipif(not cute_dsl_available(), reason="nvidia-cutlass-dsl is not installed")


@pytest.fixture
def on_hopper(monkeypatch):
    monkeypatch.setattr(cute_varlen, "on_sm90", lambda device: True)


def _jagged(dtype=torch.bfloat16, d=128, dv=None, h=4, hkv=2, total=300):
    q = torch.randn(total, h, d, dtype=dtype)
    k = torch.randn(total, hkv, d, dtype=dtype)
    v = torch.randn(total, hkv, dv or d, dtype=dtype)
    return q, k, v


@needs_cute_dsl
@pytest.mark.parametrize(
    "change, reason",
    [
        (dict(), ""),
        (dict(bias=True), "bias, causal masking and windows"),
        (dict(causal=True), "bias, causal masking and windows"),
        (dict(window=(16, 0)), "bias, causal masking and windows"),
        (dict(activation="softplus"), "no CuTe form"),
        (dict(dtype=torch.float32), "fp16/bf16"),
        (dict(d=64), ""),
        (dict(d=96, dv=128), ""),
        (dict(d=128, dv=64), ""),
        (dict(d=256), ""),
        (dict(d=128, dv=256), ""),
        (dict(d=192), "head dims"),
        (dict(dv=80), "head dims"),
        (dict(transpose=True), "contiguous last dim"),
        (dict(broadcast_k=True), "strides"),
        (dict(dense_q=True), ""),
    ],
)
def test_support_reasons(on_hopper, change, reason):
    q, k, v = _jagged(change.get("dtype", torch.bfloat16), change.get("d", 128), change.get("dv"))
    if change.get("transpose"):
        q = q.transpose(-1, -2).contiguous().transpose(-1, -2)
    if change.get("broadcast_k"):
        # heads broadcast (stride 0): no TMA layout
        k = torch.randn(300, 1, 128, dtype=k.dtype).expand(300, 2, 128)
    if change.get("dense_q"):
        q = torch.randn(1, 7, 4, q.shape[-1], dtype=q.dtype)
    bias = torch.randn(4, 300, 300, dtype=q.dtype) if change.get("bias") else None
    ok, why = cute_varlen.cute_varlen_fwd_support(q, k, v, bias, change.get("causal", False),
                                                  change.get("window", (-1, -1)), change.get("activation", "silu"))
    assert ok == (reason == "")
    assert reason in why


def test_off_hopper_is_not_cute():
    q, k, v = _jagged()
    ok, why = cute_varlen.cute_varlen_fwd_support(q, k, v, None, False, (-1, -1), "silu")
    assert not ok and ("sm_90" in why or "not installed" in why)


@needs_cute_dsl
@pytest.mark.parametrize("name, causal, expected", [("auto", False, "cute"), ("cute", False, "cute"),
                                                     ("auto", True, None), ("cute", True, None),
                                                     ("triton", False, None), ("reference", False, "reference")])
def test_selector(on_hopper, backend, name, causal, expected):
    """"auto" and "cute" take the CuTe varlen forward where it covers the call; what it does not cover (causal
    here) takes the usual choice under both (None: ``select_impl``'s answer, the reference on CPU tensors, or
    its error under a forced "triton")."""
    backend(name)
    q, k, v = _jagged()
    if expected is None:
        try:
            expected = select_impl(q, k, v, None, "varlen forward")
        except ValueError as e:
            with pytest.raises(ValueError, match=str(e)[:40]):
                select_varlen_forward_impl(q, k, v, None, causal, (-1, -1), "silu")
            return
    assert select_varlen_forward_impl(q, k, v, None, causal, (-1, -1), "silu") == expected


@needs_cute_dsl
@pytest.mark.parametrize("name", ["auto", "cute"])
@pytest.mark.parametrize("d, dv, auto_takes_cute", [(256, 256, True), (128, 256, False), (256, 128, False)])
def test_selector_wide_heads(on_hopper, backend, name, d, dv, auto_takes_cute):
    """Equal head dims of 256 take the CuTe varlen forward under "auto" too; unequal ones past 128 only under a
    forced "cute" (Triton's was faster at short samples)."""
    backend(name)
    q, k, v = _jagged(d=d, dv=dv)
    expected = "cute" if name == "cute" or auto_takes_cute else select_impl(q, k, v, None, "varlen forward")
    assert select_varlen_forward_impl(q, k, v, None, False, (-1, -1), "silu") == expected


@needs_cute_dsl
@pytest.mark.parametrize("change, reason", [(dict(), ""), (dict(causal=True), "not in the CuTe varlen backward"),
                                            (dict(d=256), "for the CuTe varlen backward"),
                                            (dict(activation="softplus"), "no CuTe form")])
def test_backward_support_reasons(on_hopper, change, reason):
    """The backward takes the forward's calls; its reasons name it."""
    q, k, v = _jagged(d=change.get("d", 128))
    ok, why = cute_varlen_bwd.cute_varlen_bwd_support(q, k, v, None, change.get("causal", False), (-1, -1),
                                                      change.get("activation", "silu"))
    assert ok == (reason == "")
    assert reason in why


@needs_cute_dsl
@pytest.mark.parametrize("name, causal, expected", [("cute", False, "cute"), ("auto", False, None),
                                                     ("cute", True, None), ("reference", False, "reference")])
def test_backward_selector(on_hopper, backend, name, causal, expected):
    """Only a forced "cute" takes the CuTe varlen backward; "auto" and the cases it does not cover take the usual
    choice (None: ``select_impl``'s answer)."""
    backend(name)
    q, k, v = _jagged()
    expected = select_impl(q, k, v, None, "varlen backward") if expected is None else expected
    assert select_varlen_backward_impl(q, k, v, None, causal, (-1, -1), "silu") == expected
