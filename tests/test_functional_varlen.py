"""``gdpa_varlen``'s argument checks (each error names the argument) and jagged NestedTensors through
``gdpa``."""

from __future__ import annotations

import pytest
import torch
from gdpa_testing import randn, rel_err
from varlen_testing import cu_of

from gdpa_inductor import gdpa, gdpa_varlen


def _jagged(gen, lengths=(3, 5), h=2, d=8):
    t = sum(lengths)
    return randn(gen, t, h, d), randn(gen, t, h, d), randn(gen, t, h, d), cu_of(list(lengths)), max(lengths)


@pytest.mark.parametrize("change,message", [
    (lambda a: a.update(q=a["q"][None]), "q: with cu_seqlens, expected [total, H, head_dim]"),
    (lambda a: a.update(cu_seqlens_k=None), "k: without cu_seqlens, expected dense"),
    (lambda a: a.update(k=a["k"][..., :4]), "k: expected head_dim 8"),
    (lambda a: a.update(v=a["v"][:-1]), "v: expected"),
    (lambda a: a.update(q=a["q"].double()), "k: expected the dtype of q"),
    (lambda a: a.update(cu_seqlens_q=a["cu_seqlens_q"].float()),
     "cu_seqlens_q: expected None or a 1-D int32 tensor of B + 1 offsets; got a 1-D torch.float32 tensor"),
    (lambda a: a.update(cu_seqlens_q=torch.tensor([0, 3, 7], dtype=torch.int32)),
     "cu_seqlens_q: expected non-decreasing offsets from 0 to 8"),
    (lambda a: a.update(cu_seqlens_k=torch.tensor([0, 8], dtype=torch.int32)), "expected one batch size"),
    (lambda a: a.update(max_seqlen_q=4), "max_seqlen: expected >= the longest sequence of cu_seqlens_q (5)"),
    (lambda a: a.update(max_seqlen_k=-1), "max_seqlen_k: expected a non-negative int"),
    (lambda a: a.update(window=(2, 3, 4)), "window: expected None, an int or a (left, right) pair"),
    (lambda a: a.update(window=-5), "window: expected non-negative sizes"),
    (lambda a: a.update(activation="softmax"), "activation"),
    (lambda a: a.update(seqused_q=torch.tensor([1], dtype=torch.int32)), "seqused_q: expected None or a 1-D int32"),
    (lambda a: a.update(seqused_k=torch.tensor([3, 6], dtype=torch.int32), max_seqlen_k=4),
     "max_seqlen: expected >= the longest sequence of cu_seqlens_k (5)"),
    (lambda a: a.update(bias=torch.zeros(2, 5, 6)),
     "bias: expected a shape broadcastable to [B, H, max_seqlen_q, max_seqlen_k] = [2, 2, 5, 5]"),
    (lambda a: a.update(bias=torch.zeros(1, 1, 2, 2, 5, 5)), "bias: expected a shape broadcastable"),
    (lambda a: a.update(bias=torch.zeros(2, 5, 5, dtype=torch.float64)), "bias: expected q's device and dtype"),
    (lambda a: a.update(bias=[[0.0]]), "bias: expected a tensor or None"),
])
def test_bad_arguments_name_the_argument(change, message, gen):
    q, k, v, cu, longest = _jagged(gen)
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest)
    change(args)
    with pytest.raises(ValueError, match=None) as info:
        gdpa_varlen(**args)
    assert message in str(info.value), str(info.value)


def _varlen_args(gen):
    q, k, v, cu, longest = _jagged(gen)
    return dict(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest)


