#!/usr/bin/env bash
# The GPU check: everything that needs CUDA, in one go, in about 8 minutes on one GPU (7.3 on an
# H200, 2026-12-04; the phases' limits add up to 565 s).
#
#   bench/gpu_check.sh [OUT_DIR] [--wheels DIR]
#
# OUT_DIR (default bench/results/gpu/) receives pytest_gpu.txt, gpu_results.json, gpu_results.md
# and each benchmark run's perf_summary.json. --wheels DIR installs the project's missing
# pure-Python dependencies (e.g. hydra-core, omegaconf, antlr4-python3-runtime) from a folder of
# wheels, offline; the machine's torch is never replaced.
#
# Each phase has a time limit of its own in seconds (TESTS_S, BENCH_S, OVERHEAD_S, PROFILE_S,
# LOADING_S), so a slow or hung phase cannot take the others' results with it on a lent machine
# with little time: the benchmark writes each section's numbers as it finishes, most wanted first.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=bench/results/gpu
WHEELS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) OUT="$1"; shift ;;
  esac
done
mkdir -p "$OUT"
PY=${PYTHON:-python3}

if ! $PY -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "error: torch sees no CUDA device here; the GPU check needs one" >&2
  exit 2
fi

# What the project needs beyond torch, by import name -> distribution name.
missing=$($PY - <<'PY'
import importlib.util
need = {"lightning": "lightning", "torchmetrics": "torchmetrics", "hydra": "hydra-core",
        "omegaconf": "omegaconf", "antlr4": "antlr4-python3-runtime", "tensorboard": "tensorboard",
        "sklearn": "scikit-learn", "rich": "rich", "pytest": "pytest"}
print(" ".join(dist for mod, dist in need.items() if importlib.util.find_spec(mod) is None))
PY
)
if [ -n "$missing" ]; then
  echo "missing here: $missing"
  if [ -z "$WHEELS" ]; then
    echo "error: install them or pass --wheels DIR (a folder of wheels; antlr4 ships only as an sdist: build its wheel first)" >&2
    exit 2
  fi
  # --no-deps: nothing from the wheel folder may replace the machine's torch (a pin on it is no
  # help: pip then looks for torch in the folder and fails); hydra-core's own needs are the others
  $PY -m pip install --no-index --no-deps --find-links "$WHEELS" $missing || exit 2
fi
# The project itself, without touching dependencies (editable: src/ and conf/ stay here).
$PY -c 'import fasttrain' 2>/dev/null || $PY -m pip install --no-deps --no-build-isolation -e . >/dev/null || \
  export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

$PY -m fasttrain.doctor --json > "$OUT/doctor.json" 2> "$OUT/doctor.err" || echo "doctor failed (see $OUT/doctor.err)"

echo "== gpu-marked tests =="
# one hung test must not take the rest: pytest-timeout where the machine has it
per_test=$($PY -c 'import pytest_timeout' 2>/dev/null && echo "--timeout=${TEST_TIMEOUT_S:-120}")
timeout "${TESTS_S:-160}" $PY -m pytest -m gpu -q -p no:cacheprovider -rfEs --durations=20 $per_test 2>&1 \
  | tee "$OUT/pytest_gpu.txt"
tests_rc=${PIPESTATUS[0]}

echo "== benchmarks =="
# lm_recipes (gpt2_small in model=gpt and model=gpt_modern with Muon, bf16 + compile: tokens/s,
# MFU), transformer (the template's GPT against a hand-written loop; its graphs are lm_recipes'
# cached ones), conv (AMP, channels_last, compile on ResNet-18), recipe:
# experiment=cifar10_resnet18 on synthetic CIFAR-shaped data, eager fp32 vs the recipe (most of
# it the compile, which starts from the gpu-marked recipe test's cached graphs), and data_wait.
timeout "${BENCH_S:-260}" $PY bench/gpu_bench.py --out "$OUT" \
  --only lm_recipes transformer conv recipe data_wait
bench_rc=$?
# The hot path on the GPU: samples/s of the default configuration (C) against a hand-written
# loop (A), lean Lightning (B) and a typical template (L), tiny MLP, where host work shows most.
timeout "${OVERHEAD_S:-75}" $PY bench/overhead.py --device cuda --cases tiny_mlp --reps 3 --json "$OUT/overhead_gpu.json" \
  | tee "$OUT/overhead_gpu.md" || bench_rc=1
# Where the default configuration's host time goes on the GPU, by owner (cProfile, tiny case):
# on the H200 its quiet step made 1,912 more Python calls than lean Lightning's (41 on a CPU).
timeout "${PROFILE_S:-30}" $PY bench/overhead.py --device cuda --profile \
  --json "$OUT/overhead_profile_gpu.json" > /dev/null || bench_rc=1
# Images from files (~30 s): ResNet-18 on fake CIFAR-10 files through data=cifar10's loader,
# the data-wait share with uint8 batches normalised on the device vs float32 from the host.
timeout "${LOADING_S:-40}" $PY bench/data_loading.py --device cuda --json "$OUT/data_loading_gpu.json" \
  | tee "$OUT/data_loading_gpu.md" || bench_rc=1

echo
cat "$OUT/gpu_results.md" 2>/dev/null || echo "no gpu_results.md: the benchmark ran out of time (gpu_results.json has the sections it finished)"
echo "gpu tests: exit $tests_rc; benchmarks: exit $bench_rc; results in $OUT"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
