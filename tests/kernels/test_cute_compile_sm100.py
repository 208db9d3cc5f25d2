"""The CuTe-DSL Blackwell forward (``GdpaFwdSm100``) compiles for sm_100a without a GPU (its own target option, fake
tensors): bf16 and fp16, D = Dv of 64 and 128, tanh-based and select-based activations, one build without the mask
of keys past Nk and one of 64-key tiles; and its variants: the causal mask, windows, a bias tensor (bf16, fp16, fp32)
and varlen batches, alone and together. Each is checked for Blackwell's instructions and none of Hopper's (every
matmul a tcgen05.mma from shared memory or, for P, from tensor memory; S and O read from tensor memory by tcgen05.ld
after its wait, P written by tcgen05.st; one tensor-memory allocation of the columns the plan needs and its release;
no wgmma), TMA loads, 16-byte O stores, the persistent tile loop (each CTA steps by the grid's size), and no
register spills in ptxas's report. The compile cache keys on the target: the same key names another file for sm_90a
than for sm_100a, and the Blackwell build lands under the sm_100a fingerprint. The support checks take each variant
and refuse what the kernel lacks (Dv != D, a bias of another dtype or shape), each with its reason; the launchers
pass each variant's arguments and the persistent grid. No Blackwell GPU has run the kernel: these are the checks a
CPU can make.

The compiles go through the worker and report store of the sm_90a checks (``cute_compile_reports``), the spec
naming its target.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from compile_reports import CompileWorker, ReportStore, report_dir, run_dir
from cute_compile_reports import WORKER_ARGV, plan_fields, report_fingerprint

from gdpa_inductor import config

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is not installed")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402

from gdpa_inductor.kernels.common.window_bounds import UNBOUNDED  # noqa: E402
from gdpa_inductor.kernels.cute import compile_cache, fwd_support, varlen_support  # noqa: E402
from gdpa_inductor.kernels.cute.fwd_plan import Sm100FwdPlan, plan_fwd_sm100, sm100_kv_stages  # noqa: E402
from gdpa_inductor.kernels.cute.gdpa_fwd_sm100 import _SCORE_CHUNK, tmem_columns  # noqa: E402
from gdpa_inductor.kernels.cute.kernel_args import SM100_TARGET_ARCH, TARGET_ARCH  # noqa: E402

# (dtype, D, activation, mask_keys, key tile): both dtypes at both head dims, an activation through tanh.approx and one
# through selects at each, gelu_tanh without the mask of keys past Nk (its own form has no select), 64-key tiles
CASES = [
    ("bf16", 128, "gelu_tanh", True, 128),
    ("fp16", 128, "silu", True, 128),
    ("bf16", 64, "relu", True, 128),
    ("fp16", 64, "sigmoid", True, 128),
    ("bf16", 128, "gelu_tanh", False, 128),
    ("bf16", 64, "gelu_tanh", True, 64),
]
TANH_BASED = {"gelu", "gelu_tanh", "silu", "sigmoid"}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


# (dtype, D, activation, the plan's options): the causal mask and windows (the register-heaviest, fp16 silu at
# D = 128, among them), a bias tensor in both 16-bit dtypes at D = 128 and in fp32, varlen batches, and combinations
VARIANTS = [
    ("bf16", 128, "gelu_tanh", dict(causal=True)),
    ("fp16", 128, "silu", dict(causal=True)),
    ("bf16", 64, "relu", dict(causal=True, mask_keys=False)),
    ("bf16", 128, "gelu_tanh", dict(window=True)),
    ("fp16", 128, "silu", dict(window=True)),
    ("bf16", 128, "gelu_tanh", dict(bias="bfloat16")),
    ("fp16", 128, "silu", dict(bias="float16")),
    ("bf16", 128, "silu", dict(bias="float32", causal=True)),
    ("fp16", 128, "silu", dict(bias="float16", window=True)),
    ("bf16", 128, "gelu_tanh", dict(varlen=True)),
    ("fp16", 128, "silu", dict(varlen=True, window=True, bias="float16")),
    ("bf16", 64, "gelu_tanh", dict(varlen=True, causal=True, tile_n=64)),
]


def case_id(case) -> str:
    if len(case) == 4:
        dtype, d, act, options = case
        return f"{dtype}-D{d}-{act}-" + "-".join(f"{k}={v}" for k, v in options.items())
    dtype, d, act, mask, tile_n = case
    return f"{dtype}-D{d}-{act}-N{tile_n}" + ("" if mask else "-exact_keys")


def case_plan(case) -> Sm100FwdPlan:
    if len(case) == 4:
        dtype, d, act, options = case
        return plan_fwd_sm100(DTYPES[dtype], d, act, **options)
    dtype, d, act, mask, tile_n = case
    return plan_fwd_sm100(DTYPES[dtype], d, act, tile_n=tile_n, mask_keys=mask)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    fingerprint, worker = report_fingerprint(), CompileWorker(WORKER_ARGV)
    directory = report_dir(config.kernel_cache_dir, run_dir(tmp_path_factory), fingerprint)
    store = ReportStore(directory, worker.compile, still_current=lambda: report_fingerprint() == fingerprint)

    def report(case) -> dict:
        plan = case_plan(case)
        return store.report(dict(case=["fwd_sm100", case_id(case)], build="fwd_sm100", plan=plan_fields(plan),
                                 sass=False, target=plan.target))

    yield report
    worker.close()


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_cute_fwd_compiles_for_sm100a(case, reports):
    _, d, act, mask, _ = case
    plan = case_plan(case)
    r = reports(case)
    assert r["target"] == "sm_100a"
    assert r["wgmma_any"] == 0, "no Hopper matmuls"
    # Q Kᵀ (D / 16 k-blocks) and P V (tile_n / 16), each issued at two places: the first key tile's Q Kᵀ and the last
    # P V outside the loop, one of each in it
    assert r["tcgen05_mma"] == 2 * (d // 16) + 2 * (plan.tile_n // 16), r
    # S: tile_n columns in 32-column loads, one wait per step of ``_SCORE_CHUNK`` columns; O: Dv columns, 32 at a
    # time, each load followed by its wait before use
    steps = plan.tile_n // min(_SCORE_CHUNK, plan.tile_n)
    assert r["tcgen05_ld"] == plan.tile_n // 32 + d // 32, r
    assert r["tcgen05_wait_ld"] == steps + d // 32, r
    # P: a step's 16-bit values in half its columns, stored in two halves, then one wait before its commit
    assert r["tcgen05_st"] == 2 * steps and r["tcgen05_wait_st"] == 1, r
    # two S buffers and O, in a power of two of columns
    assert r["tmem_alloc_columns"] == tmem_columns(plan.tile_n, d) == (512 if plan.tile_n == 128 else 256), r
    assert r["tcgen05_alloc"] == 1 and r["tcgen05_dealloc"] == 1, r
    assert r["tcgen05_commit"] > 0, "the MMA warp signals through tcgen05.commit"
    assert r["grid_size_reads"] > 0, "persistent: each CTA steps through the tiles by the grid's size"
    assert r["tma_loads"] > 0, "Q/K/V loads go through TMA"
    # full and empty barriers: Q and K and V rings, two S and two P buffers, O (full, and empty for the next tile)
    assert plan.q_stages == 2
    assert r["mbarrier_init"] == 2 * plan.q_stages + 4 * plan.kv_stages + 4 + 4 + 2, r
    assert r["st_global_v4"] == d * 2 // 16, "each thread stores its row of O in 16-byte pieces"
    assert (r["tanh_approx"] > 0) == (act in TANH_BASED), r
    if act == "gelu_tanh":
        # gelu_tanh's form has no select: with the mask, one per score (a thread's 128 scores), without it none
        assert r["selp_f32"] == (plan.tile_n if mask else 0), r
    assert r["spill_stores"] == 0 and r["spill_loads"] == 0, r
    assert r["deprecations"] == [], r["deprecations"]


@pytest.mark.parametrize("case", VARIANTS, ids=case_id)
def test_cute_fwd_variants_compile_for_sm100a(case, reports):
    _, d, act, options = case
    plan = case_plan(case)
    r = reports(case)
    assert r["target"] == "sm_100a" and r["wgmma_any"] == 0, r
    assert r["tcgen05_mma"] == 2 * (d // 16) + 2 * (plan.tile_n // 16), r
    assert r["tcgen05_alloc"] == 1 and r["tcgen05_dealloc"] == 1 and r["tcgen05_commit"] > 0, r
    assert r["grid_size_reads"] > 0, r
    assert r["tmem_alloc_columns"] == tmem_columns(plan.tile_n, d), r
    assert r["tma_loads"] > 0, "Q/K/V loads go through TMA"
    # a band runs each key tile on one of two paths, the per-score mask or none: S's loads twice
    paths = 2 if plan.causal or plan.window else 1
    assert r["tcgen05_ld"] == paths * plan.tile_n // 32 + d // 32, r
    if plan.bias:
        # S in 32-column chunks, each with its own load, wait and P store; the bias read as 32-bit words of the row,
        # 16-bit values in pairs
        assert r["tcgen05_wait_ld"] == paths * plan.tile_n // 32 + d // 32, r
        assert r["tcgen05_st"] == paths * plan.tile_n // 32, r
        if plan.bias == "float32":
            assert r["ld_global_32"] == paths * plan.tile_n, r
        else:
            assert r["ld_global_pairs"] == paths * plan.tile_n // 2, r
    else:
        # no bias read: a varlen build's only 32-bit global loads are its sample's rows
        assert r["ld_global_pairs"] == 0 and (plan.varlen or r["ld_global_32"] == 0), r
    if plan.varlen:
        # ragged descriptors: (D, rows, H, Z, sample end); O stored from the tensor memory or, without keys, as zeros
        assert r["tma_5d"] > 0, r
        assert r["st_global_v4"] == 2 * d * 2 // 16, r
    else:
        assert r["tma_5d"] == 0 and r["st_global_v4"] == d * 2 // 16, r
    assert r["spill_stores"] == 0 and r["spill_loads"] == 0, r
    assert r["deprecations"] == [], r["deprecations"]


def test_plans_and_stages():
    assert sm100_kv_stages(128) == 2 and sm100_kv_stages(64) == 3
    plan = plan_fwd_sm100(torch.bfloat16, 128, "silu")
    assert plan.target == SM100_TARGET_ARCH != TARGET_ARCH and plan.head_dim_v == 128 and plan.kv_stages == 2
    with pytest.raises(ValueError, match="D = Dv"):
        Sm100FwdPlan(torch.bfloat16, 96, "silu")
    with pytest.raises(ValueError, match="fp16 or bf16"):
        Sm100FwdPlan(torch.float32, 64, "silu")
    with pytest.raises(ValueError, match="bias tensor"):
        Sm100FwdPlan(torch.bfloat16, 64, "silu", bias="float16")
    # a window carries the causal bound in its run-time bounds: one build for both; varlen always masks keys
    assert plan_fwd_sm100(torch.bfloat16, 64, "silu", causal=True, window=True) == \
        plan_fwd_sm100(torch.bfloat16, 64, "silu", window=True)
    assert plan_fwd_sm100(torch.bfloat16, 64, "silu", mask_keys=False, varlen=True).mask_keys
    # the persistent grid counts the CTAs an SM holds: two of the 64-key build at D = 64 (tensor memory allows it)
    assert plan_fwd_sm100(torch.bfloat16, 64, "silu", tile_n=64).ctas_per_sm == 512 // tmem_columns(64, 64) == 2


def test_the_cache_key_names_the_target(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "kernel_cache_dir", str(tmp_path))
    compile_cache.source_fingerprint.cache_clear()
    try:
        hopper, blackwell = compile_cache.source_fingerprint(TARGET_ARCH), compile_cache.source_fingerprint("sm_100a")
        assert hopper != blackwell and compile_cache.source_fingerprint() == hopper
        key = (plan_fwd_sm100(torch.bfloat16, 64, "relu"), False)
        assert compile_cache.cache_path(key, "sm_100a").parent.name == blackwell
        assert compile_cache.cache_path(key, TARGET_ARCH) != compile_cache.cache_path(key, "sm_100a")
        assert compile_cache.cache_path(key) == compile_cache.cache_path(key, TARGET_ARCH)
    finally:
        compile_cache.source_fingerprint.cache_clear()


def test_the_blackwell_build_is_cached_under_its_target(tmp_path, monkeypatch):
    """One real compile in this process (sm_100a, named by the build's options, whatever cutlass-dsl assumed when
    imported): its object file lands under the sm_100a fingerprint, none under sm_90a's."""
    from gdpa_inductor.kernels.cute.kernel_build import compile_fwd_sm100

    monkeypatch.setattr(config, "kernel_cache_dir", str(tmp_path))
    monkeypatch.setattr(compile_cache, "_MEMORY", {})
    plan = plan_fwd_sm100(torch.bfloat16, 64, "relu")
    assert callable(compile_fwd_sm100(plan))
    files = list(tmp_path.rglob("*.o"))
    assert [f.parent.name for f in files] == [compile_cache.source_fingerprint(SM100_TARGET_ARCH)]
    assert compile_cache.cache_path((plan, False), SM100_TARGET_ARCH) == files[0]


