"""The eager fast path: plain eager calls skip the custom ops' Python wrappers but give exactly what the ops
give (same implementations), and every call that traces still sees the custom ops."""

from __future__ import annotations

import pytest
import torch
from gdpa_testing import randn
from torch.fx.experimental.proxy_tensor import make_fx
from varlen_testing import LAYOUTS, make_case

from gdpa_inductor import gdpa, gdpa_varlen
from gdpa_inductor.lowering import eager, ops, varlen_ops

F64 = torch.float64

DENSE_CASES = {
    "bias_causal": ((2, 2, 6, 8), (2, 2, 9, 8), (2, 2, 9, 12), (2, 2, 6, 9), True),
    "gqa_head_bias": ((2, 4, 6, 8), (2, 2, 7, 8), (2, 2, 7, 8), (4, 1, 7), False),
    "pma_no_bias": ((1, 2, 5, 8), (3, 2, 7, 8), (3, 2, 7, 8), None, False),
}


def _dense(gen, case):
    qs, ks, vs, bs, causal = DENSE_CASES[case]
    q, k, v = (randn(gen, *s, dtype=F64).requires_grad_() for s in (qs, ks, vs))
    bias = randn(gen, *bs, dtype=F64, scale=0.5).requires_grad_() if bs is not None else None
    return q, k, v, bias, causal


def _leaves(*tensors):
    return [t for t in tensors if t is not None]


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "relu_square"])
@pytest.mark.parametrize("case", list(DENSE_CASES))
def test_dense_fast_path_equals_the_custom_op(case, activation, gen):
    q, k, v, bias, causal = _dense(gen, case)
    fast = gdpa(q, k, v, bias=bias, activation=activation, scale=0.4, post_scale=0.7, causal=causal)
    assert type(fast.grad_fn).__name__ == "EagerAttentionBackward", "plain eager tensors must take the fast path"
    op = ops.attention_fwd(q, k, v, bias, activation, 0.4, 0.7, causal, 0.01)
    assert "gdpa_attention_fwd_v1" in type(op.grad_fn).__name__
    dout = randn(gen, *fast.shape, dtype=F64)
    leaves = _leaves(q, k, v, bias)
    assert torch.equal(fast, op)
    for name, a, b in zip("q k v bias".split(), torch.autograd.grad(fast, leaves, dout),
                          torch.autograd.grad(op, leaves, dout)):
        assert torch.equal(a, b), f"d{name}"


def _varlen_bias(case, q, gen):
    kw = case.kwargs
    max_q = kw["max_seqlen_q"] if kw["cu_seqlens_q"] is not None else q.shape[1]
    max_k = kw["max_seqlen_k"] if kw["cu_seqlens_k"] is not None else case.k.shape[1]
    return torch.randn(q.shape[-2], max_q, max_k, generator=gen, dtype=F64).requires_grad_()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_varlen_fast_path_equals_the_custom_op(layout, gen):
    case = make_case(layout, gen)
    q, k, v = case.inputs(F64)
    bias = _varlen_bias(case, q, gen)
    kw = case.kwargs
    fast = gdpa_varlen(q, k, v, kw["cu_seqlens_q"], kw["cu_seqlens_k"], kw["max_seqlen_q"], kw["max_seqlen_k"],
                       activation="silu", scale=0.3, post_scale=0.7, causal=True, window=(3, None),
                       seqused_q=kw["seqused_q"], seqused_k=kw["seqused_k"], bias=bias)
    assert type(fast.grad_fn).__name__ == "EagerAttentionBackward"
    op = varlen_ops.varlen_fwd(q, k, v, bias, kw["cu_seqlens_q"], kw["cu_seqlens_k"], kw["seqused_q"],
                               kw["seqused_k"], kw["max_seqlen_q"], kw["max_seqlen_k"], "silu", 0.3, 0.7, True, 3,
                               -1, 0.01)
    dout = randn(gen, *fast.shape, dtype=F64)
    assert torch.equal(fast, op)
    for name, a, b in zip("q k v bias".split(), torch.autograd.grad(fast, (q, k, v, bias), dout),
                          torch.autograd.grad(op, (q, k, v, bias), dout)):
        assert torch.equal(a, b), f"d{name}"


def test_no_grad_calls_build_no_graph(gen):
    q, k, v, bias, causal = _dense(gen, "bias_causal")
    with torch.no_grad():
        out = gdpa(q, k, v, bias=bias, causal=causal)
    assert out.grad_fn is None and not out.requires_grad
    assert torch.equal(out, ops.attention_fwd(q, k, v, bias, "gelu_tanh", 1.0, 1.0, causal, 0.01))


