"""Tokenizers of data=text: `byte` (the 256 byte values, nothing to train) and `bpe` (byte-level
BPE trained with Hugging Face `tokenizers` on the training split only).

Both map a document's bytes to token ids and ids back to bytes, so any text round-trips and
bits per byte compare across them. A tokenizer is one JSON string: the BPE's own file (written
to the run folder and kept in every checkpoint, so evaluate, predict and export use the very
one the model was trained with), or {"kind": "byte"}.

Decoding goes through bytes: a token's bytes (its characters in GPT-2's byte alphabet), joined,
then UTF-8 with replacement (U+FFFD), since a BPE token may hold part of a character (an emoji's
first byte) and generated ids need not end on a character. A tokenizer file is checked when it
is read: byte-level, token ids 0..n-1, every token made of byte-alphabet characters.
"""

from __future__ import annotations

import functools
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
        self.token_bytes = _token_bytes(tokenizer)  # id -> its bytes, for every id < vocab_size

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
        # From the bytes, not the file's decoder: a token may end inside a character.
        return b"".join(self.token_bytes[int(i)] for i in ids).decode("utf-8", errors="replace")

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
    model = spec.get("model") if isinstance(spec, dict) else None
    if not isinstance(model, dict) or model.get("type") != "BPE":
        raise UserError(f"{where}: not a byte-level BPE tokenizer file of Hugging Face tokenizers")
    if not _byte_level(spec.get("pre_tokenizer")):
        raise UserError(f"{where}: a BPE, but not byte-level (no ByteLevel pre_tokenizer): it "
                        "cannot encode every text; train one with data.tokenizer=bpe")  # fmt: skip
    tokenizers = _tokenizers()
    try:
        tokenizer = tokenizers.Tokenizer.from_str(text)
    except Exception as err:
        raise UserError(f"{where}: tokenizers could not read it ({err})") from None
    problem = _vocabulary_problem(tokenizer)
    if problem:
        raise UserError(f"{where}: {problem}")
    return BpeTokenizer(tokenizer)


def check_vocabulary(tokenizer: Tokenizer, vocab_size: int, where: str) -> None:
    """Every id the tokenizer gives must be a row of the model's embedding (0..vocab_size-1)."""
    if tokenizer.vocab_size > vocab_size:
        raise UserError(
            f"{where}: {tokenizer.vocab_size} tokens (ids up to {tokenizer.vocab_size - 1}), "
            f"past the model's vocabulary of {vocab_size}: not the tokenizer it was trained with"
        )


def _byte_level(node: Any) -> bool:
    """A pre_tokenizer that is ByteLevel, or a Sequence holding one (as GPT-2's files)."""
    if not isinstance(node, dict):
        return False
    steps = node.get("pretokenizers")
    return node.get("type") == "ByteLevel" or (
        isinstance(steps, list) and any(_byte_level(s) for s in steps)
    )


@functools.cache
def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte: printable bytes stand for themselves, the
    other 68 (control bytes, space, ...) for the characters from U+0100 on, in byte order."""
    printable = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    shifted = iter(range(0x100, 0x200))
    return {(chr(b) if b in printable else chr(next(shifted))): b for b in range(256)}


def _vocabulary_problem(tokenizer: Any) -> str | None:
    """What makes the ids unusable as embedding rows or the tokens not bytes, or None."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)  # token -> id
    ids = sorted(vocab.values())
    if ids != list(range(len(ids))):
        stray = next(i for k, i in enumerate(ids) if i != k)
        return f"its token ids are not 0..{len(ids) - 1} (id {stray} among {len(ids)} tokens)"
    alphabet, added = _byte_alphabet(), set(tokenizer.get_added_tokens_decoder())
    for token, i in vocab.items():
        if i not in added and any(c not in alphabet for c in token):
            return f"token {token!r} (id {i}) is not made of byte-level characters"
    return None


def _token_bytes(tokenizer: Any) -> list[bytes]:
    """Each id's bytes, by id: an added token's own text, else its byte-alphabet characters."""
    alphabet = _byte_alphabet()
    added = {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items()}
    table = [b""] * int(tokenizer.get_vocab_size())
    for token, i in tokenizer.get_vocab(with_added_tokens=True).items():
        table[i] = added[i].encode() if i in added else bytes(alphabet[c] for c in token)
    return table


def fingerprint(tokenizer_json: str) -> str:
    """A short hash that names one tokenizer (vocabulary and merges)."""
    return hashlib.sha256(tokenizer_json.encode()).hexdigest()[:16]


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise UserError(NEEDS) from None
    return tokenizers
