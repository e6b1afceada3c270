#!/usr/bin/env bash
# Create .venv and install gpubox with every extra (torch pinned first: see constraints.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
export PIP_DISABLE_PIP_VERSION_CHECK=1
.venv/bin/pip install -q -c constraints.txt "torch==2.13.0"
# llama-cpp-python has no wheel on PyPI: pip compiles it once (~6 min) and reuses its cached wheel after.
# LLAVA off skips the multimodal library we do not use (about a third of the build).
export CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF}"
.venv/bin/pip install -q -c constraints.txt -e ".[all,dev]"
echo "gpubox installed in $(pwd)/.venv" >&2
