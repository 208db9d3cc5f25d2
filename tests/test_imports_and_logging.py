"""What ``import gdpa_inductor`` costs and how its logger is switched on, each checked in a fresh interpreter.

Importing the package must not import Triton or cutlass-dsl (seconds of import, and absent on some platforms), and
the reference path (a CPU float64 call) must not either: only a kernel that runs needs its compiler. The logger
``gdpa_inductor`` is named ``gdpa`` in torch's logging settings.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("triton", "cutlass", "tvm_ffi")
# The hook torch calls through its ``torch.backends`` entry points while it imports.
TORCH_LOGS_HOOK = "_gdpa_inductor_torch_logs"

REFERENCE_CALLS = """
import torch
from gdpa_inductor import gdpa, gdpa_varlen
q = torch.randn(2, 2, 6, 8, dtype=torch.float64, requires_grad=True)
gdpa(q, q, q, activation="silu", causal=True).sum().backward()
x = torch.randn(9, 2, 8, dtype=torch.float64, requires_grad=True)
cu = torch.tensor([0, 4, 9], dtype=torch.int32)
gdpa_varlen(x, x, x, cu, cu, 5, 5, causal=True).sum().backward()
"""


def _run(code: str, extra_env: dict | None = None, pythonpath: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter on this checkout, without the test run's TORCH_LOGS or TRITON_INTERPRET
    (conftest turns the interpreter on for CPU-only runs)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_LOGS", "TRITON_INTERPRET")}
    env["PYTHONPATH"] = os.pathsep.join([*pythonpath, str(ROOT), env.get("PYTHONPATH", "")])
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def _loaded_after(code: str, extra_env: dict | None = None) -> list[str]:
    done = _run(code + f"\nimport sys, json\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))",
                extra_env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _backend_entry_point_installed() -> bool:
    return any(ep.name == "gdpa" for ep in importlib.metadata.entry_points(group="torch_dynamo_backends"))


# Without the entry point (a checkout on PYTHONPATH) the package registers the backend with Dynamo itself, and
# importing Dynamo imports Triton.
@pytest.mark.skipif(not _backend_entry_point_installed(),
                    reason="the torch_dynamo_backends entry point 'gdpa' is not installed (run `pip install -e .`)")
def test_import_leaves_triton_and_cutlass_out():
    assert _loaded_after("import gdpa_inductor") == []


@pytest.mark.skipif(not _backend_entry_point_installed(),
                    reason="the torch_dynamo_backends entry point 'gdpa' is not installed (run `pip install -e .`)")
def test_reference_calls_leave_triton_and_cutlass_out():
    assert _loaded_after(REFERENCE_CALLS) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the Triton interpreter, which CPU-only runs use")
def test_a_triton_call_imports_triton_when_it_runs():
    # The lazy imports still reach Triton where it runs: float32 on CPU under the interpreter.
    code = """
import torch
from gdpa_inductor import gdpa
from gdpa_inductor.kernels.reference import gdpa_reference
q = torch.randn(1, 2, 16, 16)
torch.testing.assert_close(gdpa(q, q, q, activation="silu"), gdpa_reference(q, q, q, activation="silu"),
                           rtol=1e-5, atol=1e-5)
"""
    assert "triton" in _loaded_after(code, {"TRITON_INTERPRET": "1"})


DISPATCH_DEBUG = "gdpa forward: reference (device cpu"
ONE_CALL = """
import torch, gdpa_inductor
q = torch.randn(1, 2, 4, 8, dtype=torch.float64)
gdpa_inductor.gdpa(q, q, q)
print("ran")
"""


def test_set_logs_gdpa_shows_the_dispatch():
    done = _run("import logging, torch, gdpa_inductor\n"
                "torch._logging.set_logs(modules={'gdpa': logging.DEBUG})\n" + ONE_CALL)
    assert done.returncode == 0 and "ran" in done.stdout, done.stderr[-3000:]
    assert DISPATCH_DEBUG in done.stderr


@pytest.mark.parametrize("setting, shown", [("+gdpa_inductor", True), ("gdpa_inductor", False)])
def test_torch_logs_with_the_logger_name(setting, shown):
    # The logger's own name is a module name, which torch accepts without any registration.
    done = _run(ONE_CALL, {"TORCH_LOGS": setting})
    assert done.returncode == 0 and "ran" in done.stdout, done.stderr[-3000:]
    assert (DISPATCH_DEBUG in done.stderr) == shown, done.stderr[-3000:]


def _hook_distribution(tmp_path: Path) -> Path:
    """A distribution declaring the package's ``torch.backends`` entry point, as an install of the package does."""
    info = tmp_path / "gdpa_torch_logs_hook-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gdpa-torch-logs-hook\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[torch.backends]\ngdpa_logs = {TORCH_LOGS_HOOK}:register\n")
    return tmp_path


def _with_hook(tmp_path: Path) -> tuple[str, ...]:
    assert (ROOT / f"{TORCH_LOGS_HOOK}.py").exists(), f"{TORCH_LOGS_HOOK}.py is missing from the checkout"
    return (str(_hook_distribution(tmp_path)),)


# torch 2.11 and 2.12 parse TORCH_LOGS before they call the torch.backends entry points, so no package can
# register a name in time there; 2.13 calls them first.
@pytest.mark.skipif(torch.__version__ < "2.13", reason="torch < 2.13 parses TORCH_LOGS before its entry points run")
@pytest.mark.parametrize("setting, shown", [("+gdpa", True), ("gdpa", False), ("dynamo,+gdpa", True)])
def test_torch_logs_gdpa_set_before_torch_imports(tmp_path, setting, shown):
    done = _run(ONE_CALL, {"TORCH_LOGS": setting}, pythonpath=_with_hook(tmp_path))
    assert done.returncode == 0 and "ran" in done.stdout, done.stderr[-3000:]
    assert (DISPATCH_DEBUG in done.stderr) == shown, done.stderr[-3000:]


def test_without_torch_logs_the_hook_leaves_the_logger_to_the_application(tmp_path):
    # A logger registered while torch imports stops propagating to the root logger (torch attaches its own
    # handler): the hook registers only when TORCH_LOGS asks for it.
    code = "import logging, torch, gdpa_inductor\nprint(logging.getLogger('gdpa_inductor').propagate)"
    done = _run(code, pythonpath=_with_hook(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True"]
