"""The first-use self-check of a kernel variant that no GPU of this project's tests has run: before the variant
serves any call in the process, it runs on a few small random inputs beside the trusted kernel (Triton), and only a
match lets it serve.

The verdict is kept per variant (its compile key) for the process. A pass lets the variant serve every later call
with no further check and no host synchronization; a mismatch, an exception or a failed compile disables it, with
one warning on the ``gdpa_inductor`` logger naming the variant and why, and its calls run on the trusted kernel.

The bound is the GPU tests' (tests/gpu/cute_common.py): an output within twice the error of eager PyTorch's (here:
the trusted kernel's) from the float64 math, plus a floor. The candidate is measured against the trusted output, so
the bound is three times the trusted output's own error (twice for the candidate's, once for the trusted's).
NaN and Inf must sit where the trusted output has them.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Hashable, Iterable

import torch

log = logging.getLogger("gdpa_inductor")

# absolute slack under the bound, for errors near zero (the GPU tests' FLOOR)
FLOOR = 1e-4
# the trusted output's error from the float64 math, times this: twice for the candidate's, once for its own
ERROR_FACTOR = 3.0

Outputs = torch.Tensor | tuple[torch.Tensor, ...]


@dataclasses.dataclass(frozen=True)
class Check:
    """What one variant's self-check runs. ``cases()``: the argument tuples, fresh random inputs on the device;
    ``candidate``, ``trusted`` and ``exact`` each take one tuple (``exact`` with its floating tensors in float64) and
    return the output, or a tuple of outputs named by ``outputs`` (a backward's gradients)."""

    variant: str
    candidate: Callable[..., Outputs]
    trusted: Callable[..., Outputs]
    exact: Callable[..., Outputs]
    cases: Callable[[], Iterable[tuple]]
    outputs: tuple[str, ...] = ("out",)
    trusted_name: str = "Triton"


# variant key -> (passed, why not)
_verdicts: dict[Hashable, tuple[bool, str]] = {}
_lock = threading.Lock()


def verdict(key: Hashable, make_check: Callable[[], Check]) -> tuple[bool, str]:
    """(passed, why not) for the variant ``key``: its check runs at the first ask in the process (``make_check``
    builds it), later asks read the kept verdict. Not while a CUDA graph is being captured (the check synchronizes):
    then (False, why), kept for no later ask."""
    found = _verdicts.get(key)
    if found is not None:
        return found
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return False, "not self-checked yet (a CUDA graph is being captured)"
    with _lock:
        found = _verdicts.get(key)
        if found is None:
            check = make_check()
            found = run_check(check)
            _verdicts[key] = found
            if not found[0]:
                log.warning("gdpa: %s; it is disabled for this process", found[1])
    return found


def failed(key: Hashable) -> bool:
    """Whether the variant ``key`` has been checked in this process and failed."""
    return _verdicts.get(key, (True, ""))[0] is False


def run_check(check: Check) -> tuple[bool, str]:
    """(passed, why not): every case of ``check``, the candidate against the trusted kernel; the reason names the
    variant."""
    for args in check.cases():
        shapes = ", ".join(str(tuple(a.shape)) for a in args if isinstance(a, torch.Tensor))
        try:
            got = check.candidate(*args)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:
            return False, f"{check.variant} raised {_first_line(e)} on inputs {shapes}"
        try:
            trusted = check.trusted(*args)
            exact = check.exact(*(_float64(a) for a in args))
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:
            return False, (f"the self-check of {check.variant} could not run {check.trusted_name} or the float64 "
                           f"math ({_first_line(e)})")
        why = mismatch(got, trusted, exact, check.outputs, check.trusted_name)
        if why:
            return False, (f"{check.variant} failed its first-use self-check against {check.trusted_name}: {why} "
                           f"on inputs {shapes}")
    return True, ""


def mismatch(got: Outputs, trusted: Outputs, exact: Outputs, names: tuple[str, ...], trusted_name: str) -> str:
    """Why ``got`` does not match ``trusted`` (``exact``: the float64 math, for the bound), or "" where it does."""
    got, trusted, exact = (o if isinstance(o, tuple) else (o,) for o in (got, trusted, exact))
    if len(got) != len(trusted):
        return f"{len(got)} outputs, {trusted_name} {len(trusted)}"
    for name, g, t, e in zip(names, got, trusted, exact):
        if g.shape != t.shape or g.dtype != t.dtype:
            return f"{name} of shape {tuple(g.shape)} and {g.dtype}, {trusted_name}'s {tuple(t.shape)} and {t.dtype}"
        finite = t.isfinite()
        if not (torch.equal(g.isnan(), t.isnan()) and torch.equal(g.isinf(), t.isinf())
                and torch.equal(g[t.isinf()], t[t.isinf()])):
            return f"{name} has NaN or Inf where {trusted_name}'s has not, or the other way"
        err = rel_err(g[finite], t[finite])
        bound = ERROR_FACTOR * rel_err(t[finite], e[finite]) + FLOOR
        if not err <= bound:
            return f"{name}'s relative error to {trusted_name}'s is {err:.3g}, above the bound {bound:.3g}"
    return ""


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (||out - ref|| where ref is zero)."""
    out64, ref64 = out.detach().double(), ref.detach().double()
    num, den = (out64 - ref64).norm().item(), ref64.norm().item()
    return num / den if den else num


def _float64(a):
    return a.detach().double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a


def _first_line(e: Exception) -> str:
    return f"{type(e).__name__}: {e}".splitlines()[0][:300]
