"""model=gpt_modern: the GPT class with the modern recipe (rotary positions, RMSNorm, QK-norm,
ReLU^2, untied embeddings, a logit soft cap) and Muon for the hidden matrices with AdamW for the
rest. Each piece switches alone; the default GPT keeps its parameters; cached generation, export,
activation checkpointing, the sync-free step and resume work with it; bad input is one line, exit
code 2, nothing written."""

from __future__ import annotations

import copy
import functools
import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir
from test_bad_input import _fresh_log_streams, assert_nothing_written, assert_one_error_line
from test_language_model import SMALL, write_corpus
from test_resume import assert_same, weights
from torch import nn

from conftest import CONF, REPO, run_cli
from fasttrain.models.language_model import LanguageModel
from fasttrain.models.muon import MuonWithAdamW, hidden_matrices, mark_hidden_matrices
from fasttrain.models.nets.gpt import GPT
from fasttrain.models.nets.gpt_blocks import RMSNorm, capped_logits
from fasttrain.models.schedules import WarmupCosine

__all__ = ["_fresh_log_streams"]  # autouse: in-process runs log to this test's stderr

MODERN = dict(pos="rope", norm="rms", qk_norm=True, mlp="relu2", tie_embeddings=False,
              softcap=15.0)  # fmt: skip
GPT2 = dict(pos="learned", norm="layer", qk_norm=False, mlp="gelu", tie_embeddings=True,
            softcap=None)  # fmt: skip
TINY = dict(vocab_size=50, block_size=24, n_layer=2, n_head=2, n_embd=16)
# 20 deterministic steps of a 1-layer model=gpt_modern on a small corpus (SMALL of the language
# model's tests), last.ckpt every 3 steps; AdamW's lr high enough for 20 steps to learn.
RUN = [*(o for o in SMALL if o != "model=gpt"), "model=gpt_modern",
       "data.windows_per_epoch=160", "model.scheduler.warmup_steps=0",
       "model.optimizer.adamw_lr=0.01", "trainer.deterministic=true",
       "trainer.log_every_n_steps=2", "callbacks.checkpoint.every_n_train_steps=3",
       "callbacks.progress_bar=null", "test=false",
       "+trainer.enable_model_summary=false"]  # fmt: skip
TESTS_DIR = str(Path(__file__).parent)


def recipe_of(net: GPT) -> dict:
    """The recipe a net was built with, read from its modules (not from its arguments)."""
    return {
        "pos": "learned" if net.wpe is not None else "rope",
        "norm": "rms" if isinstance(net.ln_f, nn.RMSNorm) else "layer",
        "qk_norm": net.blocks[0].attn.q_norm is not None,
        "mlp": net.blocks[0].mlp.kind,
        "tie_embeddings": net.lm_head.weight is net.wte.weight,
        "softcap": net.softcap,
    }


def test_the_default_gpt_keeps_its_parameters() -> None:
    net = GPT(**TINY)
    assert recipe_of(net) == GPT2
    per_block = ["ln_1.weight", "attn.qkv.weight", "attn.proj.weight", "ln_2.weight",
                 "mlp.fc.weight", "mlp.proj.weight"]  # fmt: skip
    blocks = [f"blocks.{i}.{name}" for i in range(2) for name in per_block]
    assert list(net.state_dict()) == ["wte.weight", "wpe.weight", *blocks, "ln_f.weight",
                                      "lm_head.weight"]  # fmt: skip


@pytest.mark.parametrize("piece", list(MODERN))
def test_each_piece_switches_alone_by_override(piece: str) -> None:
    from fasttrain.assemble import build

    def net_of(*overrides: str) -> GPT:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("train", overrides=["data=text", *overrides])
        return build(cfg.model.net, "model.net")

    off = "null" if GPT2[piece] is None else str(GPT2[piece]).lower()
    on = str(MODERN[piece]).lower()
    assert recipe_of(net_of("model=gpt_modern")) == MODERN
    assert recipe_of(net_of("model=gpt_modern", f"model.net.{piece}={off}")) == {
        **MODERN, piece: GPT2[piece]}  # fmt: skip
    assert recipe_of(net_of("model=gpt", f"+model.net.{piece}={on}")) == {
        **GPT2, piece: MODERN[piece]}  # fmt: skip


