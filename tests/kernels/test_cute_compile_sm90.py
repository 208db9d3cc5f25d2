"""The CuTe-DSL Hopper forward and backward compile for sm_90a without a GPU (their own target option, fake
tensors): every activation at D=128, a subset at D=64, D=96 and Dv != D, and at head dims of 256 the forward's
wide-head tiles (O stored from the registers) and the wide-head backward (both warpgroups on one 64-key tile, dense
and varlen) (the forward in the schedule each
pair of head dims takes, in the two others, for key counts that are a multiple of the key tile (no mask) and in
fp16, whose activation forms differ, the causal forward, and the varlen forward (causal too), whose loads and
stores go through 5-D ragged descriptors; the backward in its two dQ forms: summed in an fp32 buffer or in place in
the operands' dtype, the varlen backward in both, through 5-D ragged descriptors, and
the causal backward in both, whose diagonal takes a third, masked copy of the loop, dense and varlen,
and the varlen kernels' band mask: every forward step masked, the backward in one masked copy of its loop, and
both with a one-element bias added to every score),
each checked for wgmma (every matmul), TMA loads and stores (and the
backward's TMA reduce-add of dQ, its stmatrix store of dS), setmaxnreg (the producer/consumer register split),
tanh.approx for the tanh-based activations (bf16x2 with the P·V operand built by fma.rn.bf16x2 in the bf16 forward of
gelu_tanh and silu, f32 elsewhere), no register spills in ptxas's report, and no "wgmma serialized" warning
(ptxas then waits after every wgmma, which cost the forward 5-10%). Backward activations whose
(value, derivative) form still spills a few words are marked as strict expected failures: the day they
stop spilling the test says so.

Each case is compiled once per run, by the first test (of any pytest-xdist worker) that needs its report, in a
compile subprocess, and its report kept on disk for the next run until the kernel sources or what is measured
change (``compile_reports``, which also says why the compiles run in a subprocess).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from compile_reports import CompileWorker, ReportStore, report_dir, run_dir
from cute_compile_reports import WORKER_ARGV, plan_fields, report_fingerprint

from gdpa_inductor import config

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is not installed")

from gdpa_inductor.kernels.activations import PACKED_BF16_FORWARD  # noqa: E402
from gdpa_inductor.kernels.cute.bwd_plan import BwdPlan, dq_last_round_for, dq_late_for, packed_backward  # noqa: E402
from gdpa_inductor.kernels.cute.fwd_plan import (  # noqa: E402
    fwd_kv_stages,
    fwd_schedule,
    key_tile,
    plan_fwd,
    wide_head_tiles,
)
from gdpa_inductor.kernels.cute.fwd_support import SUPPORTED_ACTIVATIONS  # noqa: E402
from gdpa_inductor.kernels.cute.wide_bwd_plan import WideBwdPlan  # noqa: E402

# (D, Dv, activation)
CASES = [(128, 128, act) for act in SUPPORTED_ACTIVATIONS] + [(64, 64, "gelu_tanh"), (64, 64, "relu")]
HEAD_DIM_CASES = [(96, 96, "gelu_tanh"), (64, 128, "relu"), (128, 64, "silu"), (96, 128, "sigmoid"), (128, 96, "gelu")]
# past 128 only the forward (64-key tiles, one Q stage, O stored from the registers)
WIDE_HEAD_CASES = [(256, 256, "gelu_tanh"), (256, 256, "relu"), (128, 256, "silu"), (256, 64, "gelu")]
# plan_fwd's arguments per forward kind (pingpong and split_store: the plan's schedule replaced): "fwd" is the
# schedule the launcher takes for the head dim, with the mask of keys past Nk; the others are D=128's two other
# schedules, Nk a multiple of the key tile, fp16
FWD_KINDS = {
    "fwd": {},
    "fwd_no_pingpong": dict(pingpong=False, split_store=False),
    "fwd_shared_store": dict(pingpong=True, split_store=False),
    "fwd_exact_keys": dict(mask_keys=False),
    "fwd_fp16": {},
    "fwd_varlen": dict(varlen=True),
    "fwd_causal": dict(causal=True),
    "fwd_varlen_causal": dict(varlen=True, causal=True),
    "fwd_varlen_band": dict(varlen=True, band=True),
    "fwd_offset": dict(score_offset=True),
    "fwd_causal_offset": dict(causal=True, score_offset=True),
    "fwd_varlen_offset": dict(varlen=True, score_offset=True),
    "fwd_varlen_band_offset": dict(varlen=True, band=True, score_offset=True),
    "fwd_bias": dict(score_bias=True),
    "fwd_exact_keys_bias": dict(mask_keys=False, score_bias=True),
    "fwd_causal_bias": dict(causal=True, score_bias=True),
    "fwd_varlen_bias": dict(varlen=True, score_bias=True),
    "fwd_varlen_causal_bias": dict(varlen=True, causal=True, score_bias=True),
    "fwd_varlen_band_bias": dict(varlen=True, band=True, score_bias=True),
}
FWD_VARIANT_CASES = [("fwd_no_pingpong", 128, 128, "gelu_tanh"), ("fwd_no_pingpong", 128, 128, "sigmoid"),
                     ("fwd_shared_store", 128, 128, "gelu_tanh"), ("fwd_shared_store", 128, 128, "relu"),
                     ("fwd_exact_keys", 128, 128, "gelu_tanh"), ("fwd_exact_keys", 128, 128, "relu"),
                     ("fwd_exact_keys", 64, 64, "gelu_tanh"), ("fwd_fp16", 128, 128, "gelu_tanh"),
                     ("fwd_fp16", 128, 128, "silu"), ("fwd_no_pingpong", 96, 128, "gelu_tanh"),
                     ("fwd_varlen", 128, 128, "gelu_tanh"), ("fwd_varlen", 128, 128, "relu"),
                     ("fwd_varlen", 64, 64, "gelu_tanh"), ("fwd_varlen", 96, 128, "sigmoid"),
                     ("fwd_varlen", 256, 256, "gelu_tanh"), ("fwd_varlen", 128, 256, "silu"),
                     ("fwd_causal", 128, 128, "gelu_tanh"), ("fwd_causal", 128, 128, "relu"),
                     ("fwd_causal", 64, 64, "gelu_tanh"), ("fwd_causal", 96, 128, "sigmoid"),
                     ("fwd_varlen_causal", 128, 128, "gelu_tanh"), ("fwd_varlen_causal", 128, 128, "silu"),
                     ("fwd_varlen_causal", 64, 64, "relu"), ("fwd_varlen_causal", 96, 128, "sigmoid"),
                     ("fwd_varlen_band", 128, 128, "gelu_tanh"), ("fwd_varlen_band", 128, 128, "relu"),
                     ("fwd_varlen_band", 64, 64, "gelu_tanh"), ("fwd_varlen_band", 96, 128, "sigmoid")]
# a one-element bias added to every score (``score_offset``): packed and fp32 forms, D=64, wide heads, causal
FWD_OFFSET_CASES = [("fwd_offset", 128, 128, "gelu_tanh"), ("fwd_offset", 128, 128, "sigmoid"),
                    ("fwd_offset", 64, 64, "relu"), ("fwd_offset", 256, 256, "gelu_tanh"),
                    ("fwd_causal_offset", 128, 128, "gelu_tanh"), ("fwd_varlen_offset", 96, 128, "sigmoid"),
                    ("fwd_varlen_band_offset", 128, 128, "gelu_tanh")]
# a bias tensor read per score (``score_bias``): its dtype's loads, with the mask of keys past Nk and without, D=64,
# wide heads, causal; in the varlen forward (at each sample's positions), plain, causal and with the band
FWD_BIAS_CASES = [("fwd_bias", 128, 128, "gelu_tanh"), ("fwd_bias", 128, 128, "sigmoid"), ("fwd_bias", 64, 64, "relu"),
                  ("fwd_bias", 256, 256, "gelu_tanh"), ("fwd_exact_keys_bias", 128, 128, "relu"),
                  ("fwd_exact_keys_bias", 128, 128, "gelu_tanh"), ("fwd_causal_bias", 128, 128, "gelu_tanh"),
                  ("fwd_varlen_bias", 128, 128, "gelu_tanh"), ("fwd_varlen_causal_bias", 128, 128, "silu"),
                  ("fwd_varlen_band_bias", 128, 128, "gelu_tanh")]
FWD_CASES = ([("fwd", *c) for c in CASES + HEAD_DIM_CASES + WIDE_HEAD_CASES] + FWD_VARIANT_CASES + FWD_OFFSET_CASES
             + FWD_BIAS_CASES)
# measured with cutlass-dsl 4.8.1: the band forward of relu spills 28 bytes (its own select per score beside the
# band's, in every step); gelu_tanh, silu, sigmoid, gelu and hardswish do not
FWD_SPILLING = {("fwd_varlen_band", 128, 128, "relu")}
# and with a bias tensor at D = Dv = 128, where the first step of each query tile is masked (keys past Nk, or the
# causal diagonal), 72-124 bytes: that step's predicated reads of the bias; the unmasked steps spill nothing
FWD_SPILLING |= {("fwd_bias", 128, 128, "gelu_tanh"), ("fwd_bias", 128, 128, "sigmoid"),
                 ("fwd_causal_bias", 128, 128, "gelu_tanh")}
BWD_CASES = [(128, 128, act) for act in SUPPORTED_ACTIVATIONS] + [(64, 64, "gelu_tanh")] + HEAD_DIM_CASES
# measured with cutlass-dsl 4.8.1: hardswish's (value, derivative) pass (its form of three compares) spills 24-48 bytes
# in each dQ sum. Every other activation compiles without spills: the shared-memory operands' descriptors stay in
# uniform registers and fp32 dQ sums leave their scale to the cast
BWD_SPILLING = {(kind, 128, 128, "hardswish") for kind in ("bwd", "bwd_dq_direct")}
# measured with cutlass-dsl 4.8.1, gelu_tanh's packed form (bf16x2 pairs without a mask, its fp32 twin on the masked
# tiles): the causal builds, with two masked copies of the loop beside the packed one, spill 8 bytes stored, 12-24
# loaded
BWD_SPILLING |= {(kind, 128, 128, "gelu_tanh") for kind in ("bwd_causal", "bwd_causal_direct", "bwd_varlen_causal",
                                                             "bwd_varlen_causal_direct")}
TANH_BASED = {"gelu", "gelu_tanh", "silu", "sigmoid"}
# the dQ sums: in an fp32 buffer, or in place in bf16 (short key ranges)
BWD_KINDS = ("bwd", "bwd_dq_direct")
BWD_DQ_SUMS = {"bwd": "fp32", "bwd_dq_direct": "in_place", "bwd_varlen": "fp32",
               "bwd_varlen_direct": "in_place", "bwd_causal": "fp32", "bwd_causal_direct": "in_place",
               "bwd_varlen_causal": "fp32", "bwd_varlen_causal_direct": "in_place", "bwd_varlen_band": "fp32",
               "bwd_varlen_band_direct": "in_place", "bwd_offset": "fp32", "bwd_dq_direct_offset": "in_place",
               "bwd_causal_offset": "fp32", "bwd_varlen_offset": "fp32",
               "bwd_varlen_band_direct_offset": "in_place", "bwd_bias": "fp32", "bwd_dq_direct_bias": "in_place",
               "bwd_causal_bias": "fp32", "bwd_bias_dbias": "fp32", "bwd_dq_direct_bias_dbias": "in_place",
               "bwd_varlen_bias": "fp32", "bwd_varlen_direct_bias_dbias": "in_place",
               "bwd_varlen_causal_direct_bias_dbias": "in_place", "bwd_varlen_band_direct_bias_dbias": "in_place",
               "bwd_dq_direct_bias_dbias_atomic": "in_place", "bwd_varlen_direct_bias_dbias_atomic": "in_place",
               "bwd_varlen_causal_direct_bias_dbias_atomic": "in_place",
               "bwd_varlen_band_direct_bias_dbias_atomic": "in_place", "bwd_varlen_causal_bias_dbias_atomic": "fp32",
               "bwd_q80": "fp32"}
# the varlen backward (per-sample rows through ragged descriptors) in its two dQ sums
BWD_VARLEN_CASES = [("bwd_varlen", 128, 128, "gelu_tanh"), ("bwd_varlen_direct", 128, 128, "gelu_tanh"),
                    ("bwd_varlen_direct", 128, 128, "silu"), ("bwd_varlen_direct", 64, 64, "gelu_tanh"),
                    ("bwd_varlen", 96, 128, "sigmoid"), ("bwd_varlen", 256, 256, "gelu_tanh")]
# the causal backward in its two dQ sums: a third copy of the loop, masked, for the diagonal's query tiles
BWD_CAUSAL_CASES = [("bwd_causal", 128, 128, "gelu_tanh"), ("bwd_causal", 128, 128, "sigmoid"),
                    ("bwd_causal", 64, 64, "gelu_tanh"), ("bwd_causal_direct", 128, 128, "gelu_tanh"),
                    ("bwd_causal_direct", 128, 128, "silu"), ("bwd_causal_direct", 96, 128, "sigmoid")]
# the causal mask in the varlen backward (per-sample rows through ragged descriptors)
BWD_VARLEN_CAUSAL_CASES = [("bwd_varlen_causal", 128, 128, "gelu_tanh"), ("bwd_varlen_causal", 128, 128, "silu"),
                           ("bwd_varlen_causal_direct", 128, 128, "gelu_tanh"),
                           ("bwd_varlen_causal_direct", 64, 64, "gelu_tanh"), ("bwd_varlen_causal", 96, 128, "sigmoid")]
# the band mask in the varlen backward: one copy of the loop, every query tile masked
BWD_VARLEN_BAND_CASES = [("bwd_varlen_band", 128, 128, "gelu_tanh"), ("bwd_varlen_band", 128, 128, "relu"),
                         ("bwd_varlen_band_direct", 128, 128, "gelu_tanh"),
                         ("bwd_varlen_band_direct", 64, 64, "gelu_tanh"), ("bwd_varlen_band", 96, 128, "sigmoid")]
# the wide-head backward (GdpaBwdWideSm90, D or Dv of 256): dQ in two chunks a warpgroup at D = 256, one below
BWD_WIDE_CASES = [("bwd", 256, 256, "gelu_tanh"), ("bwd", 256, 256, "relu"), ("bwd_dq_direct", 256, 256, "silu"),
                  ("bwd", 256, 128, "gelu"), ("bwd", 128, 256, "sigmoid"), ("bwd", 256, 96, "relu_square"),
                  ("bwd", 64, 256, "hardswish")]
# a one-element bias: the fp32 and in-place dQ sums, D=64, the wide-head kernel, causal
BWD_OFFSET_CASES = [("bwd_offset", 128, 128, "gelu_tanh"), ("bwd_offset", 128, 128, "silu"),
                    ("bwd_dq_direct_offset", 64, 128, "relu"), ("bwd_dq_direct_offset", 128, 128, "sigmoid"),
                    ("bwd_dq_direct_offset", 64, 64, "gelu_tanh"), ("bwd_offset", 256, 256, "gelu_tanh"),
                    ("bwd_causal_offset", 128, 128, "sigmoid"), ("bwd_varlen_offset", 96, 128, "sigmoid"),
                    ("bwd_varlen_band_direct_offset", 128, 128, "gelu_tanh")]
# a bias tensor (its tiles by TMA, read by ldmatrix.trans) and its gradient (dS tiles stored by TMA): fp32 and in-place
# dQ sums, D=64, causal; in the varlen backward (at each sample's positions), plain, causal and with the band
BWD_BIAS_CASES = [("bwd_bias", 128, 128, "gelu_tanh"), ("bwd_dq_direct_bias", 128, 128, "gelu_tanh"),
                  ("bwd_dq_direct_bias", 64, 64, "gelu_tanh"), ("bwd_causal_bias", 128, 128, "gelu_tanh"),
                  ("bwd_bias_dbias", 128, 128, "gelu_tanh"), ("bwd_dq_direct_bias_dbias", 128, 128, "gelu_tanh"),
                  ("bwd_varlen_bias", 128, 128, "gelu_tanh"), ("bwd_varlen_direct_bias_dbias", 128, 128, "silu"),
                  ("bwd_varlen_causal_direct_bias_dbias", 128, 128, "gelu_tanh"),
                  ("bwd_varlen_band_direct_bias_dbias", 128, 128, "gelu_tanh")]
# measured with cutlass-dsl 4.8.1: the varlen builds with the bias's gradient and a mask spill 4 bytes with gelu_tanh;
# the others spill nothing
BWD_SPILLING |= {("bwd_varlen_causal_direct_bias_dbias", 128, 128, "gelu_tanh"),
                 ("bwd_varlen_band_direct_bias_dbias", 128, 128, "gelu_tanh")}
# dbias added atomically (each thread's dS pairs by red.global.add.v2.f32 into fp32 sums of the bias's size): the
# varlen builds "auto" takes for a bias shared by the samples (in-place and fp32 dQ sums; plain, causal, band) and a
# dense one
BWD_DBIAS_ATOMIC_CASES = [("bwd_varlen_direct_bias_dbias_atomic", 128, 128, "silu"),
                          ("bwd_varlen_causal_direct_bias_dbias_atomic", 128, 128, "gelu_tanh"),
                          ("bwd_varlen_band_direct_bias_dbias_atomic", 128, 128, "gelu_tanh"),
                          ("bwd_varlen_causal_bias_dbias_atomic", 128, 128, "silu"),
                          ("bwd_dq_direct_bias_dbias_atomic", 128, 128, "gelu_tanh")]
# measured with cutlass-dsl 4.8.1: the masked builds spill 24 bytes stored, 36-80 loaded (the band, causal gelu_tanh),
# the causal one with fp32 dQ sums 12 stored, 44 loaded; the adds' addresses are two registers a thread, their offsets
# immediates
BWD_SPILLING |= {("bwd_varlen_causal_direct_bias_dbias_atomic", 128, 128, "gelu_tanh"),
                 ("bwd_varlen_band_direct_bias_dbias_atomic", 128, 128, "gelu_tanh"),
                 ("bwd_varlen_causal_bias_dbias_atomic", 128, 128, "silu")}
# 80-row query tiles (dQᵀ by swapped operands, its fp32 halves added by a 1-D bulk reduce in the accumulators' order)
BWD_Q80_CASES = [("bwd_q80", 128, 128, act) for act in ("gelu_tanh", "silu", "relu", "sigmoid", "hardswish")]
# measured with cutlass-dsl 4.8.1: 16-20 bytes (a few loop-carried words), hardswish 56; relu none
BWD_SPILLING |= {("bwd_q80", 128, 128, act) for act in ("gelu_tanh", "silu", "sigmoid", "hardswish")}
BWD_ALL_CASES = ([(kind, *c) for kind in BWD_KINDS for c in BWD_CASES] + BWD_WIDE_CASES + BWD_VARLEN_CASES
                 + BWD_CAUSAL_CASES + BWD_VARLEN_CAUSAL_CASES + BWD_VARLEN_BAND_CASES + BWD_OFFSET_CASES
                 + BWD_BIAS_CASES + BWD_DBIAS_ATOMIC_CASES + BWD_Q80_CASES)


# the builds whose SASS a test reads (the others skip the disassembly)
UNIFORM_CASES = ([("fwd", *c) for c in CASES + HEAD_DIM_CASES + WIDE_HEAD_CASES]
                 + [(kind, *c) for kind in BWD_KINDS for c in BWD_CASES] + BWD_WIDE_CASES)
SASS_CASES = set(UNIFORM_CASES) | set(BWD_Q80_CASES)


def _expected_failure(reason: str):
    """A strict expected failure of an assertion alone: a build that fails to compile fails the test."""
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)


def case_plan(case):
    """The plan ``case`` builds: the forward's by ``plan_fwd`` (its schedule replaced where the kind names one), the
    backward's as the kind names it, dQ rounded by the kernel where the launcher has it so."""
    kind, d, dv, act = case
    if kind.startswith("fwd"):
        flags = FWD_KINDS[kind]
        schedule = {name: flags[name] for name in ("pingpong", "split_store") if name in flags}
        call = {name: value for name, value in flags.items() if name not in schedule}
        plan = plan_fwd(torch.float16 if kind == "fwd_fp16" else torch.bfloat16, d, act, dv, **call)
        return dataclasses.replace(plan, **schedule)
    sums, varlen = BWD_DQ_SUMS[kind], kind.startswith("bwd_varlen")
    return BwdPlan(torch.bfloat16, d, dv, act, dq_sums=sums, varlen=varlen, causal="causal" in kind,
                   band="band" in kind, score_offset=kind.endswith("_offset"), score_bias="_bias" in kind,
                   bias_grad="_dbias" in kind, dbias_atomic=kind.endswith("_atomic"),
                   query_tile=80 if kind == "bwd_q80" else 64, dq_last_round=dq_last_round_for(sums, d, dv, varlen))


