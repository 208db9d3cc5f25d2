"""gdpa_inductor.config: an assignment is checked when it is made, naming the option and what it expects."""

from __future__ import annotations

import os
import subprocess
import sys

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


@pytest.mark.parametrize("value", [None, 64, 80])
def test_a_query_tile_is_64_80_or_none(monkeypatch, value):
    monkeypatch.setattr(config, "cute_bwd_query_tile", value)
    assert config.cute_bwd_query_tile == value


@pytest.mark.parametrize("value", [96, "80", 80.0, True])
def test_another_query_tile_is_refused_when_set(value):
    saved = config.cute_bwd_query_tile
    with pytest.raises(ValueError, match=r"gdpa_inductor\.config\.cute_bwd_query_tile: expected None or one of"):
        config.cute_bwd_query_tile = value
    assert config.cute_bwd_query_tile == saved


@pytest.mark.parametrize("value, expected", [("80", "80"), ("64", "64"), ("128", "'128'")])
def test_the_query_tile_variable_is_read_once_at_import(tmp_path, value, expected):
    """A valid value becomes the int; another stays the string, which the backward reports by the variable's name."""
    code = "import gdpa_inductor.config as c; print(repr(c.cute_bwd_query_tile))"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "GDPA_CUTE_BWD_QUERY_TILE": value},
                         capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip() == expected
