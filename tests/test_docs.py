"""The user docs (docs/*.md, README.md) against the code they describe.

Docs drift silently when reasons are reworded, activations added, arguments renamed, support widened or files
moved; these checks read the markdown and the package sources, and call the support checks the dispatch calls
(no GPU: CPU tensors stand in for an sm_90 GPU's; one small CPU compile, for the README's example), so that such
a change fails here instead.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gdpa_inductor import gdpa, gdpa_varlen
from gdpa_inductor.kernels.activations import ACTIVATION_NAMES

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACKAGE = ROOT / "gdpa_inductor"
# In a reason excerpt, "…" stands for a value the message fills in at run time (an f-string field).
WILDCARD = "…"
# Stands for an f-string field in a source template; never part of an excerpt, so literal text cannot span it.
FIELD = "\x00"


# ---- markdown ---------------------------------------------------------------------------------------------


def _tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """(header cells, body rows) of every pipe table, in order."""
    tables, block = [], []
    for line in text.splitlines() + [""]:
        if line.lstrip().startswith("|"):
            block.append(line)
            continue
        if len(block) >= 2 and set(block[1].replace("|", "").strip()) <= set("-: "):
            rows = [_cells(row) for row in block]
            tables.append((rows[0], rows[2:]))
        block = []
    return tables


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def _code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _first_column(path: Path, header: str) -> list[str]:
    """Backticked items of the first column of every table whose first header cell starts with ``header``."""
    items = []
    for head, rows in _tables(path.read_text()):
        if head and head[0].lower().startswith(header):
            for row in rows:
                items += _code_spans(row[0])
    return items


def _section(text: str, title: str) -> str:
    """The text under a ``## title`` heading, up to the next heading of that level."""
    match = re.search(rf"^## {re.escape(title)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no '## {title}' section"
    return match.group(1)


# ---- python sources ---------------------------------------------------------------------------------------


def _sources(root: Path = PACKAGE) -> list[Path]:
    return sorted(root.rglob("*.py"))


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _template(node: ast.AST) -> str | None:
    """A string literal as text, its f-string fields replaced by FIELD."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else FIELD for v in node.values)
    return None


def _string_templates() -> list[str]:
    """Every string literal of the package except docstrings: a reason quoted from a docstring proves nothing."""
    out = []
    for path in _sources():
        tree = ast.parse(path.read_text())
        skip = _docstrings(tree)
        out += [t for node in ast.walk(tree) if id(node) not in skip and (t := _template(node)) is not None]
    return out


def _reason_templates() -> list[str]:
    """The rejection and dispatch reasons the code can produce, found by how they are produced:
    ``ChainMismatch(msg)``, ``(None | False, msg)`` verdict pairs, assignments to ``reason``/``NO_PAIR``/
    ``masks_inexact_as_bias``, and the bare reason strings ``_scores_side`` returns."""
    paths = _sources(PACKAGE / "patterns") + [PACKAGE / "lowering" / "dispatch.py"]
    found = []
    for path in paths:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ChainMismatch" and node.args:
                found.append(_template(node.args[0]))
            elif isinstance(node, ast.Tuple) and len(node.elts) == 2 and _is_none_or_false(node.elts[0]):
                found.append(_template(node.elts[1]))
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                name = getattr(target, "id", None) or getattr(target, "attr", None)
                if name in ("reason", "NO_PAIR", "masks_inexact_as_bias"):
                    found.append(_template(node.value))
            elif isinstance(node, ast.FunctionDef) and node.name == "_scores_side":
                found += [_template(r.value) for r in ast.walk(node) if isinstance(r, ast.Return) and r.value]
    return [t for t in found if t]


def _is_none_or_false(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and (node.value is None or node.value is False)


def _matcher(excerpt: str) -> re.Pattern:
    return re.compile(".*?".join(re.escape(part) for part in excerpt.split(WILDCARD)), re.S)


# ---- the checks -------------------------------------------------------------------------------------------


def _reason_excerpts() -> list[str]:
    return _first_column(DOCS / "why-not-fused.md", "reason")


def test_reason_excerpts_occur_in_the_source():
    # A reworded message would leave users searching the table for text the code no longer prints.
    excerpts = _reason_excerpts()
    assert len(excerpts) > 30, "the reason tables were not found"
    templates = _string_templates()
    missing = [e for e in excerpts if not any(_matcher(e).search(t) for t in templates)]
    assert not missing, f"excerpts in docs/why-not-fused.md not found in gdpa_inductor/ strings: {missing}"


def test_every_reason_in_the_source_is_documented():
    # A new rejection or dispatch reason must get a row, or "why wasn't my model fused?" has no answer for it.
    templates = _reason_templates()
    assert len(templates) > 30, "the reason finder found too few reasons: has the way reasons are produced changed?"
    matchers = [_matcher(e) for e in _reason_excerpts()]
    undocumented = [t.replace(FIELD, WILDCARD) for t in templates if not any(m.search(t) for m in matchers)]
    assert not undocumented, f"reasons without a row in docs/why-not-fused.md: {undocumented}"


def test_activation_table_lists_exactly_the_activations():
    # The table is the user's list of what exists; ACTIVATION_NAMES is what the op accepts.
    text = _section((DOCS / "support-matrix.md").read_text(), "Activations")
    names = [_code_spans(row[0])[0] for head, rows in _tables(text) if head[0] == "name" for row in rows]
    assert len(names) == len(set(names)), f"duplicate rows: {names}"
    assert set(names) == set(ACTIVATION_NAMES)


def _links(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)  # code blocks hold no links
    text = re.sub(r"`[^`\n]*`", "", text)
    inline = re.findall(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)
    reference = re.findall(r"^\s*\[[^\]]+\]:\s*(\S+)", text, re.M)
    return inline + reference


def test_relative_links_resolve():
    # Split and renamed docs leave dangling links that only a reader would notice.
    broken = []
    for md in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        for target in _links(md):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
                continue  # http(s), mailto and in-page anchors are not files
            if not (md.parent / target.split("#")[0]).exists():
                broken.append(f"{md.relative_to(ROOT)} -> {target}")
    assert not broken, f"links to missing files: {broken}"


def _file_table() -> list[str]:
    return [p for p in _first_column(DOCS / "how-it-works.md", "file") if p.endswith(".py")]


def test_file_table_paths_exist():
    # The table is where a contributor looks for "which file holds what".
    paths = _file_table()
    assert paths, "the file table of docs/how-it-works.md was not found"
    missing = [p for p in paths if not (ROOT / p).is_file()]
    assert not missing, f"files in docs/how-it-works.md that do not exist: {missing}"


def test_file_table_covers_the_package():
    # A module added without a row is a module nobody can place in the picture.
    listed = set(_file_table())
    unlisted = [str(p.relative_to(ROOT)) for p in _sources() if str(p.relative_to(ROOT)) not in listed]
    assert not unlisted, f"modules missing from the file table of docs/how-it-works.md: {unlisted}"


def test_readme_example_runs_and_fuses():
    """The README's first code block, run as written except for its size and device (a GPU bf16 batch becomes a
    small CPU fp32 one): it must run, compile, and fuse its attention."""
    code = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    gpu_batch = 'torch.randn(8, 4, 1024, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)'
    assert gpu_batch in code
    code = code.replace(gpu_batch, "torch.randn(2, 4, 64, 32, requires_grad=True)")
    code = code.replace("scale=128**-0.5, post_scale=1 / 1024", "scale=32**-0.5, post_scale=1 / 64")
    torch._dynamo.reset()
    before = torch._dynamo.utils.counters["gdpa"]["rewrites"]
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert torch._dynamo.utils.counters["gdpa"]["rewrites"] == before + 1
    torch.testing.assert_close(scope["out"], scope["SiluAttention"]()(scope["q"], scope["k"], scope["v"]),
                               rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


# ---- the docs as a whole ----------------------------------------------------------------------------------

# docs/benchmarks.md records how the kernels were measured, naming launcher arguments that are not the ops'
INTERNALS = {"benchmarks.md"}


def _docs(include_internals: bool = True) -> list[Path]:
    docs = [p for p in sorted(DOCS.glob("*.md")) if include_internals or p.name not in INTERNALS]
    return [ROOT / "README.md", *docs]


def _spans(path: Path) -> list[str]:
    """The inline code spans of a markdown file (code blocks left out)."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return re.findall(r"`([^`\n]+)`", text)


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), re.M | re.S)


def _subsection(text: str, title: str) -> str:
    """The text under a ``### title`` heading, up to the next heading of level 2 or 3."""
    match = re.search(rf"^### {re.escape(title)}\s*$(.*?)(?=^###? |\Z)", text, re.M | re.S)
    assert match, f"no '### {title}' section"
    return match.group(1)


OPS = {"gdpa": gdpa, "gdpa_varlen": gdpa_varlen}


def _params(fn) -> set[str]:
    return set(inspect.signature(fn).parameters)


# ---- (a) the ops' arguments -------------------------------------------------------------------------------


def _op_calls(code: str) -> list[tuple[str, list[str]]]:
    """(op name, keyword names) of every call of ``gdpa``/``gdpa_varlen`` (bare or as an attribute) in ``code``."""
    calls = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in OPS:
                calls.append((name, [kw.arg for kw in node.keywords if kw.arg is not None]))
    return calls


def _signature_block(code: str) -> tuple[str, inspect.Signature] | None:
    """(name, signature) of a block like ``gdpa(query, key, *, activation="gelu_tanh") -> Tensor``, or None."""
    match = re.fullmatch(r"\s*(\w+)(\(.*\))\s*->\s*\w+\s*", code, re.S)
    if not match or match.group(1) not in OPS:
        return None
    fn = ast.parse(f"def {match.group(1)}{match.group(2)}: ...").body[0]
    args, params = fn.args, []
    defaults = [None] * (len(args.args) - len(args.defaults)) + list(args.defaults)
    for a, d in zip(args.args, defaults):
        default = inspect.Parameter.empty if d is None else ast.literal_eval(d)
        params.append(inspect.Parameter(a.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default))
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        default = inspect.Parameter.empty if d is None else ast.literal_eval(d)
        params.append(inspect.Parameter(a.arg, inspect.Parameter.KEYWORD_ONLY, default=default))
    return match.group(1), inspect.Signature(params)


def test_op_calls_in_the_docs_use_real_keywords():
    # A renamed argument leaves every example that spells the old name failing for the reader who copies it.
    wrong, seen = [], 0
    for md in _docs():
        codes = _python_blocks(md) + [s for s in _spans(md) if re.search(r"\bgdpa(_varlen)?\(", s)]
        for code in codes:
            if _signature_block(code) is not None:
                continue
            try:
                calls = _op_calls(code)
            except SyntaxError:
                calls = [(m.group(1), re.findall(r"(\w+)\s*=(?!=)", m.group(2)))
                         for m in re.finditer(r"\b(gdpa|gdpa_varlen)\((.*)", code)]
            for name, keywords in calls:
                seen += 1
                wrong += [f"{md.name}: {name}(... {kw}=)" for kw in keywords if kw not in _params(OPS[name])]
    assert seen > 5, "the calls of gdpa/gdpa_varlen in the docs were not found"
    assert not wrong, f"keywords that gdpa/gdpa_varlen do not take: {wrong}"


def test_bare_keyword_spans_name_real_arguments():
    # `window=`, `causal=True`: a keyword named on its own in the text is an argument of the ops, or of one of
    # the few other functions the docs describe (torch.compile's, the backend's, nested tensors', dropout's, the
    # CuTe launchers').
    from gdpa_inductor.backend import gdpa_backend
    from gdpa_inductor.kernels.cute.gdpa_bwd import gdpa_bwd_cute
    from gdpa_inductor.kernels.cute.gdpa_fwd import gdpa_fwd_cute

    others = [torch.compile, torch.nested.nested_tensor, torch.nn.functional.dropout, gdpa_fwd_cute, gdpa_bwd_cute]

    known = set().union(*(_params(f) for f in [*OPS.values(), gdpa_backend, *others]))
    unknown, seen = [], 0
    for md in _docs(include_internals=False):
        for span in _spans(md):
            if re.match(r"[a-z_]\w*=(?!=)", span):  # `name=...`; `x = y` is an assignment
                for name in re.findall(r"(?:^|[,(]\s*)([a-z_]\w*)=(?!=)", span):
                    seen += 1
                    if name not in known:
                        unknown.append(f"{md.name}: `{span}`")
    assert seen > 5, "no keyword spans found: has the way the docs write them changed?"
    assert not unknown, f"keywords in the docs that no documented function takes: {unknown}"


def test_displayed_signatures_match_the_functions():
    # usage.md shows each op's signature: names, order, keyword-only marker and defaults must be the real ones.
    found = {}
    for code in _python_blocks(DOCS / "usage.md"):
        shown = _signature_block(code)
        if shown is not None:
            found[shown[0]] = shown[1]
    assert set(found) == set(OPS), f"usage.md shows signatures for {sorted(found)}, expected {sorted(OPS)}"
    for name, shown in found.items():
        real = inspect.signature(OPS[name])
        assert [(p.name, p.kind, p.default) for p in shown.parameters.values()] == [
            (p.name, p.kind, p.default) for p in real.parameters.values()
        ], f"usage.md's signature of {name} differs from the code's {real}"


@pytest.mark.parametrize("name", OPS)
def test_argument_tables_document_exactly_the_parameters(name):
    # Every parameter has a row in usage.md (a new argument is documented), every row is a parameter (a removed
    # or renamed one is not left behind).
    text = _subsection((DOCS / "usage.md").read_text(), f"`gdpa_inductor.{name}`")
    rows = [s for head, body in _tables(text) if head[0] == "argument" for row in body for s in _code_spans(row[0])]
    assert rows, f"no argument table under '### `gdpa_inductor.{name}`' in usage.md"
    params = _params(OPS[name])
    assert set(rows) == params, (
        f"{name}: undocumented {sorted(params - set(rows))}, not parameters {sorted(set(rows) - params)}")


# ---- (b) options and environment variables ----------------------------------------------------------------


def _module_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        targets = [node.target] if isinstance(node, ast.AnnAssign) else targets
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
        names |= {node.name} if isinstance(node, ast.FunctionDef) else set()
    return names


def _literals(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    return {t for node in ast.walk(tree) if id(node) not in skip and (t := _template(node)) is not None}


def test_options_and_environment_variables_exist():
    # An option or variable the docs name but the code does not read is silently ignored by the user's setting.
    config_py = PACKAGE / "config.py"
    options, config_literals = _module_names(config_py), _literals(config_py)
    package_literals = set(_string_templates())
    missing, seen = [], 0
    for md in _docs():
        text = md.read_text()
        for name in re.findall(r"(?:gdpa_inductor\.|(?<![\w./]))config\.([A-Za-z_]\w*)", text):
            seen += 1
            if name not in options:
                missing.append(f"{md.name}: config.{name}")
        for var in re.findall(r"\bGDPA_[A-Z0-9_]+\b", text):
            seen += 1
            if var.startswith("GDPA_INDUCTOR_"):
                if var not in config_literals:
                    missing.append(f"{md.name}: {var} (not read in gdpa_inductor/config.py)")
            elif var not in package_literals:
                missing.append(f"{md.name}: {var} (no such string in gdpa_inductor/)")
    assert seen > 5, "no options found in the docs: has the way they are written changed?"
    assert not missing, f"options or environment variables the code does not have: {missing}"


# ---- (c) paths ----------------------------------------------------------------------------------------------

PATH_TOKEN = re.compile(r"[\w./-]+")
TOP_DIRS = ("gdpa_inductor/", "tests/", "benchmarks/", "examples/", "docs/")
SUFFIXES = (".py", ".md", ".sh", ".toml")


def _repo_paths() -> set[str]:
    skip = {".git", "__pycache__", ".pytest_cache"}
    out = set()
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in skip and not d.endswith(".egg-info")]
        rel = Path(dirpath).relative_to(ROOT)
        out |= {(rel / n).as_posix() for n in dirnames + filenames}
    return out


def test_paths_in_backticks_exist():
    # `benchmarks/op.py`, `kernels/cute/gdpa_fwd.py`: a moved or deleted file leaves the reader
    # searching. A path is found at the repository root or as the tail of a path in it (docs name package modules
    # relative to gdpa_inductor/).
    paths = _repo_paths()
    missing, seen = [], 0
    for md in _docs():
        for span in _spans(md):
            for token in span.split():
                token = token.split("::")[0].rstrip(".,:;)")
                if not PATH_TOKEN.fullmatch(token) or not (token.endswith(SUFFIXES) or token.startswith(TOP_DIRS)):
                    continue
                seen += 1
                tail = token.rstrip("/")
                if tail not in paths and not any(p.endswith("/" + tail) for p in paths):
                    missing.append(f"{md.name}: {token}")
    assert seen > 20, "no paths found in the docs' code spans"
    assert not missing, f"paths in the docs that do not exist: {sorted(set(missing))}"


# ---- (d) the support matrix against the support checks ----------------------------------------------------


def _table(path: Path, section: str, first_header: str) -> tuple[list[str], list[list[str]]]:
    text = _section(path.read_text(), section)
    found = [(head, rows) for head, rows in _tables(text) if head[0].lower() == first_header]
    assert found, f"no table starting with '{first_header}' under '## {section}' of {path.name}"
    return found[0]


def _column(head: list[str], name: str) -> int:
    matches = [i for i, h in enumerate(head) if h.lower().startswith(name.lower())]
    assert matches, f"no column '{name}' in {head}"
    return matches[0]


def _row(rows: list[list[str]], name: str) -> list[str]:
    matches = [r for r in rows if r[0] == name]
    assert matches, f"no row '{name}' in the table (rows: {[r[0] for r in rows]})"
    return matches[0]


def _ints(cell: str) -> list[int]:
    return [int(s) for s in _code_spans(cell) if s.isdigit()]


@pytest.fixture
def hopper(monkeypatch):
    """The CuTe support checks as on an sm_90 GPU with the hopper extra: CPU tensors stand in for its tensors
    (their layouts taken as TMA-readable), and Triton's check as on a GPU, not its CPU interpreter. Returns the four
    CuTe checks with one calling convention."""
    from gdpa_inductor.kernels.cute import fwd_support, varlen_support
    from gdpa_inductor.lowering import dispatch

    monkeypatch.setattr(dispatch, "interpreting", lambda: False)

    bwd = pytest.importorskip("gdpa_inductor.kernels.cute.bwd_support")
    for module in (fwd_support, varlen_support):
        monkeypatch.setattr(module, "cute_dsl_available", lambda: True)
        monkeypatch.setattr(module, "on_sm90", lambda device: True)
    monkeypatch.setattr(fwd_support, "tma_layout", lambda t: True)

    def dense(check):
        def run(d, dv, dtype=torch.bfloat16, activation="silu", nk=16):
            q = torch.zeros(1, 2, 16, d, dtype=dtype)
            k, v = torch.zeros(1, 2, nk, d, dtype=dtype), torch.zeros(1, 2, nk, dv, dtype=dtype)
            return check(q, k, v, None, False, activation)
        return run

    def varlen(check):
        def run(d, dv, dtype=torch.bfloat16, activation="silu"):
            q, k, v = (torch.zeros(16, 2, n, dtype=dtype) for n in (d, d, dv))
            cu = torch.tensor([0, 6, 16], dtype=torch.int32)
            return check(q, k, v, None, False, (-1, -1), activation, (cu, cu, None, None))
        return run

    return {
        "CuTe-DSL forward": dense(fwd_support.cute_fwd_support),
        "CuTe-DSL backward": dense(bwd.cute_bwd_support),
        "CuTe-DSL varlen forward": varlen(varlen_support.cute_varlen_fwd_support),
        "CuTe-DSL varlen backward": varlen(varlen_support.cute_varlen_bwd_support),
    }


class _CudaTensor:
    """What ``triton_support`` reads of a tensor, on a CUDA device this machine may not have."""

    device = torch.device("cuda")

    def __init__(self, *shape, dtype=torch.float16):
        self.shape, self.dtype = torch.Size(shape), dtype

    def numel(self):
        return self.shape.numel()


def _triton_ok(d, dv, dtype=torch.float16) -> bool:
    from gdpa_inductor.lowering.dispatch import triton_support

    q, k, v = (_CudaTensor(1, 2, 16, n, dtype=dtype) for n in (d, d, dv))
    return triton_support(q, k, v, None)[0]


HEAD_DIM_PROBES = (8, 16, 25, 32, 48, 64, 72, 80, 96, 112, 128, 144, 160, 192, 200, 240, 256, 264, 320, 512)


def test_head_dim_table_matches_the_support_checks(hopper):
    # Each CuTe row lists the head dims its check takes, for D and Dv each; the Triton row its maximum.
    head, rows = _table(DOCS / "support-matrix.md", "Head dims", "path")
    col = _column(head, "D and Dv")
    for name, supported in hopper.items():
        listed = set(_ints(_row(rows, name)[col]))
        assert listed, f"no head dims listed for {name}"
        probes = sorted(set(HEAD_DIM_PROBES) | listed)
        wrong = [(d, dv) for d in probes for dv in probes if supported(d, dv)[0] != (d in listed and dv in listed)]
        assert not wrong, f"{name}: the support check disagrees with the table {sorted(listed)} at (D, Dv) {wrong[:8]}"
    (limit,) = _ints(_row(rows, "Triton kernels")[col])
    probes = sorted(set(HEAD_DIM_PROBES) | {1, 7, limit, limit + 1})
    wrong = [(d, dv) for d in probes for dv in (d, 64) if _triton_ok(d, dv) != (max(d, dv) <= limit)]
    assert not wrong, f"Triton: the support check disagrees with 'up to {limit}' at (D, Dv) {wrong}"


def test_wide_head_threshold_under_auto_matches(hopper):
    # "a pair with a 256 only from N keys": cute_fwd_preferred's threshold.
    from gdpa_inductor.kernels.cute.fwd_support import cute_fwd_preferred

    head, rows = _table(DOCS / "support-matrix.md", "Head dims", "path")
    (keys,) = _ints(_row(rows, "CuTe-DSL forward")[_column(head, "under")])

    def preferred(d, dv, nk):
        q, k, v = torch.zeros(1, 1, 1, d), torch.zeros(1, 1, nk, d), torch.zeros(1, 1, nk, dv)
        return cute_fwd_preferred(q, k, v)[0]

    assert not preferred(256, 64, keys - 1) and preferred(256, 64, keys) and preferred(256, 256, keys)
    assert preferred(128, 128, 1), "head dims up to 128 are preferred at any key count"


def test_dtype_table_matches_the_support_checks(hopper):
    # "yes"/"no" per path, against the CuTe checks, triton_support, the ops' accepted dtypes and the pattern's.
    from gdpa_inductor.patterns.softmax_free_attention import FUSABLE_DTYPES
    from gdpa_inductor.validation import SUPPORTED_DTYPES

    head, rows = _table(DOCS / "support-matrix.md", "Dtypes", "dtype")
    cute, triton, ref, backend = (_column(head, c) for c in ("CuTe-DSL", "Triton", "reference", "backend"))
    listed = {getattr(torch, _code_spans(r[0])[0]): r for r in rows}
    assert set(SUPPORTED_DTYPES) <= set(listed), f"dtypes without a row: {set(SUPPORTED_DTYPES) - set(listed)}"
    for dtype, row in listed.items():
        for name, supported in hopper.items():
            assert row[cute].startswith("yes") == supported(128, 128, dtype)[0], f"{dtype}: {name} vs '{row[cute]}'"
        assert row[triton].startswith("yes") == _triton_ok(128, 128, dtype), f"{dtype}: Triton vs '{row[triton]}'"
        assert row[ref].startswith("yes") == (dtype in SUPPORTED_DTYPES), f"{dtype}: reference vs '{row[ref]}'"
        assert row[backend].startswith("fused") == (dtype in FUSABLE_DTYPES), f"{dtype}: backend vs '{row[backend]}'"


def test_activation_table_columns_match_the_code(hopper):
    # The CuTe-DSL column against the CuTe checks; "mask as bias" against the pattern's exactness test.
    from gdpa_inductor.patterns.chain import _fill_zeroes_activation
    from gdpa_inductor.patterns.softmax_free_attention import FUSABLE_DTYPES

    head, rows = _table(DOCS / "support-matrix.md", "Activations", "name")
    cute, mask = _column(head, "CuTe-DSL"), _column(head, "mask as bias")
    for row in rows:
        name = _code_spans(row[0])[0]
        for path, supported in hopper.items():
            assert row[cute].startswith("yes") == supported(128, 128, activation=name)[0], f"{name}: {path}"
        exact = all(_fill_zeroes_activation(-torch.finfo(dt).max, name, 0.01, dt) for dt in FUSABLE_DTYPES)
        assert row[mask].startswith("yes") == exact, f"{name}: 'mask as bias' says '{row[mask]}'"


# ---- (e) no development history, no links out of the repository -------------------------------------------

HISTORY = [
    re.compile(r"\bsessions?\b", re.I),
    re.compile(r"\b(twenty|thirty|forty|fifty)-(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth)\b", re.I),
    re.compile(r"\bissues?\s*#?\d", re.I),
    re.compile(r"\.\./shared"),
    re.compile(r"not in the repository", re.I),
]


def _published_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    for top in ("gdpa_inductor", "examples", "benchmarks"):
        files += [p for p in sorted((ROOT / top).rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    return files


def test_no_development_history_or_outside_paths():
    # The docs and sources describe the project as it is: no work-period diary, no tracker numbers, no paths to
    # files outside the repository that a reader cannot open.
    found: dict[str, list[str]] = {}
    for path in _published_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # plots
        for n, line in enumerate(text.splitlines(), 1):
            for pattern in HISTORY:
                if m := pattern.search(line):
                    found.setdefault(str(path.relative_to(ROOT)), []).append(f"{n}: {m.group(0)!r}")
    summary = [f"{name}: {len(hits)} ({', '.join(hits[:3])}{', ...' if len(hits) > 3 else ''})"
               for name, hits in found.items()]
    assert not found, f"history words or outside paths in {len(found)} files:\n" + "\n".join(summary)


# ---- the README's headline figures and its install claim ----------------------------------------------------


def _benchmark_module(name: str):
    """``benchmarks.<name>``, imported with the repository root on the path (as the benchmarks' commands run)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(f"benchmarks.{name}")


def test_readme_numbers_are_the_raw_results():
    # The table's figures, the run's devices, versions and date: all from the JSON files it names; its command runs the
    # benchmark that wrote them.
    text = _section((ROOT / "README.md").read_text(), "Numbers")
    sources = [ROOT / s for s in re.findall(r"`([^`]+\.json)`", text)]
    assert sources and all(p.is_file() for p in sources), f"the Numbers section names missing results: {sources}"
    runs = [json.loads(p.read_text()) for p in sources]
    d = int(re.search(r"D = (\d+)", text).group(1))  # the head dim of the table, named first
    tables = _tables(text)
    (head, rows) = next((h, r) for h, r in tables if h[0].startswith("Nq"))
    (phead, prows) = next((h, r) for h, r in tables if h[0] == "device")
    checked = 0
    for run in runs:
        prov = _row(prows, run["device"])
        for key, col in (("torch", "torch"), ("triton", "Triton"), ("date", "date")):
            assert run[key] in prov[_column(phead, col)], f"{run['device']}: {key} is {run[key]!r}"
        script, name = re.search(r"benchmarks/(\w+)\.py ([\w-]+)", prov[_column(phead, "command")]).groups()
        writes = _benchmark_module(script).BENCHMARKS[name].writes
        assert writes == _benchmark_module("harness.plotting").benchmark_of(run), f"{run['device']}: {script} {name}"
        for kind, label in (("fwd", "forward"), ("fb", "forward+backward")):
            cols = [i for i, h in enumerate(head) if h.split()[0] in run["device"] and h.split(maxsplit=1)[1] == label]
            assert len(cols) == 1, f"no column '{label}' for {run['device']} in {head}"
            figures = {(r["nq"], r["nk"]): r for r in run["rows"] if r["kind"] == kind and r["d"] == d}
            shown = {tuple(int(x) for x in re.findall(r"\d+", row[0])): row[cols[0]] for row in rows}
            assert set(shown) == set(figures), f"{run['device']} {label}: shapes {sorted(shown)} vs {sorted(figures)}"
            for shape, cell in shown.items():
                rate, ratio = re.fullmatch(r"(\d+) TF/s, (\d+\.\d\d)×", cell).groups()
                want = figures[shape]
                assert (int(rate), ratio) == (round(want["gdpa"]), f"{want['gdpa_vs_best_softmax']:.2f}"), (
                    f"{run['device']} {label} {shape}: README {cell}, results {want['gdpa']:.1f} TF/s, "
                    f"{want['gdpa_vs_best_softmax']:.3f}×")
                checked += 1
    assert checked >= 2 * len(runs)


def test_torch_logs_settings_in_the_docs_work():
    # TORCH_LOGS is parsed when torch is imported, and an unknown name stops the program: every setting the docs
    # give must be accepted, and one naming this package must show the dispatch decisions.
    settings = sorted({s for md in _docs() for s in re.findall(r"TORCH_LOGS=([\w+,.-]+)", md.read_text())})
    assert any("gdpa" in s for s in settings), "the docs give no TORCH_LOGS setting for gdpa_inductor"
    code = "import torch, gdpa_inductor; q = torch.randn(1, 1, 4, 8); gdpa_inductor.gdpa(q, q, q)"
    for setting in settings:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCH_LOGS": setting}
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"TORCH_LOGS={setting}: {done.stderr[-2000:]}"
        if "gdpa" in setting:
            assert "gdpa forward:" in done.stderr, f"TORCH_LOGS={setting} shows no dispatch decision"
