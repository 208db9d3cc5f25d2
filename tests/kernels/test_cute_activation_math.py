"""The CuTe activation forms: each row of the activation table finds the forms it names (checked against the table
when the module is imported), and the backward's rewritten forms (``activation_math.BACKWARD_TERMS``): the same
fma/tanh algebra the kernel traces, run here on float64 tensors, against the activation table's torch value and
derivative at scale · x + bias (a one-element bias folded into the first product). The kernel moves grad_factor
into dK's and dQ's scale and grad_offset into dS = dP (m + offset), so a wrong factor, offset or constant shows
here as a wrong value or derivative."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")

from gdpa_inductor.kernels import activations  # noqa: E402
from gdpa_inductor.kernels.activations import ACTIVATION_NAMES, ACTIVATIONS, get_activation  # noqa: E402
from gdpa_inductor.kernels.cute import activation_math  # noqa: E402
from gdpa_inductor.kernels.cute.activation_math import (  # noqa: E402
    BACKWARD_TERMS,
    BackwardForm,
    PackedBackwardForm,
    PackedForm,
    backward_form,
    forward_form,
    gelu_tanh_scaled_constants,
    gelu_tanh_scaled_terms,
)


@pytest.mark.parametrize("name", ACTIVATION_NAMES)
def test_each_row_finds_its_forms(name):
    a = ACTIVATIONS[name]
    assert forward_form(name, bf16=False) is getattr(activation_math, a.cute_forward)
    assert isinstance(forward_form(name, bf16=True), PackedForm) == a.packed_bf16_forward
    assert isinstance(backward_form(name), BackwardForm)
    assert isinstance(backward_form(name, packed=True), PackedBackwardForm) == a.packed_bf16_backward
    assert callable(getattr(activation_math, a.cute_backward))
    assert (name in BACKWARD_TERMS) == a.cute_backward.endswith("_grad_terms")


def _import_afresh(module: str):
    spec = importlib.util.find_spec(module)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    return fresh


@pytest.mark.parametrize("change, error", [
    ({"cute_backward": "silu_and_grad"}, r"backward forms .*no form 'silu_and_grad' \(for 'silu'\); forms no row "
                                         r"names: 'silu_grad_terms'"),
    ({"packed_bf16_backward": True}, r"packed bf16 backward forms .*no form 'silu' \(for 'silu'\)"),
    ({"packed_bf16_forward": False}, r"packed bf16 forward forms .*forms no row names: 'silu'"),
], ids=["backward", "packed_backward", "packed_forward"])
def test_forms_are_checked_against_the_table_when_imported(monkeypatch, change, error):
    monkeypatch.setattr(activations, "ACTIVATIONS", {**ACTIVATIONS, "silu": dataclasses.replace(ACTIVATIONS["silu"],
                                                                                              **change)})
    monkeypatch.setattr(activations, "PACKED_BF16_FORWARD", frozenset(
        n for n, a in activations.ACTIVATIONS.items() if a.packed_bf16_forward))
    monkeypatch.setattr(activations, "PACKED_BF16_BACKWARD", frozenset(
        n for n, a in activations.ACTIVATIONS.items() if a.packed_bf16_backward))
    with pytest.raises(ImportError, match=error):
        _import_afresh("gdpa_inductor.kernels.cute.activation_math")


def _fma(a, b, c):
    return a * b + c


def _value_and_grad(name, x, scale, bias=None):
    form = BACKWARD_TERMS[name]
    p, m = form.fn(x, scale, _fma, torch.tanh, bias)
    return p, form.grad_factor * (m + form.grad_offset)


@pytest.mark.parametrize("name", sorted(BACKWARD_TERMS))
@pytest.mark.parametrize("scale, bias", [(0.088, None), (1.0, None), (2.5, None), (0.088, -6.2), (1.0, 1.5),
                                         (0.0, -0.75)])
def test_backward_terms_give_value_and_derivative(name, scale, bias):
    torch.manual_seed(0)
    x = torch.cat([torch.randn(4096, dtype=torch.float64) * 4, torch.linspace(-40, 40, 801, dtype=torch.float64)])
    act = get_activation(name)
    p, grad = _value_and_grad(name, x, scale, bias)
    y = scale * x + (bias or 0.0)
    torch.testing.assert_close(p, act.torch_fn(y, 0.01), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, act.torch_grad(y, 0.01), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(BACKWARD_TERMS))
def test_backward_terms_propagate_nan_and_infinities_like_eager(name):
    x = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=torch.float64)
    act = get_activation(name)
    p, grad = _value_and_grad(name, x, 1.0)
    y = x.clone().requires_grad_()
    value = act.torch_fn(y, 0.01)
    (eager_grad,) = torch.autograd.grad(value.sum(), y)
    assert torch.equal(p.isnan(), value.isnan()) and torch.equal(p.isinf(), value.isinf()), (p, value)
    assert torch.equal(grad.isnan(), eager_grad.isnan()), (grad, eager_grad)


@pytest.mark.parametrize("scale", [0.088, 1.0, 2.5, 0.0])
def test_gelu_tanh_scaled_terms_give_value_and_derivative(scale):
    """The packed backward form's algebra (``gelu_tanh_scaled_terms``, the kernel's bf16x2 pairs and its fp32 twin on
    masked tiles): P' (scale / 2) is gelu_tanh(scale · x) and (m + 1) / 2 its derivative."""
    torch.manual_seed(0)
    x = torch.cat([torch.randn(4096, dtype=torch.float64) * 40, torch.linspace(-400, 400, 801, dtype=torch.float64)])
    c = gelu_tanh_scaled_constants(scale)
    p, m = gelu_tanh_scaled_terms(x, c, torch.mul, _fma, torch.tanh, lambda t: 1.0 - t * t)
    act = get_activation("gelu_tanh")
    y = scale * x
    form = backward_form("gelu_tanh", packed=True)
    torch.testing.assert_close(p * scale * 0.5, act.torch_fn(y, 0.01), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(form.grad_factor * (m + form.grad_offset), act.torch_grad(y, 0.01), rtol=1e-12,
                               atol=1e-12)


def _bf16(t):
    return t.to(torch.bfloat16).double()


def _rel_error(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("amp", [0.3, 1.0, 3.0, 6.0])
def test_gelu_tanh_packed_roundings_keep_gradients_within_eager_error(amp):
    """The packed form's roundings, emulated step by step as the kernel takes them (x, every bf16x2 product and fma,
    tanh.approx.f32's result and dP rounded to bf16; P' and dS the matmuls' bf16 operands): dq, dk and dv against
    float64 within 2x eager PyTorch's own bf16 error (the bound the GPU tests hold the kernel to). A tanh that missed
    ±1 where |u| is large, or v in place of (1 - t²) v, would fail here."""
    gen = torch.Generator().manual_seed(int(amp * 10))
    q, do = (_bf16(torch.randn(2, 2, 128, 64, dtype=torch.float64, generator=gen) * amp) for _ in range(2))
    k, v = (_bf16(torch.randn(2, 2, 512, 64, dtype=torch.float64, generator=gen) * amp) for _ in range(2))
    s, post = 64**-0.5, 1.0 / 512
    act = get_activation("gelu_tanh")

    def grads(dtype):
        leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out = act.torch_fn((leaves[0] @ leaves[1].transpose(-1, -2)) * s, 0.01) @ leaves[2] * post
        return torch.autograd.grad(out, leaves, do.to(dtype))

    ref, eager = grads(torch.float64), grads(torch.bfloat16)
    scores = q @ k.transpose(-1, -2)
    dp = _bf16(do @ v.transpose(-1, -2))
    c = tuple(_bf16(torch.tensor(x)) for x in gelu_tanh_scaled_constants(s))
    p, m = gelu_tanh_scaled_terms(_bf16(scores), c, lambda a, b: _bf16(a * b), lambda a, b, d: _bf16(a * b + d),
                                  lambda u: _bf16(torch.tanh(u)), lambda t: _bf16(1.0 - t * t))
    ds = _bf16(dp * m + dp)
    factor = s * post * backward_form("gelu_tanh", packed=True).grad_factor
    got = (ds @ k * factor, ds.transpose(-1, -2) @ q * factor, p.transpose(-1, -2) @ do * post * s * 0.5)
    for name, g, e, r in zip(("dq", "dk", "dv"), got, eager, ref):
        assert _rel_error(_bf16(g), r) <= 2 * _rel_error(e, r), (name, _rel_error(_bf16(g), r), _rel_error(e, r))