def build_spec(case) -> dict:
    """What ``case`` compiles: its plan (``case_plan``) as the compile worker takes it (``cute_compile_reports``)."""
    build = "fwd" if case[0].startswith("fwd") else "bwd"
    return dict(case=list(case), build=build, plan=plan_fields(case_plan(case)), sass=tuple(case) in SASS_CASES)


class Reports:
    """``reports[case]``: the case's report, compiled by the first test (of any xdist worker) that needs it."""

    def __init__(self, store: ReportStore):
        self.store = store

    def __getitem__(self, case) -> dict:
        return {"case": list(case), **self.store.report(build_spec(case))}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    fingerprint, worker = report_fingerprint(), CompileWorker(WORKER_ARGV)
    directory = report_dir(config.kernel_cache_dir, run_dir(tmp_path_factory), fingerprint)
    yield Reports(ReportStore(directory, worker.compile, still_current=lambda: report_fingerprint() == fingerprint))
    worker.close()


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=_expected_failure("spills a few words"))
     if c in FWD_SPILLING else c for c in FWD_CASES],
    ids=lambda c: f"{c[0]}-D{c[1]}-Dv{c[2]}-{c[3]}",
)
def test_cute_fwd_compiles_for_sm90a(case, reports):
    r = reports[case]
    assert r["target"] == "sm_90a"
    assert r["wgmma"] >= case[1] // 16 + key_tile(*case[1:3]) // 16, "QK and PV must both be wgmma (one per k-block)"
    assert r["tma_loads"] > 0, "Q/K/V loads go through TMA"
    wide = wide_head_tiles(*case[1:3]).get("o_from_registers", False)
    assert (r["tma_stores"] > 0) == (not wide), "O goes through shared memory and TMA unless the head is wide"
    assert (r["st_global"] > 0) == wide, "a wide head's O goes from the registers to global memory"
    assert r["setmaxnreg"] == 2, "producer gives registers away, consumers take them"
    # ping-pong: each consumer warpgroup waits for its turn and hands it on through named barriers
    flags = FWD_KINDS[case[0]]
    plain = not any(flags.get(f) for f in ("varlen", "causal", "band", "score_offset", "score_bias"))
    pingpong = flags.get("pingpong", fwd_schedule(case[1], case[2], plain)[0])
    assert (r["named_barrier_arrives"] > 0) == pingpong, r
    # a full and an empty barrier per stage of Q, K and V
    q_stages = wide_head_tiles(*case[1:3]).get("q_stages", 2)
    assert r["mbarrier_init"] == 2 * q_stages + 4 * fwd_kv_stages(case[1], case[2], plain), r
    # fp16 and a bias take the fp32 forms
    packed = (case[0] != "fwd_fp16" and not case[0].endswith(("_offset", "_bias"))
              and case[3] in PACKED_BF16_FORWARD)
    assert (r["tanh_approx_bf16x2"] > 0) == packed and (r["fma_bf16x2"] > 0) == packed, r
    assert (r["tanh_approx"] > 0) == (case[3] in TANH_BASED and not packed), r
    assert r["spill_stores"] == 0 and r["spill_loads"] == 0, r
    assert not r["wgmma_serialized"], "ptxas serialized the wgmmas (register pressure)"


