"""``gdpa_inductor.explain(model_or_fn, *args, **kwargs)``: what ``backend="gdpa"`` would fuse, and why not.

Runs the model once under Dynamo with an analysis-only backend (nothing is compiled or rewritten; the
model runs eagerly), applying the GDPA pass in dry-run mode to every graph Dynamo produces, and returns
a printable report of every candidate matmul: fused (kind, activation, shapes, scales, mask handling) or
rejected (the reason).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .patterns.rewrite import CandidateReport


@dataclass
class ExplainReport:
    graphs: int = 0
    candidates: list[CandidateReport] = field(default_factory=list)

    @property
    def fused(self) -> list[CandidateReport]:
        return [c for c in self.candidates if c.matched]

    @property
    def rejected(self) -> list[CandidateReport]:
        return [c for c in self.candidates if not c.matched]

    def __str__(self) -> str:
        from .patterns.softmax_free_attention import NO_PAIR

        lone = [c for c in self.rejected if c.reason == NO_PAIR]
        left = len(self.rejected) + len([c for c in self.rejected if c.scores])
        lines = [f"gdpa explain: {self.graphs} graph(s), {len(self.fused)} GDPA subgraph(s) fused, "
                 f"{left} matmul(s) left to Inductor"]
        lines += [str(c) for c in self.candidates if c not in lone]
        if lone:
            lines.append(f"  ({len(lone)} other matmul(s) are not the second matmul of an act(Q Kᵀ) V chain: "
                         + ", ".join(c.node for c in lone) + ")")
        return "\n".join(lines)


def explain(model_or_fn, *args, **kwargs) -> ExplainReport:
    """Reports what ``torch.compile(model_or_fn, backend="gdpa")`` would fuse on these inputs, and why the
    other matmuls are not fused, without compiling anything.

    Runs ``model_or_fn(*args, **kwargs)`` once under Dynamo, on a copy of its code: every graph Dynamo
    captures goes through the GDPA pass in dry-run mode, and the model then runs eagerly, so parameters,
    buffers and RNG state change as in one eager call (gradients are not computed). Graph breaks give several
    graphs, each analyzed. What the user compiled before keeps its graphs, and the run's own Dynamo cache
    entries are removed after it (``isolated_compile``).

    Args:
        model_or_fn: an ``nn.Module`` or a function, as ``torch.compile`` takes it.
        *args, **kwargs: the inputs of one call; shapes, dtypes and devices matter (a GPU-only case is
            judged on the inputs given).

    Returns:
        An ``ExplainReport``: ``graphs`` (how many graphs Dynamo produced), ``candidates`` (one
        ``CandidateReport`` per matmul considered), ``fused`` and ``rejected`` (the candidates split by
        outcome, a rejected one with its ``reason``); ``str(report)`` is the printable summary.

    Example::

        >>> import torch, torch.nn.functional as F
        >>> import gdpa_inductor
        >>> def block(q, k, v):
        ...     return F.gelu(q @ k.transpose(-2, -1) * 0.125) @ v
        >>> q, k, v = (torch.randn(2, 4, 64, 64) for _ in range(3))
        >>> report = gdpa_inductor.explain(block, q, k, v)
        >>> len(report.fused)
        1
        >>> print(report)  # doctest: +SKIP
        gdpa explain: 1 graph(s), 1 GDPA subgraph(s) fused, 0 matmul(s) left to Inductor
        ...
    """
    from .isolated_compile import dropping_new_cache_entries, forward_on_fresh_code, on_fresh_code
    from .patterns.rewrite import rewrite_gdpa

    report = ExplainReport()

    def analyze(gm: torch.fx.GraphModule, example_inputs):
        report.graphs += 1
        report.candidates.extend(rewrite_gdpa(gm, example_inputs, dry_run=True, graph_name=f"graph{report.graphs}"))
        return gm.forward

    # on a copy of the code, so that what the user compiled before keeps its graphs and gains none
    is_module = isinstance(model_or_fn, torch.nn.Module)
    target = model_or_fn if is_module else on_fresh_code(model_or_fn)
    fresh_forward = forward_on_fresh_code(model_or_fn) if is_module else contextlib.nullcontext()
    with dropping_new_cache_entries(), fresh_forward:
        torch.compile(target, backend=analyze)(*args, **kwargs)
    return report
