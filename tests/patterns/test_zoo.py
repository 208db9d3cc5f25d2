"""Every zoo model compiled with the GDPA pass (``gdpa_backend(inner="aot_eager")``): the expected number
of rewrites, and the eager results (outputs and every input/parameter gradient).

Axes: zoo entry x {train, infer} x {fp32, bf16 autocast} x {static, dynamic}. "train" means forward +
backward with a fixed random dO (the module's own train/eval mode is left as its factory set it, so that
an eval-mode dropout stays eval); the rewrite count must be the same (AOT autograd must not count twice).
fp32 is compared to eager fp32 (relative norm error <= 1e-5); bf16 autocast compares both the compiled and
the eager-autocast run to an eager float64 run and requires compiled error <= 2 x eager error + 1e-3.

Every axis runs on every model (about 75 s for this file with ``pytest -n 2`` on 2 CPU cores: each compile
is AOT autograd without Inductor on tiny shapes), so no subset is needed.

Negative models: 0 rewrites, the eager outputs, and the rejection reason in rewrite_gdpa's reports.
"""

from __future__ import annotations

import pytest
import torch
from harness import AOT_EAGER_GDPA, Recorder, as_float64, assert_bf16_close, assert_fp32_close, reset, rewrites, run
from zoo import GDPA_THEN_SOFTMAX, NEGATIVE, ZOO, build

# The Inductor CPU path goes through torch.jit internals that warn about their own deprecation.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


@pytest.mark.parametrize("shapes", ["static", "dynamic"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["train", "infer"])
@pytest.mark.parametrize("entry", ZOO, ids=lambda e: e.name)
def test_zoo(entry, mode, precision, shapes):
    model, inputs = build(entry)
    train, autocast, dynamic = mode == "train", precision == "bf16", shapes == "dynamic"
    eager = run(model, inputs, train=train, autocast=autocast)
    reset()
    got = run(model, inputs, train=train, autocast=autocast, compile_with=AOT_EAGER_GDPA, dynamic=dynamic)
    what = f"{entry.name} [{mode}, {precision}, {shapes}]"
    count = rewrites()
    # numerics first, so that a failure reports both a wrong count and wrong numbers
    errors = []
    try:
        if autocast:
            ref64 = run(*as_float64(model, inputs), train=train)
            assert_bf16_close(got, eager, ref64, what)
        else:
            assert_fp32_close(got, eager, what)
    except AssertionError as e:
        errors.append(str(e))
    expected = entry.dynamic_rewrites if dynamic and entry.dynamic_rewrites is not None else entry.rewrites
    if count != expected:
        errors.append(f"{what}: {count} rewrites, expected {expected}")
    assert not errors, "\n".join(errors)


def _eager_and_compiled(entry, mode):
    """(eager outputs, compiled outputs, recorder with the pass's reports) for one zoo entry."""
    model, inputs = build(entry)
    train = mode == "train"
    eager = run(model, inputs, train=train)
    reset()
    recorder = Recorder(then_backend=True)
    return eager, run(model, inputs, train=train, compile_with=recorder), recorder


@pytest.mark.parametrize("mode", ["train", "infer"])
@pytest.mark.parametrize("entry", NEGATIVE, ids=lambda e: e.name)
def test_negative(entry, mode):
    eager, got, recorder = _eager_and_compiled(entry, mode)
    assert rewrites() == 0, f"{entry.name}: rewritten, but it is not GDPA"
    assert not [r for r in recorder.reports if r.matched], [str(r) for r in recorder.reports]
    assert got.keys() == eager.keys()
    for key in eager:
        torch.testing.assert_close(got[key], eager[key], equal_nan=True,
                                   msg=lambda m, key=key: f"{entry.name} {key}: {m}")
    if entry.reason is not None:
        reasons = [r.reason for r in recorder.reports]
        assert any(entry.reason in r for r in reasons), f"{entry.name}: no reason mentions {entry.reason!r}: {reasons}"


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_gdpa_block_is_fused_not_the_matmul_after_it(mode):
    """The gelu block is the GDPA subgraph; (P V) Memᵀ is two plain GEMMs and must not be taken as an
    identity-activation GDPA instead (that would leave the gelu block unfused)."""
    entry = GDPA_THEN_SOFTMAX
    eager, got, recorder = _eager_and_compiled(entry, mode)
    assert_fp32_close(got, eager, entry.name)
    assert rewrites() == entry.rewrites
    fused = [r for r in recorder.reports if r.matched]
    assert [r.details["activation"] for r in fused] == ["gelu"], [str(r) for r in recorder.reports]