def test_each_piece_changes_what_the_net_computes() -> None:
    idx = torch.randint(0, 50, (2, 24))
    torch.manual_seed(0)
    plain = GPT(**TINY).eval()
    for piece, value in MODERN.items():
        torch.manual_seed(0)
        net = GPT(**TINY, **{piece: value}).eval()
        net.load_state_dict(plain.state_dict(), strict=False)  # the weights both have
        if piece == "tie_embeddings":  # loaded, the two matrices are equal: move one
            with torch.no_grad():
                net.wte.weight.add_(1.0)
        assert not torch.allclose(net(idx), plain(idx)), piece
    untied = GPT(**TINY, tie_embeddings=False)
    assert untied.num_params(embeddings=True) == plain.num_params(embeddings=True) + 50 * 16
    assert untied.num_params() == plain.num_params()  # the matmuls a token goes through
    capped = GPT(**TINY, softcap=0.5).eval()
    assert capped(idx).abs().max() < 0.5  # within +-softcap


def test_relu2_mlp_is_relu_squared() -> None:
    net = GPT(**TINY, mlp="relu2")
    mlp, x = net.blocks[0].mlp, torch.randn(2, 5, 16)
    assert torch.equal(mlp(x), mlp.proj(torch.relu(mlp.fc(x)) ** 2))


def test_the_written_out_backwards_give_autograds_gradients() -> None:
    # RMSNorm and ReLU^2 train through their own backward on a CPU in float32 (gpt_blocks): a
    # slip there trains wrong without an error. The queries' rows are a strided view of qkv.
    torch.manual_seed(0)
    norm, relu2 = RMSNorm(8), GPT(**TINY, mlp="relu2").blocks[0].mlp
    norm.weight.data.uniform_(0.5, 1.5)
    qkv = torch.randn(3, 5, 3 * 2 * 8, requires_grad=True)
    q = qkv.split(16, dim=2)[0].view(3, 5, 2, 8)
    grad = torch.randn(3, 5, 2, 8)
    norm(q).backward(grad)
    ours = (qkv.grad.clone(), norm.weight.grad.clone())
    qkv.grad = norm.weight.grad = None
    eps = torch.finfo(torch.float32).eps
    torch.nn.functional.rms_norm(q, (8,), norm.weight, eps).backward(grad)
    assert torch.allclose(ours[0], qkv.grad, atol=1e-5)
    assert torch.allclose(ours[1], norm.weight.grad, atol=1e-5)
    h = torch.randn(4, 7, 64, requires_grad=True)
    relu2.fc = nn.Identity()  # the activation alone: h -> proj(relu(h)^2)
    relu2(h).sum().backward()
    hand = h.grad.clone()
    h.grad = None
    relu2.proj(torch.relu(h) ** 2).sum().backward()
    assert torch.equal(hand, h.grad)


def test_the_cpu_soft_cap_is_tanhs() -> None:
    x = torch.linspace(-20, 20, 4001).view(-1, 1) * torch.tensor([[1.0, -0.5]])
    head = nn.Linear(2, 3, bias=False)
    with torch.no_grad():  # logits -200..200 and 0
        head.weight.copy_(torch.tensor([[10.0, 0.0], [0.5, 3.0], [0.0, 0.0]]))
    capped = capped_logits(x, head, 15.0)
    assert torch.allclose(capped, 15 * torch.tanh(head(x) / 15), atol=1e-5)
    assert capped.abs().max() <= 15.0
    # the bf16 path (tanh) gives the same function
    low = capped_logits(x.bfloat16(), head.bfloat16(), 15.0).float()
    assert torch.allclose(low, capped, atol=0.15)


