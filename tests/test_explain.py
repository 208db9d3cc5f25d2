"""``gdpa_inductor.explain``: what backend="gdpa" would fuse, and why not, without compiling anything."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
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


class ColumnGatedEinsum(nn.Module):
    """A refused block written with einsums: one factor per key after the activation."""

    def forward(self, q, k, v, gate):
        p = F.silu(torch.einsum("...id,...jd->...ij", q, k)) * gate[:, None, None, :]
        return torch.einsum("...ij,...jd->...id", p, v)


def test_explain_gives_a_refused_blocks_reason_once_and_first(gen):
    q, k, v = (torch.randn(2, 2, 8, 8, generator=gen) for _ in range(3))
    report = gdpa_inductor.explain(ColumnGatedEinsum(), q, k, v, torch.rand(2, 8, generator=gen))
    lines = str(report).splitlines()
    assert len(report.rejected) == 1 and report.rejected[0].scores is not None, str(report)
    assert "one factor per query row" in lines[1], str(report)
    assert len(lines) == 2, str(report)
