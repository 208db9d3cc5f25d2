"""The backend on the GPU: zoo models (tests/patterns/zoo.py) compiled with the real backend="gdpa"
(Inductor + the Triton kernels) under bf16 autocast, one training step each. The rewrite count must be the
zoo's, and the output and every input/parameter gradient within 2x eager autocast's own error against a
float64 run of the same model (plus a small floor), as for the kernels."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from torch._dynamo.utils import counters

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "patterns"))  # the zoo is shared with CPU tests
from hstu_reference import HSTUReferenceMHA, jagged_inputs  # noqa: E402
from zoo import ZOO_BY_NAME, build  # noqa: E402

import gdpa_inductor  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# Styles whose fused path differs most from eager: bias + causal + /N, a dense mask as a -max bias,
# PMA's broadcast seed, blocked-GQA peeling, einsum, a learned temperature, a causal buffer, length masks.
MODELS = [
    "hstu_silu_relbias_causal", "padding_mask_before_gelu", "padding_mask_after_silu", "pma_seed_expand",
    "gqa_blocked_repeat_interleave", "einsum_heads_in_equation_sigmoid", "param_temperature_gelu",
    "gpt2_causal_buffer_before_gelu", "sigmoid_attention_log_n_bias",
    # padded batches whose length masks become the varlen op's per-sample lengths
    "padded_lengths_key_mask_gelu", "hstu_padded_lengths_causal_silu", "hstu_padded_lengths_relbias",
    "hstu_one_minus_triu_buffer", "causal_max_fill_before_gelu_tanh",
    # a factor per query row, a scale over a biased sum, a cast mask, `...` einsums, a shape-only user, masks
    # evaluated from sizes (causal, and a band on the varlen op's window)
    "hstu_attn_scale_per_row", "fbgemm_alpha_times_biased_scores", "cast_bool_key_mask_after_sigmoid",
    "ellipsis_einsums_silu", "sigmoid_expand_as_mask", "hstu_reference_mask_causal",
    "hstu_reference_mask_max_attn_len", "band_fill_before_gelu",
    # chains written in place, a factor per key on V, one K and V shared by the heads (einsums)
    "inplace_sigmoid_chain", "inplace_hstu_bias", "key_factor", "float_key_mask_after_sigmoid",
    "shared_kv_einsum_sigmoid", "shared_kv_einsum_causal_silu",
]
FLOOR = 2e-3


def _step(model, inputs, autocast: bool):
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        out = model(*leaves)
    out = out[0] if isinstance(out, tuple) else out
    gen = torch.Generator(device=out.device).manual_seed(0)
    dout = torch.randn(out.shape, device=out.device, generator=gen, dtype=torch.float64)
    out.backward(dout.to(out.dtype))
    grads = [t.grad for t in leaves if t.grad is not None] + [p.grad for p in model.parameters() if p.grad is not None]
    return [out.detach()] + [g.detach() for g in grads]


def _rel(x, ref):
    return ((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("name", MODELS)
def test_backend_cuda_bf16_training(name):
    entry = ZOO_BY_NAME[name]
    model, inputs = build(entry)
    model = model.cuda()
    inputs = tuple(t.cuda() for t in inputs)
    ref = _step(model.double(), tuple(t.double() if t.is_floating_point() else t for t in inputs), False)
    model = model.float()
    eager = _step(model, inputs, True)
    torch._dynamo.reset()
    counters.clear()
    compiled = _step(torch.compile(model, backend="gdpa"), inputs, True)
    assert counters["gdpa"]["rewrites"] == entry.rewrites
    assert len(compiled) == len(eager) == len(ref)
    for i, (c, e, r) in enumerate(zip(compiled, eager, ref)):
        err, eager_err = _rel(c, r), _rel(e, r)
        assert err <= 2 * eager_err + FLOOR, f"{name} tensor {i}: {err:.2e} > 2 x eager {eager_err:.2e} + {FLOOR}"


@pytest.mark.parametrize("padding", ["gather", "custom_op"])
@pytest.mark.parametrize("max_attn_len", [0, 48])
def test_hstu_reference_skips_its_padding_cuda(max_attn_len, padding):
    """HSTU's reference over jagged rows padded to N: fused on the varlen op with the padding skipped."""
    n = 192
    model = HSTUReferenceMHA(n, alpha=64 ** -0.5, max_attn_len=max_attn_len, padding=padding)
    q, k, v, offsets = jagged_inputs(torch.Generator().manual_seed(0), [n, 5, 130, 77], h=2, d=64)
    inputs = (q.cuda(), k.cuda(), v.cuda(), offsets.cuda())
    assert "padded query rows and key columns skipped" in str(gdpa_inductor.explain(model, *inputs))
    ref = _step(model, tuple(t.double() if t.is_floating_point() else t for t in inputs), False)
    eager = _step(model, inputs, True)
    torch._dynamo.reset()
    counters.clear()
    compiled = _step(torch.compile(model, backend="gdpa"), inputs, True)
    assert counters["gdpa"]["rewrites"] == 1
    for i, (c, e, r) in enumerate(zip(compiled, eager, ref)):
        err, eager_err = _rel(c, r), _rel(e, r)
        assert err <= 2 * eager_err + FLOOR, f"tensor {i}: {err:.2e} > 2 x eager {eager_err:.2e} + {FLOOR}"
