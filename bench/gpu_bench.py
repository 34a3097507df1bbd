"""GPU throughput, AMP speedup, transformer MFU and data-wait share, through the template's own
override surface (composed from conf/, built by fasttrain.assemble), so the numbers are what a user
of `python train.py ...` gets.

    python bench/gpu_bench.py --out bench/results/gpu   # on a CUDA machine (bench/gpu_check.sh)
    python bench/gpu_bench.py --out /tmp/x --smoke      # tiny sizes, on CPU: proves it runs

Sections (each appended to gpu_results.json as it finishes, so a timeout keeps what was done):
  conv         ResNet-18 on GPU-resident synthetic 3x32x32 batches: images/s for fp32, tf32,
               16-mixed, bf16-mixed, each without/with channels_last, and compiled variants
  transformer  model=gpt model/net=gpt2_small (the template's own task) in bf16-mixed + compile:
               tokens/s and MFU against nanoGPT's hand-written loop on the same net and batches
  lm_recipes   model=gpt and model=gpt_modern (Muon) at gpt2_small's sizes, bf16-mixed + compile:
               tokens/s, MFU, and the modern recipe's cost per step against the default's
  data_wait    perf/data_wait_share of short `python train.py` runs on digits and synthetic
               data with the default loader, pin_memory/device_prefetch off and on
  recipe       experiment=cifar10_resnet18 on synthetic CIFAR-shaped data (data=synthetic):
               images/s of the recipe (bf16-mixed, channels_last, compile, data on the device)
               against the same run eager in fp32 with host data, through its data module,
               EMA and one-cycle schedule
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


# ---- shared: compose + build like the train entry, time a window of steps ----------------------
def compose(overrides: list[str], out: Path):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from fasttrain import CONFIG_DIR

    base = [f"paths.root_dir={out}", f"paths.output_dir={out}"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return hydra_compose("train", overrides=base + overrides)


class Resident:
    """`steps` batches cycled from a few tensors already on the device: no loader in the way."""

    def __init__(self, batches: list[tuple[Any, Any]], steps: int) -> None:
        self.batches, self.steps = batches, steps

    def __iter__(self):
        return (self.batches[i % len(self.batches)] for i in range(self.steps))

    def __len__(self) -> int:
        return self.steps


def window_timer(warmup: int, measured: int, result: dict[str, float]):
    """A callback timing steps [warmup, warmup + measured), synchronising only at the two ends."""
    import lightning as L
    import torch

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    class _Timer(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == warmup:
                sync()
                result["start"] = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == warmup + measured - 1:
                sync()
                result["seconds"] = time.perf_counter() - result["start"]

    return _Timer()


def fit_window(model, batches, warmup: int, measured: int, trainer_cfg, precision: str) -> float:
    """Seconds for `measured` optimizer steps after `warmup` ones, through Lightning's loop."""
    from fasttrain.assemble import build

    result: dict[str, float] = {}
    trainer = build(
        trainer_cfg,
        "trainer",
        callbacks=[window_timer(warmup, measured, result)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_epochs=1,
        max_steps=warmup + measured,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        precision=precision,
    )
    trainer.fit(model, train_dataloaders=Resident(batches, warmup + measured))
    return result["seconds"]


# ---- conv: AMP speedup ---------------------------------------------------------------------------
CONV_VARIANTS = [  # (label, precision, matmul_precision, channels_last, compile)
    ("fp32", "32-true", "highest", False, False),
    ("fp32 channels_last", "32-true", "highest", True, False),
    ("tf32", "32-true", "high", False, False),
    ("tf32 channels_last", "32-true", "high", True, False),
    ("16-mixed", "16-mixed", "high", False, False),
    ("16-mixed channels_last", "16-mixed", "high", True, False),
    ("bf16-mixed", "bf16-mixed", "high", False, False),
    ("bf16-mixed channels_last", "bf16-mixed", "high", True, False),
    ("fp32 channels_last compile", "32-true", "highest", True, True),
    ("bf16-mixed channels_last compile", "bf16-mixed", "high", True, True),
]


def bench_conv(out: Path, smoke: bool, device: str) -> dict[str, Any]:
    import torch

    from fasttrain.assemble import build

    batch, shape = (8, [3, 16, 16]) if smoke else (256, [3, 32, 32])
    widths, blocks = ([8, 16], [1, 1]) if smoke else ([64, 128, 256, 512], [2, 2, 2, 2])
    warmup, measured = (1, 2) if smoke else (20, 60)
    variants = CONV_VARIANTS[:2] + CONV_VARIANTS[6:7] if smoke else CONV_VARIANTS
    gen = torch.Generator().manual_seed(0)
    batches = [
        (
            torch.randn(batch, *shape, generator=gen).to(device),
            torch.randint(0, 10, (batch,), generator=gen).to(device),
        )
        for _ in range(4)
    ]
    rows = []
    for label, precision, matmul, channels_last, compiled in variants:
        if smoke and precision == "16-mixed":
            continue
        cfg = compose(
            [
                "model/net=resnet",
                f"model.net.channels={widths}",
                f"model.net.blocks={blocks}",
                f"data.input_shape={shape}",
                "data=synthetic",
                f"data.batch_size={batch}",
                f"model.channels_last={channels_last}",
                f"model.compile={compiled}",
                f"matmul_precision={matmul}",
                "model.scheduler=null",
                f"trainer.accelerator={'gpu' if device == 'cuda' else 'cpu'}",
                "trainer.devices=1",
            ],
            out / "conv",
        )
        torch.set_float32_matmul_precision(cfg.matmul_precision)
        torch.manual_seed(0)
        model = build(cfg.model, "model")
        seconds = fit_window(model, batches, warmup, measured, cfg.trainer, precision)
        rows.append(
            {
                "variant": label,
                "precision": precision,
                "matmul_precision": matmul,
                "channels_last": channels_last,
                "compile": compiled,
                "images_per_s": batch * measured / seconds,
            }
        )
        print(f"conv {label}: {rows[-1]['images_per_s']:,.0f} images/s", flush=True)
    by = {r["variant"]: r["images_per_s"] for r in rows}
    best_amp = max(v for k, v in by.items() if "mixed" in k)
    return {
        "net": f"ResNet(channels={widths}, blocks={blocks})",
        "batch": batch,
        "input": shape,
        "rows": rows,
        "amp_speedup_bf16_vs_fp32": by["bf16-mixed"] / by["fp32"],
        "best_amp_vs_fp32": best_amp / by["fp32"],
    }


# ---- transformer: MFU, the template's language model against a hand-written loop ----------------
# gpt2_small's sizes (conf/model/net/gpt2_small.yaml) on the modern recipe's net
GPT2_SMALL_MODERN = ["model.net.n_layer=12", "model.net.n_head=12", "model.net.n_embd=768"]


def lm_model(out: Path, smoke: bool, compile_net: bool, recipe: str = "gpt"):
    """`model=gpt model/net=gpt2_small` (or `model=gpt_modern` at gpt2_small's sizes) as composed
    from conf/ (the smoke run: the tiny preset), its vocabulary a BPE's (GPT-2's size class; no
    data module needed to build it)."""
    from fasttrain.assemble import build_model

    small = ["data.block_size=32", "data.vocab_size=512"]
    sizes = ["model/net=gpt2_small"] if recipe == "gpt" else GPT2_SMALL_MODERN
    large = [*sizes, "data.block_size=1024", "data.vocab_size=32768"]
    net = small if smoke else large
    cfg = compose([f"model={recipe}", "data=text", "data.tokenizer=bpe", *net,
                   f"model.compile={str(compile_net).lower()}"], out)  # fmt: skip
    return build_model(cfg.model), cfg


def hand_written_loop(net, batches, warmup: int, measured: int, bf16: bool) -> float:
    """nanoGPT's loop on the same net and batches: autocast bf16, fused AdamW with decay on
    matrices only, zero_grad(set_to_none). Seconds for `measured` steps after `warmup`."""
    import contextlib

    import torch
    import torch.nn.functional as F

    params = list(net.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]  # fmt: skip
    fused = torch.cuda.is_available()
    optimizer = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), fused=fused)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    amp = torch.autocast(device, torch.bfloat16) if bf16 else contextlib.nullcontext()
    net.train()
    start = 0.0
    for step in range(warmup + measured):
        if step == warmup:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start = time.perf_counter()
        x, y = batches[step % len(batches)]
        with amp:
            logits = net(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def bench_transformer(out: Path, smoke: bool, device: str) -> dict[str, Any]:
    import torch
    from omegaconf import OmegaConf

    from fasttrain.callbacks.flops import dense_peak_tflops

    warmup, measured, batch = (1, 2, 4) if smoke else (15, 40, 16)
    torch.manual_seed(0)
    model, cfg = lm_model(out, smoke, compile_net=not smoke)
    net = model.net
    vocab, seq = int(cfg.data.vocab_size), int(cfg.data.block_size)
    flops_per_token = net.flops_per_token(seq)  # the formula PerfMonitor's perf/mfu uses
    gen = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(4):
        tokens = torch.randint(0, vocab, (batch, seq + 1), generator=gen).to(device)
        batches.append((tokens[:, :-1], tokens[:, 1:]))
    torch.manual_seed(0)  # the hand-written loop's net: the same weights, compiled the same way
    plain = lm_model(out, smoke, compile_net=not smoke)[0].net
    trainer_cfg = OmegaConf.create(
        {
            "_target_": "fasttrain.assemble.Trainer",
            "accelerator": "gpu" if device == "cuda" else "cpu",
            "devices": 1,
        }
    )
    precision = "bf16-mixed"
    seconds = fit_window(model, batches, warmup, measured, trainer_cfg, precision)
    hand_seconds = hand_written_loop(plain.to(device), batches, warmup, measured, bf16=True)
    tokens_per_s = batch * seq * measured / seconds
    hand_tokens_per_s = batch * seq * measured / hand_seconds
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    peak = dense_peak_tflops(name, "bf16")
    mfu = tokens_per_s * flops_per_token / (peak * 1e12) if peak else None
    hand_mfu = hand_tokens_per_s * flops_per_token / (peak * 1e12) if peak else None
    print(f"transformer: {tokens_per_s:,.0f} tokens/s ({tokens_per_s / hand_tokens_per_s:.3f} "
          f"of the hand-written loop's {hand_tokens_per_s:,.0f}), MFU "
          f"{mfu if mfu is None else f'{mfu:.1%}'}")  # fmt: skip
    shape = {k: int(net.hparams[k]) for k in ("vocab_size", "block_size", "n_layer", "n_head",
                                              "n_embd")}  # fmt: skip
    return {
        "shape": {**shape, "batch": batch},
        "params_non_embedding": net.num_params() - net.wte.weight.numel(),
        "params": net.num_params(embeddings=True),
        "precision": precision,
        "compile": not smoke,
        "tokens_per_s": tokens_per_s,
        "hand_written_tokens_per_s": hand_tokens_per_s,
        "ratio_vs_hand_written": tokens_per_s / hand_tokens_per_s,
        "flops_per_token": flops_per_token,
        "peak_tflops_bf16_dense": peak,
        "mfu": mfu,
        "hand_written_mfu": hand_mfu,
    }


# ---- the language-model recipes: model=gpt against model=gpt_modern (Muon), gpt2_small ---------
def bench_lm_recipes(out: Path, smoke: bool, device: str) -> dict[str, Any]:
    """Both recipes at gpt2_small's sizes in bf16-mixed + compile through Lightning's loop (the
    task's own configure_optimizers: Muon and AdamW for gpt_modern): tokens/s, MFU, and the
    modern recipe's cost per step against the default's (rotary, QK-norm, Newton-Schulz)."""
    import torch
    from omegaconf import OmegaConf

    from fasttrain.callbacks.flops import dense_peak_tflops

    warmup, measured, batch = (1, 2, 4) if smoke else (15, 40, 16)
    peak = dense_peak_tflops(torch.cuda.get_device_name() if device == "cuda" else "cpu", "bf16")
    accelerator = "gpu" if device == "cuda" else "cpu"
    trainer_cfg = OmegaConf.create(
        {"_target_": "fasttrain.assemble.Trainer", "devices": 1, "accelerator": accelerator}
    )
    rows = []
    for recipe in ("gpt", "gpt_modern"):
        torch.manual_seed(0)
        model, cfg = lm_model(out, smoke, compile_net=not smoke, recipe=recipe)
        vocab, seq = int(cfg.data.vocab_size), int(cfg.data.block_size)
        gen = torch.Generator().manual_seed(0)
        tokens = [torch.randint(0, vocab, (batch, seq + 1), generator=gen) for _ in range(4)]
        batches = [(t[:, :-1].to(device), t[:, 1:].to(device)) for t in tokens]
        flops_per_token = model.net.flops_per_token(seq)
        seconds = fit_window(model, batches, warmup, measured, trainer_cfg, "bf16-mixed")
        tokens_per_s = batch * seq * measured / seconds
        rows.append({
            "recipe": recipe, "params": model.net.num_params(embeddings=True),
            "tokens_per_s": tokens_per_s, "flops_per_token": flops_per_token,
            "mfu": tokens_per_s * flops_per_token / (peak * 1e12) if peak else None,
        })  # fmt: skip
        print(f"lm_recipes {recipe}: {tokens_per_s:,.0f} tokens/s", flush=True)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    by = {r["recipe"]: r for r in rows}
    return {
        "shape": {"vocab_size": vocab, "block_size": seq, "batch": batch},
        "precision": "bf16-mixed", "compile": not smoke, "rows": rows,
        "step_cost_modern_vs_gpt": by["gpt"]["tokens_per_s"] / by["gpt_modern"]["tokens_per_s"],
    }  # fmt: skip


# ---- data-wait share -----------------------------------------------------------------------------
def bench_data_wait(out: Path, smoke: bool, device: str) -> dict[str, Any]:
    rows = []
    epochs = 1 if smoke else 3
    for data in ("digits", "synthetic"):
        for fast in (False, True):
            run = f"{data}_{'pinned_prefetch' if fast else 'plain'}"
            cmd = [
                sys.executable,
                "train.py",
                f"data={data}",
                f"paths.log_dir={out}/data_wait",
                f"run_name={run}",
                f"trainer.max_epochs={epochs}",
                "test=false",
                "logger=none",
                f"data.pin_memory={fast}",
                f"data.device_prefetch={fast}",
                f"trainer.accelerator={'gpu' if device == 'cuda' else 'cpu'}",
            ]
            if smoke:
                cmd += ["++trainer.limit_train_batches=3", "++trainer.limit_val_batches=1"]
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
            summary = json.loads(
                (out / "data_wait" / "train" / run / "perf_summary.json").read_text()
            )
            rows.append(
                {
                    "data": data,
                    "pin_memory_and_device_prefetch": fast,
                    "data_wait_share": summary["data_wait_share"],
                    "samples_per_sec": summary["samples_per_sec"],
                    "perf_summary": summary,
                }
            )
            print(f"data_wait {run}: {summary['data_wait_share']:.1%}", flush=True)
    return {"rows": rows, "epochs": epochs}


# ---- recipe: experiment=cifar10_resnet18, eager fp32 vs the recipe ------------------------------
RECIPE_VARIANTS = {  # label -> the overrides that differ from the experiment's own settings
    "eager fp32": [
        "trainer.precision=32-true", "matmul_precision=highest", "model.channels_last=false",
        "model.compile=false", "data.on_device=false",
    ],
    "recipe": [],
}  # fmt: skip


def bench_recipe(out: Path, smoke: bool, device: str) -> dict[str, Any]:
    """The experiment's training steps through its own data module and callbacks (EMA) on
    CIFAR-sized random data (data=synthetic: the 40,000 training images of a CIFAR split; no
    augmentation there), timed over steps [warmup, warmup + measured) of the first epoch."""
    import torch

    from fasttrain.assemble import build_run

    batch, samples = (8, 64) if smoke else (512, 50_000)
    warmup, measured = (1, 2) if smoke else (15, 50)  # compile happens in the warm-up
    size = ["model.net.channels=[8,16,32,64]", "model.compile=false"] if smoke else []
    rows = []
    for label, overrides in RECIPE_VARIANTS.items():
        cfg = compose(
            [
                "experiment=cifar10_resnet18", "data=synthetic", f"data.num_samples={samples}",
                f"data.batch_size={batch}", "logger=none", "callbacks.checkpoint=null",
                "callbacks.best=null", "callbacks.progress_bar=null", "train=true", "test=false",
                f"trainer.accelerator={'gpu' if device == 'cuda' else 'cpu'}", "trainer.devices=1",
                f"trainer.max_steps={warmup + measured}", "trainer.limit_val_batches=0",
                "+trainer.num_sanity_val_steps=0", "+trainer.enable_progress_bar=false",
                "+trainer.enable_checkpointing=false", *overrides, *size,
            ],
            out / "recipe",
        )  # fmt: skip
        torch.set_float32_matmul_precision(cfg.matmul_precision)
        result: dict[str, float] = {}
        trainer, model, datamodule = build_run(cfg, [window_timer(warmup, measured, result)])
        started = time.perf_counter()
        trainer.fit(model, datamodule=datamodule)
        rows.append(
            {
                "variant": label,
                "overrides": overrides,
                "images_per_s": batch * measured / result["seconds"],
                "fit_seconds": time.perf_counter() - started,  # compile and data set-up included
            }
        )
        print(f"recipe {label}: {rows[-1]['images_per_s']:,.0f} images/s", flush=True)
    by = {r["variant"]: r["images_per_s"] for r in rows}
    return {
        "net": "ResNet-18" + (" at 1/8 widths" if smoke else ""),
        "batch": batch,
        "rows": rows,
        "speedup_recipe_vs_eager_fp32": by["recipe"] / by["eager fp32"],
    }


# ---- report ------------------------------------------------------------------------------------
def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        f"GPU check on **{m['device']}** ({m['gpu_memory_gb']:.0f} GB), torch {m['torch']}, "
        f"CUDA {m['cuda']}, lightning {m['lightning']}, {m['date']}",
        "",
    ]
    if "conv" in results:
        c = results["conv"]
        lines += [
            f"{c['net']} training, batch {c['batch']}, {c['input']} inputs, data on the device:",
            "",
            "| variant | images/s | vs fp32 |",
            "|---|---|---|",
        ]
        fp32 = next(r["images_per_s"] for r in c["rows"] if r["variant"] == "fp32")
        for r in c["rows"]:
            lines.append(
                f"| {r['variant']} | {r['images_per_s']:,.0f} | {r['images_per_s'] / fp32:.2f}x |"
            )
        lines += [
            "",
            f"AMP speedup (bf16-mixed vs fp32): **{c['amp_speedup_bf16_vs_fp32']:.2f}x** "
            f"(best mixed variant: {c['best_amp_vs_fp32']:.2f}x; target >= 2.5x)",
            "",
        ]
    if "transformer" in results:
        t = results["transformer"]
        mfu = "n/a (device not in the peak table)" if t["mfu"] is None else f"**{t['mfu']:.1%}**"
        lines += [
            f"model=gpt model/net=gpt2_small {t['shape']}, {t['params'] / 1e6:.0f} M params, "
            f"bf16-mixed + compile: {t['tokens_per_s']:,.0f} tokens/s, "
            f"**{t['ratio_vs_hand_written']:.3f}x** a hand-written loop's "
            f"{t['hand_written_tokens_per_s']:,.0f} (target >= 0.95), MFU {mfu} (target >= 45%)",
            "",
        ]
    if "lm_recipes" in results:
        lm = results["lm_recipes"]
        lines += [f"gpt2_small sizes {lm['shape']}, bf16-mixed + compile, Lightning's loop:", "",
                  "| recipe | params | tokens/s | MFU |", "|---|---|---|---|"]  # fmt: skip
        for r in lm["rows"]:
            mfu = "n/a" if r["mfu"] is None else f"{r['mfu']:.1%}"
            lines.append(f"| model={r['recipe']} | {r['params'] / 1e6:.0f} M | "
                         f"{r['tokens_per_s']:,.0f} | {mfu} |")  # fmt: skip
        lines += ["", f"gpt_modern's step cost: **{lm['step_cost_modern_vs_gpt']:.2f}x** "
                  "model=gpt's (target <= 1.15x)", ""]  # fmt: skip
    if "recipe" in results:
        r = results["recipe"]
        lines += [
            f"experiment=cifar10_resnet18 data=synthetic ({r['net']}, batch {r['batch']}, EMA, "
            "one cycle):",
            "",
            "| variant | images/s | fit s (compile included) |",
            "|---|---|---|",
        ]
        for row in r["rows"]:
            lines.append(
                f"| {row['variant']} | {row['images_per_s']:,.0f} | {row['fit_seconds']:.0f} |"
            )
        lines += ["", f"recipe vs eager fp32: **{r['speedup_recipe_vs_eager_fp32']:.2f}x**", ""]
    if "data_wait" in results:
        lines += [
            "| data | pin_memory + device_prefetch | data-wait share | samples/s |",
            "|---|---|---|---|",
        ]
        for r in results["data_wait"]["rows"]:
            lines.append(
                f"| {r['data']} | {r['pin_memory_and_device_prefetch']} | "
                f"{r['data_wait_share']:.2%} | {r['samples_per_sec']:,.0f} |"
            )
        lines.append("")
    for name, err in results.get("errors", {}).items():
        lines.append(f"- {name} failed: {err}")
    return "\n".join(lines)


