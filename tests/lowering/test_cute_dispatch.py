"""``config.backend = "cute"``: the dense forward and backward run the CuTe-DSL Hopper kernels or fail with a
ValueError that says why; under "auto" the forward and backward take the CuTe kernels where they cover the
call. The
support check's reasons are tested here on CPU tensors standing in for an sm_90 GPU's."""

from __future__ import annotations

import pytest
import torch

from gdpa_inductor import gdpa
from gdpa_inductor.kernels.cute import bwd_support, fwd_support
from gdpa_inductor.lowering import dispatch
from gdpa_inductor.lowering.dispatch import select_backward_impl, select_forward_impl, select_impl

SELECTORS = {"forward": select_forward_impl, "backward": select_backward_impl}


def _qkv(dtype=torch.bfloat16, d=128, dv=None, h=4, hkv=4, batch=(2,), nq=64, nk=80):
    q = torch.randn(*batch, h, nq, d, dtype=dtype)
    k = torch.randn(*batch, hkv, nk, d, dtype=dtype)
    v = torch.randn(*batch, hkv, nk, dv or d, dtype=dtype)
    return q, k, v


def test_forced_cute_without_hopper_raises_with_reason(backend):
    backend("cute")
    q, k, v = _qkv(torch.float32)
    with pytest.raises(ValueError, match="backend='cute' cannot run this call"):
        gdpa(q, k, v)


def test_forced_cute_backward_without_hopper_raises_with_reason(backend):
    backend("cute")
    q, k, v = _qkv(torch.float32)
    with pytest.raises(ValueError, match="backend='cute' cannot run this call"):
        select_backward_impl(q, k, v, None, False, "silu")


@pytest.mark.parametrize("missing", ["cutlass", "cuda", "tvm_ffi"])
def test_without_a_cute_package_the_reason_names_it(monkeypatch, request, missing):
    """cutlass-dsl, its CUDA bindings and TVM-FFI (the kernels' calling path) are all needed: without any one of
    them the CuTe kernels are not taken, and the reason says which packages to install."""
    find_spec = fwd_support.importlib.util.find_spec
    monkeypatch.setattr(fwd_support.importlib.util, "find_spec",
                        lambda name: None if name == missing else find_spec(name))
    monkeypatch.setattr(fwd_support, "on_sm90", lambda device: True)
    monkeypatch.setattr(dispatch, "on_cuda", lambda q: True)  # CPU tensors stand in for CUDA ones
    fwd_support.cute_dsl_available.cache_clear()
    request.addfinalizer(fwd_support.cute_dsl_available.cache_clear)
    assert not fwd_support.cute_dsl_available()
    ok, why = fwd_support.fwd_supported(*_qkv(), None, False, "silu")
    assert not ok and "nvidia-cutlass-dsl or apache-tvm-ffi is not installed" in why


@pytest.mark.parametrize("what", SELECTORS)
@pytest.mark.parametrize("name", ["auto", "triton", "reference"])
def test_off_hopper_dispatches_as_before(backend, name, what):
    backend(name)
    q, k, v = _qkv(torch.float32)
    assert SELECTORS[what](q, k, v, None, False, "silu") == select_impl(q, k, v, None, what)


@pytest.mark.skipif(not fwd_support.cute_dsl_available(), reason="nvidia-cutlass-dsl is not installed")
@pytest.mark.parametrize("what", SELECTORS)
@pytest.mark.parametrize("name, causal, expected", [("auto", False, "cute"), ("cute", False, "cute"),
                                                     ("auto", True, "reference"), ("triton", False, "triton")])
def test_on_hopper_takes_cute_where_supported(monkeypatch, backend, name, causal, expected, what):
    """On sm_90 (stood in for here) "auto" runs the CuTe kernels where they cover the call; a case they do
    not cover (causal with Nk - Nq = 16) falls through to the usual choice (the reference on these CPU tensors)."""
    monkeypatch.setattr(fwd_support, "on_sm90", lambda device: True)
    monkeypatch.setattr(dispatch, "on_cuda", lambda q: True)  # CPU tensors stand in for CUDA ones
    monkeypatch.setattr(fwd_support, "tma_layout", lambda t: True)
    backend(name)
    q, k, v = _qkv()
    if name == "triton":
        monkeypatch.setattr("gdpa_inductor.lowering.dispatch.triton_support", lambda *a: (True, ""))
    assert SELECTORS[what](q, k, v, None, causal, "silu") == expected


