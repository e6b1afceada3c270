"""The models this server can run, by name: the registry's folders and the bundled model, a name's base model
and backend. ModelManager builds on it; nothing here loads a model."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from gpubox.errors import InvalidInputError, UnknownNameError
from gpubox.settings import Settings
from gpubox.tools.inference.planning import choose_backend
from gpubox.tools.inference.registry import Discovered, MetaCache, base_of, discover, registry_dirs, registry_roots


class ModelCatalog:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.finetune = settings.state_dir / "finetune"
        self.dirs = registry_dirs(settings)
        self.meta = MetaCache()

    def roots(self) -> list[Path]:
        """Where model files (and what a symlink in a model dir points to) may live."""
        return registry_roots(self.settings)

    def discovered(self) -> dict[str, Discovered]:
        return discover(self.dirs, self.roots())

    def find(self, name: str) -> Discovered:
        if "\x00" in name:
            raise InvalidInputError("model name contains a NUL byte; pass a name from infer_models")
        found = self.discovered()
        if name.lower() in found:
            return found[name.lower()]
        raise UnknownNameError(
            "model", name, found.keys(), hint="infer_models lists them; add folders with GPUBOX_MODEL_DIRS."
        )

    def base_of(self, adapter: Discovered) -> Discovered:
        """The base model a LoRA adapter was trained on, among the models here."""
        return base_of(adapter, self.discovered(), self.finetune / "base")

    def _resolve(
        self, name: str, backend: Literal["auto", "llama.cpp", "transformers"], adapter: str | None
    ) -> tuple[Discovered, Discovered | None, Literal["llama.cpp", "transformers"]]:
        """(base model, adapter or None, backend) for a load request."""
        d = self.find(name)
        adapter_d: Discovered | None = None
        if d.format == "lora":
            adapter_d, d = d, self.base_of(d)
        elif adapter:
            adapter_d = self.find(adapter)
            if adapter_d.format != "lora":
                raise InvalidInputError(f"{adapter} is not a LoRA adapter folder (no adapter_config.json)")
        return d, adapter_d, choose_backend(d, adapter_d, backend)
