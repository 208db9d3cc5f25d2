"""Fixtures of the GPU tests."""

from __future__ import annotations

import pytest

import gdpa_inductor


@pytest.fixture
def cute_backend():
    """``config.backend = "cute"`` for one test."""
    saved = gdpa_inductor.config.backend
    gdpa_inductor.config.backend = "cute"
    yield
    gdpa_inductor.config.backend = saved


@pytest.fixture
def cute_varlen_only(monkeypatch, cute_backend):
    """The CuTe varlen kernels or a failure: the Triton varlen forward and backward raise."""

    def no_triton(*args, **kwargs):
        raise AssertionError("a Triton varlen kernel ran")

    for name in ("varlen_fwd.gdpa_varlen_fwd_triton", "varlen_bwd.gdpa_varlen_bwd_triton"):
        monkeypatch.setattr(f"gdpa_inductor.kernels.triton.{name}", no_triton)
