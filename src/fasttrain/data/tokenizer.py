"""Tokenizers of data=text: `byte` (the 256 byte values, nothing to train) and `bpe` (byte-level
BPE trained with Hugging Face `tokenizers` on the training split only).

Both map a document's bytes to token ids and ids back to bytes, so any text round-trips and
bits per byte compare across them. A tokenizer is one JSON string: the BPE's own file (written
to the run folder and kept in every checkpoint, so evaluate, predict and export use the very
one the model was trained with), or {"kind": "byte"}.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from fasttrain.config.errors import UserError

BYTE_JSON = json.dumps({"kind": "byte"})
BYTE_VOCAB = 256
NEEDS = "data.tokenizer=bpe needs Hugging Face tokenizers: pip install -e '.[text]'"


class ByteTokenizer:
    kind = "byte"
    vocab_size = BYTE_VOCAB

    def encode(self, documents: Sequence[bytes]) -> list[np.ndarray]:
        return [np.frombuffer(doc, dtype=np.uint8) for doc in documents]

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def to_json(self) -> str:
        return BYTE_JSON


class BpeTokenizer:
    """Byte-level BPE (GPT-2's scheme): no unknown tokens, any bytes encode."""

    kind = "bpe"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = int(tokenizer.get_vocab_size())

    @classmethod
    def train(cls, documents: Sequence[bytes], vocab_size: int) -> BpeTokenizer:
        tokenizers = _tokenizers()
        from tokenizers import decoders, models, pre_tokenizers, trainers

        tokenizer = tokenizers.Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False, special_tokens=[],
        )  # fmt: skip
        texts = (doc.decode("utf-8") for doc in documents)
        tokenizer.train_from_iterator(texts, trainer=trainer, length=len(documents))
        return cls(tokenizer)

    def encode(self, documents: Sequence[bytes]) -> list[np.ndarray]:
        texts = [doc.decode("utf-8") for doc in documents]
        return [np.asarray(e.ids, dtype=np.int64) for e in self.tokenizer.encode_batch(texts)]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode([int(i) for i in ids]))

    def to_json(self) -> str:
        return str(self.tokenizer.to_str())


Tokenizer = ByteTokenizer | BpeTokenizer


def from_json(text: str, where: str) -> Tokenizer:
    """The tokenizer a JSON string describes (`where`: the override or file it came from)."""
    try:
        spec = json.loads(text)
    except ValueError:
        raise UserError(f"{where}: not a tokenizer file (not JSON)") from None
    if spec == {"kind": "byte"}:
        return ByteTokenizer()
    if not isinstance(spec, dict) or spec.get("model", {}).get("type") != "BPE":
        raise UserError(f"{where}: not a byte-level BPE tokenizer file of Hugging Face tokenizers")
    tokenizers = _tokenizers()
    try:
        return BpeTokenizer(tokenizers.Tokenizer.from_str(text))
    except Exception as err:
        raise UserError(f"{where}: tokenizers could not read it ({err})") from None


def fingerprint(tokenizer_json: str) -> str:
    """A short hash that names one tokenizer (vocabulary and merges)."""
    return hashlib.sha256(tokenizer_json.encode()).hexdigest()[:16]


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise UserError(NEEDS) from None
    return tokenizers