@pytest.fixture
def on_blackwell(monkeypatch):
    """The support check as on an sm_100 GPU with the CuTe stack installed (CPU tensors stand in for its own)."""
    monkeypatch.setattr(fwd_support, "cute_dsl_available", lambda: True)
    monkeypatch.setattr(fwd_support, "on_sm100", lambda device: True)


def _operands(d=128, dv=None, nk=256, dtype=torch.bfloat16, kv_heads=4):
    q = torch.zeros(2, 4, 200, d, dtype=dtype)
    k = torch.zeros(2, kv_heads, nk, d, dtype=dtype)
    return q, k, torch.zeros(2, kv_heads, nk, d if dv is None else dv, dtype=dtype)


@pytest.mark.parametrize("change, reason", [
    (dict(bias=torch.zeros(2, 4, 200, 256, dtype=torch.float16)), "operands' dtype"),
    (dict(bias=torch.zeros(2, 4, 200, 1)), "bias [1 or 2, 1 or 4, 200, 256]"),
    (dict(bias=torch.zeros(2, 4, 100, 256, dtype=torch.bfloat16)), "(Nq, Nk)"),
    (dict(bias=torch.zeros(3, 4, 200, 256, dtype=torch.bfloat16)), "leading dims"),
    (dict(window=(-2, 3)), "window"),
    (dict(dv=64), "D = Dv"),
    (dict(d=96), "head dims"),
    (dict(nk=0), "at least one key"),
    (dict(kv_heads=3), "a multiple of k's"),
    (dict(dtype=torch.float32), "fp16/bf16"),
], ids=["bias_dtype", "fp32_bias_shape", "bias_shape", "bias_batch", "window", "dv_differs", "d96", "no_keys",
        "heads", "fp32"])
