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
    # the softmax block's P @ V is rejected with the reason; its Q Kᵀ has no matmul before it
    assert len(report.rejected) == 2, text
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
    assert report.fused == [] and len(report.rejected) == 2, str(report)
    assert "0 GDPA subgraph(s) fused" in str(report) and "softmax" in str(report)
