"""CuTe-DSL forms of the GDPA activations, one special-function op per score.

The same one-MUFU forms as the Triton kernels (``kernels/triton/activation_math.py``) on fp32 registers:
gelu_tanh, silu and sigmoid through ``tanh.approx.f32``; exact gelu through the tanh-based erf approximant
whose error is below bf16 resolution. The bf16 forward runs gelu_tanh and silu on bf16x2 pairs instead
(``PackedForm``). NaN propagates as in eager PyTorch: comparisons select, they do not clamp.

The activation table (``kernels/activations.py``) names each activation's forward and backward form here; the forms
register themselves by name (``_forward_form``, ``_backward_terms``, ``_backward_at_scaled``), and importing this
module checks that they are exactly the ones the table names, as are the packed forms.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import cutlass
import cutlass.cute as cute

from ..activations import (
    ACTIVATIONS,
    PACKED_BF16_BACKWARD,
    PACKED_BF16_FORWARD,
    ActivationName,
    check_forms,
    forms_named,
)

# The constants of the Triton forms too (one definition): gelu_tanh's, and the erf approximant
# Phi(x) ~ 0.5 (1 + tanh(x (C1 + C3 x^2 + C5 x^4))) on |x| <= 5.
from ..common.activation_constants import (
    GELU_ERF_C1,
    GELU_ERF_C3,
    GELU_ERF_C5,
    GELU_ERF_CLAMP,
    GELU_TANH_COEF,
    SQRT_2_OVER_PI,
)


@cute.jit
def _tanh(x: cutlass.Float32) -> cutlass.Float32:
    return cute.math.tanh(x, approx=True)


# The forward forms in fp32 registers, by function name (the table's ``cute_forward``).
_FORWARD_FORMS: dict[str, Callable] = {}


def _forward_form(fn: Callable) -> Callable:
    _FORWARD_FORMS[fn.__name__] = fn
    return fn


# Forward forms: act(scale · x + bias), bias None (no bias) or a one-element bias read by the kernel. The forward
# is bound by its per-score arithmetic, not by the tensor cores, so every FP32 op per score counts: products of
# the runtime scale with constants are common to every score (computed once), leaving e.g. five FP32 ops and one
# tanh for gelu_tanh and two plus a tanh for silu; a bias goes into the form's first product as an FMA
# (``_scaled``), costing no op per score.


def _scaled(x, factor: float, scale, bias, fma=cute.math.fma):
    """factor · (scale · x + bias): a form's first product, one FMA with a bias and one product without
    (factor · scale and factor · bias are common to every score); over any number type with its ``fma``."""
    if factor != 1.0:
        scale, bias = factor * scale, None if bias is None else factor * bias
    return x * scale if bias is None else fma(x, scale, bias)


@_forward_form
@cute.jit
def identity(x: cutlass.Float32, scale: cutlass.Float32, slope: cutlass.Float32, bias) -> cutlass.Float32:
    return _scaled(x, 1.0, scale, bias)


@_forward_form
@cute.jit
def relu(x: cutlass.Float32, scale: cutlass.Float32, slope: cutlass.Float32, bias) -> cutlass.Float32:
    y = _scaled(x, 1.0, scale, bias)
    return cutlass.Float32(0.0) if y < 0.0 else y


@_forward_form
@cute.jit
def relu_square(x: cutlass.Float32, scale: cutlass.Float32, slope: cutlass.Float32, bias) -> cutlass.Float32:
    y = _scaled(x, 1.0, scale, bias)
    r = cutlass.Float32(0.0) if y < 0.0 else y
    return r * r


@_forward_form
@cute.jit
def leaky_relu(x: cutlass.Float32, scale: cutlass.Float32, slope: cutlass.Float32, bias) -> cutlass.Float32:
    y = _scaled(x, 1.0, scale, bias)
    return y if y > 0.0 else y * slope


@_forward_form
@cute.jit
def gelu_tanh(x: cutlass.Float32, scale: cutlass.Float32, slope: cutlass.Float32, bias) -> cutlass.Float32:
    h, _, t = gelu_tanh_half_and_tanh(x, scale, bias, cute.math.fma, _tanh)
    return cute.math.fma(h, t, h)


@_forward_form
@cute.jit
def gelu(x: cutlass.Float32, scale: cutlass.Float32, slope: cutlass.Float32, bias) -> cutlass.Float32:
    y = _scaled(x, 1.0, scale, bias)
    yc = cute.math.min(cute.math.max(y, -GELU_ERF_CLAMP), GELU_ERF_CLAMP)
    y2 = yc * yc
    cdf = 0.5 + 0.5 * _tanh(yc * (GELU_ERF_C1 + y2 * (GELU_ERF_C3 + y2 * GELU_ERF_C5)))
    # beyond the clamp Phi is 0 or 1 to fp32 precision
    if y < -GELU_ERF_CLAMP:
        cdf = cutlass.Float32(0.0)
    if y > GELU_ERF_CLAMP:
        cdf = cutlass.Float32(1.0)
    return y * cdf


@_forward_form
@cute.jit
def sigmoid(x: cutlass.Float32, scale: cutlass.Float32, slope: cutlass.Float32, bias) -> cutlass.Float32:
    return cute.math.fma(_tanh(_scaled(x, 0.5, scale, bias)), 0.5, 0.5)


@_forward_form
@cute.jit
def silu(x: cutlass.Float32, scale: cutlass.Float32, slope: cutlass.Float32, bias) -> cutlass.Float32:
    # y sigmoid(y) = u (1 + tanh(u)) with u = y / 2
    u = _scaled(x, 0.5, scale, bias)
    return cute.math.fma(u, _tanh(u), u)


@_forward_form
@cute.jit
def hardswish(x: cutlass.Float32, scale: cutlass.Float32, slope: cutlass.Float32, bias) -> cutlass.Float32:
    y = _scaled(x, 1.0, scale, bias)
    r = y + 3.0
    r = cutlass.Float32(0.0) if r < 0.0 else r
    r = cutlass.Float32(6.0) if r > 6.0 else r
    return y * r * (1.0 / 6.0)


def gelu_tanh_half_and_tanh(x, scale, bias, fma, tanh):
    """(h, h², t) of gelu_tanh at y = scale x + bias, from ``fma(a, b, c) = a b + c`` and ``tanh`` over any number
    type (CuTe registers in the kernel, float64 tensors in the tests): h = y / 2, tanh's argument c (y + k y³) =
    h (2c + 8ck h²), and gelu_tanh(y) = h (1 + t)."""
    c, k = SQRT_2_OVER_PI, GELU_TANH_COEF
    h = _scaled(x, 0.5, scale, bias, fma)
    h2 = h * h
    return h, h2, tanh(h * fma(h2, 8.0 * c * k, 2.0 * c))


# Packed bf16x2 forms: gelu_tanh and silu divided by scale / 2 both read x (1 + tanh(u(x))), so a pair of
# scores is rounded to bf16 once (eager rounds S to bf16 too), its tanh argument u is computed two scores per
# instruction, and P = x + x tanh(u) comes out already packed as the P·V operand: four issue slots per score
# against 5.5 for the fp32 form (the tanh itself is one MUFU per score either way on sm_90). Bf16 operands
# only: P in bf16 keeps fp32's range, while in fp16 the unscaled P could overflow where act(scale · x) does not.


@cute.jit
def pack_bf16x2(lo: cutlass.Float32, hi: cutlass.Float32) -> cutlass.Int32:
    """Two fp32 values rounded to nearest into one bf16x2 register (no saturation: inf stays inf)."""
    return cute.arch.inline_ptx(
        "cvt.rn.bf16x2.f32 {$w0}, {$r0}, {$r1};", write_only_types=[cutlass.Int32], read_only_args=[hi, lo]
    )


@cute.jit
def _mul_bf16x2(a: cutlass.Int32, b: cutlass.Int32) -> cutlass.Int32:
    return cute.arch.inline_ptx(
        "mul.rn.bf16x2 {$w0}, {$r0}, {$r1};", write_only_types=[cutlass.Int32], read_only_args=[a, b]
    )


@cute.jit
def fma_bf16x2(a: cutlass.Int32, b: cutlass.Int32, c: cutlass.Int32) -> cutlass.Int32:
    return cute.arch.inline_ptx(
        "fma.rn.bf16x2 {$w0}, {$r0}, {$r1}, {$r2};", write_only_types=[cutlass.Int32], read_only_args=[a, b, c]
    )


@cute.jit
def tanh_bf16x2(u: cutlass.Int32) -> cutlass.Int32:
    return cute.arch.inline_ptx(
        "tanh.approx.bf16x2 {$w0}, {$r0};", write_only_types=[cutlass.Int32], read_only_args=[u]
    )


def gelu_tanh_scaled_constants(scale):
    """The constants of gelu_tanh at y = scale · x on the unscaled x: (c s, c k s³, 3 c k s³), the first two tanh's
    argument's (u = x (c s + c k s³ x²)), the third the backward's derivative factor's (``gelu_tanh_scaled_terms``)."""
    c = SQRT_2_OVER_PI * scale
    c3 = c * GELU_TANH_COEF * scale * scale
    return c, c3, 3.0 * c3


