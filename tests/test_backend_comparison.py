"""``compare_backends``: same weights and batches under every backend, losses side by side, errors reported."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch._dynamo.testing import CompileCounter

from gdpa_inductor.backend_comparison import BackendRun, Comparison, compare_backends


def _loss(model, batch):
    x, y = batch
    return (model(x) - y).square().mean()


def _setup(gen):
    model = nn.Sequential(nn.Linear(8, 16), nn.SiLU(), nn.Linear(16, 1))
    batches = [(torch.randn(32, 8, generator=gen), torch.randn(32, 1, generator=gen)) for _ in range(3)]
    return model, batches


def test_every_backend_trains_the_same_copy(gen):
    model, batches = _setup(gen)
    before = [p.detach().clone() for p in model.parameters()]
    comparison = compare_backends(model, batches, _loss, backends=("eager", "aot_eager"), lr=0.1,
                                  progress=lambda _: None)
    # The caller's model is never trained: each backend starts from the same weights.
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    eager, aot = comparison.runs["eager"].losses, comparison.runs["aot_eager"].losses
    assert len(eager) == 3 and eager[2] < eager[0]  # lr 0.1 on a least-squares fit: the loss goes down
    torch.testing.assert_close(aot, eager, rtol=1e-6, atol=0)
    assert comparison.loss_rel_diff("aot_eager") < 1e-6
    assert comparison.speedup("aot_eager") is None  # no timing on CPU
    assert "aot_eager vs eager: largest per-step loss difference" in str(comparison)


def test_out_of_memory_is_reported_not_raised(gen):
    model, batches = _setup(gen)

    def out_of_memory(m, batch):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")

    comparison = compare_backends(model, batches, out_of_memory, backends=("eager",), progress=lambda _: None)
    assert comparison.runs["eager"].error.startswith("out of memory (CUDA out of memory. Tried to allocate 9.00")
    assert "out of memory" in str(comparison)


def test_speedup_and_table():
    runs = {"inductor": BackendRun("inductor", [1.0, 0.5], step_ms=30.0),
            "gdpa": BackendRun("gdpa", [1.0, 0.501], step_ms=20.0)}
    comparison = Comparison(runs)
    assert comparison.speedup() == 1.5
    assert abs(comparison.loss_rel_diff() - 0.002) < 1e-12
    assert "| gdpa | 0.0 | 1 → 0.501 | 20.00 |" in str(comparison)
    assert "step 1.50x faster" in str(comparison)


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 1)

    def forward(self, x):
        return self.b(torch.nn.functional.silu(self.a(x)))


def test_the_users_compiled_model_is_left_alone(gen):
    """The comparison compiles copies of the model on their own code: the user's compiled model keeps its graph (no
    recompile at its next call) and the comparison leaves no cache entry on the model's code."""
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

    model, batches = TwoLayers(), _setup(gen)[1]
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter)
    compiled(batches[0][0])
    entries = [e.compile_id for e in _debug_get_cache_entry_list(TwoLayers.forward.__code__)]
    assert counter.frame_count == 1 and len(entries) == 1

    compare_backends(model, batches, _loss, backends=("eager", "aot_eager"), progress=lambda _: None)
    assert [e.compile_id for e in _debug_get_cache_entry_list(TwoLayers.forward.__code__)] == entries
    compiled(batches[0][0])
    assert counter.frame_count == 1, "the user's compiled model recompiled after the comparison"
