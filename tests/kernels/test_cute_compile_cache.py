"""The CuTe kernels' compile cache (kernels/cute/compile_cache.py), without a GPU: a kernel compiled for
sm_90a against fake tensors goes to disk once, a later process (here: an emptied memory cache) loads it
instead of compiling, an unreadable file is rebuilt, a failed export is only logged, and the cache directory
setting turns the disk cache off; the fingerprint changes with any source a CuTe kernel is built from (its own,
``kernels/common`` and the activation table), not with the Triton package's."""

from __future__ import annotations

import logging
import os
import shutil

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is not installed")

import torch  # noqa: E402
import tvm_ffi  # noqa: E402

from gdpa_inductor import config  # noqa: E402
from gdpa_inductor.kernels.cute import compile_cache  # noqa: E402
from gdpa_inductor.kernels.cute.bwd_plan import BwdPlan  # noqa: E402
from gdpa_inductor.kernels.cute.compile_cache import cache_path, cached_compile  # noqa: E402
from gdpa_inductor.kernels.cute.kernel_build import compile_bwd  # noqa: E402


@pytest.fixture(scope="module")
def compiled():
    """One real compile (the smallest backward), shared by the tests: never a copy loaded from memory or from an
    earlier run's disk cache, which has nothing to export."""
    saved = config.kernel_cache_dir, compile_cache._MEMORY
    config.kernel_cache_dir, compile_cache._MEMORY = None, {}
    try:
        return compile_bwd(BwdPlan(torch.bfloat16, 64, 64, "relu"))
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
    a, b = (cache_path((BwdPlan(dtype, 64, 64, "relu"), False)) for dtype in (torch.bfloat16, torch.float16))
    assert a != b and a.parent == b.parent
    assert a.parent.name == compile_cache.source_fingerprint() and len(a.parent.name) == 32


def test_a_plans_reason_names_no_other_file(cache_dir):
    """A plan's ``reason`` says why it was chosen, not what is built: the same build is the same file."""
    plan = BwdPlan(torch.bfloat16, 64, 64, "relu", reason="one account")
    same = BwdPlan(torch.bfloat16, 64, 64, "relu", reason="another")
    assert cache_path((plan, False)) == cache_path((same, False)) != cache_path((plan, True))


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


def test_fingerprinted_sources_are_the_cute_common_and_activation_files():
    kernels = compile_cache.KERNELS_DIR
    names = {src.relative_to(kernels).as_posix() for src in compile_cache.kernel_sources()}
    expected = {p.relative_to(kernels).as_posix()
                for p in [*kernels.glob("cute/*.py"), *kernels.glob("common/*.py"), kernels / "activations.py"]}
    assert names == expected
    assert {"cute/gdpa_bwd_sm90.py", "common/layout.py", "common/activation_constants.py", "activations.py"} <= names
    assert not any(n.startswith("triton/") for n in names)


@pytest.fixture
def kernels_copy(tmp_path, monkeypatch):
    """A copy of ``kernels/`` that the fingerprint reads instead (its memoized value dropped before and after)."""
    root = tmp_path / "kernels"
    shutil.copytree(compile_cache.KERNELS_DIR, root, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(compile_cache, "KERNELS_DIR", root)
    compile_cache.source_fingerprint.cache_clear()
    yield root
    compile_cache.source_fingerprint.cache_clear()


def _fingerprint_after(edit) -> str:
    edit()
    compile_cache.source_fingerprint.cache_clear()
    return compile_cache.source_fingerprint()


@pytest.mark.parametrize("changed", ["common/layout.py", "common/activation_constants.py", "common/dq_fragments.py",
                                     "activations.py", "cute/gdpa_fwd_sm90.py"])
def test_a_changed_source_changes_the_fingerprint(kernels_copy, changed):
    """A CuTe kernel's imported helpers and constants are part of what it was compiled from: changing one must not
    reload the kernel compiled before the change. Back to the old bytes, the old fingerprint (and its files)."""
    path = kernels_copy / changed
    original = path.read_bytes()
    before = compile_cache.source_fingerprint()
    after = _fingerprint_after(lambda: path.write_bytes(original + b"# changed\n"))
    assert after != before
    assert _fingerprint_after(lambda: path.write_bytes(original)) == before


def test_a_new_common_module_changes_the_fingerprint(kernels_copy):
    before = compile_cache.source_fingerprint()
    assert _fingerprint_after(lambda: (kernels_copy / "common" / "new_helper.py").write_text("X = 1\n")) != before


def test_a_triton_source_leaves_the_fingerprint(kernels_copy):
    """The Triton package is none of a CuTe kernel's sources (the layering test keeps it so): editing it keeps the
    compiled CuTe kernels."""
    path = kernels_copy / "triton" / "gdpa_fwd.py"
    before = compile_cache.source_fingerprint()
    assert _fingerprint_after(lambda: path.write_bytes(path.read_bytes() + b"# changed\n")) == before


@pytest.mark.parametrize("persist_dir, persist", [("", True), (None, False)])
def test_disk_cache_off(compiled, cache_dir, monkeypatch, persist_dir, persist):
    if persist_dir is not None:
        monkeypatch.setattr(config, "kernel_cache_dir", persist_dir)
    build = Builder(compiled)
    cached_compile(("test", "off"), build, persist=persist)
    assert not any(cache_dir.rglob("*.o"))


def test_a_compile_leaves_the_environment_alone(monkeypatch):
    """The target is the compile's own option (``kernel_args.TARGET_ARCH``): a compile with CUTE_DSL_ARCH unset
    neither sets it nor needs it."""
    from gdpa_inductor.kernels.cute.fwd_plan import plan_fwd
    from gdpa_inductor.kernels.cute.kernel_build import compile_fwd

    monkeypatch.delenv("CUTE_DSL_ARCH", raising=False)
    monkeypatch.setattr(config, "kernel_cache_dir", None)
    monkeypatch.setattr(compile_cache, "_MEMORY", {})
    before = dict(os.environ)
    assert callable(compile_fwd(plan_fwd(torch.bfloat16, 64, "relu")))
    assert dict(os.environ) == before


def test_the_fingerprint_names_the_target_not_the_environment(monkeypatch):
    def fingerprint():
        compile_cache.source_fingerprint.cache_clear()
        return compile_cache.source_fingerprint()

    try:
        monkeypatch.delenv("CUTE_DSL_ARCH", raising=False)
        unset = fingerprint()
        monkeypatch.setenv("CUTE_DSL_ARCH", "sm_100a")
        assert fingerprint() == unset
        monkeypatch.setattr(compile_cache, "TARGET_ARCH", "sm_100a")
        assert fingerprint() != unset
    finally:
        compile_cache.source_fingerprint.cache_clear()
