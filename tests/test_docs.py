"""The user docs (docs/*.md, README.md) against the code they describe.

Docs drift silently when reasons are reworded, activations added or files moved; these checks read the
markdown and the package sources (no GPU; one small CPU compile, for the README's example) so that such a
change fails here instead.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

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
    import torch

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