def test_the_support_check_refuses_with_a_reason(on_blackwell, change, reason):
    causal, bias, window = change.pop("causal", False), change.pop("bias", None), change.pop("window", (-1, -1))
    q, k, v = _operands(**change)
    ok, why = fwd_support.sm100_fwd_supported(q, k, v, bias, causal, "silu", window)
    assert not ok and reason in why, why


@pytest.mark.parametrize("causal, window, bias", [
    (False, (-1, -1), None),
    (True, (-1, -1), None),
    (False, (64, 0), None),
    (True, (300, -1), None),
    (False, (-1, -1), torch.zeros(2, 4, 200, 256, dtype=torch.bfloat16)),
    (False, (-1, -1), torch.zeros(1, 1, 200, 256, dtype=torch.bfloat16)),
    (False, (-1, -1), torch.zeros(1, 256, dtype=torch.bfloat16).expand(200, 256)),
    (False, (-1, -1), torch.zeros(2, 1, 200, 256, dtype=torch.float16).expand(2, 4, 200, 256)),
    (True, (-1, -1), torch.zeros(2, 1, 200, 256)),
    (False, (-1, -1), torch.tensor(-1.5)),
], ids=["plain", "causal", "window", "causal_window", "bias", "bias_broadcast", "bias_one_row", "bias_stride0_heads",
        "fp32_bias", "one_element"])
