"""The pieces of a GPT block (fasttrain.models.nets.gpt): LayerNorm or RMSNorm, rotary position
embeddings, causal self-attention with an optional QK-norm, a GELU or ReLU^2 MLP, and the
pre-norm Block. The modern pieces are written for the CPU's eager step too: RMSNorm's and
ReLU^2's backward passes are written out (autograd's of the plain expressions take 2-4x the
passes over the activations; the values are the same), queries and keys are normed and turned
as rows of head_dim before the transpose, and rotary is one addcmul.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

# Rotary angles of the positions in a forward: (cos, sin), each [T, 1, head_dim] (see rotary).
Rope = tuple[torch.Tensor, torch.Tensor]
Norm = Literal["layer", "rms"]
Mlp = Literal["gelu", "relu2"]
ROPE_BASE = 10000.0  # RoFormer's (and LLaMA's): the slowest pair turns once in ~60k positions


def make_norm(kind: Norm, size: int, bias: bool) -> nn.Module:
    """LayerNorm, or RMSNorm: no mean subtracted and no bias (LLaMA's)."""
    return RMSNorm(size) if kind == "rms" else nn.LayerNorm(size, bias=bias)


def _hand_backward(module: nn.Module) -> bool:
    """Whether a training forward runs the hand-written backward of _RMSNormFunction or
    _ReLU2Function: in eager autograd only. Evaluation, generation, the exported files (eval
    mode, traced) and torch.compile (which fuses the plain expression itself) run the plain
    one, which computes the same values."""
    return (module.training and torch.is_grad_enabled() and not torch.jit.is_tracing()
            and not torch.compiler.is_compiling())  # fmt: skip


class _RMSNormFunction(torch.autograd.Function):
    """x * rsqrt(mean(x^2) + eps) * weight over the last axis, its backward written out: 3
    passes over x forward (a norm, then two products) and 4 backward, where autograd's for
    F.rms_norm takes 9 (torch has no fused RMSNorm backward on the CPU). The forward gives
    F.rms_norm's float32 values (to rounding)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # mean(x^2) from the norm: one read of x, no squared copy written
        ms = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(x.size(-1))
        rstd = ms.add_(eps).rsqrt_()  # [..., 1]
        normed = x * rstd
        ctx.save_for_backward(normed, rstd, weight)
        return normed * weight

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        normed, rstd, weight = ctx.saved_tensors
        grad_x = grad_weight = None
        if ctx.needs_input_grad[1]:
            rows = normed.size(-1)
            grad_weight = torch.linalg.vecdot(grad.reshape(-1, rows), normed.reshape(-1, rows),
                                              dim=0)  # fmt: skip
        if ctx.needs_input_grad[0]:
            # d normed / dx = rstd (I - normed normed^T / size): rstd (g - normed mean(g normed)),
            # written into g itself
            g = grad * weight
            mean = torch.linalg.vecdot(g, normed).unsqueeze_(-1).div_(normed.size(-1))
            grad_x = g.mul_(rstd).addcmul_(normed, mean.mul_(rstd), value=-1)
        return grad_x, grad_weight, None


class RMSNorm(nn.RMSNorm):
    """nn.RMSNorm (the same parameter, state_dict key and values) whose float32 CPU training
    step runs _RMSNormFunction's backward: forward and backward of [32, 128, 128] in 1.8 ms on
    this 2-core x86 CPU (one thread) against 3.2 ms for F.rms_norm's autograd, 4.2 ms for
    nn.RMSNorm's and 3.0 ms for the plain expression's (LayerNorm's fused kernels: 0.8 ms).
    Elsewhere (a GPU's fused kernels, bf16, autocast) it is nn.RMSNorm."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (_hand_backward(self) and self.weight is not None and x.dtype == torch.float32
                and x.device.type == "cpu" and not torch.is_autocast_enabled("cpu")):  # fmt: skip
            eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps  # F.rms_norm's
            return _RMSNormFunction.apply(x, self.weight, eps)  # type: ignore[no-any-return]
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)


class _ReLU2Function(torch.autograd.Function):
    """relu(h)^2 with its backward in one product, 2 relu(h) x grad (zero where h <= 0, as the
    relu's), where autograd's of F.relu(h).square() takes four passes (pow's backward, then the
    relu's): forward and backward of [32, 128, 512] in 3.4 ms on this CPU against 12.5 ms (and
    GELU's 3.3 ms). It keeps h (which nothing else keeps: the Linear's backward needs its input,
    not its output) and squares the relu in place, one new [B, T, 4C] tensor each way where
    keeping relu(h) takes two in the forward: the fc-ReLU^2-proj forward and backward in ~0.96x
    the time. The same values, bit for bit."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h)
        return torch.clamp_min(h, 0).square_()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (h,) = ctx.saved_tensors
        return torch.clamp_min(h, 0).mul_(grad).mul_(2)


def rotary(positions: torch.Tensor, head_dim: int) -> Rope:
    """cos and sin of the angles pos / ROPE_BASE^(2i / head_dim), laid out for `rotate`:
    (cos, cos) and (-sin, sin), each [T, 1, head_dim] (1: the heads). Computed in float32 per
    forward, not kept in a buffer: a bf16 buffer (bf16-true) would turn position 1000 by
    several radians off, and nothing is added to the state_dict."""
    pairs = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32)
    angles = positions.float()[:, None] * ROPE_BASE ** (-pairs / head_dim)[None, :]
    cos, sin = angles.cos(), angles.sin()
    return torch.cat((cos, cos), dim=-1)[:, None], torch.cat((-sin, sin), dim=-1)[:, None]


def rotate(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """x [B, T, n_head, head_dim] with each pair (x_i, x_{i + head_dim/2}) turned by its
    position's angle i, so q . k depends on the two positions only through their distance:
    (x1 cos - x2 sin, x2 cos + x1 sin) as x (cos, cos) + (x2, x1) (-sin, sin), three passes
    where the halves' products take seven; forward and backward of [32, 128, 4, 32] in 0.70x
    the time on this CPU."""
    cos, sin = rope[0].to(x.dtype), rope[1].to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.addcmul(x * cos, torch.cat((x2, x1), dim=-1), sin)


def capped_logits(x: torch.Tensor, head: nn.Module, cap: float) -> torch.Tensor:
    """cap x tanh(head(x) / cap): logits smooth and within +-cap, so none runs away early in
    training. For a plain nn.Linear head the 1/cap is folded into its weight ([vocab, C], not a
    pass over the [B, T, vocab] logits); an int8 (export) or fp8 head keeps its own kernel and
    has its output scaled. float32 on a CPU as 2 cap x sigmoid(2 y / cap) - cap, the same
    function (tanh y = 2 sigmoid(2y) - 1): torch's CPU tanh takes ~2x sigmoid's time (2.3 vs
    1.1 ms for 512k values on one core of an AVX2 EPYC), and the form's absolute error (~1e-7 x
    cap in float32) is below the logits' own. Elsewhere tanh: in bf16 that error would be
    ~4e-3 x cap."""
    cpu_float = (x.device.type == "cpu" and x.dtype == torch.float32
                 and not torch.is_autocast_enabled("cpu"))  # fmt: skip
    scale = 2 / cap if cpu_float else 1 / cap
    if type(head) is nn.Linear:
        bias = None if head.bias is None else head.bias * scale
        scaled = F.linear(x, head.weight * scale, bias)
    else:
        scaled = head(x) * scale
    if cpu_float:
        return torch.sigmoid(scaled).mul(2 * cap).sub_(cap)
    return torch.tanh(scaled).mul(cap)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool,
                 qk_norm: Norm | None = None) -> None:  # fmt: skip
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.proj.residual = True  # type: ignore[assignment]  # read by GPT._init_weights
        self.resid_dropout = nn.Dropout(dropout)
        # Normed queries and keys bound the attention logits (no softmax saturating early).
        head_dim = n_embd // n_head
        self.q_norm = make_norm(qk_norm, head_dim, bias) if qk_norm else None
        self.k_norm = make_norm(qk_norm, head_dim, bias) if qk_norm else None

    def _heads(
        self, x: torch.Tensor, rope: Rope | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        shape = (b, t, self.n_head, c // self.n_head)
        # [B, T, n_head, head_dim] (each head's row contiguous) for the norms and the turn, as
        # cheap there as on rows of n_embd; [B, n_head, T, head_dim] views for attention
        q, k, v = q.view(shape), k.view(shape), v.view(shape)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = rotate(q, rope), rotate(k, rope)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def _merged(self, y: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = y.shape
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(b, t, -1)))

    def forward(self, x: torch.Tensor, rope: Rope | None = None) -> torch.Tensor:
        q, k, v = self._heads(x, rope)
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        return self._merged(y)

    def forward_cached(
        self,
        x: torch.Tensor,
        cache: tuple[torch.Tensor, torch.Tensor] | None,
        rope: Rope | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x: the new positions [B, t, C] after the cached ones (`rope`: their angles, so the
        cached keys keep the turn of their own positions). A prompt (no cache) attends
        causally; one new token attends to every cached position (no mask needed)."""
        q, k, v = self._heads(x, rope)
        if cache is not None:
            k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
        causal = cache is None and q.size(2) > 1
        if cache is not None and q.size(2) > 1:
            raise ValueError("forward_cached: one new position at a time after the prompt")
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return self._merged(y), (k, v)


