"""GPU correctness of the CuTe-DSL varlen kernels with a bias tensor (HSTU's relative attention bias over a jagged or
padded batch, and the backend's rewrite of a padded model with a length mask; skipped without an sm_90 GPU and
nvidia-cutlass-dsl).

Against the float64 oracle of tests/varlen_testing.py, the forward and dq, dk, dv (and dbias where the bias wants
it) are each within 2x of the oracle's math in the same dtype, over jagged self-attention, cross-attention, padded
batches and shared seed queries (PMA), biases per sample, per head, both or shared, the aligned causal mask and the
band (HSTU's max_attn_len), bf16 and fp16, GQA, D = 64 to 128, empty and single-token samples. The Triton varlen
kernels are made to fail, so each case proves the CuTe kernels ran. NaN in the bias past each sample's lengths
(positions no sample reads) changes nothing; calls the CuTe backward does not take run Triton's, with the reason.
"""

from __future__ import annotations

import pytest
import torch
from varlen_testing import make_case

import gdpa_inductor
from gdpa_inductor import gdpa_varlen
from gdpa_inductor.kernels.cute import varlen_bwd
from gdpa_inductor.kernels.cute.varlen_support import cute_varlen_bwd_support
from gdpa_inductor.kernels.triton import varlen_bwd as triton_varlen_bwd
from gdpa_inductor.lowering import dispatch

from .cute_common import NEEDS_CUTE
from .varlen_common import check, rel

pytestmark = NEEDS_CUTE

# the longest sample on each side a multiple of 8 (the backward's TMA tiles of the bias)
LENGTHS = [296, 0, 1, 129, 17, 64, 256, 128]
KEY_LENGTHS = [200, 5, 0, 304, 17, 1, 130, 128]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

# (layout, dtype, activation, D, Dv, Hkv, the bias's leading dims ("z" B, "h" H, "1" one), bias grad, mask)
CASES = [
    ("self", "bf16", "silu", 128, 128, 4, "h", True, dict(causal=True)),
    ("self", "bf16", "silu", 128, 128, 2, "z1", True, dict(causal=True, window=(100, 0))),
    ("padded_self", "bf16", "silu", 128, 128, 4, "1h", True, dict(causal=True)),
    ("cross", "bf16", "gelu_tanh", 128, 128, 2, "zh", True, {}),
    ("cross", "bf16", "sigmoid", 128, 128, 4, "h", False, dict(causal=True)),
    ("padded", "fp16", "relu", 64, 64, 4, "z1", True, dict(window=(50, 70))),
    ("self", "fp16", "gelu", 96, 128, 2, "", True, {}),
    ("pma", "bf16", "gelu_tanh", 128, 128, 4, "zh", True, {}),
    ("self", "bf16", "hardswish", 128, 64, 4, "zh", False, dict(window=(30, 30))),
]


def _extent(case) -> tuple[int, int]:
    """The bias's (rows, columns): each side's longest sample, or a dense side's N."""
    kw = case.kwargs
    return tuple(x.shape[1] if cu is None else max(lens)
                 for x, cu, lens in ((case.q, kw["cu_seqlens_q"], case.lq), (case.k, kw["cu_seqlens_k"], case.lk)))


def _bias(kind: str, case, seed: int) -> torch.Tensor:
    """A random float64 bias [*leading, rows, columns] (``_extent``): "z" a dim of the batch, "h" of the heads,
    "1" of one, in that order."""
    sizes = [{"z": len(case.lq), "h": case.q.shape[-2], "1": 1}[c] for c in kind]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*sizes, *_extent(case), device="cuda", generator=gen, dtype=torch.float64).mul(2.0)


def _sample(layout, d, dv, hkv, gen):
    return make_case(layout, gen, h=4, hkv=hkv, d=d, dv=dv, lq=LENGTHS, lk=KEY_LENGTHS).to("cuda")


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(43)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(x) for x in c[:8]) + (
    "-" + "-".join(map(str, c[8])) if c[8] else ""))
def test_bias_tensor_matches_float64(case, gen, cute_varlen_only):
    layout, dtype, activation, d, dv, hkv, kind, grad, mask = case
    sample = _sample(layout, d, dv, hkv, gen)
    # the bias as the op gets it: rounded to the dtype first, so the oracle's float64 copy holds the same values
    bias = _bias(kind, sample, 7).to(DTYPES[dtype]).double()
    check(sample, DTYPES[dtype], bias=bias, bias_grad=grad, activation=activation, **mask)


@pytest.mark.parametrize("way", ["buffer", "atomic"])
@pytest.mark.parametrize("case", [c for c in CASES if c[7]], ids=lambda c: "-".join(str(x) for x in c[:8]) + (
    "-" + "-".join(map(str, c[8])) if c[8] else ""))
