"""GPU correctness of the CuTe-DSL Hopper kernels with a bias tensor over the scores (relative-position, ALiBi-like;
skipped without an sm_90 GPU and nvidia-cutlass-dsl): under "auto" the forward runs on the CuTe kernel, and the
backward too at D and Dv up to 128 (its TMA reading the bias in place, or a padded copy where Nk or its strides are
not multiples of 8; else Triton's), dbias
included; the output and dq, dk, dv (and dbias where the bias wants it) against float64, each within 2x eager's own
error, over biases per sample, per head, per both or shared, in bf16 and fp16, ragged and exact key counts, dQ
summed in place and in fp32, the causal mask, GQA, D = 64 to 256, biases that are strided views, key-padding biases
of one row for every query; non-finite bias values give eager's NaN/Inf pattern."""

from __future__ import annotations

import pytest
import torch

import gdpa_inductor
from gdpa_inductor import gdpa
from gdpa_inductor.kernels.cute import gdpa_bwd
from gdpa_inductor.kernels.reference import gdpa_reference, gdpa_reference_backward
from gdpa_inductor.lowering import dispatch

from .cute_common import DTYPES, FLOOR, NEEDS_CUTE, bwd_inputs, rel_error
from .test_cute_bias_cuda import eager_biased

pytestmark = NEEDS_CUTE

# (dtype, activation, Z, H, Hkv, Nq, Nk, D, Dv, the bias's leading dims ("z" Z, "h" H, "1" one), causal, the
# backward "auto" runs)
CASES = [
    ("bf16", "silu", 2, 4, 4, 300, 296, 128, 128, "z1", False, "cute"),
    ("bf16", "gelu_tanh", 2, 4, 4, 257, 384, 128, 128, "h", False, "cute"),
    ("bf16", "sigmoid", 2, 8, 2, 128, 1000, 128, 128, "zh", False, "cute"),
    ("bf16", "gelu_tanh", 2, 4, 4, 200, 1152, 128, 128, "z1", False, "cute"),
    ("fp16", "relu", 40, 4, 4, 300, 200, 64, 64, "", False, "cute"),
    ("bf16", "silu", 2, 4, 4, 384, 384, 128, 128, "z1", True, "cute"),
    ("bf16", "gelu_tanh", 1, 4, 4, 1000, 1128, 128, 128, "z1", True, "cute"),
    ("fp16", "gelu_tanh", 2, 4, 2, 258, 386, 128, 128, "1h", True, "cute"),
    ("bf16", "gelu", 2, 4, 2, 300, 264, 96, 64, "zh", False, "cute"),
    ("bf16", "gelu", 2, 4, 2, 300, 260, 96, 64, "zh", False, "cute"),
    ("bf16", "hardswish", 3, 4, 4, 130, 304, 64, 96, "z1", False, "cute"),
    ("bf16", "gelu_tanh", 30, 4, 4, 512, 256, 128, 128, "z1", False, "cute"),
    ("bf16", "silu", 2, 4, 4, 1100, 1104, 256, 256, "z1", False, "triton"),
]


def _bias(kind: str, z, h, nq, nk, dtype, seed):
    """A random bias [*leading, Nq, Nk]: "z" a dim of Z, "h" of H, "1" of one, in that order."""
    sizes = [{"z": z, "h": h, "1": 1}[c] for c in kind]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*sizes, nq, nk, device="cuda", generator=gen).mul(2.0).to(dtype)


@pytest.fixture
def auto_backend(monkeypatch):
    monkeypatch.setattr(gdpa_inductor.config, "backend", "auto")


def _check(q, k, v, do, act, bias, causal, dtype, backward="cute"):
    scale, post = q.shape[-1] ** -0.5, 1.0 / k.shape[-2]
    assert dispatch.select_forward_impl(q, k, v, bias, causal, act) == "cute"
    grad = bias.requires_grad
    assert dispatch.select_backward_impl(q, k, v, bias, causal, act, grad) == backward
    leaves = [t.detach().requires_grad_() for t in (q, k, v)] + [bias.detach().requires_grad_(grad)]
    out = gdpa(*leaves[:3], activation=act, scale=scale, post_scale=post, bias=leaves[3], causal=causal)
    out.backward(do)
    eager_leaves = [t.detach().requires_grad_() for t in (q, k, v)] + [bias.detach().requires_grad_(grad)]
    eager = eager_biased(*eager_leaves[:3], act, scale, post, eager_leaves[3], causal)
    eager.backward(do)
    qd, kd, vd, bd = (t.double() for t in (q, k, v, bias))
    ref = gdpa_reference(qd, kd, vd, bd, act, scale, post, causal)
    assert out.dtype == dtype
    assert rel_error(out, ref) <= 2 * rel_error(eager, ref) + FLOOR, (rel_error(out, ref), rel_error(eager, ref))
    refs = gdpa_reference_backward(do.double(), qd, kd, vd, bd, act, scale, post, causal=causal,
                                   bias_requires_grad=grad)
    names = ("dq", "dk", "dv", "dbias")[: 4 if grad else 3]
    for name, got, r, base in zip(names, leaves, refs, eager_leaves):
        err, bound = rel_error(got.grad, r.reshape(got.shape)), rel_error(base.grad, r.reshape(got.shape))
        assert err <= 2 * bound + FLOOR, (name, err, bound)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(x) for x in c))
