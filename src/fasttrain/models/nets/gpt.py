"""A decoder-only transformer (GPT-2's layout), written plainly: token ids [B, T] -> logits
[B, T, vocab_size].

Token and learned position embeddings, pre-norm blocks of causal self-attention and a GELU MLP,
a final LayerNorm, and an output layer that shares the token embedding's weights. Attention goes
through `F.scaled_dot_product_attention(is_causal=True)`, so a GPU runs its fused flash or
memory-efficient kernels. Residual projections start at std 0.02 / sqrt(2 n_layer) (GPT-2's
scaled init), every other matrix at 0.02.

The modern recipe (conf/model/gpt_modern.yaml) is the same class with other arguments, each one
switchable alone: rotary position embeddings (`pos=rope`), RMSNorm (`norm=rms`), RMS- or
LayerNorm on each head's queries and keys (`qk_norm`), a ReLU^2 MLP (`mlp=relu2`), an output
layer of its own (`tie_embeddings=false`) and a tanh cap on the logits (`softcap`). The defaults
are GPT-2's: the same parameters, state_dict keys and operations as before these existed.
The modern pieces are written for the CPU's eager step too: RMSNorm's and ReLU^2's backward
passes are written out (autograd's of the plain expressions take 2-4x the passes over the
activations; the values are the same), queries and keys are normed and turned as rows of
head_dim before the transpose, and rotary is one addcmul.

`forward(idx)` is what training, evaluation and every exported file run. Generation runs
`forward_cached`, which keeps each block's keys and values, so each new token costs one
position instead of the whole context.
"""

from __future__ import annotations

import math
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from lightning.pytorch.core.mixins import HyperparametersMixin
from torch import nn
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from fasttrain.config.errors import ConfigError

# One block's keys and values so far: ([B, n_head, t, head_dim], same); a list of them per block.
KVCache = list[tuple[torch.Tensor, torch.Tensor]]
# Rotary angles of the positions in a forward: (cos, sin), each [T, 1, head_dim] (see rotary).
Rope = tuple[torch.Tensor, torch.Tensor]
Position = Literal["learned", "rope"]
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
    """x * rsqrt(mean(x^2) + eps) * weight over the last axis, its backward written out: 5
    passes over x where autograd's for F.rms_norm takes 9 (torch has no fused RMSNorm backward
    on the CPU). The forward gives F.rms_norm's float32 values."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rstd = torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
        normed = x * rstd
        ctx.save_for_backward(normed, rstd, weight)
        return normed * weight

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        normed, rstd, weight = ctx.saved_tensors
        grad_x = grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = (grad * normed).sum(tuple(range(grad.dim() - 1)))
        if ctx.needs_input_grad[0]:
            # d normed / dx = rstd (I - normed normed^T / size): rstd (g - normed mean(g normed))
            g = grad * weight
            mean = (g * normed).mean(-1, keepdim=True)
            grad_x = torch.addcmul(g, normed, mean, value=-1).mul_(rstd)
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
    """relu(h)^2 with its backward in one pass, 2 relu(h) x grad (zero where h <= 0, as the
    relu's), where autograd's of F.relu(h).square() takes four (pow's backward, then the
    relu's): forward and backward of [32, 128, 512] in 3.4 ms on this CPU against 12.5 ms (and
    GELU's 3.3 ms). The same values, bit for bit."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor) -> torch.Tensor:
        r = F.relu(h)
        ctx.save_for_backward(r)
        return r * r

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (r,) = ctx.saved_tensors
        return torch.mul(grad, r).mul_(2)


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


class GPT(HyperparametersMixin, nn.Module):
    """Token ids [B, T] (T <= block_size, any integer dtype) -> logits [B, T, vocab_size].

    Args:
        vocab_size: token ids are 0..vocab_size-1 (the data's tokenizer sets it).
        block_size: the longest context, in tokens (the position embedding's length).
        n_layer, n_head, n_embd: depth, attention heads, width (n_embd divisible by n_head).
        dropout: on attention weights, residual branches and embeddings (0 for pre-training
            on plenty of data, as nanoGPT does; 0.1-0.2 against overfitting a small corpus).
        bias: biases in Linear and LayerNorm layers (GPT-2 has them; without: a bit faster).
        activation_checkpointing: recompute each block's activations in the backward pass
            instead of keeping them: less memory for about a third more compute.
        pos: "learned" (a position embedding, GPT-2) or "rope" (rotary: queries and keys
            turned by their position, Su et al.; needs an even head size n_embd / n_head).
        norm: "layer" (LayerNorm, GPT-2) or "rms" (RMSNorm).
        qk_norm: norm each head's queries and keys (of the `norm` kind) before attending.
        mlp: "gelu" (GPT-2) or "relu2" (ReLU squared).
        tie_embeddings: the output layer shares the token embedding's matrix (GPT-2); false:
            a matrix of its own (more parameters, the modern recipe's choice).
        softcap: logits -> softcap x tanh(logits / softcap) (Gemma 2), within +-softcap;
            None: none.
    """

    # trainer=fsdp shards each block as its own unit (fasttrain.assemble.fsdp_wrapping)
    wrap_units: tuple[type[nn.Module], ...] = (Block,)
    # What the weights compute with and no shape shows: a resumed run keeps the checkpoint's
    # (fasttrain.checkpoints.resume).
    fixed_by_weights = ("pos", "norm", "qk_norm", "mlp", "tie_embeddings", "softcap")

    def __init__(
        self,
        vocab_size: int,
        block_size: int = 256,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 128,
        dropout: float = 0.0,
        bias: bool = False,
        activation_checkpointing: bool = False,
        pos: Position = "learned",
        norm: Norm = "layer",
        qk_norm: bool = False,
        mlp: Mlp = "gelu",
        tie_embeddings: bool = True,
        softcap: float | None = None,
    ) -> None:
        super().__init__()
        _check_sizes(vocab_size, block_size, n_layer, n_head, n_embd, dropout)
        _check_recipe(pos, norm, mlp, softcap, n_embd // n_head)
        self.save_hyperparameters()
        self.block_size, self.n_layer = block_size, n_layer
        self.head_dim, self.softcap = n_embd // n_head, softcap
        self.activation_checkpointing = activation_checkpointing
        self.wte = nn.Embedding(vocab_size, n_embd)
        # rope: positions turn queries and keys inside attention; nothing is added here
        self.wpe = nn.Embedding(block_size, n_embd) if pos == "learned" else None
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout, bias, norm, qk_norm, mlp)
                                    for _ in range(n_layer))  # fmt: skip
        self.ln_f = make_norm(norm, n_embd, bias)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        if tie_embeddings:
            self.lm_head.weight = self.wte.weight  # weight tying (one matrix, counted once)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            std = 0.02 / math.sqrt(2 * self.n_layer) if getattr(module, "residual", False) else 0.02
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def _embed(self, idx: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, Rope | None]:
        """Embedded tokens [B, T, C] at positions start.., and their rotary angles (rope)."""
        positions = torch.arange(start, start + idx.size(1), device=idx.device)
        if self.wpe is not None:
            return self.drop(self.wte(idx) + self.wpe(positions)), None
        return self.drop(self.wte(idx)), rotary(positions, self.head_dim)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.ln_f(x))
        if self.softcap is None:
            return logits
        # smooth, within +-softcap: no logit runs away early in training
        return self.softcap * torch.tanh(logits / self.softcap)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x, rope = self._embed(idx)
        # Under FSDP the strategy checkpoints each wrapped block itself (wrap_units).
        for block in self.blocks:
            if self.activation_checkpointing and self.training and not _fsdp_checkpointed(block):
                x = checkpoint(block, x, rope, use_reentrant=False)
            else:
                x = block(x, rope)
        return self._logits(x)

    def forward_cached(
        self, idx: torch.Tensor, cache: KVCache | None
    ) -> tuple[torch.Tensor, KVCache]:
        """Logits of the last position [B, vocab_size] for the new tokens `idx` [B, t] after
        the positions in `cache` (None: `idx` is the prompt), and the cache with them added."""
        start = 0 if cache is None else cache[0][0].size(2)
        x, rope = self._embed(idx, start)
        grown: KVCache = []
        for i, block in enumerate(self.blocks):
            past = None if cache is None else cache[i]
            x, kv = block.forward_cached(x, past, rope)  # type: ignore[operator]
            grown.append(kv)
        return self._logits(x[:, -1]), grown

    def num_params(self, embeddings: bool = False) -> int:
        """Parameters, the tied output matrix once; without the tables a token only looks up
        (the position embedding, and the token embedding when the output layer has a matrix of
        its own) unless `embeddings` (the 6N of FLOPs per token counts the matrices a token
        goes through)."""
        total = sum(p.numel() for p in self.parameters())
        if embeddings:
            return total
        looked_up = [] if self.wpe is None else [self.wpe.weight]
        if self.lm_head.weight is not self.wte.weight:
            looked_up.append(self.wte.weight)
        return total - sum(p.numel() for p in looked_up)

    def flops_per_token(self, context: int | None = None) -> int:
        """Training FLOPs per token (forward and backward) at `context` tokens (block_size):
        6N for the weights, plus 12 x n_layer x context x n_embd for attention's scores and
        their use (QK^T and AV: 2 x 2 x T x C forward per token, x3 with the backward), as
        nanoGPT's estimate_mfu and the PaLM paper (appendix B) count them. The embedding
        lookups are no matmuls and do not count; the output layer (tied) does, once."""
        t = self.block_size if context is None else context
        n_embd = int(self.hparams["n_embd"])
        return 6 * self.num_params() + 12 * self.n_layer * t * n_embd


