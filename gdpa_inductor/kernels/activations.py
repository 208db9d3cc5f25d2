"""The one table of GDPA activations: one row (``ActivationSpec``) carries everything about one activation.

A row gives its exact PyTorch form (what eager models compute) and its derivative in PyTorch (the reference
backward), whether a positive scale moves across it, how a Dynamo FX graph spells it (what the matcher reads), the
names of its kernel forms (``triton/activation_math.py``, ``cute/activation_math.py``: by name, so that the table
imports neither compiler), which packed bf16x2 CuTe forms it has, and when the CuTe backward takes 80-row query tiles
for it. The table checks its rows when imported (``build_table``), and each form module checks when imported that it
defines exactly the forms the table names (``check_forms``). The kernels receive the name, never a magic number.

Adding an activation: its name in ``ActivationName``, a row here, and its forms in the two form modules (in the Triton
one also a branch of ``activate`` and ``activate_and_grad``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, Optional, get_args

import torch
import torch.nn.functional as F

ActivationName = Literal[
    "identity", "relu", "relu_square", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid", "hardswish",
]
# When the CuTe backward takes 80-row query tiles where its other conditions hold (``cute/bwd_plan.bwd_query_tile``):
# "never" (not even where ``config.cute_bwd_query_tile`` asks for them), "if_asked" (64 rows unless asked),
# "by_default" (from ``LONG_QUERY_TILE_MIN_QUERIES`` queries on), "by_default_packed" (the same, in its packed bf16x2
# backward form only). The rows' comments give the measurements (H100, B·N² fixed, the backward alone, two runs, unless
# they say otherwise).
LongQueryTile = Literal["never", "if_asked", "by_default", "by_default_packed"]
TorchAct = Callable[[torch.Tensor, float], torch.Tensor]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _relu_square(x, slope):
    return torch.relu(x).square()


def _relu_square_grad(x, slope):
    return 2.0 * torch.relu(x)


def _leaky_relu_grad(x, slope):
    return torch.where(x > 0, torch.ones_like(x), torch.full_like(x, slope))


def _gelu_grad(x, slope):
    cdf = 0.5 * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))
    pdf = torch.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))
    return cdf + x * pdf


def _gelu_tanh_grad(x, slope):
    inner = _SQRT_2_OVER_PI * (x + 0.044715 * x.pow(3))
    t = torch.tanh(inner)
    dinner = _SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x * x)
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner


def _silu_grad(x, slope):
    s = torch.sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


def _sigmoid_grad(x, slope):
    s = torch.sigmoid(x)
    return s * (1.0 - s)


def _hardswish_grad(x, slope):
    # Same branches as autograd of F.hardswish: 0 at x <= -3, x/3 + 1/2 inside, 1 at x >= 3.
    return torch.where(x <= -3.0, torch.zeros_like(x), torch.where(x < 3.0, x / 3.0 + 0.5, torch.ones_like(x)))


@dataclass(frozen=True)
class FxSpelling:
    """How a Dynamo FX graph spells an activation applied to its first argument (``patterns/fx_nodes.activation_of``);
    Dynamo inlines ``nn`` modules into these calls."""

    functions: tuple[Callable, ...] = ()  # call_function targets
    methods: tuple[str, ...] = ()  # call_method names
    # the value of gelu's ``approximate`` argument that selects this activation among those sharing its functions
    approximate: Optional[str] = None
    # the slope is the call's ``negative_slope`` argument (0.01 when absent); the other activations ignore the slope
    reads_slope: bool = False
    # spelled as that activation followed by a square (relu_square: relu, then ** 2), not by a call of its own
    square_of: Optional[str] = None


@dataclass(frozen=True)
class ActivationSpec:
    name: ActivationName
    torch_fn: TorchAct
    torch_grad: TorchAct
    # act(c * x) == c * act(x) for c > 0: a scale may then move across the activation.
    positively_homogeneous: bool
    fx: FxSpelling
    # The kernel forms' names: Triton's value and value-with-derivative (which ``activate`` and ``activate_and_grad``
    # call for the name), CuTe's forward in fp32 registers and its backward (``cute/activation_math.forward_form``,
    # ``backward_form``).
    triton_forward: str
    triton_backward: str
    cute_forward: str
    cute_backward: str
    # a CuTe form on bf16x2 pairs for bf16 operands (``cute/activation_math.PackedForm``, ``PackedBackwardForm``)
    packed_bf16_forward: bool
    packed_bf16_backward: bool
    long_query_tile: LongQueryTile


FORM_FIELDS = ("triton_forward", "triton_backward", "cute_forward", "cute_backward")


def _row_error(a: ActivationSpec) -> Optional[str]:
    """What is malformed in row ``a``, or None."""
    fx = a.fx
    if not (callable(a.torch_fn) and callable(a.torch_grad)):
        return "torch_fn and torch_grad must be callables"
    for flag in ("positively_homogeneous", "packed_bf16_forward", "packed_bf16_backward"):
        if not isinstance(getattr(a, flag), bool):
            return f"{flag} must be a bool"
    for form in FORM_FIELDS:
        if not (isinstance(getattr(a, form), str) and getattr(a, form).isidentifier()):
            return f"{form} must name a function, got {getattr(a, form)!r}"
    if a.long_query_tile not in get_args(LongQueryTile):
        return f"long_query_tile must be one of {get_args(LongQueryTile)}, got {a.long_query_tile!r}"
    if a.long_query_tile == "by_default_packed" and not a.packed_bf16_backward:
        return "long_query_tile 'by_default_packed' needs a packed bf16 backward form"
    if not isinstance(fx, FxSpelling):
        return "fx must be an FxSpelling"
    if not (isinstance(fx.functions, tuple) and all(callable(f) for f in fx.functions)):
        return "fx.functions must be a tuple of callables"
    if not (isinstance(fx.methods, tuple) and all(isinstance(m, str) and m.isidentifier() for m in fx.methods)):
        return "fx.methods must be a tuple of method names"
    if fx.approximate is not None and not isinstance(fx.approximate, str):
        return "fx.approximate must be a string"
    if fx.square_of is not None and (fx.functions or fx.methods):
        return "fx.square_of spells the activation: it has no call of its own"
    return None


def _spelling_error(rows: Mapping[str, ActivationSpec]) -> Optional[str]:
    """Why an FX call could mean two activations, or a square follow no call; None when neither."""
    claims: dict[object, dict[str, Optional[str]]] = {}
    for a in rows.values():
        if a.fx.square_of is not None and (a.fx.square_of not in rows or rows[a.fx.square_of].fx.square_of):
            return f"{a.name!r}: fx.square_of must name an activation of the table spelled by a call"
        for target in (*a.fx.functions, *(f"Tensor.{m}" for m in a.fx.methods)):
            claims.setdefault(target, {})[a.name] = a.fx.approximate
    for target, by_name in claims.items():
        selectors = list(by_name.values())
        if len(selectors) > 1 and (None in selectors or len(set(selectors)) < len(selectors)):
            return f"{' and '.join(map(repr, by_name))} share the FX spelling {target} (tell them apart by approximate)"
    return None


def build_table(rows: Iterable[ActivationSpec]) -> dict[ActivationName, ActivationSpec]:
    """The rows by name, once every row is well formed, names are unique, no two rows share a kernel form or an FX
    spelling, and the names are ``ActivationName``'s; ValueError otherwise."""
    table: dict[ActivationName, ActivationSpec] = {}
    for a in rows:
        if not isinstance(a, ActivationSpec) or not (isinstance(a.name, str) and a.name.isidentifier()):
            raise ValueError(f"activation table: {a!r} is not a row named by an identifier")
        if a.name in table:
            raise ValueError(f"activation table: {a.name!r} has two rows")
        error = _row_error(a)
        if error is not None:
            raise ValueError(f"activation table: {a.name!r}: {error}")
        table[a.name] = a
    for form in FORM_FIELDS:
        named = [getattr(a, form) for a in table.values()]
        if len(set(named)) < len(named):
            raise ValueError(f"activation table: two rows name the same {form}")
    error = _spelling_error(table)
    if error is not None:
        raise ValueError(f"activation table: {error}")
    if tuple(table) != get_args(ActivationName):
        raise ValueError(f"activation table: rows {tuple(table)} differ from ActivationName {get_args(ActivationName)}")
    return table