def test_bias_tensor_matches_float64(case, auto_backend):
    dtype_name, act, z, h, hkv, nq, nk, d, dv, kind, causal, backward = case
    dtype = DTYPES[dtype_name]
    q, k, v, do = bwd_inputs(z, h, hkv, nq, nk, d, dv, dtype, 5)
    _check(q, k, v, do, act, _bias(kind, z, h, nq, nk, dtype, 6), causal, dtype, backward)


# (activation, Z, H, Hkv, Nq, Nk, the bias's leading dims, causal, dtype): dbias summed over heads, samples, both or
# neither; dQ in place and in fp32; causal; GQA; fp16; Nk not a multiple of 8 (the bias and dS through padded rows)
GRAD_CASES = [
    ("silu", 2, 4, 4, 300, 384, "z1", False, "bf16"),
    ("gelu_tanh", 3, 4, 4, 257, 296, "h", False, "bf16"),
    ("sigmoid", 2, 4, 2, 200, 1152, "zh", False, "bf16"),
    ("relu", 2, 4, 4, 130, 200, "", False, "fp16"),
    ("gelu_tanh", 2, 4, 4, 384, 512, "z1", True, "bf16"),
    ("silu", 1, 4, 4, 1000, 1128, "1h", True, "bf16"),
    ("silu", 2, 4, 4, 200, 300, "z1", False, "bf16"),
    ("relu", 2, 4, 4, 130, 1002, "h", False, "fp16"),
]


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: "-".join(str(x) for x in c))
def test_bias_tensor_with_its_gradient(case, auto_backend):
    """A bias that wants its gradient (HSTU's relative bias is learned): the CuTe forward and backward, dbias
    summed over the dims the bias broadcasts along, every gradient within 2x eager's error."""
    act, z, h, hkv, nq, nk, kind, causal, dtype_name = case
    dtype = DTYPES[dtype_name]
    q, k, v, do = bwd_inputs(z, h, hkv, nq, nk, 128, 128, dtype, 8)
    bias = _bias(kind, z, h, nq, nk, dtype, 9).requires_grad_()
    _check(q, k, v, do, act, bias, causal, dtype)


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: "-".join(str(x) for x in c))
def test_bias_gradient_added_atomically(case, auto_backend, monkeypatch):
    """dbias added atomically in fp32 (the varlen batches' way for a shared bias; a dense one's where its dS buffer
    does not fit): every gradient within 2x eager's error, and the atomic build ran."""
    monkeypatch.setattr(gdpa_bwd, "dbias_way", lambda *args, **kwargs: "atomic")
    built = []
    compile_bwd = gdpa_bwd.compile_bwd
    monkeypatch.setattr(gdpa_bwd, "compile_bwd", lambda plan, **kw: built.append(plan.dbias_atomic) or compile_bwd(
        plan, **kw))
    act, z, h, hkv, nq, nk, kind, causal, dtype_name = case
    dtype = DTYPES[dtype_name]
    q, k, v, do = bwd_inputs(z, h, hkv, nq, nk, 128, 128, dtype, 8)
    bias = _bias(kind, z, h, nq, nk, dtype, 9).requires_grad_()
    _check(q, k, v, do, act, bias, causal, dtype)
    assert built == [True], built


@pytest.mark.parametrize("cols, backward", [(slice(8, 304), "cute"), (slice(6, 306), "cute")])
def test_strided_bias_view(cols, backward, auto_backend):
    """A bias that is a slice of a wider buffer (rows longer than Nk, HSTU's sliced position table) is read in
    place, through its strides, where its tiles' rows start 16-byte aligned, else from a padded copy."""
    nk = cols.stop - cols.start
    q, k, v, do = bwd_inputs(2, 4, 4, 200, nk, 128, 128, torch.bfloat16, 10)
    table = _bias("1", 2, 4, 256, 512, torch.bfloat16, 11)
    bias = table[..., 17:217, cols]
    assert not bias.is_contiguous() and bias.stride(-1) == 1
    _check(q, k, v, do, "gelu_tanh", bias.detach().requires_grad_(), False, torch.bfloat16, backward)


