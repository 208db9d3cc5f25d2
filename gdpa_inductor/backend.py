"""The ``gdpa`` torch.compile backend (registered through the ``torch_dynamo_backends`` entry point).

For now it hands the graph to Inductor unchanged; the pattern rewrite that finds GDPA in unmodified
models lands in ``gdpa_inductor.patterns`` and is applied here before ``compile_fx``.
"""

from __future__ import annotations

import torch


def gdpa_backend(gm: torch.fx.GraphModule, example_inputs):
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs)