@pytest.mark.parametrize("case", [c for c in FWD_VARIANT_CASES if c[0] == "fwd_exact_keys"], ids=str)
def test_cute_fwd_without_mask_selects_less(case, reports):
    """With Nk a multiple of the key tile no step selects P = 0 per score (none at all for gelu_tanh, whose
    activation has no select of its own). The masked kernel computes each query tile's ragged key tile first and
    selects in that step alone: one select per score (64 a thread in a 128x128 tile) at each of the two places
    that step's activation is inlined (a CTA's first query tile, and the following ones under the last P·V of
    the one before), none in the key-tile loop."""
    exact, masked = reports[case]["selp_f32"], reports[("fwd", *case[1:])]["selp_f32"]
    scores_per_thread = 128 * key_tile(*case[1:3]) // 256
    assert masked - exact == 2 * scores_per_thread, (exact, masked)
    if case[3] == "gelu_tanh":
        assert exact == 0


@pytest.mark.parametrize("case", [c for c in FWD_VARIANT_CASES if c[0] in ("fwd_causal", "fwd_varlen_causal")],
                         ids=str)
def test_cute_causal_fwd_masks_one_step(case, reports):
    """The causal forward masks only its diagonal key tile, the first step of each query tile: as many selects
    as the kernel masking keys past Nk in its first step, none in the key-tile loop, and the same matmuls."""
    causal, masked = reports[case], reports[("fwd", *case[1:])]
    assert causal["selp_f32"] == masked["selp_f32"], (causal["selp_f32"], masked["selp_f32"])
    assert causal["wgmma"] == masked["wgmma"]


