"""How the CuTe launchers hand tensors to the compiled kernels: compiled once against fake tensors through
TVM-FFI (``--enable-tvm-ffi``), called with torch tensors.

cutlass-dsl's default calling path converts each tensor with ``from_dlpack`` and ``mark_layout_dynamic`` and
marshals every argument in Python: 18-28 µs a tensor and 11 µs a call on a 2-core EPYC, 150-500 µs a launch of
four to eight tensors with the launcher's own work, longer than the kernel at short sequences. Through TVM-FFI the
compiled function takes the torch tensors themselves and checks and converts them in C (about 3 µs a call), on
the caller's current torch stream. The kernel is compiled against fake tensors of the form the calls pass (every
size and stride a runtime value but D's unit stride, 16-byte aligned), so the compile checks on CPU build the very
kernel that runs (docs/benchmarks.md, "Host time of the CuTe launches").
"""

from __future__ import annotations

import torch

# The target every compile names itself, so that neither CUTE_DSL_ARCH nor the GPU present (cutlass-dsl's defaults)
# chooses it: these kernels are Hopper's (wgmma, TMA, setmaxnreg)
TARGET_ARCH = "sm_90a"
COMPILE_OPTIONS = f"--enable-tvm-ffi --gpu-arch {TARGET_ARCH}"


def compile_options(keep_ptx: bool) -> str:
    return COMPILE_OPTIONS + (" --keep-ptx" if keep_ptx else "")


def fake_operands(element, count: int) -> list:
    """Fake (N, D, H, Z)-mode operands: every size and stride dynamic except the unit stride of D."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    def one():
        return make_fake_tensor(
            element, tuple(cute.sym_int() for _ in range(4)),
            stride=(cute.sym_int(64), 1, cute.sym_int(64), cute.sym_int(64)), assumed_align=16,
        )

    return [one() for _ in range(count)]


def fake_rows():
    """A fake (5, B) int32 rows tensor of a varlen call (``GdpaFwdSm90.__call__``)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    return make_fake_tensor(cutlass.Int32, (5, cute.sym_int()), stride=(cute.sym_int(64), 1), assumed_align=4)


def fake_offset():
    """A fake one-element fp32 bias of a call with a score offset (``GdpaFwdSm90``'s ``score_offset``)."""
    import cutlass
    from cutlass.cute.runtime import make_fake_tensor

    return make_fake_tensor(cutlass.Float32, (1,), stride=(1,), assumed_align=4)


def fake_counts():
    """A fake (Z·H,) int32 tensor of per-head counts (``GdpaBwdSm90``'s ``dq_last_round``)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    return make_fake_tensor(cutlass.Int32, (cute.sym_int(),), stride=(1,), assumed_align=4)


def fake_score_bias():
    """A fake bias tensor of a call with one (``GdpaFwdSm90``'s ``score_bias``): its 16-bit values' pairs as int32 in
    the (Nq, Nk / 2, Hb, Zb) mode order, every size and stride dynamic but the pairs' unit stride."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    return make_fake_tensor(
        cutlass.Int32, tuple(cute.sym_int() for _ in range(4)),
        stride=(cute.sym_int(), 1, cute.sym_int(), cute.sym_int()), assumed_align=4,
    )


def fake_stream():
    """The stream argument: taken at each call from the current torch stream of the tensors' device."""
    from cutlass.cute.runtime import make_fake_stream

    return make_fake_stream(use_tvm_ffi_env_stream=True)


def dense_modes(t: torch.Tensor) -> torch.Tensor:
    """[Z, H, N, D] -> the kernel's (N, D, H, Z) mode order (a view)."""
    return t.detach().permute(2, 3, 1, 0)


def row_modes(t: torch.Tensor) -> torch.Tensor:
    """A varlen side's [total, H, D] (one block of rows) or [B, N, H, D] -> (N, D, H, Z) (a view)."""
    t4 = t.unsqueeze(0) if t.dim() == 3 else t
    return t4.detach().permute(1, 3, 2, 0)


def offset_args(bias: torch.Tensor | None) -> tuple:
    """The kernels' trailing bias argument: the one element as a 1-D fp32 tensor (a view where it is fp32, as
    the backend's rewrite passes a constant: a bf16 -log n would shift every score by up to half its ulp), or
    None (a function loaded from the disk cache fills in no defaults)."""
    return (None,) if bias is None else (bias.detach().reshape(1).float(),)
