#!/usr/bin/env bash
# Create .venv and install gpubox with every extra (torch pinned first: see constraints.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
export PIP_DISABLE_PIP_VERSION_CHECK=1
.venv/bin/pip install -q -c constraints.txt "torch==2.13.0"

# llama-cpp-python has no wheel on PyPI: we compile it once and keep the wheel in a cache keyed by the build
# flags (pip's own wheel cache ignores CMAKE_ARGS, so a wheel built with other flags would be reused silently).
# Default flags: the CPU's own SIMD features, named one by one, with AMX left out. A native build on CPUs
# that advertise AMX compiles ggml's AMX kernels, and under some hypervisors those fault (general protection)
# on the first prompt of more than a few tokens. (An AVX2-only build of this llama.cpp version answered
# SmolLM2 wrongly here at temperature 0, so the AVX-512 paths are kept where the CPU has them.) LLAVA off skips
# the multimodal library we do not use. Set CMAKE_ARGS to build differently (e.g. "-DGGML_CUDA=on").
LLAMA_VERSION="$(sed -n 's/^llama-cpp-python==//p' constraints.txt)"
cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
DEFAULT_CMAKE="-DLLAVA_BUILD=OFF"
if [ "$(uname -m)" = "x86_64" ]; then
    DEFAULT_CMAKE="$DEFAULT_CMAKE -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
    for pair in bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI \
        avx512_bf16:AVX512_BF16; do
        case "$cpu_flags" in *" ${pair%%:*} "*) DEFAULT_CMAKE="$DEFAULT_CMAKE -DGGML_${pair##*:}=ON" ;; esac
    done
fi
export CMAKE_ARGS="${CMAKE_ARGS:-$DEFAULT_CMAKE}"
key="$(printf '%s|%s|%s' "$LLAMA_VERSION" "$CMAKE_ARGS" "$(.venv/bin/python -c 'import sys; print(sys.version_info[:2])')" \
    | sha256sum | cut -c1-16)"
wheels="${GPUBOX_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpubox/wheels}/llama-$key"
if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "compiling llama-cpp-python $LLAMA_VERSION ($CMAKE_ARGS); about 10 minutes on 2 cores, once" >&2
    mkdir -p "$wheels.tmp"
    .venv/bin/pip wheel -q --no-deps --no-cache-dir --no-binary llama-cpp-python \
        -w "$wheels.tmp" "llama-cpp-python==$LLAMA_VERSION"
    rm -rf "$wheels" && mv "$wheels.tmp" "$wheels"
fi
.venv/bin/pip install -q --no-deps --force-reinstall "$wheels"/llama_cpp_python-*.whl
.venv/bin/pip install -q -c constraints.txt -e ".[all,dev]"
echo "gpubox installed in $(pwd)/.venv" >&2