@pytest.mark.parametrize("case", [c for c in FWD_VARIANT_CASES if c[0] == "fwd_varlen_band"], ids=str)
def test_cute_band_fwd_masks_every_step(case, reports):
    """The band forward masks the key-tile loop's steps too: more selects than the varlen kernel, which masks only
    its first step, and the same matmuls."""
    band, varlen = reports[case], reports[("fwd_varlen", *case[1:])]
    assert band["selp_f32"] > varlen["selp_f32"], (band["selp_f32"], varlen["selp_f32"])
    assert band["wgmma"] == varlen["wgmma"]


@pytest.mark.parametrize("case", [c for c in FWD_VARIANT_CASES
                                  if c[0] in ("fwd_varlen", "fwd_varlen_causal", "fwd_varlen_band")], ids=str)
def test_cute_varlen_fwd_reads_samples_through_ragged_descriptors(case, reports):
    """The varlen forward's loads and stores take the ragged descriptors' extra mode (5-D where the dense
    kernel's are 4-D), and it reads the per-sample rows from global memory."""
    varlen, dense = reports[case], reports[("fwd", *case[1:])]
    assert varlen["tma_5d"] > 0 and varlen["tma_5d"] == varlen["tma_loads"] + varlen["tma_stores"], varlen
    assert dense["tma_5d"] == 0
    assert varlen["ld_global_s32"] > dense["ld_global_s32"]


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=_expected_failure("spills a few words"))
     if c in BWD_SPILLING else c for c in BWD_ALL_CASES],
    ids=lambda c: f"{c[0]}-D{c[1]}-Dv{c[2]}-{c[3]}",
)
def test_cute_bwd_compiles_for_sm90a(case, reports):
    r = reports[case]
    d, dv = case[1], case[2]
    assert r["target"] == "sm_90a"
    # S (k = D) and dP (k = Dv), dV and dK (k = 64 queries), dQ (k = 128 keys; wide heads: 64 keys per chunk), one
    # wgmma per 16-wide k-block, in the loop with and the loop without the mask (causal: and the diagonal's masked
    # loop); one tile late, the last tile's dQ after the loops
    if max(d, dv) > 128:
        per_tile = d // 16 + dv // 16 + 2 * (64 // 16) + WideBwdPlan.for_head_dims(d, dv, 4).dq_chunks * 64 // 16
        late = False
    else:
        queries = 80 if case[0] == "bwd_q80" else 64
        per_tile = d // 16 + dv // 16 + 2 * (queries // 16) + 128 // 16
        late = dq_late_for(BWD_DQ_SUMS[case[0]], d, dv)
    loops = 3 if "causal" in case[0] else 1 if "band" in case[0] else 2
    assert r["wgmma"] == loops * per_tile + (128 // 16 if late else 0), r
    assert r["tma_loads"] > 0 and r["tma_stores"] > 0, "Q/dO/K/V loads and the dK/dV stores go through TMA"
    assert r["tma_reduce"] > 0 or r["bulk_reduce"] > 0, "dQ tiles are added by TMA reduce-add"
    assert r["stmatrix"] > 0, "dS goes to shared memory by stmatrix"
    assert r["named_barrier_arrives"] > 0, "the consumers signal their dS and dQ without waiting for each other"
    assert r["setmaxnreg"] == 2
    assert (r["tanh_approx"] > 0) == (case[3] in TANH_BASED)
    # no CTA stores into a peer's shared memory (no clusters)
    assert r["st_async"] == 0 and r["cluster_arrives"] == 0, r
    assert r["spill_stores"] == 0 and r["spill_loads"] == 0, r
    assert not r["wgmma_serialized"], "ptxas serialized the wgmmas (register pressure)"


# measured with cutlass-dsl 4.8.1: the forward at D = 256, Dv = 64 still moves 81 registers for 56 wgmmas (not
# looked into: its other wide-head builds pass)
NOT_UNIFORM = {("fwd", 256, 64, "gelu")}


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=_expected_failure("descriptors built per k-block"))
     if c in NOT_UNIFORM else c for c in UNIFORM_CASES],
    ids=lambda c: f"{c[0]}-D{c[1]}-Dv{c[2]}-{c[3]}",
)
def test_cute_wgmma_descriptors_stay_in_uniform_registers(case, reports):
    """The shared-memory operands are partitioned through each warpgroup's first thread, so ptxas keeps the wgmma
    descriptors in uniform registers: fewer moves from ordinary registers into uniform ones (R2UR) than wgmmas in the
    whole kernel. Partitioned through each thread's own index, they were built per k-block in ordinary registers
    and moved over, about two per wgmma (the D = 128 gelu_tanh backward: 123 R2UR, now 10; the D = 256 one 204,
    now 11)."""
    r = reports[case]
    assert r["sass_r2ur"] < r["wgmma"], r