def test_an_int8_head_is_capped_too() -> None:
    """format=int8 export quantizes the Linear layers: the head then has no float weight to fold
    1/cap into, and the capped logits come from its own int8 kernel, traced as export does."""
    torch.manual_seed(0)
    net = GPT(**TINY, dropout=0.0, bias=False, **MODERN).eval()
    idx = torch.randint(0, TINY["vocab_size"], (2, TINY["block_size"]))
    quantized = torch.ao.quantization.quantize_dynamic(copy.deepcopy(net), {nn.Linear},
                                                       dtype=torch.qint8)  # fmt: skip
    assert type(quantized.lm_head) is not nn.Linear
    with torch.no_grad():
        expected, got = net(idx), torch.jit.trace(quantized, idx)(idx)
    assert got.abs().max() <= MODERN["softcap"]
    assert torch.allclose(got, expected, atol=0.05)


def test_newton_schulz_on_the_small_gram_matrix_is_the_plain_loops() -> None:
    """Wide matrices (cols >= 2 rows) run the steps on rows x rows matrices: the same values as
    the plain loop (to float32 rounding), even on an ill-conditioned gradient."""
    from fasttrain.models import muon

    def plain(grad: torch.Tensor) -> torch.Tensor:  # the loop of torch.optim.Muon, in float64
        a, b, c = (3.4445, -4.775, 2.0315)
        x = grad.double().T if grad.size(0) > grad.size(1) else grad.double()
        x = x / x.norm().clamp(min=1e-7)
        for _ in range(5):
            gram = x @ x.T
            x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
        return x.T if grad.size(0) > grad.size(1) else x

    gen = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(384, 96, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(96, 96, generator=gen, dtype=torch.float64))
    ill = ((u * torch.logspace(0, -6, 96, dtype=torch.float64)) @ v.T).float()  # [384, 96]
    for grad in (torch.randn(96, 256, generator=gen), ill, torch.zeros(64, 128)):
        ours = muon._float32_newton_schulz(grad, (3.4445, -4.775, 2.0315), 5, 1e-7)
        assert ours.shape == grad.shape and ours.dtype == torch.float32
        want = plain(grad)
        assert (ours.double() - want).norm() <= 5e-4 * max(want.norm().item(), 1e-30)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_cached_generation_with_rope_gives_the_tokens_of_uncached(temperature: float) -> None:
    torch.manual_seed(0)
    model = LanguageModel(GPT(**{**TINY, "block_size": 48}, **MODERN), None, vocab_size=50).eval()
    prompt = torch.randint(0, 50, (1, 7))
    runs = [
        model.generate(prompt, 30, temperature, 10, torch.Generator().manual_seed(3), cached=c)
        for c in (True, False)
    ]
    assert torch.equal(runs[0], runs[1]) and runs[0].shape == (1, 37)


def test_each_cached_position_has_the_full_forwards_logits() -> None:
    # The keys kept in the cache were turned at their own positions; the new token at its own.
    torch.manual_seed(0)
    net = GPT(**TINY, **MODERN).eval()
    idx = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        full = net(idx)  # [2, 12, 50]
        logits, cache = net.forward_cached(idx[:, :5], None)
        stepped = [logits]
        for t in range(5, 12):
            logits, cache = net.forward_cached(idx[:, t : t + 1], cache)
            stepped.append(logits)
    assert torch.allclose(torch.stack(stepped, dim=1), full[:, 4:], atol=1e-5)


def test_activation_checkpointing_gives_the_same_gradients() -> None:
    torch.manual_seed(0)
    plain = GPT(**TINY, **MODERN)
    recomputed = GPT(**TINY, **MODERN, activation_checkpointing=True)
    recomputed.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 50, (3, 24))
    for net in (plain, recomputed):
        net(idx).square().mean().backward()
    for a, b in zip(plain.parameters(), recomputed.parameters(), strict=True):
        assert a.grad is not None and torch.allclose(a.grad, b.grad, atol=1e-6)


def muon_factory(**kwargs) -> functools.partial:
    return functools.partial(MuonWithAdamW, lr=0.02, adamw_lr=0.003, **kwargs)