@pytest.mark.parametrize("path", ["eager_fast_path", "custom_op"])
def test_double_backward_raises_instead_of_a_silent_zero(path, gen):
    """The backward kernels are not differentiable; both paths say so rather than return zeros."""
    q, k, v, _, _ = _dense(gen, "pma_no_bias")
    if path == "custom_op":
        out = ops.attention_fwd(q, k, v, None, "silu", 1.0, 1.0, False, 0.01)
    else:
        out = gdpa(q, k, v, activation="silu")
    (dq,) = torch.autograd.grad((out**2).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice|no autograd formula"):
        dq.sum().backward()


def _op_names(gm: torch.fx.GraphModule) -> set[str]:
    return {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}


def test_make_fx_traces_the_custom_ops(gen):
    q, k, v, bias, causal = _dense(gen, "bias_causal")
    gm = make_fx(lambda q, k, v, b: gdpa(q, k, v, bias=b, causal=True))(q, k, v, bias)
    assert "gdpa.attention_fwd_v1.default" in _op_names(gm)
    case = make_case("self", gen)
    kw = case.kwargs
    gm = make_fx(lambda q, k, v, cu: gdpa_varlen(q, k, v, cu, cu, kw["max_seqlen_q"], kw["max_seqlen_q"]))(
        *case.inputs(F64), kw["cu_seqlens_q"])
    assert "gdpa.varlen_fwd_v2.default" in _op_names(gm)


def test_dynamo_traces_the_custom_op(gen):
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm

    q, k, v, bias, causal = _dense(gen, "gqa_head_bias")
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v, b: gdpa(q, k, v, bias=b, activation="relu"), backend=capture,
                             fullgraph=True)
    out = compiled(q, k, v, bias)
    assert len(graphs) == 1 and "gdpa.attention_fwd_v1.default" in _op_names(graphs[0])
    assert torch.equal(out, gdpa(q, k, v, bias=bias, activation="relu"))


@pytest.mark.parametrize("context", ["fake_tensor_mode", "vmap", "tensor_subclass"])
def test_plain_eager_is_false_whenever_something_traces(context, gen):
    x = randn(gen, 2, 3, dtype=F64)
    assert eager.plain_eager(x, None, torch.nn.Parameter(x))
    if context == "fake_tensor_mode":
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            assert not eager.plain_eager(torch.empty(2))
    elif context == "vmap":
        seen = []
        torch.vmap(lambda row: seen.append(eager.plain_eager(row)) or row)(x)
        assert seen == [False]
    else:
        class Subclass(torch.Tensor):
            pass

        assert not eager.plain_eager(x, torch.Tensor._make_subclass(Subclass, x))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fast_path_equals_the_custom_ops_on_the_gpu(gen):
    """The Triton kernels behind both paths, bf16: identical forwards and gradients (dq/dk/dv have no
    atomics; the shared bias's gradient is summed in an order that may differ)."""
    dev, bf16 = torch.device("cuda"), torch.bfloat16
    q, k, v = (randn(gen, 3, 2, 300, 64, dtype=bf16).to(dev).requires_grad_() for _ in range(3))
    bias = randn(gen, 2, 300, 300, dtype=bf16).to(dev).requires_grad_()
    fast = gdpa(q, k, v, bias=bias, activation="silu", scale=0.125, causal=True)
    op = ops.attention_fwd(q, k, v, bias, "silu", 0.125, 1.0, True, 0.01)
    assert type(fast.grad_fn).__name__ == "EagerAttentionBackward" and torch.equal(fast, op)
    dout = torch.randn_like(fast)
    for name, a, b in zip("q k v bias".split(), torch.autograd.grad(fast, (q, k, v, bias), dout),
                          torch.autograd.grad(op, (q, k, v, bias), dout)):
        exact = name != "bias"
        torch.testing.assert_close(a, b, rtol=0 if exact else None, atol=0 if exact else None, msg=f"d{name}")
    case = make_case("self", gen, lq=[300, 0, 1, 129, 64]).to(dev)
    qj, kj, vj = case.inputs(bf16)
    cu, longest = case.kwargs["cu_seqlens_q"], case.kwargs["max_seqlen_q"]
    fast = gdpa_varlen(qj, kj, vj, cu, cu, longest, longest, activation="gelu_tanh", scale=0.25, causal=True)
    op = varlen_ops.varlen_fwd(qj, kj, vj, None, cu, cu, None, None, longest, longest, "gelu_tanh", 0.25, 1.0, True,
                               -1, -1, 0.01)
    assert type(fast.grad_fn).__name__ == "EagerAttentionBackward" and torch.equal(fast, op)
    dout = torch.randn_like(fast)
    for a, b in zip(torch.autograd.grad(fast, (qj, kj, vj), dout), torch.autograd.grad(op, (qj, kj, vj), dout)):
        assert torch.equal(a, b)
