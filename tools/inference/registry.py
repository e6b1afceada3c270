"""What can be run: the bundled SmolLM2 GGUF, GGUF files, HF model folders and LoRA adapters in the model dirs."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpubox.bundled import smollm2_gguf

log = logging.getLogger("gpubox.inference")

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass
class Discovered:
    name: str
    path: Path
    format: Literal["gguf", "hf", "lora"]
    bundled: bool = False
    base_model: str | None = None


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def discover(model_dirs: list[Path]) -> dict[str, Discovered]:
    found: dict[str, Discovered] = {}
    bundled = smollm2_gguf()
    if bundled is not None:
        found[DEFAULT_MODEL] = Discovered(DEFAULT_MODEL, bundled, "gguf", bundled=True)
    for base in model_dirs:
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            if p.is_file() and p.suffix == ".gguf" and "mmproj" not in p.name:
                found.setdefault(p.stem.lower(), Discovered(p.stem.lower(), p, "gguf"))
            elif p.is_dir() and (p / "adapter_config.json").is_file():
                try:
                    base_model = json.loads((p / "adapter_config.json").read_text()).get("base_model_name_or_path")
                except (OSError, json.JSONDecodeError):
                    base_model = None
                found.setdefault(p.name.lower(), Discovered(p.name.lower(), p, "lora", base_model=base_model))
            elif p.is_dir() and (p / "config.json").is_file() and any((p / w).exists() for w in WEIGHT_FILES):
                found.setdefault(p.name.lower(), Discovered(p.name.lower(), p, "hf"))
    return found


def size_of(d: Discovered) -> int:
    return _size(d.path)
