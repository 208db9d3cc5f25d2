"""A zoo of small, unmodified-looking models that contain softmax-free attention (GDPA), written the ways
real models write it (see docs/gdpa-semantics.md), plus models that must NOT be rewritten.

Every entry is (name, model factory, input factory, expected rewrite count). Sizes are tiny (B=2, N 8..24,
2-4 heads, head dim 8-16) so that one compile takes well under a second with ``inner="aot_eager"``.
Model factories build their parameters from the global RNG; ``build(entry)`` seeds it (and a generator for
the inputs) from the entry's name, so every entry gets its own fresh, reproducible, non-zero values.

Nothing here depends on the package: these are plain PyTorch models.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint
from hstu_reference import HSTUReferenceMHA, jagged_inputs


@dataclass(frozen=True)
class ZooEntry:
    name: str
    model: Callable[[], nn.Module]
    inputs: Callable[[torch.Generator], tuple]
    rewrites: int
    # negative entries: a keyword of rewrite_gdpa's rejection reason (None: no candidate is matched at all)
    reason: Optional[str] = None
    # the count with dynamic shapes, where a spelling is read only with static sizes (None: ``rewrites``)
    dynamic_rewrites: Optional[int] = None


def seed_of(name: str) -> int:
    return zlib.crc32(name.encode())


def build(entry: ZooEntry) -> tuple[nn.Module, tuple]:
    """(model, inputs), both seeded from the entry's name."""
    with torch.random.fork_rng():
        torch.manual_seed(seed_of(entry.name))
        model = entry.model()
    gen = torch.Generator().manual_seed(seed_of(entry.name) + 1)
    return model, tuple(entry.inputs(gen))


def randn(gen: torch.Generator, *shape, scale: float = 1.0, dtype=torch.float32) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def tensors(*shapes):
    """An input factory: one standard-normal tensor per shape."""
    return lambda gen: tuple(randn(gen, *s) for s in shapes)


def qkv(b=2, h=2, n=16, d=16, m=None, hkv=None):
    """q [b, h, n, d], k/v [b, hkv, m, d]."""
    m = n if m is None else m
    hkv = h if hkv is None else hkv
    return tensors((b, h, n, d), (b, hkv, m, d), (b, hkv, m, d))


