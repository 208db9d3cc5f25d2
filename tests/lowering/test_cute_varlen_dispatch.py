"""Which path the varlen forward and backward take: the CuTe-DSL varlen kernels where they cover the call (under
"auto" and "cute"; the aligned causal builds where every sample's Nk - Nq is known to fit them, a band mask for
other causal calls and for windows), else the usual choice, with the reason in the support check. CPU tensors
stand in for an sm_90 GPU's; the op itself then runs as before (the reference here), whatever the selector says for
the GPU."""

from __future__ import annotations

import pytest
import torch

from gdpa_inductor.kernels.common.window_bounds import UNBOUNDED
from gdpa_inductor.kernels.cute import varlen_plan, varlen_support
from gdpa_inductor.kernels.cute.fwd_support import cute_dsl_available
from gdpa_inductor.lowering import dispatch
from gdpa_inductor.lowering.dispatch import select_impl, select_varlen_backward_impl, select_varlen_forward_impl

needs_cute_dsl = pytest.mark.skipif(not cute_dsl_available(), reason="nvidia-cutlass-dsl is not installed")


@pytest.fixture
def on_hopper(monkeypatch):
    monkeypatch.setattr(varlen_support, "on_sm90", lambda device: True)
    monkeypatch.setattr(dispatch, "on_cuda", lambda q: True)  # CPU tensors stand in for CUDA ones


def _jagged(dtype=torch.bfloat16, d=128, dv=None, h=4, hkv=2, total=300):
    q = torch.randn(total, h, d, dtype=dtype)
    k = torch.randn(total, hkv, d, dtype=dtype)
    v = torch.randn(total, hkv, dv or d, dtype=dtype)
    return q, k, v


def _self_rows(total=300):
    """(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k) of self attention: one offsets tensor for both sides."""
    cu = torch.tensor([0, 100, total], dtype=torch.int32)
    return cu, cu, None, None


@needs_cute_dsl
@pytest.mark.parametrize(
    "change, reason",
    [
        (dict(), ""),
        (dict(bias=(4, 300, 300)), ""),
        (dict(bias=(2, 1, 300, 300)), ""),
        (dict(bias=(4, 1, 300)), "a value for every query position of a sample (got shape (4, 1, 300)"),
        (dict(bias=(300, 1)), "a value for every key position"),
        (dict(bias=(4, 1, 300), dense_q=True), "a value for every query position"),
        (dict(bias=(4, 7, 300), dense_q=True), ""),
        (dict(bias=(4, 300, 299)), "reads a bias's values in pairs"),
        (dict(bias=(4, 300, 300), bias_dtype=torch.float32), "in the operands' dtype"),
        (dict(bias=()), ""),
        (dict(bias=(1, 1, 1), causal=True, window=(16, 0)), ""),
        (dict(causal=True), ""),
        (dict(window=(16, 0)), ""),
        (dict(causal=True, window=(16, 0)), ""),
        (dict(window=(3, 5), d=256), "D and Dv of at most 128"),
        (dict(causal=True, d=128, dv=256), "D and Dv of at most 128"),
        (dict(activation="softplus"), "no CuTe form"),
        (dict(dtype=torch.float32), "fp16/bf16"),
        (dict(d=64), ""),
        (dict(d=96, dv=128), ""),
        (dict(d=128, dv=64), ""),
        (dict(d=256), ""),
        (dict(d=128, dv=256), ""),
        (dict(d=192), "head dims"),
        (dict(dv=80), "head dims"),
        (dict(transpose=True), "contiguous last dim"),
        (dict(broadcast_k=True), "strides"),
        (dict(dense_q=True), ""),
    ],
)
def test_support_reasons(on_hopper, change, reason):
    q, k, v = _jagged(change.get("dtype", torch.bfloat16), change.get("d", 128), change.get("dv"))
    if change.get("transpose"):
        q = q.transpose(-1, -2).contiguous().transpose(-1, -2)
    if change.get("broadcast_k"):
        # heads broadcast (stride 0): no TMA layout
        k = torch.randn(300, 1, 128, dtype=k.dtype).expand(300, 2, 128)
    if change.get("dense_q"):
        q = torch.randn(1, 7, 4, q.shape[-1], dtype=q.dtype)
    bias = torch.randn(change["bias"], dtype=change.get("bias_dtype", q.dtype)) if "bias" in change else None
    ok, why = varlen_support.cute_varlen_fwd_support(q, k, v, bias, change.get("causal", False),
                                                  change.get("window", (-1, -1)), change.get("activation", "silu"),
                                                  _self_rows())
    assert ok == (reason == "")
    assert reason in why


