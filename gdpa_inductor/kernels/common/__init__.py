"""What the CuTe-DSL and Triton kernel packages share: host-side helpers, constants and the dQ passes after the CuTe
backward. Neither backend imports the other; both import from here. Importing this package imports nothing else
(its modules that need Triton import it themselves)."""
