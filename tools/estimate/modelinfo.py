"""Model shapes from the catalog, a Hugging Face config.json, or a GGUF header (via the `gguf` package)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpubox.errors import InvalidInputError, MissingExtraError, NotFoundError
from gpubox.paths import resolve_inside
from gpubox.tools.estimate.catalog import Catalog, ModelShape

# llama.cpp general.file_type -> our weight-format names
GGUF_FILE_TYPES = {
    0: "f32",
    1: "f16",
    2: "q4_0",
    3: "q4_1",
    7: "q8_0",
    8: "q5_0",
    9: "q5_1",
    10: "q2_k",
    11: "q3_k_s",
    12: "q3_k_m",
    13: "q3_k_l",
    14: "q4_k_s",
    15: "q4_k_m",
    16: "q5_k_s",
    17: "q5_k_m",
    18: "q6_k",
    32: "bf16",
}


@dataclass
class ResolvedModel:
    shape: ModelShape
    source: str  # "catalog", "config.json" or "gguf"
    path: Path | None = None
    weight_format: str | None = None  # known when read from a GGUF file
    weight_bytes: int | None = None  # exact tensor bytes of a GGUF file
    chat_template: bool = False  # a GGUF file embeds tokenizer.chat_template


def _from_config(cfg: dict[str, Any], name: str) -> ModelShape:
    text = cfg.get("text_config", cfg)  # multimodal configs nest the LM
    try:
        h = int(text["hidden_size"])
        heads = int(text["num_attention_heads"])
        return ModelShape(
            id=name,
            layers=int(text["num_hidden_layers"]),
            hidden=h,
            heads=heads,
            kv_heads=int(text.get("num_key_value_heads") or heads),
            head_dim=int(text.get("head_dim") or h // heads),
            intermediate=int(text["intermediate_size"]),
            vocab=int(text["vocab_size"]),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            max_context=int(text.get("max_position_embeddings") or 4096),
            sliding_window=text.get("sliding_window") if text.get("sliding_window_pattern") else None,
            global_every=text.get("sliding_window_pattern"),
            source="config.json",
            params_override=None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInputError(
            f"config.json of {name} lacks a decoder field ({exc}); only decoder-only LMs are supported"
        ) from exc


def _gguf_value(field: Any) -> Any:
    contents = getattr(field, "contents", None)
    if callable(contents):
        return contents()
    return field.parts[field.data[0]].tolist()[0] if field.data else None


def read_gguf(path: Path) -> ResolvedModel:
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise MissingExtraError("Reading GGUF metadata", "hf", "gguf") from exc
    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # corrupt or not a GGUF file
        raise InvalidInputError(f"{path} is not a readable GGUF file: {exc}") from exc
    fields = {k: _gguf_value(v) for k, v in reader.fields.items() if not k.startswith("tokenizer.ggml.")}
    arch = fields.get("general.architecture", "llama")

    def f(key: str, default: Any = None) -> Any:
        return fields.get(f"{arch}.{key}", default)

    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = len(tokens.data) if tokens is not None else None
    names = {t.name for t in reader.tensors}
    heads = int(f("attention.head_count", 1))
    h = int(f("embedding_length"))
    shape = ModelShape(
        id=path.stem,
        layers=int(f("block_count")),
        hidden=h,
        heads=heads,
        kv_heads=int(f("attention.head_count_kv", heads)),
        head_dim=int(f("attention.key_length", h // heads)),
        intermediate=int(f("feed_forward_length")),
        vocab=int(vocab or f("vocab_size", 32000)),
        tied_embeddings="output.weight" not in names,
        max_context=int(f("context_length", 4096)),
        sliding_window=f("attention.sliding_window"),
        global_every=6 if f("attention.sliding_window") and arch.startswith("gemma3") else None,
        source=f"gguf ({arch})",
        params_override=int(sum(int(t.n_elements) for t in reader.tensors)),
    )
    ftype = fields.get("general.file_type")
    return ResolvedModel(
        shape=shape,
        source="gguf",
        path=path,
        weight_format=GGUF_FILE_TYPES.get(int(ftype)) if ftype is not None else None,
        weight_bytes=int(sum(int(t.n_bytes) for t in reader.tensors)),
        chat_template="tokenizer.chat_template" in reader.fields,
    )


def resolve_model(spec: str, catalog: Catalog, roots: Sequence[Path]) -> ResolvedModel:
    """A catalog name, or a path (inside the allowed roots / model dirs) to a .gguf file or HF folder."""
    looks_like_path = spec.endswith(".gguf") or ("/" in spec and Path(spec).expanduser().exists())
    if not looks_like_path:
        return ResolvedModel(shape=catalog.model(spec), source="catalog")
    path = resolve_inside(spec, roots, what="model path")
    if path.is_file() and path.suffix == ".gguf":
        return read_gguf(path)
    cfg = path / "config.json" if path.is_dir() else path
    if cfg.name != "config.json" or not cfg.is_file():
        raise NotFoundError(f"{path} is neither a .gguf file nor a folder with config.json")
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"{cfg} is not valid JSON: {exc}") from exc
    return ResolvedModel(shape=_from_config(data, cfg.parent.name), source="config.json", path=cfg.parent)
