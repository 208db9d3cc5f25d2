"""Readable names for the GPU kernels the fused ops launch, found by a part of the symbol a profiler lists.

CuTe-DSL symbols carry the kernel class's module path and name (``kernel_cutlass_kernel_gdpa_inductorkernelscute
gdpa_fwd_sm90GdpaFwdSm90_object_at_...``); Triton's are the ``@triton.jit`` function's name.
"""

from __future__ import annotations

# (part of the symbol, readable name); no part is contained in another, so the order does not matter
KERNEL_NAMES: tuple[tuple[str, str], ...] = (
    ("GdpaFwdSm90", "GDPA forward, CuTe SM90"),
    ("GdpaBwdSm90", "GDPA backward, CuTe SM90"),
    ("gdpa_fwd_tma_kernel", "GDPA forward, Triton (TMA)"),
    ("gdpa_fwd_kernel", "GDPA forward, Triton"),
    ("gdpa_bwd_dkdv_kernel", "GDPA backward dK dV, Triton"),
    ("gdpa_bwd_dq_kernel", "GDPA backward dQ, Triton"),
    ("gdpa_varlen_fwd_kernel", "GDPA varlen forward, Triton"),
    ("gdpa_varlen_bwd_dkdv_kernel", "GDPA varlen backward dK dV, Triton"),
    ("gdpa_varlen_bwd_dq_kernel", "GDPA varlen backward dQ, Triton"),
    ("varlen_schedule_kernel", "GDPA varlen tile schedule, Triton"),
    ("varlen_zero_gaps_kernel", "GDPA varlen backward, unread rows zeroed, Triton"),
    ("_dq_of_fragments_kernel", "GDPA backward dQ from the CuTe sums, Triton"),
    ("_scale_round_kernel", "GDPA backward dQ scale and round, Triton"),
)


def kernel_name(symbol: str) -> str | None:
    """The readable name of a GDPA kernel's symbol; None for any other kernel."""
    for part, name in KERNEL_NAMES:
        if part in symbol:
            return name
    return None
