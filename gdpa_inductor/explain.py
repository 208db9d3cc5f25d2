"""``gdpa_inductor.explain(model_or_fn, *args, **kwargs)``: what ``backend="gdpa"`` would fuse, and why not.

Runs the model once under Dynamo with an analysis-only backend (nothing is compiled or rewritten; the
model runs eagerly), applying the GDPA pass in dry-run mode to every graph Dynamo produces, and returns
a printable report of every candidate matmul: fused (kind, activation, shapes, scales, mask handling) or
rejected (the reason).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .patterns.rewrite import CandidateReport, rewrite_gdpa
from .patterns.softmax_free_attention import NO_PAIR


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
        lone = [c for c in self.rejected if c.reason == NO_PAIR]
        lines = [f"gdpa explain: {self.graphs} graph(s), {len(self.fused)} GDPA subgraph(s) fused, "
                 f"{len(self.rejected)} matmul(s) left to Inductor"]
        lines += [str(c) for c in self.candidates if c not in lone]
        if lone:
            lines.append(f"  ({len(lone)} other matmul(s) are not the second matmul of an act(Q Kᵀ) V chain: "
                         + ", ".join(c.node for c in lone) + ")")
        return "\n".join(lines)


def explain(model_or_fn, *args, **kwargs) -> ExplainReport:
    report = ExplainReport()

    def analyze(gm: torch.fx.GraphModule, example_inputs):
        report.graphs += 1
        report.candidates.extend(rewrite_gdpa(gm, example_inputs, dry_run=True, graph_name=f"graph{report.graphs}"))
        return gm.forward

    torch._dynamo.reset()
    try:
        torch.compile(model_or_fn, backend=analyze)(*args, **kwargs)
    finally:
        torch._dynamo.reset()
    return report
