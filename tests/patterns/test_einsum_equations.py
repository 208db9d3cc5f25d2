"""Einsum equations with ``...`` are read by spelling the ellipsis out: the explicit equation must compute what the
original computes on operands of the given ranks, and equations that cannot be spelled out are refused (None)."""

from __future__ import annotations

import pytest
import torch

from gdpa_inductor.patterns.fx_nodes import explicit_equation

CASES = [  # (equation, operand shapes)
    ("...id,...jd->...ij", [(2, 3, 5, 4), (2, 3, 6, 4)]),
    ("...ij,...jd->...id", [(2, 3, 5, 6), (2, 3, 6, 4)]),
    ("...id,...jd->...ij", [(2, 3, 5, 4), (3, 6, 4)]),  # broadcast from the right
    ("b...id,b...jd->b...ij", [(2, 3, 5, 4), (2, 3, 6, 4)]),
    ("...ij,jd->...id", [(2, 3, 5, 6), (6, 4)]),
    ("bhid,bhjd->bhij", [(2, 3, 5, 4), (2, 3, 6, 4)]),  # nothing to spell out
]


@pytest.mark.parametrize("equation, shapes", CASES)
def test_explicit_equation_computes_the_same(equation, shapes):
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes)
    explicit = explicit_equation(equation, [a.dim(), b.dim()])
    assert explicit is not None and "." not in explicit
    torch.testing.assert_close(torch.einsum(explicit, a, b), torch.einsum(equation, a, b))


@pytest.mark.parametrize("equation, ranks", [
    ("...id,...jd", [4, 4]),  # implicit output
    ("...i...d,...jd->...ij", [4, 4]),  # two ellipses in one term
    ("...id,...jd->ij", [4, 4]),  # the ellipsis summed away
    ("...abcd,jd->...j", [3, 2]),  # more letters than the operand has dims
])
def test_explicit_equation_refuses(equation, ranks):
    assert explicit_equation(equation, ranks) is None
