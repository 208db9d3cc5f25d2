"""The dK/dV kernel run as two passes, a dV pass then a dK pass with dBias (``tile_configs.dkdv_passes``: sm_100's
choice above head width 128 in half precision), under TRITON_INTERPRET=1 against the float64 reference: head dims
192 and 256 (one case with Dv = 64), lengths that end part-way through the tiles, every gradient. fp16 takes
sm_100's own tile choice (the launchers told the tensors are on a GPU of capability 10); fp32, which sm_100 runs in
one pass, is given small two-pass tiles so that its fp32 accuracy checks the passes' masks and bounds."""

from __future__ import annotations

import pytest
import torch
from gdpa_testing import dtype_id, rel_err, requires_interpreter
from test_triton_interpreter import _make, check_fwd_bwd
from test_triton_varlen_interpreter import eager_half, run_both
from varlen_testing import bias_for, make_case

from gdpa_inductor.kernels.triton import gdpa_bwd, tile_configs, varlen_bwd
from gdpa_inductor.kernels.triton.tile_configs import BwdConfig

pytestmark = [
    requires_interpreter,
    pytest.mark.usefixtures("poison_empty"),
    pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning"),
]

SMALL_PASSES = (BwdConfig(16, 32, 4, 1, dv_pass=BwdConfig(32, 16, 4, 1)), BwdConfig(32, 16, 4, 1))
DENSE = {
    "d192_gqa_bias": _make((1, 4, 40, 192), (1, 2, 70, 192), (1, 2, 70, 192), bs=(1, 4, 40, 70)),
    "d256_causal_bias": _make((2, 1, 70, 256), (2, 1, 40, 256), (2, 1, 40, 256), bs=(70, 40), causal=True),
    # each pass's tile follows its own width: sm_100's narrow dV tile
    "d256_dv64": _make((1, 2, 40, 256), (1, 2, 70, 256), (1, 2, 70, 64)),
}


@pytest.fixture
def passes(monkeypatch, request):
    """The launches' passes, recorded: fp16 with sm_100's tiles, fp32 with ``SMALL_PASSES``."""
    launched = []
    for module, tiles in [(gdpa_bwd, "default_bwd_configs"), (varlen_bwd, "default_varlen_bwd_configs")]:
        def record(kv_cfg, _real=module.dkdv_passes):
            launched.append([(with_dk, with_dv) for _, with_dk, with_dv in _real(kv_cfg)])
            return _real(kv_cfg)

        monkeypatch.setattr(module, "dkdv_passes", record)
        if request.getfixturevalue("dtype") == torch.float16:
            monkeypatch.setattr(module, "tile_capability", lambda device: tile_configs.BLACKWELL)
        else:
            monkeypatch.setattr(module, tiles, lambda *args, **kwargs: SMALL_PASSES)
    return launched


def test_sm100_takes_two_passes_above_head_width_128_in_half_precision():
    for d, dv in [(192, 192), (256, 64), (64, 256)]:
        for dtype in (torch.float16, torch.bfloat16):
            kv_cfg, _ = tile_configs.default_bwd_configs(d, dv, dtype, 1024, capability=tile_configs.BLACKWELL)
            assert [p[1:] for p in tile_configs.dkdv_passes(kv_cfg)] == [(False, True), (True, False)]
            kv_cfg, _ = tile_configs.default_varlen_bwd_configs(d, dv, dtype, 1024,
                                                                capability=tile_configs.BLACKWELL)
            assert kv_cfg.dv_pass is not None
    for d, dtype in [(128, torch.bfloat16), (256, torch.float32)]:
        kv_cfg, _ = tile_configs.default_bwd_configs(d, d, dtype, 1024, capability=tile_configs.BLACKWELL)
        assert [p[1:] for p in tile_configs.dkdv_passes(kv_cfg)] == [(True, True)]


@pytest.mark.parametrize("case", DENSE)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=dtype_id)
def test_dense(dtype, case, passes, gen):
    check_fwd_bwd(*DENSE[case](gen, dtype), "gelu_tanh", gen)
    assert passes == [[(False, True), (True, False)]]


@pytest.mark.parametrize("d", [192, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=dtype_id)
def test_varlen(dtype, d, passes, gen):
    """fp32 with a bias shared by the samples (and its gradient) under the causal window; fp16 without a bias,
    within twice eager's fp16 error."""
    case = make_case("cross", gen, h=2, hkv=1, d=d, dv=d, lq=[40, 0, 23], lk=[70, 33, 17])
    mask = dict(causal=True, window=(20, 0))
    if dtype == torch.float32:
        got, want = run_both(case, dtype, bias=bias_for(case, gen, shared=True, h=2), **mask)
        names = ("out", "dq", "dk", "dv", "dbias")
        for name, a, b in zip(names, got, want, strict=True):
            assert rel_err(a, b) <= 1e-5, f"{name}: {rel_err(a, b):.3g}"
    else:
        got, want = run_both(case, dtype, **mask)
        eager = eager_half(case, dtype, **mask)
        for name, a, e, b in zip(("out", "dq", "dk", "dv"), got, eager, want, strict=True):
            assert rel_err(a, b) <= 2 * rel_err(e, b) + 1e-6, f"{name}: {rel_err(a, b):.3g} vs {rel_err(e, b):.3g}"
    assert passes == [[(False, True), (True, False)]]
