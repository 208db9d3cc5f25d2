"""The dQ sums' workspace kept zeroed between the CuTe backward's calls (``kernels/cute/dq_workspace``), and the
launcher handing it to the kernel that rounds dQ itself (no GPU needed: the device-side half, that the kernel
leaves it zero, is tests/gpu/test_cute_dq_last_round_cuda.py's)."""

from __future__ import annotations

import pytest
import torch

from gdpa_inductor.kernels.cute import dq_workspace
from gdpa_inductor.kernels.cute.dq_workspace import release_dq_workspaces, zeroed_dq_sums

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _fresh():
    release_dq_workspaces()
    yield
    release_dq_workspaces()


@pytest.mark.parametrize("shape, heads", [((2, 4, 160, 128), 8), ((1, 1, 1, 64), 1), ((3, 2, 80, 96), 6)])
def test_zeroed_sums_and_counts_of_the_asked_sizes(shape, heads):
    sums, counts = zeroed_dq_sums(shape, heads, CPU)
    assert (sums.shape, sums.dtype, counts.shape, counts.dtype) == (torch.Size(shape), torch.float32,
                                                                    torch.Size([heads]), torch.int32)
    assert sums.is_contiguous() and not sums.any() and not counts.any()
    # the counts lie past the sums: filling one leaves the other zero
    sums.fill_(1.5)
    assert not counts.any()


def test_a_call_no_larger_reuses_the_kept_buffer_and_a_larger_one_grows_it():
    sums, counts = zeroed_dq_sums((2, 4, 256, 128), 8, CPU)
    kept = sums.data_ptr()
    smaller, _ = zeroed_dq_sums((1, 4, 80, 128), 4, CPU)
    assert smaller.data_ptr() == kept
    larger, larger_counts = zeroed_dq_sums((4, 4, 256, 128), 16, CPU)
    assert larger.data_ptr() != kept and not larger.any() and not larger_counts.any()
    again, _ = zeroed_dq_sums((2, 4, 256, 128), 8, CPU)
    assert again.data_ptr() == larger.data_ptr()


def test_each_stream_keeps_its_own(monkeypatch):
    first, _ = zeroed_dq_sums((1, 2, 64, 64), 2, CPU)
    monkeypatch.setattr(dq_workspace, "_stream_key", lambda device: ("cpu", None, "another stream"))
    second, _ = zeroed_dq_sums((1, 2, 64, 64), 2, CPU)
    assert second.data_ptr() != first.data_ptr()


def test_a_stream_being_captured_gets_a_fresh_buffer_it_does_not_keep(monkeypatch):
    kept, _ = zeroed_dq_sums((1, 2, 64, 64), 2, CPU)
    monkeypatch.setattr(dq_workspace, "_capturing", lambda device: True)
    captured = [zeroed_dq_sums((1, 2, 64, 64), 2, CPU)[0] for _ in range(2)]
    assert len({kept.data_ptr(), *(t.data_ptr() for t in captured)}) == 3
    monkeypatch.setattr(dq_workspace, "_capturing", lambda device: False)
    assert zeroed_dq_sums((1, 2, 64, 64), 2, CPU)[0].data_ptr() == kept.data_ptr()


def test_release_gives_the_buffers_back():
    zeroed_dq_sums((1, 2, 64, 64), 2, CPU)
    assert dq_workspace._WORKSPACES
    release_dq_workspaces()
    assert not dq_workspace._WORKSPACES


def test_public_release_is_the_workspace_one():
    import gdpa_inductor

    assert gdpa_inductor.release_dq_workspaces is release_dq_workspaces
