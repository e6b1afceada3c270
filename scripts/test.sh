#!/usr/bin/env bash
# Install everything (scripts/install.sh) and run the whole test suite plus the linter.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
.venv/bin/ruff check server tools resources prompts tests examples bench
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python -m pytest -q "$@"