@cute.jit
def _gelu_tanh_constants(scale: cutlass.Float32):
    c, c3, _ = gelu_tanh_scaled_constants(scale)
    return pack_bf16x2(c, c), pack_bf16x2(c3, c3)


@cute.jit
def _gelu_tanh_argument(x: cutlass.Int32, c):
    # u = x (c s + c k s^3 x^2) at y = s x
    return _mul_bf16x2(x, fma_bf16x2(_mul_bf16x2(x, x), c[1], c[0]))


@cute.jit
def _silu_constants(scale: cutlass.Float32):
    return (pack_bf16x2(0.5 * scale, 0.5 * scale),)


@cute.jit
def _silu_argument(x: cutlass.Int32, c):
    return _mul_bf16x2(x, c[0])


class PackedForm(NamedTuple):
    """act(scale · x) / (scale / 2) = x (1 + tanh(argument(x))) on bf16x2 pairs; ``constants(scale)`` gives
    the argument's constants (bf16x2 registers, computed once per kernel)."""

    constants: Callable
    argument: Callable


# by activation: those the table marks ``packed_bf16_forward``
_PACKED_BF16 = {
    "gelu_tanh": PackedForm(_gelu_tanh_constants, _gelu_tanh_argument),
    "silu": PackedForm(_silu_constants, _silu_argument),
}


