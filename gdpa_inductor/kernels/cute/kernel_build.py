"""The compiled CuTe-DSL kernels: one build per plan (``FwdPlan``, ``BwdPlan``, ``Sm100FwdPlan``, ``Sm100BwdPlan``:
the plan is the compile key), compiled against its argument schema's fakes (``kernel_args``), which needs no GPU
(target sm_90a, or the Blackwell kernels' sm_100a: each build names its target to the compile and to the cache),
and cached in memory and on disk (``compile_cache``): sizes and strides are runtime values, so every shape reuses a
build. cutlass-dsl is imported here, lazily: the package works without it."""

from __future__ import annotations

import torch

from .bwd_plan import BwdPlan, Sm100BwdPlan
from .compile_cache import cached_compile
from .fwd_plan import FwdPlan, Sm100FwdPlan
from .kernel_args import BWD_ARGS, BWD_SM100_ARGS, FWD_ARGS, FWD_SM100_ARGS, WIDE_BWD_ARGS, compile_options, element


def compile_fwd(plan: FwdPlan, keep_ptx: bool = False):
    """The compiled forward (``GdpaFwdSm90``) of ``plan``, called with ``FWD_ARGS.values(plan, ...)``.
    ``keep_ptx`` keeps the PTX in ``.artifacts`` (compile checks; such builds stay in memory)."""
    def build():
        import cutlass.cute as cute

        from . import activation_math
        from .gdpa_fwd_sm90 import GdpaFwdSm90

        kernel = GdpaFwdSm90(
            element(plan.dtype), plan.head_dim, plan.head_dim_v,
            activation_math.forward_form(plan.activation, plan.packed), tile_n=plan.tile_n,
            kv_stages=plan.kv_stages, pingpong=plan.pingpong, split_store=plan.split_store,
            mask_keys=plan.mask_keys, q_stages=plan.q_stages, o_from_registers=plan.o_from_registers,
            varlen=plan.varlen, causal=plan.causal, band=plan.band, score_offset=plan.score_offset,
            score_bias=plan.score_bias,
        )
        return cute.compile(kernel, *FWD_ARGS.fakes(plan), options=compile_options(keep_ptx))

    return cached_compile((plan, keep_ptx), build, persist=not keep_ptx)


def compile_fwd_sm100(plan: Sm100FwdPlan, keep_ptx: bool = False):
    """The compiled Blackwell forward (``GdpaFwdSm100``) of ``plan``, for ``plan.target``, called with
    ``FWD_SM100_ARGS.values(plan, ...)`` on [Z, H, N, D] operands in ``dense_modes`` with Nk >= 1, or a varlen
    batch's sides in ``row_modes``. No Blackwell GPU in this project's tests has run it: the dispatch self-checks
    each build first (``lowering/sm100_forward.py``, ``sm100_varlen_forward.py``). ``keep_ptx`` as for
    ``compile_fwd``."""
    def build():
        import cutlass.cute as cute

        from . import activation_math
        from .gdpa_fwd_sm100 import GdpaFwdSm100

        kernel = GdpaFwdSm100(
            element(plan.dtype), plan.head_dim, plan.head_dim_v, activation_math.forward_form(plan.activation, False),
            tile_n=plan.tile_n, kv_stages=plan.kv_stages, mask_keys=plan.mask_keys, causal=plan.causal,
            window=plan.window, bias=element(getattr(torch, plan.bias)) if plan.bias else None, varlen=plan.varlen,
            q_stages=plan.q_stages,
        )
        return cute.compile(kernel, *FWD_SM100_ARGS.fakes(plan), options=compile_options(keep_ptx, plan.target))

    return cached_compile((plan, keep_ptx), build, persist=not keep_ptx, target=plan.target)


def compile_bwd_sm100(plan: Sm100BwdPlan, keep_ptx: bool = False):
    """The compiled Blackwell backward (``GdpaBwdSm100``) of ``plan``, for ``plan.target``, called with
    ``BWD_SM100_ARGS.values(plan, ...)`` on [Z, H, N, D] operands in ``dense_modes`` with Nq, Nk >= 1 and dQ's
    zeroed fp32 sums. No Blackwell GPU in this project's tests has run it: the dispatch self-checks each build first
    (``lowering/sm100_backward.py``). ``keep_ptx`` as for ``compile_fwd``."""
    def build():
        import cutlass.cute as cute

        from . import activation_math
        from .gdpa_bwd_sm100 import GdpaBwdSm100

        kernel = GdpaBwdSm100(
            element(plan.dtype), plan.head_dim, plan.head_dim_v, activation_math.backward_form(plan.activation, False),
            q_stages=plan.q_stages, mask_queries=plan.mask_queries, causal=plan.causal, window=plan.window,
            varlen=plan.varlen, bias=element(getattr(torch, plan.bias)) if plan.bias else None,
            bias_grad=plan.bias_grad,
        )
        return cute.compile(kernel, *BWD_SM100_ARGS.fakes(plan), options=compile_options(keep_ptx, plan.target))

    return cached_compile((plan, keep_ptx), build, persist=not keep_ptx, target=plan.target)


def compile_bwd(plan: BwdPlan, keep_ptx: bool = False):
    """The compiled backward of ``plan`` (``GdpaBwdSm90``, or ``GdpaBwdWideSm90`` past head dims of 128), called
    with ``bwd_args(plan).values(plan, ...)``. ``keep_ptx`` as for ``compile_fwd``."""
    def build():
        import cutlass
        import cutlass.cute as cute

        from . import activation_math
        from .gdpa_bwd_sm90 import GdpaBwdSm90
        from .gdpa_bwd_wide_sm90 import GdpaBwdWideSm90

        dq_element = cutlass.Float32 if plan.dq_sums == "fp32" else element(plan.dtype)
        form = activation_math.backward_form(plan.activation, plan.packed)
        if plan.wide:
            kernel = GdpaBwdWideSm90(element(plan.dtype), plan.head_dim, plan.head_dim_v, form, dq_element,
                                     varlen=plan.varlen, score_offset=plan.score_offset)
        else:
            kernel = GdpaBwdSm90(
                element(plan.dtype), plan.head_dim, plan.head_dim_v, form, dq_element, dq_late=plan.dq_late,
                varlen=plan.varlen, causal=plan.causal, band=plan.band, score_offset=plan.score_offset,
                score_bias=plan.score_bias, bias_grad=plan.bias_grad, dbias_atomic=plan.dbias_atomic,
                tile_m=plan.query_tile, dq_last_round=plan.dq_last_round,
            )
        return cute.compile(kernel, *bwd_args(plan).fakes(plan), options=compile_options(keep_ptx))

    return cached_compile((plan, keep_ptx), build, persist=not keep_ptx)


def bwd_args(plan: BwdPlan):
    """The argument schema of ``plan``'s backward kernel."""
    return WIDE_BWD_ARGS if plan.wide else BWD_ARGS
