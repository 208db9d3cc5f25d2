"""Which varlen calls the CuTe-DSL Hopper kernels take (``GdpaFwdSm90`` and ``GdpaBwdSm90`` with ``varlen``, or
``GdpaBwdWideSm90`` past head dims of 128), each an (ok, reason) check, and where "auto" prefers the varlen forward
to Triton's."""

from __future__ import annotations

import torch

from ..activations import ActivationName
from ..reference_varlen import varlen_batch
from .bwd_support import BWD_HEAD_DIMS, bwd_bias_support
from .fwd_support import CAUSAL_TILE, bias_pairs_support, cute_dsl_available, on_sm90, on_sm100, operand_support

# the dense forward's head dims: past 128 its wide-head tiles (64 keys, O stored from the registers, the rows past
# each sample's end predicated off)
VARLEN_HEAD_DIMS = (64, 96, 128, 256)


def cute_varlen_fwd_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool,
                            window: tuple[int, int], activation: ActivationName, rows: tuple,
                            kernel: str = "the CuTe varlen forward",
                            head_dims: tuple = VARLEN_HEAD_DIMS) -> tuple[bool, str]:
    """(ok, reason) for the CuTe varlen forward on the varlen op's operands (``[total, H, D]`` or
    ``[B, N, H, D]`` each) and ``rows``, their (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k); ``kernel``
    names it in the reasons and ``head_dims`` are D's and Dv's (the backward takes the same calls at its own head
    dims)."""
    if not cute_dsl_available():
        return False, "nvidia-cutlass-dsl or apache-tvm-ffi is not installed"
    if not on_sm90(q.device):
        return False, "the CuTe kernel is built for sm_90 (Hopper)"
    ok, reason = varlen_bias_support(bias, q, k, kernel)
    if not ok:
        return ok, reason
    if (causal or tuple(window) != (-1, -1)) and max(q.shape[-1], v.shape[-1]) > CAUSAL_TILE:
        return False, f"causal masking and windows in {kernel} need D and Dv of at most {CAUSAL_TILE}"
    return operand_support(q, k, v, activation, head_dims, kernel)


def varlen_bias_support(bias: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor,
                        kernel: str = "the CuTe varlen forward") -> tuple[bool, str]:
    """(ok, reason) for a bias in the CuTe varlen kernels: one element, or a tensor ``gdpa_varlen`` took (in q's
    dtype, broadcasting to [B, H, max_seqlen_q, max_seqlen_k]) that holds a value for every position of a sample,
    read at the sample's index and the positions within it: its last two dims not broadcast (more than one along a
    jagged side, a dense side's N), its values readable in pairs (``bias_pairs_support``)."""
    if bias is None or bias.numel() == 1:
        return True, ""
    if bias.dtype != q.dtype:
        return False, f"{kernel} reads a bias in the operands' dtype {q.dtype} (got {bias.dtype})"
    if bias.dim() < 2:
        return False, f"{kernel} takes a bias over the scores' rows and columns (got shape {tuple(bias.shape)})"
    for what, n, side in (("query", bias.shape[-2], q), ("key", bias.shape[-1], k)):
        per_sample = side.shape[1] if side.dim() == 4 else None
        if n == 1 and per_sample != 1:
            return False, (f"{kernel} takes a bias with a value for every {what} position of a sample (got shape "
                           f"{tuple(bias.shape)}, broadcast over them)")
    return bias_pairs_support(bias, kernel)