def heads(t: torch.Tensor, h: int) -> torch.Tensor:
    """[B, N, H*D] -> [B, H, N, D]"""
    b, n, c = t.shape
    return t.view(b, n, h, c // h).transpose(1, 2)


def merge(o: torch.Tensor) -> torch.Tensor:
    """[B, H, N, D] -> [B, N, H*D]"""
    b, h, n, d = o.shape
    return o.transpose(1, 2).reshape(b, n, h * d)


# ---------------------------------------------------------------------------------------------------------
# Positive models
# ---------------------------------------------------------------------------------------------------------


class QkvUnbindGelu(nn.Module):
    """ViT-style: one qkv Linear, reshape + permute(2, 0, 3, 1, 4) + unbind, `@`, .transpose(-2, -1),
    a Python-float scale on S, F.gelu."""

    def __init__(self, c=32, h=4, act=F.gelu):
        super().__init__()
        self.h, self.scale, self.act = h, (c // h) ** -0.5, act
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.h, c // self.h).permute(2, 0, 3, 1, 4).unbind(0)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = self.act(attn)
        o = (attn @ v).transpose(1, 2).reshape(b, n, c)
        return self.proj(o)


class TorchMatmulGeluTanh(nn.Module):
    """torch.matmul, .mT, divide by math.sqrt(d), F.gelu(approximate="tanh")."""

    def forward(self, q, k, v):
        s = torch.matmul(q, k.mT) / math.sqrt(q.shape[-1])
        p = F.gelu(s, approximate="tanh")
        return torch.matmul(p, v)


class TensorMatmulSiLUModule(nn.Module):
    """Tensor.matmul, .permute(0, 1, 3, 2), nn.SiLU()."""

    def __init__(self, d=8):
        super().__init__()
        self.scale = d ** -0.5
        self.act = nn.SiLU()

    def forward(self, q, k, v):
        s = q.matmul(k.permute(0, 1, 3, 2)) * self.scale
        return self.act(s).matmul(v)


class BmmFoldedRelu(nn.Module):
    """torch.bmm with heads folded into the batch ([B*H, N, D]), separate q/k/v Linears, x.relu()."""

    def __init__(self, c=24, h=3):
        super().__init__()
        self.h, self.scale = h, (c // h) ** -0.5
        self.q, self.k, self.v = nn.Linear(c, c), nn.Linear(c, c), nn.Linear(c, c)

    def forward(self, x):
        b, n, c = x.shape
        h, d = self.h, c // self.h

        def fold(t):
            return t.view(b, n, h, d).transpose(1, 2).reshape(b * h, n, d)

        q, k, v = fold(self.q(x)), fold(self.k(x)), fold(self.v(x))
        s = torch.bmm(q, k.transpose(1, 2)) * self.scale
        p = s.relu()
        o = torch.bmm(p, v)
        return o.view(b, h, n, d).transpose(1, 2).reshape(b, n, c)


class EinsumHeadsSigmoid(nn.Module):
    """einsum with the heads inside the equation (no transposes at all), torch.sigmoid."""

    def forward(self, q, k, v):  # [B, N, H, D]
        s = torch.einsum("bnhd,bmhd->bhnm", q, k) * q.shape[-1] ** -0.5
        p = torch.sigmoid(s)
        return torch.einsum("bhnm,bmhd->bnhd", p, v)


class EinsumScoresMatmulOut(nn.Module):
    """einsum for S, `@` for P V, F.leaky_relu(x, 0.2)."""

    def forward(self, q, k, v):
        s = torch.einsum("bhnd,bhmd->bhnm", q, k) * q.shape[-1] ** -0.5
        p = F.leaky_relu(s, 0.2)
        return p @ v


class MatmulScoresEinsumOut(nn.Module):
    """`@` for S, einsum for P V, F.hardswish (scores scaled up so both kinks at +-3 are crossed)."""

    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1) * (3.0 / math.sqrt(q.shape[-1]))
        p = F.hardswish(s)
        return torch.einsum("bhnm,bhmd->bhnd", p, v)


class FiveDimBatch(nn.Module):
    """5-D operands [B, G, H, N, D]."""

    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1) * 0.35
        return F.gelu(s) @ v


class CrossChunkReluSquare(nn.Module):
    """Cross attention (queries from x, keys/values from memory via one Linear + .chunk), F.relu(x) ** 2."""

    def __init__(self, c=32, h=2):
        super().__init__()
        self.h, self.scale = h, (c // h) ** -0.5
        self.q = nn.Linear(c, c)
        self.kv = nn.Linear(c, 2 * c)

    def forward(self, x, mem):
        q = heads(self.q(x), self.h)
        k, v = self.kv(mem).chunk(2, dim=-1)
        k, v = heads(k, self.h), heads(v, self.h)
        s = q @ k.transpose(-2, -1) * self.scale
        p = F.relu(s) ** 2
        return merge(p @ v)


class SplitSquare(nn.Module):
    """qkv .split(c, dim=-1), .view + .permute(0, 2, 1, 3) head split, .mT, x.relu().square()."""

    def __init__(self, c=32, h=4):
        super().__init__()
        self.c, self.h, self.scale = c, h, (c // h) ** -0.5
        self.qkv = nn.Linear(c, 3 * c)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = [t.view(b, n, self.h, -1).permute(0, 2, 1, 3) for t in self.qkv(x).split(self.c, dim=-1)]
        s = q @ k.mT * self.scale
        p = s.relu().square()
        return merge(p @ v)


class ShapeIntBeforeGelu(nn.Module):
    """A shape-derived int scale before the activation: S / N with N = x.shape[1]; [B, N, H, D] inputs."""

    def forward(self, q, k, v):
        n = q.shape[1]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        s = (q @ k.transpose(-2, -1)) / n
        p = F.gelu(s)
        return (p @ v).transpose(1, 2)


class ShapeIntAfterSilu(nn.Module):
    """A shape-derived int scale after the activation: silu(S) / N."""

    def forward(self, q, k, v):
        n = k.shape[-2]
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        p = F.silu(s) / n
        return p @ v


class BufferTemperatureSigmoid(nn.Module):
    """A 1-element registered buffer scale: S * self.temp.exp(); x.sigmoid() as a method; a float bias."""

    def __init__(self):
        super().__init__()
        self.register_buffer("temp", torch.tensor([math.log(0.3)]))

    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1) * self.temp.exp()
        p = (s - 0.5).sigmoid()
        return p @ v


class ParamTemperatureGelu(nn.Module):
    """A learned 0-dim parameter scale: S * self.temp.exp() (its gradient must flow)."""

    def __init__(self, d=16):
        super().__init__()
        self.temp = nn.Parameter(torch.tensor(math.log(d ** -0.5)))

    def forward(self, q, k, v):
        s = torch.matmul(q, k.transpose(-2, -1)) * self.temp.exp()
        return torch.matmul(F.gelu(s), v)


class ScaleOnQuery(nn.Module):
    """The scale multiplies q before the first matmul."""

    def forward(self, q, k, v):
        q = q * q.shape[-1] ** -0.5
        s = q @ k.transpose(-2, -1)
        return F.gelu(s) @ v


class PostScaleFloat(nn.Module):
    """A Python-float scale after the activation (Meta's qk_scale)."""

    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1) / 4.0
        p = F.gelu(s) * 0.125
        return p @ v


class FloatCastThenBack(nn.Module):
    """S.float() before the activation, .to(v.dtype) after (mixed-precision style)."""

    def __init__(self, c=32, h=2):
        super().__init__()
        self.h, self.scale = h, (c // h) ** -0.5
        self.qkv = nn.Linear(c, 3 * c)

    def forward(self, x):
        q, k, v = (heads(t, self.h) for t in self.qkv(x).chunk(3, dim=-1))
        s = (q @ k.transpose(-2, -1)).float() * self.scale
        p = F.gelu(s).to(v.dtype)
        return merge(p @ v)


class DropoutP0(nn.Module):
    """F.dropout with p=0 between the activation and P V."""

    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        p = F.dropout(F.silu(s), p=0.0, training=self.training)
        return p @ v


class DropoutEval(nn.Module):
    """nn.Dropout(0.1) in eval mode (the factory calls .eval())."""

    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)

    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        return self.drop(F.gelu(s)) @ v


def _eval(model: nn.Module) -> nn.Module:
    return model.eval()


class HSTU(nn.Module):
    """HSTU-style: silu(u, v, q, k) projections, relative bias parameter sliced [:, :N, :N], silu attention
    divided by N, causal mask (a bool tril buffer sliced [:N, :N], multiplied after the activation)."""

    def __init__(self, c=32, h=2, max_n=24):
        super().__init__()
        self.c, self.h = c, h
        self.uvqk = nn.Linear(c, 4 * c)
        self.rel_bias = nn.Parameter(torch.randn(h, max_n, max_n) * 0.5)
        self.register_buffer("causal", torch.tril(torch.ones(max_n, max_n, dtype=torch.bool)))
        self.out = nn.Linear(c, c)

    def forward(self, x):
        n = x.shape[1]
        u, v, q, k = F.silu(self.uvqk(x)).split(self.c, dim=-1)
        q, k, v = heads(q, self.h), heads(k, self.h), heads(v, self.h)
        s = q @ k.transpose(-2, -1) + self.rel_bias[:, :n, :n]
        p = F.silu(s) / n
        p = p * self.causal[:n, :n]
        return self.out(merge(p @ v) * u)


class SigmoidLogBias(nn.Module):
    """Sigmoid attention with the scalar bias -log(N) as a Python float (N from the keys' shape)."""

    def forward(self, q, k, v):
        n = k.shape[-2]
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5 - math.log(n)
        return torch.sigmoid(s) @ v


class PMA(nn.Module):
    """Pooling by multi-head attention: learned seed queries [1, H, S, D] broadcast to the batch by
    .expand (or .repeat), attending to each sample's sequence."""

    def __init__(self, c=32, h=4, seeds=4, broadcast="expand", act=F.gelu):
        super().__init__()
        self.h, self.scale, self.broadcast, self.act = h, (c // h) ** -0.5, broadcast, act
        self.seed = nn.Parameter(torch.randn(1, h, seeds, c // h))
        self.kv = nn.Linear(c, 2 * c)

    def forward(self, x):
        b = x.shape[0]
        k, v = (heads(t, self.h) for t in self.kv(x).chunk(2, dim=-1))
        if self.broadcast == "expand":
            q = self.seed.expand(b, -1, -1, -1)
        else:
            q = self.seed.repeat(b, 1, 1, 1)
        s = q @ k.transpose(-2, -1) * self.scale
        return merge(self.act(s) @ v)


class PFFNBmm(nn.Module):
    """Personalized FFN: per-sample weights W1 [B, D, dff], W2 [B, dff, D] produced from user features by a
    Linear; act(x W1) W2 through torch.bmm."""

    def __init__(self, d=16, dff=24, u=8):
        super().__init__()
        self.d, self.dff = d, dff
        self.w1 = nn.Linear(u, d * dff)
        self.w2 = nn.Linear(u, dff * d)

    def forward(self, x, user):
        b = x.shape[0]
        w1 = self.w1(user).view(b, self.d, self.dff)
        w2 = self.w2(user).view(b, self.dff, self.d)
        h = F.gelu(torch.bmm(x, w1))
        return torch.bmm(h, w2)


class PFFNEinsum(PFFNBmm):
    """The same PFFN through einsum, with relu."""

    def forward(self, x, user):
        b = x.shape[0]
        w1 = self.w1(user).reshape(b, self.d, self.dff)
        w2 = self.w2(user).reshape(b, self.dff, self.d)
        h = F.relu(torch.einsum("bnd,bdf->bnf", x, w1))
        return torch.einsum("bnf,bfd->bnd", h, w2)


class GQA(nn.Module):
    """Grouped-query attention: kv heads repeated blocked (repeat_interleave) or interleaved (.repeat)."""

    def __init__(self, layout="blocked", act=F.silu):
        super().__init__()
        self.layout, self.act = layout, act

    def forward(self, q, k, v):
        g = q.shape[1] // k.shape[1]
        if self.layout == "blocked":
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        else:
            k, v = k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1)
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        return self.act(s) @ v


class ThreeBlocks(nn.Module):
    """Several GDPA blocks in one graph: relu, nn.GELU("tanh"), sigmoid; residuals in between."""

    def __init__(self, c=32):
        super().__init__()
        self.b1 = QkvUnbindGelu(c, 4, act=F.relu)
        self.b2 = QkvUnbindGelu(c, 2, act=nn.GELU("tanh"))
        self.b3 = QkvUnbindGelu(c, 4, act=torch.sigmoid)

    def forward(self, x):
        x = x + self.b1(x)
        x = x + self.b2(x)
        return x + self.b3(x)


class StackedChains(nn.Module):
    """Blocks sharing a matmul: each block's output matmul P_i @ V_i is the next block's scores
    (O_{i+1} = act(P_i @ V_i) @ V_{i+1}, V per sample). With ``depth`` = 2 only the first block is fused
    (the second would need the first's output matmul as its Q Kᵀ); with 3, the first and the third."""

    def __init__(self, depth=2):
        super().__init__()
        self.depth = depth
        self.acts = (F.gelu, F.silu, torch.sigmoid)[:depth]

    def forward(self, q, k, *vs):
        out = q @ k.transpose(-2, -1)
        for act, v in zip(self.acts, vs):
            out = act(out * 0.25) @ v
        return out


class Checkpointed(nn.Module):
    """A GDPA block inside torch.utils.checkpoint (use_reentrant=False)."""

    def __init__(self, c=32):
        super().__init__()
        self.block = QkvUnbindGelu(c, 4, act=F.silu)
        self.norm = nn.LayerNorm(c)

    def forward(self, x):
        return x + torch.utils.checkpoint.checkpoint(self.block, self.norm(x), use_reentrant=False)


class CausalFinfoBeforeSilu(nn.Module):
    """Causal mask before silu: masked_fill(tril_buffer[:N, :N] == 0, -torch.finfo(dtype).max)."""

    def __init__(self, max_n=24):
        super().__init__()
        self.register_buffer("tril", torch.tril(torch.ones(max_n, max_n)))

    def forward(self, q, k, v):
        n = q.shape[-2]
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        s = s.masked_fill(self.tril[:n, :n] == 0, -torch.finfo(s.dtype).max)
        return F.silu(s) @ v


class GPT2CausalBeforeGelu(nn.Module):
    """GPT-2 style: a [1, 1, T, T] tril buffer sliced [:, :, :N, :N], filled with -finfo.max before gelu."""

    def __init__(self, c=32, h=4, max_n=24):
        super().__init__()
        self.h = h
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.register_buffer("bias", torch.tril(torch.ones(max_n, max_n)).view(1, 1, max_n, max_n))

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = heads(q, self.h), heads(k, self.h), heads(v, self.h)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, -torch.finfo(att.dtype).max)
        att = F.gelu(att)
        y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class CausalNotTrilAfter(nn.Module):
    """Causal mask after the activation: masked_fill(~tril(ones(N, N, dtype=bool)), 0)."""

    def forward(self, q, k, v):
        n = q.shape[-2]
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        mask = torch.tril(torch.ones(n, n, dtype=torch.bool, device=q.device))
        p = F.gelu(s).masked_fill(~mask, 0.0)
        return p @ v


class CausalMulBoolAfter(nn.Module):
    """Causal mask after the activation as `P * mask` with a bool tril mask."""

    def forward(self, q, k, v):
        n = q.shape[-2]
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        mask = torch.tril(torch.ones(n, n, dtype=torch.bool, device=q.device))
        p = F.leaky_relu(s, 0.1) * mask
        return p @ v


class CausalWhereArange(nn.Module):
    """torch.where(i >= j, P, 0) with i/j from torch.arange."""

    def forward(self, q, k, v):
        n = q.shape[-2]
        i = torch.arange(n, device=q.device)[:, None]
        j = torch.arange(n, device=q.device)[None, :]
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        p = torch.where(i >= j, F.silu(s), 0.0)
        return p @ v


class CausalMaxFillBeforeGeluTanh(nn.Module):
    """gelu_tanh after filling the future with -finfo.max: gelu_tanh(-max) is exactly 0 though its derivative
    is NaN there (x³ overflows); masked_fill's backward zeroes it, and the op's causal flag drops those
    entries, so the fused block equals eager, gradients included."""

    def forward(self, q, k, v):
        n = q.shape[-2]
        future = torch.triu(torch.ones(n, n, dtype=torch.bool, device=q.device), diagonal=1)
        s = (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5)
        return F.gelu(s.masked_fill(future, -torch.finfo(s.dtype).max), approximate="tanh") @ v


class ReluNegInfBefore(nn.Module):
    """relu after filling the future with -inf (relu(-inf) = 0 exactly)."""

    def forward(self, q, k, v):
        n = q.shape[-2]
        future = torch.triu(torch.ones(n, n, dtype=torch.bool, device=q.device), diagonal=1)
        s = (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).masked_fill(future, float("-inf"))
        return F.relu(s) @ v


class HSTUFloatTrilMask(nn.Module):
    """HSTU's reference as written: the causal mask is a FLOAT {0, 1} tril buffer, sliced and unsqueezed,
    multiplied after silu(S) / N (docs: "mask is boolean or {0,1}")."""

    def __init__(self, max_n=24):
        super().__init__()
        self.register_buffer("invalid_attn_mask", torch.tril(torch.ones(max_n, max_n)))

    def forward(self, q, k, v):
        n = q.shape[-2]
        s = torch.einsum("bhnd,bhmd->bhnm", q, k)
        p = F.silu(s) / n
        p = p * self.invalid_attn_mask[:n, :n].unsqueeze(0).unsqueeze(0)
        return torch.einsum("bhnm,bhmd->bhnd", p, v)


class HSTUOneMinusTriuBuffer(nn.Module):
    """generative-recommenders' spelling: a bool ``triu(ones, 1)`` buffer of invalid pairs, turned into the
    multiplier ``1.0 - mask.to(dtype)`` (the causal complement), sliced to N and multiplied after silu / N."""

    def __init__(self, max_n=24):
        super().__init__()
        self.register_buffer("_attn_mask", torch.triu(torch.ones(max_n, max_n, dtype=torch.bool), diagonal=1))

    def forward(self, q, k, v):
        n = q.shape[-2]
        invalid_attn_mask = 1.0 - self._attn_mask.to(q.dtype)
        p = F.silu(q @ k.transpose(-2, -1)) / n * invalid_attn_mask[:n, :n].unsqueeze(0).unsqueeze(0)
        return p @ v


class TrilMaskArgument(nn.Module):
    """A {0, 1} float mask passed by the caller (the research HSTU's, computed by another graph), with no gradient
    taken: lower-triangular in this call, but nothing says it will be in the next (no recompile follows a change of
    values), so it becomes the causal flag of the op that checks it when it runs."""

    def forward(self, q, k, v, mask):
        n = q.shape[-2]
        return (F.silu(q @ k.transpose(-2, -1)) * mask.detach()[:n, :n]) @ v


def _tril_mask_inputs(gen):
    return (*qkv(2, 2, 12, 16)(gen), torch.tril(torch.ones(16, 16)))


class GdpaThenSoftmaxReadout(nn.Module):
    """A GDPA block whose output is directly the query of a softmax read-out over a memory (no projection
    in between). One GDPA block (gelu); the softmax read-out must stay unfused."""

    def forward(self, q, k, v, mem):
        o = F.gelu(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5) @ v
        s = o @ mem.transpose(-2, -1) * o.shape[-1] ** -0.5
        return torch.softmax(s, dim=-1) @ mem


ZOO: list[ZooEntry] = [
    ZooEntry("qkv_unbind_gelu", QkvUnbindGelu, tensors((2, 12, 32)), 1),
    ZooEntry("torch_matmul_mT_gelu_tanh", TorchMatmulGeluTanh, qkv(2, 2, 10, 16), 1),
    ZooEntry("tensor_matmul_permute_nn_silu", TensorMatmulSiLUModule, qkv(2, 3, 14, 8), 1),
    ZooEntry("bmm_heads_folded_relu_method", BmmFoldedRelu, tensors((2, 16, 24)), 1),
    ZooEntry("einsum_heads_in_equation_sigmoid", EinsumHeadsSigmoid, tensors((2, 12, 2, 16), (2, 18, 2, 16),
                                                                             (2, 18, 2, 16)), 1),
    ZooEntry("einsum_scores_matmul_out_leaky_relu", EinsumScoresMatmulOut, qkv(2, 2, 16, 8), 1),
    ZooEntry("matmul_scores_einsum_out_hardswish", MatmulScoresEinsumOut, qkv(2, 2, 12, 16, m=20), 1),
    ZooEntry("five_dim_batch_gelu", FiveDimBatch, tensors((2, 2, 2, 8, 8), (2, 2, 2, 10, 8), (2, 2, 2, 10, 8)), 1),
    ZooEntry("cross_chunk_relu_pow2", CrossChunkReluSquare, tensors((2, 10, 32), (2, 20, 32)), 1),
    ZooEntry("split_permute_relu_square", SplitSquare, tensors((2, 16, 32)), 1),
    ZooEntry("shape_int_scale_before_gelu", ShapeIntBeforeGelu, tensors((2, 16, 2, 16), (2, 16, 2, 16),
                                                                        (2, 16, 2, 16)), 1),
    ZooEntry("shape_int_scale_after_silu", ShapeIntAfterSilu, qkv(2, 2, 12, 16, m=20), 1),
    ZooEntry("buffer_temperature_sigmoid_method", BufferTemperatureSigmoid, qkv(2, 2, 16, 16), 1),
    ZooEntry("param_temperature_gelu", ParamTemperatureGelu, qkv(2, 4, 8, 16), 1),
    ZooEntry("scale_on_query_gelu", ScaleOnQuery, qkv(2, 2, 16, 16), 1),
    ZooEntry("post_scale_float_gelu", PostScaleFloat, qkv(2, 2, 16, 16), 1),
    ZooEntry("float_cast_then_back", FloatCastThenBack, tensors((2, 12, 32)), 1),
    ZooEntry("dropout_p0", DropoutP0, qkv(2, 2, 12, 16), 1),
    ZooEntry("nn_dropout_eval", lambda: _eval(DropoutEval()), qkv(2, 2, 12, 16), 1),
    ZooEntry("hstu_silu_relbias_causal", HSTU, tensors((2, 16, 32)), 1),
    ZooEntry("sigmoid_attention_log_n_bias", SigmoidLogBias, qkv(2, 2, 12, 16, m=16), 1),
    ZooEntry("pma_seed_expand", PMA, tensors((2, 16, 32)), 1),
    ZooEntry("pma_seed_repeat", lambda: PMA(broadcast="repeat", act=F.silu), tensors((2, 12, 32)), 1),
    ZooEntry("pffn_bmm", PFFNBmm, tensors((2, 12, 16), (2, 8)), 1),
    ZooEntry("pffn_einsum", PFFNEinsum, tensors((2, 12, 16), (2, 8)), 1),
    ZooEntry("gqa_blocked_repeat_interleave", GQA, qkv(2, 4, 12, 16, hkv=2), 1),
    ZooEntry("gqa_interleaved_repeat", lambda: GQA("interleaved", F.gelu), qkv(2, 4, 12, 16, hkv=2), 1),
    ZooEntry("three_blocks", ThreeBlocks, tensors((2, 12, 32)), 3),
    ZooEntry("stacked_chains_two", StackedChains, tensors((2, 2, 12, 8), (2, 2, 10, 8), (2, 2, 10, 12),
                                                          (2, 2, 12, 8)), 1),
    ZooEntry("stacked_chains_three", lambda: StackedChains(3), tensors((2, 2, 12, 8), (2, 2, 10, 8),
                                                                       (2, 2, 10, 12), (2, 2, 12, 9),
                                                                       (2, 2, 9, 8)), 2),
    ZooEntry("checkpointed_block", Checkpointed, tensors((2, 12, 32)), 1),
    ZooEntry("causal_finfo_fill_before_silu", CausalFinfoBeforeSilu, qkv(2, 2, 16, 16), 1),
    ZooEntry("gpt2_causal_buffer_before_gelu", GPT2CausalBeforeGelu, tensors((2, 12, 32)), 1),
    ZooEntry("causal_not_tril_fill_after_gelu", CausalNotTrilAfter, qkv(2, 2, 12, 16), 1),
    ZooEntry("causal_mul_bool_mask_after", CausalMulBoolAfter, qkv(2, 2, 12, 16), 1),
    ZooEntry("causal_where_arange_silu", CausalWhereArange, qkv(2, 2, 12, 16), 1),
    ZooEntry("relu_neg_inf_fill_before", ReluNegInfBefore, qkv(2, 2, 12, 16), 1),
    ZooEntry("causal_max_fill_before_gelu_tanh", CausalMaxFillBeforeGeluTanh, qkv(2, 2, 12, 16), 1),
    ZooEntry("hstu_float_tril_mask_unsqueezed", HSTUFloatTrilMask, qkv(2, 2, 16, 16), 1),
    ZooEntry("hstu_one_minus_triu_buffer", HSTUOneMinusTriuBuffer, qkv(2, 2, 16, 16), 1),
]

# Checked by its own test (the count alone cannot tell which subgraph was fused).
GDPA_THEN_SOFTMAX = ZooEntry("gdpa_then_softmax_readout", GdpaThenSoftmaxReadout,
                             tensors((2, 2, 12, 16), (2, 2, 12, 16), (2, 2, 12, 16), (2, 2, 20, 16)), 1)

ZOO_BY_NAME = {e.name: e for e in ZOO}
assert len(ZOO_BY_NAME) == len(ZOO), "zoo names must be unique"


# ---------------------------------------------------------------------------------------------------------
# Negative models: must compile to 0 rewrites and the eager result
# ---------------------------------------------------------------------------------------------------------


class SoftmaxAttention(nn.Module):
    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        return torch.softmax(s, dim=-1) @ v


class LayerNormBetween(nn.Module):
    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        s = F.layer_norm(F.gelu(s), (s.shape[-1],))
        return s @ v


class RowNormalised(nn.Module):
    """relu attention normalised by its row sum (not GDPA: a row reduction between the matmuls)."""

    def forward(self, q, k, v):
        p = F.relu(q @ k.transpose(-2, -1))
        p = p / (p.sum(dim=-1, keepdim=True) + 1e-6)
        return p @ v


class LinearFFN(nn.Module):
    def __init__(self, d=16, dff=32):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, dff), nn.Linear(dff, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class MatmulFFN(nn.Module):
    """x @ W1 -> act -> @ W2 with W1/W2 parameters shared by the whole batch."""

    def __init__(self, d=16, dff=32):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(d, dff) * d ** -0.5)
        self.w2 = nn.Parameter(torch.randn(dff, d) * dff ** -0.5)

    def forward(self, x):
        return F.gelu(x @ self.w1) @ self.w2


class ScoresReturned(nn.Module):
    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        return F.gelu(s) @ v, s


class ProbsCached(nn.Module):
    """P cloned into a cache list (attention maps kept for logging)."""

    def __init__(self):
        super().__init__()
        self.cache = []

    def forward(self, q, k, v):
        p = F.silu(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5)
        self.cache.append(p.detach().clone())
        return p @ v


class CumsumInChain(nn.Module):
    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        return torch.cumsum(F.gelu(s), dim=-1) @ v


class AbsInChain(nn.Module):
    def forward(self, q, k, v):
        s = (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).abs()
        return F.gelu(s) @ v


class NegInfBeforeSilu(nn.Module):
    """-inf fill before silu: silu(-inf) is NaN, so this is not a mask (eager itself gives NaN)."""

    def forward(self, q, k, v):
        n = q.shape[-2]
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        s = s.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool, device=q.device)), float("-inf"))
        return F.silu(s) @ v


