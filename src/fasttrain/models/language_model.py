"""Language modelling on the task contract (fasttrain.models.task): next-token cross-entropy over
windows of token ids (fasttrain.data.text), generation with a key/value cache.

Logged: train/loss, val/loss and test/loss in nats per token; val/ppl (e^loss); val/bpb, bits per
byte of text (loss / ln 2 / the split's bytes per token: comparable across tokenizers, and with
gzip and xz); val/acc, next-token top-1 accuracy. The best checkpoint keeps the lowest val/loss.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import Metric, MetricCollection

from fasttrain.config.domains import AtLeast, NonNegative, check_arguments
from fasttrain.config.errors import ConfigError, UserError
from fasttrain.models.task import OptimizerFactory, Task

TOKENIZER_KEY = "tokenizer"  # the checkpoint's tokenizer JSON (fasttrain.data.tokenizer)


class TokenAccuracy(Metric):
    """Share of positions whose top-1 logit is the next token: logits [B, T, V], targets [B, T]."""

    full_state_update = False
    correct: torch.Tensor  # states (add_state)
    total: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.add_state("correct", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        self.correct += (logits.argmax(dim=-1) == targets).sum()
        self.total += targets.numel()

    def compute(self) -> torch.Tensor:
        return self.correct.float() / self.total.clamp(min=1)


class LanguageModel(Task):
    """Next-token prediction over token ids [B, T] (targets: the same windows shifted by one).

    Args:
        net: token ids [B, T] -> logits [B, T, vocab_size] (fasttrain.models.nets.GPT).
        vocab_size: the data's vocabulary (checked against the data module).
        weight_decay: AdamW's decay on the weight matrices and embeddings only (not on biases
            and LayerNorm gains, which it would pull to zero); overrides the optimizer's.
        the rest: as fasttrain.models.task.Task.
    """

    monitor = "val/loss"
    monitor_mode = "min"
    charts: ClassVar[dict[str, list[str]]] = {
        "bits per byte: val": [r"^val/bpb$"],
        "perplexity: val": [r"^val/ppl$"],
    }

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory | None,
        vocab_size: Annotated[int, AtLeast(1)] = 256,
        weight_decay: Annotated[float, NonNegative] = 0.1,
        scheduler_interval: Literal["epoch", "step"] = "step",  # (Task's default: epoch)
        **base: Any,
    ) -> None:
        check_arguments(LanguageModel.__init__, locals())
        for key in ("input_mean", "input_std"):
            value = base.pop(key, None)  # (None is accepted: checkpoints record both)
            if value is not None:
                raise ConfigError(key, value, "a language model's inputs are token ids, never "
                                  "normalised; leave it unset")  # fmt: skip
        weight_decay = float(weight_decay)  # (NaN: refused above; AdamW would at fit's start)
        super().__init__(net, optimizer, scheduler_interval=scheduler_interval,
                         vocab_size=vocab_size, weight_decay=weight_decay, **base)  # fmt: skip
        self.vocab_size, self.weight_decay = vocab_size, weight_decay
        # Bytes per token of the held-out splits (1 for bytes), set from the data in setup.
        self.bytes_per_token = {"val": 1.0, "test": 1.0}
        self.tokenizer_json: str | None = None

    # ---- the contract -------------------------------------------------------------------
    def loss(self, outputs: torch.Tensor, y: torch.Tensor, training: bool) -> torch.Tensor:
        return F.cross_entropy(outputs.reshape(-1, outputs.size(-1)).float(), y.reshape(-1))

    def make_metrics(self) -> dict[str, Metric | MetricCollection]:
        return {"acc": TokenAccuracy()}

    def score(self) -> tuple[str, Metric]:
        return "acc", TokenAccuracy()

    def agreement(self, outputs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        # One answer per position: the same next token.
        return (outputs.argmax(dim=-1) == reference.argmax(dim=-1)).flatten()

    def prediction_header(self, datamodule: Any) -> list[str]:
        return ["loss", "bpb", "acc"]

    def prediction_rows(self, outputs: torch.Tensor, datamodule: Any) -> list[list[Any]]:
        raise UserError(
            "predict for a language model generates text: python -m fasttrain.predict "
            "ckpt_path=... prompt='def ' (evaluate gives the test split's loss, ppl and bpb)"
        )

    def data_mismatch(self, datamodule: Any) -> str | None:
        vocab = getattr(datamodule, "vocab_size", None)
        if vocab is None:
            return "token windows (data=text), but the data has no vocabulary"
        if vocab != self.vocab_size:
            return f"a vocabulary of {self.vocab_size} tokens, but the data's has {vocab}"
        block = getattr(self.net, "block_size", None)
        if block is not None and datamodule.block_size > block:
            return f"contexts of up to {block} tokens, but data.block_size={datamodule.block_size}"
        return None

    def configure_data(self, datamodule: Any) -> None:
        if self.tokenizer_json is None or not hasattr(datamodule, "use_tokenizer"):
            return
        file = getattr(datamodule, "tokenizer_file", None)
        given = Path(file).expanduser() if file else None
        if (
            given is not None
            and given.is_file()
            and given.read_text(errors="replace") != (self.tokenizer_json)
        ):
            raise UserError(
                f"data.tokenizer_file={file!r}: not the tokenizer this checkpoint was "
                "trained with (another run's?); leave it unset: the checkpoint has its own"
            )
        datamodule.use_tokenizer(self.tokenizer_json)

    def export_module(self) -> tuple[nn.Module, dict[str, str]] | None:
        block = int(getattr(self.net, "block_size", 0)) or None
        module = TokenLogits(self.net, block)
        shown = f"1..{block}" if block else "T"
        return module, {
            "input": f"token ids int64 [N, T], T in {shown} (the checkpoint's tokenizer)",
            "output": f"next-token logits float32 [N, T, {self.vocab_size}]",
        }

    def example_inputs(self, batch: int, input_shape: Sequence[int]) -> torch.Tensor:
        return torch.randint(0, self.vocab_size, (batch, *input_shape))

    def param_groups(self) -> Any:
        # Weight decay on matrices (Linear weights, embeddings), none on biases and norms.
        params = [p for p in self.parameters() if p.requires_grad]
        return [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": self.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]

    # ---- data, checkpoint -------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is None or not hasattr(datamodule, "bytes_per_token"):
            return
        self.bytes_per_token = {s: datamodule.bytes_per_token(s) for s in ("val", "test")}
        record = datamodule.tokenizer_record()
        if self.tokenizer_json is not None and self.tokenizer_json != record:
            raise UserError(
                "data.tokenizer_file: the data's tokenizer is not the one this checkpoint was "
                "trained with (another run's?); leave data.tokenizer_file unset to use the "
                "checkpoint's own"
            )
        self.tokenizer_json = record

    def on_fit_start(self) -> None:
        # The run folder keeps the tokenizer beside the checkpoints (data.tokenizer_file= takes
        # it for another run); the checkpoints keep it too.
        if self.tokenizer_json is not None and self.trainer.is_global_zero:
            folder = Path(self.trainer.default_root_dir)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "tokenizer.json").write_text(self.tokenizer_json)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.tokenizer_json is not None:
            checkpoint[TOKENIZER_KEY] = self.tokenizer_json

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        record = checkpoint.get(TOKENIZER_KEY)
        if record is not None:
            self.check_tokenizer(record)
        if isinstance(record, str):
            if self.tokenizer_json is not None and self.tokenizer_json != record:
                raise UserError(
                    "resume: the data's tokenizer is not the one the checkpoint was trained "
                    "with (another corpus, split or data.tokenizer_file); resume=never starts over"
                )
            self.tokenizer_json = record

    def check_tokenizer(self, record: Any) -> None:
        """A checkpoint's tokenizer entry must be its JSON text; read from a file, it can be
        anything. Its format and its ids against this model's vocabulary are checked where a
        checkpoint is loaded for evaluate, export and predict (fasttrain.checkpoints.load: the
        data layer's tokenizer is not this layer's to import); resuming compares it with the
        data's own tokenizer."""
        where = "its tokenizer"
        if self._trainer is not None:  # trainer.fit or test with ckpt_path=
            where = f"ckpt_path={self.trainer.ckpt_path}: {where}"
        if not isinstance(record, str):
            raise UserError(f"{where} is of type {type(record).__name__}, expected "
                            "its JSON text (a str): not a checkpoint fasttrain wrote")  # fmt: skip

    # ---- held-out values: ppl and bits per byte from the epoch's mean loss ---------------
    def on_validation_epoch_end(self) -> None:
        self._log_derived("val", self.val_loss)
        super().on_validation_epoch_end()

    def on_test_epoch_end(self) -> None:
        self._log_derived("test", self.test_loss)

    def _log_derived(self, stage: str, mean_loss: Metric) -> None:
        if not mean_loss.update_called:
            return
        loss = mean_loss.compute()
        self.log(f"{stage}/ppl", torch.exp(loss), sync_dist=True)
        bpb = loss / math.log(2) / self.bytes_per_token[stage]
        self.log(f"{stage}/bpb", bpb, sync_dist=True)

    # ---- generation -------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        cached: bool = True,
    ) -> torch.Tensor:
        """Token ids [B, t] -> [B, t + max_new_tokens]. Cached: the prompt's keys and values are
        kept, so each new token runs one position; uncached: the whole context each token (as
        a net without `forward_cached`). The context is the last block_size tokens."""
        net = self.net
        block = int(getattr(net, "block_size", prompt.size(1) + max_new_tokens))
        step = functools.partial(_next_token, temperature=temperature, top_k=top_k,
                                 generator=generator)  # fmt: skip
        ids, cache, fed = prompt, None, 0
        for _ in range(max_new_tokens):
            if cached and hasattr(net, "forward_cached") and ids.size(1) <= block:
                logits, cache = net.forward_cached(ids[:, fed:], cache)  # type: ignore[operator]
                fed = ids.size(1)
            else:  # past block_size a cache would need positions beyond the embedding
                logits = net(ids[:, -block:])[:, -1]
            ids = torch.cat((ids, step(logits)), dim=1)
        return ids


