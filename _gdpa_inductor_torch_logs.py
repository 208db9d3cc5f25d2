"""``TORCH_LOGS=gdpa`` (``+gdpa``: debug) for gdpa_inductor's logger, registered while torch imports.

torch calls its ``torch.backends`` entry points before it parses TORCH_LOGS (torch 2.13 and later), so the name is
known when torch validates the setting. This module is not part of the package: loading it from inside torch's own
import must not import gdpa_inductor, whose modules need a fully imported torch.
"""

from __future__ import annotations

import os


def register() -> None:
    # Only when TORCH_LOGS asks for it: torch takes over a registered logger (no propagation to the root logger),
    # which would hide gdpa_inductor's records from the application's own handlers in every process.
    names = {name.strip().lstrip("+-") for name in os.environ.get("TORCH_LOGS", "").split(",")}
    if "gdpa" not in names:
        return
    from torch._logging._internal import log_registry

    if not log_registry.is_log("gdpa"):
        log_registry.register_log("gdpa", "gdpa_inductor")