def test_muon_takes_exactly_the_hidden_matrices() -> None:
    net = GPT(**TINY, **MODERN, bias=True)
    model = LanguageModel(net, muon_factory(), vocab_size=50, weight_decay=0.1)
    optimizer = MuonWithAdamW(mark_hidden_matrices(model.param_groups(), net), lr=0.02,
                              adamw_lr=0.003)  # fmt: skip
    names = {id(p): n for n, p in net.named_parameters()}
    by_muon = {g["muon"]: [names[id(p)] for p in g["params"]] for g in optimizer.param_groups
               if g["muon"] or g["weight_decay"]}  # fmt: skip
    matrices = ("attn.qkv.weight", "attn.proj.weight", "mlp.fc.weight", "mlp.proj.weight")
    assert sorted(by_muon[True]) == sorted(f"blocks.{i}.{m}" for i in range(2) for m in matrices)
    assert sorted(by_muon[False]) == ["lm_head.weight", "wte.weight"]  # decayed, by AdamW
    assert [g["lr"] for g in optimizer.param_groups] == [0.02, 0.003, 0.003]
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.1, 0.0]
    seen = [p for g in optimizer.param_groups for p in g["params"]]
    assert len(seen) == len({id(p) for p in seen}) == len(list(net.parameters()))
    # Tied (GPT-2's): the output layer is the embedding, never Muon's.
    tied = GPT(**TINY)
    assert {id(p) for p in hidden_matrices(tied)} == {
        id(p) for n, p in tied.named_parameters() if n.startswith("blocks.") and p.dim() == 2
    }
    # An MLP: every Linear but the output layer.
    from fasttrain.models.nets import MLP, SmallCNN

    mlp = MLP(input_shape=[8], num_classes=3, hidden=[16, 16])
    assert [p.shape for p in hidden_matrices(mlp)] == [(16, 8), (16, 16)]
    assert hidden_matrices(SmallCNN(input_shape=[1, 8, 8], num_classes=3)) == []


def train_steps(optimizer: torch.optim.Optimizer, net: GPT, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, 50, (4, 24), generator=gen)
        optimizer.zero_grad()
        nn.functional.cross_entropy(net(idx).flatten(0, 1), idx.roll(-1, 1).flatten()).backward()
        optimizer.step()


def test_muon_orthogonalises_in_float32_where_the_cpu_emulates_bf16(monkeypatch) -> None:
    import torch.optim._muon as torch_muon

    from fasttrain.models import muon

    torch_own = torch_muon._zeropower_via_newtonschulz
    grad = torch.randn(48, 16, generator=torch.Generator().manual_seed(0))
    coefficients = (3.4445, -4.775, 2.0315)  # torch.optim.Muon's defaults
    ours = muon._float32_newton_schulz(grad, coefficients, 5, 1e-7)
    bf16 = torch_own(grad, coefficients, 5, 1e-7).float()
    assert ours.dtype == torch.float32 and ours.shape == grad.shape
    assert 1e-4 < ((ours - bf16).norm() / ours.norm()).item() < 0.05  # torch's, but for bf16
    # A CPU without bf16 products: torch.optim.Muon's step calls ours, once a hidden matrix
    # (it fails here if torch no longer looks its orthogonalisation up in torch.optim._muon).
    seen: list[torch.Size] = []
    real = muon._float32_newton_schulz

    def counted(g: torch.Tensor, *args: Any) -> torch.Tensor:
        seen.append(g.shape)
        return real(g, *args)

    monkeypatch.setattr(muon, "_cpu_multiplies_bf16_fast", lambda: False)
    monkeypatch.setattr(muon, "_float32_newton_schulz", counted)
    torch.manual_seed(0)
    net = GPT(**TINY, **MODERN)
    groups = mark_hidden_matrices(LanguageModel(net, None, vocab_size=50).param_groups(), net)
    train_steps(muon_factory()(groups), net, 1, seed=1)
    assert sorted(seen) == sorted(p.shape for p in hidden_matrices(net))
    assert torch_muon._zeropower_via_newtonschulz is torch_own  # put back after the step


