"""gdpa_inductor.config: an assignment is checked when it is made, naming the option and what it expects."""

from __future__ import annotations

import pytest

from gdpa_inductor import config


@pytest.mark.parametrize("value", ["auto", "triton", "reference", "cute"])
def test_every_backend_can_be_set(monkeypatch, value):
    monkeypatch.setattr(config, "backend", value)
    assert config.backend == value


@pytest.mark.parametrize("value", ["cuda", "Triton", None])
def test_an_unknown_backend_is_refused_when_set(value):
    saved = config.backend
    with pytest.raises(ValueError, match=r"gdpa_inductor\.config\.backend: expected one of .*auto.*got"):
        config.backend = value
    assert config.backend == saved


@pytest.mark.parametrize("value", ["", None, "/tmp/kernels"])
def test_a_cache_dir_is_a_path_or_none(monkeypatch, value):
    monkeypatch.setattr(config, "kernel_cache_dir", value)
    assert config.kernel_cache_dir == value


def test_a_cache_dir_must_be_a_path():
    saved = config.kernel_cache_dir
    with pytest.raises(TypeError, match=r"gdpa_inductor\.config\.kernel_cache_dir: expected a path"):
        config.kernel_cache_dir = 3
    assert config.kernel_cache_dir == saved
