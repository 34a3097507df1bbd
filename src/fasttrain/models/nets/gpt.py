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
The block and its pieces: fasttrain.models.nets.gpt_blocks.

`forward(idx)` is what training, evaluation and every exported file run. Generation runs
`forward_cached`, which keeps each block's keys and values, so each new token costs one
position instead of the whole context.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import torch
from lightning.pytorch.core.mixins import HyperparametersMixin
from torch import nn
from torch.utils.checkpoint import checkpoint

from fasttrain.config.domains import AtLeast, Probability, Range, check_arguments
from fasttrain.config.errors import ConfigError
from fasttrain.models.nets.gpt_blocks import (
    Block,
    Mlp,
    Norm,
    Rope,
    capped_logits,
    make_norm,
    rotary,
)

# One block's keys and values so far: ([B, n_head, t, head_dim], same); a list of them per block.
KVCache = list[tuple[torch.Tensor, torch.Tensor]]
Position = Literal["learned", "rope"]


Size = Annotated[int, AtLeast(1)]  # a count of tokens, layers, heads or channels


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
    # (fasttrain.checkpoints.fits).
    fixed_by_weights = ("pos", "norm", "qk_norm", "mlp", "tie_embeddings", "softcap")

    def __init__(
        self,
        vocab_size: Size,
        block_size: Size = 256,
        n_layer: Size = 4,
        n_head: Size = 4,
        n_embd: Size = 128,
        dropout: Annotated[float, Probability] = 0.0,
        bias: bool = False,
        activation_checkpointing: bool = False,
        pos: Position = "learned",
        norm: Norm = "layer",
        qk_norm: bool = False,
        mlp: Mlp = "gelu",
        tie_embeddings: bool = True,
        softcap: Annotated[float | None, Range(0, low_open=True, null="no cap")] = None,
    ) -> None:
        super().__init__()
        check_arguments(GPT.__init__, locals())
        if n_embd % n_head:
            raise ConfigError("n_embd", n_embd, f"expected a multiple of n_head={n_head}")
        if pos == "rope" and n_embd // n_head % 2:
            raise ConfigError(
                "pos", pos, "rotary embeddings turn pairs of a head's dimensions, but the head "
                f"size n_embd / n_head = {n_embd // n_head} is odd; an even one (another n_head "
                "or n_embd), or model.net.pos=learned"
            )  # fmt: skip
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
        if self.softcap is None:
            return self.lm_head(self.ln_f(x))  # type: ignore[no-any-return]
        return capped_logits(self.ln_f(x), self.lm_head, self.softcap)

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