class PaddingMask(nn.Module):
    """A dense (non-causal) boolean padding mask, an input of the model."""

    def forward(self, q, k, v, valid):
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        s = s.masked_fill(~valid, -torch.finfo(s.dtype).max)
        return F.gelu(s) @ v


class PaddingMaskTanhGelu(nn.Module):
    """The same padding mask before gelu_tanh: a -max bias is not exact there (its backward overflows)."""

    def forward(self, q, k, v, valid):
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        s = s.masked_fill(~valid, -torch.finfo(s.dtype).max)
        return F.gelu(s, approximate="tanh") @ v


class PaddingMaskAfterSilu(nn.Module):
    """A key-padding mask multiplied in after the activation (HSTU's padded-batch form)."""

    def forward(self, q, k, v, valid):
        n = q.shape[-2]
        return (F.silu(q @ k.transpose(-2, -1)) / n * valid) @ v


class PaddedLengthsKeyMask(nn.Module):
    """A padded batch whose key mask is built from the lengths (``arange < lengths``): the padding is skipped."""

    def forward(self, q, k, v, lengths):
        valid = torch.arange(k.shape[-2], device=k.device)[None, :] < lengths[:, None]
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        s = s.masked_fill(~valid[:, None, None, :], -torch.finfo(s.dtype).max)
        return F.gelu(s) @ v


