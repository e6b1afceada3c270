"""The HF copy of a base model that training reads.

transformers 5 refuses to train a model loaded with `gguf_file=` ("quantized with QuantizationMethod.GGUF ...
do not support training"), so a GGUF base is dequantized once (GgufConfig(dequantize=True)), saved with
`save_pretrained` under `<state_dir>/finetune/base/<name>/`, and every job trains from that folder. The same folder
is the base the inference family loads a finished adapter onto.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

LOCK_STALE_S = 1800


def hf_ready(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors")) and (path / "tokenizer.json").is_file()


def ensure_hf_base(fmt: str, src: Path, dest: Path, log: Callable[[str], None] = print) -> Path:
    """Return `dest`, building it from `src` first when it is missing. Safe against concurrent builders."""
    if fmt == "hf":
        return src
    if hf_ready(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    lock = dest.with_name(dest.name + ".lock")
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.close(fd)
            break
        except FileExistsError:
            if time.time() - lock.stat().st_mtime > LOCK_STALE_S:
                lock.unlink(missing_ok=True)  # a builder that died long ago
                continue
            if hf_ready(dest):
                return dest
            time.sleep(1)
    try:
        if hf_ready(dest):
            return dest
        log(f"dequantizing {src.name} into an HF folder for training (once per base model): {dest}")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

        model = AutoModelForCausalLM.from_pretrained(
            str(src.parent),
            gguf_file=src.name,
            dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True),
        )
        tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
        return dest
    finally:
        lock.unlink(missing_ok=True)
