"""The one table of GDPA activations.

Each entry names the activation and gives, side by side, its exact PyTorch form (what eager models
compute) and its derivative in PyTorch (the reference backward). The Triton kernels receive the name as a
constexpr, and ``triton/activation_math.py`` holds the Triton form of each name (the value, and the value with its
derivative, sharing the one special-function op), so no activation is ever a magic number.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

TorchAct = Callable[[torch.Tensor, float], torch.Tensor]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _relu_square(x, slope):
    return torch.relu(x).square()


def _relu_square_grad(x, slope):
    return 2.0 * torch.relu(x)


def _leaky_relu_grad(x, slope):
    return torch.where(x > 0, torch.ones_like(x), torch.full_like(x, slope))


def _gelu_grad(x, slope):
    cdf = 0.5 * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))
    pdf = torch.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))
    return cdf + x * pdf


def _gelu_tanh_grad(x, slope):
    inner = _SQRT_2_OVER_PI * (x + 0.044715 * x.pow(3))
    t = torch.tanh(inner)
    dinner = _SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x * x)
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner


def _silu_grad(x, slope):
    s = torch.sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


def _sigmoid_grad(x, slope):
    s = torch.sigmoid(x)
    return s * (1.0 - s)


def _hardswish_grad(x, slope):
    # Same branches as autograd of F.hardswish: 0 at x <= -3, x/3 + 1/2 inside, 1 at x >= 3.
    return torch.where(x <= -3.0, torch.zeros_like(x), torch.where(x < 3.0, x / 3.0 + 0.5, torch.ones_like(x)))


@dataclass(frozen=True)
class Activation:
    name: str
    torch_fn: TorchAct
    torch_grad: TorchAct
    # act(c * x) == c * act(x) for c > 0: a scale may then move across the activation.
    positively_homogeneous: bool


ACTIVATIONS: dict[str, Activation] = {
    a.name: a
    for a in (
        Activation("identity", lambda x, s: x, lambda x, s: torch.ones_like(x), True),
        Activation("relu", lambda x, s: torch.relu(x), lambda x, s: (x > 0).to(x.dtype), True),
        Activation("relu_square", _relu_square, _relu_square_grad, False),
        Activation("leaky_relu", lambda x, s: F.leaky_relu(x, s), _leaky_relu_grad, True),
        Activation("gelu", lambda x, s: F.gelu(x), _gelu_grad, False),
        Activation("gelu_tanh", lambda x, s: F.gelu(x, approximate="tanh"), _gelu_tanh_grad, False),
        Activation("silu", lambda x, s: F.silu(x), _silu_grad, False),
        Activation("sigmoid", lambda x, s: torch.sigmoid(x), _sigmoid_grad, False),
        Activation("hardswish", lambda x, s: F.hardswish(x), _hardswish_grad, False),
    )
}

ACTIVATION_NAMES: tuple[str, ...] = tuple(ACTIVATIONS)


def get_activation(name: str) -> Activation:
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(
            f"activation: expected one of {', '.join(ACTIVATION_NAMES)}; got {name!r}"
        ) from None