class MLPBlock(nn.Module):
    def __init__(self, n_embd: int, dropout: float, bias: bool, kind: Mlp = "gelu") -> None:
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.proj.residual = True  # type: ignore[assignment]
        self.dropout = nn.Dropout(dropout)
        self.kind = kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.kind == "gelu":
            h = F.gelu(h)
        # ReLU^2 (So et al., Primer): as good as GELU or better for LMs
        elif _hand_backward(self):
            h = _ReLU2Function.apply(h)
        else:
            h = F.relu(h).square()
        return self.dropout(self.proj(h))


class Block(nn.Module):
    """Pre-norm: x + attn(ln(x)), then x + mlp(ln(x)). The unit FSDP wraps and activation
    checkpointing recomputes."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool, norm: Norm = "layer",
                 qk_norm: bool = False, mlp: Mlp = "gelu") -> None:  # fmt: skip
        super().__init__()
        self.ln_1 = make_norm(norm, n_embd, bias)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias, norm if qk_norm else None)
        self.ln_2 = make_norm(norm, n_embd, bias)
        self.mlp = MLPBlock(n_embd, dropout, bias, mlp)

    def forward(self, x: torch.Tensor, rope: Rope | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), rope)
        return x + self.mlp(self.ln_2(x))

    def forward_cached(
        self,
        x: torch.Tensor,
        cache: tuple[torch.Tensor, torch.Tensor] | None,
        rope: Rope | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        attended, cache = self.attn.forward_cached(self.ln_1(x), cache, rope)
        x = x + attended
        return x + self.mlp(self.ln_2(x)), cache
