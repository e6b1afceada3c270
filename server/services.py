"""Typed access to each family's service: the one way families reach each other.

Each accessor builds its service once per AppState (thread-safe) and wires what it needs from the others here,
so no family looks another up by a string key or reads its private state. Imports are lazy: asking for the
ledger never imports torch or llama.cpp.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gpubox.state import AppState

if TYPE_CHECKING:
    from gpubox.tools.bench.service import BenchService
    from gpubox.tools.box.ledger import Ledger
    from gpubox.tools.estimate.service import Estimator
    from gpubox.tools.finetune.merge import Merger
    from gpubox.tools.finetune.service import Finetuner
    from gpubox.tools.gpu.idle import IdleGuard
    from gpubox.tools.gpu.session import SessionMeter
    from gpubox.tools.inference.manager import ModelManager
    from gpubox.tools.search.service import SearchService
    from gpubox.tools.serve.service import Adapter, ServeService

LEDGER, ESTIMATE, SEARCH, INFERENCE, FINETUNE, MERGE, BENCH, SESSION, IDLE, SERVE = (
    "ledger",
    "estimate",
    "search",
    "inference",
    "finetune",
    "finetune_merge",
    "bench",
    "session",
    "idle_guard",
    "serve",
)


def ledger(state: AppState) -> Ledger:
    from gpubox.tools.box.ledger import Ledger

    return state.service(LEDGER, Ledger)


def estimator(state: AppState) -> Estimator:
    from gpubox.tools.estimate.service import Estimator

    return state.service(ESTIMATE, lambda s: Estimator(s, runnable=lambda: runnable_models(state)))


def runnable_models(state: AppState) -> tuple[dict[str, Path], list[Path]]:
    """What infer_models lists, by name (each GGUF file or HF folder; a LoRA adapter is no model to estimate), and
    the roots those may live in; read from the model dirs without building the inference manager."""
    from gpubox.tools.inference.registry import discover, registry_dirs, registry_roots

    roots = registry_roots(state.settings)
    found = discover(registry_dirs(state.settings), roots)
    return {name: d.path for name, d in found.items() if d.format != "lora"}, roots


def search(state: AppState) -> SearchService:
    from gpubox.tools.search.service import SearchService

    return state.service(SEARCH, lambda s: SearchService(s, ledger(state)))


def models(state: AppState) -> ModelManager:
    from gpubox.tools.inference.manager import ModelManager

    return state.service(INFERENCE, lambda s: ModelManager(s, ledger(state)))


def models_if_built(state: AppState) -> ModelManager | None:
    """The model manager when this server built one; never loads the inference stack to answer."""
    return state.peek(INFERENCE)


def search_if_built(state: AppState) -> SearchService | None:
    return state.peek(SEARCH)


def finetuner(state: AppState) -> Finetuner:
    from gpubox.tools.finetune.calibrate import record_calibration
    from gpubox.tools.finetune.service import Finetuner

    def loaded() -> dict[str, object]:
        mgr = models_if_built(state)
        return dict(mgr.loaded()) if mgr is not None else {}

    return state.service(
        FINETUNE,
        lambda s: Finetuner(
            s, ledger(state), calibrate=lambda info: record_calibration(estimator(state), info), loaded=loaded
        ),
    )


def merger(state: AppState) -> Merger:
    from gpubox.tools.finetune.merge import Merger

    return state.service(MERGE, Merger)


def bench(state: AppState) -> BenchService:
    from gpubox.tools.bench.service import BenchService

    def busy_models() -> list[str]:
        mgr = models_if_built(state)
        return mgr.busy_models() if mgr is not None else []

    return state.service(
        BENCH, lambda s: BenchService(s, ledger(state), estimator=lambda: estimator(state), busy_models=busy_models)
    )


def bench_if_built(state: AppState) -> BenchService | None:
    return state.peek(BENCH)


def session_meter(state: AppState) -> SessionMeter:
    from gpubox.tools.gpu.session import SessionMeter

    return state.service(SESSION, SessionMeter)


def idle_guard(state: AppState) -> IdleGuard:
    """The idle guard watching this server's session meter (started by the GPU family when configured)."""
    from gpubox.tools.gpu.idle import IdleGuard

    return state.service(IDLE, lambda s: IdleGuard(session_meter(state), s))


def serve(state: AppState) -> ServeService:
    from gpubox.tools.serve.service import ServeService

    # lazy: listing engines never builds the fine-tuning family; resolving a model to serve does
    return state.service(
        SERVE,
        lambda s: ServeService(
            s, ledger(state), lambda m: finetuner(state).resolve_base(m), lambda m: lora_adapter(state, m)
        ),
    )


def lora_adapter(state: AppState, name: str) -> Adapter | None:
    """A LoRA adapter here (a fine-tune job's output or one in the model dirs) with its base, for serving."""
    import json
    from pathlib import Path

    from gpubox.tools.finetune.schemas import ResolvedBase
    from gpubox.tools.serve.service import Adapter

    mgr = models(state)
    d = mgr.discovered().get(name.lower())
    if d is None or d.format != "lora":
        return None
    base = mgr.base_of(d)
    if base.format == "gguf":
        resolved = finetuner(state).resolve_base(base.name)
    else:  # an HF folder: a model dir's, or the copy fine-tuning trained on in its own state dir
        resolved = ResolvedBase(name=base.name, path=str(base.path), format="hf", hf_path=str(base.path), hf_ready=True)
    cfg = json.loads((Path(d.path) / "adapter_config.json").read_text(encoding="utf-8"))
    return Adapter(name=d.name, path=Path(d.path), rank=int(cfg.get("r") or 8), base=resolved)


def serve_if_built(state: AppState) -> ServeService | None:
    return state.peek(SERVE)
