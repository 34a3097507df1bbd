"""predict for a language model: a prompt's continuation, sampled from a checkpoint.

Deterministic for a seed (one torch.Generator on the model's device draws every token), with a
key/value cache (each new token runs one position), the prompt cut to the model's context from
the left when it is longer (said once).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from fasttrain.config.errors import UserError


@dataclass
class Generation:
    prompt: str
    continuation: str
    tokens: list[int]  # the new token ids
    tokens_per_sec: float


def check_sampling(max_new_tokens: Any, temperature: Any, top_k: Any) -> None:
    """Refuse a sampling setting before a checkpoint is read. Any finite temperature >= 0 is
    sampled safely (fasttrain.models.language_model._next_token): NaN and inf are not numbers
    to divide by."""
    if not _is_int(max_new_tokens) or max_new_tokens < 1:
        raise UserError(f"max_new_tokens={max_new_tokens!r}: expected an int >= 1")
    number = isinstance(temperature, (int, float)) and not isinstance(temperature, bool)
    if not number or not math.isfinite(temperature) or temperature < 0:
        raise UserError(f"temperature={temperature!r}: expected a finite number >= 0 "
                        "(0: the most likely token; small ones tend to it)")  # fmt: skip
    if top_k is not None and (not _is_int(top_k) or top_k < 1):
        raise UserError(f"top_k={top_k!r}: expected an int >= 1, or null (every token)")


def check_prompt(prompt: Any) -> None:
    """Some UTF-8 text. Python reads a command line's bytes that are not UTF-8 as lone
    surrogates (surrogateescape: byte 0xff -> U+DCFF), which no tokenizer can encode."""
    if not isinstance(prompt, str) or not prompt:
        raise UserError(f"prompt={prompt!r}: expected some text to continue, e.g. prompt='def '")
    at = next((i for i, c in enumerate(prompt) if "\ud800" <= c <= "\udfff"), None)
    if at is not None:
        code = ord(prompt[at])
        what = f"byte 0x{code - 0xDC00:02x}" if code >= 0xDC80 else f"U+{code:04X}"
        raise UserError(f"prompt={prompt[:40]!r}: {what} at character {at} is not UTF-8 text "
                        "(a terminal or file in another encoding?); expected UTF-8")  # fmt: skip


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def prompt_ids(tokenizer: Any, prompt: str, block_size: int) -> list[int]:
    """The prompt's token ids, the last block_size - 1 of them when longer (one line said)."""
    check_prompt(prompt)
    (ids,) = tokenizer.encode([prompt.encode("utf-8")])
    ids = [int(i) for i in ids]
    room = block_size - 1  # at least one position left for a new token within the context
    if len(ids) > room:
        print(f"prompt: {len(ids)} tokens, longer than the model's context of {block_size}; "
              f"kept the last {room}")  # fmt: skip
        ids = ids[-room:]
    return ids


def generate(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int, temperature: float,
             top_k: int | None, seed: int, device: torch.device,
             cached: bool = True) -> Generation:  # fmt: skip
    block = int(getattr(model.net, "block_size", 1 << 30))
    ids = prompt_ids(tokenizer, prompt, block)
    model = model.to(device).eval()
    generator = torch.Generator(device).manual_seed(int(seed))
    x = torch.tensor([ids], dtype=torch.long, device=device)
    start = time.perf_counter()
    out = model.generate(x, max_new_tokens, float(temperature), top_k, generator, cached)
    new = out[0, len(ids) :].tolist()  # the one read back, after the last token
    seconds = time.perf_counter() - start
    return Generation(prompt, tokenizer.decode(new), new, len(new) / max(seconds, 1e-9))
