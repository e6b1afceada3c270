"""GPU, price and model-shape catalogs: package data, extended by JSON files in <state_dir>/catalog/.

A user file `gpus.json` / `models.json` adds or replaces entries by id; `prices.json` adds price rows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from gpubox.errors import ConfigError, InvalidInputError, UnknownNameError
from gpubox.tools.estimate.schemas import ProviderCost


class GpuSpec(BaseModel):
    id: str
    name: str
    vram_gb: float = Field(description="Memory in GB (1e9 bytes), as marketed")
    bandwidth_gbs: float = Field(description="Peak memory bandwidth, GB/s")
    bf16_tflops: float = Field(description="Dense BF16/FP16 tensor TFLOPS (FP32 accumulate)")
    fp32_tflops: float
    tdp_w: float
    gpu_class: str = Field(description="datacenter-hbm, datacenter-gddr, workstation-gddr, consumer-gddr, apple")
    memory_type: str
    bf16_supported: bool = True
    aliases: list[str] = Field(default_factory=list)
    sources: dict[str, str] = Field(default_factory=dict)


class Price(BaseModel):
    provider: str
    gpu: str
    usd_per_hour: float = Field(description="On-demand $ per GPU-hour")
    spot_usd_per_hour: float | None = None
    observed: str = Field(description="Date the price was observed at its source")
    source: str
    note: str | None = None


class ModelShape(BaseModel):
    id: str
    layers: int = Field(ge=1)
    hidden: int = Field(ge=1)
    heads: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    intermediate: int = Field(ge=1)
    vocab: int = Field(ge=1)
    tied_embeddings: bool
    max_context: int = Field(ge=1)
    sliding_window: int | None = Field(None, description="Local-attention window of the non-global layers")
    global_every: int | None = Field(None, description="Every n-th layer attends globally (others: window)")
    aliases: list[str] = Field(default_factory=list)
    source: str = ""
    params_override: int | None = Field(None, description="Exact parameter count when read from weights")

    # --- parameter counts (all exact for Llama-style decoder blocks) ------------------------------
    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(d_in, d_out) of every projection in one block."""
        q_out = self.heads * self.head_dim
        kv_out = self.kv_heads * self.head_dim
        h, f = self.hidden, self.intermediate
        return {
            "q_proj": (h, q_out),
            "k_proj": (h, kv_out),
            "v_proj": (h, kv_out),
            "o_proj": (q_out, h),
            "gate_proj": (h, f),
            "up_proj": (h, f),
            "down_proj": (f, h),
        }

    def linear_params_per_layer(self) -> int:
        return sum(i * o for i, o in self.linear_shapes().values())

    def embedding_params(self) -> int:
        """Input embedding plus (untied) output head."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def params(self) -> int:
        if self.params_override:
            return self.params_override
        norms = self.layers * 2 * self.hidden + self.hidden
        return self.layers * self.linear_params_per_layer() + self.embedding_params() + norms

    def kv_layers_at(self, context: int) -> float:
        """Layers' worth of full-context KV: sliding-window layers only keep `window` tokens."""
        if not self.sliding_window or not self.global_every:
            return float(self.layers)
        n_global = self.layers // self.global_every
        n_local = self.layers - n_global
        return n_global + n_local * min(context, self.sliding_window) / max(context, 1)


DATA = "gpubox.tools.estimate"


def _package_json(name: str) -> dict[str, Any]:
    return json.loads(resources.files(DATA).joinpath("data", name).read_text(encoding="utf-8"))


def _user_json(state_dir: Path | None, name: str) -> dict[str, Any]:
    """A user catalog file as a JSON object ({} when absent); anything else is refused in one line naming it."""
    if state_dir is None:
        return {}
    path = state_dir / "catalog" / name
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}); fix or remove it") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} cannot be read as UTF-8 text ({exc}); fix or remove it") from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f'{path} must be a JSON object like {{"{name[:-5]}": [...]}}, not {_kind(data)}; fix or remove it'
        )
    return data