def machine(device: str) -> dict[str, Any]:
    import lightning
    import torch

    props = torch.cuda.get_device_properties(0) if device == "cuda" else None
    return {
        "device": props.name if props else "cpu",
        "gpu_memory_gb": props.total_memory / 1e9 if props else 0,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "lightning": lightning.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gpu")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes; runs on CPU")
    every_section = ["conv", "transformer", "lm_recipes", "data_wait", "recipe"]
    parser.add_argument("--only", nargs="*", default=every_section)
    args = parser.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.smoke:
        sys.exit(
            "error: no CUDA device: the GPU benchmark needs one (--smoke runs tiny sizes on CPU)"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"machine": machine(device), "smoke": args.smoke}
    sections = {
        "conv": bench_conv,
        "transformer": bench_transformer,
        "lm_recipes": bench_lm_recipes,
        "data_wait": bench_data_wait,
        "recipe": bench_recipe,
    }
    for name in args.only:
        try:
            results[name] = sections[name](args.out / "runs", args.smoke, device)
        except Exception as err:  # one failing section must not lose the others' numbers
            results.setdefault("errors", {})[name] = f"{type(err).__name__}: {err}"[:2000]
            print(f"{name} failed: {err}", file=sys.stderr)
        (args.out / "gpu_results.json").write_text(
            json.dumps(results, indent=2, default=str) + "\n"
        )
    (args.out / "gpu_results.md").write_text(markdown(results) + "\n")
    print(markdown(results))
    sys.exit(1 if results.get("errors") else 0)


if __name__ == "__main__":
    main()