def test_muon_state_resumes_exactly_and_a_schedule_scales_every_group() -> None:
    def fresh() -> tuple[GPT, MuonWithAdamW]:
        torch.manual_seed(0)
        net = GPT(**TINY, **MODERN)
        groups = mark_hidden_matrices(LanguageModel(net, None, vocab_size=50).param_groups(), net)
        return net, muon_factory(fused=True)(groups)

    net, optimizer = fresh()
    train_steps(optimizer, net, 3, seed=1)
    # copies: a state_dict holds the very tensors the next steps update in place
    saved_net, saved = copy.deepcopy(net.state_dict()), copy.deepcopy(optimizer.state_dict())
    train_steps(optimizer, net, 2, seed=2)
    again, resumed = fresh()
    again.load_state_dict(saved_net)
    resumed.load_state_dict(saved)
    assert resumed.muon.param_groups[0] is resumed.param_groups[0]  # the inner ones follow
    assert resumed.muon.state is resumed.state is resumed.adamw.state
    train_steps(resumed, again, 2, seed=2)
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), again.parameters(), strict=True))
    schedule = WarmupCosine(resumed, total_steps=10, warmup_steps=4)
    assert [g["lr"] for g in resumed.param_groups] == pytest.approx(
        [0.02 / 5, 0.003 / 5, 0.003 / 5]
    )
    schedule.step()
    assert resumed.muon.param_groups[0]["lr"] == pytest.approx(0.02 * 2 / 5)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus")


def overrides_for(root: Path, corpus: Path, *extra: str) -> list[str]:
    return [*RUN, f"data.path={corpus}", f"data.cache_dir={root}/cache", *extra]


def train_in_process(root: Path, corpus: Path, name: str, *extra: str) -> Path:
    from fasttrain.tasks import train

    run = root / "logs" / "train" / name
    overrides = overrides_for(root, corpus, f"paths.root_dir={root}", f"paths.log_dir={root}/logs",
                              f"paths.output_dir={run}", f"run_name={name}", *extra)  # fmt: skip
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        train(compose("train", overrides=overrides))
    return run


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> tuple[Path, Path]:
    """(root, run folder) of the uninterrupted 20-step run of model=gpt_modern with Muon."""
    root = tmp_path_factory.mktemp("modern")
    return root, train_in_process(root, corpus, "ref")


def test_the_modern_recipe_trains_and_its_loss_falls(trained: tuple[Path, Path]) -> None:
    _, run = trained
    metrics = json.loads((run / "metrics.json").read_text())["metrics"]
    assert metrics["val/loss"] < 3.0  # from ln 256 = 5.55 in 20 steps
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    groups = ckpt["optimizer_states"][0]["param_groups"]
    assert [g["muon"] for g in groups] == [True, False, False]
    assert ckpt["hyper_parameters"]["net"]["pos"] == "rope"


def test_bf16_mixed_with_ema_trains_the_modern_recipe(corpus: Path, tmp_path: Path) -> None:
    run = train_in_process(tmp_path, corpus, "bf16", "trainer.precision=bf16-mixed",
                           "callbacks/averaging=ema", "trainer.deterministic=false")  # fmt: skip
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert any("ema" in key.lower() for key in ckpt["callbacks"]), list(ckpt["callbacks"])
    # Validated with the averaged weights (0.999 over 20 steps: near the start, finite)
    loss = json.loads((run / "metrics.json").read_text())["metrics"]["val/loss"]
    assert torch.isfinite(torch.tensor(loss))
    assert [g["muon"] for g in ckpt["optimizer_states"][0]["param_groups"]] == [True, False, False]


