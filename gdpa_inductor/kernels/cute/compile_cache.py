"""Compiled CuTe-DSL kernels, kept in memory and on disk.

A compile takes seconds (IR generation, MLIR passes, ptxas); loading the same kernel from an object file takes
milliseconds. Each kernel (compiled through TVM-FFI, ``kernel_args``) is exported once with cutlass-dsl's
``export_to_c`` to ``<config.kernel_cache_dir>/cute/<fingerprint>/<key hash>.o`` and later processes load it
with ``cute.runtime.load_module(..., enable_tvm_ffi=True)``, which gives a function called the same way. The
fingerprint hashes the kernel sources (this directory, ``kernels/common`` and ``kernels/activations.py``: all that a
compiled kernel reads its code and constants from), the cutlass-dsl, TVM-FFI and Python versions and the target
architecture the kernel is compiled for (``kernel_args.TARGET_ARCH`` for the Hopper kernels, ``SM100_TARGET_ARCH`` for
the Blackwell forward: each build names its own), so any change to them compiles afresh. Files
are written to a temporary name and renamed into place: a concurrent or killed writer never leaves a partial file
under the final name. A file that fails to
load is removed and rebuilt; a failing export only costs the next process a compile. Both are logged, neither
reaches the caller.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Hashable
from pathlib import Path

from ... import config
from .kernel_args import TARGET_ARCH

log = logging.getLogger("gdpa_inductor")
_MEMORY: dict = {}
KERNELS_DIR = Path(__file__).resolve().parents[1]
# What the CuTe kernels are built from, relative to ``kernels/``: their own sources, and the shared code and constants
# they import (``tests/kernels/test_kernel_layering.py`` keeps them off the Triton package, which is not hashed)
SOURCE_PATTERNS = ("cute/*.py", "common/*.py", "activations.py")


def kernel_sources(root: Path | None = None) -> list[Path]:
    """The files under ``root`` (default ``kernels/``) that ``source_fingerprint`` hashes, in a fixed order."""
    root = KERNELS_DIR if root is None else root
    return sorted({src for pattern in SOURCE_PATTERNS for src in root.glob(pattern)})


def sources_hash(root: Path | None = None) -> str:
    """Hash of ``kernel_sources``: each file's path under ``root`` and its bytes."""
    root = KERNELS_DIR if root is None else root
    h = hashlib.sha256()
    for src in kernel_sources(root):
        h.update(src.relative_to(root).as_posix().encode())
        h.update(src.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def source_fingerprint(target: str | None = None) -> str:
    """Hash of the kernel sources (``kernel_sources``), the cutlass-dsl, TVM-FFI and Python versions and the
    target (None: the Hopper kernels', ``TARGET_ARCH``)."""
    import cutlass
    import tvm_ffi

    h = hashlib.sha256()
    h.update(f"py{sys.version_info.major}.{sys.version_info.minor} cutlass={cutlass.__version__} "
             f"tvm_ffi={tvm_ffi.__version__} ".encode())
    h.update(f"target={TARGET_ARCH if target is None else target} ".encode())
    h.update(sources_hash().encode())
    return h.hexdigest()[:32]


def cache_path(key: Hashable, target: str | None = None) -> Path | None:
    """Where ``key``'s object file for ``target`` (None: ``TARGET_ARCH``) lives, or None when the disk cache is
    off."""
    if not config.kernel_cache_dir:
        return None
    name = hashlib.sha256(repr(key).encode()).hexdigest()[:32]
    return Path(config.kernel_cache_dir) / "cute" / source_fingerprint(target) / f"{name}.o"


def _symbol(path: Path) -> str:
    return f"gdpa_{path.stem[:16]}"


def _load(path: Path):
    import cutlass.cute as cute

    try:
        return cute.runtime.load_module(str(path), enable_tvm_ffi=True)[_symbol(path)]
    except Exception as exc:  # a truncated or foreign file: rebuild it
        log.info("gdpa_inductor: dropping unreadable cached kernel %s (%s)", path, exc)
        path.unlink(missing_ok=True)
        return None


def _store(path: Path, compiled) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            written = os.path.join(tmp, path.name)
            compiled.export_to_c(written, _symbol(path))
            os.replace(written, path)
    except Exception as exc:
        log.info("gdpa_inductor: could not cache the compiled kernel at %s (%s)", path, exc)


def cached_compile(key: Hashable, build: Callable, persist: bool = True, target: str | None = None):
    """The compiled kernel for ``key`` (a hashable value whose repr names everything the compile depends on
    besides the sources and the target: a plan and whether the PTX is kept), built by ``build()`` for ``target``
    (None: ``TARGET_ARCH``): from memory, else from disk (``persist``), else ``build()``, stored in both."""
    memo = (TARGET_ARCH if target is None else target, key)
    if memo in _MEMORY:
        return _MEMORY[memo]
    path = cache_path(key, target) if persist else None
    compiled = _load(path) if path is not None and path.exists() else None
    if compiled is None:
        compiled = build()
        if path is not None:
            _store(path, compiled)
    _MEMORY[memo] = compiled
    return compiled