ACTIVATIONS: dict[ActivationName, ActivationSpec] = build_table((
    ActivationSpec(
        "identity", lambda x, s: x, lambda x, s: torch.ones_like(x), positively_homogeneous=True,
        # no call: a chain without an activation reads as identity
        fx=FxSpelling(),
        triton_forward="identity", triton_backward="identity_and_grad",
        cute_forward="identity", cute_backward="identity_and_grad",
        packed_bf16_forward=False, packed_bf16_backward=False,
        # 80 rows measured +1-2% from 2048 queries on: 64 unless asked
        long_query_tile="if_asked",
    ),
    ActivationSpec(
        "relu", lambda x, s: torch.relu(x), lambda x, s: (x > 0).to(x.dtype), positively_homogeneous=True,
        fx=FxSpelling(functions=(F.relu, torch.relu), methods=("relu",)),
        triton_forward="relu", triton_backward="relu_and_grad",
        cute_forward="relu", cute_backward="relu_and_grad",
        packed_bf16_forward=False, packed_bf16_backward=False,
        # 80 rows measured +4% at 2048², +7% at 4096²
        long_query_tile="by_default",
    ),
    ActivationSpec(
        "relu_square", _relu_square, _relu_square_grad, positively_homogeneous=False,
        fx=FxSpelling(square_of="relu"),
        triton_forward="relu_square", triton_backward="relu_square_and_grad",
        cute_forward="relu_square", cute_backward="relu_square_and_grad",
        packed_bf16_forward=False, packed_bf16_backward=False,
        # 80 rows measured -1% to +2.5% from 2048 queries on: 64 unless asked
        long_query_tile="if_asked",
    ),
    ActivationSpec(
        "leaky_relu", lambda x, s: F.leaky_relu(x, s), _leaky_relu_grad, positively_homogeneous=True,
        fx=FxSpelling(functions=(F.leaky_relu, torch._C._nn.leaky_relu), methods=("leaky_relu",), reads_slope=True),
        triton_forward="leaky_relu", triton_backward="leaky_relu_and_grad",
        cute_forward="leaky_relu", cute_backward="leaky_relu_and_grad",
        packed_bf16_forward=False, packed_bf16_backward=False,
        # 80 rows measured -1% to +2.5% from 2048 queries on: 64 unless asked
        long_query_tile="if_asked",
    ),
    ActivationSpec(
        "gelu", lambda x, s: F.gelu(x), _gelu_grad, positively_homogeneous=False,
        fx=FxSpelling(functions=(F.gelu, torch._C._nn.gelu), methods=("gelu",), approximate="none"),
        triton_forward="gelu", triton_backward="gelu_and_grad",
        cute_forward="gelu", cute_backward="gelu_and_grad",
        packed_bf16_forward=False, packed_bf16_backward=False,
        # its erf polynomial beside the 80-row tiles' accumulators: ptxas serializes every wgmma of the build (72
        # bytes spilled); the other activations spill 0-56 bytes there (hardswish the most), none serializes
        long_query_tile="never",
    ),
    ActivationSpec(
        "gelu_tanh", lambda x, s: F.gelu(x, approximate="tanh"), _gelu_tanh_grad, positively_homogeneous=False,
        fx=FxSpelling(functions=(F.gelu, torch._C._nn.gelu), methods=("gelu",), approximate="tanh"),
        triton_forward="gelu_tanh", triton_backward="gelu_tanh_and_grad",
        cute_forward="gelu_tanh", cute_backward="gelu_tanh_grad_terms",
        packed_bf16_forward=True, packed_bf16_backward=True,
        # 80 rows measured -1% to -4% in the fp32 form; the packed form left registers enough for the 80-row tiles to
        # gain (H100, medians of four alternating rounds, whole backward: 2048² 11.73 -> 11.39 ms, 4096² 10.76 ->
        # 10.36; 1536² level, 1152² 2% slower)
        long_query_tile="by_default_packed",
    ),
    ActivationSpec(
        "silu", lambda x, s: F.silu(x), _silu_grad, positively_homogeneous=False,
        fx=FxSpelling(functions=(F.silu,)),
        triton_forward="silu", triton_backward="silu_and_grad",
        cute_forward="silu", cute_backward="silu_grad_terms",
        packed_bf16_forward=True, packed_bf16_backward=False,
        # 80 rows measured +2% at 2048², +3.5% at 4096²
        long_query_tile="by_default",
    ),
    ActivationSpec(
        "sigmoid", lambda x, s: torch.sigmoid(x), _sigmoid_grad, positively_homogeneous=False,
        fx=FxSpelling(functions=(torch.sigmoid, F.sigmoid), methods=("sigmoid",)),
        triton_forward="sigmoid", triton_backward="sigmoid_and_grad",
        cute_forward="sigmoid", cute_backward="sigmoid_grad_terms",
        packed_bf16_forward=False, packed_bf16_backward=False,
        # 80 rows measured -1% to +2.5% from 2048 queries on: 64 unless asked
        long_query_tile="if_asked",
    ),
    ActivationSpec(
        "hardswish", lambda x, s: F.hardswish(x), _hardswish_grad, positively_homogeneous=False,
        fx=FxSpelling(functions=(F.hardswish, torch._C._nn.hardswish)),
        triton_forward="hardswish", triton_backward="hardswish_and_grad",
        cute_forward="hardswish", cute_backward="hardswish_and_grad",
        packed_bf16_forward=False, packed_bf16_backward=False,
        # 80 rows measured +4% at 2048² and at 4096²
        long_query_tile="by_default",
    ),
))