def _fsdp_checkpointed(block: nn.Module) -> bool:
    """Whether the strategy already wrapped `block` for activation checkpointing."""
    wrapped = type(block).__name__ == "CheckpointWrapper"
    return wrapped or hasattr(block, "_checkpoint_wrapped_module")


def _check_sizes(vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int,
                 dropout: float) -> None:  # fmt: skip
    for name, value in (("vocab_size", vocab_size), ("block_size", block_size),
                        ("n_layer", n_layer), ("n_head", n_head), ("n_embd", n_embd)):  # fmt: skip
        if not isinstance(value, int) or value < 1:
            raise ConfigError(name, value, "expected an int >= 1")
    if n_embd % n_head:
        raise ConfigError("n_embd", n_embd, f"expected a multiple of n_head={n_head}")
    if not 0.0 <= dropout < 1.0:
        raise ConfigError("dropout", dropout, "expected a probability in [0, 1)")


def _check_recipe(pos: str, norm: str, mlp: str, softcap: float | None, head_dim: int) -> None:
    for name, value, kind in (("pos", pos, Position), ("norm", norm, Norm), ("mlp", mlp, Mlp)):
        if value not in get_args(kind):
            raise ConfigError(
                name, value, f"expected one of {', '.join(map(repr, get_args(kind)))}"
            )
    if softcap is not None and not (isinstance(softcap, (int, float)) and softcap > 0):
        raise ConfigError("softcap", softcap, "expected a number > 0, or null for no cap")
    if pos == "rope" and head_dim % 2:
        raise ConfigError(
            "pos", pos, f"rotary embeddings turn pairs of a head's dimensions, but the head size "
            f"n_embd / n_head = {head_dim} is odd; an even one (another n_head or n_embd), or "
            "model.net.pos=learned"
        )  # fmt: skip
