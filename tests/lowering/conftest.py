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


@pytest.fixture
def sm100_machine(monkeypatch):
    """CPU tensors as an sm_100 GPU's with the CuTe stack and Triton (varlen sides scheduled by PyTorch), every
    self-check verdict and fallback forgotten; returns the list the variants checked are appended to."""
    from gdpa_inductor.kernels.cute import bwd_support, fwd_support, varlen_support
    from gdpa_inductor.kernels.triton import varlen_schedule
    from gdpa_inductor.lowering import dispatch, fallback, self_check

    monkeypatch.setattr(self_check, "_verdicts", {})
    monkeypatch.setattr(fallback, "_failed", {})
    for module in (fwd_support, bwd_support, varlen_support):
        monkeypatch.setattr(module, "cute_dsl_available", lambda: True)
        monkeypatch.setattr(module, "on_sm100", lambda device: True)
    monkeypatch.setattr(fwd_support, "tma_layout", lambda t: True)
    monkeypatch.setattr(varlen_schedule, "interpreting", lambda: False)
    monkeypatch.setattr(dispatch, "on_cuda", lambda q: True)
    monkeypatch.setattr(dispatch, "triton_support", lambda *a: (True, "supported"))
    checks = []
    run_check = self_check.run_check
    monkeypatch.setattr(self_check, "run_check", lambda check: checks.append(check.variant) or run_check(check))
    return checks