ACTIVATION_NAMES: tuple[ActivationName, ...] = get_args(ActivationName)
PACKED_BF16_FORWARD: frozenset[ActivationName] = frozenset(n for n, a in ACTIVATIONS.items() if a.packed_bf16_forward)
PACKED_BF16_BACKWARD: frozenset[ActivationName] = frozenset(n for n, a in ACTIVATIONS.items() if a.packed_bf16_backward)


def get_activation(name: str) -> ActivationSpec:
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(
            f"activation: expected one of {', '.join(ACTIVATION_NAMES)}; got {name!r}"
        ) from None


def with_long_query_tile(fact: LongQueryTile) -> tuple[ActivationName, ...]:
    """The activations whose CuTe backward takes 80-row query tiles as ``fact`` says (``LongQueryTile``)."""
    return tuple(a.name for a in ACTIVATIONS.values() if a.long_query_tile == fact)


def check_forms(where: str, defined: Iterable[str], named: Mapping[str, ActivationName]) -> None:
    """ImportError unless the forms ``where`` defines (by name) are exactly ``named``: form name -> the activation
    whose row names it. A form module calls this when imported."""
    defined = set(defined)
    missing = [f"{form!r} (for {name!r})" for form, name in named.items() if form not in defined]
    extra = sorted(defined - set(named))
    problems = [*(["no form " + ", ".join(missing)] if missing else []),
                *(["forms no row names: " + ", ".join(map(repr, extra))] if extra else [])]
    if problems:
        raise ImportError(f"{where} does not match the activation table (kernels/activations.py): "
                          + "; ".join(problems))


def forms_named(field: str) -> dict[str, ActivationName]:
    """{form name: activation} of one of the rows' form columns (``FORM_FIELDS``)."""
    return {getattr(a, field): a.name for a in ACTIVATIONS.values()}
