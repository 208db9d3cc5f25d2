"""gdpa_inductor: fused Generalized Dot-Product Attention for torch.compile.

``gdpa_inductor.gdpa`` is the fused op; ``torch.compile(model, backend="gdpa")`` is the backend.
"""

from .functional import gdpa
from .kernels.activations import ACTIVATION_NAMES

__version__ = "0.1.0"
__all__ = ["ACTIVATION_NAMES", "__version__", "gdpa"]