@pytest.mark.parametrize("case", BWD_ALL_CASES, ids=lambda c: f"{c[0]}-D{c[1]}-Dv{c[2]}-{c[3]}")
def test_cute_bwd_rounds_dq_itself_where_it_sums_in_fp32(case, reports):
    """fp32 dQ sums of a dense batch at D, Dv <= 128 (``dq_last_round_for``, as the launcher builds them): each CTA
    counts itself in once per head (one acquire-release add after a proxy fence over its bulk reduce-adds) and the last
    rounds the head's sums, read through L2 16 bytes at a time, each group zeroed once (its load is at two places:
    before the loop and within it) and the count reset once, for the next call (``dq_workspace``); no other build
    counts, reads dQ back or clears it."""
    r = reports[case]
    kind, d, dv = case[:3]
    rounds = dq_last_round_for(BWD_DQ_SUMS[kind], d, dv, kind.startswith("bwd_varlen"))
    got = (r["count_acq_rel"], r["proxy_fence_global"], r["ld_global_cg_v4"] > 0, r["count_reset"],
           2 * r["zero_stores"] == r["ld_global_cg_v4"], r["zero_stores"] > 0)
    assert got == ((1, 1, True, 1, True, True) if rounds else (0, 0, False, 0, True, False)), r


@pytest.mark.parametrize("case", BWD_Q80_CASES, ids=str)
def test_cute_80_row_bwd_adds_dq_fragments_by_bulk_reduce(case, reports):
    """80-row query tiles: the scores and dQᵀ in m64n80 wgmmas, each warpgroup's half of dQᵀ stored in 16-byte
    groups and added by one 1-D bulk reduce-add per warpgroup and tile (the dQ warp's two, unrolled), no TMA tensor
    reduce."""
    r = reports[case]
    assert r["wgmma_n80"] > 0 and r["bulk_reduce"] == 2 and r["tma_reduce"] == 0, r
    assert r["sass_sts128"] >= 3 * 10, r


