"""The code-tuned adapter for the bundled all-MiniLM-L6-v2: low-rank weight updates (LoRA, rank 16, on every linear
layer of its six transformer blocks) trained here on (doc comment, definition) pairs from public code that is not
in semble's benchmark (bench/code_embedder: the pairs, the training script and what it measured). MiniLM was trained
on sentence pairs; the adapter teaches it that a description and the code it describes belong together.

Merged into the loaded model's weights once (W += B @ A), so embedding costs what plain MiniLM costs. Applies only
to the bundled model: another model folder is used as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

NAME = "code-v1"  # recorded in each index: vectors from another variant are made again
FILE = Path(__file__).parent / "data" / "minilm_code_v1.safetensors"


def digest() -> str:
    """A short hash of the adapter file (the ONNX query export is keyed on it)."""
    import hashlib

    return hashlib.sha256(FILE.read_bytes()).hexdigest()[:16]


def merge(auto_model: Any) -> int:
    """Add the adapter's updates to `auto_model` (the transformers BertModel inside the sentence-transformers
    model) in place, in the model's own dtype; returns how many weight matrices changed. Raises ValueError when a
    layer is missing or its shape differs: the adapter was made for another model."""
    import torch
    from safetensors.torch import load_file

    tensors = load_file(str(FILE))
    layers = sorted({k.rsplit(".", 1)[0] for k in tensors})
    with torch.no_grad():
        for name in layers:
            try:
                linear = auto_model.get_submodule(name)
            except AttributeError as e:
                raise ValueError(f"the code adapter's layer {name} is not in this model") from e
            weight = linear.weight  # on the model's device (cuda on a GPU box): the update is made there
            a, b = (tensors[f"{name}.lora_{x}"].to(weight.device, torch.float32) for x in ("a", "b"))
            if tuple(weight.shape) != (b.shape[0], a.shape[1]):
                shape = f"{b.shape[0]}x{a.shape[1]}"
                raise ValueError(f"the code adapter's layer {name} is {shape}, not {tuple(weight.shape)}")
            weight.copy_((weight.float() + b @ a).to(weight.dtype))
    return len(layers)
