"""Fixtures of the lowering tests."""

from __future__ import annotations

import pytest

from gdpa_inductor import config


@pytest.fixture
def backend(monkeypatch):
    """Sets ``gdpa_inductor.config.backend`` for one test (``backend("cute")``)."""
    def set_backend(name):
        monkeypatch.setattr(config, "backend", name)

    return set_backend
