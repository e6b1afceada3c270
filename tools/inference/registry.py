"""What can be run: the bundled SmolLM2 GGUF, GGUF files, HF model folders and LoRA adapters in the model dirs
(and the adapters fine-tuning writes under the state dir).

Metadata is cached per file path, keyed by (mtime, size): reading a GGUF header of a multi-GB file costs
seconds, and infer_models is called often. A changed file has a new key and is read again.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from gpubox.bundled import smollm2_gguf
from gpubox.errors import GpuboxError, InvalidInputError, NotFoundError, PathNotAllowedError
from gpubox.paths import NAME_MAX, check_tree_inside, open_inside, resolve_inside
from gpubox.settings import Settings
from gpubox.tools.estimate.modelinfo import ResolvedModel, read_gguf
from gpubox.tools.inference.schemas import LoadedInfo, ModelEntry

log = logging.getLogger("gpubox.inference")

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
JSON_MAX_BYTES = 64 * 1024 * 1024  # a sharded checkpoint's index of a very large model is a few MB
DEFAULT_MODEL = "smollm2-135m-instruct"
T = TypeVar("T")


@dataclass
class Discovered:
    name: str
    path: Path
    format: Literal["gguf", "hf", "lora"]
    bundled: bool = False
    base_model: str | None = None


def is_hf_folder(p: Path) -> bool:
    return (p / "config.json").is_file() and any((p / w).exists() for w in WEIGHT_FILES)


def inside_roots(path: Path, roots: Sequence[Path], what: str = "model") -> Path:
    """`path` resolved, refused when it (or a symlink on the way) leaves the roots; a folder is refused when a
    file in it does (check_model_folder). The message never says where a symlink points or whether something
    outside exists."""
    try:
        resolved = resolve_inside(path, roots, what=what)
    except PathNotAllowedError:
        raise PathNotAllowedError(
            f"{what} {path} resolves outside the model directories; symlinks that leave them are refused"
        ) from None
    except NotFoundError:
        raise NotFoundError(f"{what} {path} no longer exists; call infer_models to refresh the list") from None
    if resolved.is_dir():
        check_model_folder(resolved, roots, what=what)
    return resolved


def check_model_folder(folder: Path, roots: Sequence[Path], what: str = "model folder") -> None:
    """Refuse an HF model or adapter folder that would make transformers/peft read outside the roots.

    They open the folder's files by name and follow symlinks, so every entry is checked (check_tree_inside); a
    sharded checkpoint's index names its shard files and transformers joins those names onto the folder
    ("../x" or "/x" would leave it), so those must be plain file names. (tokenizer_config.json's "*_file" paths
    are ignored by transformers >= 5 itself.)
    """
    check_tree_inside(folder, roots, what=what)
    for index in INDEX_FILES:
        if (folder / index).is_file():
            weight_map = read_json_object(folder / index, roots).get("weight_map")
            if not isinstance(weight_map, dict):
                raise InvalidInputError(f"{folder / index} has no 'weight_map' object; save the model again")
            for shard in set(weight_map.values()):
                _plain_name(shard, folder / index)


def _plain_name(value: Any, source: Path) -> None:
    ok = isinstance(value, str) and value not in ("", ".", "..") and not any(c in value for c in "/\\\x00")
    if not ok or len(str(value).encode("utf-8", "surrogateescape")) > NAME_MAX:
        raise InvalidInputError(
            f"{source} names the file {repr(value)[:80]}, which is not a plain file name in the folder; "
            "transformers would read it from elsewhere. Save the model again with save_pretrained"
        )


def read_json_object(path: Path, roots: Sequence[Path]) -> dict[str, Any]:
    """A JSON object file inside the roots, size-bounded; anything else is an InvalidInputError naming it."""
    with open_inside(path, roots, what="model file") as fh:
        raw = fh.read(JSON_MAX_BYTES + 1)
    try:
        data = json.loads(raw.decode("utf-8")) if len(raw) <= JSON_MAX_BYTES else None
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        data = None
    if not isinstance(data, dict):
        raise InvalidInputError(
            f"{path} is not a JSON object of at most {JSON_MAX_BYTES // 2**20} MiB; fix or remove the file"
        )
    return data


def registry_dirs(settings: Settings) -> list[Path]:
    """Where infer_models looks: the configured model dirs, merged models and fine-tuned adapters."""
    return [*settings.model_dirs, settings.state_dir / "models", settings.state_dir / "finetune" / "adapters"]


def registry_roots(settings: Settings) -> list[Path]:
    """Where model files (and what a symlink in a model dir points to) may live."""
    bundled = smollm2_gguf()
    s = settings
    return [*s.model_dirs, *s.allowed_roots, s.state_dir, *([bundled.parent] if bundled else [])]


def discover(model_dirs: Sequence[Path], roots: Sequence[Path] | None = None) -> dict[str, Discovered]:
    found: dict[str, Discovered] = {}
    bundled = smollm2_gguf()
    if bundled is not None:
        found[DEFAULT_MODEL] = Discovered(DEFAULT_MODEL, bundled, "gguf", bundled=True)
    roots = [Path(r).resolve() for r in (roots if roots is not None else model_dirs)]
    for base in model_dirs:
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            try:
                if p.is_symlink() and not any(p.resolve().is_relative_to(r) for r in roots):
                    log.warning("skipping %s: a symlink that leaves the model directories", p)
                    continue
                if p.is_file() and p.suffix == ".gguf" and "mmproj" not in p.name:
                    found.setdefault(p.stem.lower(), Discovered(p.stem.lower(), p, "gguf"))
                elif p.is_dir() and (p / "adapter_config.json").is_file():
                    try:
                        cfg = json.loads((p / "adapter_config.json").read_text())
                        base_model = cfg.get("base_model_name_or_path") if isinstance(cfg, dict) else None
                    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                        base_model = None
                    found.setdefault(p.name.lower(), Discovered(p.name.lower(), p, "lora", base_model=base_model))
                elif p.is_dir() and is_hf_folder(p):
                    found.setdefault(p.name.lower(), Discovered(p.name.lower(), p, "hf"))
            except (OSError, RuntimeError, ValueError) as exc:  # an unreadable entry or symlink loop: skip it
                log.warning("skipping %s: %s", p, exc)
    return found


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_mtime_ns, st.st_size


class MetaCache:
    """Per-path metadata, re-read only when the file's (mtime, size) changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[tuple[str, Path], tuple[tuple[int, int], Any]] = {}

    def _get(self, kind: str, path: Path, stamp: tuple[int, int], read: Callable[[], T]) -> T:
        with self._lock:
            hit = self._data.get((kind, path))
        if hit is not None and hit[0] == stamp:
            if isinstance(hit[1], GpuboxError):  # a broken file is not read again until it changes
                raise hit[1].with_traceback(None)
            return hit[1]
        try:
            value = read()  # outside the lock: a slow header read must not stall other lookups
        except GpuboxError as exc:  # infer_models re-read two broken 98 MB files in full on every call
            with self._lock:
                self._data[(kind, path)] = (stamp, exc)
            raise
        with self._lock:
            self._data[(kind, path)] = (stamp, value)
        return value

    def gguf(self, path: Path) -> ResolvedModel:
        return self._get("gguf", path, _stamp(path), lambda: read_gguf(path))

    def json_file(self, path: Path) -> dict[str, Any]:
        """A JSON object file (config.json, adapter_config.json); a broken one is an InvalidInputError naming it."""

        def read() -> dict[str, Any]:
            try:
                data = json.loads(path.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise InvalidInputError(f"{path} is not valid JSON ({exc}); fix or remove the file") from None
            if not isinstance(data, dict):
                raise InvalidInputError(f"{path} must hold a JSON object, not {type(data).__name__}")
            return data

        try:
            stamp = _stamp(path)
        except OSError:
            raise NotFoundError(f"{path} is missing; the model folder needs it") from None
        return self._get("json", path, stamp, read)


def _dir_size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(dirpath, f)).st_size
            except OSError:
                continue
    return total


