"""Dynamic shapes and compile caches with the GDPA pass.

- With ``dynamic=True`` the pass adds no guards of its own: over the same sequence of batch and sequence
  lengths, backend="gdpa" compiles exactly as many graphs as the pass-free aot_eager backend.
- The FX graph and AOT autograd caches key on the graph after the rewrite: with the caches on, a graph
  compiled while the pass is disabled must not be served the fused artifact, and the reverse.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config
from torch._inductor.utils import fresh_cache
from zoo import ZOO_BY_NAME, build

import gdpa_inductor.backend
import gdpa_inductor.patterns.rewrite
from gdpa_inductor.lowering import ops


def _graphs_over_shapes(name: str, backend) -> tuple[int, int]:
    """(graphs compiled, GDPA rewrites) over four batch/sequence sizes with dynamic=True."""
    model, inputs = build(ZOO_BY_NAME[name])
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend=backend, dynamic=True)
    for scale_b, scale_n in ((1, 1), (2, 1), (1, 0.5), (3, 0.75)):
        args = tuple(_resize(t, scale_b, scale_n) for t in inputs)
        with torch.no_grad():
            torch.testing.assert_close(compiled(*args), model(*args), rtol=1e-5, atol=1e-5)
    return counters["stats"]["unique_graphs"], counters["gdpa"]["rewrites"]


@pytest.mark.parametrize("name", ["hstu_silu_relbias_causal", "qkv_unbind_gelu", "pma_seed_expand"])
def test_dynamic_shapes_no_extra_recompiles(name):
    gdpa_graphs, rewrites = _graphs_over_shapes(
        name, functools.partial(gdpa_inductor.backend.gdpa_backend, inner="aot_eager"))
    plain_graphs, _ = _graphs_over_shapes(name, "aot_eager")
    assert gdpa_graphs == plain_graphs, f"the pass added recompiles: {gdpa_graphs} graphs vs {plain_graphs}"
    assert gdpa_graphs <= 2  # the first call (static) and one dynamic graph at most
    assert rewrites == gdpa_graphs * ZOO_BY_NAME[name].rewrites


def _resize(t: torch.Tensor, scale_b: float, scale_n: float) -> torch.Tensor:
    """Repeat along the batch dim and cut the sequence dim (dim -2 of 4-D q/k/v, dim 1 of 3-D inputs)."""
    t = t.repeat(scale_b, *([1] * (t.dim() - 1)))
    seq_dim = -2 if t.dim() == 4 else 1
    n = max(2, int(t.shape[seq_dim] * scale_n))
    return t.narrow(seq_dim, 0, n).contiguous()


def test_caches_key_on_the_rewritten_graph(monkeypatch):
    """Same model, caches on: compile fused, then with the pass off, then fused again; each run's op calls
    follow the pass, i.e. no compile is served an artifact made for the other graph."""
    model, inputs = build(ZOO_BY_NAME["qkv_unbind_gelu"])
    calls = {"n": 0}
    real = ops.gdpa_reference

    def counting(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(ops, "gdpa_reference", counting)
    real_rewrite = gdpa_inductor.patterns.rewrite.rewrite_gdpa

    def run(pass_on: bool) -> int:
        torch._dynamo.reset()
        calls["n"] = 0
        monkeypatch.setattr(gdpa_inductor.patterns.rewrite, "rewrite_gdpa",
                            real_rewrite if pass_on else (lambda gm, example_inputs: []))
        with torch.no_grad():
            got = torch.compile(model, backend="gdpa")(*inputs)
            torch.testing.assert_close(got, model(*inputs), rtol=1e-5, atol=1e-5)
        return calls["n"]

    with fresh_cache(), inductor_config.patch(fx_graph_cache=True):
        assert run(True) == 1
        assert run(False) == 0
        assert run(True) == 1