@pytest.mark.skipif(not fwd_support.cute_dsl_available(), reason="nvidia-cutlass-dsl is not installed")
@pytest.mark.parametrize(
    "change, reason",
    [
        (dict(), ""),
        (dict(bias=(64, 80)), ""),
        (dict(bias=(2, 1, 64, 80)), ""),
        (dict(bias=(4, 64, 80)), ""),
        (dict(bias=(2, 4, 64, 80), causal=True), "non-negative multiple"),
        (dict(bias=(2, 4, 80, 80), causal=True, nq=80, nk=80), ""),
        (dict(bias=(4, 1, 1)), "a bias of one element or one over the scores' rows and columns, its last two dims "
                               "(Nq, Nk) = (64, 80) (got (64, 1))"),
        (dict(bias=(2, 1, 1, 80)), ""),
        (dict(bias=(1, 80)), ""),
        (dict(bias=(2, 4, 64, 1)), "(Nq, Nk) = (64, 80) (got (64, 1))"),
        (dict(bias=(3, 1, 64, 80)), "does not broadcast to the scores' (2, 4, 64, 80)"),
        (dict(bias=(64, 80), bias_dtype=torch.float32), "a bias in the operands' dtype torch.bfloat16"),
        (dict(bias=(64, 80), transpose_bias=True), "a bias's values in pairs: its last dim contiguous"),
        (dict(bias=(64, 81), nk=81), "Nk and its other strides even"),
        (dict(bias=()), ""),
        (dict(bias=(1, 1, 1, 1)), ""),
        (dict(bias=(), causal=True, nq=80, nk=80), ""),
        (dict(causal=True), "Nk - Nq to be a non-negative multiple of 128"),
        (dict(causal=True, nq=80, nk=80), ""),
        (dict(causal=True, nq=80, nk=336, d=64, dv=96), ""),
        (dict(causal=True, nq=208, nk=80), "non-negative multiple"),
        (dict(causal=True, nq=80, nk=80, dv=256), "D and Dv of at most 128"),
        (dict(activation="softplus"), "no CuTe form"),
        (dict(dtype=torch.float32), "fp16/bf16"),
        (dict(d=96), ""),
        (dict(dv=64), ""),
        (dict(d=64, dv=96), ""),
        (dict(d=80), "head dims"),
        (dict(dv=192), "head dims"),
        (dict(dv=256), ""),
        (dict(d=256, dv=64), ""),
        (dict(transpose=True), "contiguous last dim"),
        (dict(broadcast_q=True), "strides"),
    ],
)
def test_support_reasons(monkeypatch, change, reason):
    monkeypatch.setattr(fwd_support, "on_sm90", lambda device: True)
    monkeypatch.setattr(dispatch, "on_cuda", lambda q: True)  # CPU tensors stand in for CUDA ones
    q, k, v = _qkv(change.get("dtype", torch.bfloat16), change.get("d", 128), change.get("dv"),
                   nq=change.get("nq", 64), nk=change.get("nk", 80))
    if change.get("transpose"):
        q = q.transpose(-1, -2).contiguous().transpose(-1, -2)
    if change.get("broadcast_q"):
        q = q[:1]
    bias = torch.randn(change["bias"], dtype=change.get("bias_dtype", q.dtype)) if "bias" in change else None
    if change.get("transpose_bias"):
        bias = bias.mT.contiguous().mT
    ok, why = fwd_support.cute_fwd_support(q, k, v, bias, change.get("causal", False), change.get("activation", "silu"))
    assert ok == (reason == "")
    assert reason in why