def _assert_selects(select, what: str, q, k, v, causal: bool, rows: str, expected: str | None, window=(-1, -1)):
    """``select`` (a varlen selector) picks ``expected`` for the call over ``rows`` ("self": one offsets tensor for
    both sides, "equal_offsets": two equal ones); None: ``select_impl``'s answer, or its error under a forced
    "triton"."""
    rows = _self_rows() if rows == "self" else (_self_rows()[0], _self_rows()[0].clone(), None, None)
    if expected is None:
        try:
            expected = select_impl(q, k, v, None, what)
        except ValueError as e:
            with pytest.raises(ValueError, match=str(e)[:40]):
                select(q, k, v, None, causal, window, "silu", rows)
            return
    assert select(q, k, v, None, causal, window, "silu", rows) == expected


def _dense(n, b=2, d=128, dtype=torch.bfloat16):
    return torch.randn(b, n, 4, d, dtype=dtype)


@needs_cute_dsl
@pytest.mark.parametrize("layout, reason", [
    ("self", ""),
    ("equal_offsets", "one cu_seqlens tensor"),
    ("jagged_q_dense_k", "one cu_seqlens tensor"),
    ("padded_self", ""),
    ("padded_two_lengths", "one seqused tensor"),
    ("padded_q_only", "one seqused tensor"),
    ("dense_equal", ""),
    ("dense_offset_256", ""),
    ("dense_offset_100", "non-negative multiple of 128"),
    ("dense_fewer_keys", "non-negative multiple of 128"),
    ("self_d256", "D and Dv of at most 128"),
])
def test_causal_mask_kinds(on_hopper, layout, reason):
    """The aligned causal builds are taken where every sample's Nk - Nq is known, without reading the offsets, to
    be a non-negative multiple of 128: one cu_seqlens or one seqused tensor for both sides, or full dense sides whose
    lengths differ by such a multiple (``reason``: why not, else ""); every other causal call runs as the band
    (unbounded left, 0 right), but past head dims of 128."""
    q, k, v = _jagged(d=256 if layout == "self_d256" else 128)
    rows = _self_rows()
    lengths = torch.tensor([5, 9], dtype=torch.int32)
    if layout == "equal_offsets":
        rows = (rows[0], rows[0].clone(), None, None)
    elif layout == "jagged_q_dense_k":
        k, v, rows = _dense(300), _dense(300), (rows[0], None, None, None)
    elif layout.startswith(("padded", "dense")):
        nq, nk = {"dense_offset_256": (64, 320), "dense_offset_100": (64, 164), "dense_fewer_keys": (300, 172)}.get(
            layout, (300, 300))
        q, k, v = _dense(nq), _dense(nk), _dense(nk)
        rows = {"padded_self": (None, None, lengths, lengths),
                "padded_two_lengths": (None, None, lengths, lengths.clone()),
                "padded_q_only": (None, None, lengths, None)}.get(layout, (None, None, None, None))
    aligned, why = varlen_support.varlen_causal_support(q, k, v, rows)
    assert aligned == (reason == "")
    assert reason in why
    band = varlen_plan.varlen_band(q, k, v, True, (-1, -1), rows)
    assert band == (None if aligned else (UNBOUNDED, 0))
    wide = layout == "self_d256"
    assert varlen_support.cute_varlen_fwd_support(q, k, v, None, True, (-1, -1), "silu", rows)[0] == (not wide)
    # the same call without the mask is taken, and runs no band
    assert varlen_support.cute_varlen_fwd_support(q, k, v, None, False, (-1, -1), "silu", rows) == (True, "")
    assert varlen_plan.varlen_band(q, k, v, False, (-1, -1), rows) is None


