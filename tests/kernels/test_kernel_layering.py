"""The two kernel backends do not import each other: what both use lives in ``kernels/common`` (or beside it, as
``kernels/activations.py``), so a CuTe kernel's compile cache can hash everything it depends on, and either
backend can change without reaching into the other. Read from the sources with ``ast``; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[2] / "gdpa_inductor" / "kernels"
BACKENDS = ("cute", "triton")
PACKAGE = "gdpa_inductor.kernels"


def _imported_modules(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, absolute dotted name) of every module ``path`` imports, with relative imports resolved against
    ``package`` (the module's own package); ``from X import y`` also yields ``X.y``, which may name a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def _crossings(backend: str) -> list[str]:
    other = next(b for b in BACKENDS if b != backend)
    forbidden = f"{PACKAGE}.{other}"
    bad = {}
    for path in sorted((KERNELS / backend).rglob("*.py")):
        package = ".".join((PACKAGE, backend, *path.relative_to(KERNELS / backend).parent.parts))
        for line, module in _imported_modules(path, package):
            if module == forbidden or module.startswith(forbidden + "."):
                bad.setdefault(f"{path.relative_to(KERNELS.parent)}:{line}", module)  # one entry per statement
    return [f"{where} imports {module}" for where, module in bad.items()]


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_does_not_import_the_other(backend):
    crossings = _crossings(backend)
    assert not crossings, f"kernels/{backend} imports the other backend (move the shared code to kernels/common):\n" \
        + "\n".join(crossings)


@pytest.mark.parametrize("source, package, expected", [
    ("from ..triton import dq_round", f"{PACKAGE}.cute", f"{PACKAGE}.triton"),
    ("from ..triton.layout import as_4d", f"{PACKAGE}.cute", f"{PACKAGE}.triton.layout"),
    ("from .. import triton", f"{PACKAGE}.cute", f"{PACKAGE}.triton"),
    ("import gdpa_inductor.kernels.cute.gdpa_fwd", f"{PACKAGE}.triton", f"{PACKAGE}.cute.gdpa_fwd"),
    ("from gdpa_inductor.kernels.cute import gdpa_bwd", f"{PACKAGE}.triton", f"{PACKAGE}.cute.gdpa_bwd"),
    ("def f():\n    from ...kernels.cute.varlen_fwd import x", f"{PACKAGE}.triton", f"{PACKAGE}.cute.varlen_fwd"),
])
def test_every_import_form_is_seen(tmp_path, source, package, expected):
    """The reader resolves relative, absolute and function-local imports, so none of them slips past the check."""
    path = tmp_path / "m.py"
    path.write_text(source + "\n")
    assert any(m == expected for _, m in _imported_modules(path, package))


def test_common_imports_neither_backend():
    forbidden = tuple(f"{PACKAGE}.{b}" for b in BACKENDS)
    bad = [f"{path.name}:{line} imports {module}"
           for path in sorted((KERNELS / "common").rglob("*.py"))
           for line, module in _imported_modules(path, f"{PACKAGE}.common")
           if any(module == f or module.startswith(f + ".") for f in forbidden)]
    assert not bad, bad


# Modules of the package that the CuTe launchers import for host-side work only (shapes of a varlen batch): no
# compiled kernel is built from them, so the compile cache need not hash them.
CUTE_HOST_ONLY = {"gdpa_inductor.kernels.reference_varlen"}


def test_what_cute_imports_from_the_kernels_is_in_its_compile_fingerprint():
    """A CuTe kernel compiled from a helper or constant outside its directory would be reloaded stale from the disk
    cache after that file changed unless the fingerprint hashes it (``compile_cache.kernel_sources``)."""
    from gdpa_inductor.kernels.cute.compile_cache import kernel_sources

    hashed = {".".join((PACKAGE, *src.relative_to(KERNELS).with_suffix("").parts)) for src in kernel_sources()}
    hashed |= {name.removesuffix(".__init__") for name in hashed}
    unhashed = set()
    for path in sorted((KERNELS / "cute").glob("*.py")):
        for _, module in _imported_modules(path, f"{PACKAGE}.cute"):
            if not module.startswith(PACKAGE + "."):
                continue  # outside kernels/ (the settings, third-party packages)
            where = KERNELS.joinpath(*module.split(".")[2:])
            is_module = where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()
            if is_module and module not in hashed | CUTE_HOST_ONLY:
                unhashed.add(f"{path.name} imports {module}")
    assert not unhashed, sorted(unhashed)
