"""User-facing options, each read once from its environment variable when this module is imported.

``backend`` (``GDPA_INDUCTOR_BACKEND``) forces a kernel path:
- ``"auto"`` (default): on an sm_90 GPU with nvidia-cutlass-dsl, the CuTe-DSL forward and backward
  (``kernels/cute``, dense and varlen) where they cover the call; otherwise Triton on CUDA where it supports the
  case, the reference elsewhere;
- ``"triton"``: Triton or an error saying why not (on CPU it needs ``TRITON_INTERPRET=1``);
- ``"reference"``: always the pure-PyTorch path;
- ``"cute"``: the CuTe-DSL Hopper forward and backward or an error saying why not; the varlen op takes the
  CuTe varlen kernels where they cover the call (windows and causal masks included, at D and Dv up to 128), and
  the varlen calls they do not cover (bias, masks past those head dims) run as under ``"auto"``. Needs
  nvidia-cutlass-dsl and an sm_90 GPU.

``kernel_cache_dir`` (``GDPA_INDUCTOR_CACHE_DIR``): where compiled CuTe-DSL kernels are kept between processes
(default ``~/.cache/gdpa_inductor``; the empty string or None keeps them in memory only).

``cute_bwd_query_tile`` (``GDPA_CUTE_BWD_QUERY_TILE``): the queries the CuTe backward steps over at a time where it
can choose (64 or 80; None, the default: its own choice, ``kernels/cute/bwd_plan.py``).

A bad environment value fails the import with a ValueError naming the variable and the values it takes. An
assignment (``gdpa_inductor.config.backend = "reference"``) is checked when it is made: a ValueError or TypeError
naming the option, an AttributeError for a name that is no option. ``config.patch(backend="reference")`` sets
options for a ``with`` block or a decorated function and restores them after, as torch's config modules do.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

Backend = Literal["auto", "triton", "reference", "cute"]
BACKENDS: tuple[str, ...] = ("auto", "triton", "reference", "cute")
QueryTile = Literal[64, 80]
QUERY_TILES: tuple[int, ...] = (64, 80)


@dataclass(frozen=True)
class Option:
    """One option: its environment variable and default, what it takes (``accepts``, described by ``expected``;
    the variable's texts by ``env_expected``), how the variable's text becomes a value, and the error a wrong
    assigned value raises."""

    env: str
    default: Any
    expected: str
    env_expected: str
    accepts: Callable[[Any], bool]
    parse: Callable[[str], Any] = str
    error: type[Exception] = ValueError


def _query_tile_from_text(text: str) -> Any:
    return int(text) if text in {str(t) for t in QUERY_TILES} else text


OPTIONS: dict[str, Option] = {
    "backend": Option("GDPA_INDUCTOR_BACKEND", "auto", f"one of {BACKENDS}", f"one of {BACKENDS}",
                      lambda v: v in BACKENDS),
    "kernel_cache_dir": Option(
        "GDPA_INDUCTOR_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "gdpa_inductor"),
        "a path (str) or None", "a directory, or empty for none",
        lambda v: v is None or isinstance(v, (str, os.PathLike)), error=TypeError,
    ),
    "cute_bwd_query_tile": Option(
        "GDPA_CUTE_BWD_QUERY_TILE", None, f"None or one of {QUERY_TILES}", "64 or 80 (unset: the backward's choice)",
        lambda v: v is None or (type(v) is int and v in QUERY_TILES), parse=_query_tile_from_text,
    ),
}


def _check(name: str, value: Any) -> None:
    option = OPTIONS[name]
    if not option.accepts(value):
        got = type(value).__name__ if option.error is TypeError else repr(value)
        raise option.error(f"gdpa_inductor.config.{name}: expected {option.expected}; got {got}")


def _from_environment(name: str) -> Any:
    """``name``'s value from its environment variable, or its default where the variable is unset."""
    option = OPTIONS[name]
    text = os.environ.get(option.env)
    if text is None:
        return option.default
    value = option.parse(text)
    if not option.accepts(value):
        raise ValueError(f"environment variable {option.env}={text!r}: expected {option.env_expected} "
                         f"(gdpa_inductor.config.{name})")
    return value


backend: Backend = _from_environment("backend")
kernel_cache_dir: str | None = _from_environment("kernel_cache_dir")
cute_bwd_query_tile: QueryTile | None = _from_environment("cute_bwd_query_tile")


@contextlib.contextmanager
def patch(changes: dict[str, Any] | None = None, **options: Any) -> Iterator[None]:
    """Sets options (a dict, keywords or both) for a ``with`` block or a decorated function, each checked as an
    assignment is before any is set, and restores the earlier values after."""
    changes = {**(changes or {}), **options}
    module = sys.modules[__name__]
    for name, value in changes.items():
        if name not in OPTIONS:
            raise AttributeError(f"gdpa_inductor.config has no option {name!r} (options: {', '.join(OPTIONS)})")
        _check(name, value)
    saved = {name: getattr(module, name) for name in changes}
    try:
        for name, value in changes.items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


class _CheckedOptions(types.ModuleType):
    """This module, with each assignment to an option checked and assignments to other new names refused."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in OPTIONS:
            _check(name, value)
        elif not hasattr(self, name):
            raise AttributeError(f"gdpa_inductor.config has no option {name!r} (options: {', '.join(OPTIONS)})")
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _CheckedOptions
