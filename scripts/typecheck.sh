#!/usr/bin/env bash
# pyright cannot follow setuptools' editable-install import hook, so check an installed copy of the package.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
.venv/bin/pip install -q --no-deps --no-build-isolation --target "$tmp/site" . >/dev/null
cat > "$tmp/pyrightconfig.json" <<JSON
{"include": ["site/gpubox"], "pythonVersion": "3.11", "typeCheckingMode": "standard",
 "extraPaths": ["site"], "venvPath": "$(pwd)", "venv": ".venv", "reportMissingModuleSource": false}
JSON
.venv/bin/pyright -p "$tmp/pyrightconfig.json" "$@"
