#!/usr/bin/env bash
# One call on a lent H100/H200 box: wheels that box lacks and the llama-cpp-python source travel in .whl/
# (bench/gpu_carry.sh makes it; the call starts with `GPU_UNPACK_BACKGROUND=1 bash bench/gpu_unpack.sh .whl &&
# GPU_UNPACK_BACKGROUND=1 bash bench/gpu_unpack.sh --install &&`). The QLoRA test's model, trl and bitsandbytes are
# larger than one call carries: .ft1-.ft3, one call each, before this one or after it on the warm box.
# Runs bench/gpu_checks.py + bench/bench_tools_vs_script.py (figures in $OUT, or bench/results/) while llama.cpp
# builds, then the GPU-marked tests and bench/llama_cuda_bisect.py where llama.cpp was built with CUDA. Each step
# has its own limit (seconds); the whole ran in 321 s on an H200 (bench/results/gpu_h200_20261127/).
set -uo pipefail
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
for site in /tmp/site /tmp/site-llama; do  # site-llama (the CUDA llama.cpp build) first: it is added last
  [ -d "$site" ] && export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
done
# the package is not installed there: expose server/, tools/, ... as `gpubox` through a symlinked tree
mkdir -p .gpubox-src/gpubox
for d in server/*.py; do ln -sf "$(pwd)/$d" .gpubox-src/gpubox/; done
for d in tools resources prompts; do ln -sfn "$(pwd)/$d" ".gpubox-src/gpubox/$d"; done
export PYTHONPATH="$(pwd)/.gpubox-src${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi || true
# gpu_checks.py also runs bench_attention over the FFPA sweep (B=1 H=48 N=8192 D=64,128,320..1024, fp16) and
# bench_device through MCP; then the tool's figures against a bare script timing the same SDPA kernels
export PYTHONUNBUFFERED=1 GPU_CHECKS_ATTENTION_S="${GPU_CHECKS_ATTENTION_S:-200}" GPU_CHECKS_DEVICE_S="${GPU_CHECKS_DEVICE_S:-60}"
timeout "${GPU_CHECKS_S:-300}" python3 bench/gpu_checks.py
timeout "${TOOLS_VS_SCRIPT_S:-120}" python3 bench/bench_tools_vs_script.py --device cuda --rounds 3 ${OUT:+--out "$OUT"}
# a CUDA build of llama-cpp-python (bench/gpu_carry.sh's .l1/.l2, built there): which of gpubox's load settings, or
# torch in the same process, crashes it (an H200 run saw infer_load segfault where a bare load did not)
if [ -e /tmp/carry/llama.started ]; then  # gpu_unpack.sh's build, if it runs in the background
  for _ in $(seq 1 "${LLAMA_BUILD_WAIT_S:-300}"); do [ -e /tmp/carry/llama.done ] && break; sleep 1; done
  echo "gpu_checks: llama-cpp-python CUDA build exit $(cat /tmp/carry/llama.done 2>/dev/null || echo 'still running')"
fi
# the build lands in /tmp/site-llama only when it ends, after PYTHONPATH was set above
[ -d /tmp/site-llama ] && [[ ":$PYTHONPATH:" != *":/tmp/site-llama:"* ]] && export PYTHONPATH="/tmp/site-llama:$PYTHONPATH"
# after the build, so the llama.cpp offload test finds it; the fine-tuning GPU test appends planned vs measured memory and tokens/s to GPUBOX_GPU_RESULTS
GPUBOX_GPU_RESULTS="${OUT:-bench/results}/gpu_finetune.jsonl" timeout "${GPU_TESTS_S:-150}" python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tail -20
if python3 -c "import llama_cpp, sys; sys.exit(not llama_cpp.llama_supports_gpu_offload())" 2>/dev/null; then
  model=(); [ -f .whl/tiny.gguf ] && model=(--model "$(pwd)/.whl/tiny.gguf")  # gpu_carry.sh's 8 MB stand-in
  timeout "${LLAMA_BISECT_S:-300}" python3 bench/llama_cuda_bisect.py "${model[@]}" \
    --out "${OUT:-bench/results}/llama_cuda_bisect.md"
fi
# the serving benchmark on the GPU, where the box has vLLM (a CUDA vLLM cannot travel in .whl/: several GB with
# its CUDA torch): in-process llama.cpp vs the vLLM engine through MCP vs its API, 1-16 clients
if python3 -c "import vllm" 2>/dev/null; then
  python3 bench/serve_bench.py --engine-python "$(command -v python3)" --no-one-thread \
    --out "${OUT:-bench/results}/serve_bench_gpu.md"
else
  echo "gpu_checks: vLLM is not installed on this box; serve_bench skipped" >&2
fi
