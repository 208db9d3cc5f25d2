"""Writing in-place steps out of place (``patterns/in_place.py``): each spelling on a tensor nothing else shares
becomes its out-of-place call and the graph computes what it computed; a tensor shared with a view read before the
change, a graph input, a change through slices, or one made with gradients off stays in place."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from harness import reset

from gdpa_inductor.patterns.in_place import write_out_of_place
from gdpa_inductor.patterns.mutation import written


def _traced(fn, *inputs) -> fx.GraphModule:
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm

    reset()
    torch.compile(fn, backend=capture)(*inputs)
    assert len(graphs) == 1
    return graphs[0]


def scale_and_fill(x, m):
    s = x @ x.transpose(-1, -2)
    s.mul_(0.5)
    s -= 1.0
    s.masked_fill_(m, -3.0)
    return s.sigmoid_() @ x


def set_through_a_mask(x, m):
    s = x @ x.transpose(-1, -2)
    s[m] = 0.25
    return torch.relu_(s) @ x


def activation_by_position(x, m):
    s = x @ x.transpose(-1, -2)
    F.hardtanh(s, -0.5, 0.5, True)
    s.div_(2.0)
    return s @ x


def chained_methods(x, m):
    s = x @ x.transpose(-1, -2)
    s.mul_(2.0).add_(1.0).tril_()
    return s @ x


def promoted_then_stored(x, m):
    s = (x @ x.transpose(-1, -2)).to(torch.bfloat16)
    s += m.float() * 0.3  # computed in float32, stored in bfloat16
    return s.float() @ x


@pytest.mark.parametrize("fn, rewritten", [
    (scale_and_fill, 4), (set_through_a_mask, 2), (activation_by_position, 2), (chained_methods, 3),
    (promoted_then_stored, 1),
], ids=lambda c: getattr(c, "__name__", str(c)))
def test_written_out_of_place_computes_the_same(fn, rewritten):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 4, generator=gen)
    m = torch.rand(2, 6, 6, generator=gen) < 0.3
    gm = _traced(fn, x, m)
    inputs = (x, m)[:len([n for n in gm.graph.nodes if n.op == "placeholder"])]  # Dynamo drops an unread input
    want = gm(*inputs)
    assert write_out_of_place(gm.graph) == rewritten
    gm.graph.lint()
    gm.recompile()
    assert not [n for n in gm.graph.nodes if written(n) is not None], gm.graph
    torch.testing.assert_close(gm(*inputs), want, rtol=0, atol=0)


def view_read_after(x, m):
    s = x @ x.transpose(-1, -2)
    t = s.transpose(-1, -2)
    s.mul_(2.0)
    return t @ x


def input_changed(x, m):
    x.mul_(2.0)
    return x @ x.transpose(-1, -2)


def changed_without_gradients(x, m):
    s = x @ x.transpose(-1, -2)
    with torch.no_grad():
        s.mul_(2.0)  # not recorded: the gradient of s @ x reads s as made
    return s @ x


def set_with_slices(x, m):
    s = x @ x.transpose(-1, -2)
    s[:, 0, :] = 1.0
    return s @ x


@pytest.mark.parametrize("fn", [view_read_after, input_changed, set_with_slices, changed_without_gradients],
                         ids=lambda f: f.__name__)
def test_left_in_place(fn):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 4, generator=gen)
    m = torch.rand(2, 6, 6, generator=gen) < 0.3
    gm = _traced(fn, x.clone(), m)
    writes = [n for n in gm.graph.nodes if written(n) is not None]
    assert writes
    assert write_out_of_place(gm.graph) == 0
    assert [n for n in gm.graph.nodes if written(n) is not None] == writes
