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

import dataclasses
from collections.abc import Callable

import torch

# The target every compile names itself, so that neither CUTE_DSL_ARCH nor the GPU present (cutlass-dsl's defaults)
# chooses it: Hopper's for the sm90 kernels (wgmma, TMA, setmaxnreg), Blackwell's for GdpaFwdSm100 and GdpaBwdSm100
# (tcgen05, tensor memory). The target follows the kernel: its build passes it here and to the compile cache, which
# keys on it.
TARGET_ARCH = "sm_90a"
SM100_TARGET_ARCH = "sm_100a"


def compile_options(keep_ptx: bool, target: str = TARGET_ARCH) -> str:
    return f"--enable-tvm-ffi --gpu-arch {target}" + (" --keep-ptx" if keep_ptx else "")


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


def offset_arg(bias: torch.Tensor | None) -> torch.Tensor | None:
    """The kernels' one-element bias argument: a 1-D fp32 tensor (a view where it is fp32, as the backend's rewrite
    passes a constant: a bf16 -log n would shift every score by up to half its ulp), or None."""
    return None if bias is None else bias.detach().reshape(1).float()


def score_bias_modes(bias: torch.Tensor) -> torch.Tensor:
    """A bias the forward takes (``fwd_support.score_bias_support``) -> its values' pairs as int32 in the
    forward's (Nq, Nk / 2, Hb, Zb) mode order (a view)."""
    b = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
    # torch's dtype view wants every stride even, size-1 dims' too (never stepped along: any even one does)
    b = torch.as_strided(b, b.shape, [s if n > 1 else 2 for n, s in zip(b.shape[:-1], b.stride()[:-1])] + [1])
    return dense_modes(b.view(torch.int32))


# TMA reads and writes rows that start 16 bytes apart: the bias's and dS's columns padded to 8 16-bit values
TMA_COLUMNS = 8


def padded(n: int, tile: int) -> int:
    """``n`` rounded up to whole ``tile``s."""
    return -(-n // tile) * tile


def tma_bias(bias: torch.Tensor) -> torch.Tensor:
    """``bias`` ([Zb, Hb, Nq, Nk]) itself where TMA can load its tiles in place (Nk and every stride of a dim above
    one a multiple of ``TMA_COLUMNS``, 16-byte aligned), else a copy with its rows padded to a multiple of
    ``TMA_COLUMNS`` columns, seen as the bias's columns (Nk = 300, a sliced position table: the backward stays on the
    CuTe kernel for one copy of the bias). A bias of one row seen as Nq rows of stride 0 copies its one row."""
    strides = [s for n, s in zip(bias.shape[:-1], bias.stride()[:-1]) if n > 1]
    if not (bias.shape[-1] % TMA_COLUMNS or any(s % TMA_COLUMNS for s in strides) or bias.data_ptr() % 16):
        return bias
    one_row = bias.shape[-2] > 1 and bias.stride(-2) == 0
    stored = bias[..., :1, :] if one_row else bias
    cols = bias.shape[-1]
    copy = torch.empty((*stored.shape[:-1], padded(cols, TMA_COLUMNS)), dtype=bias.dtype, device=bias.device)
    copy = copy[..., :cols].copy_(stored)
    return copy.expand(bias.shape) if one_row else copy


def bias_tile_modes(bias: torch.Tensor) -> torch.Tensor:
    """A [Zb, Hb, Nq, Nk] bias (or fewer leading dims) the backward takes -> the kernel's (Nq, Nk, Hb, Zb) mode
    order (a view of it, or of ``tma_bias``' padded copy), its size-1 dims given a stride TMA takes (never stepped
    along: any multiple of 16 bytes does)."""
    bias = tma_bias(bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape)))
    placeholder = padded(bias.shape[-1], TMA_COLUMNS)
    b = torch.as_strided(bias, bias.shape, [s if n > 1 else placeholder for n, s in
                                            zip(bias.shape[:-1], bias.stride()[:-1])] + [1])
    return dense_modes(b)