def test_the_support_check_takes_each_variant(on_blackwell, causal, window, bias):
    # causal at any Nq, Nk (here Nq = 200, Nk = 256: not a whole number of tiles apart)
    dtype = torch.float16 if bias is not None and bias.dtype == torch.float16 else torch.bfloat16
    assert fwd_support.sm100_fwd_supported(*_operands(dtype=dtype), bias, causal, "gelu_tanh", window) == (True, "")


def test_the_support_check_wants_an_sm100_gpu():
    ok, why = fwd_support.sm100_fwd_supported(*_operands(), None, False, "gelu_tanh")
    assert not ok and why


@pytest.fixture(autouse=True)
def blackwell_sm_count(monkeypatch):
    """The launchers size the persistent grid by the device's SM count: a B200's 148 here, on CPU tensors."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=148))


class RecordedBuild:
    """Stands in for ``compile_fwd_sm100``: records the plan it is asked for and the arguments of the launch."""

    def __init__(self):
        self.plans, self.calls = [], []

    def __call__(self, plan):
        self.plans.append(plan)
        return lambda *args: self.calls.append(args)


@pytest.mark.parametrize("nk, masked", [(256, False), (200, True)])
def test_the_launcher_passes_the_schema_arguments(monkeypatch, nk, masked):
    """The launcher plans the call (the mask of keys past Nk where Nk is not a multiple of the key tile) and passes
    the operands in the kernel's (N, D, H, Z) modes and the scalars, in ``GdpaFwdSm100.__call__``'s order (the stream
    is the compiled function's own)."""
    from gdpa_inductor.kernels.cute import gdpa_fwd

    build = RecordedBuild()
    monkeypatch.setattr(gdpa_fwd, "compile_fwd_sm100", build)
    q, k, v = _operands(nk=nk)
    out = gdpa_fwd.gdpa_fwd_cute_sm100(q, k, v, "silu", 0.125, 0.5, 0.01)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert build.plans == [plan_fwd_sm100(torch.bfloat16, 128, "silu", mask_keys=masked)]
    (args,) = build.calls
    assert [tuple(a.shape) for a in args[:4]] == [(200, 128, 4, 2), (nk, 128, 4, 2), (nk, 128, 4, 2), (200, 128, 4, 2)]
    assert args[3].data_ptr() == out.data_ptr() and args[4:7] == (0.125, 0.5, 0.01)
    # the grid: 2 query tiles x 4 heads x 2 samples, fewer than the SMs
    assert args[7] == 16
    # rows, num_m (varlen), the window's bounds, the bias: none in a plain build
    assert args[8:] == (None,) * 5


@pytest.mark.parametrize("causal, window, plan_causal, bounds", [
    (True, (-1, -1), True, (None, None)),
    (False, (16, 0), False, (16, 0)),
    (True, (-1, 5), False, (UNBOUNDED, 0)),
    (False, (-1, 7), False, (UNBOUNDED, 7)),
])
def test_the_launcher_passes_the_band(monkeypatch, causal, window, plan_causal, bounds):
    """The causal mask alone is a build of its own; a window's bounds (with the causal bound folded in, as the varlen
    op's ``band_limits``) are run-time arguments of the window build."""
    from gdpa_inductor.kernels.cute import gdpa_fwd

    build = RecordedBuild()
    monkeypatch.setattr(gdpa_fwd, "compile_fwd_sm100", build)
    gdpa_fwd.gdpa_fwd_cute_sm100(*_operands(), "silu", 1.0, 1.0, 0.01, causal=causal, window=window)
    (plan,), (args,) = build.plans, build.calls
    assert (plan.causal, plan.window) == (plan_causal, bounds != (None, None))
    assert args[10:12] == bounds and args[12] is None


@pytest.mark.parametrize("bias, name, words", [
    (torch.arange(2 * 4 * 200 * 256, dtype=torch.bfloat16).view(2, 4, 200, 256), "bfloat16", (200, 128, 4, 2)),
    (torch.zeros(1, 1, 200, 256, dtype=torch.bfloat16), "bfloat16", (200, 128, 1, 1)),
    (torch.randn(2, 1, 200, 256), "float32", (200, 256, 1, 2)),
    (torch.tensor(-1.5, dtype=torch.bfloat16), "float32", (200, 256, 1, 1)),
], ids=["bf16", "bf16_broadcast", "fp32", "one_element"])
def test_the_launcher_passes_the_bias_words(monkeypatch, bias, name, words):
    """The bias as the kernel reads it: 16-bit values as int32 pairs, fp32 as it is, one element as an fp32 row of
    Nk copies over Nq rows of stride 0; in the (Nq, words a row, Hb, Zb) modes."""
    from gdpa_inductor.kernels.cute import gdpa_fwd

    build = RecordedBuild()
    monkeypatch.setattr(gdpa_fwd, "compile_fwd_sm100", build)
    gdpa_fwd.gdpa_fwd_cute_sm100(*_operands(), "silu", 1.0, 1.0, 0.01, bias=bias)
    (plan,), (args,) = build.plans, build.calls
    given = args[12]
    assert plan.bias == name and tuple(given.shape) == words and given.stride(1) == 1
    assert given.dtype == (torch.float32 if name == "float32" else torch.int32)
    if bias.numel() == 1:
        assert given.stride(0) == 0 and bool((given == -1.5).all())
    elif name == "bfloat16":
        # word w of row i holds columns 2w and 2w + 1
        assert torch.equal(given[5, 7, -1, -1].reshape(1).clone().view(torch.bfloat16), bias[-1, -1, 5, 14:16])


def test_the_varlen_launcher_passes_the_rows(monkeypatch):
    """The varlen launcher's grid rows (per sample: first query row, query count, first key row, key count, index),
    the longest sample's query tiles, and the band's bounds, in the schema's slots."""
    from gdpa_inductor.kernels.common.varlen_rows import VarlenSide
    from gdpa_inductor.kernels.cute import varlen_fwd

    build = RecordedBuild()
    monkeypatch.setattr(varlen_fwd, "compile_fwd_sm100", build)
    cu = torch.tensor([0, 300, 310], dtype=torch.int32)
    q = torch.zeros(310, 4, 128, dtype=torch.bfloat16)
    k, v = torch.zeros_like(q), torch.zeros_like(q)

    def side(t):
        return VarlenSide(t, cu[:-1], cu[1:] - cu[:-1], 300, 2, True)

    out = varlen_fwd.gdpa_varlen_fwd_cute_sm100(side(q), side(k), v, side(torch.empty_like(q)),
                                                torch.tensor([0, 1]), "silu", 1.0, 1.0, 0.01, causal=True,
                                                window=(40, -1))
    (plan,), (args,) = build.plans, build.calls
    assert plan.varlen and plan.window and not plan.causal and plan.mask_keys
    assert [tuple(a.shape) for a in args[:4]] == [(310, 128, 4, 1)] * 4 and args[3].data_ptr() == out.data_ptr()
    # 3 query tiles x 4 heads x 2 samples, the grid coprime with the 3 query tiles: jagged samples
    assert args[7] == 24
    assert args[8].tolist() == [[0, 300], [300, 10], [0, 300], [300, 10], [0, 1]]
    assert args[9:12] == (3, 40, 0) and args[12] is None


def test_the_launcher_takes_a_grid(monkeypatch):
    """A grid smaller than the tiles (a check on small inputs whose CTAs each walk several tiles), at most the tiles."""
    from gdpa_inductor.kernels.cute import gdpa_fwd

    build = RecordedBuild()
    monkeypatch.setattr(gdpa_fwd, "compile_fwd_sm100", build)
    for ctas, grid in [(3, 3), (100, 16), (0, 1)]:
        gdpa_fwd.gdpa_fwd_cute_sm100(*_operands(), "silu", 1.0, 1.0, 0.01, ctas=ctas)
        assert build.calls[-1][7] == grid


def test_the_launcher_compiles_nothing_without_keys(monkeypatch):
    from gdpa_inductor.kernels.cute import gdpa_fwd

    build = RecordedBuild()
    monkeypatch.setattr(gdpa_fwd, "compile_fwd_sm100", build)
    q, k, v = _operands(nk=0)
    out = gdpa_fwd.gdpa_fwd_cute_sm100(q, k, v, "silu", 1.0, 1.0, 0.01, out=torch.full_like(q, 7.0))
    assert build.plans == [] and not out.any()


@pytest.mark.parametrize("d, tile_n", [(128, 128), (64, 64)])
def test_each_activation_thread_holds_its_row_in_order(d, tile_n):
    """The kernel's tensor-memory copies (traced for sm_100a with a static thread index; no kernel): thread t of
    the activation warps loads row t of S with its keys in order, stores P's 16-bit pairs of that row in order (so the
    bf16 view of its registers in S's order is P's column order), and loads row t of O in 32-column chunks, each in
    order: what the key mask (column coordinates), the in-place P (its columns never ahead of the loaded S) and the O
    stores from the registers (row t, contiguous) assume."""
    from gdpa_inductor.kernels.cute import activation_math
    from gdpa_inductor.kernels.cute.gdpa_fwd_sm100 import _EPI_COLUMNS, GdpaFwdSm100

    kernel = GdpaFwdSm100(cutlass.BFloat16, d, d, activation_math.forward_form("relu", False), tile_n=tile_n)
    found = {}

    @cute.jit
    def trace(t: cutlass.Constexpr):
        qk_mma, pv_mma = kernel._tiled_mmas()
        tmem = cute.make_ptr(cutlass.Float32, 0, cute.AddressSpace.tmem, assumed_align=16)
        *_, tLcS, tLcP = kernel._score_copies(qk_mma.get_slice(0), tmem, t)
        _, tLtO, tLcO = kernel._o_copy(pv_mma.get_slice(0), tmem, t)
        found[t] = dict(
            s=[tuple(tLcS[i]) for i in range(cute.size(tLcS))], p=[tuple(tLcP[i]) for i in range(cute.size(tLcP))],
            o=[[tuple(tLcO[None, 0, 0, c][i]) for i in range(_EPI_COLUMNS)] for c in range(cute.size(tLcO, mode=[3]))],
        )

    for t in (0, 33, 127):
        cute.compile(trace, t, options=f"--gpu-arch {SM100_TARGET_ARCH}")
        # one step's columns: the tile's, or 64 of them (``_SCORE_CHUNK``)
        assert found[t]["s"] == [(t, c) for c in range(kernel.chunk)] and kernel.chunk == min(tile_n, _SCORE_CHUNK)
        assert found[t]["p"] == [(t, c) for c in range(kernel.chunk // 2)]
        assert found[t]["o"] == [[(t, c * _EPI_COLUMNS + i) for i in range(_EPI_COLUMNS)] for c in range(d // 32)]


@pytest.fixture
def varlen_on_blackwell(monkeypatch):
    monkeypatch.setattr(varlen_support, "cute_dsl_available", lambda: True)
    monkeypatch.setattr(varlen_support, "on_sm100", lambda device: True)


def _jagged(d=128, dv=None, dtype=torch.bfloat16):
    q = torch.zeros(310, 4, d, dtype=dtype)
    return q, torch.zeros(310, 4, d, dtype=dtype), torch.zeros(310, 4, d if dv is None else dv, dtype=dtype)


ROWS = (torch.tensor([0, 300, 310], dtype=torch.int32),) * 2 + (None, None)


@pytest.mark.parametrize("causal, window, bias", [
    (False, (-1, -1), None),
    (True, (-1, -1), None),
    (True, (64, -1), torch.zeros(2, 4, 300, 300, dtype=torch.bfloat16)),
    (False, (-1, -1), torch.zeros(1, 1, 300, 300)),
    (False, (-1, -1), torch.tensor(0.5)),
], ids=["plain", "causal", "window_bias", "fp32_bias", "one_element"])
def test_the_varlen_support_check_takes_each_variant(varlen_on_blackwell, causal, window, bias):
    # the causal mask with the rows of two cu_seqlens tensors: any per-sample Nk - Nq
    rows = (ROWS[0], ROWS[0].clone(), None, None)
    assert varlen_support.sm100_varlen_fwd_support(*_jagged(), bias, causal, window, "silu", rows) == (True, "")


@pytest.mark.parametrize("change, bias, reason", [
    (dict(dv=64), None, "D = Dv"),
    (dict(d=96), None, "head dims"),
    (dict(), torch.zeros(1, 1, 300, 1, dtype=torch.bfloat16), "every key position"),
    (dict(), torch.zeros(1, 1, 300, 300, dtype=torch.float16), "operands' dtype"),
    (dict(), torch.zeros(1, 1, 300, 1), "every key position"),
], ids=["dv_differs", "d96", "bias_broadcast_keys", "bias_dtype", "fp32_bias_broadcast_keys"])
def test_the_varlen_support_check_refuses_with_a_reason(varlen_on_blackwell, change, bias, reason):
    ok, why = varlen_support.sm100_varlen_fwd_support(*_jagged(**change), bias, False, (-1, -1), "silu", ROWS)
    assert not ok and reason in why, why


def test_the_varlen_support_check_wants_an_sm100_gpu():
    ok, why = varlen_support.sm100_varlen_fwd_support(*_jagged(), None, False, (-1, -1), "silu", ROWS)
    assert not ok and why


def test_a_bias_build_holds_its_rows_in_chunks():
    """With a bias the activation warps take S 32 columns at a time: thread t's registers hold row t, the chunk's
    columns in order (the bias words are read by those columns), and its P registers the chunk's 16-bit pairs in
    order, written 16 fp32 columns per chunk."""
    from gdpa_inductor.kernels.cute import activation_math
    from gdpa_inductor.kernels.cute.gdpa_fwd_sm100 import _BIAS_CHUNK, GdpaFwdSm100

    kernel = GdpaFwdSm100(cutlass.BFloat16, 128, 128, activation_math.forward_form("silu", False),
                          bias=cutlass.BFloat16)
    assert kernel.chunk == _BIAS_CHUNK == 32
    found = {}

    @cute.jit
    def trace(t: cutlass.Constexpr):
        qk_mma, _ = kernel._tiled_mmas()
        tmem = cute.make_ptr(cutlass.Float32, 0, cute.AddressSpace.tmem, assumed_align=16)
        *_, tLcS, tLcP = kernel._score_copies(qk_mma.get_slice(0), tmem, t)
        found[t] = ([tuple(tLcS[i]) for i in range(cute.size(tLcS))], [tuple(tLcP[i]) for i in range(cute.size(tLcP))])

    for t in (0, 77):
        cute.compile(trace, t, options=f"--gpu-arch {SM100_TARGET_ARCH}")
        assert found[t] == ([(t, c) for c in range(32)], [(t, c) for c in range(16)])
