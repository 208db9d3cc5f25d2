"""The ``gdpa`` torch.compile backend: registered through the package's entry point, and compiling (via
Inductor on CPU) to the same results as eager."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch
import torch.nn.functional as F
from gdpa_testing import assert_close_to_reference, randn, reference64

import gdpa_inductor


def _entry_point_installed() -> bool:
    return any(ep.name == "gdpa" for ep in importlib.metadata.entry_points(group="torch_dynamo_backends"))


# Inductor's CPU path goes through torch.jit internals that warn about their own deprecation.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

requires_entry_point = pytest.mark.skipif(
    not _entry_point_installed(),
    reason="the torch_dynamo_backends entry point 'gdpa' is not installed (run `pip install -e .`)",
)


@pytest.fixture
def dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@requires_entry_point
def test_entry_point_targets_the_backend():
    (ep,) = [ep for ep in importlib.metadata.entry_points(group="torch_dynamo_backends") if ep.name == "gdpa"]
    from gdpa_inductor.backend import gdpa_backend

    assert ep.load() is gdpa_backend


@requires_entry_point
def test_listed_by_dynamo(dynamo):
    assert "gdpa" in torch._dynamo.list_backends()


@requires_entry_point
def test_compile_function_using_gdpa(dynamo, gen):
    def attention(q, k, v, bias):
        return gdpa_inductor.gdpa(q, k, v, bias=bias, activation="silu", scale=0.25, post_scale=0.5, causal=True)

    q, k, v = (randn(gen, 2, 2, n, 16) for n in (10, 14, 14))
    bias = randn(gen, 10, 14)
    compiled = torch.compile(attention, backend="gdpa", fullgraph=True)
    out = compiled(q, k, v, bias)
    torch.testing.assert_close(out, attention(q, k, v, bias), rtol=1e-5, atol=1e-5)
    kw = dict(activation="silu", scale=0.25, post_scale=0.5, causal=True)
    assert_close_to_reference(out, reference64(q, k, v, bias, **kw), dtype=torch.float32, what="compiled gdpa")


@requires_entry_point
def test_compile_matmul_gelu_matmul(dynamo, gen):
    """GDPA as a model writes it, no package call in it: the backend must still compile it correctly."""
    def model(q, k, v):
        return F.gelu(q @ k.transpose(-2, -1) * 0.25) @ v

    q, k, v = (randn(gen, 2, 2, n, 16) for n in (10, 14, 14))
    out = torch.compile(model, backend="gdpa", fullgraph=True)(q, k, v)
    torch.testing.assert_close(out, model(q, k, v), rtol=1e-5, atol=1e-5)


def test_mode_and_options_reach_inductor(monkeypatch):
    """``torch.compile(mode=..., options=...)`` with backend="gdpa" configures Inductor as backend="inductor"
    would (a backend that rejected them would fail the user's compile with a TypeError)."""
    from torch._inductor import compile_fx as compile_fx_module

    from gdpa_inductor.backend import gdpa_backend, inductor_config_patches

    assert inductor_config_patches("max-autotune", {"fallback_random": True}) == {
        "max_autotune": True, "triton.cudagraphs": True, "coordinate_descent_tuning": True, "fallback_random": True}
    assert inductor_config_patches(None, None) == {}
    seen = []
    monkeypatch.setattr(compile_fx_module, "compile_fx",
                        lambda gm, inputs, config_patches=None: seen.append(config_patches) or gm.forward)
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    gdpa_backend(gm, [torch.ones(2)], mode="reduce-overhead", options={"fallback_random": True})
    assert seen == [{"triton.cudagraphs": True, "fallback_random": True}]


@requires_entry_point
def test_compile_with_mode_runs(dynamo, gen):
    def model(q, k, v):
        return F.silu(q @ k.transpose(-2, -1) * 0.25) @ v

    q, k, v = (randn(gen, 2, 2, n, 16) for n in (10, 14, 14))
    before = torch._dynamo.utils.counters["gdpa"]["rewrites"]
    out = torch.compile(model, backend="gdpa", mode="max-autotune-no-cudagraphs")(q, k, v)
    torch.testing.assert_close(out, model(q, k, v), rtol=1e-5, atol=1e-5)
    assert torch._dynamo.utils.counters["gdpa"]["rewrites"] == before + 1


@requires_entry_point
def test_a_rewritten_graph_is_not_taken_from_the_autograd_cache(dynamo, gen, monkeypatch, tmp_path):
    """The fused ops choose their launch path when traced, from state that AOT autograd's cache does not key on:
    with the caches on, a plain graph compiled twice comes from that cache the second time, a fused one never."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    counters = torch._dynamo.utils.counters

    def fused(q, k, v):
        return F.silu(q @ k.transpose(-2, -1) * 0.25) @ v

    def plain(q, k, v):
        return F.silu(q * k * 0.25) + v

    q, k, v = (randn(gen, 2, 2, 14, 16).requires_grad_() for _ in range(3))
    with torch._functorch.config.patch(enable_autograd_cache=True), torch._inductor.config.patch(fx_graph_cache=True):
        for fn, hits in ((plain, 1), (fused, 0)):
            counters.clear()
            for _ in range(2):
                torch._dynamo.reset()
                torch.compile(fn, backend="gdpa")(q, k, v).sum().backward()
            assert counters["aot_autograd"]["autograd_cache_hit"] == hits, dict(counters["aot_autograd"])


def test_a_graph_whose_launches_fail_to_compile_is_compiled_with_opaque_calls(dynamo, gen, monkeypatch, caplog):
    """Where Inductor cannot compile a rewritten graph with the fused kernels launched from it, the backend
    compiles it again with every fused call opaque, says so once, and the values are eager's; a graph with no
    rewrite raises as Inductor raised."""
    import gdpa_inductor.backend as backend
    from gdpa_inductor.lowering import direct_launch

    real_compile, launch_states = backend._compile, []

    def compile_failing_with_launches(gm, example_inputs, inner, patches):
        launch_states.append(direct_launch._disabled)
        if not direct_launch._disabled:
            raise RuntimeError("injected failure of the direct launches")
        return real_compile(gm, example_inputs, inner, patches)

    monkeypatch.setattr(backend, "_compile", compile_failing_with_launches)
    q, k, v = (randn(gen, 2, 2, 14, 16) for _ in range(3))
    fn = lambda q, k, v: F.silu(q @ k.transpose(-2, -1) * 0.25) @ v  # noqa: E731
    with caplog.at_level("WARNING", logger="gdpa_inductor"):
        out = torch.compile(fn, backend=backend.gdpa_backend)(q, k, v)
    torch.testing.assert_close(out, fn(q, k, v), rtol=1e-5, atol=1e-5)
    assert launch_states == [False, True]
    assert "compiling them as opaque calls" in caplog.text

    torch._dynamo.reset()
    with pytest.raises(Exception, match="injected failure"):
        torch.compile(lambda x: x.sin() + 1, backend=backend.gdpa_backend, fullgraph=True)(q)
