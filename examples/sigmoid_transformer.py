"""A sigmoid-attention language model (Ramapuram et al. 2024, "Theory, analysis, and best practices for
sigmoid self-attention"), in plain PyTorch, trained with backend="gdpa".

A GPT-style decoder: token and learned position embeddings, pre-norm blocks of causal sigmoid attention and a
GELU MLP, a tied output head, next-token cross entropy on synthetic token sequences. The attention is the
paper's ``sigmoid(q kᵀ / sqrt(d) + b) v`` with ``b = -log(n)`` (with scores near 0 at initialisation, each
weight starts near 1/n, as softmax's would), written as a user writes it by hand (nanoGPT's ``masked_fill``
of a tril buffer with ``-inf``: sigmoid(-inf) is exactly 0).

The backend fuses the attention of every block; the causal mask becomes the op's causal flag.

    python examples/sigmoid_transformer.py                   # CPU: tiny sizes, reference path, no timing
    python examples/sigmoid_transformer.py --device cuda     # GPU: B=64, N=1024, dim 1024, H=8, D=128, bf16
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gdpa_inductor.backend_comparison import add_run_options, explain_and_compare


class SigmoidSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, max_len: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("mask", torch.tril(torch.ones(max_len, max_len)).view(1, 1, max_len, max_len))

    def forward(self, x):
        b, n, dim = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        att = q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1]) - math.log(n)
        att = att.masked_fill(self.mask[:, :, :n, :n] == 0, float("-inf"))
        y = torch.sigmoid(att) @ v
        return self.proj(y.transpose(1, 2).reshape(b, n, dim))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, max_len: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = SigmoidSelfAttention(dim, heads, max_len)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class SigmoidLM(nn.Module):
    def __init__(self, vocab: int, max_len: int, dim: int = 1024, heads: int = 8, layers: int = 4):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, max_len) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight
        # GPT-2's init: with the head tied to it, unit-variance embeddings would start with huge logits.
        for emb in (self.tok, self.pos):
            nn.init.normal_(emb.weight, std=0.02)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def make_batch(batch: int, seq: int, vocab: int, device, generator) -> tuple:
    """Synthetic text: a random first-order Markov chain over the vocabulary, so that there is something to learn."""
    successors = torch.randint(0, vocab, (vocab, 4), generator=torch.Generator().manual_seed(1))
    tokens = torch.empty(batch, seq + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, vocab, (batch,), generator=generator)
    choice = torch.randint(0, 4, (batch, seq), generator=generator)
    for t in range(seq):
        tokens[:, t + 1] = successors[tokens[:, t], choice[:, t]]
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device)


def loss_fn(model: nn.Module, batch: tuple) -> torch.Tensor:
    tokens, targets = batch
    return F.cross_entropy(model(tokens).float().flatten(0, 1), targets.flatten())


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_options(ap)
    ap.add_argument("--batch", type=int, default=None, help="sequences; default 64 on GPU, 4 on CPU")
    ap.add_argument("--seq", type=int, default=None, help="sequence length; default 1024 on GPU, 16 on CPU")
    ap.add_argument("--dim", type=int, default=None,
                    help="model width (heads x head dim); default 1024 on GPU, 64 on CPU")
    ap.add_argument("--heads", type=int, default=None, help="default 8 on GPU, 4 on CPU")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=None, help="default 8192 on GPU, 256 on CPU")
    return ap


def main(argv=None):
    args = build_parser().parse_args(argv)
    gpu = args.device.startswith("cuda")
    dtype = getattr(torch, args.dtype or ("bfloat16" if gpu else "float32"))
    batch, seq = args.batch or (64 if gpu else 4), args.seq or (1024 if gpu else 16)
    dim, heads = args.dim or (1024 if gpu else 64), args.heads or (8 if gpu else 4)
    vocab = args.vocab or (8192 if gpu else 256)

    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = SigmoidLM(vocab, seq, dim, heads, args.layers).to(args.device, dtype)
    batches = [make_batch(batch, seq, vocab, args.device, gen) for _ in range(args.steps)]
    print(f"sigmoid-attention LM (causal, b = -log n, x {args.layers} blocks): batch {batch}, seq {seq}, dim {dim} "
          f"({heads} heads), vocab {vocab}, {dtype}, {args.device}", flush=True)
    return explain_and_compare(model, batches, loss_fn, (batches[0][0],), args.backends)


if __name__ == "__main__":
    main()
