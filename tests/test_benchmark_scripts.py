"""The benchmark scripts under benchmarks/: each stands alone on the shared harness (no script imports another), each
benchmark's options parse, and each results file a benchmark writes has a plot (no GPU: nothing is run)."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.harness import cli, plotting  # noqa: E402

BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py"))


def _script_imports(source: str, package: str) -> set[str]:
    """The scripts that ``source``, a module of ``package``, imports (as dotted names, relative imports resolved)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return names & ({f"benchmarks.{s}" for s in SCRIPTS} | set(SCRIPTS))


def test_there_are_scripts_and_a_harness():
    assert len(SCRIPTS) >= 5, SCRIPTS
    assert (BENCHMARKS / "harness" / "timing.py").is_file()


@pytest.mark.parametrize("path", sorted(BENCHMARKS.glob("*.py")) + sorted(BENCHMARKS.glob("harness/*.py")),
                         ids=lambda p: p.relative_to(BENCHMARKS).as_posix())
def test_no_script_imports_another(path):
    # What two scripts share lives in benchmarks/harness/, not in one of them (a script is a command, not a library).
    package = ".".join(path.relative_to(ROOT).parent.parts)
    assert not _script_imports(path.read_text(), package), f"{path.name} imports another script"


def test_the_import_check_sees_every_form_of_import():
    text = ("from benchmarks.op import check_bars\nfrom .. import kernels\nimport tune\n"
            "from .timing import SETTLE_MS\nimport benchmarks.harness.checks\n")
    assert _script_imports(text, "benchmarks.harness") == {"benchmarks.op", "benchmarks.kernels", "tune"}


@pytest.fixture(scope="module")
def scripts():
    return {name: importlib.import_module(f"benchmarks.{name}") for name in SCRIPTS}


def test_each_benchmark_names_a_chart_or_none(scripts):
    writes = {name: bench.writes for module in scripts.values() for name, bench in module.BENCHMARKS.items()}
    assert writes, "no benchmarks found"
    unknown = {name: w for name, w in writes.items() if w is not None and w not in plotting.CHARTS}
    assert not unknown, f"results that no chart draws: {unknown}"
    assert sum(w is not None for w in writes.values()) == len(plotting.CHARTS), "a chart no benchmark writes for"


def test_every_benchmark_parses_its_options(scripts, capsys):
    for script, module in scripts.items():
        for name, bench in module.BENCHMARKS.items():
            with pytest.raises(SystemExit) as done:
                cli.main(module.__doc__, module.BENCHMARKS, [name, "--help"])
            assert done.value.code == 0, (script, name)
            assert f"{script}.py {name}" in (bench.run.__doc__ or ""), f"{script} {name}: no command in its docstring"
    assert "usage:" in capsys.readouterr().out


def test_options_that_do_not_go_together_are_a_usage_error(scripts, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main("", scripts["varlen"].BENCHMARKS, ["kernels", "--window", "256"])
    assert done.value.code == 2
    assert "--window needs --causal" in capsys.readouterr().err