@pytest.mark.parametrize("causal, window, rows, band", [
    (False, (-1, -1), "self", None),
    (True, (-1, -1), "self", None),
    (True, (-1, -1), "equal_offsets", (UNBOUNDED, 0)),
    (True, (16, 0), "self", (16, 0)),
    (True, (16, 7), "self", (16, 0)),
    (True, (-1, 7), "self", (UNBOUNDED, 0)),
    (False, (3, 2), "self", (3, 2)),
    (False, (-1, 5), "equal_offsets", (UNBOUNDED, 5)),
    (False, (0, -1), "self", (0, UNBOUNDED)),
])
def test_band_bounds(causal, window, rows, band):
    """The band's (left, right) bounds for a call: the window's sides (-1: unbounded), the right one at most 0
    under causal; None where the plain or the aligned causal builds run."""
    q, k, v = _jagged()
    rows = _self_rows() if rows == "self" else (_self_rows()[0], _self_rows()[0].clone(), None, None)
    assert varlen_plan.varlen_band(q, k, v, causal, window, rows) == band


def test_off_hopper_is_not_cute():
    q, k, v = _jagged()
    ok, why = varlen_support.cute_varlen_fwd_support(q, k, v, None, False, (-1, -1), "silu", _self_rows())
    assert not ok and ("sm_90" in why or "not installed" in why)


@needs_cute_dsl
@pytest.mark.parametrize("name, causal, rows, expected", [
    ("auto", False, "self", "cute"), ("cute", False, "self", "cute"), ("auto", True, "self", "cute"),
    ("cute", True, "self", "cute"), ("auto", True, "equal_offsets", "cute"), ("cute", True, "equal_offsets", "cute"),
    ("triton", False, "self", None), ("reference", False, "self", "reference"), ("triton", True, "equal_offsets", None),
])
def test_selector(on_hopper, backend, name, causal, rows, expected):
    """"auto" and "cute" take the CuTe varlen forward where it covers the call, causal over two offsets tensors too
    (as a band); the other backends take the usual choice (None: ``select_impl``'s answer, the reference on CPU
    tensors, or its error under a forced "triton")."""
    backend(name)
    q, k, v = _jagged()
    _assert_selects(select_varlen_forward_impl, "varlen forward", q, k, v, causal, rows, expected)


@needs_cute_dsl
@pytest.mark.parametrize("name, expected", [("auto", "cute"), ("cute", "cute"), ("triton", None)])
@pytest.mark.parametrize("window", [(16, 0), (3, 2)])
def test_selectors_take_windows(on_hopper, backend, name, expected, window):
    """Windows (HSTU's max_attn_len, two-sided) run on the CuTe varlen kernels under "auto" and "cute", forward and
    backward."""
    backend(name)
    q, k, v = _jagged()
    for select, what in ((select_varlen_forward_impl, "varlen forward"),
                         (select_varlen_backward_impl, "varlen backward")):
        _assert_selects(select, what, q, k, v, window[1] == 0, "self", expected, window)


@needs_cute_dsl
@pytest.mark.parametrize("name", ["auto", "cute"])
@pytest.mark.parametrize("d, dv, auto_takes_cute", [(256, 256, True), (128, 256, False), (256, 128, False)])
def test_selector_wide_heads(on_hopper, backend, name, d, dv, auto_takes_cute):
    """Equal head dims of 256 take the CuTe varlen forward under "auto" too; unequal ones past 128 only under a
    forced "cute" (Triton's was faster at short samples)."""
    backend(name)
    q, k, v = _jagged(d=d, dv=dv)
    expected = "cute" if name == "cute" or auto_takes_cute else select_impl(q, k, v, None, "varlen forward")
    assert select_varlen_forward_impl(q, k, v, None, False, (-1, -1), "silu", _self_rows()) == expected


