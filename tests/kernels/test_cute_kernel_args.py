"""The CuTe launchers' calling convention (kernels/cute/kernel_args.py), without a GPU: tensors reach the kernels as
views in the kernels' (N, D, H, Z) mode order, never copies, and each launcher's argument list, as it stands, is
taken by the kernel compiled for sm_90a through TVM-FFI, fresh or loaded from the disk cache (which fills in no
defaults), up to the one check a CPU cannot pass: the tensors' device; each kernel's argument schema lists its
``__call__``'s parameters, and its compile fakes and launch values agree on what a plan's build takes. The kernels'
results are checked on the GPU (tests/gpu)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from types import SimpleNamespace

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is not installed")

import torch  # noqa: E402
import tvm_ffi  # noqa: E402

from gdpa_inductor import config  # noqa: E402
from gdpa_inductor.kernels.cute import (  # noqa: E402
    compile_cache,
    gdpa_bwd,
    gdpa_fwd,
    kernel_build,
    varlen_bwd,
    varlen_fwd,
)
from gdpa_inductor.kernels.cute.bwd_plan import BwdPlan  # noqa: E402
from gdpa_inductor.kernels.cute.fwd_plan import plan_fwd  # noqa: E402
from gdpa_inductor.kernels.cute.gdpa_bwd_sm90 import GdpaBwdSm90  # noqa: E402
from gdpa_inductor.kernels.cute.gdpa_bwd_wide_sm90 import GdpaBwdWideSm90  # noqa: E402
from gdpa_inductor.kernels.cute.gdpa_fwd_sm90 import GdpaFwdSm90  # noqa: E402
from gdpa_inductor.kernels.cute.kernel_args import (  # noqa: E402
    BWD_ARGS,
    FWD_ARGS,
    WIDE_BWD_ARGS,
    dense_modes,
    row_modes,
)
from gdpa_inductor.kernels.triton.varlen_schedule import ORDER, row  # noqa: E402
from gdpa_inductor.lowering.varlen_ops import sides  # noqa: E402

DTYPE, D, ACT = torch.float16, 64, "relu"


@pytest.mark.parametrize("shape", [(2, 4, 300, 128), (1, 1, 64, 64), (3, 2, 17, 96)])
def test_dense_modes_view_in_kernel_order(shape):
    z, h, n, d = shape
    t = torch.randn(shape)
    m = dense_modes(t)
    assert m.shape == (n, d, h, z) and m.stride(1) == 1 and m.data_ptr() == t.data_ptr()
    assert m[n - 1, d - 2, h - 1, z - 1] == t[z - 1, h - 1, n - 1, d - 2]


@pytest.mark.parametrize("shape", [(500, 4, 128), (3, 40, 2, 64)])
def test_row_modes_view_jagged_and_padded_sides(shape):
    t = torch.randn(shape)
    m = row_modes(t)
    t4 = t.unsqueeze(0) if t.dim() == 3 else t
    z, n, h, d = t4.shape
    assert m.shape == (n, d, h, z) and m.stride(1) == 1 and m.data_ptr() == t.data_ptr()
    assert m[n - 1, 1, h - 1, z - 1] == t4[z - 1, n - 1, h - 1, 1]


class Launch:
    """Stands in for a compiled kernel: records the compile's arguments and the call's."""

    def __init__(self, compile_fn):
        self.compile_fn, self.compile_args, self.call_args = compile_fn, None, None

    def compile(self, *args, **kwargs):
        self.compile_args = (args, kwargs)
        return self

    @property
    def plan(self):
        """The plan the launcher compiled."""
        return self.compile_args[0][0]

    def __call__(self, *args):
        self.call_args = args

    def check_on_compiled_kernel(self):
        """The recorded call on the real kernel: rejected for the device alone, and TVM-FFI's account of the
        kernel's parameters (named in that error; it checks arguments in order and stops at the first) matches
        the call's arguments one by one: tensors of the same dtype and rank, float32 and int32 scalars."""
        args, kwargs = self.compile_args
        compiled, loaded = _fresh_and_loaded(self.compile_fn, args, tuple(sorted(kwargs.items())))
        assert isinstance(loaded, tvm_ffi.Function) and not isinstance(compiled, tvm_ffi.Function)
        for kernel in (compiled, loaded):
            with pytest.raises(ValueError, match="argument #0.*expected device_type=cuda") as error:
                kernel(*self.call_args)
            params = _parameters(str(error.value))
            assert len(params) == len(self.call_args), params
            for param, arg in zip(params, self.call_args):
                assert param == _kind(arg), (param, arg)


