"""Public model code, unmodified: x-transformers' sigmoid attention (``Attend(sigmoid=True)`` and the
``attn_sigmoid=True`` encoder and decoder built on it, also with one K and V head shared by the heads), installed
as the package users install. Each model is compiled with the GDPA pass (AOT autograd, no Inductor): the rewrite
count is pinned, and the outputs and every parameter and input gradient must match eager in fp32."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import x_transformers
import x_transformers.attend
from harness import AOT_EAGER_GDPA, assert_fp32_close, reset, rewrites, run

B, H, N, D = 2, 2, 16, 8


class AttendOutput(nn.Module):
    """``Attend`` as x-transformers' ``Attention`` calls it, keeping the output (the intermediates stay unread)."""

    def __init__(self, **kwargs):
        super().__init__()
        self.attend = x_transformers.attend.Attend(sigmoid=True, **kwargs)

    def forward(self, q, k, v, *mask):
        return self.attend(q, k, v, mask=mask[0] if mask else None)[0]


def _qkv(gen: torch.Generator) -> tuple:
    return tuple(torch.randn(B, H, N, D, generator=gen) for _ in range(3))


def _key_mask(gen: torch.Generator) -> torch.Tensor:
    keep = torch.rand(B, N, generator=gen) > 0.3
    keep[:, 0] = True
    return keep


def _tokens(gen: torch.Generator) -> tuple:
    return (torch.randint(0, 50, (B, N), generator=gen),)


def _wrapper(layers, **options) -> nn.Module:
    return x_transformers.TransformerWrapper(num_tokens=50, max_seq_len=N, attn_layers=layers(
        dim=32, depth=2, heads=2, attn_sigmoid=True, **options))


CASES = {
    "attend": (lambda: AttendOutput(), _qkv, 1),
    "attend_causal": (lambda: AttendOutput(causal=True), _qkv, 1),
    "attend_key_mask": (lambda: AttendOutput(), lambda g: (*_qkv(g), _key_mask(g)), 1),
    "encoder": (lambda: _wrapper(x_transformers.Encoder), _tokens, 2),
    "decoder": (lambda: _wrapper(x_transformers.Decoder), _tokens, 2),
    # one K and V shared by the heads: einsums without a heads index
    "decoder_one_kv_head": (lambda: _wrapper(x_transformers.Decoder, attn_one_kv_head=True), _tokens, 2),
}


@pytest.mark.parametrize("mode", ["train", "infer"])
@pytest.mark.parametrize("name", CASES)
def test_x_transformers_sigmoid_attention(name, mode):
    build, inputs_of, expected = CASES[name]
    torch.manual_seed(0)
    model = build()
    inputs = inputs_of(torch.Generator().manual_seed(1))
    train = mode == "train"
    eager = run(model, inputs, train=train)
    reset()
    got = run(model, inputs, train=train, compile_with=AOT_EAGER_GDPA)
    assert rewrites() == expected, f"{name}: {rewrites()} rewrites, expected {expected}"
    assert_fp32_close(got, eager, f"x-transformers {name} [{mode}]")