def size_of(d: Discovered) -> int:
    """Bytes on disk; a folder is walked with stat only (cheap next to a header read, and always current)."""
    return d.path.stat().st_size if d.path.is_file() else _dir_size(d.path)


def describe(meta: MetaCache, d: Discovered, loaded: LoadedInfo | None) -> ModelEntry:
    """What infer_models says of one model: its metadata from the file, or the problem reading it."""
    arch = params = quant = ctx = problem = None
    template = False
    try:
        if d.format == "gguf":
            rm = meta.gguf(d.path)
            arch, params, quant, ctx = rm.shape.source, rm.shape.params(), rm.weight_format, rm.shape.max_context
            template = rm.chat_template
        elif d.format == "hf":
            cfg = meta.json_file(d.path / "config.json")
            arch = str((cfg.get("architectures") or [cfg.get("model_type")])[0])
            mp = cfg.get("max_position_embeddings")
            ctx = mp if isinstance(mp, int) else None
            qc = cfg.get("quantization_config")
            quant = (qc.get("quant_method") if isinstance(qc, dict) else None) or str(cfg.get("torch_dtype", ""))
            tok = d.path / "tokenizer_config.json"
            template = (d.path / "chat_template.jinja").is_file() or (
                tok.is_file() and "chat_template" in meta.json_file(tok)
            )
    except (GpuboxError, OSError, LookupError, TypeError, ValueError) as exc:  # listed with the reason, not fatal
        problem = str(exc)
    return ModelEntry(
        name=d.name,
        path=str(d.path),
        format=d.format,
        architecture=arch,
        params=params,
        quantization=quant,
        context_length=ctx,
        size_bytes=size_of(d),
        chat_template=template,
        base_model=d.base_model,
        bundled=d.bundled,
        loaded=loaded,
        problem=problem,
    )


