"""The GPU generation the Triton launchers choose tiles for (``tile_configs.tile_capability``): the compute
capability of the tensors' GPU reaches every tile choice, from the eager launches and from the launches a compiled
graph makes (``traced``: the same launchers); Hopper's tiles where there is no GPU to ask. The sm_100 tiles
themselves are checked by their compiles (``test_triton_compile_sm100.py``)."""

from __future__ import annotations

import hashlib

import pytest
import torch
from gdpa_testing import requires_interpreter

from gdpa_inductor.kernels.common.varlen_rows import with_tensor
from gdpa_inductor.kernels.triton import gdpa_bwd, gdpa_fwd, tile_configs, varlen_bwd, varlen_fwd
from gdpa_inductor.kernels.triton.varlen_schedule import varlen_sides


def _no_gpu(index):
    raise AssertionError("no GPU may be asked")


def test_cpu_tensors_take_hoppers_tiles_without_asking_a_gpu(monkeypatch):
    monkeypatch.setattr(tile_configs, "capability_major", _no_gpu)
    assert tile_configs.tile_capability(torch.device("cpu")) == tile_configs.HOPPER


def test_the_interpreter_takes_hoppers_tiles_without_asking_a_gpu(monkeypatch):
    monkeypatch.setattr(tile_configs, "capability_major", _no_gpu)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert tile_configs.tile_capability(torch.device("cuda", 0)) == tile_configs.HOPPER


def test_a_cuda_tensor_takes_its_gpus_capability(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(tile_configs, "capability_major", lambda index: {0: 9, 1: 10}[index])
    assert tile_configs.tile_capability(torch.device("cuda", 1)) == tile_configs.BLACKWELL
    assert tile_configs.tile_capability(torch.device("cuda", 0)) == tile_configs.HOPPER


def test_only_sm_100_changes_the_tiles():
    """Hopper's tiles (measured on an H200) for every capability but 10."""
    args = (128, 128, torch.bfloat16, 2048)
    for capability in (8, 9, 12):
        assert tile_configs.default_fwd_config(*args, capability=capability) == tile_configs.FwdConfig(128, 64, 8, 3)
        assert tile_configs.default_bwd_configs(*args, capability=capability) == (
            tile_configs.BwdConfig(64, 128, 8, 3), tile_configs.BwdConfig(128, 64, 8, 2))
        assert tile_configs.tma_fwd_config(capability) == tile_configs.TMA_CONFIG
    assert tile_configs.default_bwd_configs(*args, capability=10) == (
        tile_configs.BwdConfig(32, 128, 8, 1), tile_configs.BwdConfig(128, 32, 8, 2))


def _tiles(cfg) -> str:
    return f"{cfg.block_m}x{cfg.block_n}/{cfg.num_warps}w/{cfg.num_stages}s"


def _choices(capability: int) -> str:
    """Every tile choice over head widths, dtypes, kv lengths and bias, one line per (D, Dv, dtype, kv)."""
    lines = [f"tma {_tiles(tile_configs.tma_fwd_config(capability))}"]
    for d, dv in [(16, 16), (32, 32), (64, 64), (64, 128), (96, 96), (128, 128), (160, 160), (192, 192), (256, 256),
                  (128, 256)]:
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for kv in (64, 256, 512, 1024, 2048, 4096, 8192):
                fwd = [_tiles(tile_configs.default_fwd_config(d, dv, dtype, kv, bias, capability=capability))
                       for bias in (False, True)]
                bwd = tile_configs.default_bwd_configs(d, dv, dtype, kv, capability=capability)
                vfwd = tile_configs.default_varlen_fwd_config(d, dv, dtype, kv, capability=capability)
                vbwd = tile_configs.default_varlen_bwd_configs(d, dv, dtype, kv, capability=capability)
                assert bwd[0].dv_pass is None and vbwd[0].dv_pass is None, (d, dv, dtype, kv)
                lines.append(f"{d} {dv} {dtype} {kv}: {fwd} {[_tiles(c) for c in bwd]} {_tiles(vfwd)} "
                             f"{[_tiles(c) for c in vbwd]}")
    return "\n".join(lines)


# The digest of ``_choices`` for Hopper's tiles, as measured on an H200: a change to any of them changes it.
HOPPER_CHOICES = "f4525eb657818a0c"


@pytest.mark.parametrize("capability", [8, 9, 12])
def test_hoppers_tile_choices_are_unchanged(capability):
    """Every GPU but sm_100 keeps Hopper's tiles, each dK/dV in one pass."""
    assert hashlib.sha256(_choices(capability).encode()).hexdigest()[:16] == HOPPER_CHOICES


@pytest.fixture
def asked(monkeypatch):
    """The capability each tile function is given, with the launchers' tensors standing in for a GPU of
    capability 10."""
    seen = []
    for module, name in [(gdpa_fwd, "default_fwd_config"), (gdpa_bwd, "default_bwd_configs"),
                         (varlen_fwd, "default_varlen_fwd_config"), (varlen_bwd, "default_varlen_bwd_configs")]:
        monkeypatch.setattr(module, "tile_capability", lambda device: 10)
        real = getattr(module, name)

        def record(*args, _real=real, _name=name, **kwargs):
            seen.append((_name, kwargs["capability"]))
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, record)
    return seen


@requires_interpreter
@pytest.mark.parametrize("traced", [False, True])
def test_the_dense_launchers_choose_tiles_for_the_tensors_gpu(asked, traced):
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, 2, 24, 16, generator=gen) for _ in range(4))
    args = ("silu", 0.25, 1.0, True, 0.01)
    gdpa_fwd.gdpa_fwd_triton(q, k, v, None, *args, traced=traced)
    gdpa_bwd.gdpa_bwd_triton(dout, q, k, v, None, *args, False, traced=traced)
    assert asked == [("default_fwd_config", 10), ("default_bwd_configs", 10)]


@requires_interpreter
def test_the_varlen_launchers_choose_tiles_for_the_tensors_gpu(asked):
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([24, 7], dtype=torch.int32)
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).to(torch.int32)])
    q, k, v, dout = (torch.randn(31, 2, 16, generator=gen) for _ in range(4))
    side, kside, order = varlen_sides(q, k, cu, cu, None, None, 24, 24, 2)
    params = ("silu", 0.25, 1.0, True, (-1, -1), 0.01)
    varlen_fwd.gdpa_varlen_fwd_triton(side, kside, v, None, with_tensor(side, torch.empty_like(q)), order, *params)
    varlen_bwd.gdpa_varlen_bwd_triton(with_tensor(side, dout), side, kside, v, None, order, *params, False)
    assert asked == [("default_varlen_fwd_config", 10), ("default_varlen_bwd_configs", 10)]
