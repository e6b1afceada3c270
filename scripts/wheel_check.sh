#!/usr/bin/env bash
# The installable wheel, checked the way a user gets it (issue #21), not the checkout:
#   1. `python -m build` (sdist, then the wheel built from that sdist) from a copy of the working tree,
#      so a stale ./build folder cannot leak files into the wheel and the sdist is proved complete;
#   2. a fresh virtualenv outside the repository: `pip install "<wheel>[models]"` (the bundled model
#      packages come as dependencies; llama-cpp-python from scripts/install.sh's compiled-wheel cache);
#   3. from a directory where the checkout is not importable: `gpubox doctor`, and one tool call over stdio
#      with the official MCP client (`gpubox serve` as its child);
#   4. `uvx --from <wheel> gpubox` (uv from PyPI): --help, and the same stdio call with uvx as the command.
#      Where uv cannot be installed or uvx cannot reach a package index, that step is skipped with a note.
# Needs: python3 (>= 3.11; PYTHON=...), the pip index pip is configured with. KEEP=1 keeps the temp folder.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpubox-wheel.XXXXXX")"
[ "${KEEP:-0}" = 1 ] && echo "wheel_check: keeping $WORK" >&2 || trap 'rm -rf "$WORK"' EXIT
step() { printf 'wheel_check: %s (%s)\n' "$1" "$(date +%H:%M:%S)" >&2; }

step "build sdist + wheel from a copy of the working tree"
mkdir "$WORK/src"
# tracked files plus untracked ones git does not ignore: what a clean checkout of this tree would hold
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard) \
    | (cd "$REPO" && tar --null -T - -cf -) | tar -xf - -C "$WORK/src"
"$REPO/.venv/bin/python" -m build --outdir "$WORK/dist" "$WORK/src" >"$WORK/build.log" 2>&1 \
    || { tail -40 "$WORK/build.log" >&2; echo "wheel_check: python -m build failed" >&2; exit 1; }
WHEEL="$(ls "$WORK"/dist/gpubox-*.whl)"
for f in gpubox/tools/estimate/data/gpus.json gpubox/tools/estimate/data/models.json \
    gpubox/tools/estimate/data/prices.json gpubox/cli.py gpubox/tools/search/__init__.py \
    gpubox/tools/search/data/minilm_code_v1.safetensors; do
    "$PY" -c 'import sys, zipfile; sys.exit(sys.argv[2] not in zipfile.ZipFile(sys.argv[1]).namelist())' \
        "$WHEEL" "$f" || { echo "wheel_check: $f is missing from $(basename "$WHEEL")" >&2; exit 1; }
done

step "fresh venv outside the repository: pip install $(basename "$WHEEL")[models]"
cd "$WORK"
"$PY" -m venv "$WORK/venv"
find_links=()
for d in "${GPUBOX_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpubox/wheels}"/llama-*; do
    [ -d "$d" ] && find_links+=(--find-links "$d")
done
"$WORK/venv/bin/pip" install -q -c "$REPO/constraints.txt" "${find_links[@]}" "$WHEEL[models]"
where="$("$WORK/venv/bin/python" -c 'import gpubox; print(gpubox.__file__)')"
case "$where" in
    "$WORK/venv/"*) ;;
    *) echo "wheel_check: gpubox imported from $where, not from the fresh venv" >&2; exit 1 ;;
esac

export GPUBOX_STATE_DIR="$WORK/state" GPUBOX_ALLOWED_ROOTS="$WORK"
step "gpubox doctor"
"$WORK/venv/bin/gpubox" doctor >"$WORK/doctor.txt"
grep -q -i "smollm2" "$WORK/doctor.txt" \
    || { cat "$WORK/doctor.txt" >&2; echo "wheel_check: doctor does not list the bundled SmolLM2" >&2; exit 1; }

step "gpubox install --print (a client config from the installed command; HOME is a temp folder)"
HOME="$WORK/home" "$WORK/venv/bin/gpubox" install --client cursor --print 2>/dev/null | grep -q "$WORK/venv/bin/gpubox" \
    || { echo "wheel_check: gpubox install --print does not name the installed gpubox" >&2; exit 1; }

# One tool call over stdio with the official client; argv: the command and its arguments.
cat >"$WORK/stdio_call.py" <<'EOF'
import os, sys

import anyio
from mcp import Client, StdioServerParameters


async def main() -> None:
    env = {k: v for k, v in os.environ.items() if k.startswith(("GPUBOX_", "HF_", "UV_", "SSL_"))}
    env.update(PATH=os.environ["PATH"], HOME=os.environ.get("HOME", "/tmp"))
    params = StdioServerParameters(command=sys.argv[1], args=sys.argv[2:], env=env)
    async with Client(params) as client:
        result = await client.call_tool("estimate_gpus", {"name_contains": "H100"})
        rows = ((result.structured_content or {}).get("table") or {}).get("rows", [])  # the compact default
        if result.is_error or not rows:
            sys.exit(f"estimate_gpus over stdio failed: {result}")
        print(f"stdio estimate_gpus: {len(rows)} GPUs, first {rows[0][0]}")


anyio.run(main)
EOF
step "one stdio tool call (estimate_gpus) against the installed gpubox serve"
"$WORK/venv/bin/python" "$WORK/stdio_call.py" "$WORK/venv/bin/gpubox" serve

step "uvx --from <wheel> gpubox"
if ! "$WORK/venv/bin/pip" install -q uv 2>"$WORK/uv-pip.log"; then
    echo "wheel_check: NOTE: uv could not be installed from the package index; the uvx step is skipped" >&2
    exit 0
fi
UVX="$WORK/venv/bin/uvx"
# uv does not read pip's configuration: hand it the same index, find-links and CA bundle pip uses.
index="${PIP_INDEX_URL:-$("$WORK/venv/bin/pip" config get global.index-url 2>/dev/null || true)}"
[ -n "$index" ] && export UV_DEFAULT_INDEX="$index"
[ -n "${PIP_FIND_LINKS:-}" ] && export UV_FIND_LINKS="${PIP_FIND_LINKS// /,}"
[ -n "${PIP_CERT:-}" ] && export SSL_CERT_FILE="$PIP_CERT"
if ! "$UVX" --from "$WHEEL" gpubox --help >"$WORK/uvx.log" 2>&1; then
    if grep -q -i -E "failed to fetch|error sending request|dns error|connect|timed out|network" "$WORK/uvx.log"; then
        tail -5 "$WORK/uvx.log" >&2
        echo "wheel_check: NOTE: uvx could not reach a package index; the uvx step is skipped" >&2
        exit 0
    fi
    cat "$WORK/uvx.log" >&2
    echo "wheel_check: uvx --from <wheel> gpubox --help failed" >&2
    exit 1
fi
grep -q "client-config" "$WORK/uvx.log" || { cat "$WORK/uvx.log" >&2; exit 1; }
"$WORK/venv/bin/python" "$WORK/stdio_call.py" "$UVX" --from "$WHEEL" gpubox serve
step "the wheel works"
