"""``gdpa_inductor.explain``: what backend="gdpa" would fuse, and why not, without compiling anything."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

import gdpa_inductor


class GeluAndSoftmax(nn.Module):
    """One fusable GDPA block (gelu) and one softmax attention block (its own queries) in one graph."""

    def forward(self, q, k, v, q2):
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        o = F.gelu(s) @ v
        s2 = q2 @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        return o + torch.softmax(s2, dim=-1) @ v


def test_explain_reports_fused_and_rejected(gen):
    q, k, v, q2 = (torch.randn(2, 2, 12, 16, generator=gen) for _ in range(4))
    counters.clear()
    model = GeluAndSoftmax()
    report = gdpa_inductor.explain(model, q, k, v, q2)
    text = str(report)
    assert report.graphs == 1
    assert len(report.fused) == 1, text
    fused = report.fused[0]
    assert fused.details["activation"] == "gelu"
    assert fused.details["scale"] == 0.25
    # the softmax block is rejected once, at its P @ V, with the reason; its Q Kᵀ is reported with it
    assert len(report.rejected) == 1, text
    assert report.rejected[0].scores is not None, text
    assert "2 matmul(s) left to Inductor" in text, text
    assert "FUSED" in text and "activation=gelu" in text, text
    assert "softmax" in text, text
    assert any("softmax" in r.reason for r in report.rejected), text
    # analysis only: nothing was rewritten or counted, and the model is unchanged
    assert counters["gdpa"]["rewrites"] == 0
    torch.testing.assert_close(model(q, k, v, q2), GeluAndSoftmax()(q, k, v, q2))


class SoftmaxOnly(nn.Module):
    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v


def test_explain_softmax_only_fuses_nothing(gen):
    q, k, v = (torch.randn(2, 2, 8, 8, generator=gen) for _ in range(3))
    report = gdpa_inductor.explain(SoftmaxOnly(), q, k, v)
    assert report.fused == [] and len(report.rejected) == 1, str(report)
    assert "0 GDPA subgraph(s) fused" in str(report) and "softmax" in str(report)
    assert "2 matmul(s) left to Inductor" in str(report)


class EntryGatedEinsum(nn.Module):
    """A refused block written with einsums: a float gate per query and key after the activation."""

    def forward(self, q, k, v, gate):
        p = F.silu(torch.einsum("...id,...jd->...ij", q, k)) * gate[:, None]
        return torch.einsum("...ij,...jd->...id", p, v)


def test_explain_gives_a_refused_blocks_reason_once_and_first(gen):
    q, k, v = (torch.randn(2, 2, 8, 8, generator=gen) for _ in range(3))
    report = gdpa_inductor.explain(EntryGatedEinsum(), q, k, v, torch.rand(2, 8, 8, generator=gen))
    lines = str(report).splitlines()
    assert len(report.rejected) == 1 and report.rejected[0].scores is not None, str(report)
    assert "neither a scalar, a boolean mask nor one factor per query row or per key" in lines[1], str(report)
    assert len(lines) == 2, str(report)


# ---- what the user compiled before is left alone ------------------------------------------------------------


class BreaksInForward(nn.Module):
    """Two graphs, the second in Dynamo's resume function of this forward."""

    def forward(self, q, k, v):
        s = F.gelu(q @ k.transpose(-2, -1) * 0.25)
        torch._dynamo.graph_break()
        return s @ v


def gelu_block(q, k, v):
    return F.gelu(q @ k.transpose(-2, -1) * 0.25) @ v


def _break_then_relu(x):
    torch._dynamo.graph_break()
    return x.relu()


class CallsABreakingHelper(nn.Module):
    """Past the break in the helper, Dynamo compiles the helper's own frames: code the user's compile shares."""

    def forward(self, q, k, v):
        return _break_then_relu(gelu_block(q, k, v)) + 1


def _cache_entries() -> dict[int, tuple]:
    """Every code object Dynamo has compiled, by id, with its code and its cache entries' compile ids."""
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo import convert_frame

    codes = [code for ref in convert_frame.input_codes.seen if (code := ref()) is not None]
    return {id(c): (c, [(e.compile_id, e.code is not None) for e in _debug_get_cache_entry_list(c)]) for c in codes}


def _live(entries: dict[int, tuple]) -> dict[int, list]:
    return {key: [compile_id for compile_id, live in ids if live] for key, (_, ids) in entries.items() if ids}


@pytest.mark.parametrize("make", [GeluAndSoftmax, BreaksInForward, lambda: gelu_block, CallsABreakingHelper],
                         ids=["module", "graph-break", "function", "helper-graph-break"])
def test_explain_leaves_what_the_user_compiled_alone(gen, make):
    """The user's compiled graphs survive explain (no recompile at the next call) and explain leaves no cache entry
    that can match: all its own are gone, or (on the helper's code, which the user's compile has entries on too)
    invalidated."""
    model = make()
    inputs = [torch.randn(2, 2, 8, 16, generator=gen) for _ in range(4 if make is GeluAndSoftmax else 3)]
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter)
    expected = compiled(*inputs)
    frames, before = counter.frame_count, _cache_entries()
    assert frames >= 1 and _live(before)

    report = gdpa_inductor.explain(model, *inputs)
    assert report.graphs >= 1 and report.candidates, str(report)
    assert _live(_cache_entries()) == _live(before), "explain left a live cache entry or dropped one of the user's"

    torch.testing.assert_close(compiled(*inputs), expected)
    assert counter.frame_count == frames, "the user's compiled model recompiled after explain"
    if make is not CallsABreakingHelper:
        assert {k: ids for k, (_, ids) in _cache_entries().items() if ids} == {
            k: ids for k, (_, ids) in before.items() if ids}, "explain left cache entries behind"


def test_explain_twice_analyzes_twice(gen):
    """Each explain compiles afresh: a second one is not served from the first one's cache entries."""
    q, k, v = (torch.randn(2, 2, 8, 16, generator=gen) for _ in range(3))
    first, second = gdpa_inductor.explain(gelu_block, q, k, v), gdpa_inductor.explain(gelu_block, q, k, v)
    assert first.graphs == second.graphs == 1 and len(first.fused) == len(second.fused) == 1


@pytest.mark.parametrize("fails", ["before", "after"])
def test_explain_reports_even_where_the_cache_entries_cannot_be_read(gen, monkeypatch, caplog, fails):
    """Dynamo's cache entries are read through torch internals: where those fail, explain still reports, and says in
    the log that its own entries stayed."""
    from gdpa_inductor import isolated_compile

    real, calls = isolated_compile._entries_by_code, []

    def entries():
        calls.append(1)
        if (fails == "before") == (len(calls) == 1):
            raise AttributeError("no such Dynamo internal")
        return real()

    monkeypatch.setattr(isolated_compile, "_entries_by_code", entries)
    q, k, v = (torch.randn(2, 2, 8, 16, generator=gen) for _ in range(3))
    with caplog.at_level("INFO", logger="gdpa_inductor"):
        report = gdpa_inductor.explain(gelu_block, q, k, v)
    assert report.graphs == 1 and len(report.fused) == 1
    assert "could not drop the extra compile's Dynamo cache entries" in caplog.text
