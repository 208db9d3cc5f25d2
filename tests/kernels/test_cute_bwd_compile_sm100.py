"""The CuTe-DSL Blackwell backward (``GdpaBwdSm100``) compiles for sm_100a without a GPU (fake tensors): bf16 and fp16,
D = Dv of 64 and 128, silu, gelu_tanh and relu, one build without the mask of queries past Nq, the causal mask, a
window, varlen batches, and a bias with its gradient. Each is checked for
Blackwell's instructions and none of Hopper's (every matmul a tcgen05.mma: Sᵀ, dPᵀ, dV with Pᵀ from tensor memory, dK,
dQ; Sᵀ, dPᵀ, dQ, dK and dV read by tcgen05.ld, Pᵀ written by tcgen05.st; one allocation of 512 columns and its
release; no wgmma), TMA loads, dSᵀ stored to shared memory in 16-byte pieces, dQ added by ``red.global.add.v4.f32``,
dK and dV stored in 16-byte pieces, and no register spills in ptxas's report. On CPU traces: the shared-memory views
the matmuls read as their transposes (Kᵀ, Qᵀ, dOᵀ, dS) cover the same bytes as the K-major layouts loaded or written,
the kernel's dSᵀ addresses are those of its layout, and each thread's tensor-memory copies hold its row, columns in
order. A float64 model of the kernel's tiles, scales and mask gives autograd's gradients. The support check refuses
what the kernel lacks, each with its reason, and the launcher passes the schema's arguments. No Blackwell GPU has run
the kernel: these are the checks a CPU can make.
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

from gdpa_inductor.kernels.cute import bwd_support, fwd_support  # noqa: E402
from gdpa_inductor.kernels.cute.bwd_plan import Sm100BwdPlan, plan_bwd_sm100, sm100_bwd_q_stages  # noqa: E402
from gdpa_inductor.kernels.cute.gdpa_bwd_sm100 import tmem_columns  # noqa: E402
from gdpa_inductor.kernels.cute.kernel_args import SM100_TARGET_ARCH  # noqa: E402

# (dtype, D, activation, mask_queries, band): both dtypes at both head dims, silu and gelu_tanh (tanh.approx) at each,
# relu (selects) once, one build without the mask of queries past Nq; the causal mask and a window at both head dims;
# varlen, its own or with the causal mask, at both; a bias of the operands' dtype and an fp32 one, each with its
# gradient. The last slot names the features, "-" between them
CASES = [
    ("bf16", 128, "gelu_tanh", True, ""),
    ("fp16", 128, "silu", True, ""),
    ("bf16", 64, "silu", True, ""),
    ("fp16", 64, "gelu_tanh", True, ""),
    ("bf16", 64, "relu", False, ""),
    ("bf16", 128, "silu", True, "causal"),
    ("fp16", 64, "gelu_tanh", False, "window"),
    ("bf16", 128, "silu", True, "varlen"),
    ("fp16", 64, "gelu_tanh", True, "varlen-causal"),
    ("bf16", 128, "silu", True, "bias-grad"),
    ("fp16", 64, "gelu_tanh", True, "causal-bias_fp32-grad"),
    ("bf16", 128, "silu", True, "varlen-causal-bias-grad"),
]
TANH_BASED = {"gelu", "gelu_tanh", "silu", "sigmoid"}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
TILE = 128


def case_id(case) -> str:
    dtype, d, act, mask, band = case
    return f"{dtype}-D{d}-{act}" + ("" if mask else "-exact_queries") + (f"-{band}" if band else "")


def case_plan(case) -> Sm100BwdPlan:
    dtype, d, act, mask, features = case
    parts = features.split("-")
    bias = "float32" if "bias_fp32" in parts else str(DTYPES[dtype]).removeprefix("torch.") if "bias" in parts else ""
    return plan_bwd_sm100(DTYPES[dtype], d, act, mask_queries=mask, causal="causal" in parts,
                          window="window" in parts, varlen="varlen" in parts, bias=bias, bias_grad="grad" in parts)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    fingerprint, worker = report_fingerprint(), CompileWorker(WORKER_ARGV)
    directory = report_dir(config.kernel_cache_dir, run_dir(tmp_path_factory), fingerprint)
    store = ReportStore(directory, worker.compile, still_current=lambda: report_fingerprint() == fingerprint)

    def report(case) -> dict:
        plan = case_plan(case)
        return store.report(dict(case=["bwd_sm100", *case], build="bwd_sm100", plan=plan_fields(plan), sass=False,
                                 target=plan.target))

    yield report
    worker.close()


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_cute_bwd_compiles_for_sm100a(case, reports):
    _, d, act, mask, band = case
    plan = case_plan(case)
    r = reports(case)
    assert r["target"] == "sm_100a"
    assert r["wgmma_any"] == 0, "no Hopper matmuls"
    # under a band the compute warps' tile step is built twice (edge tiles masked per score, whole ones not), each
    # taking 16 scores at a time rather than 32
    paths = 2 if plan.causal or plan.window else 1
    chunk = 16 if plan.causal or plan.window or plan.bias else 32
    # Sᵀ and dPᵀ over D / 16 k-blocks each, dV, dK and dQ over 128 / 16 each, issued once a query tile
    assert r["tcgen05_mma"] == 2 * (d // 16) + 3 * (TILE // 16), r
    # Sᵀ and dPᵀ in 32-column loads; dQ, dV and dK D columns each, 32 at a time
    assert r["tcgen05_ld"] == paths * 2 * (TILE // chunk) + 3 * (d // 32), r
    # Pᵀ: a column of 16-bit pairs per two scores, one store a chunk, then one wait before its commit
    assert r["tcgen05_st"] == paths * TILE // chunk and r["tcgen05_wait_st"] == 1, r
    assert r["tmem_alloc_columns"] == tmem_columns(d, d) == 512, r
    assert r["tcgen05_alloc"] == 1 and r["tcgen05_dealloc"] == 1, r
    # Sᵀ, dPᵀ and dQ full, P, dO, dS and Q released, K and V released at a work tile's end, dK/dV full: each by
    # tcgen05.commit
    assert r["tcgen05_commit"] == 10, r
    assert r["tma_loads"] > 0, "K/V/Q/dO loads go through TMA"
    # full and empty barriers: K, V, the Q and dO rings, Sᵀ, dPᵀ, P, dS, dQ, dK/dV
    assert r["mbarrier_init"] == 2 * (2 + 2 * plan.q_stages + 6), r
    # dSᵀ: a thread's 128 16-bit values of its row in 16-byte stores (ptxas may merge the two paths' last one)
    assert paths * TILE * 2 // 16 - (paths - 1) <= r["st_shared_v4"] <= paths * TILE * 2 // 16, r
    # dQ: a thread's row of D fp32 sums, four a reduction; dK and dV: its rows in 16-byte stores
    assert r["red_v4_f32"] == d // 4, r
    assert r["st_global_v4"] == 2 * (d * 2 // 16), r
    # dS into the bias gradient's buffer: one store a score of each step variant, none without it
    assert r["st_global"] - r["st_global_v4"] == (paths * TILE if plan.bias_grad else 0), r
    assert (r["tanh_approx"] > 0) == (act in TANH_BASED), r
    if act == "silu" and case[0] == "fp16" and not (plan.causal or plan.window):
        # the mask: P and dS of each of a thread's 128 scores kept or zeroed by a select
        assert r["selp_f32"] == 2 * TILE, r
    assert r["spill_stores"] == 0 and r["spill_loads"] == 0, r
    assert r["deprecations"] == [], r["deprecations"]


def test_tensor_memory_columns():
    """Sᵀ and dPᵀ (128 columns each, dQ within dPᵀ's), dV and dK: 384 columns at D = 64, rounded up to 512; 512 at
    D = 128, the whole tensor memory."""
    assert tmem_columns(64, 64) == tmem_columns(128, 128) == 512
    with pytest.raises(AssertionError):
        tmem_columns(256, 256)


def test_plans_and_stages():
    assert sm100_bwd_q_stages(128) == 2 and sm100_bwd_q_stages(64) == 2
    plan = plan_bwd_sm100(torch.bfloat16, 128, "silu")
    assert plan.target == SM100_TARGET_ARCH and plan.head_dim_v == 128 and plan.q_stages == 2
    with pytest.raises(ValueError, match="D = Dv"):
        Sm100BwdPlan(torch.bfloat16, 96, "silu")
    with pytest.raises(ValueError, match="fp16 or bf16"):
        Sm100BwdPlan(torch.float32, 64, "silu")
    with pytest.raises(ValueError, match="stages"):
        Sm100BwdPlan(torch.bfloat16, 64, "silu", q_stages=3)


def _kernel(d: int, causal: bool = False):
    from gdpa_inductor.kernels.cute import activation_math
    from gdpa_inductor.kernels.cute.gdpa_bwd_sm100 import GdpaBwdSm100

    return GdpaBwdSm100(cutlass.BFloat16, d, d, activation_math.backward_form("silu", False), q_stages=2,
                        causal=causal)


def _offset(layout, mn: int, k: int, stage: int = 0) -> int:
    """The element offset (before the swizzle) of an operand's (M or N, K) element in its shared-memory layout
    (``make_smem_layout_a``/``_b``: ((MN atom, K atom), 1, K blocks, stages))."""
    return cute.crd2idx(((mn, k % 16), 0, k // 16, stage), layout.outer)


@pytest.mark.parametrize("d", [64, 128])
def test_the_transposed_views_cover_the_same_bytes(d):
    """Each MN-major view a matmul reads (Kᵀ of dQ, Qᵀ of dK, dOᵀ of dV, dS of dQ) puts every element at the offset
    of the K-major layout the tile was loaded or written in, with the same swizzle, at every stage; and the kernel's
    own dSᵀ addresses (``ds_offset``) are its layout's, swizzled."""
    from gdpa_inductor.kernels.cute.gdpa_bwd_sm100 import ds_offset

    kernel = _kernel(d)
    found = {}

    @cute.jit
    def trace():
        lay = kernel._smem_layouts(kernel._tiled_mmas())
        # (loaded or written, its transposed view, the loaded one's (MN, K) extents, stages)
        pairs = (("k", "kt", TILE, d, 1), ("q", "qt", TILE, d, 2), ("do", "dot", TILE, d, 2),
                 ("dst", "ds", TILE, TILE, 1))
        for name, t_name, rows, cols, stages in pairs:
            a, b = lay[name], lay[t_name]
            found[name] = (str(a.inner) == str(b.inner), [
                (_offset(a, r, c, st), _offset(b, c, r, st))
                for st in range(stages) for r in range(0, rows, 3) for c in range(0, cols, 5)
            ])
        found["swizzle"] = str(lay["dst"].inner)
        found["ds"] = [(_offset(lay["dst"], r, c), ds_offset(r, c)) for r in range(0, TILE, 3) for c in range(TILE)]

    cute.compile(trace, options=f"--gpu-arch {SM100_TARGET_ARCH}")
    for name in ("k", "q", "do", "dst"):
        same_swizzle, offsets = found[name]
        assert same_swizzle and all(x == y for x, y in offsets), name
    # 128-byte swizzle of 16-bit elements: the 16-byte chunk's index (bits 3-5) XORed with bits 6-8
    assert found["swizzle"] == "S<3,4,3>"
    assert all(plain ^ (((plain >> 6) & 7) << 3) == mine for plain, mine in found["ds"])


@pytest.mark.parametrize("d, causal", [(64, False), (128, False), (128, True)])
def test_each_thread_holds_its_row_in_order(d, causal):
    """The kernel's tensor-memory copies (traced for sm_100a with a static thread index; no kernel): compute thread t
    loads key row t of Sᵀ (and dPᵀ, the same copy) with its queries in order and stores Pᵀ's 16-bit pairs of that
    row in order, 32 scores at a time (16 under a band); thread t of the dQ warps loads query row t of dQ, and
    compute thread t key row t of dV and dK, in 32-column chunks, each in order: what the query and band masks, the
    in-place Pᵀ, the dSᵀ stores to its row, the dQ reductions and the dK/dV stores assume."""
    from gdpa_inductor.kernels.cute.gdpa_bwd_sm100 import _CHUNK

    kernel = _kernel(d, causal)
    step = 16 if causal else 32
    found = {}

    @cute.jit
    def trace(t: cutlass.Constexpr):
        mmas = kernel._tiled_mmas()
        tmem = cute.make_ptr(cutlass.Float32, 0, cute.AddressSpace.tmem, assumed_align=16)
        *_, tLcS, tLcP = kernel._score_copies(mmas[0].get_slice(0), tmem, t)

        def chunks(coords):
            return [[tuple(coords[None, 0, 0, c][i]) for i in range(cute.size(coords[None, 0, 0, c]))]
                    for c in range(cute.size(coords, mode=[3]))]

        found[t] = dict(s=chunks(tLcS), p=chunks(tLcP))
        for name, mma, tiler in (("dv", mmas[2], kernel.dv_tiler), ("dk", mmas[3], kernel.dk_tiler),
                                 ("dq", mmas[4], kernel.dq_tiler)):
            found[t][name] = chunks(kernel._acc_copy(mma.get_slice(0), tiler[:2], tmem, t)[2])

    for t in (0, 33, 127):
        cute.compile(trace, t, options=f"--gpu-arch {SM100_TARGET_ARCH}")
        assert found[t]["s"] == [[(t, c * step + i) for i in range(step)] for c in range(TILE // step)]
        assert found[t]["p"] == [[(t, c * step // 2 + i) for i in range(step // 2)] for c in range(TILE // step)]
        for name in ("dv", "dk", "dq"):
            assert found[t][name] == [[(t, c * _CHUNK + i) for i in range(_CHUNK)] for c in range(d // _CHUNK)], name


@pytest.fixture
def on_blackwell(monkeypatch):
    """The support check as on an sm_100 GPU with the CuTe stack installed (CPU tensors stand in for its own)."""
    monkeypatch.setattr(bwd_support, "cute_dsl_available", lambda: True)
    monkeypatch.setattr(bwd_support, "on_sm100", lambda device: True)
    monkeypatch.setattr(fwd_support, "cute_dsl_available", lambda: True)


def _operands(d=128, dv=None, nk=256, nq=200, dtype=torch.bfloat16, kv_heads=4):
    q = torch.zeros(2, 4, nq, d, dtype=dtype)
    k = torch.zeros(2, kv_heads, nk, d, dtype=dtype)
    v = torch.zeros(2, kv_heads, nk, d if dv is None else dv, dtype=dtype)
    return q, k, v, torch.zeros(2, 4, nq, v.shape[-1], dtype=dtype)


@pytest.mark.parametrize("change, reason", [
    (dict(bias=torch.ones(1), bias_grad=True), "a tensor only"),
    (dict(bias=torch.ones(2, 4, 200, 256).transpose(-1, -2).contiguous().transpose(-1, -2)), "keys contiguous"),
    (dict(bias=torch.ones(3, 4, 200, 256, dtype=torch.bfloat16)), "shape [1 or 2, 1 or 4, 200, 256]"),
    (dict(bias=torch.ones(1, 4, 200, 256, dtype=torch.float16)), "operands' dtype or float32"),
    (dict(dv=64), "D = Dv"),
    (dict(d=96), "head dims"),
    (dict(kv_heads=3), "a multiple of k's"),
    (dict(dtype=torch.float32), "fp16/bf16"),
    (dict(grad_out=torch.zeros(2, 4, 200, 128, dtype=torch.float16)), "grad_out"),
], ids=["one_element_gradient", "bias_columns", "bias_batch", "bias_dtype", "dv_differs", "d96", "heads", "fp32",
        "grad_out_dtype"])
def test_the_support_check_refuses_with_a_reason(on_blackwell, change, reason):
    causal, bias, grad_out = change.pop("causal", False), change.pop("bias", None), change.pop("grad_out", None)
    bias_grad = change.pop("bias_grad", False)
    q, k, v, do = _operands(**change)
    ok, why = bwd_support.sm100_bwd_supported(q, k, v, do if grad_out is None else grad_out, bias, causal, "silu",
                                              bias_grad)
    assert not ok and reason in why, why


def test_the_support_check_takes_a_plain_call(on_blackwell):
    assert bwd_support.sm100_bwd_supported(*_operands(), None, False, "gelu_tanh") == (True, "")
    assert bwd_support.sm100_bwd_supported(*_operands(), None, True, "silu") == (True, "")
    for bias, grad in [(torch.ones(1, 4, 200, 256, dtype=torch.bfloat16), True), (torch.ones(2, 1, 200, 256), True),
                       (torch.ones(1, dtype=torch.float16), False)]:
        assert bwd_support.sm100_bwd_supported(*_operands(), bias, False, "silu", grad) == (True, "")
    assert bwd_support.sm100_bwd_supported(*_operands(kv_heads=2, d=64), None, False, "silu") == (True, "")


def test_the_support_check_wants_an_sm100_gpu():
    ok, why = bwd_support.sm100_bwd_supported(*_operands(), None, False, "gelu_tanh")
    assert not ok and why


@pytest.fixture(autouse=True)
def blackwell_sm_count(monkeypatch):
    """The launchers size the persistent grid by the device's SM count: a B200's 148 here, on CPU tensors."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=148))


class RecordedBuild:
    """Stands in for ``compile_bwd_sm100``: records the plan it is asked for and the arguments of the launch."""

    def __init__(self):
        self.plans, self.calls = [], []

    def __call__(self, plan):
        self.plans.append(plan)
        return lambda *args: self.calls.append(args)


# (causal, window as the op takes it, the plan's band, the bounds passed)
BAND_CALLS = [(False, (-1, -1), "", (None, None)), (True, (-1, -1), "causal", (None, None)),
              (True, (64, -1), "window", (64, 0)), (False, (-1, 5), "window", (1 << 30, 5))]


@pytest.mark.parametrize("nq, masked, kv_heads", [(256, False, 4), (200, True, 2)])
@pytest.mark.parametrize("band", BAND_CALLS, ids=["none", "causal", "causal_window", "right_window"])
def test_the_launcher_passes_the_schema_arguments(monkeypatch, nq, masked, kv_heads, band):
    """The launcher plans the call (the mask of queries past Nq where Nq is not a multiple of the query tile, the
    band's kind), passes the operands in the kernel's (N, D, H, Z) modes (K and V repeated per query head, dQ's zeroed
    fp32 sums) and the scalars and the band's bounds in ``GdpaBwdSm100.__call__``'s order (the stream is the compiled
    function's own), the persistent grid (``Sm100BwdPlan.grid``: here every one of the 2 x 4 x 2 work tiles has its
    own CTA) among them, and returns dQ, dK and dV in the operands' shapes and dtype."""
    from gdpa_inductor.kernels.cute import gdpa_bwd

    build = RecordedBuild()
    monkeypatch.setattr(gdpa_bwd, "compile_bwd_sm100", build)
    q, k, v, do = _operands(nq=nq, kv_heads=kv_heads)
    causal, window, kind, bounds = band
    dq, dk, dv, dbias = gdpa_bwd.gdpa_bwd_cute_sm100(q, k, v, do, "silu", 0.125, 0.5, 0.01, causal=causal,
                                                     window=window)
    assert dbias is None
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    assert dq.dtype == dk.dtype == dv.dtype == q.dtype
    assert build.plans == [plan_bwd_sm100(torch.bfloat16, 128, "silu", mask_queries=masked, causal=kind == "causal",
                                          window=kind == "window")]
    (args,) = build.calls
    assert [tuple(a.shape) for a in args[:7]] == [(nq, 128, 4, 2), (256, 128, 4, 2), (256, 128, 4, 2),
                                                  (nq, 128, 4, 2), (nq, 128, 4, 2), (256, 128, 4, 2),
                                                  (256, 128, 4, 2)]
    assert args[4].dtype == torch.float32 and not args[4].any()
    assert args[7:] == (0.125, 0.5, 0.01, 16, *bounds, None, None, None, None)


def test_the_launcher_sizes_the_grid(monkeypatch):
    """The plan's grid for the device's SMs (at most one CTA an SM, coprime with the key tiles a head under a band),
    or the one asked for (a check's few CTAs), never more than the work tiles."""
    from gdpa_inductor.kernels.cute import gdpa_bwd

    build = RecordedBuild()
    monkeypatch.setattr(gdpa_bwd, "compile_bwd_sm100", build)
    q, k, v, do = (t.repeat(40, 1, 1, 1) for t in _operands())
    for causal, ctas in [(False, None), (True, None), (False, 3), (False, 10**6)]:
        gdpa_bwd.gdpa_bwd_cute_sm100(q, k, v, do, "silu", 0.125, 0.5, 0.01, causal=causal, ctas=ctas)
    # 80 samples x 4 heads x 2 key tiles
    assert [args[10] for args in build.calls] == [148, 147, 3, 640]


@pytest.mark.parametrize("bias, grad", [("tensor", True), ("tensor", False), ("one", False)])
def test_the_launcher_passes_the_bias_and_its_gradients_buffer(monkeypatch, bias, grad):
    """A bias tensor in its (Nq, Nk, Hb, Zb) modes, one element as an fp32 row of keys every query reads, and with
    its gradient a zero-filled [Z, H, Nq, Nk] buffer in the bias's dtype in the last slot, summed back to dbias of
    the bias's shape and dtype."""
    from gdpa_inductor.kernels.cute import gdpa_bwd

    build = RecordedBuild()
    monkeypatch.setattr(gdpa_bwd, "compile_bwd_sm100", build)
    q, k, v, do = _operands()
    b = torch.randn(1, 4, 200, 256).bfloat16() if bias == "tensor" else torch.tensor(-1.5, dtype=torch.bfloat16)
    *_, dbias = gdpa_bwd.gdpa_bwd_cute_sm100(q, k, v, do, "silu", 0.125, 0.5, 0.01, bias=b, bias_grad=grad)
    (plan,), (args,) = build.plans, build.calls
    assert plan.bias == ("bfloat16" if bias == "tensor" else "float32") and plan.bias_grad == grad
    given, buffer = args[-2:]
    assert tuple(given.shape) == (200, 256, 4 if bias == "tensor" else 1, 1) and given.stride(1) == 1
    if bias == "one":
        assert given.dtype == torch.float32 and bool((given == -1.5).all()) and given.stride(0) == 0
    else:
        assert torch.equal(given.permute(3, 2, 0, 1), b)
    assert (buffer is None) != grad
    if grad:
        assert tuple(buffer.shape) == (200, 256, 4, 2) and buffer.dtype == torch.bfloat16 and not buffer.any()
        assert dbias.shape == b.shape and dbias.dtype == b.dtype and not dbias.any()
    else:
        assert dbias is None


def test_the_launcher_compiles_nothing_without_keys_or_queries(monkeypatch):
    from gdpa_inductor.kernels.cute import gdpa_bwd

    build = RecordedBuild()
    monkeypatch.setattr(gdpa_bwd, "compile_bwd_sm100", build)
    for change in (dict(nk=0), dict(nq=0)):
        q, k, v, do = _operands(**change)
        dq, dk, dv, _ = gdpa_bwd.gdpa_bwd_cute_sm100(q, k, v, do, "silu", 1.0, 1.0, 0.01)
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
        assert not (dq.any() or dk.any() or dv.any())
    assert build.plans == []


def _kernel_model(q, k, v, do, name, scale, post_scale):
    """The kernel's arithmetic in float64 on CPU, tile by tile: per 128-key CTA and 128-row query tile, Sᵀ and dPᵀ of
    zero-padded tiles, (p, m) by the activation's backward terms (``BACKWARD_TERMS``, with fma and tanh as torch
    ops), dSᵀ = dPᵀ (m + grad_offset), queries past Nq masked; dV · post_scale and dK · scale · post_scale · factor
    as the epilogue scales them, dQ's unscaled sums as the dQ warps add them."""
    from gdpa_inductor.kernels.cute.activation_math import BACKWARD_TERMS

    form = BACKWARD_TERMS[name]
    nq, nk = q.shape[0], k.shape[0]
    pad = lambda t, rows: torch.cat([t, t.new_zeros(rows - t.shape[0], t.shape[1])])  # noqa: E731
    qp, dop = pad(q, -(-nq // TILE) * TILE), pad(do, -(-nq // TILE) * TILE)
    kp, vp = pad(k, -(-nk // TILE) * TILE), pad(v, -(-nk // TILE) * TILE)
    dq_sums, dk, dv = torch.zeros_like(qp), torch.zeros_like(kp), torch.zeros_like(vp)
    for n in range(0, kp.shape[0], TILE):
        kt, vt = kp[n:n + TILE], vp[n:n + TILE]
        for m in range(0, qp.shape[0], TILE):
            qt, dot = qp[m:m + TILE], dop[m:m + TILE]
            p, g = form.fn(kt @ qt.T, scale, lambda a, b, c: a * b + c, torch.tanh, None)
            dpt = vt @ dot.T
            dst = dpt * (g + form.grad_offset)
            keep = (torch.arange(TILE) + m < nq)[None, :]
            p, dst = torch.where(keep, p, 0.0), torch.where(keep, dst, 0.0)
            dv[n:n + TILE] += p @ dot
            dk[n:n + TILE] += dst @ qt
            dq_sums[m:m + TILE] += dst.T @ kt
    factor = scale * post_scale * form.grad_factor
    return dq_sums[:nq], dk[:nk] * factor, dv[:nk] * post_scale


@pytest.mark.parametrize("name", ["silu", "gelu_tanh"])
def test_the_kernels_arithmetic_gives_the_gradients(name):
    """The model of the kernel's tiles, scales and mask (``_kernel_model``), its dQ sums scaled on the host as the
    launcher scales them (``dq_of_sums``), gives autograd's gradients of the eager GDPA at Nq and Nk past whole
    tiles."""
    from gdpa_inductor.kernels.activations import get_activation
    from gdpa_inductor.kernels.cute.bwd_results import dq_of_sums

    torch.manual_seed(0)
    nq, nk, d, scale, post_scale = 200, 130, 64, 0.125, 0.5
    q, k, v, do = (torch.randn(n, d, dtype=torch.float64) for n in (nq, nk, nk, nq))
    dq_sums, dk, dv = _kernel_model(q, k, v, do, name, scale, post_scale)
    dq = dq_of_sums(dq_sums, torch.float64, name, scale, post_scale)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = get_activation(name).torch_fn(scale * leaves[0] @ leaves[1].T, 0.01) * post_scale @ leaves[2]
    expected = torch.autograd.grad(out, leaves, do)
    # the host's factor is rounded to fp32 (as the kernel multiplies it)
    for got, want in zip((dq, dk, dv), expected):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)


def _side(t, cu, max_len):
    from gdpa_inductor.kernels.common.varlen_rows import VarlenSide

    return VarlenSide(t, cu[:-1], cu[1:] - cu[:-1], max_len, cu.numel() - 1, True)


@pytest.mark.parametrize("causal, window, kind, bounds", BAND_CALLS, ids=["none", "causal", "causal_window",
                                                                         "right_window"])
def test_the_varlen_launcher_passes_the_rows(monkeypatch, causal, window, kind, bounds):
    """The varlen launcher's plan (varlen, the band's kind, queries always masked), the sides in the kernel's
    (N, D, H, Z) modes (K and V repeated per query head, zeroed fp32 dQ sums and zeroed dK, dV: rows no sample reaches
    stay zero), the rows (per sample: first query row, query count, first key row, key count, index), the band's
    bounds and the longest sample's key tiles in the schema's slots; gradients in the sides' shapes."""
    from gdpa_inductor.kernels.cute import varlen_bwd

    build = RecordedBuild()
    monkeypatch.setattr(varlen_bwd, "compile_bwd_sm100", build)
    cu_q = torch.tensor([0, 300, 310, 310], dtype=torch.int32)
    cu_k = torch.tensor([0, 200, 330, 340], dtype=torch.int32)
    q, do = torch.ones(310, 4, 128, dtype=torch.bfloat16), torch.ones(310, 4, 128, dtype=torch.bfloat16)
    k, v = torch.ones(340, 2, 128, dtype=torch.bfloat16), torch.ones(340, 2, 128, dtype=torch.bfloat16)
    dq, dk, dv, dbias = varlen_bwd.gdpa_varlen_bwd_cute_sm100(do, _side(q, cu_q, 300), _side(k, cu_k, 200), v,
                                                              torch.tensor([0, 1, 2]), "silu", 0.125, 0.5, 0.01,
                                                              causal=causal, window=window)
    (plan,), (args,) = build.plans, build.calls
    assert plan == plan_bwd_sm100(torch.bfloat16, 128, "silu", causal=kind == "causal", window=kind == "window",
                                  varlen=True) and plan.mask_queries
    assert [tuple(a.shape) for a in args[:7]] == [(310, 128, 4, 1), (340, 128, 4, 1), (340, 128, 4, 1),
                                                  (310, 128, 4, 1), (310, 128, 4, 1), (340, 128, 4, 1),
                                                  (340, 128, 4, 1)]
    assert args[4].dtype == torch.float32 and not (args[4].any() or args[5].any() or args[6].any())
    # 2 key tiles x 4 heads x 3 samples: a CTA each
    assert args[7:11] == (0.125, 0.5, 0.01, 24) and args[11:13] == bounds
    assert args[13].tolist() == [[0, 300, 310], [300, 10, 0], [0, 200, 330], [200, 130, 10], [0, 1, 2]]
    assert args[14] == 2 and args[15:] == (None, None) and dbias is None
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    assert dq.dtype == dk.dtype == dv.dtype == torch.bfloat16


def test_the_varlen_support_check(on_blackwell, monkeypatch):
    from gdpa_inductor.kernels.cute import varlen_support

    monkeypatch.setattr(varlen_support, "cute_dsl_available", lambda: True)
    monkeypatch.setattr(varlen_support, "on_sm100", lambda device: True)
    q, k = torch.zeros(310, 4, 128, dtype=torch.bfloat16), torch.zeros(340, 2, 128, dtype=torch.bfloat16)
    rows = (torch.tensor([0, 300, 310], dtype=torch.int32), torch.tensor([0, 200, 340], dtype=torch.int32), None, None)

    def check(q, k, v, bias, grad, window, activation):
        return varlen_support.sm100_varlen_bwd_support(q, k, v, bias, grad, window, activation, rows)

    assert check(q, k, k, None, False, (-1, -1), "silu") == (True, "")
    assert check(q, k, k, None, False, (3, 0), "gelu_tanh") == (True, "")
    for bias, grad in [(torch.ones(300, 200, dtype=torch.bfloat16), True), (torch.ones(2, 4, 300, 200), True),
                       (torch.ones(1), False)]:
        assert check(q, k, k, bias, grad, (-1, -1), "silu") == (True, "")
    for args, reason in [((q, k, k, torch.ones(1), True, (-1, -1), "silu"), "a tensor only"),
                         ((q, k, k, None, True, (-1, -1), "silu"), "needs a bias tensor"),
                         ((q, k, k, torch.ones(300, 200, dtype=torch.float16), False, (-1, -1), "silu"),
                          "operands' dtype"),
                         ((q, k, k, torch.ones(200, 300, dtype=torch.bfloat16).T, False, (-1, -1), "silu"),
                          "keys contiguous"),
                         ((q, k, k, None, False, (-2, 0), "silu"), "window"),
                         ((q, k, k[..., :64], None, False, (-1, -1), "silu"), "D = Dv"),
                         ((q, k[:, :1].expand(340, 3, 128), k, None, False, (-1, -1), "silu"), "one shape"),
                         ((q[..., :96], k[..., :96], k[..., :96], None, False, (-1, -1), "silu"), "head dims")]:
        ok, why = check(*args)
        assert not ok and reason in why, why


def test_the_varlen_launcher_passes_the_bias_and_its_gradients_buffer(monkeypatch):
    """A varlen call's bias of fewer dims in its 4-D (Nq, Nk, Hb, Zb) modes, its gradient's zero-filled
    [B, H, max_seqlen_q, max_seqlen_k] buffer in the last slot, summed back to dbias of the bias's shape."""
    from gdpa_inductor.kernels.cute import varlen_bwd

    build = RecordedBuild()
    monkeypatch.setattr(varlen_bwd, "compile_bwd_sm100", build)
    cu = torch.tensor([0, 300, 310], dtype=torch.int32)
    q = torch.ones(310, 4, 128, dtype=torch.bfloat16)
    bias = torch.randn(4, 300, 300).bfloat16()
    *_, dbias = varlen_bwd.gdpa_varlen_bwd_cute_sm100(q, _side(q, cu, 300), _side(q, cu, 300), q, torch.tensor([0, 1]),
                                                      "silu", 0.125, 0.5, 0.01, causal=True, bias=bias,
                                                      bias_grad=True)
    (plan,), (args,) = build.plans, build.calls
    assert plan.varlen and plan.causal and plan.bias == "bfloat16" and plan.bias_grad
    given, buffer = args[15:]
    assert tuple(given.shape) == (300, 300, 4, 1) and torch.equal(given[..., 0].permute(2, 0, 1), bias)
    assert tuple(buffer.shape) == (300, 300, 4, 2) and buffer.dtype == torch.bfloat16 and not buffer.any()
    assert dbias.shape == bias.shape and dbias.dtype == bias.dtype and not dbias.any()