class HSTUPaddedLengths(nn.Module):
    """HSTU's padded reference: silu / N, a causal float tril, and a query-and-key validity mask from the
    lengths multiplied in after the activation."""

    def __init__(self, n=12):
        super().__init__()
        self.register_buffer("tril", torch.tril(torch.ones(n, n)))

    def forward(self, q, k, v, lengths):
        n = q.shape[-2]
        valid = torch.arange(n, device=q.device).unsqueeze(0) < lengths.unsqueeze(1)
        mask = valid.unsqueeze(1).unsqueeze(-1) & valid[:, None, None, :]
        p = F.silu(q @ k.transpose(-2, -1)) / n * self.tril[:n, :n]
        p = torch.where(mask, p, 0.0)
        return p @ v


class HSTUPaddedLengthsRelBias(nn.Module):
    """HSTU's padded reference with its relative attention bias (a learned [H, N, N] table shared by the
    batch): silu(S + rab) / N, causal, and the query-and-key validity mask from the lengths."""

    def __init__(self, n=12, h=2):
        super().__init__()
        self.rab = nn.Parameter(torch.randn(h, n, n) * 0.1)
        self.register_buffer("tril", torch.tril(torch.ones(n, n)))

    def forward(self, q, k, v, lengths):
        n = q.shape[-2]
        valid = torch.arange(n, device=q.device).unsqueeze(0) < lengths.unsqueeze(1)
        mask = valid.unsqueeze(1).unsqueeze(-1) & valid[:, None, None, :]
        p = F.silu(q @ k.transpose(-2, -1) + self.rab[:, :n, :n]) / n * self.tril[:n, :n]
        return torch.where(mask, p, 0.0) @ v