@pytest.mark.slow  # torch.compile on a CPU: ~1 min of compiling
def test_the_compiled_modern_recipe_trains(corpus: Path, tmp_path: Path) -> None:
    run = train_in_process(tmp_path, corpus, "compiled", "model.compile=true")
    assert json.loads((run / "metrics.json").read_text())["metrics"]["val/loss"] < 3.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_modern_recipe_trains_on_cuda_in_bf16_compiled(corpus: Path, tmp_path: Path) -> None:
    run = train_in_process(tmp_path, corpus, "cuda", "trainer=gpu", "trainer.precision=bf16-mixed",
                           "model.compile=true", "data.on_device=true",
                           "trainer.deterministic=false")  # fmt: skip
    assert json.loads((run / "metrics.json").read_text())["metrics"]["val/loss"] < 3.0


def test_fsdp_shards_each_modern_block() -> None:
    from fasttrain.assemble import fsdp_wrapping

    net = GPT(**TINY, **MODERN, activation_checkpointing=True)
    strategy = fsdp_wrapping("fsdp", LanguageModel(net, None, vocab_size=50))["strategy"]
    wrapped = strategy.kwargs["auto_wrap_policy"]._run_policy(net, set(), {})
    assert list(wrapped) == list(net.blocks)  # every block its own unit, nothing else


def test_a_killed_run_resumes_bit_exact(trained: tuple[Path, Path], corpus: Path,
                                        tmp_path: Path) -> None:  # fmt: skip
    _, reference = trained
    # SIGKILL at the end of step 8: last.ckpt is step 6's, so steps 7 and 8 are done again.
    proc = run_cli([str(REPO / "train.py"), *overrides_for(tmp_path, corpus), "run_name=run",
                    "+callbacks.killer._target_=killer.Killer", "+callbacks.killer.at_step=8"],
                   tmp_path / "logs", PYTHONPATH=TESTS_DIR)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert torch.load(tmp_path / "logs/train/run/checkpoints/last.ckpt")["global_step"] == 6
    resumed = train_in_process(tmp_path, corpus, "run")
    assert_same(weights(resumed), weights(reference))  # weights, Muon's and AdamW's moments


def test_export_matches_eager_at_any_length(trained: tuple[Path, Path], tmp_path: Path) -> None:
    from fasttrain.checkpoints.load import load_task
    from fasttrain.deploy.formats import OnnxExporter, TorchScriptExporter

    _, run = trained
    model, _ = load_task(run / "checkpoints" / "last.ckpt")
    module, _ = model.export_module()
    example = model.example_inputs(2, [32])
    idx = torch.randint(0, 256, (3, 11))  # another batch and length than the example's
    expected = model(idx).detach()
    exporters = [TorchScriptExporter()]
    if all(_importable(m) for m in OnnxExporter().requires()):
        exporters.append(OnnxExporter())
    for exporter in exporters:
        path = tmp_path / exporter.filename
        exporter.write(module, example, path, {})
        runner, _ = exporter.load(path, torch.device("cpu"))
        got = runner(idx)
        assert got.shape == (3, 11, 256), exporter.name
        assert torch.allclose(got, expected, atol=1e-4), exporter.name


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_the_step_makes_no_sync_with_muon(tmp_path: Path) -> None:
    from practices import build_run, compose_train
    from test_hot_path import CountPerStep

    cfg = compose_train(tmp_path, "trainer.accelerator=cpu", "trainer.devices=1",
                        "trainer.max_epochs=1", "test=false", "model=gpt_modern", "data=text",
                        "data.windows_per_epoch=640", "data.batch_size=32", "data.block_size=32",
                        "model.net.n_layer=1", "model.net.n_embd=32", quick=False)  # fmt: skip
    counter = CountPerStep(first=3)
    trainer, model, datamodule = build_run(cfg, callbacks=[counter])
    trainer.fit(model, datamodule=datamodule)
    last = trainer.num_training_batches - 1
    quiet = {i: c for i, c in counter.per_step.items() if i not in counter.logging and i != last}
    assert len(quiet) >= 10 and not any(quiet.values()), quiet


def run_main(entry: str, argv: list[str], log_dir: Path, monkeypatch, capsys) -> list[str]:
    """`python -m fasttrain.<entry> ...` in this process: exit code 2, the error lines."""
    import importlib

    main = importlib.import_module(f"fasttrain.{entry}").main
    monkeypatch.setattr(sys, "argv", [entry, *argv, f"paths.log_dir={log_dir}"])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2, err
    return err


