"""The CuTe backward's rewritten activation forms (``activation_math.BACKWARD_TERMS``): the same fma/tanh
algebra the kernel traces, run here on float64 tensors, against the activation table's torch value and
derivative at scale · x + bias (a one-element bias folded into the first product). The kernel moves grad_factor
into dK's and dQ's scale and grad_offset into dS = dP (m + offset), so a wrong factor, offset or constant shows
here as a wrong value or derivative."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")

from gdpa_inductor.kernels.activations import get_activation  # noqa: E402
from gdpa_inductor.kernels.cute.activation_math import BACKWARD_TERMS  # noqa: E402


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