class RightAlignedPadding(nn.Module):
    """Padding at the front (``arange >= N - lengths``): not a length mask the op reads, so a dense bias."""

    def forward(self, q, k, v, lengths):
        n = k.shape[-2]
        valid = torch.arange(n, device=k.device)[None, :] >= n - lengths[:, None]
        s = q @ k.transpose(-2, -1)
        s = s.masked_fill(~valid[:, None, None, :], -torch.finfo(s.dtype).max)
        return F.silu(s) @ v


def _lengths_inputs(gen):
    q, k, v = qkv(2, 2, 12, 16)(gen)
    return q, k, v, torch.tensor([7, 12])


def _padding_inputs(gen):
    q, k, v = qkv(2, 2, 12, 16)(gen)
    valid = torch.rand(2, 1, 1, 12, generator=gen) < 0.7
    valid[..., 0] = True
    return q, k, v, valid


class Float64Attention(nn.Module):
    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        return F.gelu(s) @ v


def _f64(factory):
    return lambda gen: tuple(t.double() for t in factory(gen))


NEGATIVE: list[ZooEntry] = [
    ZooEntry("neg_softmax", SoftmaxAttention, qkv(2, 2, 12, 16), 0, reason="softmax"),
    ZooEntry("neg_layer_norm_between", LayerNormBetween, qkv(2, 2, 12, 16), 0, reason="layer_norm"),
    ZooEntry("neg_row_normalised", RowNormalised, qkv(2, 2, 12, 16), 0, reason="used elsewhere"),
    ZooEntry("neg_linear_ffn", LinearFFN, tensors((2, 12, 16)), 0, reason=None),
    ZooEntry("neg_matmul_ffn_shared_weights", MatmulFFN, tensors((2, 12, 16)), 0, reason="shared by the batch"),
    ZooEntry("neg_scores_returned", ScoresReturned, qkv(2, 2, 12, 16), 0, reason="used elsewhere"),
    ZooEntry("neg_probs_cached", ProbsCached, qkv(2, 2, 12, 16), 0, reason="used elsewhere"),
    ZooEntry("neg_cumsum_in_chain", CumsumInChain, qkv(2, 2, 12, 16), 0, reason="cumsum"),
    ZooEntry("neg_abs_in_chain", AbsInChain, qkv(2, 2, 12, 16), 0, reason="abs"),
    ZooEntry("neg_neg_inf_before_silu", NegInfBeforeSilu, qkv(2, 2, 12, 16), 0, reason="does not give exactly 0"),
    ZooEntry("neg_padding_mask_gelu_tanh", PaddingMaskTanhGelu, _padding_inputs, 0, reason="exact"),
    ZooEntry("neg_float64", Float64Attention, _f64(qkv(2, 2, 12, 16)), 0, reason="float64"),
]

