"""The language model's inputs that ended in a traceback: sampling settings that overflow or are
not numbers, a prompt that is not UTF-8, an .npy file for a language model, and tokenizers that
split a character, reach past the model's vocabulary or are not a tokenizer at all. Each is one
line naming the override (exit 2 on the command line), checked before anything is written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from practices import build_run, compose_train

from conftest import CONF, run_cli
from fasttrain.checkpoints.load import load_task
from fasttrain.config.errors import UserError
from fasttrain.data.text import TextDataModule
from fasttrain.models.language_model import LanguageModel
from fasttrain.models.nets.gpt import GPT
from fasttrain.tasks import predict

# One step of a 1-layer GPT on a small byte-level corpus: a checkpoint to craft others from.
TINY = ["model=gpt", "data=text", "data.block_size=16", "data.batch_size=4",
        "data.val_fraction=0.34", "data.test_fraction=0.34", "data.windows_per_epoch=4",
        "data.eval_windows=2", "model.net.n_layer=1", "model.net.n_embd=16", "model.net.n_head=2",
        "model.scheduler=null", "callbacks=none", "logger=none", "trainer.max_epochs=1",
        "trainer.accelerator=cpu", "trainer.limit_val_batches=0",
        "+trainer.enable_progress_bar=false", "+trainer.enable_model_summary=false",
        "+trainer.enable_checkpointing=false"]  # fmt: skip
LINE = "def 😀 x é\n"  # 14 bytes: a 4-byte and a 2-byte character


def write_corpus(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    words = ["def", "return", "self", "x", "y", "é", "😀"]
    rng = np.random.default_rng(0)
    for i in range(6):
        lines = (" ".join(rng.choice(words, 6)) for _ in range(30))
        (folder / f"d{i}.txt").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture(scope="module")
def lm_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A language model's checkpoint, trained in this process (a few seconds, no subprocess)."""
    root = tmp_path_factory.mktemp("tiny_lm")
    corpus = write_corpus(root / "corpus")
    cfg = compose_train(root, *TINY, f"data.path={corpus}", f"data.cache_dir={root}/cache",
                        quick=False)  # fmt: skip
    trainer, model, datamodule = build_run(cfg)
    trainer.fit(model, datamodule=datamodule)
    path = root / "lm.ckpt"
    trainer.save_checkpoint(path)
    return path


def predict_cfg(ckpt: Path, tmp_path: Path, *overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("predict", overrides=[
            f"ckpt_path={ckpt}", f"paths.root_dir={tmp_path}", f"paths.output_dir={tmp_path}/run",
            "device=cpu", "max_new_tokens=4", *overrides,
        ])  # fmt: skip


def crafted(ckpt: Path, tmp_path: Path, tokenizer: object) -> Path:
    """`ckpt` with another tokenizer entry."""
    record = torch.load(ckpt, weights_only=True)
    record["tokenizer"] = tokenizer
    path = tmp_path / "crafted.ckpt"
    torch.save(record, path)
    return path


def bpe_json(text: str, vocab_size: int) -> str:
    from fasttrain.data.tokenizer import BpeTokenizer

    return BpeTokenizer.train([text.encode()], vocab_size).to_json()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["prompt=x", "temperature=nan"], "temperature=nan: expected a finite number >= 0"),
        (["prompt=x", "temperature=inf"], "temperature=inf: expected a finite number >= 0"),
        (["prompt=''"], "prompt='': expected some text"),
        (["prompt='a\udcffb'"], r"prompt='a\\udcffb': byte 0xff at character 1 is not UTF-8"),
    ],
    ids=["nan", "inf", "empty-prompt", "lone-surrogate"],
)
def test_generation_settings_are_refused_before_the_checkpoint_is_read(
    overrides: list[str], message: str, tmp_path: Path
) -> None:
    # No checkpoint there: refused by the setting, not by the missing file.
    cfg = predict_cfg(tmp_path / "missing.ckpt", tmp_path, *overrides)
    with pytest.raises(UserError, match=message):
        predict(cfg)
    assert not list(tmp_path.rglob("generation.txt"))


@pytest.mark.slow  # a process to its refusal, ~15 s on 2 cores; in-process tests cover the rest
def test_a_prompt_that_is_not_utf8_is_one_line_exit_2(lm_ckpt: Path, tmp_path: Path) -> None:
    # A byte that is not UTF-8 reaches Python as a lone surrogate (surrogateescape: 0xff ->
    # U+DCFF); os.fsencode turns "\udcff" back into that byte on the way out.
    proc = run_cli(["-m", "fasttrain.predict", f"ckpt_path={lm_ckpt}", "prompt='a\udcffb'",
                    "device=cpu"], tmp_path / "logs")  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [
        "error: prompt='a\\udcffb': byte 0xff at character 1 is not UTF-8 text (a terminal or "
        "file in another encoding?); expected UTF-8"
    ]
    assert not (tmp_path / "logs" / "predict").exists() or not any(
        (tmp_path / "logs" / "predict").iterdir()
    )