# --- the argument schemas: one per kernel, read both by the compile (fakes) and by the launch (values) ---

def element(dtype: torch.dtype):
    """cutlass-dsl's element type of a torch dtype."""
    import cutlass

    return {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16, torch.float32: cutlass.Float32}[dtype]


def _always(plan) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class Arg:
    """One parameter of a kernel's ``__call__``: ``fake(plan)`` its compile-time stand-in; ``taken(plan)`` whether the
    build reads it (if not, None at both ends); ``passed``: False for the stream, which the compiled function takes
    from the caller's current torch stream."""

    name: str
    fake: Callable
    taken: Callable = _always
    passed: bool = True


class KernelArgs:
    """A kernel's parameters in ``__call__``'s order: the compile's fakes and a launch's values from one list, so
    the two cannot disagree (a function loaded from the disk cache fills in no defaults: every parameter is
    passed, None where the build takes none)."""

    def __init__(self, *args: Arg):
        self.args = args
        # per plan: the passed parameters' names and whether the build takes each (asked for at every launch)
        self._layouts: dict = {}

    def fakes(self, plan) -> list:
        return [a.fake(plan) if a.taken(plan) else None for a in self.args]

    def values(self, plan, **given) -> list:
        """The launch's arguments: each parameter the build takes from ``given`` (by name), None for the others
        (``given`` may name, as None, parameters this kernel lacks: a launcher shared by two kernels)."""
        layout = self._layouts.get(plan)
        if layout is None:
            layout = self._layouts[plan] = tuple((a.name, a.taken(plan)) for a in self.args if a.passed)
        out = []
        for name, taken in layout:
            value = given.pop(name, None)
            if taken and value is None:
                raise TypeError(f"this build of the kernel needs {name!r}")
            if not taken and value is not None:
                raise TypeError(f"this build of the kernel takes no {name!r}")
            out.append(value)
        unknown = sorted(name for name, value in given.items() if value is not None)
        if unknown:
            raise TypeError(f"the kernel has no parameters {unknown}")
        return out


def _operands(*names: str, dtype: Callable = lambda plan: plan.dtype) -> list[Arg]:
    return [Arg(n, lambda plan: fake_operands(element(dtype(plan)), 1)[0]) for n in names]


def _scalars(*names: str) -> list[Arg]:
    def f32(plan):
        import cutlass

        return cutlass.Float32(1.0)

    return [Arg(n, f32) for n in names]


def _int32(plan):
    import cutlass

    return cutlass.Int32(1)


def _varlen(plan) -> bool:
    return plan.varlen


def _band(plan) -> bool:
    return plan.band


def _score_offset(plan) -> bool:
    return plan.score_offset


_STREAM = Arg("stream", lambda plan: fake_stream(), passed=False)

# GdpaFwdSm90.__call__
FWD_ARGS = KernelArgs(
    *_operands("q", "k", "v", "out"), *_scalars("scale", "post_scale", "slope"), Arg("num_ctas", _int32), _STREAM,
    Arg("rows", lambda plan: fake_rows(), _varlen), Arg("num_m", _int32, _varlen),
    Arg("band_left", _int32, _band), Arg("band_right", _int32, _band),
    Arg("offset", lambda plan: fake_offset(), _score_offset),
    Arg("bias", lambda plan: fake_score_bias(), lambda plan: plan.score_bias),
)