def varlen_causal_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: tuple,
                          kernel: str = "the CuTe varlen forward") -> tuple[bool, str]:
    """(ok, reason) for the causal mask in the CuTe varlen kernels: the dense kernels' rule (``causal_support``)
    in every sample, Nk - Nq a non-negative multiple of 128. Without reading the offsets on the host (a device
    sync per call) that is known only where it holds by construction: both sides' rows from one ``cu_seqlens``
    tensor (self-attention over jagged sequences, HSTU's case) or one ``seqused`` tensor (Nk = Nq per sample), or
    full dense sides whose lengths differ by such a multiple. Equal offsets in two tensors take Triton's kernel."""
    cu_q, cu_k, used_q, used_k = rows
    if max(q.shape[-1], v.shape[-1]) > CAUSAL_TILE:
        return False, f"causal masking in {kernel} needs D and Dv of at most {CAUSAL_TILE}"
    if cu_q is not None or cu_k is not None:
        if cu_q is not cu_k or used_q is not used_k:
            return False, (f"causal masking in {kernel} needs queries and keys to take their rows from one "
                           "cu_seqlens tensor, and their rows used from one seqused tensor or none (per-sample "
                           "lengths are not read on the host)")
        return True, ""
    if used_q is not None or used_k is not None:
        if used_q is not used_k:
            return False, (f"causal masking in {kernel} needs queries and keys to take their valid lengths from "
                           "one seqused tensor (per-sample lengths are not read on the host)")
        return True, ""
    nq, nk = q.shape[1], k.shape[1]
    if nk < nq or (nk - nq) % CAUSAL_TILE:
        return False, (f"causal masking in {kernel} needs Nk - Nq to be a non-negative multiple of {CAUSAL_TILE}; "
                       f"got Nq={nq}, Nk={nk}")
    return True, ""


def cute_varlen_fwd_preferred(q: torch.Tensor, v: torch.Tensor) -> tuple[bool, str]:
    """(ok, reason): whether "auto" should run a supported call on the CuTe varlen forward.

    Measured on H200 (``varlen.py kernels --head-dims``, B=1152, H=4, bf16 gelu_tanh, lengths up to
    256..2048): at D = Dv = 256 the wide-head tiles ran 0.99-1.73x Triton's
    varlen forward, at D = 128, Dv = 256 0.48-1.22x (behind at short samples), so unequal head dims past 128
    keep Triton's."""
    if max(q.shape[-1], v.shape[-1]) > 128 and q.shape[-1] != v.shape[-1]:
        return False, ("unequal head dims past 128 take the CuTe varlen forward only under backend='cute' "
                       "(behind Triton's at short samples)")
    return True, ""


def cute_varlen_bwd_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool,
                            window: tuple[int, int], activation: ActivationName, rows: tuple,
                            bias_grad: bool = False) -> tuple[bool, str]:
    """(ok, reason) for the CuTe varlen backward: the varlen forward's cases (``rows``: the call's cu_seqlens and
    seqused, for its causal rule) at the dense backward's head dims (``BWD_HEAD_DIMS``; masks only up to 128), a
    bias tensor and its gradient (``bias_grad``: whether the call wants one) where the dense backward takes them
    (``bwd_bias_support``)."""
    check = cute_varlen_fwd_support(q, k, v, bias, causal, window, activation, rows, "the CuTe varlen backward",
                                    BWD_HEAD_DIMS)
    return bwd_bias_support(check, bias, q, v, bias_grad, (varlen_batch(q, k, rows[0], rows[1]), q.shape[-2]),
                            varlen=True)


def sm100_varlen_fwd_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool,
                             window: tuple[int, int], activation: ActivationName, rows: tuple) -> tuple[bool, str]:
    """(ok, reason) for the Blackwell forward on the varlen op's operands (``[total, H, D]`` or ``[B, N, H, D]``
    each) and ``rows`` (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k), launched by
    ``varlen_fwd.gdpa_varlen_fwd_cute_sm100``: an sm_100 GPU, D = Dv in ``SM100_HEAD_DIMS``, k and v of one layout
    but the last dim, a bias ``varlen_bias_support`` takes (or the same in fp32: its last dim contiguous), a window
    of bounds >= -1; the causal mask and windows at any per-sample Nk - Nq. The dispatch asks it on sm_100, then the
    self-check of the call's build (``lowering/sm100_varlen_forward.py``)."""
    from .fwd_plan import SM100_HEAD_DIMS

    kernel = "the CuTe Blackwell varlen forward"
    if not cute_dsl_available():
        return False, "nvidia-cutlass-dsl or apache-tvm-ffi is not installed"
    if not on_sm100(q.device):
        return False, f"{kernel} is built for sm_100"
    fp32 = bias is not None and bias.numel() != 1 and bias.dtype == torch.float32
    # an fp32 bias: the 16-bit rules but its dtype and the pairs (read one value a word)
    stand_in = torch.empty_strided(bias.shape, bias.stride(), dtype=q.dtype, device="meta") if fp32 else bias
    ok, reason = varlen_bias_support(stand_in, q, k, kernel)
    if not ok and not (fp32 and "pairs" in reason):
        return ok, reason
    if fp32 and (bias.stride(-1) != 1 or bias.data_ptr() % 4):
        return False, f"{kernel} reads an fp32 bias with its last dim contiguous, 4-byte aligned"
    if len(window) != 2 or min(window) < -1:
        return False, f"{kernel} takes a window of two bounds, each -1 (none) or >= 0 (got {window})"
    if q.shape[-1] != v.shape[-1]:
        return False, f"{kernel} needs D = Dv (got D={q.shape[-1]}, Dv={v.shape[-1]})"
    if k.shape[:-1] != v.shape[:-1]:
        return False, f"{kernel} needs k and v of one shape but the last dim (got {tuple(k.shape)}, {tuple(v.shape)})"
    return operand_support(q, k, v, activation, SM100_HEAD_DIMS, kernel)