def forward_form(name: ActivationName, bf16: bool):
    """The forward's per-score form of activation ``name``: a PackedForm for bf16 where the table has one (O must
    then be multiplied by scale / 2), otherwise the fp32 form act(scale · x + bias)."""
    if bf16 and name in PACKED_BF16_FORWARD:
        return _PACKED_BF16[name]
    return FORWARD_FORMS[name]


# Backward forms. (p, m) = fn(x, scale, slope, bias) with p = act(y) and act'(y) = grad_factor · (m +
# grad_offset) at y = scale · x + bias (bias None, or one element folded into the first product as above). Each
# score costs one special-function op and a handful of FP32 ops beside five matmuls, and
# the backward is bound by that arithmetic where two warpgroups share an SM's issue slots (2048², H200: relu's
# backward ran ~10% faster than gelu_tanh's). So the scale goes into the first product of the form (no separate
# y = scale · x), the factor into the scale dK and dQ take once per tile, and an offset of 1 into dS = dP (m + 1)
# = fma(dP, m, dP): gelu_tanh takes 10 FP32 ops per score with dS instead of 13, silu 5 instead of 8 (2048²,
# H200, one process: gelu_tanh's backward 473-481 -> 503-518 TF/s, silu's 502-505 -> 533-535). One op fewer for
# gelu_tanh, P left divided by scale / 2 as in the forward's packed forms (bf16 only), measured no faster.


class BackwardForm(NamedTuple):
    """(p, m) = fn(x, scale, slope, bias) per score: p = act(y), act'(y) = grad_factor · (m + grad_offset) at
    y = scale · x + bias; ``grad_offset`` is 0 or 1."""

    fn: Callable
    grad_factor: float
    grad_offset: float


# The backward forms, by function name (the table's ``cute_backward``): (the form with its unwrapped fn, whether fn
# takes (x, scale, fma, tanh, bias) rather than act and act' at y as (y, slope)).
_BACKWARD_FORMS: dict[str, tuple[BackwardForm, bool]] = {}


def _backward_terms(grad_factor: float, grad_offset: float) -> Callable:
    """Registers a form built from fma and tanh alone: fn(x, scale, fma, tanh, bias) gives (p, m)."""
    def register(terms: Callable) -> Callable:
        _BACKWARD_FORMS[terms.__name__] = (BackwardForm(terms, grad_factor, grad_offset), True)
        return terms

    return register


