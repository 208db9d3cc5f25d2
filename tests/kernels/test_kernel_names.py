"""Every GPU kernel the fused ops launch has a readable name, found from the symbol a profiler lists."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import triton

import gdpa_inductor.kernels.triton as triton_kernels
from gdpa_inductor.kernels.names import KERNEL_NAMES, kernel_name

# symbols of cutlass-dsl's sm_90a builds of the forward and the backward (their PTX's .entry, cut after the class)
CUTE_SYMBOLS = {
    "kernel_cutlass_kernel_gdpa_inductorkernelscutegdpa_fwd_sm90GdpaFwdSm90_object_at__CopyAtom_ThrID10_0":
        "GDPA forward, CuTe SM90",
    "kernel_cutlass_kernel_gdpa_inductorkernelscutegdpa_bwd_sm90GdpaBwdSm90_object_at__CopyAtom_ThrID10_0":
        "GDPA backward, CuTe SM90",
}


def _launched_triton_kernels() -> list[str]:
    """The ``@triton.jit`` functions named ``*_kernel`` of the package's Triton modules (the helpers they call are
    inlined and never appear in a profile)."""
    names = []
    for info in pkgutil.iter_modules(triton_kernels.__path__):
        module = importlib.import_module(f"{triton_kernels.__name__}.{info.name}")
        names += [name for name, obj in vars(module).items()
                  if isinstance(obj, triton.runtime.KernelInterface) and name.endswith("_kernel")
                  and obj.fn.__module__ == module.__name__]
    return sorted(names)


def test_the_triton_modules_launch_kernels():
    assert {"gdpa_fwd_kernel", "gdpa_bwd_dq_kernel", "gdpa_varlen_fwd_kernel"} <= set(_launched_triton_kernels())


@pytest.mark.parametrize("symbol", _launched_triton_kernels())
def test_every_triton_kernel_has_a_name(symbol):
    assert kernel_name(symbol) is not None


@pytest.mark.parametrize("symbol, name", CUTE_SYMBOLS.items(), ids=["fwd", "bwd"])
def test_cute_symbols_are_named(symbol, name):
    assert kernel_name(symbol) == name


def test_every_cute_kernel_class_has_a_name():
    pytest.importorskip("cutlass")
    from gdpa_inductor.kernels.cute import gdpa_bwd_sm90, gdpa_fwd_sm90

    classes = [cls for module in (gdpa_fwd_sm90, gdpa_bwd_sm90) for cls in vars(module).values()
               if inspect.isclass(cls) and cls.__module__ == module.__name__ and "kernel" in vars(cls)]
    assert len(classes) == 2
    assert all(kernel_name(cls.__name__) is not None for cls in classes)


@pytest.mark.parametrize("symbol", ["triton_poi_fused_add_0", "sm90_xmma_gemm_bf16bf16_bf16f32", "flash_fwd_kernel"])
def test_other_kernels_have_no_name(symbol):
    assert kernel_name(symbol) is None


def test_no_symbol_part_contains_another():
    parts = [part for part, _ in KERNEL_NAMES]
    assert not [(a, b) for a in parts for b in parts if a != b and a in b]