# Non-causal boolean masks are fused as an additive -finfo.max bias (exact for these activations).
ZOO += [
    ZooEntry("padding_mask_before_gelu", PaddingMask, _padding_inputs, 1),
    ZooEntry("padded_lengths_key_mask_gelu", PaddedLengthsKeyMask, _lengths_inputs, 1),
    ZooEntry("hstu_padded_lengths_causal_silu", HSTUPaddedLengths, _lengths_inputs, 1),
    ZooEntry("hstu_padded_lengths_relbias", HSTUPaddedLengthsRelBias, _lengths_inputs, 1),
    ZooEntry("right_aligned_padding_silu", RightAlignedPadding, _lengths_inputs, 1),
    ZooEntry("padding_mask_after_silu", PaddingMaskAfterSilu, _padding_inputs, 1),
]
ZOO_BY_NAME = {e.name: e for e in ZOO}


class IntCastInChain(nn.Module):
    """Scores cast to an integer type between the matmuls: not value-preserving, never fused."""

    def forward(self, q, k, v):
        return F.relu(q @ k.transpose(-2, -1) * 4.0).to(torch.int32).to(q.dtype) @ v


ZOO.append(ZooEntry("tril_mask_argument", TrilMaskArgument, _tril_mask_inputs, 1))
NEGATIVE.append(ZooEntry("neg_int_cast_in_chain", IntCastInChain, qkv(2, 2, 12, 16), 0, reason="unsupported op to "))


# ---- real code's spellings: a factor per query row, a scale over a biased sum, cast masks, `...` einsums,
# users that read no value -------------------------------------------------------------------------------


class HSTUAttnScale(nn.Module):
    """generative-recommenders' per-token ``attn_scale`` in place of / N: silu(S + rab) * attn_scale[b, i]."""

    def __init__(self, h=2, max_n=16):
        super().__init__()
        self.rel_bias = nn.Parameter(torch.randn(h, max_n, max_n) * 0.5)

    def forward(self, q, k, v, attn_scale):
        n = q.shape[-2]
        p = F.silu(q @ k.transpose(-2, -1) + self.rel_bias[:, :n, :n])
        return (p * attn_scale.unsqueeze(1).unsqueeze(-1)) @ v


class RowDivisor(nn.Module):
    """A per-row divisor after the activation (each query's own normaliser, not computed from P)."""

    def forward(self, q, k, v, norm):
        return (F.gelu(q @ k.transpose(-2, -1)) / (norm.abs() + 1.0)[..., None]) @ v


class AlphaTimesBiasedScores(nn.Module):
    """FBGEMM's HSTU reference: silu(alpha * (S + rab)), alpha a Python number, then / N."""

    def __init__(self, h=2, max_n=16, alpha=0.25):
        super().__init__()
        self.alpha = alpha
        self.rab = nn.Parameter(torch.randn(h, max_n, max_n))

    def forward(self, q, k, v):
        n = q.shape[-2]
        s = q @ k.transpose(-2, -1)
        return (F.silu(self.alpha * (s + self.rab[:, :n, :n])) / n) @ v


class CastBoolKeyMask(nn.Module):
    """``P * mask.type(dtype)`` of a boolean key mask after sigmoid."""

    def forward(self, q, k, v, keep):
        p = torch.sigmoid(q @ k.transpose(-2, -1) * 0.5)
        return (p * keep[:, None, None, :].type(p.dtype)) @ v


class EllipsisEinsum(nn.Module):
    """Einsums with ``...`` for the batch and head dims."""

    def forward(self, q, k, v):
        s = torch.einsum("...id,...jd->...ij", q, k) * q.shape[-1] ** -0.5
        return torch.einsum("...ij,...jd->...id", F.silu(s), v)


class SigmoidExpandAsMask(nn.Module):
    """Apple's sigmoid attention: ``masked_fill(~mask.expand_as(attn), -inf)`` before sigmoid, a -log n bias."""

    def forward(self, q, k, v, keep):
        attn = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5 - math.log(k.shape[-2])
        attn = attn.masked_fill(~keep[:, None, None, :].expand_as(attn), float("-inf"))
        return torch.sigmoid(attn) @ v


class DeadCloneOfScores(nn.Module):
    """x-transformers' ``Attend``: a clone of the scores kept for a hook that is off, so nothing reads it."""

    def forward(self, q, k, v):
        sim = torch.einsum("b h i d, b h j d -> b h i j", q, k) * 0.5
        sim.clone()
        return torch.einsum("b h i j, b h j d -> b h i d", torch.sigmoid(sim), v)


def _row_inputs(gen):
    return (*qkv(2, 2, 12, 16)(gen), torch.rand(2, 12, generator=gen) + 0.1)


def _keep_inputs(gen):
    keep = torch.rand(2, 12, generator=gen) > 0.3
    keep[:, 0] = True
    return (*qkv(2, 2, 12, 16)(gen), keep)


class HSTUMaskBuilder(nn.Module):
    """generative-recommenders' reference mask: the diagonal (``eye``) or'ed with row - col > 0 (|row - col| > 0 when
    not causal), and'ed with row - col <= max_attn_len; einsums, silu(S * alpha) / N, then times the mask."""

    def __init__(self, causal=True, max_attn_len=0):
        super().__init__()
        self.causal, self.max_attn_len = causal, max_attn_len

    def forward(self, q, k, v):
        n = q.shape[2]
        ids = torch.arange(0, n, device=q.device).view(1, n)
        row = ids.view(n, 1).expand(n, n)
        col = row.t()
        dist = row.view(1, n, n) - col.view(1, n, n)
        if not self.causal:
            dist = torch.where(dist > 0, dist, -dist)
        valid = torch.logical_or(torch.eye(n, device=q.device, dtype=torch.bool).view(1, n, n), dist > 0)
        if self.max_attn_len > 0:
            valid = torch.logical_and(valid, dist <= self.max_attn_len)
        p = F.silu(torch.einsum("bhxa,bhya->bhxy", q, k) * 0.25) / n
        return torch.einsum("bhxd,bhdv->bhxv", p * valid.unsqueeze(1), v)