@pytest.mark.parametrize("case", BWD_VARLEN_CASES + BWD_VARLEN_CAUSAL_CASES + BWD_VARLEN_BAND_CASES, ids=str)
def test_cute_varlen_bwd_reads_samples_through_ragged_descriptors(case, reports):
    """The varlen backward's loads, stores and dQ reduce-adds all take the ragged descriptors' extra mode (5-D
    where the dense kernel's are 4-D), and it reads the per-sample rows from global memory."""
    varlen = reports[case]
    dense = reports[("bwd" if BWD_DQ_SUMS[case[0]] == "fp32" else "bwd_dq_direct", *case[1:])]
    assert varlen["tma_5d"] > 0 and varlen["tma_5d"] == (
        varlen["tma_loads"] + varlen["tma_stores"] + varlen["tma_reduce"]), varlen
    assert dense["tma_5d"] == 0
    assert varlen["ld_global_s32"] > dense["ld_global_s32"]


@pytest.mark.parametrize("case", BWD_CAUSAL_CASES + BWD_VARLEN_CAUSAL_CASES, ids=str)
def test_cute_causal_bwd_masks_two_loop_copies(case, reports):
    """The causal backward selects per score in its diagonal's loop and in the last query tile's, as many as the
    unmasked kernel's one masked loop each (these activations select nothing of their own), none in the loop of the
    query tiles past the diagonal."""
    dense = reports[("bwd" if BWD_DQ_SUMS[case[0]] == "fp32" else "bwd_dq_direct", *case[1:])]
    assert reports[case]["selp_f32"] == 2 * dense["selp_f32"] > 0, (reports[case]["selp_f32"], dense["selp_f32"])


