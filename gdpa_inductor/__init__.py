"""gdpa_inductor: fused Generalized Dot-Product Attention for torch.compile.

``gdpa_inductor.gdpa`` is the fused op (``gdpa_varlen`` its jagged form); ``torch.compile(model,
backend="gdpa")`` is the backend, which finds GDPA in unmodified models; ``gdpa_inductor.explain(model,
*inputs)`` says what it fuses and why not; ``release_dq_workspaces()`` frees the fp32 dQ buffer the Hopper backward
keeps zeroed between calls.
"""

from .backend import install as _install_backend
from .explain import ExplainReport, explain
from .functional import gdpa, gdpa_varlen
from .kernels.activations import ACTIVATION_NAMES
from .kernels.cute.dq_workspace import release_dq_workspaces


def _register_torch_log() -> None:
    """Names the package's logger ``gdpa`` in torch's logging settings, e.g.
    ``torch._logging.set_logs(modules={"gdpa": logging.DEBUG})``. ``TORCH_LOGS`` is parsed while torch imports,
    before this runs: ``TORCH_LOGS=+gdpa_inductor`` (the logger's own name) works on every torch version."""
    from torch._logging._internal import log_registry

    if not log_registry.is_log("gdpa"):
        log_registry.register_log("gdpa", "gdpa_inductor")


_install_backend()
_register_torch_log()

__version__ = "0.1.0"
__all__ = [
    "ACTIVATION_NAMES", "ExplainReport", "__version__", "explain", "gdpa", "gdpa_varlen", "release_dq_workspaces",
]
