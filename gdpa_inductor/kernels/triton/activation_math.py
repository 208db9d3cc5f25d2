"""Triton forms of the GDPA activations, in fp32 registers.

Every function takes ``(x, slope, TANH_APPROX, PRECISE)``:
- ``TANH_APPROX``: use the hardware ``tanh.approx.f32`` (one special-function op). Off under the Triton
  interpreter, which cannot run inline asm.
- ``PRECISE``: fp32 inputs; use accurate formulas (libdevice erf, exp-based sigmoid), since tanh.approx's
  ~2^-11 error is fine for bf16/fp16 outputs but not for fp32 ones.
The ``*_and_grad`` twins return (act(x), act'(x)) sharing the special-function op. NaN propagates as in
eager PyTorch (``where(x < 0, 0, x)`` rather than ``max``, which drops NaN on the GPU).

The activation table (``kernels/activations.py``) names each activation's two forms here (``triton_forward``,
``triton_backward``); the forms register themselves by name (``_form``), and importing this module checks that they
are exactly the ones the table names.
"""

import triton
import triton.language as tl

from ..activations import check_forms, forms_named
from ..common import activation_constants as consts

SQRT_2_OVER_PI = tl.constexpr(consts.SQRT_2_OVER_PI)
GELU_TANH_COEF = tl.constexpr(consts.GELU_TANH_COEF)
INV_SQRT_2 = tl.constexpr(0.7071067811865476)
INV_SQRT_2PI = tl.constexpr(0.3989422804014327)
# The erf approximant of exact GELU in half precision (``activation_constants``)
GELU_ERF_C1 = tl.constexpr(consts.GELU_ERF_C1)
GELU_ERF_C3 = tl.constexpr(consts.GELU_ERF_C3)
GELU_ERF_C5 = tl.constexpr(consts.GELU_ERF_C5)
GELU_ERF_CLAMP = tl.constexpr(consts.GELU_ERF_CLAMP)

# The forms, by function name: what the table's ``triton_forward`` and ``triton_backward`` name.
FORMS: dict[str, object] = {}


def _form(fn):
    FORMS[fn.__name__] = fn
    return fn


