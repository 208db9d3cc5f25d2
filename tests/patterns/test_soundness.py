"""Never a wrong rewrite: blocks whose spelling looks like GDPA but whose values differ are left to Inductor, and a
causal mask read from a module buffer follows the buffer after the compile. Each model is compiled (AOT autograd,
no Inductor) and compared in fp32 with its own eager run in float64, NaN positions included."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from harness import AOT_EAGER_GDPA, reset, rewrites

from gdpa_inductor.lowering.buffer_mask_ops import is_causal_keep_mask

B, H, N, D = 2, 2, 16, 8


def _qkv(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, N, D, generator=gen) for _ in range(3))


def compiled_vs_eager(model: nn.Module, *inputs, train: bool = True, before=None) -> tuple[int, float]:
    """(rewrites, worst relative error of the outputs and every input gradient) against eager in float64; the
    NaN positions must agree. ``before(model)`` runs after the compile (one call) and before the comparison."""
    reset()
    compiled = torch.compile(model, backend=AOT_EAGER_GDPA)
    if before is not None:
        compiled(*inputs)
        before(model)
    got_inputs = [x.clone().requires_grad_(train and x.is_floating_point()) for x in inputs]
    out = compiled(*got_inputs)
    ref_model = copy.deepcopy(model).double()
    ref_inputs = [x.double().requires_grad_(train) if x.is_floating_point() else x for x in inputs]
    ref = ref_model(*ref_inputs)
    assert torch.equal(out.isnan(), ref.isnan()), "NaN where eager has none (or the reverse)"
    pairs = [(out, ref)]
    if train:
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
        out.backward(torch.nan_to_num(dout))
        ref.backward(torch.nan_to_num(dout.double()))
        pairs += [(a.grad, b.grad) for a, b in zip(got_inputs, ref_inputs) if a.is_floating_point()]
    worst = 0.0
    for a, b in pairs:
        finite = ~b.isnan()
        err = (a.double()[finite] - b[finite]).abs().max() / b[finite].abs().max().clamp_min(1e-30)
        worst = max(worst, float(err))
    return rewrites(), worst


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def arange_start_one(q, k, v):
    n = q.shape[-2]
    i = torch.arange(start=1, end=n + 1)
    j = torch.arange(n)
    s = (q @ k.transpose(-2, -1)).masked_fill(~(i[:, None] >= j[None, :]), 0.0)
    return F.silu(s) @ v


def sliced_arange(q, k, v):
    n = q.shape[-2]
    i = torch.arange(n + 1)[1:]
    j = torch.arange(n)
    s = (q @ k.transpose(-2, -1)).masked_fill(~(i[:, None] >= j[None, :]), 0.0)
    return F.relu(s) @ v


def two_masks_with_finfo_max(q, k, v, m1, m2):
    s = q @ k.transpose(-2, -1)
    big = -torch.finfo(s.dtype).max
    return F.silu(s.masked_fill(~m1, big).masked_fill(~m2, big)) @ v


def mask_then_bias(q, k, v, bias):
    n = q.shape[-2]
    s = (q @ k.transpose(-2, -1)).masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), 0.0)
    return F.relu(s + bias) @ v


WRONG_SPELLINGS = {
    "arange_start_one": (arange_start_one, ()),
    "sliced_arange": (sliced_arange, ()),
    "two_masks_with_finfo_max": (two_masks_with_finfo_max, "masks"),
    "mask_then_bias": (mask_then_bias, "bias"),
}


@pytest.mark.parametrize("name", WRONG_SPELLINGS)
def test_look_alike_blocks_keep_eagers_values(name):
    fn, extra = WRONG_SPELLINGS[name]
    gen = torch.Generator().manual_seed(3)
    inputs = _qkv()
    if extra == "masks":
        inputs += (torch.rand(N, N, generator=gen) > 0.3, torch.rand(N, N, generator=gen) > 0.3)
    elif extra == "bias":
        inputs += (torch.randn(N, N, generator=gen),)
    count, err = compiled_vs_eager(Fn(fn), *inputs)
    assert err < 1e-5, f"{name}: compiled differs from eager by {err:.3g} ({count} rewrites)"


class CausalBuffer(nn.Module):
    """minGPT's spelling: a tril buffer sliced to the length, ``== 0`` filled with -finfo.max before gelu."""

    def __init__(self, max_n=24, dtype=torch.float32):
        super().__init__()
        self.register_buffer("mask", torch.tril(torch.ones(max_n, max_n, dtype=dtype)))

    def forward(self, q, k, v):
        n = q.shape[-2]
        s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
        s = s.masked_fill(self.mask[:n, :n] == 0, -torch.finfo(s.dtype).max)
        return F.gelu(s) @ v


class FloatCausalBuffer(nn.Module):
    """HSTU's spelling: silu(S) / N times a float {0, 1} tril buffer."""

    def __init__(self, max_n=24):
        super().__init__()
        self.register_buffer("tril", torch.tril(torch.ones(max_n, max_n)))

    def forward(self, q, k, v):
        n = q.shape[-2]
        return (F.silu(q @ k.transpose(-2, -1)) / n * self.tril[:n, :n]) @ v