def sm100_varlen_bwd_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, bias_grad: bool,
                             window: tuple[int, int], activation: ActivationName, rows: tuple) -> tuple[bool, str]:
    """(ok, reason) for the Blackwell backward on the varlen op's operands (``[total, H, D]`` or ``[B, N, H, D]``
    each) and ``rows`` (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k), launched by
    ``varlen_bwd.gdpa_varlen_bwd_cute_sm100``: an sm_100 GPU, a bias ``varlen_bias_support``'s rules take (or the same
    in fp32), its keys contiguous, its gradient a tensor's whose [B, H, max_seqlen_q, max_seqlen_k] dS buffer fits in
    half the memory the device can still allocate, D = Dv in ``SM100_BWD_HEAD_DIMS``, k and v of one layout but the
    last dim, a window of bounds >= -1; the causal mask and windows at any per-sample Nk - Nq. The output's gradient
    is copied where TMA cannot read it."""
    from .bwd_plan import SM100_BWD_HEAD_DIMS
    from .dbias_plan import dbias_sums_for

    kernel = "the CuTe Blackwell varlen backward"
    if not cute_dsl_available():
        return False, "nvidia-cutlass-dsl or apache-tvm-ffi is not installed"
    if not on_sm100(q.device):
        return False, f"{kernel} is built for sm_100"
    if bias is None and bias_grad:
        return False, "bias_grad=True needs a bias tensor"
    if bias is not None and bias.numel() == 1 and bias_grad:
        return False, f"{kernel} takes a bias gradient of a tensor only (got one element)"
    if bias is not None and bias.numel() != 1:
        fp32 = bias.dtype == torch.float32
        # the 16-bit rules but its dtype and the pairs: the backward reads one value a score
        stand_in = torch.empty_strided(bias.shape, bias.stride(), dtype=q.dtype, device="meta") if fp32 else bias
        ok, reason = varlen_bias_support(stand_in, q, k, kernel)
        if not ok and "pairs" not in reason:
            return ok, reason
        if bias.stride(-1) != 1:
            return False, f"{kernel} reads a bias with its keys contiguous (got strides {bias.stride()})"
        if bias_grad:
            way, reason = dbias_sums_for(varlen_batch(q, k, rows[0], rows[1]), q.shape[-2], bias)
            if way != "buffer":
                return False, reason or f"{kernel} sums dbias in a buffer of every (sample, head)'s dS: it does not fit"
    if len(window) != 2 or min(window) < -1:
        return False, f"{kernel} takes a window of two bounds, each -1 (none) or >= 0 (got {window})"
    if q.shape[-1] != v.shape[-1]:
        return False, f"{kernel} needs D = Dv (got D={q.shape[-1]}, Dv={v.shape[-1]})"
    if k.shape[:-1] != v.shape[:-1] or q.shape[-2] % k.shape[-2]:
        return False, (f"{kernel} needs k and v of one shape but the last dim, and q's heads a multiple of k's "
                       f"(got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)})")
    return operand_support(q, k, v, activation, SM100_BWD_HEAD_DIMS, kernel)