def _backward_at_scaled(and_grad: Callable) -> Callable:
    """Registers a form giving (act(y), act'(y)) at y = scale · x + bias: no factor to move."""
    _BACKWARD_FORMS[and_grad.__name__] = (BackwardForm(and_grad, 1.0, 0.0), False)
    return and_grad


@_backward_terms(0.5, 1.0)
def gelu_tanh_grad_terms(x, scale, fma, tanh, bias=None):
    """gelu_tanh's (p, m) at y = scale x + bias with act' = (m + 1) / 2, over any number type as
    ``gelu_tanh_half_and_tanh``: p = h (1 + t), and 2 act' = 1 + t + (1 - t^2) h (2c + 24ck h^2)."""
    c, k = SQRT_2_OVER_PI, GELU_TANH_COEF
    h, h2, t = gelu_tanh_half_and_tanh(x, scale, bias, fma, tanh)
    return fma(h, t, h), fma(fma(-t, t, 1.0), h * fma(h2, 24.0 * c * k, 2.0 * c), t)


@_backward_terms(0.5, 1.0)
def silu_grad_terms(x, scale, fma, tanh, bias=None):
    """silu's (p, m) with act' = (m + 1) / 2: at h = (scale x + bias) / 2, sigmoid(2h) = (1 + t) / 2 with t =
    tanh(h), so p = h (1 + t) and 2 act' = (1 + t)(1 + h (1 - t)) = 1 + t + h (1 - t^2)."""
    h = _scaled(x, 0.5, scale, bias, fma)
    t = tanh(h)
    return fma(h, t, h), fma(h, fma(-t, t, 1.0), t)


@_backward_terms(0.25, 0.0)
def sigmoid_grad_terms(x, scale, fma, tanh, bias=None):
    """sigmoid's (p, m) with act' = m / 4: sigmoid(y) = (1 + t) / 2 with t = tanh(y / 2), and act' = (1 - t^2) / 4."""
    t = tanh(_scaled(x, 0.5, scale, bias, fma))
    return fma(t, 0.5, 0.5), fma(-t, t, 1.0)


def _form_of_terms(terms: Callable) -> Callable:
    @cute.jit
    def fn(x: cutlass.Float32, scale: cutlass.Float32, slope: cutlass.Float32, bias):
        return terms(x, scale, cute.math.fma, _tanh, bias)

    return fn


def _form_at_scaled(and_grad: Callable) -> Callable:
    @cute.jit
    def fn(x: cutlass.Float32, scale: cutlass.Float32, slope: cutlass.Float32, bias):
        return and_grad(_scaled(x, 1.0, scale, bias), slope)

    return fn


# (act(y), act'(y)) at y = scale · x + bias for the other activations: selects and clamps, no factor to move


@_backward_at_scaled
@cute.jit
def identity_and_grad(x: cutlass.Float32, slope: cutlass.Float32):
    return x, cutlass.Float32(1.0)


@_backward_at_scaled
@cute.jit
def relu_and_grad(x: cutlass.Float32, slope: cutlass.Float32):
    y = cutlass.Float32(0.0) if x < 0.0 else x
    g = cutlass.Float32(1.0) if x > 0.0 else cutlass.Float32(0.0)
    return y, g


@_backward_at_scaled
@cute.jit
def relu_square_and_grad(x: cutlass.Float32, slope: cutlass.Float32):
    r = cutlass.Float32(0.0) if x < 0.0 else x
    return r * r, 2.0 * r


@_backward_at_scaled
@cute.jit
def leaky_relu_and_grad(x: cutlass.Float32, slope: cutlass.Float32):
    y = x if x > 0.0 else x * slope
    g = cutlass.Float32(1.0) if x > 0.0 else slope
    return y, g


@_backward_at_scaled
@cute.jit
def gelu_and_grad(x: cutlass.Float32, slope: cutlass.Float32):
    xc = cute.math.min(cute.math.max(x, -GELU_ERF_CLAMP), GELU_ERF_CLAMP)
    x2 = xc * xc
    t = _tanh(xc * (GELU_ERF_C1 + x2 * (GELU_ERF_C3 + x2 * GELU_ERF_C5)))
    cdf = 0.5 + 0.5 * t
    du = GELU_ERF_C1 + x2 * (3.0 * GELU_ERF_C3 + x2 * (5.0 * GELU_ERF_C5))
    pdf = 0.5 * (1.0 - t * t) * du
    if x < -GELU_ERF_CLAMP:
        cdf = cutlass.Float32(0.0)
        pdf = cutlass.Float32(0.0)
    if x > GELU_ERF_CLAMP:
        cdf = cutlass.Float32(1.0)
        pdf = cutlass.Float32(0.0)
    return x * cdf, cdf + x * pdf