def fake_bias_words(plan):
    """A fake bias tensor of the Blackwell forward (``GdpaFwdSm100``'s ``mBias``): its values as 32-bit words (16-bit
    pairs as int32, or fp32) in the (Nq, words a row, Hb, Zb) mode order, every size and stride dynamic but the
    words' unit stride."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    return make_fake_tensor(
        cutlass.Float32 if plan.bias == "float32" else cutlass.Int32, tuple(cute.sym_int() for _ in range(4)),
        stride=(cute.sym_int(), 1, cute.sym_int(), cute.sym_int()), assumed_align=4,
    )


def sm100_bias_words(bias: torch.Tensor) -> torch.Tensor:
    """A bias the Blackwell forward takes (``fwd_support.sm100_bias_support``) -> its 32-bit words in the kernel's
    (Nq, words a row, Hb, Zb) mode order (a view): 16-bit values in pairs (``score_bias_modes``), fp32 as they are."""
    if bias.dtype != torch.float32:
        return score_bias_modes(bias)
    b = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
    return dense_modes(b)


def fake_scores(dtype_name: str):
    """A fake (Nq, Nk, H, Z) tensor of scores' values in dtype ``dtype_name`` (torch's name): the Blackwell
    backward's bias (broadcast dims of stride 0) and its gradient's dS buffer, every size and stride dynamic but the
    keys' unit stride."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    dtype = getattr(torch, dtype_name)
    # aligned to an element: a 4-byte value read or written as two 16-bit halves otherwise
    return make_fake_tensor(element(dtype), tuple(cute.sym_int() for _ in range(4)),
                            stride=(cute.sym_int(), 1, cute.sym_int(), cute.sym_int()), assumed_align=dtype.itemsize)


# GdpaFwdSm100.__call__
FWD_SM100_ARGS = KernelArgs(
    *_operands("q", "k", "v", "out"), *_scalars("scale", "post_scale", "slope"), Arg("num_ctas", _int32), _STREAM,
    Arg("rows", lambda plan: fake_rows(), _varlen), Arg("num_m", _int32, _varlen),
    Arg("band_left", _int32, lambda plan: plan.window), Arg("band_right", _int32, lambda plan: plan.window),
    Arg("bias", fake_bias_words, lambda plan: bool(plan.bias)),
)
# GdpaBwdSm100.__call__: dQ summed in fp32
BWD_SM100_ARGS = KernelArgs(
    *_operands("q", "k", "v", "dout"), *_operands("dq", dtype=lambda plan: torch.float32), *_operands("dk", "dv"),
    *_scalars("scale", "post_scale", "slope"), Arg("num_ctas", _int32), _STREAM,
    Arg("band_left", _int32, lambda plan: plan.window), Arg("band_right", _int32, lambda plan: plan.window),
    Arg("rows", lambda plan: fake_rows(), _varlen), Arg("num_n", _int32, _varlen),
    Arg("bias", lambda plan: fake_scores(plan.bias), lambda plan: bool(plan.bias)),
    Arg("dbias", lambda plan: fake_scores(plan.bias), lambda plan: plan.bias_grad),
)

_BWD_HEAD = (
    *_operands("q", "k", "v", "dout"),
    *_operands("dq", dtype=lambda plan: torch.float32 if plan.dq_sums == "fp32" else plan.dtype),
    *_operands("dk", "dv"), *_scalars("scale", "post_scale", "slope"), _STREAM,
    Arg("rows", lambda plan: fake_rows(), _varlen), Arg("num_n", _int32, _varlen),
)
# GdpaBwdSm90.__call__
BWD_ARGS = KernelArgs(
    *_BWD_HEAD, Arg("band_left", _int32, _band), Arg("band_right", _int32, _band),
    Arg("offset", lambda plan: fake_offset(), _score_offset),
    Arg("bias", lambda plan: fake_operands(element(plan.dtype), 1)[0], lambda plan: plan.score_bias),
    Arg("dbias", lambda plan: fake_operands(element(torch.float32 if plan.dbias_atomic else plan.dtype), 1)[0],
        lambda plan: plan.bias_grad),
    Arg("dq_out", lambda plan: fake_operands(element(plan.dtype), 1)[0], lambda plan: plan.dq_last_round),
    Arg("dq_count", lambda plan: fake_counts(), lambda plan: plan.dq_last_round),
)
# GdpaBwdWideSm90.__call__: no mask, no bias tensor, dQ rounded after it
WIDE_BWD_ARGS = KernelArgs(*_BWD_HEAD, Arg("offset", lambda plan: fake_offset(), _score_offset))
