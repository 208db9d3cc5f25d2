"""A compiled training step on the GPU: the fused ops never synchronize with the host (dense, varlen, forward,
backward, with and without a bias), and CUDA graphs (``mode="reduce-overhead"``) capture them for training and
inference with eager's results."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters

from gdpa_inductor import gdpa, gdpa_varlen
from gdpa_inductor.demo import DemoRecModel, make_batch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = [torch.bfloat16, torch.float32]


class SyncDebugError:
    """``torch.cuda.set_sync_debug_mode("error")`` inside: any host synchronization raises."""

    def __enter__(self):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode("default")


def _leaves(*shapes, dtype):
    gen = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn(s, device="cuda", dtype=dtype, generator=gen).requires_grad_() for s in shapes]


def _backward_of(fn, *args, **kwargs):
    def step():
        out = fn(*args, **kwargs)
        out.backward(torch.ones_like(out))

    return step


def _dense(dtype, bias: bool, causal: bool):
    q, k, v = _leaves((2, 4, 200, 64), (2, 2, 200, 64), (2, 2, 200, 64), dtype=dtype)
    b = _leaves((4, 200, 200), dtype=dtype)[0] if bias else None
    return _backward_of(gdpa, q, k, v, activation="silu", bias=b, causal=causal, scale=0.125)


def _varlen(dtype, padded: bool):
    if padded:
        used = torch.tensor([37, 163, 128], device="cuda", dtype=torch.int32)
        q, k, v = _leaves(*[(3, 163, 4, 64)] * 3, dtype=dtype)
        return _backward_of(gdpa_varlen, q, k, v, None, None, 163, 163, seqused_q=used, seqused_k=used,
                            activation="gelu_tanh", causal=True)
    lengths = torch.tensor([0, 37, 200, 328], device="cuda", dtype=torch.int32)
    q, k, v = _leaves(*[(328, 4, 64)] * 3, dtype=dtype)
    return _backward_of(gdpa_varlen, q, k, v, lengths, lengths, 163, 163, activation="gelu_tanh", causal=True)


CASES = {
    "dense": lambda dtype: _dense(dtype, bias=False, causal=False),
    "dense_bias_causal": lambda dtype: _dense(dtype, bias=True, causal=True),
    "varlen": lambda dtype: _varlen(dtype, padded=False),
    "varlen_padded": lambda dtype: _varlen(dtype, padded=True),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES)
def test_the_ops_never_synchronize(case, dtype):
    step = CASES[case](dtype)
    step()  # compiles the kernels
    with SyncDebugError():
        step()
    torch.cuda.synchronize()


def _demo(dtype, batch=8, seq=64, dim=128):
    torch.manual_seed(0)
    model = DemoRecModel(dim, 4, seeds=4, dff=16, max_len=seq).to("cuda", dtype)
    return model, make_batch(batch, seq, dim, "cuda", dtype)


def _loss(model, inputs):
    return model(*inputs).float().square().mean()


def test_a_compiled_training_step_never_synchronizes():
    torch._dynamo.reset()
    model, inputs = _demo(torch.bfloat16)
    compiled = torch.compile(model, backend="gdpa")
    for _ in range(2):
        _loss(compiled, inputs).backward()
    assert counters["gdpa"]["rewrites"] >= 3
    with SyncDebugError():
        _loss(compiled, inputs).backward()
    torch.cuda.synchronize()


def _sgd_losses(model, inputs, steps: int, cudagraph: bool) -> list[torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        if cudagraph:
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        loss = _loss(model, inputs)
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    return losses


def test_cuda_graphs_train_as_eager():
    """fp32 (IEEE dots in the fused kernels): the compiled, graph-replayed steps follow eager's losses."""
    torch._dynamo.reset()
    counters.clear()
    model, inputs = _demo(torch.float32)
    eager = _sgd_losses(copy.deepcopy(model), inputs, 5, cudagraph=False)
    compiled = torch.compile(model, backend="gdpa", mode="reduce-overhead")
    graphed = _sgd_losses(compiled, inputs, 5, cudagraph=True)
    assert counters["gdpa"]["rewrites"] >= 3
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    for e, g in zip(eager, graphed):
        assert abs(g.item() - e.item()) <= 1e-4 * abs(e.item())
    assert graphed[-1] < graphed[0]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_graphs_infer_as_eager(dtype):
    """Against a float64 run of the same model: within 2x eager's own error in this dtype, plus a small floor."""
    torch._dynamo.reset()
    counters.clear()
    model, inputs = _demo(dtype)
    with torch.no_grad():
        reference = copy.deepcopy(model).double()(*[t.double() if t.is_floating_point() else t for t in inputs])
        expected = model(*inputs)
        compiled = torch.compile(model, backend="gdpa", mode="reduce-overhead")
        for _ in range(3):
            torch.compiler.cudagraph_mark_step_begin()
            out = compiled(*inputs).clone()
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    eager_err, err = _rel(expected, reference), _rel(out, reference)
    floor = 1e-5 if dtype == torch.float32 else 2e-3
    assert err <= 2 * eager_err + floor, f"{err:.2e} > 2 x eager {eager_err:.2e} + {floor}"


def _rel(x: torch.Tensor, reference: torch.Tensor) -> float:
    return ((x.double() - reference).norm() / reference.norm()).item()