@functools.cache
def _fresh_and_loaded(compile_fn, args: tuple, kwargs: tuple):
    """The build of ``compile_fn(*args, **kwargs)``, fresh and then as a later process loads it from the disk
    cache (``launch`` points it at the test's folder): once per build, as several calls share one."""
    compiled = compile_fn(*args, **dict(kwargs))
    compile_cache._MEMORY.clear()  # a later process: the kernel from the disk cache
    return compiled, compile_fn(*args, **dict(kwargs))


def _parameters(message: str) -> list[str]:
    """The parameter types of the signature in a TVM-FFI argument error: `f(a: Tensor([n0, 5], int32), s: float32)`
    -> ["Tensor(2, int32)", "float32"]."""
    signature = re.search(r"`\w+\((.*)\)`", message).group(1)
    params = re.findall(r"\w+: (Tensor\(\[[^\]]*\], \w+\)|\w+)", signature)
    return [re.sub(r"Tensor\(\[([^\]]*)\], (\w+)\)", lambda m: f"Tensor({m[1].count(',') + 1}, {m[2]})", p)
            for p in params]


def _kind(arg) -> str:
    if isinstance(arg, torch.Tensor):
        return f"Tensor({arg.dim()}, {str(arg.dtype).removeprefix('torch.')})"
    return {float: "float32", int: "int32", type(None): "None"}[type(arg)]