class BandFillBeforeGelu(nn.Module):
    """A band mask built from ``arange`` differences, filled with -finfo.max before gelu."""

    def forward(self, q, k, v):
        n = q.shape[-2]
        i, j = torch.arange(n, device=q.device)[:, None], torch.arange(n, device=q.device)[None, :]
        outside = (i - j).abs() > 2
        s = q @ k.transpose(-2, -1)
        return F.gelu(s.masked_fill(outside, -torch.finfo(s.dtype).max)) @ v


ZOO += [
    ZooEntry("hstu_reference_mask_causal", HSTUMaskBuilder, qkv(2, 2, 12, 16), 1),
    ZooEntry("hstu_reference_mask_max_attn_len", lambda: HSTUMaskBuilder(max_attn_len=3), qkv(2, 2, 12, 16), 1),
    ZooEntry("hstu_reference_mask_not_causal", lambda: HSTUMaskBuilder(causal=False), qkv(2, 2, 12, 16), 1),
    ZooEntry("band_fill_before_gelu", BandFillBeforeGelu, qkv(2, 2, 12, 16), 1),
    ZooEntry("hstu_attn_scale_per_row", HSTUAttnScale, _row_inputs, 1),
    ZooEntry("row_divisor_after_gelu", RowDivisor, tensors((2, 2, 12, 16), (2, 2, 12, 16), (2, 2, 12, 16),
                                                           (2, 2, 12)), 1),
    ZooEntry("fbgemm_alpha_times_biased_scores", AlphaTimesBiasedScores, qkv(2, 2, 12, 16), 1),
    ZooEntry("cast_bool_key_mask_after_sigmoid", CastBoolKeyMask, _keep_inputs, 1),
    ZooEntry("ellipsis_einsums_silu", EllipsisEinsum, qkv(2, 2, 12, 16), 1),
    ZooEntry("sigmoid_expand_as_mask", SigmoidExpandAsMask, _keep_inputs, 1),
    ZooEntry("dead_clone_of_scores", DeadCloneOfScores, qkv(2, 2, 12, 16), 1),
]
ZOO_BY_NAME = {e.name: e for e in ZOO}


class ColumnFactor(nn.Module):
    """A factor per key after the activation: (P ⊙ c) V = P (cᵀ ⊙ V), V's rows scaled."""

    def forward(self, q, k, v, c):
        return (F.silu(q @ k.transpose(-2, -1)) * c[:, None, None, :]) @ v


class FloatKeyMaskAfterSigmoid(nn.Module):
    """A key padding mask given as a float {0, 1} tensor (as data loaders give it), multiplied after sigmoid."""

    def forward(self, q, k, v, c):
        return (torch.sigmoid(q @ k.transpose(-2, -1) * 0.25) * (c > 0.5).float()[:, None, None, :]) @ v


class KeyFactorGrowingV(nn.Module):
    """A factor per key and per sample over a V shared by the batch: scaling V would give it the batch."""

    def forward(self, q, k, v, c):
        return (F.silu(q @ k.transpose(-2, -1)) * c[:, None, None, :]) @ v[:1]


class TensorScaleAfterBias(nn.Module):
    """(S + b) * t with t a per-head tensor: not a number to fold into the scale."""

    def forward(self, q, k, v, t):
        return F.silu((q @ k.transpose(-2, -1) + 1.0) * t[None, :, None, None]) @ v


ZOO += [
    ZooEntry("key_factor", ColumnFactor, _row_inputs, 1),
    ZooEntry("float_key_mask_after_sigmoid", FloatKeyMaskAfterSigmoid, _row_inputs, 1),
]
NEGATIVE.append(ZooEntry("neg_key_factor_growing_v", KeyFactorGrowingV, _row_inputs, 0,
                         reason="does not broadcast to V's rows without growing V"))
NEGATIVE.append(ZooEntry("neg_tensor_scale_after_bias", TensorScaleAfterBias,
                         tensors((2, 2, 12, 16), (2, 2, 12, 16), (2, 2, 12, 16), (2,)), 0,
                         reason="neither a scalar nor a causal mask"))




# ---- jagged rows padded to [B, H, N, D]: HSTU's reference over its padding (hstu_reference.py) ----------------


def _jagged_inputs(gen):
    return jagged_inputs(gen, [5, 12, 0, 9], h=2, d=16)


ZOO += [
    ZooEntry("hstu_reference_padded_gather", lambda: HSTUReferenceMHA(12), _jagged_inputs, 1),
    ZooEntry("hstu_reference_padded_custom_op_window",
             lambda: HSTUReferenceMHA(12, max_attn_len=3, padding="custom_op"), _jagged_inputs, 1),
]
# ---- activations written out in elementwise ops (read twice or more) --------------------------------------------


class SwishWrittenOut(nn.Module):
    """Older HSTU-style code: swish as ``s * torch.sigmoid(s)``, / N, a causal mask after it."""

    def forward(self, q, k, v):
        n = q.shape[-2]
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        p = s * torch.sigmoid(s) / n
        return p.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool, device=q.device)), 0.0) @ v


class GPT2GeluFormula(nn.Module):
    """GPT-2's gelu: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))."""

    def forward(self, q, k, v):
        x = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        p = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
        return torch.matmul(p, v)


ZOO += [
    ZooEntry("swish_written_out_causal", SwishWrittenOut, qkv(2, 2, 12, 16), 1),
    # under dynamic shapes Dynamo reads math.pi through a tensor: a number known only when the program runs
    ZooEntry("gpt2_gelu_formula", GPT2GeluFormula, qkv(2, 2, 10, 16), 1, dynamic_rewrites=0),
]


class ReluAsWhere(nn.Module):
    """``where(s > 0, s, 0)`` is 0 where s is NaN, where relu is NaN: not relu."""

    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1)
        return torch.where(s > 0, s, 0.0) @ v


class QuickGelu(nn.Module):
    """CLIP's quick gelu, s * sigmoid(1.702 s): no activation of the table."""

    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1)
        return (s * torch.sigmoid(1.702 * s)) @ v


NEGATIVE += [
    ZooEntry("neg_relu_as_where", ReluAsWhere, qkv(2, 2, 12, 16), 0, reason="no activation of the table"),
    ZooEntry("neg_quick_gelu", QuickGelu, qkv(2, 2, 12, 16), 0, reason="no activation of the table"),
]
ZOO_BY_NAME = {e.name: e for e in ZOO}


# ---- fill values given as tensors of one number ------------------------------------------------------------------


class WhereZerosLikeAfterSilu(nn.Module):
    """``torch.where(causal, p, torch.zeros_like(p))`` after silu: the fill reads only p's shape."""

    def forward(self, q, k, v):
        n = q.shape[-2]
        causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=q.device))
        p = F.silu(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5) / n
        return torch.where(causal, p, torch.zeros_like(p)) @ v


class MaskedFillTensorBeforeRelu(nn.Module):
    """``masked_fill(future, torch.tensor(0.0))`` before relu: a 0-dim tensor as the fill."""

    def forward(self, q, k, v):
        n = q.shape[-2]
        future = torch.triu(torch.ones(n, n, dtype=torch.bool, device=q.device), diagonal=1)
        s = (q @ k.transpose(-2, -1)).masked_fill(future, torch.tensor(0.0))
        return F.relu(s) @ v