# Each message names the argument, the dtype and shape it expects, and what it got.
_OFFSETS = r"expected None or a 1-D int32 tensor of B \+ 1 offsets; got "
REFUSED = {
    "cu_q_2d": (dict(cu_seqlens_q=torch.tensor([[0, 3, 8]], dtype=torch.int32)),
                rf"^cu_seqlens_q: {_OFFSETS}a 2-D torch.int32 tensor of shape \(1, 3\)$"),
    "cu_k_0d": (dict(cu_seqlens_k=torch.tensor(8, dtype=torch.int32)),
                rf"^cu_seqlens_k: {_OFFSETS}a 0-D torch.int32 tensor of shape \(\)$"),
    "cu_q_int64": (dict(cu_seqlens_q=torch.tensor([0, 3, 8])),
                   rf"^cu_seqlens_q: {_OFFSETS}a 1-D torch.int64 tensor of shape \(3,\) "
                   r"\(convert with .to\(torch.int32\)\)$"),
    "cu_k_int64": (dict(cu_seqlens_k=torch.tensor([0, 3, 8])), rf"^cu_seqlens_k: {_OFFSETS}a 1-D torch.int64"),
    "cu_q_empty": (dict(cu_seqlens_q=torch.zeros(0, dtype=torch.int32)),
                   rf"^cu_seqlens_q: {_OFFSETS}a 1-D torch.int32 tensor of shape \(0,\)$"),
    "cu_q_list": (dict(cu_seqlens_q=[0, 3, 8]), rf"^cu_seqlens_q: {_OFFSETS}list$"),
    "cu_q_meta": (dict(cu_seqlens_q=torch.tensor([0, 3, 8], dtype=torch.int32, device="meta")),
                  r"^cu_seqlens_q: expected the device of q \(cpu\); got meta$"),
    "seqused_2d": (dict(q=torch.zeros(2, 5, 2, 8), cu_seqlens_q=None, seqused_q=torch.ones(2, 1, dtype=torch.int32)),
                   r"^seqused_q: expected None or a 1-D int32 or int64 tensor of 2 lengths \(one per sample\); "
                   r"got a 2-D torch.int32 tensor of shape \(2, 1\)$"),
    "seqused_float": (dict(q=torch.zeros(2, 5, 2, 8), cu_seqlens_q=None, seqused_q=torch.ones(2)),
                      r"^seqused_q: expected None or a 1-D int32 or int64 tensor of 2 lengths .*; "
                      r"got a 1-D torch.float32 tensor of shape \(2,\)$"),
    "seqused_too_short": (dict(q=torch.zeros(2, 5, 2, 8), cu_seqlens_q=None,
                               seqused_q=torch.ones(1, dtype=torch.int32)),
                          r"^seqused_q: expected .* of 2 lengths \(one per sample\); got a 1-D torch.int32 tensor "
                          r"of shape \(1,\)$"),
    "seqused_negative": (dict(q=torch.zeros(2, 5, 2, 8), cu_seqlens_q=None, seqused_q=torch.tensor([2, -1])),
                         r"^seqused_q: expected non-negative lengths; got a minimum of -1$"),
    "nan_scale": (dict(scale=float("nan")), r"^scale: expected a finite number \(not nan or inf\); got nan$"),
    "inf_scale": (dict(scale=float("-inf")), r"^scale: expected a finite number \(not nan or inf\); got -inf$"),
    "inf_post_scale": (dict(post_scale=float("inf")),
                       r"^post_scale: expected a finite number \(not nan or inf\); got inf$"),
    "nan_post_scale": (dict(post_scale=float("nan")),
                       r"^post_scale: expected a finite number \(not nan or inf\); got nan$"),
    "string_causal": (dict(causal="yes"), r"^causal: expected a bool \(True or False\); got 'yes' \(str\)$"),
    "int_causal": (dict(causal=0), r"^causal: expected a bool \(True or False\); got 0 \(int\)$"),
    "tensor_causal": (dict(causal=torch.tensor([True])),
                      r"^causal: expected a bool \(True or False\); got a torch.bool tensor of shape \(1,\)"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_refused_arguments_say_what_was_expected_and_got(case, gen):
    args = _varlen_args(gen)
    change, message = REFUSED[case]
    args.update(change)
    with pytest.raises(ValueError, match=message):
        gdpa_varlen(**args)


def test_causal_takes_numpy_bools(gen):
    np = pytest.importorskip("numpy")
    args = _varlen_args(gen)
    outs = {value: gdpa_varlen(**args, causal=value) for value in (True, False)}
    assert not torch.equal(outs[True], outs[False])
    for value in (True, False):
        assert torch.equal(gdpa_varlen(**args, causal=np.bool_(value)), outs[value])


def test_checks_take_shape_derived_scale_and_causal_under_dynamic_shapes(gen):
    # torch.compile traces them as symbolic floats and bools: checked without a graph break.
    args = _varlen_args(gen)

    def f(q, k, v):
        return gdpa_varlen(q, k, v, args["cu_seqlens_q"], args["cu_seqlens_k"], 5, 5, scale=q.shape[-1] ** -0.5,
                           causal=q.shape[0] > 2)

    torch._dynamo.reset()
    try:
        out = torch.compile(f, backend="eager", fullgraph=True, dynamic=True)(args["q"], args["k"], args["v"])
    finally:
        torch._dynamo.reset()
    assert torch.equal(out, gdpa_varlen(**args, scale=8**-0.5, causal=True))


def test_nested_tensor_through_gdpa_matches_dense_per_sample(gen):
    lengths = [3, 0, 6, 1]
    h, d = 2, 8
    per_sample = [[randn(gen, n, h, d, dtype=torch.float64) for n in lengths] for _ in range(3)]
    nts = [torch.nested.nested_tensor(xs, layout=torch.jagged, requires_grad=True) for xs in per_sample]
    out = gdpa(*(nt.transpose(1, 2) for nt in nts), activation="silu", scale=0.5, causal=True)
    assert out.is_nested and out.shape[0] == len(lengths)
    values = out.transpose(1, 2).values()
    dout = torch.randn(values.shape, dtype=torch.float64, generator=gen)
    grads = torch.autograd.grad(values, nts, dout)
    rows = 0
    for z, n in enumerate(lengths):
        q, k, v = (per_sample[i][z].transpose(0, 1).requires_grad_() for i in range(3))
        p = torch.nn.functional.silu(q @ k.mT * 0.5).tril()
        want = (p @ v).transpose(0, 1)
        assert rel_err(values[rows:rows + n], want) < 1e-12 if n else True
        if n:
            wq, wk, wv = torch.autograd.grad(want, (q, k, v), dout[rows:rows + n])
            for g, w in zip(grads, (wq, wk, wv)):
                assert rel_err(g.values()[rows:rows + n], w.transpose(0, 1)) < 1e-12
        rows += n


@pytest.mark.parametrize("shared", [True, False])
def test_nested_self_attention_passes_one_offsets_tensor(gen, monkeypatch, shared):
    """Queries and keys with one offsets tensor reach the varlen op with one cu_seqlens tensor (the CuTe kernels'
    causal rule asks for that); keys with offsets of their own, even equal ones, with their own."""
    import gdpa_inductor.functional as functional

    seen = []
    monkeypatch.setattr(functional, "varlen_attention", lambda q, k, v, bias, cu_q, cu_k, *a: seen.append(
        (cu_q, cu_k)) or q)
    offsets = torch.tensor([0, 3, 10])
    q, k, v = (torch.nested.nested_tensor_from_jagged(randn(gen, 10, 2, 8), offsets if shared or i == 0
                                                      else offsets.clone()).transpose(1, 2) for i in range(3))
    gdpa(q, k, v, causal=True)
    (cu_q, cu_k), = seen
    assert (cu_q is cu_k) == shared
    assert torch.equal(cu_q, cu_k) and cu_q.dtype == torch.int32


def test_nested_key_with_dense_seed_query_is_pma(gen):
    lengths = [4, 0, 9]
    h, d = 2, 8
    seeds = randn(gen, 1, h, 5, d, dtype=torch.float64)
    kv = [torch.nested.nested_tensor([randn(gen, n, h, d, dtype=torch.float64) for n in lengths],
                                     layout=torch.jagged) for _ in range(2)]
    out = gdpa(seeds, kv[0].transpose(1, 2), kv[1].transpose(1, 2), activation="relu")
    assert out.shape == (3, h, 5, d)
    rows = 0
    for z, n in enumerate(lengths):
        k, v = (x.values()[rows:rows + n].transpose(0, 1) for x in kv)
        want = torch.relu(seeds[0] @ k.mT) @ v
        assert rel_err(out[z], want) < 1e-12 if n else out[z].abs().sum() == 0
        rows += n


def test_nested_with_bias_is_refused(gen):
    nt = torch.nested.nested_tensor([randn(gen, 3, 2, 8)], layout=torch.jagged).transpose(1, 2)
    with pytest.raises(ValueError, match="bias: not supported with NestedTensor"):
        gdpa(nt, nt, nt, bias=torch.zeros(1))


def test_nested_query_with_dense_per_sample_kv_is_pffn(gen):
    """Jagged tokens against dense per-sample weights [B, H, dff, D] (PFFN), no copies."""
    lengths = [3, 0, 6]
    h, d, dff = 2, 8, 5
    q = torch.nested.nested_tensor([randn(gen, n, h, d, dtype=torch.float64) for n in lengths], layout=torch.jagged)
    k, v = (randn(gen, len(lengths), h, dff, d, dtype=torch.float64) for _ in range(2))
    out = gdpa(q.transpose(1, 2), k, v, activation="gelu")
    values = out.transpose(1, 2).values()
    rows = 0
    for z, n in enumerate(lengths):
        qz = q.values()[rows:rows + n].transpose(0, 1)
        want = torch.nn.functional.gelu(qz @ k[z].mT) @ v[z]
        assert n == 0 or rel_err(values[rows:rows + n].transpose(0, 1), want) < 1e-12
        rows += n


def test_nested_key_with_dense_value_is_refused(gen):
    kv = torch.nested.nested_tensor([randn(gen, 3, 2, 8)], layout=torch.jagged).transpose(1, 2)
    with pytest.raises(ValueError, match="key/value: expected both NestedTensors or both dense"):
        gdpa(kv, kv, torch.zeros(1, 2, 3, 8))