@_backward_at_scaled
@cute.jit
def hardswish_and_grad(x: cutlass.Float32, slope: cutlass.Float32):
    # hardswish(x) = x c with c = s clamped to [0, 1], s = x / 6 + 1/2, and act' = 2 s - 1/2 where s is inside
    # (c == s), c outside: three compares where two clamps and two tests of x made ptxas spill 140-160 bytes in
    # the backward (now 24-48). Rounding s upwards keeps eager's derivative at the kinks: no float x gives
    # x / 6 + 1/2 exactly 0, and from x = 3 on it lies above 1 (rounded to nearest, x = 3 gave s = 1 and 1.5, not
    # eager's 1). NaN: c = 1 and act' = 1, as eager's derivative at NaN.
    s = cute.math.fma(x, 1.0 / 6.0, 0.5, rounding=cute.math.RoundingMode.UP)
    c = cutlass.Float32(0.0) if s < 0.0 else s
    c = c if s <= 1.0 else cutlass.Float32(1.0)
    g = cute.math.fma(s, 2.0, -0.5) if c == s else c
    return x * c, g


# A packed bf16x2 backward form for gelu_tanh. Its fp32 form takes 11 FP32 ops and a tanh per score, and at 2048² its
# backward ran 11-15% slower than silu's (the activation sits between each warpgroup's Sᵀ/dPᵀ and dV/dK/dQ matmuls).
# On bf16x2 pairs, as in the forward: x rounded to bf16 once (eager rounds S too), tanh's argument u two scores per
# instruction, P' = x (1 + t) = P / (scale / 2) already the dV operand (dV takes the factor once), m (act' =
# (m + 1) / 2, as the fp32 form) in bf16x2, then dS = dP (m + 1) from dP rounded to bf16 (as eager's dP) by one
# fma.rn.bf16x2 per pair, already dK's operand: about 7.5 issue slots a score against 12 (H100, 2048²: the
# backward's main kernel 7% faster). The tanh stays tanh.approx.f32 on the unpacked u, rounded to bf16: 2 act' =
# 1 + t + (1 - t²) v with v growing as y³ needs t within its rounding of tanh(u), and exactly ±1 once |u| is large,
# which tanh.approx.bf16x2 (two MUFU ops per pair on sm_90 anyway) is not: dQ and dK errors reached 6x eager
# PyTorch's at inputs 3x randn. As built, dQ and dK errors measured 0.86-1.68x eager's at inputs 0.3-6x randn
# (Frobenius norm; the fp32 form 0.62-1.49x, the bound 2x). Bf16 only (fp16's range).


class PackedBackwardForm(NamedTuple):
    """The backward of act on bf16x2 pairs of unscaled scores x: ``constants(scale)`` gives its bf16x2 constants,
    computed once per kernel; ``pair(x, constants)`` gives (P', m) as bf16x2, ``score(x, widened)`` the same for one
    fp32 score (masked tiles) from the constants widened to fp32 (``widen_bf16x2``; by each masked copy of the loop,
    so that the loop without a mask keeps no fp32 copies live), with P' = act(scale · x) / (scale / 2) and
    act'(scale · x) = grad_factor · (m + grad_offset)."""

    constants: Callable
    pair: Callable
    score: Callable
    grad_factor: float
    grad_offset: float


@cute.jit
def _tanh_of_bf16x2(u: cutlass.Int32) -> cutlass.Int32:
    """tanh of both halves of a bf16x2 by tanh.approx.f32 (a bf16 widens to fp32 by its bits), rounded to bf16x2."""
    return cute.arch.inline_ptx(
        "{ .reg .b32 lo, hi; shl.b32 lo, {$r0}, 16; and.b32 hi, {$r0}, 0xffff0000; tanh.approx.f32 lo, lo; "
        "tanh.approx.f32 hi, hi; cvt.rn.bf16x2.f32 {$w0}, hi, lo; }",
        write_only_types=[cutlass.Int32], read_only_args=[u],
    )


