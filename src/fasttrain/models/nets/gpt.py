"""A decoder-only transformer (GPT-2's layout), written plainly: token ids [B, T] -> logits
[B, T, vocab_size].

Token and learned position embeddings, pre-norm blocks of causal self-attention and a GELU MLP,
a final LayerNorm, and an output layer that shares the token embedding's weights. Attention goes
through `F.scaled_dot_product_attention(is_causal=True)`, so a GPU runs its fused flash or
memory-efficient kernels. Residual projections start at std 0.02 / sqrt(2 n_layer) (GPT-2's
scaled init), every other matrix at 0.02.

`forward(idx)` is what training, evaluation and every exported file run. Generation runs
`forward_cached`, which keeps each block's keys and values, so each new token costs one
position instead of the whole context.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from lightning.pytorch.core.mixins import HyperparametersMixin
from torch import nn
from torch.utils.checkpoint import checkpoint

from fasttrain.config.errors import ConfigError

# One block's keys and values so far: ([B, n_head, t, head_dim], same); a list of them per block.
KVCache = list[tuple[torch.Tensor, torch.Tensor]]


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.proj.residual = True  # type: ignore[assignment]  # read by GPT._init_weights
        self.resid_dropout = nn.Dropout(dropout)

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        shape = (b, t, self.n_head, c // self.n_head)
        return (q.view(shape).transpose(1, 2), k.view(shape).transpose(1, 2),
                v.view(shape).transpose(1, 2))  # fmt: skip

    def _merged(self, y: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = y.shape
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(b, t, -1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(x)
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        return self._merged(y)

    def forward_cached(
        self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x: the new positions [B, t, C] after the cached ones. A prompt (no cache) attends
        causally; one new token attends to every cached position (no mask needed)."""
        q, k, v = self._heads(x)
        if cache is not None:
            k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
        causal = cache is None and q.size(2) > 1
        if cache is not None and q.size(2) > 1:
            raise ValueError("forward_cached: one new position at a time after the prompt")
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return self._merged(y), (k, v)


class MLPBlock(nn.Module):
    def __init__(self, n_embd: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.proj.residual = True  # type: ignore[assignment]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm: x + attn(ln(x)), then x + mlp(ln(x)). The unit FSDP wraps and activation
    checkpointing recomputes."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = MLPBlock(n_embd, dropout, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))

    def forward_cached(
        self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        attended, cache = self.attn.forward_cached(self.ln_1(x), cache)
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
    """

    # trainer=fsdp shards each block as its own unit (fasttrain.assemble.fsdp_wrapping)
    wrap_units: tuple[type[nn.Module], ...] = (Block,)

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
    ) -> None:
        super().__init__()
        _check_sizes(vocab_size, block_size, n_layer, n_head, n_embd, dropout)
        self.save_hyperparameters()
        self.block_size, self.n_layer = block_size, n_layer
        self.activation_checkpointing = activation_checkpointing
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout, bias) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
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

    def _embed(self, idx: torch.Tensor, start: int = 0) -> torch.Tensor:
        positions = torch.arange(start, start + idx.size(1), device=idx.device)
        return self.drop(self.wte(idx) + self.wpe(positions))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self._embed(idx)
        # Under FSDP the strategy checkpoints each wrapped block itself (wrap_units).
        for block in self.blocks:
            if self.activation_checkpointing and self.training and not _fsdp_checkpointed(block):
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.lm_head(self.ln_f(x))

    def forward_cached(
        self, idx: torch.Tensor, cache: KVCache | None
    ) -> tuple[torch.Tensor, KVCache]:
        """Logits of the last position [B, vocab_size] for the new tokens `idx` [B, t] after
        the positions in `cache` (None: `idx` is the prompt), and the cache with them added."""
        start = 0 if cache is None else cache[0][0].size(2)
        x = self._embed(idx, start)
        grown: KVCache = []
        for i, block in enumerate(self.blocks):
            x, kv = block.forward_cached(x, None if cache is None else cache[i])  # type: ignore[operator]
            grown.append(kv)
        return self.lm_head(self.ln_f(x[:, -1])), grown

    def num_params(self, embeddings: bool = False) -> int:
        """Parameters, the tied output matrix once; without the position embedding unless
        `embeddings` (the 6N of FLOPs per token counts the matrices a token goes through)."""
        total = sum(p.numel() for p in self.parameters())
        return total if embeddings else total - self.wpe.weight.numel()

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
