"""Shared fixtures: the bundled SmolLM2 dequantized to an HF folder once per machine, and per-test state dirs
that get a hard-linked copy of it (dequantizing takes about a minute on a 2-core box)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpubox.bundled import smollm2_gguf
from gpubox.settings import Settings

DATA = Path(__file__).resolve().parent.parent / "data"
DATASET = DATA / "finetune" / "glimmerphone.jsonl"
BASE_NAME = "smollm2-135m-instruct-hf"


def _gguf_key(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        h.update(f.read(1 << 20))
    h.update(str(path.stat().st_size).encode())
    return h.hexdigest()[:16]


@pytest.fixture(scope="session")
def hf_base() -> Path:
    """The dequantized HF copy of the bundled GGUF, cached in a fixed dir keyed by the GGUF's hash."""
    pytest.importorskip("trl", reason="needs gpubox[train]")
    pytest.importorskip("peft", reason="needs gpubox[train]")
    pytest.importorskip("transformers", reason="needs gpubox[hf]")
    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("needs gpubox[models] (the bundled SmolLM2 GGUF)")
    from gpubox.tools.finetune.base import ensure_hf_base

    dest = Path(tempfile.gettempdir()) / "gpubox-finetune-cache" / _gguf_key(gguf) / BASE_NAME
    return ensure_hf_base("gguf", gguf, dest, log=lambda _m: None)


def link_base(hf_base: Path, state_dir: Path) -> None:
    """Put the cached HF base where the fine-tuning family keeps it, as hard links (no 540 MB copy)."""
    dest = state_dir / "finetune" / "base" / BASE_NAME
    if dest.exists():
        return

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:  # another file system
            shutil.copy2(src, dst)

    shutil.copytree(hf_base, dest, copy_function=link)


def make_settings(root: Path, hf_base: Path | None = None) -> Settings:
    root.mkdir(parents=True, exist_ok=True)
    state = root / "state"
    if hf_base is not None:
        link_base(hf_base, state)
    return Settings.load(state_dir=state, allowed_roots=[root, DATA], infer_context_length=512)


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, hf_base: Path) -> Iterator[dict[str, Any]]:
    """One 12-step LoRA job that teaches the glimmerphone fact, shared by test_jobs.py and test_merge.py (training
    it twice would add minutes to the suite). Planned and launched on one server, which is closed while the job
    runs (a "server restart": the worker is detached and keeps training); a second server follows it to the end."""
    from gpubox.app import build_server, state_of
    from tests.finetune.test_jobs import TEACH, ok, run, wait_until

    settings = make_settings(tmp_path_factory.mktemp("ft") / "root", hf_base)
    first = build_server(settings)

    async def launch(client: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        plan = await ok(client, "finetune_plan", **TEACH, per_device_train_batch_size=4, max_steps=12)
        job = await ok(client, "finetune_launch", plan_id=plan["plan_id"])
        return plan, job

    plan, launched = run(first, launch)
    state_of(first).close()
    second = build_server(settings)
    final = run(second, lambda c: wait_until(c, launched["job_id"], lambda s: False))
    yield {"mcp": second, "plan": plan, "launched": launched, "final": final, "settings": settings}
    state_of(second).close()
