"""The first-use self-check (``lowering/self_check.py``) on its own: the comparison against the trusted outputs
(each of a backward's gradients too), the verdict kept per variant, and no check while a CUDA graph is captured."""

from __future__ import annotations

import pytest
import torch

from gdpa_inductor.kernels.reference import gdpa_reference, gdpa_reference_backward
from gdpa_inductor.lowering import self_check


@pytest.fixture(autouse=True)
def no_verdicts_yet(monkeypatch):
    monkeypatch.setattr(self_check, "_verdicts", {})


def _backward_check(gen, spoil=None, trusted_raises=False) -> self_check.Check:
    """A backward variant's check: (dq, dk, dv) of the reference in bf16 against themselves, ``spoil`` applied to
    the candidate's."""

    def cases():
        for nq, nk in ((65, 77), (130, 200)):
            q, do = (torch.randn(1, 2, nq, 64, generator=gen).bfloat16() for _ in range(2))
            k, v = (torch.randn(1, 2, nk, 64, generator=gen).bfloat16() for _ in range(2))
            yield do, q, k, v

    def grads(do, q, k, v):
        return gdpa_reference_backward(do, q, k, v, None, "gelu_tanh", 0.125, 1.0, False, 0.01, False)[:3]

    def trusted(*args):
        if trusted_raises:
            raise RuntimeError("no trusted kernel")
        return grads(*args)

    def candidate(*args):
        got = tuple(g.clone() for g in grads(*args))
        if spoil:
            spoil(got)
        return got

    return self_check.Check("a backward stand-in", candidate, trusted, grads, cases, outputs=("dq", "dk", "dv"))


def _scale_dk(grads):
    grads[1].mul_(1.02)


def _inf_in_dv(grads):
    grads[2][0, 0, 0, 0] = float("inf")


@pytest.mark.parametrize("spoil, why", [(None, ""), (_scale_dk, "dk's relative error to Triton's is 0.0"),
                                        (_inf_in_dv, "dv has NaN or Inf where Triton's has not")])
def test_every_gradient_of_a_backward_is_compared(gen, spoil, why):
    ok, reason = self_check.run_check(_backward_check(gen, spoil))
    assert ok == (why == "") and why in reason
    assert ok or reason.startswith("a backward stand-in failed its first-use self-check against Triton: ")


def test_a_check_that_cannot_run_the_trusted_kernel_fails(gen):
    ok, reason = self_check.run_check(_backward_check(gen, trusted_raises=True))
    assert not ok and "could not run Triton or the float64 math (RuntimeError: no trusted kernel)" in reason


def test_inf_where_the_trusted_output_has_it_passes():
    t = torch.tensor([1.0, float("inf"), -2.0, 3.0])
    assert self_check.mismatch(t.clone(), t, t.double(), ("out",), "Triton") == ""
    flipped = t.clone()
    flipped[1] = -flipped[1]
    assert "NaN or Inf" in self_check.mismatch(flipped, t, t.double(), ("out",), "Triton")


def test_the_verdict_is_kept_per_variant(gen):
    built = []

    def make(spoil):
        def build():
            built.append(spoil)
            return _backward_check(gen, spoil)
        return build

    assert self_check.verdict("good", make(None)) == (True, "")
    assert not self_check.verdict("bad", make(_scale_dk))[0]
    for _ in range(3):
        assert self_check.verdict("good", make(_scale_dk)) == (True, "")
        assert not self_check.verdict("bad", make(None))[0]
    assert built == [None, _scale_dk]
    assert self_check.failed("bad") and not self_check.failed("good") and not self_check.failed("unseen")


def test_no_check_while_a_cuda_graph_is_captured(monkeypatch, gen):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    ok, reason = self_check.verdict("good", lambda: _backward_check(gen))
    assert not ok and "CUDA graph" in reason and self_check._verdicts == {}


def test_a_forward_variant_matches_the_reference_in_its_dtype(gen):
    """The bound passes a correct result rounded apart from the trusted one (the float64 math rounded to bf16)."""
    def cases():
        yield tuple(torch.randn(2, 4, 200, 64, generator=gen).bfloat16() for _ in range(3))

    def forward(q, k, v):
        return gdpa_reference(q, k, v, None, "silu", 0.125)

    check = self_check.Check("a forward stand-in", lambda *a: forward(*(t.double() for t in a)).bfloat16(),
                             forward, forward, cases)
    assert self_check.run_check(check) == (True, "")
