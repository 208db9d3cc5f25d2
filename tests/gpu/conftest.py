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
