"""An HSTU sequential recommender (Zhai et al. 2024, "Actions speak louder than words"), in plain PyTorch,
trained with backend="gdpa".

Each sample is a user's jagged history of (item, timestamp) actions, padded to the longest history, with its
length. A stack of HSTU layers encodes it:
- ``u, v, q, k = split(silu(Linear(norm(x))))``;
- pointwise attention ``silu(q kᵀ + rab) / N`` under HSTU's causal mask and a validity mask built from the
  lengths, as HSTU's padded reference writes them; ``rab`` is HSTU's relative attention bias: a learned weight
  per head for each position offset ``i - j`` and, with ``--time-bias``, a shared one for each log-bucketed time
  gap ``t_i - t_j``;
- ``Linear(norm(attn @ v) * u)`` and a residual.
Every position predicts the next item of the history: a sampled softmax over the target and a set of random
negatives (cosine similarity / temperature, as HSTU trains), averaged over the valid positions.

The backend fuses the attention of every layer, the relative bias (with its gradient) included; the causal mask
becomes the op's flag and the validity mask per-sample lengths: the varlen op skips the padding and reads the bias at
each sample's positions (on Hopper, the CuTe-DSL varlen kernels, dbias included).
The time bias is off by default: its gradient sums B·N² entries into HSTU's 128 buckets, which eager and
Inductor alike do with contended atomics (seconds per step at the GPU sizes), whatever the attention costs.

    python examples/hstu_jagged.py                   # CPU: tiny sizes, reference path, no timing
    python examples/hstu_jagged.py --device cuda     # GPU: B=1152, N<=512, H=4, D=128, bf16
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from gdpa_inductor.backend_comparison import add_run_options, explain_and_compare


def time_bucket(gap: torch.Tensor, buckets: int) -> torch.Tensor:
    """HSTU's log bucketization of time gaps in seconds (0.301 = log 2: one bucket per doubling)."""
    return (torch.log(gap.abs().clamp(min=1).float()) / 0.301).long().clamp(max=buckets)


class HSTULayer(nn.Module):
    def __init__(self, dim: int, heads: int, max_offset: int, time_buckets: int | None):
        super().__init__()
        self.heads = heads
        self.norm_in, self.norm_attn = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.uvqk = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(dim, dim)
        self.pos_w = nn.Parameter(torch.randn(heads, max_offset + 1) * 0.02)
        self.ts_w = None if time_buckets is None else nn.Parameter(torch.randn(time_buckets + 1) * 0.02)

    def forward(self, x, offset, bucket, causal, valid):
        b, n, dim = x.shape
        h, hd = self.heads, dim // self.heads
        u, v, q, k = F.silu(self.uvqk(self.norm_in(x))).split(dim, dim=-1)
        q, k, v = (t.view(b, n, h, hd).transpose(1, 2) for t in (q, k, v))
        rab = self.pos_w[:, offset]
        if self.ts_w is not None:
            rab = rab + self.ts_w[bucket].unsqueeze(1)  # as in HSTU, the time bias is shared by the heads
        p = F.silu(q @ k.transpose(-2, -1) + rab) / n * causal
        pair_valid = valid[:, None, :, None] & valid[:, None, None, :]
        a = (torch.where(pair_valid, p, 0.0) @ v).transpose(1, 2).reshape(b, n, dim)
        return x + self.out(self.norm_attn(a) * u)


class HSTU(nn.Module):
    def __init__(self, items: int, max_len: int, dim: int = 512, heads: int = 4, layers: int = 2,
                 time_buckets: int | None = None, temperature: float = 0.05):
        super().__init__()
        self.temperature = temperature
        self.time_buckets = time_buckets
        self.item_emb = nn.Embedding(items, dim, padding_idx=0)
        self.layers = nn.ModuleList(HSTULayer(dim, heads, max_len - 1, time_buckets) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        # HSTU multiplies the scores by a {0, 1} float causal mask.
        self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len)))

    def forward(self, history, timestamps, lengths, targets, negatives):
        b, n = history.shape
        pos = torch.arange(n, device=history.device)
        valid = pos[None, :] < lengths[:, None]
        # Future keys are masked, so only offsets i - j >= 0 are ever used.
        offset = (pos[:, None] - pos[None, :]).clamp(min=0)
        bucket = None
        if self.time_buckets is not None:
            bucket = time_bucket(timestamps[:, :, None] - timestamps[:, None, :], self.time_buckets)
        x = self.item_emb(history)
        for layer in self.layers:
            x = layer(x, offset, bucket, self.causal[:n, :n], valid)

        user = F.normalize(self.norm(x), dim=-1)
        pos_logit = (user * F.normalize(self.item_emb(targets), dim=-1)).sum(-1, keepdim=True)
        neg_logits = user @ F.normalize(self.item_emb(negatives), dim=-1).T
        return torch.cat([pos_logit, neg_logits], dim=-1) / self.temperature