def test_tensor_bias_reaches_the_cute_kernels(auto_backend, monkeypatch):
    """"auto" runs the op's forward and backward with a bias tensor that wants its gradient on the CuTe kernels:
    the Triton kernels made to fail."""
    def no_triton(*args, **kwargs):
        raise AssertionError("a Triton kernel ran")

    monkeypatch.setattr("gdpa_inductor.kernels.triton.gdpa_fwd.gdpa_fwd_triton", no_triton)
    monkeypatch.setattr("gdpa_inductor.kernels.triton.gdpa_bwd.gdpa_bwd_triton", no_triton)
    q, k, v, do = bwd_inputs(2, 4, 4, 256, 256, 128, 128, torch.bfloat16, 12)
    bias = _bias("z1", 2, 4, 256, 256, torch.bfloat16, 13).requires_grad_()
    out = gdpa(q, k, v, activation="silu", scale=0.1, bias=bias)
    out.backward(do)
    ref = gdpa_reference(*(t.double() for t in (q, k, v, bias)), "silu", 0.1, 1.0)
    dbias = gdpa_reference_backward(do.double(), *(t.double() for t in (q, k, v, bias)), "silu", 0.1, 1.0,
                                    bias_requires_grad=True)[3]
    assert rel_error(out, ref) < 1e-2 and rel_error(bias.grad, dbias.reshape(bias.shape)) < 1e-2


# a key-padding bias, one row for every query: (dtype, activation, Z, H, Nq, Nk, the bias's dims before its row, causal,
# whether it wants its gradient); dQ in place and in fp32, shared by the samples, per head, 2-D, causal, fp16
KEY_PADDING_CASES = [
    ("bf16", "silu", 2, 4, 300, 1000, (2, 1), False, False),
    ("bf16", "relu", 2, 4, 200, 2048, (2, 4), False, True),
    ("fp16", "sigmoid", 3, 2, 130, 256, (), False, True),
    ("bf16", "silu", 2, 4, 384, 384, (2, 1), True, True),
    ("bf16", "gelu", 2, 4, 257, 1152, (1, 4), False, False),
]


@pytest.mark.parametrize("case", KEY_PADDING_CASES, ids=lambda c: "-".join(str(x) for x in c))
def test_key_padding_bias_on_the_cute_kernels(case, auto_backend):
    """A bias of one row for every query ([..., 1, Nk]: padded keys at -finfo.max, the others random) runs on the
    CuTe forward and backward (read as Nq rows of stride 0, no copy), dbias summed over the queries too: the
    output and every gradient within 2x eager's error."""
    dtype_name, act, z, h, nq, nk, lead, causal, grad = case
    dtype = DTYPES[dtype_name]
    q, k, v, do = bwd_inputs(z, h, h, nq, nk, 128, 128, dtype, 18)
    gen = torch.Generator(device="cuda").manual_seed(19)
    bias = torch.randn(*lead, 1, nk, device="cuda", generator=gen).mul(2.0).to(dtype)
    bias[..., nk - nk // 5:] = -torch.finfo(dtype).max
    _check(q, k, v, do, act, bias.requires_grad_(grad), causal, dtype)


def test_bias_expanded_by_its_caller_gets_a_gradient_per_row(auto_backend):
    """A key-padding row the caller expanded to every query itself ([Z, 1, Nq, Nk], stride 0 along Nq) is a bias of
    Nq rows to the op: its gradient has one value per row (autograd sums them into the row), not their sum."""
    q, k, v, do = bwd_inputs(2, 4, 4, 200, 384, 128, 128, torch.bfloat16, 20)
    row = torch.randn(2, 1, 1, 384, device="cuda", generator=torch.Generator(device="cuda").manual_seed(21))
    bias = row.bfloat16().expand(2, 1, 200, 384)
    assert bias.stride(2) == 0
    _check(q, k, v, do, "silu", bias.detach().requires_grad_(), False, torch.bfloat16)


def test_odd_key_count_takes_triton(auto_backend):
    """An odd Nk (the bias's pairs of columns would straddle its rows) keeps the Triton forward, which is still
    within 2x eager's error."""
    q, k, v, do = bwd_inputs(2, 4, 4, 200, 301, 128, 128, torch.bfloat16, 16)
    bias = _bias("z1", 2, 4, 200, 301, torch.bfloat16, 17)
    assert dispatch.select_forward_impl(q, k, v, bias, False, "silu") == "triton"
    out = gdpa(q, k, v, activation="silu", bias=bias)
    ref = gdpa_reference(*(t.double() for t in (q, k, v, bias)), "silu", 1.0, 1.0)
    assert rel_error(out, ref) <= 2 * rel_error(eager_biased(q, k, v, "silu", 1.0, 1.0, bias, False), ref) + FLOOR


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_bias_values_like_eager(value, auto_backend):
    """NaN or +-Inf at a few positions of the bias reach the output where eager's do, and nowhere else."""
    q, k, v, _ = bwd_inputs(2, 2, 2, 130, 200, 128, 128, torch.bfloat16, 14)
    bias = _bias("z1", 2, 2, 130, 200, torch.bfloat16, 15)
    bias[0, 0, 7, 3] = value
    bias[1, 0, 129, 199] = value
    for act in ("silu", "sigmoid", "relu"):
        got = gdpa(q, k, v, activation=act, bias=bias)
        expected = eager_biased(q, k, v, act, 1.0, 1.0, bias, False)
        assert torch.equal(got.isnan(), expected.isnan()) and torch.equal(got.isinf(), expected.isinf()), act