@pytest.fixture
def launch(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(config, "kernel_cache_dir", str(tmp_path))
    monkeypatch.setattr(compile_cache, "_MEMORY", {})

    def record(module, name, compile_fn):
        stand_in = Launch(compile_fn)
        monkeypatch.setattr(module, name, stand_in.compile)
        return stand_in

    return record


def _randn(*shape):
    return torch.randn(*shape, dtype=DTYPE)


def test_dense_forward_call(launch):
    stand_in = launch(gdpa_fwd, "compile_fwd", kernel_build.compile_fwd)
    q, k, v = _randn(2, 4, 200, D), _randn(2, 4, 130, D), _randn(2, 4, 130, D)
    out = gdpa_fwd.gdpa_fwd_cute(q, k, v, ACT, 0.125, 1.0, 0.01)
    tensors = stand_in.call_args[:4]
    assert [t.data_ptr() for t in tensors] == [x.data_ptr() for x in (q, k, v, out)]
    assert stand_in.call_args[4:] == (0.125, 1.0, 0.01, 2 * 4 * 2, None, None, None, None, None, None)
    stand_in.check_on_compiled_kernel()


@pytest.mark.parametrize("num_keys, dq_dtype", [(300, DTYPE), (1100, torch.float32)])
def test_dense_backward_call(launch, num_keys, dq_dtype):
    stand_in = launch(gdpa_bwd, "compile_bwd", kernel_build.compile_bwd)
    q, k, v, do = _randn(1, 2, 100, D), _randn(1, 2, num_keys, D), _randn(1, 2, num_keys, D), _randn(1, 2, 100, D)
    gdpa_bwd.gdpa_bwd_cute(q, k, v, do, ACT, 0.125, 1.0, 0.01)
    tensors, scalars = stand_in.call_args[:7], stand_in.call_args[7:]
    assert [t.data_ptr() for t in tensors[:4]] == [x.data_ptr() for x in (q, k, v, do)]
    assert tensors[4].dtype == dq_dtype and scalars[:10] == (0.125, 1.0, 0.01, None, None, None, None, None, None, None)
    # fp32 sums: the kernel rounds dQ itself, into dQ in the operands' dtype, with one zero count per (sample, head)
    if dq_dtype == torch.float32:
        dq, counts = scalars[10:]
        assert dq.dtype == DTYPE and dq.shape == q.shape[2:] + q.shape[1::-1]
        assert counts.dtype == torch.int32 and counts.tolist() == [0, 0]
    else:
        assert scalars[10:] == (None, None)
    stand_in.check_on_compiled_kernel()


@pytest.mark.parametrize("bias", [torch.tensor(-1.5, dtype=DTYPE), torch.full((1, 1, 1, 1), 0.25)])
def test_dense_calls_with_a_one_element_bias(launch, bias):
    """A one-element bias (of any float dtype) ends the forward's and the backward's call as a 1-element fp32
    tensor, after Nones for the varlen and band arguments, and the builds with a score offset take it."""
    q, k, v, do = _randn(2, 4, 200, D), _randn(2, 4, 130, D), _randn(2, 4, 130, D), _randn(2, 4, 200, D)
    stand_in = launch(gdpa_fwd, "compile_fwd", kernel_build.compile_fwd)
    gdpa_fwd.gdpa_fwd_cute(q, k, v, ACT, 0.125, 1.0, 0.01, bias=bias)
    assert stand_in.call_args[8:12] == (None, None, None, None)
    offset = stand_in.call_args[12]
    assert offset.dtype == torch.float32 and offset.tolist() == [bias.item()]
    stand_in.check_on_compiled_kernel()
    stand_in = launch(gdpa_bwd, "compile_bwd", kernel_build.compile_bwd)
    gdpa_bwd.gdpa_bwd_cute(q, k, v, do, ACT, 0.125, 1.0, 0.01, bias=bias)
    assert stand_in.call_args[10:14] == (None, None, None, None)
    assert stand_in.call_args[14].tolist() == [bias.item()] and stand_in.call_args[15:] == (None,) * 4
    stand_in.check_on_compiled_kernel()


@pytest.mark.parametrize("bias_grad, sums", [(False, None), (True, None), (True, "atomic")])
@pytest.mark.parametrize("bias", [torch.randn(2, 1, 200, 136, dtype=DTYPE), torch.randn(4, 200, 136, dtype=DTYPE),
                                  torch.randn(200, 144, dtype=DTYPE)[:, 8:]])
def test_dense_backward_calls_with_a_bias_tensor(launch, bias, bias_grad, sums):
    """A bias tensor follows the one element's None in the backward's call, in place (a view) in the kernel's
    (Nq, Nk, Hb, Zb) mode order, its size-1 dims given a stride TMA takes; with its gradient wanted the call ends with
    a [Z, H, Nq, Nk] dS buffer in the same order (else None), or with the atomic sums an fp32 (Nk, Nq, Hb, Zb) tensor
    padded to whole tiles, and dbias comes back in the bias's shape."""
    q, k, v, do = _randn(2, 4, 200, D), _randn(2, 4, 136, D), _randn(2, 4, 136, D), _randn(2, 4, 200, D)
    bias4 = bias.reshape((1,) * (4 - bias.dim()) + bias.shape)
    stand_in = launch(gdpa_bwd, "compile_bwd", kernel_build.compile_bwd)
    plan = gdpa_bwd.plan_dense_bwd(q, k, v, ACT, bias=bias4, bias_grad=bias_grad)
    if sums == "atomic":
        plan = dataclasses.replace(plan, dbias_atomic=True)
    dbias = gdpa_bwd.gdpa_bwd_cute(q, k, v, do, ACT, 0.125, 1.0, 0.01, bias=bias4, bias_grad=bias_grad,
                                   plan=plan)[3]
    assert stand_in.call_args[10:15] == (None, None, None, None, None)
    modes = stand_in.call_args[15]
    assert modes.shape == (200, 136, bias4.shape[1], bias4.shape[0]) and modes.data_ptr() == bias.data_ptr()
    assert modes.stride()[:2] == (bias.stride(-2), 1) and all(s % 8 == 0 and s > 0 for s in modes.stride()[2:])
    assert torch.equal(modes[:, :, 0, 0], bias4[0, 0])
    ds = stand_in.call_args[16]
    assert (ds is not None) == bias_grad and (dbias is not None) == bias_grad
    if bias_grad:
        assert dbias.shape == bias4.shape and dbias.dtype == DTYPE
        if sums == "atomic":
            assert ds.shape == (256, 256, bias4.shape[1], bias4.shape[0]) and ds.dtype == torch.float32
            assert ds.stride(1) == 1
        else:
            assert ds.shape == (200, 136, 4, 2) and ds.dtype == DTYPE
    assert stand_in.plan.score_bias and stand_in.plan.bias_grad == bias_grad
    assert stand_in.plan.dbias_atomic == (sums == "atomic")
    stand_in.check_on_compiled_kernel()


@pytest.mark.parametrize("bias, atomic", [(torch.randn(1, 4, 300, 304, dtype=DTYPE), True),
                                          (torch.randn(300, 304, dtype=DTYPE), True),
                                          (torch.randn(3, 1, 300, 304, dtype=DTYPE), False)])
def test_varlen_backward_calls_with_a_bias_gradient(launch, bias, atomic):
    """A varlen batch's bias shared by its samples has its gradient added atomically: the call ends with an fp32
    (columns, rows, Hb, Zb) tensor padded to whole tiles; a bias per sample gets the [B, H, rows, columns] dS
    buffer."""
    qs, ks, v, order = _jagged_sides([5, 300, 129])
    stand_in = launch(varlen_bwd, "compile_bwd", kernel_build.compile_bwd)
    dout = _randn(qs.tensor.shape[0], 4, D)
    dbias = varlen_bwd.gdpa_varlen_bwd_cute(dout, qs, ks, v, order, ACT, 0.125, 1.0, 0.01, bias=bias,
                                            bias_grad=True)[3]
    ds = stand_in.call_args[16]
    lead = (1,) * (4 - bias.dim()) + tuple(bias.shape[:-2])
    if atomic:
        assert ds.shape == (384, 320, lead[1], lead[0]) and ds.dtype == torch.float32 and ds.stride(1) == 1
    else:
        assert ds.shape == (300, 304, 4, 3) and ds.dtype == DTYPE
    assert stand_in.plan.dbias_atomic == atomic
    assert dbias.shape == bias.shape and dbias.dtype == DTYPE
    stand_in.check_on_compiled_kernel()


@pytest.mark.parametrize("bias", [torch.randn(2, 1, 200, 130, dtype=DTYPE), torch.randn(4, 200, 130, dtype=DTYPE),
                                  torch.randn(200, 140, dtype=DTYPE)[:, 4:134]])
def test_dense_forward_calls_with_a_bias_tensor(launch, bias):
    """A bias tensor ends the forward's call after the one element's None, in place (a view) as int32 pairs of its
    values in the kernel's (Nq, Nk / 2, Hb, Zb) mode order, leading dims it lacks of one, and the build with a bias
    tensor takes it."""
    q, k, v = _randn(2, 4, 200, D), _randn(2, 4, 130, D), _randn(2, 4, 130, D)
    stand_in = launch(gdpa_fwd, "compile_fwd", kernel_build.compile_fwd)
    gdpa_fwd.gdpa_fwd_cute(q, k, v, ACT, 0.125, 1.0, 0.01, bias=bias.reshape((1,) * (4 - bias.dim()) + bias.shape))
    assert stand_in.call_args[8:13] == (None, None, None, None, None)
    pairs = stand_in.call_args[13]
    leading = (1,) * (4 - bias.dim()) + tuple(bias.shape[:-2])
    assert pairs.shape == (200, 65, leading[1], leading[0]) and pairs.dtype == torch.int32
    assert pairs.data_ptr() == bias.data_ptr() and pairs.stride()[:2] == (bias.stride(-2) // 2, 1)
    assert torch.equal(pairs[:, :, 0, 0].contiguous().view(DTYPE), bias.reshape(-1, 200, 130)[0])
    assert stand_in.plan.score_bias
    stand_in.check_on_compiled_kernel()


def _jagged_sides(lengths):
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    total, longest = int(cu[-1]), max(lengths)
    q, k, v = _randn(total, 4, D), _randn(total, 2, D), _randn(total, 2, D)
    _, qs, ks, schedule = sides(q, k, cu, cu, None, None, longest, longest, False)
    return qs, ks, v, row(schedule, ORDER)


def test_varlen_forward_call(launch):
    stand_in = launch(varlen_fwd, "compile_fwd", kernel_build.compile_fwd)
    qs, ks, v, order = _jagged_sides([5, 300, 129])
    out = torch.empty(qs.tensor.shape[0], 4, D, dtype=DTYPE)
    varlen_fwd.gdpa_varlen_fwd_cute(qs, ks, v, SimpleNamespace(tensor=out), order, ACT, 0.125, 1.0, 0.01)
    args = stand_in.call_args
    assert [t.data_ptr() for t in args[:4]] == [x.data_ptr() for x in (qs.tensor, ks.tensor, v, out)]
    assert args[4:8] == (0.125, 1.0, 0.01, 3 * 4 * 3) and args[9] == 3
    assert args[8].tolist() == [qs.starts.tolist(), qs.lengths.tolist(), ks.starts.tolist(), ks.lengths.tolist(),
                                order.tolist()]
    stand_in.check_on_compiled_kernel()


def test_varlen_backward_call(launch):
    stand_in = launch(varlen_bwd, "compile_bwd", kernel_build.compile_bwd)
    qs, ks, v, order = _jagged_sides([5, 300, 129])
    dout = _randn(qs.tensor.shape[0], 4, D)
    varlen_bwd.gdpa_varlen_bwd_cute(dout, qs, ks, v, order, ACT, 0.125, 1.0, 0.01)
    args = stand_in.call_args
    assert args[0].data_ptr() == qs.tensor.data_ptr() and args[3].data_ptr() == dout.data_ptr()
    assert args[7:10] == (0.125, 1.0, 0.01) and args[11] == 3
    stand_in.check_on_compiled_kernel()


@pytest.mark.parametrize("bias", [torch.tensor(-2.0, dtype=DTYPE), torch.full((1, 1, 1), 0.5)])
def test_varlen_calls_with_a_one_element_bias(launch, bias):
    """The varlen forward's and backward's calls end with the one-element bias as a 1-element fp32 tensor, after
    the band's Nones, and the builds with a score offset take it."""
    qs, ks, v, order = _jagged_sides([5, 300, 129])
    stand_in = launch(varlen_fwd, "compile_fwd", kernel_build.compile_fwd)
    out = torch.empty(qs.tensor.shape[0], 4, D, dtype=DTYPE)
    varlen_fwd.gdpa_varlen_fwd_cute(qs, ks, v, SimpleNamespace(tensor=out), order, ACT, 0.125, 1.0, 0.01, bias=bias)
    assert stand_in.call_args[10:12] == (None, None)
    offset = stand_in.call_args[12]
    assert offset.dtype == torch.float32 and offset.tolist() == [bias.item()]
    stand_in.check_on_compiled_kernel()
    stand_in = launch(varlen_bwd, "compile_bwd", kernel_build.compile_bwd)
    dout = _randn(qs.tensor.shape[0], 4, D)
    varlen_bwd.gdpa_varlen_bwd_cute(dout, qs, ks, v, order, ACT, 0.125, 1.0, 0.01, bias=bias)
    assert stand_in.call_args[12:14] == (None, None) and stand_in.call_args[14].tolist() == [bias.item()]
    stand_in.check_on_compiled_kernel()


def test_varlen_band_calls(launch):
    """A band's bounds follow the rows and the tile count, in the forward's and the backward's call, and the band
    builds take them."""
    qs, ks, v, order = _jagged_sides([5, 300, 129])
    stand_in = launch(varlen_fwd, "compile_fwd", kernel_build.compile_fwd)
    out = torch.empty(qs.tensor.shape[0], 4, D, dtype=DTYPE)
    varlen_fwd.gdpa_varlen_fwd_cute(qs, ks, v, SimpleNamespace(tensor=out), order, ACT, 0.125, 1.0, 0.01,
                                    causal=True, band=(300, 0))
    assert stand_in.call_args[10:] == (300, 0, None, None)
    stand_in.check_on_compiled_kernel()
    stand_in = launch(varlen_bwd, "compile_bwd", kernel_build.compile_bwd)
    dout = _randn(qs.tensor.shape[0], 4, D)
    varlen_bwd.gdpa_varlen_bwd_cute(dout, qs, ks, v, order, ACT, 0.125, 1.0, 0.01, causal=True, band=(7, 0))
    assert stand_in.call_args[12:] == (7, 0, None, None, None, None, None)
    stand_in.check_on_compiled_kernel()


# --- the argument schemas (``KernelArgs``): the compile's fakes and a launch's values from one list ---

FWD_PLANS = [
    plan_fwd(DTYPE, 64, ACT), plan_fwd(DTYPE, 128, ACT, causal=True), plan_fwd(DTYPE, 64, ACT, varlen=True),
    plan_fwd(DTYPE, 64, ACT, varlen=True, band=True), plan_fwd(DTYPE, 256, ACT, varlen=True, score_offset=True),
    plan_fwd(torch.bfloat16, 96, ACT, 128, score_bias=True),
]
BWD_PLANS = [
    BwdPlan(DTYPE, 64, 64, ACT), BwdPlan(DTYPE, 128, 128, ACT, dq_last_round=True),
    BwdPlan(DTYPE, 64, 64, ACT, dq_sums="in_place", varlen=True, band=True),
    BwdPlan(DTYPE, 64, 64, ACT, varlen=True, causal=True, score_offset=True),
    BwdPlan(DTYPE, 128, 128, ACT, score_bias=True),
    BwdPlan(DTYPE, 128, 128, ACT, score_bias=True, bias_grad=True, dq_last_round=True),
    BwdPlan(DTYPE, 96, 64, ACT, score_bias=True, bias_grad=True, dbias_atomic=True, dq_sums="in_place"),
    BwdPlan(DTYPE, 256, 256, ACT), BwdPlan(DTYPE, 128, 256, ACT, varlen=True, score_offset=True),
]
SCHEMA_PLANS = [(FWD_ARGS, plan) for plan in FWD_PLANS] + [(kernel_build.bwd_args(plan), plan) for plan in BWD_PLANS]


def _taken(plan) -> set[str]:
    """The parameters a build reads, from its plan's flags: the operands and scalars always, the rest per flag."""
    if isinstance(plan, BwdPlan):
        names = {"q", "k", "v", "dout", "dq", "dk", "dv", "scale", "post_scale", "slope"}
        names |= {"rows", "num_n"} if plan.varlen else set()
        names |= {"bias"} if plan.score_bias else set()
        names |= {"dbias"} if plan.bias_grad else set()
        names |= {"dq_out", "dq_count"} if plan.dq_last_round else set()
    else:
        names = {"q", "k", "v", "out", "scale", "post_scale", "slope", "num_ctas"}
        names |= {"rows", "num_m"} if plan.varlen else set()
        names |= {"bias"} if plan.score_bias else set()
    names |= {"band_left", "band_right"} if plan.band else set()
    names |= {"offset"} if plan.score_offset else set()
    return names


def _given(schema, plan) -> dict:
    """A launch's named arguments for every parameter the build takes (each its own name)."""
    return {a.name: a.name for a in schema.args if a.passed and a.taken(plan)}


def _plan_id(plan) -> str:
    flags = [f.name for f in dataclasses.fields(plan) if f.type in (bool, "bool") and getattr(plan, f.name)]
    sums = [plan.dq_sums] if isinstance(plan, BwdPlan) else []
    return "-".join([type(plan).__name__, f"{plan.head_dim}x{plan.head_dim_v}", *sums, *flags])


@pytest.mark.parametrize("schema, plan", SCHEMA_PLANS, ids=[_plan_id(plan) for _, plan in SCHEMA_PLANS])
def test_fakes_and_values_agree_on_what_the_build_takes(schema, plan):
    """The compile's fakes and the launch's values, the stream aside (taken from the caller's), line up one by one:
    None at the same places, the parameters the plan's flags name taken."""
    fakes = [fake for a, fake in zip(schema.args, schema.fakes(plan)) if a.passed]
    values = schema.values(plan, **_given(schema, plan))
    assert len(values) == len(fakes) == len(schema.args) - 1
    assert [v is None for v in values] == [f is None for f in fakes]
    passed = [a.name for a in schema.args if a.passed]
    assert {name for name, v in zip(passed, values) if v is not None} == _taken(plan)
    assert all(v == name for name, v in zip(passed, values) if v is not None)


def test_values_need_every_argument_the_build_takes():
    plan = plan_fwd(DTYPE, 64, ACT, score_offset=True)
    given = _given(FWD_ARGS, plan)
    del given["offset"]
    with pytest.raises(TypeError, match="this build of the kernel needs 'offset'"):
        FWD_ARGS.values(plan, **given)


@pytest.mark.parametrize("name", ["bias", "rows", "band_left"])
def test_values_refuse_an_argument_the_build_does_not_take(name):
    plan = plan_fwd(DTYPE, 64, ACT, score_offset=True)
    with pytest.raises(TypeError, match=f"this build of the kernel takes no '{name}'"):
        FWD_ARGS.values(plan, **_given(FWD_ARGS, plan), **{name: torch.zeros(1)})


def test_values_ignore_untaken_arguments_given_as_none():
    """A launcher shared by two kernels (the narrow and the wide backward) names, as None, parameters one lacks."""
    plan = BwdPlan(DTYPE, 256, 128, ACT)
    given = _given(WIDE_BWD_ARGS, plan)
    quiet = dict(band_left=None, band_right=None, bias=None, dbias=None, dq_out=None, dq_count=None, offset=None)
    assert WIDE_BWD_ARGS.values(plan, **given, **quiet) == WIDE_BWD_ARGS.values(plan, **given)
    with pytest.raises(TypeError, match=r"the kernel has no parameters \['dq_out'\]"):
        WIDE_BWD_ARGS.values(plan, **given, dq_out=torch.zeros(1))


def test_wide_backward_schema_has_no_mask_bias_or_dq_round():
    names = {a.name for a in WIDE_BWD_ARGS.args}
    assert not names & {"band_left", "band_right", "bias", "dbias", "dq_out", "dq_count"}
    assert kernel_build.bwd_args(BwdPlan(DTYPE, 256, 128, ACT)) is WIDE_BWD_ARGS
    assert kernel_build.bwd_args(BwdPlan(DTYPE, 128, 128, ACT)) is BWD_ARGS


# the kernels' names of the schemas' tensors (the others are the same)
KERNEL_NAMES = {"q": "mQ", "k": "mK", "v": "mV", "out": "mO", "dout": "mdO", "dq": "mdQ", "dk": "mdK", "dv": "mdV",
                "bias": "mBias", "dbias": "mdBias", "dq_out": "mdQ_out"}


@pytest.mark.parametrize("schema, kernel", [(FWD_ARGS, GdpaFwdSm90), (BWD_ARGS, GdpaBwdSm90),
                                            (WIDE_BWD_ARGS, GdpaBwdWideSm90)], ids=["fwd", "bwd", "wide_bwd"])
def test_schema_is_the_kernels_call_signature(schema, kernel):
    """Each schema lists its kernel's ``__call__`` parameters after ``self``, all of them and in order: a build
    loaded from the disk cache fills in no defaults, and the values are passed by position."""
    params = list(inspect.signature(kernel.__call__).parameters)
    assert params[0] == "self"
    assert [KERNEL_NAMES.get(a.name, a.name) for a in schema.args] == params[1:]