@pytest.mark.skipif(not fwd_support.cute_dsl_available(), reason="nvidia-cutlass-dsl is not installed")
@pytest.mark.parametrize("bias_shape, bias_grad, nk, backward, reason", [
    ((), False, 80, "cute", ""),
    ((1, 1, 1), False, 80, "cute", ""),
    ((), True, 80, "reference", "the CuTe backward computes the gradient of a bias tensor only"),
    ((64, 80), False, 80, "cute", ""),
    ((2, 1, 64, 80), True, 80, "cute", ""),
    ((2, 4, 64, 84), True, 84, "cute", ""),
    ((2, 4, 64, 84), False, 84, "cute", ""),
])
def test_biases_in_the_cute_backward(monkeypatch, backend, bias_shape, bias_grad, nk, backward, reason):
    """A one-element bias (sigmoid attention's -log n, a 0-d tensor after the backend's rewrite) runs on the CuTe
    kernels, added to each score in the activation's first product, without its gradient; a bias tensor runs on both
    CuTe kernels, with its gradient or without, Nk a multiple of 8 or not (the backward's TMA then reads a padded
    copy); otherwise the CuTe forward and the usual backward (the reference on CPU tensors), the reason said."""
    monkeypatch.setattr(fwd_support, "on_sm90", lambda device: True)
    monkeypatch.setattr(dispatch, "on_cuda", lambda q: True)  # CPU tensors stand in for CUDA ones
    monkeypatch.setattr(fwd_support, "tma_layout", lambda t: True)
    backend("auto")
    q, k, v = _qkv(nk=nk)
    bias = torch.randn(bias_shape, dtype=q.dtype)
    assert select_forward_impl(q, k, v, bias, False, "sigmoid") == "cute"
    assert select_backward_impl(q, k, v, bias, False, "sigmoid", bias_grad) == backward
    ok, why = bwd_support.cute_bwd_support(q, k, v, bias, False, "sigmoid", bias_grad)
    assert ok == (backward == "cute") and reason in why and bool(reason) == (not ok)


@pytest.mark.skipif(not fwd_support.cute_dsl_available(), reason="nvidia-cutlass-dsl is not installed")
def test_bias_tensor_backward_at_wide_heads_says_why(monkeypatch, backend):
    """Past head dims of 128 (the wide-head backward) a bias tensor keeps the usual backward, with the reason."""
    monkeypatch.setattr(fwd_support, "on_sm90", lambda device: True)
    monkeypatch.setattr(dispatch, "on_cuda", lambda q: True)  # CPU tensors stand in for CUDA ones
    monkeypatch.setattr(fwd_support, "tma_layout", lambda t: True)
    q, k, v = _qkv(d=256, dv=256)
    ok, why = bwd_support.cute_bwd_support(q, k, v, torch.randn(64, 80, dtype=q.dtype), False, "silu")
    assert not ok and "reads a bias tensor at D and Dv up to 128 (got 256, 256)" in why


@pytest.mark.skipif(not fwd_support.cute_dsl_available(), reason="nvidia-cutlass-dsl is not installed")
@pytest.mark.parametrize("d, dv, covered", [(256, 256, True), (128, 256, True), (256, 64, True), (128, 128, True),
                                             (96, 64, True), (256, 192, False), (32, 256, False)])
def test_backward_takes_head_dims_up_to_256(monkeypatch, backend, d, dv, covered):
    """Head dims of 64, 96, 128 and 256 in any pair take the CuTe backward under "auto" (past 128 the wide-head
    kernel, faster than Triton's at every measured shape); others keep the usual choice, with the reason in the
    support check."""
    monkeypatch.setattr(fwd_support, "on_sm90", lambda device: True)
    monkeypatch.setattr(dispatch, "on_cuda", lambda q: True)  # CPU tensors stand in for CUDA ones
    monkeypatch.setattr(fwd_support, "tma_layout", lambda t: True)
    backend("auto")
    q, k, v = _qkv(d=d, dv=dv)
    ok, why = bwd_support.cute_bwd_support(q, k, v, None, False, "silu")
    assert ok == covered
    assert ("must each be one of (64, 96, 128, 256)" in why) == (not covered)
    expected = "cute" if covered else select_impl(q, k, v, None, "backward")
    assert select_backward_impl(q, k, v, None, False, "silu") == expected


