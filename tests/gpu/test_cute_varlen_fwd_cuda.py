"""GPU correctness of the CuTe-DSL varlen forward (skipped without an sm_90 GPU and nvidia-cutlass-dsl); every
layout, activation, dtype and head-dim pair is checked, forward included, by test_cute_varlen_bwd_cuda.py.

Against the float64 oracle of tests/varlen_testing.py, the forward's relative error is at most 2x that of the
oracle's math in the same dtype (eager), at the same inputs: samples without keys, and a batch of more query
tiles than SMs with lengths up to 1024 (each CTA skips the tiles past its samples' lengths). The Triton varlen
kernels are made to fail, so each case proves the CuTe kernel ran. Non-finite values in one sample
stay in that sample: its neighbours' rows (read by the same tiles without the bounded descriptors) are
unchanged to the bit.
"""

from __future__ import annotations

import pytest
import torch
from varlen_testing import make_case, oracle

from gdpa_inductor import gdpa_varlen
from gdpa_inductor.kernels.cute import varlen_fwd

from .cute_common import NEEDS_CUTE
from .varlen_common import FLOOR, rel

pytestmark = NEEDS_CUTE


def check_forward(case, dtype, **params):
    params = dict(activation="silu", scale=case.q.shape[-1] ** -0.5, post_scale=0.5) | params
    forward = oracle(case, **params)
    ref = forward(*case.inputs(torch.float64))
    eager = forward(*case.inputs(dtype))
    q, k, v = (t.detach() for t in case.inputs(dtype))
    out = gdpa_varlen(q, k, v, **case.kwargs, **params)
    assert out.shape == ref.shape and out.dtype == dtype
    err, eager_err = rel(out, ref), rel(eager, ref)
    assert err <= 2 * eager_err + FLOOR, f"out: {err:.3g} > 2 x eager {eager_err:.3g}"
    return out


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(23)


@pytest.mark.parametrize("layout, activation", [("self", "gelu_tanh"), ("padded", "silu"), ("pma", "sigmoid")])
def test_many_tiles_per_cta(layout, activation, gen, cute_varlen_only):
    """More query tiles than SMs, lengths up to 1024 in a random order: each CTA runs several samples' tiles
    and skips the query tiles past its samples' lengths."""
    lengths = torch.randint(0, 1025, (300,), generator=gen).tolist()
    keys = torch.randint(0, 1025, (300,), generator=gen).tolist()
    case = make_case(layout, gen, h=4, hkv=4, d=128, dv=128, lq=lengths, lk=keys).to("cuda")
    check_forward(case, torch.bfloat16, activation=activation)


@pytest.mark.parametrize("poison", ["k", "v", "q"])
def test_non_finite_values_stay_in_their_sample(poison, gen, cute_varlen_only):
    """NaN and Inf in the first rows of sample 1, right behind sample 0's ragged last tile: sample 0 and every
    other sample come out as without them, bit for bit, and sample 1 is non-finite where the oracle is."""
    case = make_case("self", gen, h=4, hkv=4, d=128, dv=128, lq=[200, 150, 77]).to("cuda")
    clean = gdpa_varlen(*(t.detach().to(torch.bfloat16) for t in case.inputs(torch.float64)), **case.kwargs,
                        activation="silu")
    tensor = {"q": case.q, "k": case.k, "v": case.v}[poison]
    tensor[200:203, 1] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=tensor.dtype,
                                      device=tensor.device)[:, None]
    out = gdpa_varlen(*(t.detach().to(torch.bfloat16) for t in case.inputs(torch.float64)), **case.kwargs,
                      activation="silu")
    others = torch.cat([torch.arange(0, 200), torch.arange(350, 427)]).cuda()
    assert torch.equal(out[others], clean[others])
    ref = oracle(case, activation="silu", scale=1.0, post_scale=1.0)(*case.inputs(torch.float64))
    assert torch.equal(out[200:350].isfinite(), ref[200:350].isfinite())


@pytest.mark.parametrize("layout, lq, lk", [("cross", [3, 130], [0, 0]), ("padded", [200, 5, 1], [0, 0, 0]),
                                            ("cross", [0, 1, 300, 2], [5, 0, 0, 7])])
def test_samples_without_keys(layout, lq, lk, gen, cute_varlen_only):
    """A sample without keys gives O = 0 (its query tiles skip the main loop and are stored as zeros); so does
    a batch without any key (no descriptor can point into an empty tensor)."""
    case = make_case(layout, gen, h=4, hkv=2, d=128, dv=128, lq=lq, lk=lk).to("cuda")
    out = check_forward(case, torch.bfloat16, activation="sigmoid")
    starts = [0, *torch.tensor(case.lq).cumsum(0).tolist()]
    for z, n in enumerate(case.lk):
        if n == 0 and layout == "cross":
            assert torch.count_nonzero(out[starts[z]:starts[z + 1]]) == 0


@pytest.mark.parametrize("d, dv", [(256, 256), (128, 256), (256, 64)])
@pytest.mark.parametrize("layout, dtype, activation", [("self", torch.bfloat16, "gelu_tanh"),
                                                       ("padded", torch.float16, "silu"),
                                                       ("cross", torch.bfloat16, "relu"),
                                                       ("pma", torch.bfloat16, "sigmoid")])
def test_wide_heads(d, dv, layout, dtype, activation, gen, cute_varlen_only):
    """Head dims past 128 take the dense forward's wide-head tiles (64-key tiles, O stored from the registers):
    each sample's rows past its end are predicated off, so its neighbours' rows (and a padded batch's zeros)
    stay as they are; samples without keys give O = 0; GQA, several query and key tiles a sample."""
    lq, lk = [300, 1, 129, 64, 0, 77], [65, 0, 300, 1, 40, 128]
    case = make_case(layout, gen, h=4, hkv=2, d=d, dv=dv, lq=lq, lk=lk).to("cuda")
    check_forward(case, dtype, activation=activation)


def test_grid_coprime_with_query_tiles_changes_no_bit(gen, cute_varlen_only, monkeypatch):
    """The grid coprime with the longest sample's query tiles (``persistent_grid``) only hands the tiles to other
    CTAs: the bits of the one-CTA-per-SM grid, with many tiles per CTA over jagged lengths."""
    lengths = torch.randint(1, 1025, (400,), generator=gen).tolist()
    case = make_case("self", gen, h=4, hkv=4, d=128, dv=128, lq=lengths).to("cuda")
    q, k, v = (t.detach().to(torch.bfloat16) for t in case.inputs(torch.float64))
    balanced = gdpa_varlen(q, k, v, **case.kwargs, activation="gelu_tanh")
    monkeypatch.setattr(varlen_fwd, "persistent_grid", lambda tiles, sms, num_m, uneven: min(tiles, sms))
    assert torch.equal(gdpa_varlen(q, k, v, **case.kwargs, activation="gelu_tanh"), balanced)