class NewFullBeforeSigmoid(nn.Module):
    """``where(keep, s, s.new_full((), -inf))`` before sigmoid, keep a key mask of the batch."""

    def forward(self, q, k, v, keep):
        s = q @ k.transpose(-2, -1) * 0.5
        s = torch.where(keep[:, None, None, :], s, s.new_full((), float("-inf")))
        return torch.sigmoid(s) @ v


class OnesLikeAfterSilu(nn.Module):
    """``torch.where(causal, p, torch.ones_like(p))``: masked entries add 1·v, not 0."""

    def forward(self, q, k, v):
        n = q.shape[-2]
        causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=q.device))
        p = F.silu(q @ k.transpose(-2, -1))
        return torch.where(causal, p, torch.ones_like(p)) @ v


class ZerosLikeReadElsewhere(nn.Module):
    """The zeros shaped like P also go to the output: P's shape is then read outside the block."""

    def forward(self, q, k, v):
        n = q.shape[-2]
        causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=q.device))
        p = F.silu(q @ k.transpose(-2, -1))
        zeros = torch.zeros_like(p)
        return torch.where(causal, p, zeros) @ v, zeros


ZOO += [
    ZooEntry("where_zeros_like_after_silu", WhereZerosLikeAfterSilu, qkv(2, 2, 12, 16), 1),
    ZooEntry("masked_fill_tensor_before_relu", MaskedFillTensorBeforeRelu, qkv(2, 2, 12, 16), 1),
    ZooEntry("new_full_before_sigmoid", NewFullBeforeSigmoid, _keep_inputs, 1),
]
NEGATIVE += [
    ZooEntry("neg_ones_like_after_silu", OnesLikeAfterSilu, qkv(2, 2, 12, 16), 0, reason="not 0"),
    ZooEntry("neg_zeros_like_read_elsewhere", ZerosLikeReadElsewhere, qkv(2, 2, 12, 16), 0,
             reason="also used elsewhere"),
]
ZOO_BY_NAME = {e.name: e for e in ZOO}


# ---- chains written in place ----------------------------------------------------------------------------------------


class InPlaceUnusedScale(nn.Module):
    """``s.mul_(2)`` whose result nothing reads: it still doubles the scores (a scale of 2, not a dead user)."""

    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1)
        s.mul_(2.0)
        return F.silu(s) @ v


class InPlaceSigmoidChain(nn.Module):
    """Sigmoid attention with every step in place: ``s.mul_``, ``s -= c``, ``s.masked_fill_`` of the future,
    ``s.sigmoid_()`` (whose output its gradient reads, so nothing after it is in place)."""

    def forward(self, q, k, v):
        n = q.shape[-2]
        future = torch.triu(torch.ones(n, n, dtype=torch.bool, device=q.device), 1)
        s = q @ k.transpose(-2, -1)
        s.mul_(q.shape[-1] ** -0.5)
        s -= math.log(n)
        s.masked_fill_(future, float("-inf"))
        p = s.sigmoid_()
        return p @ v


class InPlaceHSTUBias(nn.Module):
    """HSTU-style: ``s += rab`` (a learned bias), ``nn.SiLU(inplace=True)``, ``p /= n``, ``p[future] = 0`` through a
    boolean index."""

    def __init__(self, h=2, n=12):
        super().__init__()
        self.rab = nn.Parameter(torch.randn(h, n, n) * 0.1)
        self.act = nn.SiLU(inplace=True)

    def forward(self, q, k, v):
        n = q.shape[-2]
        future = torch.triu(torch.ones(n, n, dtype=torch.bool, device=q.device), 1)
        s = q @ k.transpose(-2, -1)
        s += self.rab
        p = self.act(s)
        p /= n
        p[future.expand_as(p)] = 0.0
        return p @ v


class ViewBeforeInPlaceScale(nn.Module):
    """A view of the scores taken before ``s.mul_(2)`` and read after it: it sees the change."""

    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1)
        t = s[..., :, :]
        s.mul_(2.0)
        return F.silu(t) @ v


class ReluInPlaceByPosition(nn.Module):
    """``F.relu(s, True)`` (in place by position) before another activation of s: s is changed for both."""

    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1)
        F.relu(s, True)
        return torch.sigmoid(s) @ v


ZOO += [
    ZooEntry("inplace_unused_scale", InPlaceUnusedScale, qkv(2, 2, 12, 16), 1),
    ZooEntry("inplace_sigmoid_chain", InPlaceSigmoidChain, qkv(2, 2, 12, 16), 1),
    ZooEntry("inplace_hstu_bias", InPlaceHSTUBias, qkv(2, 2, 12, 16), 1),
]
NEGATIVE += [
    ZooEntry("neg_view_before_inplace_scale", ViewBeforeInPlaceScale, qkv(2, 2, 12, 16), 0,
             reason="also used elsewhere"),
    ZooEntry("neg_relu_inplace_by_position", ReluInPlaceByPosition, qkv(2, 2, 12, 16), 0,
             reason="a second activation"),
]
ZOO_BY_NAME = {e.name: e for e in ZOO}


# ---- one K and V shared by the heads, written as einsums without a heads index (x-transformers' one_kv_head) ------


def _mqa_inputs(gen):
    return (randn(gen, 2, 4, 12, 16), randn(gen, 2, 12, 16), randn(gen, 2, 12, 16))


class SharedKVEinsumSigmoid(nn.Module):
    """``einsum('bhid,bjd->bhij')`` and ``einsum('bhij,bjd->bhid')``: K and V [B, N, D] shared by the heads."""

    def forward(self, q, k, v):
        s = torch.einsum("bhid,bjd->bhij", q, k) * q.shape[-1] ** -0.5
        return torch.einsum("bhij,bjd->bhid", torch.sigmoid(s), v)


class SharedKVEinsumCausalSilu(nn.Module):
    """The same with K and V's letters in another order (``bdj``, ``jbd``), causal silu and ``/ N``."""

    def forward(self, q, k, v):
        n = q.shape[-2]
        s = torch.einsum("bhid,bdj->bhij", q, k.transpose(1, 2))
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), 0.0)
        return torch.einsum("bhij,jbd->bhid", F.silu(s) / n, v.transpose(0, 1))


class SharedKeyOnly(nn.Module):
    """K shared by the heads, V with one per head: the op needs them alike."""

    def forward(self, q, k, v):
        s = torch.einsum("bhid,bjd->bhij", q, k)
        return torch.einsum("bhij,bhjd->bhid", F.silu(s), v[:, None].expand(-1, 4, -1, -1))


ZOO += [
    ZooEntry("shared_kv_einsum_sigmoid", SharedKVEinsumSigmoid, _mqa_inputs, 1),
    ZooEntry("shared_kv_einsum_causal_silu", SharedKVEinsumCausalSilu, _mqa_inputs, 1),
]
NEGATIVE += [
    ZooEntry("neg_shared_key_only", SharedKeyOnly, _mqa_inputs, 0, reason="key and value head counts differ"),
]
ZOO_BY_NAME = {e.name: e for e in ZOO}