def _user_entries(state_dir: Path | None, key: str) -> list[dict[str, Any]]:
    """The `key` list of a user catalog file, each entry an object (ids are checked by the caller's model)."""
    entries = _user_json(state_dir, f"{key}.json").get(key, [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        path = state_dir / "catalog" / f"{key}.json" if state_dir else key
        raise ConfigError(f'"{key}" in {path} must be a list of JSON objects; fix or remove it')
    return entries


def _kind(data: object) -> str:
    return {list: "a list", str: "a string", type(None): "null"}.get(type(data), f"a {type(data).__name__}")


def norm(name: str) -> str:
    """Case, spaces, dashes and underscores, the vendor prefix and 'GB' vs ' GB' do not matter:
    'NVIDIA A100-SXM4-40GB', 'a100 sxm4 40 gb' -> 'a100sxm440gb'."""
    key = re.sub(r"[^a-z0-9.]", "", name.lower())
    return key.removeprefix("nvidia")


class AmbiguousNameError(InvalidInputError):
    """A name matches the start of several entries (e.g. 'A100': 40/80 GB, SXM/PCIe)."""


class Catalog:
    def __init__(self, state_dir: Path | None = None) -> None:
        try:
            self.gpus = self._merge(GpuSpec, "gpus", state_dir)
            self.models = self._merge(ModelShape, "models", state_dir)
            user_prices = _user_entries(state_dir, "prices")
            self.prices = [Price(**p) for p in _package_json("prices.json")["prices"] + user_prices]
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "entry"
            raise ConfigError(
                f"a catalog file in {state_dir}/catalog is malformed: a {exc.title} entry's {where}: {first['msg']} "
                f"({exc.error_count()} problem(s) in all); fix or remove it"
            ) from exc
        self._gpu_index = self._index(self.gpus)
        self._model_index = self._index(self.models)

    @staticmethod
    def _merge(model_cls: type[Any], key: str, state_dir: Path | None) -> dict[str, Any]:
        out = {e["id"]: model_cls(**e) for e in _package_json(f"{key}.json")[key]}
        for e in _user_entries(state_dir, key):
            entry = model_cls(**e)  # validated first: an entry without an id is a ValidationError, not a KeyError
            out[entry.id] = entry
        return out

    @staticmethod
    def _index(entries: dict[str, Any]) -> dict[str, str]:
        idx: dict[str, str] = {}
        for eid, e in entries.items():
            for n in [eid, *e.aliases]:
                idx[norm(n)] = eid
        return idx

    def find_gpu(self, name: str) -> GpuSpec | None:
        """Exact id or alias (normalised), else None: never a substring match, so 'L40' is not the L4."""
        key = self._gpu_index.get(norm(name))
        return self.gpus[key] if key is not None else None

    def gpu(self, name: str) -> GpuSpec:
        found = self.find_gpu(name)
        if found is not None:
            return found
        key = norm(name)
        starts = sorted({gid for n, gid in self._gpu_index.items() if key and n.startswith(key)})
        if len(starts) > 1:
            raise AmbiguousNameError(
                f"GPU name '{name}' is ambiguous: it could be {', '.join(starts)}. Pass one of these ids "
                "(memory size and form factor change bandwidth and price)."
            )
        raise UnknownNameError("GPU", name, self.gpus.keys(), hint="Or pass 'local' or 'all'.")

    def model(self, name: str) -> ModelShape:
        key = self._model_index.get(norm(name))
        if key is None:
            raise UnknownNameError(
                "model",
                name,
                self.models.keys(),
                hint="Or pass a path to a GGUF file or a Hugging Face model folder (with config.json).",
            )
        return self.models[key]

    def prices_for(self, gpu_id: str) -> list[Price]:
        return sorted((p for p in self.prices if p.gpu == gpu_id), key=lambda p: p.usd_per_hour)

    def costs(self, gpu_id: str, usd: Callable[[float], float]) -> list[ProviderCost]:
        """One row per provider price of `gpu_id`; `usd(hourly price)` is the cost of the work at that price."""
        return [
            ProviderCost(
                provider=p.provider,
                usd_per_hour=p.usd_per_hour,
                spot_usd_per_hour=p.spot_usd_per_hour,
                price_observed=p.observed,
                source=p.source,
                usd=usd(p.usd_per_hour),
            )
            for p in self.prices_for(gpu_id)
        ]


@cache
def package_catalog() -> Catalog:
    return Catalog(None)
