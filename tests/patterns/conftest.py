"""The pattern tests check the graph rewrite, not the kernels: the fused op runs its pure-PyTorch reference
(tests/conftest.py sets TRITON_INTERPRET=1 on CPU, which would otherwise route fp32 calls through the Triton
interpreter; the kernels have their own tests under tests/kernels)."""

from __future__ import annotations

import pytest
import torch

import gdpa_inductor.config


@pytest.fixture(autouse=True)
def reference_kernels_and_fresh_dynamo(monkeypatch):
    monkeypatch.setattr(gdpa_inductor.config, "backend", "reference")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
