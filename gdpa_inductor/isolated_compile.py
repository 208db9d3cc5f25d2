"""Compiling a user's model or function once more (for ``explain``, for ``compare_backends``) without touching the
graphs the user compiled before.

Dynamo keeps what it compiles on the code objects it starts frames on: cache entries, which count against
``torch._dynamo.config.recompile_limit``; ``torch._dynamo.reset()`` drops every one, the user's too. Here the extra
compile starts on a copy of the function's code (``on_fresh_code``, ``forward_on_fresh_code``), so its entries land
on the copy, and ``dropping_new_cache_entries`` removes, afterwards, every entry on code that had none before. Code
the user had compiled and that the extra compile reached all the same (a function called past a graph break) keeps
the user's entries; the entries added there are invalidated (they never match again and hold no graph), though
Dynamo still counts them.
"""

from __future__ import annotations

import contextlib
import logging
import types
from collections.abc import Iterator

import torch
from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list, reset_code
from torch._dynamo import convert_frame

log = logging.getLogger("gdpa_inductor")


def on_fresh_code(fn):
    """``fn`` (a function or a bound method) as a function with a copy of its code object; any other callable as
    it is."""
    if isinstance(fn, types.MethodType):
        return types.MethodType(on_fresh_code(fn.__func__), fn.__self__)
    if not isinstance(fn, types.FunctionType):
        return fn
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__, copy.__module__, copy.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    copy.__dict__.update(fn.__dict__)
    return copy


@contextlib.contextmanager
def forward_on_fresh_code(module: torch.nn.Module) -> Iterator[None]:
    """Inside, ``module`` runs its forward on a copy of its code (an instance attribute, taken away after)."""
    own = vars(module).get("forward")
    module.forward = on_fresh_code(module.forward)
    try:
        yield
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own


def _entries_by_code() -> dict[int, tuple[types.CodeType, list]]:
    """Every code object Dynamo has compiled frames of, with its cache entries, by the code's id."""
    codes = [code for ref in convert_frame.input_codes.seen if (code := ref()) is not None]
    return {id(code): (code, _debug_get_cache_entry_list(code)) for code in codes}


@contextlib.contextmanager
def dropping_new_cache_entries() -> Iterator[None]:
    """The Dynamo cache entries that compiles inside add are removed on leaving (on code that had entries before:
    invalidated)."""
    try:
        before = _entries_by_code()
    except Exception as exc:  # Dynamo internals of another torch: the entries stay, nothing else changes
        before = exc
    try:
        yield
    finally:
        try:
            if isinstance(before, Exception):
                raise before
            _drop_entries_added_since(before)
        except Exception as exc:
            log.info("gdpa_inductor: could not drop the extra compile's Dynamo cache entries (%s)", exc)


def _drop_entries_added_since(before: dict) -> None:
    from torch._dynamo.guards import DeletedGuardManagerWrapper

    for key, (code, entries) in _entries_by_code().items():
        kept = {entry.compile_id for entry in before[key][1]} if key in before else set()
        if not kept:
            reset_code(code)
            continue
        for entry in entries:
            if entry.compile_id not in kept and entry.code is not None:
                reason = "added by a compile that gdpa_inductor discarded"
                entry.guard_manager.extra_state.invalidate(entry, DeletedGuardManagerWrapper(reason))