class TokenLogits(nn.Module):
    """What an exported language model holds: token ids [N, T] -> logits [N, T, V], the batch
    and the length dynamic (up to the context)."""

    def __init__(self, net: nn.Module, block_size: int | None) -> None:
        super().__init__()
        self.net = net
        self.dynamic_axes = {0: ("batch", None), 1: ("length", block_size)}

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.net(idx)


def _next_token(logits: torch.Tensor, temperature: float, top_k: int | None,
                generator: torch.Generator | None) -> torch.Tensor:  # fmt: skip
    """[B, V] logits -> [B, 1] sampled ids (temperature 0: the most likely).

    Any temperature > 0 is safe: the logits are shifted by their max first, so the scaled ones
    are <= 0 and cannot overflow to +inf (which made softmax NaN); a tiny temperature sends all
    but the largest to -inf, i.e. the most likely token (ties shared), the limit it tends to.
    float32, the temperature at least float32's smallest normal: never 0 / 0."""
    logits = logits.float()
    if temperature <= 0:
        return logits.argmax(dim=-1, keepdim=True)
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    shifted = logits - logits.amax(dim=-1, keepdim=True)  # [B, V], 0 at the max
    scaled = shifted / max(float(temperature), torch.finfo(torch.float32).tiny)
    probs = torch.softmax(scaled, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)