@cute.jit
def _one_minus_square_bf16x2(t: cutlass.Int32) -> cutlass.Int32:
    # 0x3f80: bf16's 1.0
    return cute.arch.inline_ptx(
        "{ .reg .b32 nt, one; mov.b32 one, 0x3f803f80; neg.bf16x2 nt, {$r0}; fma.rn.bf16x2 {$w0}, nt, {$r0}, one; }",
        write_only_types=[cutlass.Int32], read_only_args=[t],
    )


def gelu_tanh_scaled_terms(x, c, mul, fma, tanh, one_minus_square):
    """gelu_tanh's (P', m) at y = s x from ``gelu_tanh_scaled_constants(s)`` (``c``), over any number type with its
    ``mul``, ``fma``, ``tanh`` and 1 - t² (bf16x2 registers in the kernel, float64 tensors in the tests): tanh's
    argument u = x (c s + c k s³ x²), v = x (c s + 3 c k s³ x²), P' = x (1 + t) = gelu_tanh(y) / (s / 2) and
    2 act' = 1 + t + (1 - t²) v = 1 + m."""
    x2 = mul(x, x)
    t = tanh(mul(x, fma(x2, c[1], c[0])))
    v = mul(x, fma(x2, c[2], c[0]))
    return fma(x, t, x), fma(one_minus_square(t), v, t)


@cute.jit
def _gelu_tanh_bwd_constants(scale: cutlass.Float32):
    return tuple(pack_bf16x2(c, c) for c in gelu_tanh_scaled_constants(scale))


@cute.jit
def _gelu_tanh_bwd_pair(x: cutlass.Int32, c):
    return gelu_tanh_scaled_terms(x, c, _mul_bf16x2, fma_bf16x2, _tanh_of_bf16x2, _one_minus_square_bf16x2)


@cute.jit
def widen_bf16x2(w: cutlass.Int32) -> cutlass.Float32:
    """The low half of a bf16x2 as fp32 (a bf16 widens by its bits)."""
    return cute.arch.inline_ptx("shl.b32 {$w0}, {$r0}, 16;", write_only_types=[cutlass.Float32], read_only_args=[w])


@cute.jit
def _one_minus_square(t: cutlass.Float32) -> cutlass.Float32:
    return cute.math.fma(-t, t, 1.0)


@cute.jit
def _gelu_tanh_bwd_score(x: cutlass.Float32, c):
    return gelu_tanh_scaled_terms(x, c, lambda a, b: a * b, cute.math.fma, _tanh, _one_minus_square)


# by activation: those the table marks ``packed_bf16_backward``
_PACKED_BF16_BACKWARD = {
    "gelu_tanh": PackedBackwardForm(_gelu_tanh_bwd_constants, _gelu_tanh_bwd_pair, _gelu_tanh_bwd_score, 0.5, 1.0),
}

check_forms("cute/activation_math.py's forward forms", _FORWARD_FORMS, forms_named("cute_forward"))
check_forms("cute/activation_math.py's backward forms", _BACKWARD_FORMS, forms_named("cute_backward"))
check_forms("cute/activation_math.py's packed bf16 forward forms", _PACKED_BF16, {n: n for n in PACKED_BF16_FORWARD})
check_forms("cute/activation_math.py's packed bf16 backward forms", _PACKED_BF16_BACKWARD,
            {n: n for n in PACKED_BF16_BACKWARD})

# Each activation's forms, from its row.
FORWARD_FORMS: dict[str, Callable] = {n: _FORWARD_FORMS[a.cute_forward] for n, a in ACTIVATIONS.items()}
_BACKWARD_FORM_OF: dict[str, tuple[BackwardForm, bool]] = {
    n: _BACKWARD_FORMS[a.cute_backward] for n, a in ACTIVATIONS.items()}
# the forms built from fma and tanh alone, their fn taking (x, scale, fma, tanh, bias)
BACKWARD_TERMS: dict[str, BackwardForm] = {n: form for n, (form, terms) in _BACKWARD_FORM_OF.items() if terms}


def backward_form(name: ActivationName, packed: bool = False) -> BackwardForm | PackedBackwardForm:
    """The backward's per-score form of activation ``name``: with ``packed`` (bf16 operands, no bias) a
    PackedBackwardForm where the table has one."""
    if packed and name in PACKED_BF16_BACKWARD:
        return _PACKED_BF16_BACKWARD[name]
    form, terms = _BACKWARD_FORM_OF[name]
    return form._replace(fn=(_form_of_terms if terms else _form_at_scaled)(form.fn))