@needs_cute_dsl
@pytest.mark.parametrize("change, reason", [(dict(), ""), (dict(causal=True), ""),
                                            (dict(causal=True, equal_offsets=True), ""),
                                            (dict(window=(3, 0)), ""),
                                            (dict(bias=(4, 300, 300)), ""),
                                            (dict(bias=(4, 296, 296), total=296), ""),
                                            (dict(bias=(4, 296, 296), total=296, bias_grad=True), ""),
                                            (dict(bias=(4, 296, 296), total=296, d=256), "D and Dv up to 128"),
                                            (dict(bias=(4, 1, 296), total=296), "every query position"),
                                            (dict(bias=()), ""),
                                            (dict(bias=(), bias_grad=True), "the gradient of a bias tensor only"),
                                            (dict(d=256), ""),
                                            (dict(d=256, causal=True), "D and Dv of at most 128"),
                                            (dict(d=192), "for the CuTe varlen backward"),
                                            (dict(activation="softplus"), "no CuTe form")])
def test_backward_support_reasons(on_hopper, change, reason):
    """The backward takes the forward's calls, causal ones and windows included, and a bias tensor's gradient where
    it reads the bias's tiles by TMA (D and Dv up to 128; Nk not a multiple of 8 through a padded copy); its reasons
    name it."""
    total = change.get("total", 300)
    q, k, v = _jagged(d=change.get("d", 128), total=total)
    rows = _self_rows(total)
    if change.get("equal_offsets"):
        rows = (rows[0], rows[0].clone(), None, None)
    bias = torch.randn(change["bias"], dtype=q.dtype) if "bias" in change else None
    ok, why = varlen_support.cute_varlen_bwd_support(q, k, v, bias, change.get("causal", False),
                                                      change.get("window", (-1, -1)),
                                                      change.get("activation", "silu"), rows,
                                                      change.get("bias_grad", False))
    assert ok == (reason == "")
    assert reason in why


@needs_cute_dsl
@pytest.mark.parametrize("name, causal, rows, expected", [
    ("cute", False, "self", "cute"), ("auto", False, "self", "cute"), ("cute", True, "self", "cute"),
    ("auto", True, "self", "cute"), ("auto", True, "equal_offsets", "cute"), ("triton", False, "self", None),
    ("reference", False, "self", "reference"),
])
def test_backward_selector(on_hopper, backend, name, causal, rows, expected):
    """"auto" and "cute" take the CuTe varlen backward where it covers the call; the cases it does not cover take
    the usual choice (None: ``select_impl``'s answer, or its error under a forced "triton")."""
    backend(name)
    q, k, v = _jagged()
    _assert_selects(select_varlen_backward_impl, "varlen backward", q, k, v, causal, rows, expected)


@needs_cute_dsl
def test_one_element_bias_takes_cute_without_its_gradient(on_hopper, backend):
    """A one-element bias runs on the CuTe varlen kernels under "auto"; a bias that wants its gradient leaves the
    backward to the usual choice (the CuTe backward computes a bias tensor's only)."""
    backend("auto")
    q, k, v = _jagged()
    bias = torch.tensor(-1.0, dtype=q.dtype)
    args = (q, k, v, bias, True, (-1, -1), "sigmoid", _self_rows())
    assert select_varlen_forward_impl(*args) == "cute"
    assert select_varlen_backward_impl(*args) == "cute"
    assert select_varlen_backward_impl(*args, bias_grad=True) == select_impl(q, k, v, bias, "varlen backward")


@needs_cute_dsl
@pytest.mark.parametrize("grad", [False, True])
def test_bias_tensor_takes_cute_with_its_gradient(on_hopper, backend, grad):
    """HSTU's relative bias ([H, N, N] shared by the samples, learned) runs on the CuTe varlen forward and backward
    under "auto", its gradient included."""
    backend("auto")
    q, k, v = _jagged(total=296)
    bias = torch.randn(4, 296, 296, dtype=q.dtype)
    args = (q, k, v, bias, True, (-1, -1), "silu", _self_rows(296))
    assert select_varlen_forward_impl(*args) == "cute"
    assert select_varlen_backward_impl(*args, bias_grad=grad) == "cute"
