"""Calling the fused GDPA op directly: HSTU-style silu attention and PMA pooling, forward and backward.

    python examples/gdpa_op.py            # GPU if present (Triton kernels), else the CPU reference path
"""

import torch

from gdpa_inductor import gdpa


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    b, h, n, d = 8, 4, 256, 64
    q, k, v = (torch.randn(b, h, n, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    rel_bias = torch.randn(h, n, n, device=device, dtype=dtype, requires_grad=True)

    # HSTU: silu(QKᵀ + relative bias) / N, causal
    seq = gdpa(q, k, v, activation="silu", bias=rel_bias, post_scale=1.0 / n, causal=True)
    # PMA: 4 learned seed queries (batch 1) attend to every sample's sequence, no copy of the seeds
    seeds = torch.randn(1, h, 4, d, device=device, dtype=dtype, requires_grad=True)
    pooled = gdpa(seeds, seq, seq, activation="gelu", scale=d**-0.5)
    pooled.float().square().mean().backward()
    print(f"sequence out {tuple(seq.shape)}, pooled {tuple(pooled.shape)} on {device}")
    print(f"grad norms: q {q.grad.norm():.3g}, rel_bias {rel_bias.grad.norm():.3g}, seeds {seeds.grad.norm():.3g}")


if __name__ == "__main__":
    main()
