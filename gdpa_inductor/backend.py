"""The ``gdpa`` torch.compile backend (registered through the ``torch_dynamo_backends`` entry point).

``gdpa_backend`` rewrites every GDPA subgraph of Dynamo's graph into the fused op
(``gdpa_inductor.patterns``), then hands the graph to Inductor's ``compile_fx``, which compiles everything
else exactly as ``backend="inductor"`` would. The rewrite happens before AOT autograd, so the fused op's
registered autograd supplies the backward, and the FX graph / AOT autograd caches key on the rewritten
graph (a change of the pass changes the graph; a change of the op's semantics changes its versioned name).
"""

from __future__ import annotations

import contextlib
import logging

import torch

log = logging.getLogger("gdpa_inductor")


def gdpa_backend(gm: torch.fx.GraphModule, example_inputs, *, inner: str = "inductor", mode: str | None = None,
                 options: dict | None = None):
    """Rewrites GDPA subgraphs, then compiles with Inductor (``inner="aot_eager"`` runs AOT autograd
    without Inductor: used by tests that check the rewrite's numerics cheaply).

    ``mode`` and ``options`` are ``torch.compile``'s, passed on to Inductor as ``backend="inductor"`` takes
    them (``mode="max-autotune"``, ``options={"triton.cudagraphs": True}``, ...).
    """
    # Imported here: the pass needs Inductor's pattern matcher, and importing Dynamo imports Triton, which a
    # plain `import gdpa_inductor` should not.
    from torch._dynamo.utils import counters

    from .patterns.rewrite import rewrite_gdpa

    rewrites = 0
    try:
        rewrites = sum(r.matched for r in rewrite_gdpa(gm, example_inputs))
    except Exception:  # a bug in the pass must never break the user's compile: compile unfused
        log.exception("gdpa: the GDPA pass failed; compiling the graph unchanged")
    patches = inductor_config_patches(mode, options)
    try:
        with _autograd_cache_off(rewrites):
            compiled = _compile(gm, example_inputs, inner, patches)
    except Exception as e:
        if not rewrites:
            raise
        from .lowering import direct_launch

        # the fused ops' own launches are what Inductor compiles beyond a plain graph: retry with opaque calls
        log.warning("gdpa: Inductor could not compile the graph with the fused kernels launched from it (%s: %s); "
                    "compiling them as opaque calls", type(e).__name__, str(e).splitlines()[0][:300] if str(e) else "")
        with direct_launch.disabled(), _autograd_cache_off(rewrites):
            compiled = _compile(gm, example_inputs, inner, patches)
    # Counted once the compile returned: Dynamo may restart a backend call (and discard its graph).
    counters["gdpa"]["rewrites"] += rewrites
    return compiled


def _autograd_cache_off(rewrites: int):
    """The fused ops decide when they are traced whether the graph launches their kernels itself
    (``lowering/direct_launch.py``), from state that AOT autograd's cache does not key on (``config.backend``, the
    CuTe stack): a rewritten graph is never taken from that cache. Inductor's own cache keys on the traced graph,
    which shows the decision."""
    if not rewrites:
        return contextlib.nullcontext()
    return torch._functorch.config.patch(enable_autograd_cache=False)


def inductor_config_patches(mode: str | None, options: dict | None) -> dict:
    """Inductor's config for ``torch.compile(mode=..., options=...)``, as its own backend derives it."""
    from torch._inductor import list_mode_options

    patches = dict(list_mode_options(mode)) if mode else {}
    patches.update(options or {})
    return patches


def _compile(gm, example_inputs, inner: str, config_patches: dict):
    if inner == "aot_eager":
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.aot_autograd import make_boxed_compiler

        def nop(g, _):
            return g

        return aot_autograd(fw_compiler=make_boxed_compiler(nop))(gm, example_inputs)
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs, config_patches=config_patches or None)


def install() -> None:
    """Makes ``backend="gdpa"`` resolvable when the package runs from a checkout (PYTHONPATH) rather than
    an install: an installed package is found through its entry point, and registering the same name
    twice would fail Dynamo's duplicate check."""
    from importlib.metadata import entry_points

    if any(ep.name == "gdpa" for ep in entry_points(group="torch_dynamo_backends")):
        return
    # Only a checkout gets here: registering needs Dynamo's registry, whose import also imports Triton.
    from torch._dynamo.backends.registry import list_backends, register_backend

    if "gdpa" not in list_backends(exclude_tags=()):
        register_backend(compiler_fn=gdpa_backend, name="gdpa")
