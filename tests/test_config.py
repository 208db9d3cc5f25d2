"""gdpa_inductor.config: an environment value is checked once, at import, naming the variable and what it takes;
an assignment is checked when it is made, naming the option; ``config.patch`` sets options for a block and restores
them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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


ROOT = Path(__file__).resolve().parents[1]


def _import_config(variable: str, value: str, tmp_path) -> subprocess.CompletedProcess:
    """This checkout's config module imported in a fresh process with ``variable`` set to ``value``."""
    code = "import gdpa_inductor.config as c; print(repr((c.backend, c.kernel_cache_dir, c.cute_bwd_query_tile)))"
    env = {**os.environ, variable: value, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)


@pytest.mark.parametrize("variable, value, expected", [
    ("GDPA_CUTE_BWD_QUERY_TILE", "80", 80), ("GDPA_CUTE_BWD_QUERY_TILE", "64", 64),
    ("GDPA_INDUCTOR_BACKEND", "reference", "reference"), ("GDPA_INDUCTOR_CACHE_DIR", "", ""),
])
def test_an_environment_value_is_read_once_at_import(tmp_path, variable, value, expected):
    out = _import_config(variable, value, tmp_path)
    assert out.returncode == 0, out.stderr
    index = ["GDPA_INDUCTOR_BACKEND", "GDPA_INDUCTOR_CACHE_DIR", "GDPA_CUTE_BWD_QUERY_TILE"].index(variable)
    assert eval(out.stdout.strip())[index] == expected


@pytest.mark.parametrize("variable, value, expected", [
    ("GDPA_CUTE_BWD_QUERY_TILE", "128", "64 or 80"), ("GDPA_CUTE_BWD_QUERY_TILE", "", "64 or 80"),
    ("GDPA_INDUCTOR_BACKEND", "cuda", "one of .*'auto'"),
])
def test_a_bad_environment_value_fails_the_import_naming_the_variable(tmp_path, variable, value, expected):
    out = _import_config(variable, value, tmp_path)
    assert out.returncode != 0
    assert re.search(rf"ValueError: environment variable {variable}={value!r}: expected {expected}", out.stderr), \
        out.stderr[-2000:]


def test_an_unknown_option_is_refused():
    with pytest.raises(AttributeError, match="gdpa_inductor.config has no option 'bakend'"):
        config.bakend = "reference"
    assert not hasattr(config, "bakend")


def test_patch_sets_options_for_a_block_and_restores_them():
    saved = config.backend, config.cute_bwd_query_tile
    with config.patch(backend="reference", cute_bwd_query_tile=80):
        assert (config.backend, config.cute_bwd_query_tile) == ("reference", 80)
    assert (config.backend, config.cute_bwd_query_tile) == saved
    with pytest.raises(RuntimeError), config.patch({"backend": "triton"}):
        assert config.backend == "triton"
        raise RuntimeError
    assert config.backend == saved[0], "restored after an exception too"


def test_patch_decorates_a_function():
    saved = config.backend

    @config.patch(backend="reference")
    def read():
        return config.backend

    assert read() == read() == "reference" and config.backend == saved


@pytest.mark.parametrize("changes, error", [
    (dict(backend="reference", cute_bwd_query_tile=96), ValueError), (dict(kernel_cache_dir=3), TypeError),
    (dict(bakend="reference"), AttributeError),
])
def test_patch_checks_every_value_before_setting_any(changes, error):
    saved = config.backend, config.kernel_cache_dir, config.cute_bwd_query_tile
    with pytest.raises(error, match="gdpa_inductor.config"), config.patch(**changes):
        pass
    assert (config.backend, config.kernel_cache_dir, config.cute_bwd_query_tile) == saved
