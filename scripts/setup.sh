#!/usr/bin/env bash
# Creates .venv and installs the project with its development tools.
# On a machine without an NVIDIA GPU it installs the CPU build of torch 2.13.0 first,
# so that no multi-GB CUDA build is pulled in by the `torch>=2.1` requirement.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
        "${PIP[@]}" torch
    else
        "${PIP[@]}" "torch==2.13.0"
    fi
fi
"${PIP[@]}" -e ".[dev]"
echo "setup: .venv ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