def base_of(adapter: Discovered, found: dict[str, Discovered], finetune_bases: Path) -> Discovered:
    """The base model a LoRA adapter was trained on, among `found` (or an HF base fine-tuning keeps in gpubox's
    own state dir, `finetune_bases`, outside the model dirs)."""
    base = adapter.base_model or ""
    if base.startswith("/") and "\x00" not in base:
        resolved = Path(base).resolve()
        if resolved.is_relative_to(finetune_bases.resolve()) and is_hf_folder(resolved):
            return Discovered(resolved.name.lower(), resolved, "hf")
        for d in found.values():
            if d.format != "lora" and d.path.resolve() == resolved:
                return d
    for cand in (base.rstrip("/").split("/")[-1].lower(), Path(base).name.lower()):
        if cand in found and found[cand].format != "lora":
            return found[cand]
    raise NotFoundError(
        f"adapter {adapter.name} was trained on '{base}', which is not among the models here; "
        "put the base model in a model dir"
    )


def check_files(d: Discovered, adapter_d: Discovered | None, roots: list[Path], meta: MetaCache) -> None:
    """Re-resolve right before opening: refuse what left the roots; name the file and problem if broken."""
    if d.format == "gguf":
        with open_inside(inside_roots(d.path, roots), roots, what="model file") as fh:
            magic = fh.read(4)
        if magic != b"GGUF":
            raise InvalidInputError(f"{d.path} is not a GGUF file (it does not start with 'GGUF')")
    else:
        inside_roots(d.path, roots, what="model folder")
        meta.json_file(d.path / "config.json")
    if adapter_d is not None:
        inside_roots(adapter_d.path, roots, what="adapter folder")
        meta.json_file(adapter_d.path / "adapter_config.json")
