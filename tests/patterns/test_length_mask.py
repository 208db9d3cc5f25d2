"""Which padding masks become per-sample lengths (the varlen op, padding skipped) and which stay a dense
bias: the verdict in ``explain``'s report, for masks written in several ways."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gdpa_inductor


def _attention(mask_fn, act=F.gelu, causal=False):
    def fn(q, k, v, lengths):
        n = k.shape[-2]
        s = q @ k.transpose(-2, -1) * 0.25
        s = s.masked_fill(~mask_fn(n, lengths, q.device), -torch.finfo(s.dtype).max)
        p = act(s)
        if causal:
            p = p * torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        return p @ v
    return fn


def _valid(n, lengths, device):
    return torch.arange(n, device=device)[None, :] < lengths[:, None]


MASKS = {
    "key_getitem": (lambda n, L, d: _valid(n, L, d)[:, None, None, :], "key columns skipped"),
    "key_unsqueeze_gt": (lambda n, L, d: (L.unsqueeze(-1) > torch.arange(n, device=d)).unsqueeze(1).unsqueeze(1),
                         "key columns skipped"),
    "query_and_key": (lambda n, L, d: _valid(n, L, d)[:, None, :, None] & _valid(n, L, d)[:, None, None, :],
                      "query rows and key columns skipped"),
    "key_expand": (lambda n, L, d: (torch.arange(n, device=d).expand(L.shape[0], n) < L[:, None])[:, None, None],
                   "key columns skipped"),
    # not length masks of the op's form: dense bias
    "less_equal": (lambda n, L, d: (torch.arange(n, device=d)[None, :] <= L[:, None])[:, None, None, :], "dense"),
    "right_aligned": (lambda n, L, d: (torch.arange(n, device=d)[None, :] >= n - L[:, None])[:, None, None, :],
                      "dense"),
    "lengths_per_head": (lambda n, L, d: (torch.arange(n, device=d)[None, :] < L[:, None])[None, :, None, :],
                         "dense"),
    "two_lengths": (lambda n, L, d: _valid(n, L, d)[:, None, :, None] & _valid(n, L.flip(0), d)[:, None, None, :],
                    "dense"),
}


def _inputs():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 12, 8, generator=g) for _ in range(3))
    return q, k, v, torch.tensor([5, 12])  # two samples, two heads: per-head lengths broadcast too


@pytest.mark.parametrize("name", MASKS)
def test_length_mask_verdict(name):
    mask_fn, expected = MASKS[name]
    fn = _attention(mask_fn)
    report = gdpa_inductor.explain(fn, *_inputs())
    assert len(report.fused) == 1, str(report)
    note = report.fused[0].details["mask"]
    if expected == "dense":
        assert note == "dense boolean mask (as a bias)", note
    else:
        assert "padding length mask" in note and expected in note, note
    eager = fn(*_inputs())
    torch._dynamo.reset()
    got = torch.compile(fn, backend="gdpa")(*_inputs())
    torch._dynamo.reset()
    assert torch.allclose(got, eager, rtol=1e-5, atol=1e-6), (got - eager).abs().max()


def test_causal_with_key_mask_only_stays_dense():
    """Causal with only the keys masked would need the padded square's alignment: not the varlen op's."""
    fn = _attention(MASKS["key_getitem"][0], act=F.silu, causal=True)
    report = gdpa_inductor.explain(fn, *_inputs())
    assert report.fused[0].details["mask"].startswith("causal"), str(report)
    assert "padding length mask" not in report.fused[0].details["mask"]


@pytest.mark.parametrize("before_activation", [True, False], ids=["fill_before", "where_after"])
def test_length_mask_with_gelu_tanh(before_activation):
    """gelu_tanh's derivative overflows at -finfo.max, so a padding mask cannot be a -max bias for it. A
    length mask is skipped instead, whether applied after the activation or as a -max fill before it
    (gelu_tanh(-max) is exactly 0, and masked_fill's backward zeroes the NaN derivative there): outputs and
    gradients equal eager's."""
    def fn(q, k, v, lengths):
        n = k.shape[-2]
        valid = torch.arange(n, device=q.device)[None, :] < lengths[:, None]
        mask = valid[:, None, :, None] & valid[:, None, None, :]
        s = q @ k.transpose(-2, -1) * 0.25
        if before_activation:
            return F.gelu(s.masked_fill(~mask, -torch.finfo(s.dtype).max), approximate="tanh") @ v
        return torch.where(mask, F.gelu(s, approximate="tanh"), 0.0) @ v

    report = gdpa_inductor.explain(fn, *_inputs())
    assert len(report.fused) == 1 and "padding length mask" in report.fused[0].details["mask"], str(report)

    def run(f):
        q, k, v, lengths = _inputs()
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        out = f(q, k, v, lengths)
        out.backward(torch.cos(out.detach()))
        return [out.detach(), q.grad, k.grad, v.grad]

    eager = run(fn)
    torch._dynamo.reset()
    got = run(torch.compile(fn, backend="gdpa"))
    torch._dynamo.reset()
    for g, e in zip(got, eager):
        assert torch.isfinite(g).all() and torch.allclose(g, e, rtol=1e-5, atol=1e-6), (g - e).abs().max()
