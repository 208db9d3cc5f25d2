"""The numbers in the activations' kernel forms, defined once for the Triton forms (``triton/activation_math.py``,
as constexprs) and the CuTe-DSL forms (``cute/activation_math.py``)."""

from __future__ import annotations

# gelu_tanh: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
SQRT_2_OVER_PI = 0.7978845608028654
GELU_TANH_COEF = 0.044715
# Erf approximant for exact GELU in half precision: Phi(x) ~ 0.5(1 + tanh(x(C1 + C3 x^2 + C5 x^4))) on |x| <= 5,
# within 2^-13 of the exact Phi, gelu and gelu' (pinned by tests/kernels/test_activations.py).
GELU_ERF_C1 = 0.7974228171161315
GELU_ERF_C3 = 0.03700386699238616
GELU_ERF_C5 = -0.0003475472313648832
GELU_ERF_CLAMP = 5.0
