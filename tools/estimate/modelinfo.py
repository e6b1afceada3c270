"""Model shapes from the catalog, a Hugging Face config.json, or a GGUF header (via the `gguf` package), and the
summary of one that every estimate reports."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpubox.errors import InvalidInputError, MissingExtraError, NotFoundError, UnknownNameError
from gpubox.paths import open_inside, resolve_inside
from gpubox.tools.estimate.catalog import Catalog, ModelShape
from gpubox.tools.estimate.formats import file_type_name
from gpubox.tools.estimate.schemas import ModelSummary

MAX_CONFIG_BYTES = 4 * 1024 * 1024
# llama.cpp general.file_type -> our weight-format names, used when the `gguf` enum does not know a code
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


def summary(rm: ResolvedModel) -> ModelSummary:
    """The model as an estimate reports it: its shape and where that was read."""
    s = rm.shape
    return ModelSummary(
        id=s.id,
        source=rm.source,
        params=s.params(),
        params_b=round(s.params() / 1e9, 3),
        layers=s.layers,
        hidden=s.hidden,
        heads=s.heads,
        kv_heads=s.kv_heads,
        head_dim=s.head_dim,
        intermediate=s.intermediate,
        vocab=s.vocab,
        tied_embeddings=s.tied_embeddings,
        max_context=s.max_context,
        sliding_window=s.sliding_window,
    )


# Bounds far beyond any released decoder (the largest have ~200 layers, hidden 32k, vocab 1M, 10M context):
# a value outside them is a broken or hostile file, and planning with it would overflow or never finish.
LIMITS = {
    "hidden_size": 1 << 17,
    "num_attention_heads": 1 << 12,
    "num_key_value_heads": 1 << 12,
    "num_hidden_layers": 4096,
    "head_dim": 1 << 14,
    "intermediate_size": 1 << 20,
    "vocab_size": 1 << 24,
    "max_position_embeddings": 1 << 27,
    "sliding_window": 1 << 27,
    "sliding_window_pattern": 4096,
}


def _field(text: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = text.get(key)
    if value is None:
        if default is None:
            raise InvalidInputError(f"{where}: field '{key}' is missing; only decoder-only LMs are supported")
        return default
    # bool is an int subclass, floats must be whole: 1e308 or 12.5 heads is a broken file, not a model
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise InvalidInputError(f"{where}: field '{key}' must be a positive integer, got {value!r:.60}")
    if isinstance(value, float) and (not value.is_integer() or abs(value) > 2**53):
        raise InvalidInputError(f"{where}: field '{key}' must be a positive integer, got {value!r:.60}")
    n = int(value)
    if not 1 <= n <= LIMITS[key]:
        raise InvalidInputError(f"{where}: field '{key}' = {n} is outside 1..{LIMITS[key]}")
    return n


def _from_config(cfg: Any, name: str, where: str = "config.json") -> ModelShape:
    if not isinstance(cfg, dict):
        raise InvalidInputError(f"{where}: expected a JSON object at the top level, got {type(cfg).__name__}")
    text = cfg.get("text_config", cfg)  # multimodal configs nest the LM
    if not isinstance(text, dict):
        raise InvalidInputError(f"{where}: field 'text_config' must be an object, got {type(text).__name__}")
    if "text_config" in cfg:
        where = f"{where} (text_config)"
    h = _field(text, "hidden_size", where)
    heads = _field(text, "num_attention_heads", where)
    window = _field(text, "sliding_window", where, 0) if text.get("sliding_window_pattern") else 0
    tied = cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    return ModelShape(
        id=name,
        layers=_field(text, "num_hidden_layers", where),
        hidden=h,
        heads=heads,
        kv_heads=_field(text, "num_key_value_heads", where, heads),
        head_dim=_field(text, "head_dim", where, max(1, h // heads)),
        intermediate=_field(text, "intermediate_size", where),
        vocab=_field(text, "vocab_size", where),
        tied_embeddings=tied is True,
        max_context=_field(text, "max_position_embeddings", where, 4096),
        sliding_window=window or None,
        global_every=_field(text, "sliding_window_pattern", where) if window else None,
        source="config.json",
        params_override=None,
    )


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

    def n(key: str, default: Any = None) -> int:
        """A count, at least 1 (stored as an integer, or a float); a per-layer list (OpenELM, Jamba) counts as its
        largest."""
        value = f(key, default)
        value = max(value, default=None) if isinstance(value, list) else value
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 1:
            raise InvalidInputError(
                f"{path} has no usable '{arch}.{key}' in its GGUF metadata (got {value!r}), so its size cannot be "
                f"planned; a GGUF converted by llama.cpp for architecture {arch!r} has it"
            )
        return int(value)

    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = len(tokens.data) if tokens is not None else None
    names = {t.name for t in reader.tensors}
    heads = n("attention.head_count", 1)
    h = n("embedding_length")
    shape = ModelShape(
        id=path.stem,
        layers=n("block_count"),
        hidden=h,
        heads=heads,
        kv_heads=n("attention.head_count_kv", heads),
        head_dim=n("attention.key_length", h // max(1, heads)),
        intermediate=n("feed_forward_length"),
        vocab=int(vocab or n("vocab_size", 32000)),
        tied_embeddings="output.weight" not in names,
        max_context=n("context_length", 4096),
        sliding_window=window if isinstance(window := f("attention.sliding_window"), int) and window > 0 else None,
        global_every=6 if f("attention.sliding_window") and arch.startswith("gemma3") else None,
        source=f"gguf ({arch})",
        params_override=int(sum(int(t.n_elements) for t in reader.tensors)),
    )
    ftype = fields.get("general.file_type")
    return ResolvedModel(
        shape=shape,
        source="gguf",
        path=path,
        weight_format=_file_type(ftype),
        weight_bytes=int(sum(int(t.n_bytes) for t in reader.tensors)),
        chat_template="tokenizer.chat_template" in reader.fields,
    )


def _file_type(code: Any) -> str | None:
    if not isinstance(code, int):
        return None
    return file_type_name(code) or GGUF_FILE_TYPES.get(code)


def resolve_model(spec: str, catalog: Catalog, roots: Sequence[Path]) -> ResolvedModel:
    """A catalog name, or a path (inside the allowed roots / model dirs) to a .gguf file or HF folder."""
    # Whether a path exists must not decide how it is read: that would tell a caller which files exist
    # outside the roots. Anything path-shaped that is not a catalog name is resolved inside the roots.
    looks_like_path = spec.endswith(".gguf") or "/" in spec or spec.startswith("~")
    if not looks_like_path:
        return ResolvedModel(shape=catalog.model(spec), source="catalog")
    if not spec.endswith(".gguf"):
        with contextlib.suppress(UnknownNameError):
            return ResolvedModel(shape=catalog.model(spec), source="catalog")
    path = resolve_inside(spec, roots, what="model path")
    if path.is_file() and path.suffix == ".gguf":
        return read_gguf(path)
    cfg = path / "config.json" if path.is_dir() else path
    # lstat-based: a symlinked config.json goes to open_inside, which refuses one that leaves the roots
    # without saying whether its target exists
    if cfg.name != "config.json" or not (cfg.is_symlink() or cfg.is_file()):
        raise NotFoundError(f"{path} is neither a .gguf file nor a folder with config.json")
    try:
        # re-checked at open time: a config.json that is (or became) a symlink out of the roots is refused
        with open_inside(cfg, roots, what="model config") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise InvalidInputError(f"{cfg} is over {MAX_CONFIG_BYTES} bytes; a model config.json is a few KB")
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{cfg} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"{cfg} is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise InvalidInputError(f"{cfg} is nested too deeply to be a model config") from exc
    return ResolvedModel(shape=_from_config(data, cfg.parent.name, str(cfg)), source="config.json", path=cfg.parent)