@triton.jit
def tanh(x, TANH_APPROX: tl.constexpr):
    if TANH_APPROX:
        return tl.inline_asm_elementwise(
            "tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _tanh(x, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    if PRECISE:
        return tanh(x, False)
    else:
        return tanh(x, TANH_APPROX)


@triton.jit
def _sigmoid(x, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    if PRECISE:
        return tl.sigmoid(x)
    else:
        return 0.5 + 0.5 * tanh(0.5 * x, TANH_APPROX)


@_form
@triton.jit
def identity(x, slope, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    return x


@_form
@triton.jit
def identity_and_grad(x, slope, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    return x, tl.full(x.shape, 1.0, tl.float32)


@_form
@triton.jit
def relu(x, slope, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    return tl.where(x < 0.0, 0.0, x)


@_form
@triton.jit
def relu_and_grad(x, slope, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    return tl.where(x < 0.0, 0.0, x), tl.where(x > 0.0, 1.0, 0.0)


@_form
@triton.jit
def relu_square(x, slope, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    r = tl.where(x < 0.0, 0.0, x)
    return r * r


@_form
@triton.jit
def relu_square_and_grad(x, slope, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    r = tl.where(x < 0.0, 0.0, x)
    return r * r, 2.0 * r


@_form
@triton.jit
def leaky_relu(x, slope, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    return tl.where(x > 0.0, x, x * slope)


@_form
@triton.jit
def leaky_relu_and_grad(x, slope, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    return tl.where(x > 0.0, x, x * slope), tl.where(x > 0.0, 1.0, slope)


@triton.jit
def _gelu_erf_parts(x, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    """Returns (Phi(x), phi(x)): the normal CDF and PDF."""
    if PRECISE:
        cdf = 0.5 * (1.0 + tl.erf(x * INV_SQRT_2))
        pdf = tl.exp(-0.5 * x * x) * INV_SQRT_2PI
    else:
        xc = tl.minimum(tl.maximum(x, -GELU_ERF_CLAMP), GELU_ERF_CLAMP)
        x2 = xc * xc
        t = tanh(xc * (GELU_ERF_C1 + x2 * (GELU_ERF_C3 + x2 * GELU_ERF_C5)), TANH_APPROX)
        # Beyond the clamp Phi is 0 or 1 to fp32 precision; exact values keep -finfo.max masking exact.
        cdf = tl.where(x < -GELU_ERF_CLAMP, 0.0, tl.where(x > GELU_ERF_CLAMP, 1.0, 0.5 + 0.5 * t))
        du = GELU_ERF_C1 + x2 * (3.0 * GELU_ERF_C3 + x2 * (5.0 * GELU_ERF_C5))
        pdf = tl.where(xc == x, 0.5 * (1.0 - t * t) * du, 0.0)
    return cdf, pdf


@_form
@triton.jit
def gelu(x, slope, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    cdf, pdf = _gelu_erf_parts(x, TANH_APPROX, PRECISE)
    return x * cdf


@_form
@triton.jit
def gelu_and_grad(x, slope, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    cdf, pdf = _gelu_erf_parts(x, TANH_APPROX, PRECISE)
    return x * cdf, cdf + x * pdf


@_form
@triton.jit
def gelu_tanh(x, slope, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    t = _tanh(x * (SQRT_2_OVER_PI + (SQRT_2_OVER_PI * GELU_TANH_COEF) * x * x), TANH_APPROX, PRECISE)
    return 0.5 * x * (1.0 + t)


@_form
@triton.jit
def gelu_tanh_and_grad(x, slope, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    x2 = x * x
    t = _tanh(x * (SQRT_2_OVER_PI + (SQRT_2_OVER_PI * GELU_TANH_COEF) * x2), TANH_APPROX, PRECISE)
    half_x = 0.5 * x
    dinner = SQRT_2_OVER_PI + (3.0 * SQRT_2_OVER_PI * GELU_TANH_COEF) * x2
    return half_x * (1.0 + t), 0.5 * (1.0 + t) + half_x * (1.0 - t * t) * dinner


@_form
@triton.jit
def silu(x, slope, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    return x * _sigmoid(x, TANH_APPROX, PRECISE)


@_form
@triton.jit
def silu_and_grad(x, slope, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    s = _sigmoid(x, TANH_APPROX, PRECISE)
    return x * s, s * (1.0 + x * (1.0 - s))


@_form
@triton.jit
def sigmoid(x, slope, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    return _sigmoid(x, TANH_APPROX, PRECISE)


@_form
@triton.jit
def sigmoid_and_grad(x, slope, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    s = _sigmoid(x, TANH_APPROX, PRECISE)
    return s, s * (1.0 - s)


@_form
@triton.jit
def hardswish(x, slope, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    return x * tl.minimum(tl.maximum(x + 3.0, 0.0), 6.0) * (1.0 / 6.0)


@_form
@triton.jit
def hardswish_and_grad(x, slope, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    y = x * tl.minimum(tl.maximum(x + 3.0, 0.0), 6.0) * (1.0 / 6.0)
    dy = tl.where(x <= -3.0, 0.0, tl.where(x < 3.0, x * (1.0 / 3.0) + 0.5, 1.0))
    return y, dy


check_forms("triton/activation_math.py's forms", FORMS,
            {**forms_named("triton_forward"), **forms_named("triton_backward")})


@triton.jit
def activate(x, slope, ACT: tl.constexpr, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    """act(x) for the table's activation named ``ACT``. A name, not a function, is the kernels' constexpr: a
    compiled graph that launches the kernels itself (``torch.library.triton_op``) can only carry plain values."""
    if ACT == "identity":
        return identity(x, slope, TANH_APPROX, PRECISE)
    elif ACT == "relu":
        return relu(x, slope, TANH_APPROX, PRECISE)
    elif ACT == "relu_square":
        return relu_square(x, slope, TANH_APPROX, PRECISE)
    elif ACT == "leaky_relu":
        return leaky_relu(x, slope, TANH_APPROX, PRECISE)
    elif ACT == "gelu":
        return gelu(x, slope, TANH_APPROX, PRECISE)
    elif ACT == "gelu_tanh":
        return gelu_tanh(x, slope, TANH_APPROX, PRECISE)
    elif ACT == "silu":
        return silu(x, slope, TANH_APPROX, PRECISE)
    elif ACT == "sigmoid":
        return sigmoid(x, slope, TANH_APPROX, PRECISE)
    else:
        tl.static_assert(ACT == "hardswish", "activation not in the table")
        return hardswish(x, slope, TANH_APPROX, PRECISE)


@triton.jit
def activate_and_grad(x, slope, ACT: tl.constexpr, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr):
    """(act(x), act'(x)) for the table's activation named ``ACT``."""
    if ACT == "identity":
        return identity_and_grad(x, slope, TANH_APPROX, PRECISE)
    elif ACT == "relu":
        return relu_and_grad(x, slope, TANH_APPROX, PRECISE)
    elif ACT == "relu_square":
        return relu_square_and_grad(x, slope, TANH_APPROX, PRECISE)
    elif ACT == "leaky_relu":
        return leaky_relu_and_grad(x, slope, TANH_APPROX, PRECISE)
    elif ACT == "gelu":
        return gelu_and_grad(x, slope, TANH_APPROX, PRECISE)
    elif ACT == "gelu_tanh":
        return gelu_tanh_and_grad(x, slope, TANH_APPROX, PRECISE)
    elif ACT == "silu":
        return silu_and_grad(x, slope, TANH_APPROX, PRECISE)
    elif ACT == "sigmoid":
        return sigmoid_and_grad(x, slope, TANH_APPROX, PRECISE)
    else:
        tl.static_assert(ACT == "hardswish", "activation not in the table")
        return hardswish_and_grad(x, slope, TANH_APPROX, PRECISE)


@triton.jit
def fp32_factors(scale, post_scale, slope):
    """The kernels' float arguments in fp32. A compiled graph that launches a kernel itself passes Python floats as
    fp64 (Inductor keeps their precision); fp64 scores would then reach the fp32-only tanh.approx."""
    return tl.cast(scale, tl.float32), tl.cast(post_scale, tl.float32), tl.cast(slope, tl.float32)
