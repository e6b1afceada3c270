"""finetune_plan's check of `lora_target_modules` against the base model's real module names.

peft matches each listed name against the model's module names (equal, or ending in "." + name) and can only wrap
some module types; a name that matches nothing, or matches a container such as "mlp", fails the job after the model
is loaded. The names come from the model built on PyTorch's meta device from its config alone (the same classes
training instantiates, no weights read or allocated): about a second for a 7B config.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from gpubox.errors import InvalidInputError
from gpubox.tools.finetune.schemas import FinetuneRequest, ResolvedBase

# Building more layers than any released decoder has (the largest have ~200) would only let a broken or hostile
# config stall the plan; such a config is not checked here (the estimator and the load refuse it later)
MAX_LAYERS = 1024


def module_types(base: ResolvedBase) -> dict[str, bool]:
    """Every named module of the base -> whether peft's LoRA can wrap it (Linear, Embedding, Conv, Conv1D).

    Cached per config file and its (mtime, size): a GGUF's config comes from parsing its whole metadata, vocabulary
    included (seconds for a 49k-token vocabulary), and plans are made again and again for the same base."""
    if base.format == "hf" or base.hf_ready:
        source, gguf = Path(base.hf_path) / "config.json", None
    else:
        source, gguf = Path(base.path), Path(base.path).name
    st = source.stat()
    return dict(_module_types(str(source.parent), gguf, st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=8)
def _module_types(folder: str, gguf: str | None, _mtime_ns: int, _size: int) -> tuple[tuple[str, bool], ...]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.pytorch_utils import Conv1D

    config = AutoConfig.from_pretrained(folder, gguf_file=gguf) if gguf else AutoConfig.from_pretrained(folder)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config.get_text_config(), "num_hidden_layers", 0)
    if not isinstance(layers, int) or layers > MAX_LAYERS:
        raise ValueError(f"num_hidden_layers={layers!r:.40} is not a plausible layer count")
    supported = (
        torch.nn.Linear,
        torch.nn.Embedding,
        torch.nn.Conv1d,
        torch.nn.Conv2d,
        torch.nn.Conv3d,
        torch.nn.MultiheadAttention,
        Conv1D,
    )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return tuple((name, isinstance(m, supported)) for name, m in model.named_modules() if name)


def check(req: FinetuneRequest, base: ResolvedBase, modules: dict[str, bool] | None = None) -> list[str]:
    """Refuse listed target modules the base does not have (or peft cannot wrap); warnings when unchecked."""
    targets = req.lora_target_modules
    if req.method == "full" or not isinstance(targets, list):
        return []  # 'all-linear' is resolved by peft itself; a full fine-tune has no adapter
    if modules is None:
        try:
            modules = module_types(base)
        except Exception as exc:  # any failure here only means the names could not be read: warn, don't refuse
            return [
                f"lora_target_modules were not checked against {base.name}: its module names could not be read "
                f"({type(exc).__name__}: {str(exc)[:200]}); a wrong name fails the job when the model loads"
            ]
    usable = sorted({name.rsplit(".", 1)[-1] for name, ok in modules.items() if ok})
    missing, unusable = [], []
    for t in targets:
        hits = [ok for name, ok in modules.items() if name == t or name.endswith("." + t)]
        if not hits:
            missing.append(t)
        elif not all(hits):
            unusable.append(t)
    if missing or unusable:
        problems = []
        if missing:
            problems.append(f"{_names(missing)} not found in {base.name}")
        if unusable:
            problems.append(f"{_names(unusable)} name(s) a block LoRA cannot wrap, not a layer")
        raise InvalidInputError(
            f"lora_target_modules: {'; '.join(problems)}. The model's LoRA-capable modules are: "
            f"{', '.join(usable[:40])}; list some of those, or pass 'all-linear'"
        )
    return []


def _names(items: list[Any]) -> str:
    return ", ".join(repr(str(i)[:100]) for i in items[:10]) + (" ..." if len(items) > 10 else "")