@pytest.mark.parametrize("case", [c for c in BWD_VARLEN_BAND_CASES if c[3] != "relu"], ids=str)
def test_cute_band_bwd_masks_one_loop(case, reports):
    """The band backward runs one copy of the loop, masked: as many selects as the unmasked kernel's masked loop
    (for activations without selects of their own: relu's appear in every copy of the loop), and the matmuls of one
    loop (``test_cute_bwd_compiles_for_sm90a``)."""
    dense = reports[("bwd" if BWD_DQ_SUMS[case[0]] == "fp32" else "bwd_dq_direct", *case[1:])]
    assert reports[case]["selp_f32"] == dense["selp_f32"] > 0, (reports[case]["selp_f32"], dense["selp_f32"])


@pytest.mark.parametrize("case", [c for c in FWD_OFFSET_CASES + BWD_OFFSET_CASES
                                  if (c[0].startswith("bwd") and ("band" in c[0] or not packed_backward(
                                      torch.bfloat16, c[3], c[1], c[2], False, False)))
                                  or (c[0].startswith("fwd") and c[3] not in PACKED_BF16_FORWARD)], ids=str)
def test_cute_score_offset_folds_into_the_first_product(case, reports):
    """A one-element bias costs no op per score: at every place its activation is inlined (the forward's three: a
    CTA's first step, the key-tile loop, the step that crosses to the next query tile; each copy of the backward's
    loop) each score's first product of the form becomes an FMA taking the bias (no FP32 add); the forward loads
    the bias at each of those places (held in a register across its loop, it made the band forward spill 40
    bytes), the backward once; the matmuls are the same as without it. (The bf16 forward of gelu_tanh and silu
    takes the fp32 forms with a bias, the plain build the packed ones, and so does the bf16 backward of gelu_tanh at
    D <= 128: not compared.)"""
    kind, d, dv, _ = case
    r, plain = reports[case], reports[(kind.removesuffix("_offset"), *case[1:])]
    if kind.startswith("fwd"):
        places, scores = 3, 128 * key_tile(d, dv) // 256
    else:
        # the band masks every tile: one copy of the loop
        places = 1 if "band" in kind else 3 if "causal" in kind else 2
        scores = (64 if max(d, dv) > 128 else 128) * 64 // 256
    folded = places * scores
    assert r["add_f32"] == plain["add_f32"], (r["add_f32"], plain["add_f32"])
    assert r["fma_f32"] - plain["fma_f32"] == folded, (r["fma_f32"], plain["fma_f32"])
    # the product factor · bias (sigmoid's bias / 2), common to all scores: at most once per place
    assert 0 <= r["mul_f32"] - (plain["mul_f32"] - folded) <= places, (r["mul_f32"], plain["mul_f32"])
    assert r["ld_global_32"] == plain["ld_global_32"] + (places if kind.startswith("fwd") else 1)
    assert r["wgmma"] == plain["wgmma"]


