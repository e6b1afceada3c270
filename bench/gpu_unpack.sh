#!/usr/bin/env bash
# The device side of bench/gpu_carry.sh, run from the repository root on the lent box:
#   bash bench/gpu_unpack.sh .ft1          in each call that carries a folder: copy it to /tmp/carry (the box keeps
#                                          /tmp only while warm, 30 s between calls: issue the calls back to back)
#   bash bench/gpu_unpack.sh --install     join the split files (NAME.part-aa, -ab, ...), install every wheel into
#                                          /tmp/site, and build a carried llama-cpp-python source with CUDA for this
#                                          GPU into /tmp/site-llama (3.5 min on 16 cores; GPU_UNPACK_BACKGROUND=1
#                                          starts the build in its own session and returns; bench/gpu_checks.sh
#                                          waits for /tmp/carry/llama.done)
set -euo pipefail
mkdir -p /tmp/carry
if [ "${1:-}" != "--install" ]; then
  for d in "$@"; do cp "$d"/* /tmp/carry/; done
  exit 0
fi
cd /tmp/carry
for first in *.part-aa; do
  [ -e "$first" ] || continue
  name=${first%.part-aa}
  cat "$name".part-* > "$name" && rm "$name".part-*
done
if ls ./*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ./*.whl
fi
sdist=$(ls llama_cpp_python-*.tar.* 2>/dev/null | head -1 || true)
[ -n "$sdist" ] || exit 0
python3 -c "import scikit_build_core" || { echo "gpu_unpack: scikit-build-core is missing; carry its wheel" >&2; exit 3; }
mkdir -p src && tar xf "$sdist" -C src && src=$(ls -d /tmp/carry/src/llama_cpp_python-* | head -1)
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
# no flash-attention kernels (most of the CUDA compile time; llama.cpp falls back to its other attention path) and
# no multimodal library (llama_cpp imports it only for vision chat handlers)
build="CMAKE_ARGS='-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$cap -DGGML_CUDA_FA=OFF -DLLAVA_BUILD=OFF' \
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
python3 -m pip install --no-build-isolation --no-deps --no-index --target /tmp/site-llama $src \
> /tmp/carry/llama_build.log 2>&1; echo \$? > /tmp/carry/llama.done"
touch /tmp/carry/llama.started
if [ "${GPU_UNPACK_BACKGROUND:-0}" = 1 ]; then
  setsid nohup bash -c "$build" > /dev/null 2>&1 < /dev/null &
else
  bash -c "$build"
  tail -3 /tmp/carry/llama_build.log
fi