def make_batch(batch: int, max_len: int, items: int, negatives: int, device, generator) -> tuple:
    """A synthetic batch: lengths uniform in [1, max_len]; ids and timestamps padded with zeros past the length."""
    lengths = torch.randint(1, max_len + 1, (batch,), generator=generator)
    lengths[0] = max_len  # the padded width is the longest history, as a padding collate makes it
    valid = torch.arange(max_len)[None, :] < lengths[:, None]
    # One extra action per user: the last position's target.
    seq = torch.randint(1, items, (batch, max_len + 1), generator=generator)
    history, targets = seq[:, :-1] * valid, seq[:, 1:] * valid
    # Gaps from a second to about two weeks, log-uniform, so that the time gaps spread over many buckets.
    gaps = torch.exp(torch.rand(batch, max_len, generator=generator) * 14).long()
    timestamps = (1_700_000_000 + gaps.cumsum(dim=1)) * valid
    neg = torch.randint(1, items, (negatives,), generator=generator)
    return tuple(t.to(device) for t in (history, timestamps, lengths, targets, neg))


def loss_fn(model: nn.Module, batch: tuple) -> torch.Tensor:
    logits = model(*batch).float()
    lengths, n = batch[2], logits.shape[1]
    valid = (torch.arange(n, device=logits.device)[None, :] < lengths[:, None]).float()
    # The target is logit 0; padded positions do not count.
    logits = logits.flatten(0, 1)
    nll = F.cross_entropy(logits, logits.new_zeros(logits.shape[0], dtype=torch.long), reduction="none")
    return (nll * valid.flatten()).sum() / valid.sum()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_options(ap)
    ap.add_argument("--batch", type=int, default=None, help="users; default 1152 on GPU, 4 on CPU")
    ap.add_argument("--seq", type=int, default=None, help="longest history; default 512 on GPU, 16 on CPU")
    ap.add_argument("--dim", type=int, default=None,
                    help="model width (heads x head dim); default 512 on GPU, 64 on CPU")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--items", type=int, default=None, help="item vocabulary; default 100000 on GPU, 1000 on CPU")
    ap.add_argument("--negatives", type=int, default=128, help="sampled negatives per batch")
    ap.add_argument("--time-bias", action="store_true", help="add HSTU's bucketed relative time bias (slow backward)")
    return ap


def main(argv=None):
    args = build_parser().parse_args(argv)
    gpu = args.device.startswith("cuda")
    dtype = getattr(torch, args.dtype or ("bfloat16" if gpu else "float32"))
    batch, seq = args.batch or (1152 if gpu else 4), args.seq or (512 if gpu else 16)
    dim, items = args.dim or (512 if gpu else 64), args.items or (100_000 if gpu else 1000)

    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = HSTU(items, seq, dim, args.heads, args.layers, time_buckets=128 if args.time_bias else None)
    model = model.to(args.device, dtype)
    batches = [make_batch(batch, seq, items, args.negatives, args.device, gen) for _ in range(args.steps)]
    bias = "position and time" if args.time_bias else "position"
    print(f"HSTU (silu attention + relative {bias} bias x {args.layers} layers): batch {batch}, history <= {seq}, "
          f"dim {dim} ({args.heads} heads), {items} items, {dtype}, {args.device}", flush=True)
    return explain_and_compare(model, batches, loss_fn, batches[0], args.backends)


if __name__ == "__main__":
    main()