def test_nan_temperature_on_the_command_line_is_one_line_exit_2(
    lm_ckpt: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    from fasttrain.predict import main

    argv = [f"ckpt_path={lm_ckpt}", "prompt=x", "temperature=nan", f"paths.log_dir={tmp_path}/logs"]
    monkeypatch.setattr(sys, "argv", ["predict", *argv])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("error: temperature=nan: expected a finite number >= 0"), err
    assert not list((tmp_path / "logs").rglob("generation.txt"))
    # the refused run's folder is gone, and no log handler of this process still writes there
    # (the next in-process run's first log line failed on the deleted file)
    import logging

    handlers = [h for lg in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
                for h in getattr(lg, "handlers", [])]  # fmt: skip
    files = [Path(h.baseFilename) for h in handlers if isinstance(h, logging.FileHandler)]
    assert not [f for f in files if f.is_relative_to(tmp_path)], files


@pytest.mark.parametrize("temperature", [1e-45, 1e-300])
def test_a_tiny_temperature_gives_the_most_likely_tokens(temperature: float) -> None:
    # 1e-45: logits / temperature overflowed to inf (softmax NaN); 1e-300 is 0 in float32.
    torch.manual_seed(0)
    model = LanguageModel(GPT(vocab_size=256, block_size=16, n_layer=1, n_head=2, n_embd=16),
                          None).eval()  # fmt: skip
    prompt = torch.tensor([[100, 101, 102]])
    generator = torch.Generator().manual_seed(0)
    sampled = model.generate(prompt, 8, temperature, 50, generator)
    assert torch.equal(sampled, model.generate(prompt, 8, 0.0, 50))


def test_an_npy_file_for_a_language_model_is_refused(lm_ckpt: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((2, 16), dtype=np.float32))
    cfg = predict_cfg(lm_ckpt, tmp_path, f"input={tmp_path}/x.npy")
    with pytest.raises(UserError, match=f"^input={tmp_path}/x.npy: ckpt_path={lm_ckpt} is a "
                       "language model's checkpoint, which takes no .npy file"):  # fmt: skip
        predict(cfg)
    assert not list(tmp_path.rglob("predictions.csv"))


@pytest.mark.parametrize(
    ("tokenizer", "message"),
    [
        (5, "its tokenizer is of type int, expected its JSON text"),
        ([1, 2], "its tokenizer is of type list, expected"),
        ({"kind": "byte"}, "its tokenizer is of type dict, expected"),
        (json.dumps({"model": "BPE"}), "its tokenizer: not a byte-level BPE tokenizer file"),
    ],
    ids=["int", "list", "dict", "model-not-a-map"],
)
def test_a_tokenizer_entry_of_the_wrong_type_is_named(
    tokenizer: object, message: str, lm_ckpt: Path, tmp_path: Path
) -> None:
    path = crafted(lm_ckpt, tmp_path, tokenizer)
    # load_task: what evaluate, export and predict read a checkpoint with
    with pytest.raises(UserError, match=f"^ckpt_path={path}: {message}"):
        load_task(path)


def test_a_tokenizer_past_the_models_vocabulary_is_refused(lm_ckpt: Path, tmp_path: Path) -> None:
    pytest.importorskip("tokenizers", reason="BPE needs tokenizers: pip install -e '.[text]'")
    # A BPE's merges have ids from 256 on; this model embeds 256 tokens (bytes).
    path = crafted(lm_ckpt, tmp_path, bpe_json(LINE * 50, 270))
    cfg = predict_cfg(path, tmp_path, f"prompt='{LINE}'")
    with pytest.raises(UserError, match=f"^ckpt_path={path}: its tokenizer: 2.. tokens .*past "
                       "the model's vocabulary of 256"):  # fmt: skip
        predict(cfg)
    assert not list(tmp_path.rglob("generation.txt"))


def test_a_tokenizer_file_with_ids_past_its_size_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers", reason="BPE needs tokenizers: pip install -e '.[text]'")
    spec = json.loads(bpe_json(LINE * 50, 270))
    vocab = spec["model"]["vocab"]
    vocab[max(vocab, key=vocab.get)] = 5000  # as many tokens, one id far past them
    file = tmp_path / "tokenizer.json"
    file.write_text(json.dumps(spec))
    data = TextDataModule(str(write_corpus(tmp_path / "corpus")), tokenizer="bpe",
                          vocab_size=len(vocab), tokenizer_file=str(file), block_size=16,
                          cache_dir=str(tmp_path / "cache"), val_fraction=0.34,
                          test_fraction=0.34)  # fmt: skip
    with pytest.raises(UserError, match=f"^data.tokenizer_file='{file}': its token ids are not "
                       f"0..{len(vocab) - 1} \\(id 5000 among"):  # fmt: skip
        data.setup()


def test_bpe_decodes_from_the_bytes_with_replacement() -> None:
    pytest.importorskip("tokenizers", reason="BPE needs tokenizers: pip install -e '.[text]'")
    from fasttrain.data.tokenizer import BpeTokenizer, from_json

    spec = json.loads(bpe_json("ab 😀 é xyz " * 50, 270))
    spec["decoder"] = None  # a file without a decoder (or another one): the bytes still decode
    tokenizer = from_json(json.dumps(spec), "data.tokenizer_file=t.json")
    assert isinstance(tokenizer, BpeTokenizer)
    ids = tokenizer.encode(["x 😀".encode()])[0].tolist()
    assert tokenizer.decode(ids) == "x 😀"
    first = tokenizer.tokenizer.token_to_id("ð")  # byte 0xf0 alone: an emoji's first byte
    assert tokenizer.decode([*ids, first]) == "x 😀\ufffd"


def test_one_file_is_split_between_characters_and_its_bytes_counted(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers", reason="BPE needs tokenizers: pip install -e '.[text]'")
    text = (LINE * 300).encode()
    file = tmp_path / "one.txt"
    file.write_bytes(text)
    val, test = 0.102, 0.1
    assert text[int(len(text) * (1 - val - test))] & 0xC0 == 0x80  # by position: mid-character
    data = TextDataModule(str(file), tokenizer="bpe", vocab_size=265, block_size=16,
                          cache_dir=str(tmp_path / "cache"), val_fraction=val,
                          test_fraction=test)  # fmt: skip
    data.setup()
    splits = data.meta["splits"]
    assert sum(s["bytes"] for s in splits.values()) == len(text)  # every byte once
    assert data.bytes_per_token("val") == splits["val"]["bytes"] / splits["val"]["tokens"] > 1