# (overrides, substrings the error line must hold: the override, then what is valid)
BAD = [
    (["model/optimizer=muon"], ["model/optimizer=muon", "SmallCNN has none", "model/net=mlp"]),
    (["model=gpt_modern", "data=text", "model.net.n_embd=36", "model.net.n_head=4"],
     ["model.net.pos='rope'", "head size n_embd / n_head = 9 is odd", "model.net.pos=learned"]),
    (["model=gpt_modern", "data=text", "model.net.norm=batch"],
     ["model.net.norm='batch'", "'layer', 'rms'"]),
    (["model=gpt_modern", "data=text", "model.net.mlp=swiglu"],
     ["model.net.mlp='swiglu'", "'gelu'"]),
    (["model=gpt_modern", "data=text", "model.net.softcap=0"], ["model.net.softcap=0", "> 0"]),
    (["model=gpt_modern", "data=text", "model.optimizer.adamw_lr=0"],
     ["model.optimizer.adamw_lr=0", "learning rate > 0"]),
    (["model=gpt_modern", "data=text", "model.optimizer.momentum=-1"],
     ["model.optimizer.momentum=-1", ">= 0"]),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "expected"), BAD, ids=[" ".join(c[0]) for c in BAD])
def test_bad_input_is_one_line_exit_2_nothing_written(
    overrides: list[str], expected: list[str], tmp_path: Path, monkeypatch, capsys
) -> None:
    err = run_main("train", ["data.num_workers=0", *overrides], tmp_path / "logs", monkeypatch,
                   capsys)  # fmt: skip
    assert_one_error_line(err, expected)
    assert_nothing_written(tmp_path / "logs")


# A checkpoint of one recipe continued as another: `resume=` with the other model (shapes
# differ) or with one piece changed (no shape shows it).
OTHER_RECIPE = [
    (["model=gpt", "model/optimizer=muon"],  # the optimizer kept: only the net differs
     ["resume=", "different model", "net.wpe.weight", "resume=never"]),
    (["model.net.norm=layer"],
     ["resume=", "model.net.norm=layer differs from the checkpoint's model.net.norm=rms",
      "continue with model.net.norm=rms", "resume=never"]),
    (["model.net.softcap=null"], ["model.net.softcap=null", "model.net.softcap=15.0"]),
    (["model.net.mlp=gelu"], ["model.net.mlp=gelu", "model.net.mlp=relu2"]),
]  # fmt: skip


@pytest.mark.parametrize(("change", "expected"), OTHER_RECIPE, ids=[c[0][0] for c in OTHER_RECIPE])
def test_resuming_as_another_recipe_is_refused(
    change: list[str], expected: list[str], trained: tuple[Path, Path], corpus: Path,
    tmp_path: Path, monkeypatch, capsys,
) -> None:  # fmt: skip
    root, run = trained
    ckpt = run / "checkpoints" / "last.ckpt"
    argv = [*overrides_for(root, corpus), *change, f"resume={ckpt}", "run_name=other"]
    err = run_main("train", argv, tmp_path / "logs", monkeypatch, capsys)
    assert_one_error_line(err, expected)
    assert_nothing_written(tmp_path / "logs")


@pytest.mark.parametrize("change", ["+model=gpt", "+model.net.pos=learned"])
def test_evaluating_as_another_recipe_is_refused(
    change: str, trained: tuple[Path, Path], corpus: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    root, run = trained
    argv = [f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}", "data=text",
            f"data.path={corpus}", f"data.cache_dir={root}/cache", change]  # fmt: skip
    err = run_main("evaluate", argv, tmp_path / "logs", monkeypatch, capsys)
    assert_one_error_line(err, ["model: eval rebuilds the model the checkpoint holds",
                                "takes no model settings"])  # fmt: skip
    assert not (tmp_path / "logs" / "eval").exists() or not any(
        (tmp_path / "logs" / "eval").iterdir())  # fmt: skip
