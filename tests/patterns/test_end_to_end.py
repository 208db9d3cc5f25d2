"""A few zoo models end to end through the real ``backend="gdpa"`` (the GDPA pass, then Inductor's
compile_fx on CPU), training and inference, against eager; and the backend's promise that a failing pass
never breaks the user's compile."""

from __future__ import annotations

import pytest
import torch
from harness import assert_fp32_close, reset, rewrites, run
from zoo import ZOO_BY_NAME, build

import gdpa_inductor.backend
import gdpa_inductor.patterns.rewrite

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

E2E = ["hstu_silu_relbias_causal", "gpt2_causal_buffer_before_gelu", "pma_seed_expand", "pffn_bmm"]


@pytest.mark.parametrize("mode", ["train", "infer"])
@pytest.mark.parametrize("name", E2E)
def test_inductor_end_to_end(name, mode):
    entry = ZOO_BY_NAME[name]
    model, inputs = build(entry)
    train = mode == "train"
    eager = run(model, inputs, train=train)
    reset()
    got = run(model, inputs, train=train, compile_with="gdpa")
    assert rewrites() == entry.rewrites
    assert_fp32_close(got, eager, f"{name} [{mode}, inductor]")


def _boom(*args, **kwargs):
    raise RuntimeError("injected failure in the GDPA rewrite")


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_failing_replacement_leaves_the_graph_unfused(monkeypatch, mode):
    monkeypatch.setattr(gdpa_inductor.patterns.rewrite, "_replace", _boom)
    model, inputs = build(ZOO_BY_NAME["gpt2_causal_buffer_before_gelu"])
    train = mode == "train"
    eager = run(model, inputs, train=train)
    reset()
    got = run(model, inputs, train=train, compile_with="gdpa")
    assert rewrites() == 0
    assert_fp32_close(got, eager, "unfused after a failed rewrite")


def test_failing_replacement_is_reported():
    model, inputs = build(ZOO_BY_NAME["qkv_unbind_gelu"])
    reports = []

    def backend(gm, example_inputs):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(gdpa_inductor.patterns.rewrite, "_replace", _boom)
            reports.extend(gdpa_inductor.patterns.rewrite.rewrite_gdpa(gm, example_inputs))
        code = gm.code
        assert "gdpa" not in code and "gelu" in code, "the graph must be left exactly as it was"
        return gm.forward

    reset()
    with torch.no_grad():
        torch.compile(model, backend=backend)(*inputs)
    assert not any(r.matched for r in reports)
    assert any(not r.matched and "rewrite failed" in r.reason and "injected" in r.reason for r in reports), reports


def test_failing_pass_never_breaks_the_compile(monkeypatch):
    monkeypatch.setattr(gdpa_inductor.patterns.rewrite, "rewrite_gdpa", _boom)
    model, inputs = build(ZOO_BY_NAME["hstu_silu_relbias_causal"])
    eager = run(model, inputs, train=True)
    reset()
    got = run(model, inputs, train=True, compile_with="gdpa")
    assert rewrites() == 0
    assert_fp32_close(got, eager, "compiled after the pass raised")


@pytest.mark.parametrize("name", ["three_blocks", "stacked_chains_three"])
def test_rewrites_are_inductor_pattern_matcher_replacements(name):
    """The pass is an Inductor PatternMatcherPass: each rewrite is one pattern-matcher replacement (and a dry
    run, which only reports, makes none)."""
    from torch._dynamo.utils import counters

    entry = ZOO_BY_NAME[name]
    model, inputs = build(entry)
    seen = {}

    def backend(gm, example_inputs):
        counters.clear()
        dry = gdpa_inductor.patterns.rewrite.rewrite_gdpa(gm, example_inputs, dry_run=True)
        seen["dry"] = (sum(r.matched for r in dry), counters["inductor"]["pattern_matcher_count"])
        done = gdpa_inductor.patterns.rewrite.rewrite_gdpa(gm, example_inputs)
        seen["real"] = (sum(r.matched for r in done), counters["inductor"]["pattern_matcher_count"])
        return gm.forward

    reset()
    with torch.no_grad():
        torch.compile(model, backend=backend)(*inputs)
    assert seen == {"dry": (entry.rewrites, 0), "real": (entry.rewrites, entry.rewrites)}


def test_caller_mask_values_are_not_baked_in():
    """A mask argument that happens to be lower-triangular on the first call: the next call, with another mask
    and no recompile, must still be computed with that other mask."""
    model, (q, k, v, tril) = build(ZOO_BY_NAME["tril_mask_argument"])
    reset()
    compiled = torch.compile(model, backend="gdpa")
    with torch.no_grad():
        torch.testing.assert_close(compiled(q, k, v, tril), model(q, k, v, tril))
        other = (torch.rand(16, 16, generator=torch.Generator().manual_seed(1)) < 0.5).float()
        torch.testing.assert_close(compiled(q, k, v, other), model(q, k, v, other))


def test_the_pass_keeps_no_input_value_in_the_graph():
    """The real values a proof reads (a causal buffer here) are the pass's for its run only: the graph handed to
    Inductor holds none of them."""
    from gdpa_inductor.patterns import fx_nodes as fxn

    model, inputs = build(ZOO_BY_NAME["gpt2_causal_buffer_before_gelu"])
    seen = []

    def backend(gm, example_inputs):
        seen.append(sum(r.matched for r in gdpa_inductor.patterns.rewrite.rewrite_gdpa(gm, example_inputs)))
        seen.append([n.name for n in gm.graph.nodes if fxn.REAL_VALUE in n.meta])
        return gm.forward

    reset()
    with torch.no_grad():
        torch.compile(model, backend=backend)(*inputs)
    assert seen == [1, []]


def test_the_pass_keeps_no_row_count_in_the_graph():
    """The jagged rows a padded batch's offsets describe size the pass's drawn offsets during its run only."""
    from gdpa_inductor.patterns import fx_nodes as fxn

    model, inputs = build(ZOO_BY_NAME["hstu_reference_padded_gather"])
    seen = []

    def backend(gm, example_inputs):
        from gdpa_inductor.patterns import padded_operands

        recorded = []
        original = padded_operands._jagged_rows

        def spy(node, b, source, offsets):
            recorded.append(source.meta.get(fxn.REAL_ROWS))
            return original(node, b, source, offsets)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(padded_operands, "_jagged_rows", spy)
            seen.append(sum(r.matched for r in gdpa_inductor.patterns.rewrite.rewrite_gdpa(gm, example_inputs)))
        seen.append(recorded[:1])
        seen.append([n.name for n in gm.graph.nodes if fxn.REAL_ROWS in n.meta])
        return gm.forward

    reset()
    with torch.no_grad():
        torch.compile(model, backend=backend)(*inputs)
    offsets = inputs[3]
    assert seen == [1, [(int(offsets[-1]), int(offsets.sum()))], []]
