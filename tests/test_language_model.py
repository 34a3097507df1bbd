"""The language model (model=gpt data=text): the net's FLOPs formula against torch's counter,
cached generation against uncached, token windows that resume exactly, the corpus and its memmaps,
and every bad input of the text data and of generation: one line, exit 2, nothing written."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import run_cli
from fasttrain.config.errors import UserError
from fasttrain.data.corpus import corpus_files, split_documents
from fasttrain.data.text import TextDataModule, TokenWindows
from fasttrain.models.language_model import LanguageModel
from fasttrain.models.nets.gpt import GPT

SMALL = ["model=gpt", "data=text", "data.block_size=32", "data.batch_size=8",
         "data.val_fraction=0.2", "data.test_fraction=0.2",
         "data.windows_per_epoch=32", "data.eval_windows=8", "model.net.n_layer=1",
         "model.net.n_embd=32", "model.net.n_head=2", "trainer.max_epochs=1", "logger=none",
         "data.num_workers=0"]  # fmt: skip


# 20 steps without warm-up at a high lr: a small corpus of 11 words is learned well below ln 256
LEARNS = ["data.windows_per_epoch=160", "model.scheduler.warmup_steps=0", "model.optimizer.lr=0.01"]
HALF = {"val_fraction": 0.2, "test_fraction": 0.2}  # a small corpus: every split gets files


def write_corpus(root: Path, files: int = 20, lines: int = 60) -> Path:
    """A folder of small Python-like text files (enough for every split at block_size 32)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    words = ["def", "return", "self", "value", "import", "class", "for", "in", "if", "x", "y"]
    for i in range(files):
        text = "\n".join(" ".join(rng.choice(words, 6)) for _ in range(lines)) + "\n"
        (root / f"doc{i:02d}.py").write_text(text)
    return root


def test_flops_per_token_matches_torchs_flop_counter() -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    net = GPT(vocab_size=96, block_size=64, n_layer=2, n_head=4, n_embd=64)
    idx = torch.randint(0, 96, (2, 64))
    # The math kernel: attention as matmuls the counter sees (the CPU's fused one it skips).
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        net(idx).sum().backward()
    counted = counter.get_total_flops() / idx.numel()
    # The formula counts LayerNorm gains as weights (no matmul): within 1%. Attention is 14%
    # of it at this size, so a formula without it would fail.
    assert net.flops_per_token(64) == pytest.approx(counted, rel=0.01)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_cached_generation_gives_the_tokens_of_uncached(temperature: float) -> None:
    torch.manual_seed(0)
    net = GPT(vocab_size=50, block_size=48, n_layer=2, n_head=2, n_embd=32)
    model = LanguageModel(net, None, vocab_size=50).eval()
    prompt = torch.randint(0, 50, (1, 7))
    runs = [
        model.generate(prompt, 30, temperature, 10, torch.Generator().manual_seed(3), cached=c)
        for c in (True, False)
    ]
    assert torch.equal(runs[0], runs[1])
    assert runs[0].shape == (1, 37) and torch.equal(runs[0][:, :7], prompt)


def test_windows_are_a_function_of_seed_epoch_and_index() -> None:
    tokens = np.arange(1000, dtype=np.uint16)
    windows = TokenWindows(tokens, block_size=16, length=64, seed=3)
    x, y = windows.__getitems__([5, 6, 64 + 5])  # index 5 of epochs 0 and 1 (tagged)
    assert x.shape == (3, 16) and torch.equal(x[:, 1:], y[:, :-1])  # y: x shifted by one
    again, _ = TokenWindows(tokens, 16, 64, seed=3).__getitems__([5])
    assert torch.equal(again[0], x[0])  # the same window for the same position
    assert not torch.equal(x[0], x[2])  # another epoch, another window
    other, _ = TokenWindows(tokens, 16, 64, seed=4).__getitems__([5])
    assert not torch.equal(other[0], x[0])
    starts = windows.window_starts(list(range(64 * 8)))
    assert starts.min() >= 0 and starts.max() <= 1000 - 17  # every window inside the split


