"""The CuTe kernels' compile cache (kernels/cute/compile_cache.py), without a GPU: a kernel compiled for
sm_90a against fake tensors goes to disk once, a later process (here: an emptied memory cache) loads it
instead of compiling, an unreadable file is rebuilt, a failed export is only logged, and the cache directory
setting turns the disk cache off."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is not installed")

import torch  # noqa: E402
import tvm_ffi  # noqa: E402

from gdpa_inductor import config  # noqa: E402
from gdpa_inductor.kernels.cute import compile_cache  # noqa: E402
from gdpa_inductor.kernels.cute.compile_cache import cache_path, cached_compile  # noqa: E402


@pytest.fixture(scope="module")
def compiled():
    """One real compile (the smallest backward), shared by the tests: never a copy loaded from memory or from an
    earlier run's disk cache, which has nothing to export."""
    from gdpa_inductor.kernels.cute.gdpa_bwd import compile_bwd

    saved = config.kernel_cache_dir, compile_cache._MEMORY
    config.kernel_cache_dir, compile_cache._MEMORY = None, {}
    try:
        return compile_bwd(torch.bfloat16, 64, "relu")
    finally:
        config.kernel_cache_dir, compile_cache._MEMORY = saved


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "kernel_cache_dir", str(tmp_path))
    monkeypatch.setattr(compile_cache, "_MEMORY", {})
    return tmp_path


class Builder:
    def __init__(self, result):
        self.result, self.calls = result, 0

    def __call__(self):
        self.calls += 1
        return self.result


def test_second_process_loads_instead_of_compiling(compiled, cache_dir):
    build = Builder(compiled)
    key = ("test", "bwd", 64, "relu")
    assert cached_compile(key, build) is compiled and build.calls == 1
    path = cache_path(key)
    assert path.exists() and path.is_relative_to(cache_dir) and path.stat().st_size > 0
    assert cached_compile(key, build) is compiled and build.calls == 1, "memory hit"

    compile_cache._MEMORY.clear()  # a new process
    loaded = cached_compile(key, build)
    assert build.calls == 1, "loaded from disk, not compiled"
    assert loaded is not compiled and isinstance(loaded, tvm_ffi.Function)
    assert list(path.parent.iterdir()) == [path], "no temporary files left behind"


def test_keys_and_sources_name_distinct_files(cache_dir):
    a, b = cache_path(("bwd", "torch.bfloat16", 64, "relu")), cache_path(("bwd", "torch.float16", 64, "relu"))
    assert a != b and a.parent == b.parent
    assert a.parent.name == compile_cache.source_fingerprint() and len(a.parent.name) == 32


def test_unreadable_file_is_rebuilt(compiled, cache_dir, caplog):
    key = ("test", "corrupt")
    path = cache_path(key)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not an object file")
    build = Builder(compiled)
    with caplog.at_level(logging.INFO, logger="gdpa_inductor"):
        assert cached_compile(key, build) is compiled
    assert build.calls == 1 and "dropping unreadable cached kernel" in caplog.text
    assert path.exists() and path.read_bytes() != b"not an object file", "replaced by the fresh compile"


def test_failed_export_is_logged_not_raised(cache_dir, caplog):
    build = Builder(object())  # has no export_to_c
    with caplog.at_level(logging.INFO, logger="gdpa_inductor"):
        assert cached_compile(("test", "no-export"), build) is build.result
    assert "could not cache the compiled kernel" in caplog.text
    assert not cache_path(("test", "no-export")).exists()


@pytest.mark.parametrize("persist_dir, persist", [("", True), (None, False)])
def test_disk_cache_off(compiled, cache_dir, monkeypatch, persist_dir, persist):
    if persist_dir is not None:
        monkeypatch.setattr(config, "kernel_cache_dir", persist_dir)
    build = Builder(compiled)
    cached_compile(("test", "off"), build, persist=persist)
    assert not any(cache_dir.rglob("*.o"))