def test_bias_gradient_either_way(case, way, gen, cute_varlen_only, monkeypatch):
    """dbias stored through the [B, H, rows, columns] dS buffer or added atomically in fp32 (by default: the
    latter for a bias the samples share), either way within 2x the oracle's error, and the build of that way ran."""
    monkeypatch.setattr(varlen_bwd, "dbias_way", lambda *args, **kwargs: way)
    built = []
    compile_bwd = varlen_bwd.compile_bwd
    monkeypatch.setattr(varlen_bwd, "compile_bwd", lambda plan, **kw: built.append(plan.dbias_atomic) or compile_bwd(
        plan, **kw))
    layout, dtype, activation, d, dv, hkv, kind, grad, mask = case
    sample = _sample(layout, d, dv, hkv, gen)
    bias = _bias(kind, sample, 7).to(DTYPES[dtype]).double()
    check(sample, DTYPES[dtype], bias=bias, bias_grad=grad, activation=activation, **mask)
    assert built == [way == "atomic"], built


@pytest.mark.parametrize("mask", [{}, dict(causal=True)], ids=["plain", "causal"])
def test_nan_past_each_sample_changes_nothing(gen, cute_varlen_only, mask):
    """A per-sample bias holding NaN at every position past its sample's query and key lengths (read by no
    sample): the output and every gradient equal the run without them, bit for bit (dQ up to the order of its
    sums), and dbias is zero there."""
    sample = _sample("cross", 128, 128, 4, gen)
    clean = _bias("z1", sample, 9).to(torch.bfloat16)
    poisoned = clean.clone()
    for z, (nq, nk) in enumerate(zip(sample.lq, sample.lk)):
        poisoned[z, :, nq:, :] = float("nan")
        poisoned[z, :, :, nk:] = float("nan")

    def run(bias):
        q, k, v = (t.detach().to(torch.bfloat16).requires_grad_() for t in sample.inputs(torch.float64))
        b = bias.detach().requires_grad_()
        out = gdpa_varlen(q, k, v, **sample.kwargs, activation="silu", bias=b, **mask)
        dout = torch.randn(out.shape, generator=torch.Generator("cuda").manual_seed(3), device="cuda").to(out.dtype)
        return (out, *torch.autograd.grad(out, (q, k, v, b), dout))

    want, got = run(clean), run(poisoned)
    for name, g, w in zip(("out", "dk", "dv", "dbias"), got[:1] + got[2:], want[:1] + want[2:]):
        assert torch.equal(g, w), name
    # dQ's tiles are added by TMA reduce-adds from the key tiles' CTAs, in no fixed order
    assert got[1].isfinite().all() and rel(got[1], want[1]) < 1e-2
    for z, (nq, nk) in enumerate(zip(sample.lq, sample.lk)):
        assert not got[4][z, :, nq:].any() and not got[4][z, :, :, nk:].any()


def test_calls_past_the_cute_backward_take_tritons(gen, monkeypatch):
    """Under "auto": head dims of 256 run the CuTe forward and Triton's varlen backward (the wide-head backward reads
    no bias tensor), with the reason in the support check; a bias whose columns are not a multiple of 8 runs both CuTe
    kernels (the backward's TMA reads a padded copy); both within 2x eager's error, dbias included."""
    monkeypatch.setattr(gdpa_inductor.config, "backend", "auto")
    ran = []

    def recording(fn):
        def wrapped(*args, **kwargs):
            ran.append("triton backward")
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(triton_varlen_bwd, "gdpa_varlen_bwd_triton",
                        recording(triton_varlen_bwd.gdpa_varlen_bwd_triton))
    for d, lengths, causal, reason in ((128, [298, 17, 0, 130], True, ""),
                                       (256, [296, 17, 0, 130], False, "up to 128")):
        sample = make_case("self", gen, h=4, hkv=4, d=d, dv=d, lq=lengths).to("cuda")
        bias = _bias("h", sample, 11).to(torch.bfloat16)
        q, k, v = sample.inputs(torch.bfloat16)
        rows = tuple(sample.kwargs[n] for n in ("cu_seqlens_q", "cu_seqlens_k", "seqused_q", "seqused_k"))
        assert dispatch.select_varlen_forward_impl(q, k, v, bias, causal, (-1, -1), "silu", rows) == "cute"
        ok, why = cute_varlen_bwd_support(q, k, v, bias, causal, (-1, -1), "silu", rows, True)
        assert ok == (not reason) and reason in why, why
        ran.clear()
        check(sample, torch.bfloat16, bias=bias.double(), causal=causal)
        assert ran == ([] if ok else ["triton backward"]), ran
