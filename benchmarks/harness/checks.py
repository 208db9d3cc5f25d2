"""The error every benchmark checks a provider by before timing it."""

from __future__ import annotations


def rel_err(out, ref) -> float:
    """Relative error (Frobenius norm) of ``out`` against the float64 reference ``ref``."""
    return ((out.double() - ref).norm() / ref.norm()).item()
