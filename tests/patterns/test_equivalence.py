"""The proof by evaluation at a model's real size: a mask too large to compute whole (a [B, 1, N, N] padding mask of
a large batch) is computed at the sampled coordinates alone when it is elementwise in smaller values, or drawn there
when it is a graph input, so the block is still proven, and still refused where the recipe would differ. The size
limit is lowered so that a small model stands in for a large one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from harness import AOT_EAGER_GDPA, reset, rewrites

import gdpa_inductor
from gdpa_inductor.patterns import equivalence

B, H, N, D = 40, 2, 24, 8


@pytest.fixture
def small_value_limit(monkeypatch):
    """Values over 16 KiB count as too large to compute whole: the [B, 1, N, N] masks here (23,040 bytes), not the
    [B, N] ones they are built from nor their values at the proof's sampled coordinates (the first and last sample)."""
    monkeypatch.setattr(equivalence, "MAX_VALUE_BYTES", 1 << 14)


def _pair_valid(lengths):
    valid = torch.arange(N)[None, :] < lengths[:, None]
    return valid[:, None, :, None] & valid[:, None, None, :]


def where_after_silu(q, k, v, lengths):
    p = F.silu(q @ k.transpose(-2, -1)) / N
    return torch.where(_pair_valid(lengths), p, 0.0) @ v


def expanded_fill_before_gelu(q, k, v, lengths):
    s = q @ k.transpose(-2, -1) * D**-0.5
    keep = _pair_valid(lengths).expand(B, H, N, N)
    return F.gelu(s.masked_fill(~keep, -torch.finfo(s.dtype).max)) @ v


def cast_mask_after_sigmoid(q, k, v, lengths):
    return (torch.sigmoid(q @ k.transpose(-2, -1)) * _pair_valid(lengths).float()) @ v


def mask_input_before_gelu(q, k, v, keep):
    """A dense boolean mask passed in, as large as the scores but for the heads."""
    s = q @ k.transpose(-2, -1) * D**-0.5
    return F.gelu(s.masked_fill(~keep, -torch.finfo(s.dtype).max)) @ v


def fill_zero_then_bias(q, k, v, lengths, bias):
    """Masked scores set to 0 before a bias: relu(0 + bias) is not 0 there, so this is not a padding mask."""
    s = (q @ k.transpose(-2, -1)).masked_fill(~_pair_valid(lengths), 0.0)
    return F.relu(s + bias) @ v


def _inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, D, generator=gen) for _ in range(3))
    return q, k, v, torch.cat([torch.tensor([N, 7, 1]), torch.randint(1, N + 1, (B - 3,), generator=gen)])


def _compiled_and_eager(fn, *inputs):
    reset()
    leaves = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    out = torch.compile(fn, backend=AOT_EAGER_GDPA)(*leaves)
    out.square().sum().backward()
    out = out.detach()
    ref_leaves = [x.double().requires_grad_() if x.is_floating_point() else x for x in inputs]
    ref = fn(*ref_leaves)
    ref.square().sum().backward()
    ref = ref.detach()
    pairs = [(out, ref)] + [(a.grad, b.grad) for a, b in zip(leaves, ref_leaves) if a.is_floating_point()]
    return rewrites(), max(float((a.double() - b).abs().max() / b.abs().max()) for a, b in pairs if b is not None)


@pytest.mark.parametrize("fn", [where_after_silu, expanded_fill_before_gelu, cast_mask_after_sigmoid],
                         ids=lambda f: f.__name__)
def test_large_length_masks_are_proven_at_sampled_coordinates(fn, small_value_limit):
    count, err = _compiled_and_eager(fn, *_inputs())
    assert count == 1, gdpa_inductor.explain(fn, *_inputs())
    assert err < 1e-5


def test_large_mask_input_is_drawn_at_sampled_coordinates(small_value_limit):
    q, k, v, lengths = _inputs()
    keep = _pair_valid(lengths) | (torch.rand(B, 1, N, N, generator=torch.Generator().manual_seed(4)) < 0.2)
    count, err = _compiled_and_eager(mask_input_before_gelu, q, k, v, keep)
    assert count == 1, gdpa_inductor.explain(mask_input_before_gelu, q, k, v, keep)
    assert err < 1e-5


def test_large_mask_of_a_wrong_recipe_is_refused_for_its_values(small_value_limit):
    inputs = _inputs() + (torch.randn(N, generator=torch.Generator().manual_seed(5)),)
    report = gdpa_inductor.explain(fill_zero_then_bias, *inputs)
    [block] = [c for c in report.candidates if c.scores]
    assert not block.matched and "the fused op would differ from the graph" in block.reason, block.reason
    count, err = _compiled_and_eager(fill_zero_then_bias, *inputs)
    assert count == 0 and err < 1e-5