@pytest.mark.parametrize("case", FWD_BIAS_CASES, ids=str)
def test_cute_score_bias_read_per_score(case, reports):
    """A bias tensor costs each pair of neighbouring scores one 32-bit load of their values, at every place the
    forward's activation is inlined (a CTA's first step, the key-tile loop, the step that crosses to the next query
    tile), and folds into the first product as the one-element bias does (no FP32 add: an FMA a score); the matmuls
    are those of the build without it."""
    kind, d, dv, act = case
    r = reports[case]
    plain = reports[(kind.removesuffix("_bias") if kind != "fwd_bias" else "fwd", d, dv, act)]
    reads = 3 * 128 * key_tile(d, dv) // 256
    assert r["ld_global_pairs"] == reads // 2 and plain["ld_global_pairs"] == 0, (r["ld_global_pairs"], reads)
    # bf16 gelu_tanh's plain build runs the packed forms, whose FP32 ops are not comparable
    plain_fp32 = act not in PACKED_BF16_FORWARD
    assert r["add_f32"] <= plain["add_f32"] or not plain_fp32, (r["add_f32"], plain["add_f32"])
    assert r["fma_f32"] - (plain["fma_f32"] if plain_fp32 else 0) >= reads, (r["fma_f32"], plain["fma_f32"])
    assert r["wgmma"] == plain["wgmma"]


@pytest.mark.parametrize("case", BWD_BIAS_CASES, ids=str)
def test_cute_bwd_bias_tensor_by_tma_and_ldmatrix(case, reports):
    """A bias tensor in the backward: one more TMA load per query tile, its values read by ldmatrix.trans (four
    x4 loads of 16 scores' pairs a thread, in each copy of the loop) and folded into the first product (no FP32
    add); with its gradient the dQ warp also stores each dS tile by TMA; the matmuls are those of the build without
    it."""
    kind, d, dv, act = case
    r = reports[case]
    plain = reports[(kind.removesuffix("_dbias").removesuffix("_bias"), d, dv, act)]
    # the copies of the loop: masked and not, causal's diagonal as a third, the band's one masked copy
    loops = 3 if "causal" in kind else 1 if "band" in kind else 2
    assert r["ldmatrix"] == 4 * loops and plain["ldmatrix"] == 0, r["ldmatrix"]
    assert r["tma_loads"] > plain["tma_loads"]
    assert r["add_f32"] == plain["add_f32"], (r["add_f32"], plain["add_f32"])
    assert (r["tma_stores"] > plain["tma_stores"]) == kind.endswith("_dbias"), (r["tma_stores"], plain["tma_stores"])
    assert r["wgmma"] == plain["wgmma"]


@pytest.mark.parametrize("case", BWD_DBIAS_ATOMIC_CASES, ids=str)
def test_cute_bwd_dbias_added_atomically(case, reports):
    """dbias added atomically: 16 red.global.add.v2.f32 a thread in each copy of the loop (its 32 dS values, two
    neighbouring queries an add), no TMA store of dS tiles (the bias's own build's stores), the bias read as before
    and the matmuls of the build without a bias."""
    kind, d, dv, act = case
    r = reports[case]
    plain = reports[(kind.removesuffix("_bias_dbias_atomic"), d, dv, act)]
    loops = 3 if "causal" in kind else 1 if "band" in kind else 2
    assert r["red_v2_f32"] == 16 * loops and plain["red_v2_f32"] == 0, r["red_v2_f32"]
    assert r["ldmatrix"] == 4 * loops
    assert r["tma_stores"] == plain["tma_stores"], (r["tma_stores"], plain["tma_stores"])
    assert r["wgmma"] == plain["wgmma"]


@pytest.mark.parametrize("case", FWD_CASES + BWD_ALL_CASES, ids=lambda c: f"{c[0]}-D{c[1]}-Dv{c[2]}-{c[3]}")
def test_cute_builds_call_no_deprecated_cutlass_api(case, reports):
    """cutlass-dsl is pinned; a name it has deprecated (moved or renamed) would break the kernels on the version
    that removes it."""
    assert reports[case]["deprecations"] == [], reports[case]["deprecations"]
