"""The README's demo and the examples, run as a user runs them on a CPU (tiny sizes, reference path).

Each must fuse every GDPA block it was written to show, and train exactly as backend="inductor" does.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

from gdpa_inductor import config, demo
from gdpa_inductor.patterns.softmax_free_attention import NO_PAIR

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"

# example file -> GDPA blocks in its model at the default CPU size (each layer's attention and PFFN, PMA)
FUSED_BLOCKS = {
    "hstu_jagged.py": 2,
    "ranking_pffn_pma.py": 5,
    "sigmoid_transformer.py": 4,
}


@pytest.fixture(autouse=True)
def reference_path(monkeypatch):
    """The path a user's CPU takes: the suite sets TRITON_INTERPRET=1, which would route fp32 calls through the
    Triton interpreter instead (its kernels have their own tests)."""
    monkeypatch.setattr(config, "backend", "reference")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), EXAMPLES / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", sorted(FUSED_BLOCKS))
def test_example_fuses_and_trains_like_inductor(name, capsys):
    report, comparison = _load(name).main(["--device", "cpu", "--steps", "2"])
    assert len(report.fused) == FUSED_BLOCKS[name], str(report)
    # Every matmul left to Inductor is a lone one (a projection), never an attention block that was refused.
    assert all(c.reason == NO_PAIR for c in report.rejected), str(report)
    assert len(comparison.runs["gdpa"].losses) == 2
    assert comparison.loss_rel_diff("gdpa") < 1e-5  # fp32: only the order of float additions differs
    out = capsys.readouterr().out
    assert f"{FUSED_BLOCKS[name]} GDPA subgraph(s) fused" in out
    assert "timing needs a GPU" in out


def test_every_example_is_tested():
    assert {p.name for p in EXAMPLES.glob("*.py")} - {"gdpa_op.py"} == set(FUSED_BLOCKS)


def test_demo_on_cpu(capsys):
    demo.main(["--device", "cpu"])
    out = capsys.readouterr().out
    assert "3 GDPA subgraph(s) fused" in out
    assert out.count("FUSED") == 3
    worst = float(re.search(r"worst gradient rel\. error ([0-9.e+-]+)", out).group(1))
    assert worst < 1e-5
    assert "ran its pure-PyTorch reference path" in out