@pytest.mark.parametrize("model_cls", [CausalBuffer, FloatCausalBuffer])
@pytest.mark.parametrize("change", ["fill_", "load_state_dict", "reassign"])
def test_buffer_mask_followed_after_the_compile(model_cls, change):
    model = model_cls()
    q, k, v = _qkv(1)
    reset()
    compiled = torch.compile(model, backend=AOT_EAGER_GDPA)
    before = compiled(q, k, v)
    assert rewrites() == 1
    torch.testing.assert_close(before, model(q, k, v), rtol=1e-5, atol=1e-5)
    name = next(iter(model._buffers))
    new = torch.ones_like(model._buffers[name]).triu()  # no longer causal
    if change == "fill_":
        with torch.no_grad():
            model._buffers[name].copy_(new)
    elif change == "load_state_dict":
        model.load_state_dict({name: new})
    else:
        setattr(model, name, new)
    after = compiled(q, k, v)
    torch.testing.assert_close(after, model(q, k, v), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(after, before)


@pytest.mark.parametrize("model_cls", [CausalBuffer, FloatCausalBuffer])
@pytest.mark.parametrize("still_causal", [True, False])
def test_buffer_mask_gradients(model_cls, still_causal):
    def change(model):
        if not still_causal:
            buffer = next(iter(model._buffers.values()))
            with torch.no_grad():
                buffer.copy_(torch.rand(buffer.shape, generator=torch.Generator().manual_seed(5)) > 0.5)

    count, err = compiled_vs_eager(model_cls(), *_qkv(2), before=change)
    assert count >= 1 and err < 1e-5, (count, err)


def test_causal_check_is_cached_per_buffer_state():
    buffer = torch.tril(torch.ones(8, 8))
    mask = buffer[:6, :6]
    assert is_causal_keep_mask(mask, buffer)
    with torch.no_grad():
        buffer[5, 0] = 0.0  # an in-place write: a new state, checked again
    assert not is_causal_keep_mask(buffer[:6, :6], buffer)
    assert not is_causal_keep_mask(torch.ones(6, 6), torch.ones(6, 6))
    assert is_causal_keep_mask(torch.tril(torch.ones(1, 5, 5, dtype=torch.bool)), torch.zeros(1))


class MaskFromAnotherGraph(nn.Module):
    """The research HSTU's spelling: the model makes ``1.0 - triu`` of its buffer, and the attention, which a graph
    break puts in another graph, multiplies silu(S) / N by it: there the mask is an input the caller passes."""

    def __init__(self, max_n=N):
        super().__init__()
        self.register_buffer("_attn_mask", torch.triu(torch.ones(max_n, max_n, dtype=torch.bool), diagonal=1))

    def forward(self, q, k, v):
        mask = 1.0 - self._attn_mask.to(q.dtype)
        torch._dynamo.graph_break()
        n = q.shape[-2]
        return (F.silu(q @ k.transpose(-2, -1)) / n * mask[:n, :n]) @ v


@pytest.mark.parametrize("still_causal", [True, False])
def test_float_mask_from_another_graph_is_checked_when_it_runs(still_causal):
    def change(model):
        if not still_causal:
            with torch.no_grad():
                model._attn_mask.copy_(torch.rand(N, N, generator=torch.Generator().manual_seed(5)) > 0.5)

    count, err = compiled_vs_eager(MaskFromAnotherGraph(), *_qkv(3), before=change)
    assert count >= 1 and err < 1e-5, (count, err)


def test_checked_mask_ops_are_kept_out_of_cuda_graphs():
    """A CUDA graph would replay the causal check's answer of its recording: Inductor leaves graphs with these ops
    to run without one."""
    from torch._inductor.utils import is_cudagraph_unsafe_fx_node

    graph = torch.fx.Graph()
    for name in ("attention_buffer_mask_fwd_v1", "attention_buffer_mask_bwd_v1"):
        node = graph.call_function(getattr(torch.ops.gdpa, name).default, ())
        assert is_cudagraph_unsafe_fx_node(node), name


def test_checked_states_hold_bounded_memory(monkeypatch):
    """A mask made anew each step adds a state per step; the cache keeps the newest within its byte budget."""
    from gdpa_inductor.lowering import buffer_mask_ops

    monkeypatch.setattr(buffer_mask_ops, "_CHECKED", type(buffer_mask_ops._CHECKED)())
    monkeypatch.setattr(buffer_mask_ops, "MAX_HELD_BYTES", 3 * 16 * 16 * 4)
    masks = [torch.tril(torch.ones(16, 16)) for _ in range(10)]
    assert all(is_causal_keep_mask(m, m) for m in masks)
    held = [source for source, _ in buffer_mask_ops._CHECKED.values()]
    assert 1 <= len(held) <= 3 and held[-1] is masks[-1]


def test_a_causal_mask_that_requires_grad_is_not_fused():
    """The checked op gives its mask no gradient: a caller's mask that wants one is left to Inductor."""

    def masked(q, k, v, mask):
        return (F.silu(q @ k.transpose(-2, -1)) / N * mask) @ v

    count, err = compiled_vs_eager(Fn(masked), *_qkv(4), torch.tril(torch.ones(N, N)))
    assert count == 0 and err < 1e-5, (count, err)