@pytest.mark.skipif(not fwd_support.cute_dsl_available(), reason="nvidia-cutlass-dsl is not installed")
@pytest.mark.parametrize("name, keys, expected", [("auto", fwd_support.WIDE_HEAD_MIN_KEYS - 1, "reference"),
                                                  ("auto", fwd_support.WIDE_HEAD_MIN_KEYS, "cute"),
                                                  ("cute", 80, "cute")])
def test_wide_head_forward_from_min_keys_under_auto(monkeypatch, backend, name, keys, expected):
    """"auto" runs the wide-head CuTe forward from ``WIDE_HEAD_MIN_KEYS`` keys (below, the usual choice: the
    reference on these CPU tensors); forcing "cute" runs it at any key count."""
    monkeypatch.setattr(fwd_support, "on_sm90", lambda device: True)
    monkeypatch.setattr(dispatch, "on_cuda", lambda q: True)  # CPU tensors stand in for CUDA ones
    monkeypatch.setattr(fwd_support, "tma_layout", lambda t: True)
    backend(name)
    q = torch.randn(2, 4, 64, 256, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 4, keys, 256, dtype=torch.bfloat16) for _ in range(2))
    assert select_forward_impl(q, k, v, None, False, "silu") == expected


@pytest.mark.skipif(not fwd_support.cute_dsl_available(), reason="nvidia-cutlass-dsl is not installed")
@pytest.mark.parametrize("nq, nk", [(80, 80), (80, 208)])
def test_causal_on_cute_where_covered(monkeypatch, backend, nq, nk):
    """Under the causal mask "auto" and a forced "cute" run both CuTe kernels where they cover the call."""
    monkeypatch.setattr(fwd_support, "on_sm90", lambda device: True)
    monkeypatch.setattr(dispatch, "on_cuda", lambda q: True)  # CPU tensors stand in for CUDA ones
    monkeypatch.setattr(fwd_support, "tma_layout", lambda t: True)
    q, k, v = _qkv(nq=nq, nk=nk)
    assert bwd_support.cute_bwd_support(q, k, v, None, True, "silu") == (True, "")
    for name in ("auto", "cute"):
        backend(name)
        assert select_forward_impl(q, k, v, None, True, "silu") == "cute"
        assert select_backward_impl(q, k, v, None, True, "silu") == "cute"


@pytest.mark.skipif(not fwd_support.cute_dsl_available(), reason="nvidia-cutlass-dsl is not installed")
@pytest.mark.parametrize("nq, nk, d, dv, reason", [(80, 96, 128, 128, "non-negative multiple of 128"),
                                                   (208, 80, 128, 128, "non-negative multiple of 128"),
                                                   (80, 80, 128, 256, "D and Dv of at most 128")])
def test_causal_backward_outside_the_mask_cases_says_why(monkeypatch, backend, nq, nk, d, dv, reason):
    """Causal calls the CuTe kernels do not cover (Nk - Nq not a whole number of 128-key tiles, Nq > Nk, heads
    past 128) keep the usual choice under "auto", and a forced "cute" names the reason."""
    monkeypatch.setattr(fwd_support, "on_sm90", lambda device: True)
    monkeypatch.setattr(dispatch, "on_cuda", lambda q: True)  # CPU tensors stand in for CUDA ones
    monkeypatch.setattr(fwd_support, "tma_layout", lambda t: True)
    q, k, v = _qkv(nq=nq, nk=nk, d=d, dv=dv)
    ok, why = bwd_support.cute_bwd_support(q, k, v, None, True, "silu")
    assert not ok and reason in why
    backend("auto")
    assert select_backward_impl(q, k, v, None, True, "silu") == select_impl(q, k, v, None, "backward")
    backend("cute")
    with pytest.raises(ValueError, match=reason):
        select_backward_impl(q, k, v, None, True, "silu")