def test_split_by_document_keeps_files_whole_and_one_file_by_position() -> None:
    docs = {f"f{i}.py": f"text {i}\n".encode() for i in range(200)}
    splits = split_documents(docs, 0.1, 0.1, seed=1)
    assert sorted(d for s in splits.values() for d in s) == sorted(docs.values())
    assert 5 < len(splits["val"]) < 40 and 5 < len(splits["test"]) < 40
    assert split_documents(docs, 0.1, 0.1, seed=1) == splits  # fixed by the seed
    one = split_documents({"a.txt": bytes(range(100))}, 0.1, 0.2, seed=0)
    assert (len(one["train"][0]), len(one["val"][0]), len(one["test"][0])) == (70, 10, 20)


def test_memmaps_are_written_once_and_whole(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    (corpus / "binary.bin").write_bytes(b"\x00\x01\xff\xfe")  # not text: skipped, said once
    dm = TextDataModule(str(corpus), block_size=32, cache_dir=str(tmp_path / "cache"), **HALF)
    with pytest.warns(UserWarning, match="skipped 1 of 21 files that are not UTF-8"):
        folder = dm.token_folder()
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["documents"] == 20 and meta["dtype"] == "uint16"
    sizes = {s: (folder / f"{s}.bin").stat().st_size // 2 for s in ("train", "val", "test")}
    assert sizes == {s: meta["splits"][s]["tokens"] for s in sizes}
    assert sum(v["bytes"] for v in meta["splits"].values()) == sum(
        p.stat().st_size for p in corpus.glob("*.py")
    )  # byte tokens: every byte of every text file, once
    stamp = (folder / "train.bin").stat().st_mtime_ns
    again = TextDataModule(str(corpus), block_size=32, cache_dir=str(tmp_path / "cache"), **HALF)
    assert again.token_folder() == folder
    assert (folder / "train.bin").stat().st_mtime_ns == stamp  # read, not rewritten
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [folder.name]  # no temp folder


def test_a_prepare_killed_mid_write_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    dm = TextDataModule(str(corpus), block_size=32, cache_dir=str(tmp_path / "cache"), **HALF)

    def dies(*args, **kwargs):
        raise KeyboardInterrupt  # a Ctrl-C with every file written, just before the rename

    monkeypatch.setattr("fasttrain.data.corpus.os.rename", dies)
    with pytest.raises(KeyboardInterrupt):
        dm.token_folder()
    assert not any((tmp_path / "cache").iterdir())
    monkeypatch.undo()
    # A SIGKILL leaves the temporary folder (no finally runs): the next writer removes it.
    key = dm.cache_key(*corpus_files(str(corpus)), None)
    stale = tmp_path / "cache" / f".{key}.999999999.tmp"
    stale.mkdir()
    (stale / "train.bin").write_bytes(b"half")
    folder = dm.token_folder()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [folder.name]


def test_bpe_is_trained_on_the_training_split_and_round_trips(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers", reason="BPE needs tokenizers: pip install -e '.[text]'")
    corpus = write_corpus(tmp_path / "corpus")
    dm = TextDataModule(str(corpus), tokenizer="bpe", vocab_size=290, block_size=16,
                        cache_dir=str(tmp_path / "cache"), **HALF)  # fmt: skip
    dm.setup()
    assert dm.tokenizer is not None and dm.tokenizer.vocab_size == 290
    text = "def value(self):\n    return x  # ünïcode\n"
    (ids,) = dm.tokenizer.encode([text.encode()])
    assert dm.tokenizer.decode(ids) == text
    assert dm.bytes_per_token("val") > 1.5  # merges: fewer tokens than bytes
    # The same tokenizer file, given to another data module: its memmaps are the same tokens.
    file = tmp_path / "tokenizer.json"
    file.write_text(dm.tokenizer_record())
    again = TextDataModule(str(corpus), tokenizer="bpe", vocab_size=290, block_size=16,
                           tokenizer_file=str(file), cache_dir=str(tmp_path / "cache2"),
                           **HALF)  # fmt: skip
    again.setup()
    assert np.array_equal(again.tokens["val"], dm.tokens["val"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (dict(vocab_size=70000, tokenizer="bpe", token_dtype="uint16"),
         "data.token_dtype=uint16: the vocabulary of 70000 tokens does not fit"),
        (dict(vocab_size=512), "vocab_size=512: the byte tokenizer has 256 symbols"),
        (dict(tokenizer="bpe", vocab_size=200), "vocab_size=200: expected an int >= 256"),
        (dict(tokenizer="bpe", vocab_size=256), "vocab_size=256: a byte-level BPE has the 256"),
    ],
)  # fmt: skip
def test_bad_settings_are_refused_when_built(args: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        TextDataModule(**args)


@pytest.mark.parametrize("key", ["input_mean", "input_std"])
def test_normalising_token_ids_is_refused_not_dropped(key: str) -> None:
    # +model.input_mean=0.5 was accepted and silently dropped
    from fasttrain.models.language_model import LanguageModel
    from fasttrain.models.nets.gpt import GPT

    with pytest.raises(UserError, match=rf"{key}=0.5: a language model's inputs are token ids"):
        LanguageModel(GPT(vocab_size=256, block_size=8, n_layer=1, n_head=1, n_embd=8), None,
                      **{key: 0.5})  # fmt: skip


def run_refused(tmp_path: Path, *overrides: str) -> str:
    proc = run_cli(["train.py", *SMALL, *overrides], tmp_path / "logs", timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    # One error line, the last (Lightning's "Seed set to" info may come first), no traceback.
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr and len(lines) <= 2, proc.stderr
    runs = tmp_path / "logs" / "train"
    assert not runs.exists() or not any(runs.iterdir())  # no run folder left behind
    return lines[-1]


@pytest.mark.parametrize(
    ("corpus", "overrides", "message"),
    [
        ("empty", [], "the corpus has no text: 1 files, none of them non-empty UTF-8"),
        ("missing", [], "no files found"),
        ("binary", [], "none of them non-empty UTF-8 text"),
        ("text", ["data.block_size=4096", "model.net.n_embd=32"], "data.block_size=4096: the "),
        ("text", ["data.tokenizer=bpe", "data.vocab_size=290", "data.tokenizer_file=nope.json"],
         "data.tokenizer_file='nope.json': no such file"),
    ],
)  # fmt: skip
def test_bad_corpus_one_line_exit_2_nothing_written(
    corpus: str, overrides: list[str], message: str, tmp_path: Path
) -> None:
    path = tmp_path / "corpus"
    if corpus == "empty":
        path.mkdir()
        (path / "a.txt").write_text("")
    elif corpus == "binary":
        path.mkdir()
        (path / "a.bin").write_bytes(b"\xff\xfe\x00")
    elif corpus == "text":
        write_corpus(path, files=12, lines=5)
    line = run_refused(tmp_path, f"data.path={path}", f"data.cache_dir={tmp_path}/cache",
                       *overrides)  # fmt: skip
    assert message in line
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


@pytest.fixture(scope="module")
def trained_lm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(root, best checkpoint) of one short run on a small corpus."""
    root = tmp_path_factory.mktemp("lm")
    corpus = write_corpus(root / "corpus")
    proc = run_cli(["train.py", *SMALL, f"data.path={corpus}", "run_name=lm",
                    f"data.cache_dir={root}/cache", "callbacks.perf.peak_tflops=1"],
                   root / "logs", timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (root / "train_stdout.txt").write_text(proc.stdout)  # the commands it printed
    record = json.loads((root / "logs" / "train" / "lm" / "metrics.json").read_text())
    return root, Path(record["checkpoint"])


def printed_command(root: Path, name: str) -> list[str]:
    """The words of the `name` command the run printed (e.g. evaluate), without the python."""
    lines = (root / "train_stdout.txt").read_text().splitlines()
    line = next(line for line in lines if line.split(" ", 1)[0] == name)
    return shlex.split(line.split(" ", 1)[1])[1:]


def test_a_short_run_logs_bpb_tokens_per_sec_and_mfu(trained_lm: tuple[Path, Path]) -> None:
    root, ckpt = trained_lm
    run = root / "logs" / "train" / "lm"
    # The run folder keeps the tokenizer the checkpoint holds (for data.tokenizer_file=).
    record = torch.load(ckpt, weights_only=True)["tokenizer"]
    assert (run / "tokenizer.json").read_text() == record
    metrics = json.loads((run / "metrics.json").read_text())["metrics"]
    # bytes: one token a byte, so bits per byte are nats per token / ln 2
    assert metrics["test/bpb"] == pytest.approx(metrics["test/loss"] / np.log(2), rel=1e-5)
    assert metrics["test/ppl"] == pytest.approx(np.exp(metrics["test/loss"]), rel=1e-5)
    perf = json.loads((run / "perf_summary.json").read_text())
    assert perf["tokens_per_sec"] == pytest.approx(perf["samples_per_sec"] * 32, rel=1e-6)
    net = GPT(vocab_size=256, block_size=32, n_layer=1, n_head=2, n_embd=32)
    assert perf["flops_per_sample"] == net.flops_per_token(32) * 32
    assert 0 < perf["mfu"] < 1  # against the stated 1 TFLOP/s


@pytest.mark.slow  # three predict processes (~20 s): CI runs it in make test-slow
def test_predict_generates_the_same_text_for_a_seed(trained_lm: tuple[Path, Path]) -> None:
    root, ckpt = trained_lm
    texts = []
    for run, cache in (("a", "true"), ("b", "false")):
        proc = run_cli(["-m", "fasttrain.predict", f"ckpt_path={ckpt}", "prompt='def '",
                        "max_new_tokens=40", "seed=0", f"kv_cache={cache}", f"run_name={run}"],
                       root / "logs", timeout=300)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        texts.append((root / "logs" / "predict" / run / "generation.txt").read_bytes())
    assert texts[0] == texts[1] and texts[0].startswith(b"def ")
    long = "x = 1\n" * 40  # 240 tokens, the context is 32: cut from the left, said once
    proc = run_cli(["-m", "fasttrain.predict", f"ckpt_path={ckpt}", f"prompt='{long}'",
                    "max_new_tokens=3", "run_name=c"], root / "logs", timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("longer than the model's context of 32; kept the last 31") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["prompt=''"], "prompt='': expected some text"),
        (["prompt=x", "max_new_tokens=0"], "max_new_tokens=0: expected an int >= 1"),
        (["prompt=x", "top_k=0"], "top_k=0: expected an int >= 1"),
    ],
)
def test_bad_generation_settings(
    args: list[str], message: str, trained_lm: tuple[Path, Path], tmp_path: Path
) -> None:
    _, ckpt = trained_lm
    proc = run_cli(["-m", "fasttrain.predict", f"ckpt_path={ckpt}", *args], tmp_path / "logs",
                   timeout=300)  # fmt: skip
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "logs" / "predict").exists() or not any(
        (tmp_path / "logs" / "predict").rglob("generation.txt"))  # fmt: skip


def test_evaluate_refuses_another_runs_tokenizer(trained_lm: tuple[Path, Path],
                                                 tmp_path: Path) -> None:  # fmt: skip
    pytest.importorskip("tokenizers", reason="BPE needs tokenizers: pip install -e '.[text]'")
    root, ckpt = trained_lm
    other = TextDataModule(str(root / "corpus"), tokenizer="bpe", vocab_size=290,
                           block_size=16, cache_dir=str(tmp_path / "c"), **HALF)  # fmt: skip
    file = tmp_path / "tokenizer.json"
    file.write_text(other.tokenizer_record())
    proc = run_cli(["-m", "fasttrain.evaluate", f"ckpt_path={ckpt}", "data=text",
                    f"data.tokenizer_file={file}"], tmp_path / "logs", timeout=300)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "not the tokenizer this checkpoint was trained with" in proc.stderr


def test_export_takes_any_length_up_to_the_context(trained_lm: tuple[Path, Path],
                                                   tmp_path: Path) -> None:  # fmt: skip
    root, ckpt = trained_lm
    formats = "onnx" if _has("onnx", "onnxruntime", "onnxscript") else "torchscript"
    proc = run_cli(["-m", "fasttrain.export", f"ckpt_path={ckpt}", f"format={formats}",
                    f"output_dir={tmp_path}/x", "latency_time=0.01"], root / "logs",
                   timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    from fasttrain.checkpoints.load import load_task

    model, _ = load_task(ckpt)
    idx = torch.randint(0, 256, (3, 11))  # another batch and length than the example's
    expected = model(idx).detach()
    if formats == "onnx":
        import onnxruntime as ort

        session = ort.InferenceSession(str(tmp_path / "x" / "model.onnx"))
        got = torch.from_numpy(session.run(None, {"input": idx.numpy()})[0])
    else:
        got = torch.jit.load(tmp_path / "x" / "model.ts")(idx)
    assert got.shape == (3, 11, 256)
    assert torch.allclose(got, expected, atol=1e-4)


def _has(*modules: str) -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in modules)


def test_weight_decay_on_matrices_only() -> None:
    net = GPT(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16, bias=True)
    decayed, plain = LanguageModel(net, None, vocab_size=50, weight_decay=0.1).param_groups()
    assert all(p.dim() >= 2 for p in decayed["params"]) and decayed["weight_decay"] == 0.1
    assert all(p.dim() < 2 for p in plain["params"]) and plain["weight_decay"] == 0.0
    counted = sum(p.numel() for g in (decayed, plain) for p in g["params"])
    assert counted == sum(p.numel() for p in net.parameters())  # tied weights once


@pytest.mark.slow  # ~2 min of training on 2 CPU cores
def test_the_tiny_gpt_beats_the_bigram_model_on_the_default_corpus(tmp_path: Path) -> None:
    """The default command, 4 epochs (512 steps of 32 x 128 bytes, ~2 min on 2 CPU cores): test
    bits per byte below the test split's bigram entropy under the training split's counts
    (~3.57 for Python 3.11's standard library)."""
    from fasttrain.data.corpus import bigram_bits_per_byte

    proc = run_cli(["train.py", "model=gpt", "data=text", "trainer.max_epochs=4", "run_name=lm",
                    f"paths.root_dir={tmp_path}"], tmp_path / "logs", timeout=1200)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "logs" / "train" / "lm" / "metrics.json").read_text())
    (folder,) = (tmp_path / "data" / "text").iterdir()  # the run's memmaps: byte tokens
    split = {s: np.fromfile(folder / f"{s}.bin", dtype=np.uint16).astype(np.uint8).tobytes()
             for s in ("train", "test")}  # fmt: skip
    bigram = bigram_bits_per_byte(split["train"], split["test"])
    assert 3.0 < bigram < 4.5  # the baseline is what it should be for source code
    assert metrics["metrics"]["test/bpb"] < bigram, (metrics["metrics"]["test/bpb"], bigram)


def test_fsdp_shards_each_block_and_checkpoints_them_when_asked() -> None:
    from fasttrain.assemble import fsdp_wrapping
    from fasttrain.models.nets.gpt import Block

    net = GPT(vocab_size=64, block_size=16, n_layer=3, n_head=2, n_embd=16,
              activation_checkpointing=True)  # fmt: skip
    model = LanguageModel(net, None, vocab_size=64)
    strategy = fsdp_wrapping("fsdp", model)["strategy"]
    wrapped = strategy.kwargs["auto_wrap_policy"]._run_policy(net, set(), {})
    assert list(wrapped) == list(net.blocks)  # every block its own unit, nothing else
    assert strategy._activation_checkpointing_kwargs["auto_wrap_policy"]._module_classes == {Block}
    assert fsdp_wrapping("ddp", model) == {}  # other strategies: as configured


def test_windows_on_the_device_are_the_host_windows(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    batches = []
    for on_device in (False, True):
        dm = TextDataModule(str(corpus), block_size=16, batch_size=4, windows_per_epoch=12,
                            cache_dir=str(tmp_path / "cache"), on_device=on_device,
                            **HALF)  # fmt: skip
        batches.append([b for b in dm.train_dataloader()] + [b for b in dm.val_dataloader()])
    assert len(batches[0]) == len(batches[1]) > 3
    for (x0, y0), (x1, y1) in zip(*batches, strict=True):
        assert torch.equal(x0, x1) and torch.equal(y0, y1)


def test_a_loader_resumed_mid_epoch_serves_the_windows_it_had_left(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    dm = TextDataModule(str(corpus), block_size=16, batch_size=4, windows_per_epoch=40,
                        cache_dir=str(tmp_path / "cache"), **HALF)  # fmt: skip
    whole = [x for x, _ in dm.train_dataloader()]
    loader = dm.train_dataloader()
    served = iter(loader)
    for _ in range(4):
        next(served)
    state = loader.state_dict()  # what Lightning stores in a mid-epoch checkpoint
    resumed = dm.train_dataloader()
    resumed.load_state_dict(state)
    rest = [x for x, _ in resumed]
    assert len(rest) == len(whole) - 4
    assert all(torch.equal(a, b) for a, b in zip(rest, whole[4:], strict=True))


def learning_run(tmp_path: Path, name: str, *overrides: str) -> Path:
    """The run folder of 20 learning steps (LEARNS) on a small corpus with `overrides`."""
    corpus = write_corpus(tmp_path / "corpus")
    proc = run_cli(["train.py", *SMALL, *LEARNS, f"data.path={corpus}", *overrides,
                    f"data.cache_dir={tmp_path}/cache", f"run_name={name}"], tmp_path / "logs",
                   timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp_path / "logs" / "train" / name


def final_test_loss(run: Path) -> float:
    return json.loads((run / "metrics.json").read_text())["metrics"]["test/loss"]


def test_bf16_mixed_trains_the_language_model(tmp_path: Path) -> None:
    run = learning_run(tmp_path, "bf16", "trainer.precision=bf16-mixed")
    assert final_test_loss(run) < 3.5  # from ln 256 = 5.55: it learned


@pytest.mark.slow  # torch.compile on a CPU: ~1 min of compiling
def test_compiled_language_model_trains(tmp_path: Path) -> None:
    run = learning_run(tmp_path, "compiled", "model.compile=true")
    assert final_test_loss(run) < 3.5  # from ln 256 = 5.55: it learned


def test_activation_checkpointing_gives_the_same_gradients() -> None:
    torch.manual_seed(0)
    plain = GPT(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0)
    recomputed = GPT(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=16,
                     activation_checkpointing=True)  # fmt: skip
    recomputed.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 40, (3, 16))
    for net in (plain, recomputed):
        net.train()
        net(idx).square().mean().backward()
    for a, b in zip(plain.parameters(), recomputed.parameters(), strict=True):
        assert a.grad is not None and torch.allclose(a.grad, b.grad, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpt_trains_on_cuda_in_bf16_with_windows_on_the_device(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    proc = run_cli(["train.py", *SMALL, *LEARNS, f"data.path={corpus}", "trainer=gpu",
                    "trainer.precision=bf16-mixed", "data.on_device=true", "model.compile=true",
                    f"data.cache_dir={tmp_path}/cache", "run_name=cuda"], tmp_path / "logs",
                   timeout=600,  # run_cli hides the GPUs unless told: this run needs one
                   CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "logs" / "train" / "cuda"
    assert json.loads((run / "metrics.json").read_text())["metrics"]["test/loss"] < 3.5
    assert json.loads((run / "perf_summary.json").read_text())["tokens_per_sec"] > 0


def test_evaluate_reads_the_memmaps_the_run_wrote(trained_lm: tuple[Path, Path]) -> None:
    root, _ = trained_lm
    before = sorted(p.name for p in (root / "cache").iterdir())
    # As printed: the locations the run was given come with it (never from the checkpoint).
    command = printed_command(root, "evaluate")
    assert command[:2] == ["-m", "fasttrain.evaluate"] and command[2].startswith("ckpt_path=")
    assert f"data.path={root / 'corpus'}" in command and "data=text" in command
    proc = run_cli([*command, "run_name=ev"], root / "logs", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(p.name for p in (root / "cache").iterdir()) == before  # nothing tokenized again
    record = json.loads((root / "logs" / "eval" / "ev" / "metrics.json").read_text())
    trained = json.loads((root / "logs" / "train" / "lm" / "metrics.json").read_text())
    assert record["metrics"]["test/bpb"] == pytest.approx(trained["metrics"]["test/bpb"], rel=1e-5)


def test_prepare_writes_the_memmaps_training_then_reads(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    cache = f"data.cache_dir={tmp_path}/cache"
    data = [f"data.path={corpus}", "data.val_fraction=0.2", "data.test_fraction=0.2",
            "data.block_size=32"]  # fmt: skip
    proc = run_cli(["-m", "fasttrain.prepare", "data=text", cache, *data], tmp_path / "logs")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (folder,) = (tmp_path / "cache").iterdir()
    stamp = (folder / "train.bin").stat().st_mtime_ns
    proc = run_cli(["train.py", *SMALL, cache, *data, "run_name=p"], tmp_path / "logs")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [folder.name]
    assert (folder / "train.bin").stat().st_mtime_ns == stamp  # read, not written again


def test_a_python_without_its_sources_says_to_set_data_path(tmp_path: Path, monkeypatch) -> None:
    import sysconfig

    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    message = r"standard library sources are not installed .* set data\.path"
    with pytest.raises(UserError, match=message):
        TextDataModule(cache_dir=str(tmp_path / "cache")).token_folder()


def test_ema_averages_the_language_model(tmp_path: Path) -> None:
    run = learning_run(tmp_path, "ema", "callbacks/averaging=ema")
    # Tested with the averaged weights: after 20 steps of a 0.999 average, still near the start.
    assert np.isfinite(final_test_loss(run))
    ckpt = torch.load(next((run / "checkpoints").glob("epoch*.ckpt")), weights_only=True)
    assert any("ema" in key.lower() for key in ckpt.get("callbacks", {})), list(ckpt)


def test_a_checkpoint_never_chooses_where_data_is_read_or_written(
    trained_lm: tuple[Path, Path], tmp_path: Path, monkeypatch
) -> None:
    """A checkpoint whose data spec names a folder to read (path=/etc) and one to write
    (cache_dir=...) gets neither: locations are this command line's and conf/'s. Stopped just
    before the data module is built (what it would read and write is then fixed)."""
    from fasttrain import assemble
    from fasttrain.assemble import restore as restoring

    _, ckpt = trained_lm
    crafted = torch.load(ckpt, weights_only=True)
    evil = tmp_path / "evil_cache"
    crafted["datamodule_hyper_parameters"].update(path="/etc", cache_dir=str(evil))
    torch.save(crafted, tmp_path / "crafted.ckpt")
    seen: dict[str, object] = {}

    def stop(node, where, **kwargs):
        if where == "data":
            seen.update(path=node.path, cache_dir=node.cache_dir)
            raise RuntimeError("stop")
        return build(node, where, **kwargs)

    build = assemble.build
    monkeypatch.setattr(assemble, "build", stop)
    from hydra import compose, initialize_config_dir

    from conftest import CONF

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("eval", [f"ckpt_path={tmp_path / 'crafted.ckpt'}", "data=text",
                               f"paths.root_dir={tmp_path}",
                               f"paths.output_dir={tmp_path}/run"])  # fmt: skip
    with pytest.raises(RuntimeError, match="stop"):
        restoring.restore(cfg)
    assert seen == {"path": None, "cache_dir": f"{tmp_path}/data/text"}  # conf/'s, not its
    assert not evil.exists()
