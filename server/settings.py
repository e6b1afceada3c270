"""The one settings object: env vars (GPUBOX_*), an optional TOML file, and explicit overrides.

This module is the only place that reads the environment; everything else receives a Settings.
"""

from __future__ import annotations

import contextvars
import ipaddress
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from gpubox.configfiles import check_token, check_toml, read_token_file, writable_dir
from gpubox.envlists import check_hosts, split_names, split_paths
from gpubox.errors import ConfigError

_CONFIG_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar("gpubox_config_file", default=None)

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def default_state_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "gpubox"


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


PathList = Annotated[list[Path], NoDecode]
StrList = Annotated[list[str], NoDecode]


class Settings(BaseSettings):
    """gpubox settings. Env prefix GPUBOX_ (e.g. GPUBOX_STATE_DIR); `--config file.toml` for a file."""

    model_config = SettingsConfigDict(env_prefix="GPUBOX_", extra="forbid", validate_default=True)

    _file_token: str | None = PrivateAttr(default=None)

    # --- storage and access -------------------------------------------------------------------
    state_dir: Path = Field(
        default_factory=default_state_dir,
        description="Where gpubox keeps SQLite databases, FAISS indexes, calibrations and job files.",
    )
    allowed_roots: PathList = Field(
        default_factory=lambda: [Path.cwd()],
        description="Directories tools may read (code search, model files). Default: the working directory.",
    )
    model_dirs: PathList = Field(
        default_factory=list,
        description="Directories scanned for GGUF files, HF model folders and LoRA adapters.",
    )

    # --- serving --------------------------------------------------------------------------------
    host: str = Field(default="127.0.0.1", description="Bind address for the HTTP transport.")
    port: int = Field(default=8765, ge=1, le=65535, description="TCP port for the HTTP transport.")
    token: SecretStr | None = Field(
        default=None, description="Bearer token required on every HTTP request (also --token)."
    )
    token_file: Path | None = Field(default=None, description="File holding the bearer token (first line).")
    allowed_hosts: StrList = Field(
        default_factory=list,
        description="Extra Host header values accepted over HTTP (e.g. 'gpu-box.internal:*').",
    )
    allowed_origins: StrList = Field(
        default_factory=list,
        description="Extra Origin header values accepted over HTTP (e.g. 'https://gpu-box.internal').",
    )
    max_request_body_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1024,
        le=256 * 1024 * 1024,
        description="Largest HTTP request body accepted; larger bodies get 413.",
    )
    http_request_timeout_seconds: float = Field(
        default=10.0,
        ge=0.5,
        le=600.0,
        description="A connection whose request (headers and body) has not fully arrived this long after it "
        "opened, or after the previous response, is closed (slow-client protection).",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Log level for the server's stderr log."
    )

    # --- estimator -----------------------------------------------------------------------------
    electricity_usd_per_kwh: float = Field(
        default=0.15,
        ge=0.0,
        le=5.0,
        description="Local electricity price used for on-premise cost estimates.",
    )

    # --- code search ---------------------------------------------------------------------------
    search_embedding_model: Path | None = Field(
        default=None,
        description="Local embedding model folder for code search (default: bundled all-MiniLM-L6-v2): a "
        "sentence-transformers model, or a model2vec static model (config.json model_type 'model2vec', e.g. "
        "minishlab/potion-code-16M downloaded beforehand; needs the model2vec extra). Never downloaded at run time; "
        "indexes built with another model must be dropped and re-indexed.",
    )
    search_code_adapter: bool = Field(
        default=False,
        description="With the bundled all-MiniLM-L6-v2: merge gpubox's code-tuned adapter into it (trained on doc "
        "comments and the definitions they describe, in public code outside semble's benchmark): a better vector "
        "mode, but hybrid ranking no better and a lower recall@5 on a labelled set (bench/results/code_embedder.md). "
        "Other models are used as they are. "
        "Changing it re-embeds each index on its next search_index run.",
    )
    search_max_file_bytes: int = Field(
        default=1_000_000, ge=1024, le=100_000_000, description="Files larger than this are not indexed."
    )
    search_index_wait_seconds: float = Field(
        default=20.0,
        ge=0.0,
        le=3600.0,
        description="How long search_index waits before returning and letting indexing continue in the background.",
    )
    search_ann_threshold: int = Field(
        default=200_000,
        ge=1000,
        le=100_000_000,
        description="Chunk count above which FAISS HNSW replaces the exact-ranking search (exact over fp16 vectors "
        "up to 20,000 chunks, then a 4-bit fast scan whose best candidates are rescored on the fp16 vectors).",
    )
    search_embed_batch: int = Field(default=32, ge=1, le=4096, description="Embedding batch size.")
    search_embed_max_tokens: int = Field(
        default=256,
        ge=32,
        le=512,
        description="Tokens of a chunk the embedding model reads (the rest is cut; MiniLM reads at most 512).",
    )
    search_onnx_queries: bool = Field(
        default=True,
        description="On a CPU, embed search queries with ONNX Runtime (the model exported once into the state dir; "
        "about 2x faster than PyTorch for a short query) when onnxruntime and onnx are installed.",
    )
    search_query_int8: bool = Field(
        default=True,
        description="With search_onnx_queries: the query encoder's weights in 8-bit blocks of 32 (ONNX Runtime "
        "MatMulNBits; needs onnx-ir), used only where its vectors match fp32's (cosine >= 0.999) and it is faster.",
    )
    search_embed_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto",
        description="Precision of the embedding model: auto = fp16 on a GPU, bf16 on a CPU that multiplies bf16 "
        "natively (AMX or AVX512-BF16), else fp32. Vectors from either precision can share an index.",
    )

    tools: StrList = Field(
        default_factory=list,
        description="Families (gpu, box, estimate, search, infer, serve, finetune, bench) or tool names to expose; "
        "empty: all. Resources and prompts follow the families.",
    )

    # --- box memory ledger (every family reserves here before it allocates) ---------------------
    memory_budget_gb: float | None = Field(
        default=None,
        gt=0,
        le=65_536,
        description="GB gpubox may reserve on each device (host RAM and each GPU); default: its memory minus "
        "memory_headroom_gb.",
    )
    memory_budgets: Annotated[dict[str, float], NoDecode] = Field(
        default_factory=dict,
        description="Per-device budgets overriding memory_budget_gb, e.g. 'host=8,cuda:0=70' or a JSON object.",
    )
    memory_headroom_gb: float | None = Field(
        default=None, ge=0, le=1024, description="Memory left free on each device (default: 5% of it, at least 0.5)."
    )

    # --- serving engines -------------------------------------------------------------------------
    serve_python: Path | None = Field(
        default=None,
        description="Python with vLLM for serve_start (default: <state_dir>/engines/vllm, made by `gpubox engine "
        "install vllm`, else this interpreter).",
    )
    serve_max_model_len: int = Field(
        default=2048, ge=128, le=1_048_576, description="Default max_model_len of a served model (capped at its own)."
    )
    serve_start_timeout_s: float = Field(
        default=1800, ge=30, le=86_400, description="How long an engine may take to start before it is stopped."
    )
    serve_probe_after_s: float = Field(
        default=20.0,
        ge=0.05,
        le=600,
        description="Seconds a request to an engine may go without a byte before the engine's health is probed: "
        "it keeps waiting while the probe answers, and ends with an error when it does not.",
    )
    serve_probe_timeout_s: float = Field(
        default=5.0, gt=0, le=120, description="How long an engine's health probe may take before it counts as failed."
    )

    # --- inference -----------------------------------------------------------------------------
    infer_max_resident: int = Field(default=2, ge=1, le=64, description="Models kept loaded at once (LRU eviction).")
    infer_memory_budget_gb: float | None = Field(
        default=None, gt=0, le=4096, description="Memory all resident models may use; loading more evicts the LRU."
    )
    infer_keep_alive_seconds: float = Field(
        default=300.0, ge=0, le=604_800, description="Idle time before a model unloads itself; 0 pins models."
    )
    infer_context_length: int = Field(
        default=4096, ge=128, le=1_048_576, description="Default context when loading (capped at the model's)."
    )
    infer_threads: int | None = Field(default=None, ge=1, le=512, description="CPU threads for llama.cpp (auto).")
    infer_llama_process: Literal["auto", "always", "never"] = Field(
        default="auto", description="Run each llama.cpp model in a child process (auto: GPU builds of llama.cpp)."
    )

    # --- rented box: session meter and idle guard -----------------------------------------------
    hourly_usd: float | None = Field(
        default=None, ge=0, le=10_000, description="What the box costs per hour, for the session cost meter."
    )
    price_provider: str | None = Field(
        default=None,
        max_length=100,
        description="A provider in the estimator's price catalog (e.g. 'Lambda', 'RunPod'); its dated on-demand "
        "price for the local GPU is used when hourly_usd is unset.",
    )
    price_gpu: str | None = Field(
        default=None, max_length=100, description="GPU to price with price_provider (default: the local GPU from NVML)."
    )
    budget_usd: float | None = Field(default=None, gt=0, le=1_000_000, description="Session budget in dollars.")
    session_sample_seconds: float = Field(
        default=10.0, ge=0.5, le=3600, description="How often GPU utilisation is sampled for the session meter."
    )
    idle_shutdown_minutes: float | None = Field(
        default=None,
        gt=0,
        le=10_080,
        description="Run idle_command after this long with no MCP request, no running work and the GPU idle (off).",
    )
    idle_command: str | None = Field(
        default=None,
        max_length=4096,
        description="Command (split like a shell, run without one) that stops the box, e.g. 'sudo shutdown -h now'.",
    )
    idle_grace_seconds: float = Field(
        default=120.0, ge=0, le=3600, description="Warning period before idle_command runs; any request cancels it."
    )
    idle_dry_run: bool = Field(default=False, description="Idle guard only reports what it would run.")

    @field_validator("price_provider", mode="after")
    @classmethod
    def _known_provider(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from gpubox.tools.estimate.catalog import package_catalog

        providers = sorted({p.provider for p in package_catalog().prices})
        match = [p for p in providers if p.lower() == value.strip().lower()]
        if not match:
            raise ValueError(f"unknown price_provider '{value}'; known providers: {', '.join(providers)}")
        return match[0]

    @model_validator(mode="after")
    def _idle_guard_complete(self) -> Settings:
        if self.idle_shutdown_minutes is not None and not self.idle_command and not self.idle_dry_run:
            raise ValueError("idle_shutdown_minutes needs idle_command (what stops the box) or idle_dry_run = true")
        if self.idle_command is not None:
            import shlex

            try:
                argv = shlex.split(self.idle_command)
            except ValueError as exc:
                raise ValueError(f"idle_command cannot be parsed ({exc}); check its quotes") from None
            if not argv:
                raise ValueError("idle_command is blank; give the command that stops the box")
        return self

    @field_validator("memory_budgets", mode="before")
    @classmethod
    def _budget_pairs(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().startswith("{"):
            try:
                return json.loads(value)
            except ValueError as exc:
                raise ValueError(f"memory_budgets is not valid JSON: {exc}") from None
        if isinstance(value, str):
            pairs = [p.strip() for p in value.split(",") if p.strip()]
            if any("=" not in p for p in pairs):
                raise ValueError("memory_budgets takes 'device=GB' pairs separated by commas, e.g. 'host=8,cuda:0=70'")
            return {k.strip(): v.strip() for k, v in (p.split("=", 1) for p in pairs)}
        return value

    @field_validator("memory_budgets", mode="after")
    @classmethod
    def _budget_devices(cls, value: dict[str, float]) -> dict[str, float]:
        for device, gb in value.items():
            if not re.fullmatch(r"host|cuda:\d{1,2}", device):
                raise ValueError(f"memory_budgets: unknown device '{device}'; use 'host' or 'cuda:N'")
            if not 0 < gb <= 65_536:
                raise ValueError(f"memory_budgets: {device}={gb} must be above 0 and at most 65536 GB")
        return value

    @field_validator("allowed_roots", "model_dirs", mode="before")
    @classmethod
    def _path_lists(cls, value: Any, info: ValidationInfo) -> Any:
        return split_paths(value, str(info.field_name), blank_ok=info.field_name != "allowed_roots")

    @field_validator("allowed_hosts", "allowed_origins", mode="before")
    @classmethod
    def _name_lists(cls, value: Any, info: ValidationInfo) -> Any:
        names = split_names(value, str(info.field_name))
        return check_hosts(names, str(info.field_name), origin=info.field_name == "allowed_origins")

    @field_validator("tools", mode="before")
    @classmethod
    def _tool_list(cls, value: Any) -> Any:
        # Tool and family names hold neither ',' nor ':', so both separators stay accepted as before.
        if isinstance(value, str) and not value.strip().startswith("["):
            value = value.replace(os.pathsep, ",")
        return split_names(value, "tools")

    @field_validator("state_dir", "token_file", "search_embedding_model", "serve_python", mode="after")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

    @field_validator("allowed_roots", "model_dirs", mode="after")
    @classmethod
    def _resolve_all(cls, value: list[Path]) -> list[Path]:
        return [p.expanduser().resolve() for p in value]

    @model_validator(mode="after")
    def _token_file_readable(self) -> Settings:
        # exists, not is_file: `--token-file <(pass show gpubox)` is a pipe
        if self.token_file is not None and not self.token_file.exists():
            raise ValueError(f"token_file {self.token_file} does not exist; create it or unset GPUBOX_TOKEN_FILE")
        return self

    # --- derived --------------------------------------------------------------------------------
    def resolved_token(self) -> str | None:
        """The bearer token from `token`, else the first line of `token_file`, else None."""
        if self.token is not None:
            value = self.token.get_secret_value().strip()
            if not value:  # a blank token must not pass for "auth configured"
                raise ConfigError("the token (GPUBOX_TOKEN / --token) is blank; set a real token or unset it")
            return check_token(value, "the token (GPUBOX_TOKEN / --token)")
        if self.token_file is not None:
            # Read once per Settings: start-up asks several times, and a pipe reads empty the second time.
            if self._file_token is None:
                self._file_token = read_token_file(self.token_file)
            return self._file_token
        return None

    def ensure_state_dir(self) -> Path:
        """The state dir, made if missing; ConfigError saying why when it cannot hold gpubox's files."""
        return writable_dir(self.state_dir, "state_dir", "--state-dir or GPUBOX_STATE_DIR")

    @classmethod
    def load(cls, config_file: Path | str | None = None, **overrides: Any) -> Settings:
        """Build settings from overrides > env > TOML file (config_file or GPUBOX_CONFIG)."""
        path = Path(config_file) if config_file else None
        if path is None and os.environ.get("GPUBOX_CONFIG"):
            path = Path(os.environ["GPUBOX_CONFIG"])
        if path is not None:
            check_toml(path)
        token = _CONFIG_FILE.set(path)
        try:
            return cls(**{k: v for k, v in overrides.items() if v is not None})
        finally:
            _CONFIG_FILE.reset(token)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = _CONFIG_FILE.get()
        if path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)
