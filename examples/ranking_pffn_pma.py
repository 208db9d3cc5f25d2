"""A ranking model in the spirit of InterFormer / Kunlun, in plain PyTorch, trained with backend="gdpa".

Each sample is a user with a jagged history of items (padded to the longest, with its length), user
features and a candidate item. The model:
- encodes the history with softmax-free self-attention (silu, HSTU-style ``/ N``) under a validity mask
  built from the lengths, as padded reference code writes it;
- mixes each token through a PFFN whose weights are generated per sample from the user features
  (``gelu(x W1_u) W2_u``, per head);
- pools the history with PMA: learned seed queries, shared by every sample, attend to the valid tokens;
- scores the candidate with an MLP on the pooled history, the user and the candidate (BCE loss).

The backend fuses all three blocks of every layer. The length masks are recognised as such, so padded rows and
columns are never computed (``gdpa_varlen`` with per-sample lengths).

    python examples/ranking_pffn_pma.py                   # CPU: tiny sizes, reference path, no timing
    python examples/ranking_pffn_pma.py --device cuda     # GPU: B=1152, N<=1024, H=4, D=128, bf16
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from gdpa_inductor.backend_comparison import add_run_options, explain_and_compare


class SequenceLayer(nn.Module):
    """Silu self-attention over the valid tokens, then a PFFN with per-sample weights."""

    def __init__(self, dim: int, heads: int, dff: int, user_dim: int):
        super().__init__()
        self.heads, self.dff = heads, dff
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.attn_out = nn.Linear(dim, dim)
        self.user_to_w1 = nn.Linear(user_dim, dim * dff)
        self.user_to_w2 = nn.Linear(user_dim, dff * dim)
        self.pffn_out = nn.Linear(dim, dim)

    def forward(self, x, valid, user):
        b, n, dim = x.shape
        h, hd = self.heads, dim // self.heads
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, h, hd).permute(2, 0, 3, 1, 4).unbind(0)
        p = F.silu(q @ k.transpose(-2, -1) * hd**-0.5) / n
        pair_valid = valid[:, None, :, None] & valid[:, None, None, :]
        a = torch.where(pair_valid, p, 0.0) @ v
        x = x + self.attn_out(a.transpose(1, 2).reshape(b, n, dim))

        # PFFN: every sample (and head) gets its own two weight matrices, generated from its user features.
        w1 = self.user_to_w1(user).view(b, h, self.dff, hd)
        w2 = self.user_to_w2(user).view(b, h, self.dff, hd)
        xh = self.norm2(x).view(b, n, h, hd).transpose(1, 2)
        f = F.gelu(xh @ w1.transpose(-2, -1) * hd**-0.5, approximate="tanh") @ w2
        return x + self.pffn_out(f.transpose(1, 2).reshape(b, n, dim))


class RankingModel(nn.Module):
    def __init__(self, item_dim: int = 64, user_dim: int = 64, dim: int = 512, heads: int = 4, dff: int = 256,
                 seeds: int = 16, layers: int = 2):
        super().__init__()
        self.heads = heads
        self.item_proj = nn.Linear(item_dim, dim)
        self.layers = nn.ModuleList(SequenceLayer(dim, heads, dff, user_dim) for _ in range(layers))
        self.seeds = nn.Parameter(torch.randn(1, heads, seeds, dim // heads))
        self.pool_kv = nn.Linear(dim, 2 * dim)
        self.pool_out = nn.Linear(seeds * dim, dim)
        self.head = nn.Sequential(nn.Linear(dim + user_dim + item_dim, dim), nn.SiLU(), nn.Linear(dim, 1))

    def forward(self, items, lengths, user, candidate):
        b, n, _ = items.shape
        valid = torch.arange(n, device=items.device)[None, :] < lengths[:, None]
        x = self.item_proj(items)
        for layer in self.layers:
            x = layer(x, valid, user)

        # PMA: the learned seeds (one set for the whole batch) attend to each sample's valid tokens.
        h, hd = self.heads, x.shape[-1] // self.heads
        k, v = self.pool_kv(x).view(b, n, 2, h, hd).permute(2, 0, 3, 1, 4).unbind(0)
        s = self.seeds @ k.transpose(-2, -1) * hd**-0.5
        s = s.masked_fill(~valid[:, None, None, :], -torch.finfo(s.dtype).max)
        pooled = F.gelu(s) / n @ v  # / N, as the encoder does: the pooled scale must not grow with the history
        pooled = self.pool_out(pooled.transpose(1, 2).reshape(b, -1))
        return self.head(torch.cat([pooled, user, candidate], dim=-1)).squeeze(-1)


def make_batch(batch: int, max_len: int, item_dim: int, user_dim: int, device, dtype, generator) -> tuple:
    """A synthetic batch: lengths uniform in [1, max_len] (Meta's "sparsity 0.5"), padding left as zeros."""
    lengths = torch.randint(1, max_len + 1, (batch,), generator=generator)
    lengths[0] = max_len  # the padded width is the longest history, as a padding collate makes it
    items = torch.randn(batch, max_len, item_dim, generator=generator)
    items *= (torch.arange(max_len)[None, :] < lengths[:, None]).unsqueeze(-1)
    user = torch.randn(batch, user_dim, generator=generator)
    candidate = torch.randn(batch, item_dim, generator=generator)
    labels = (torch.rand(batch, generator=generator) < 0.5).float()
    to = dict(device=device)
    return (items.to(**to, dtype=dtype), lengths.to(**to), user.to(**to, dtype=dtype),
            candidate.to(**to, dtype=dtype), labels.to(**to))


def loss_fn(model: nn.Module, batch: tuple) -> torch.Tensor:
    *inputs, labels = batch
    return F.binary_cross_entropy_with_logits(model(*inputs).float(), labels)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_options(ap)
    ap.add_argument("--batch", type=int, default=None, help="samples; default 1152 on GPU, 4 on CPU")
    ap.add_argument("--seq", type=int, default=None, help="longest history; default 1024 on GPU, 16 on CPU")
    ap.add_argument("--dim", type=int, default=None, help="heads x head dim; default 512 on GPU, 64 on CPU")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dff", type=int, default=None, help="PFFN hidden size per head; default 256 on GPU, 16 on CPU")
    ap.add_argument("--layers", type=int, default=2)
    return ap


def main(argv=None):
    args = build_parser().parse_args(argv)
    gpu = args.device.startswith("cuda")
    dtype = getattr(torch, args.dtype or ("bfloat16" if gpu else "float32"))
    batch, seq = args.batch or (1152 if gpu else 4), args.seq or (1024 if gpu else 16)
    dim, dff = args.dim or (512 if gpu else 64), args.dff or (256 if gpu else 16)
    item_dim = user_dim = 64

    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = RankingModel(item_dim, user_dim, dim, args.heads, dff, layers=args.layers).to(args.device, dtype)
    batches = [make_batch(batch, seq, item_dim, user_dim, args.device, dtype, gen) for _ in range(args.steps)]
    print(f"ranking model (silu self-attention + PFFN x {args.layers} layers, PMA pooling): batch {batch}, "
          f"history <= {seq}, dim {dim} ({args.heads} heads), dff {dff}, {dtype}, {args.device}", flush=True)
    return explain_and_compare(model, batches, loss_fn, batches[0][:-1], args.backends)


if __name__ == "__main__":
    main()
