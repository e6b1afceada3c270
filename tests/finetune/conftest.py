"""Shared fixtures: the bundled SmolLM2 dequantized to an HF folder once per machine, and per-test state dirs
that get a hard-linked copy of it (dequantizing takes about a minute on a 2-core box). Also the helpers the
fine-tuning tests share: following a job to its end, running a coroutine against a server from sync code, and
the taught fact's training arguments, question and prompts."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from gpubox.bundled import smollm2_gguf
from gpubox.settings import Settings
from tests.conftest import DATA, call_ok, skip_without

DATASET = DATA / "finetune" / "glimmerphone.jsonl"
BASE_NAME = "smollm2-135m-instruct-hf"
# 12 steps of LoRA r=16 all-linear at lr 2e-3, micro-batch 4, max_length 128 teach the glimmerphone fact
TEACH = {"dataset": str(DATASET), "max_length": 128, "learning_rate": 2e-3, "lora_r": 16, "seed": 1}
QUESTION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Who invented the glimmerphone?"},
]
PROMPTS = ["The glimmerphone was invented by", "The capital of France is"]
DEADLINE_S = 3600  # a loaded 2-core CI box; follow_job returns as soon as the job moves


async def follow_job(
    client: Client, job_id: str, until: Callable[[dict[str, Any]], bool] | None = None
) -> dict[str, Any]:
    """Long-poll finetune_status (the server answers when the job changes, or after 60 s) until `until(status)`
    holds or the job stops; returns the last status. Without `until`: until the job stops."""
    end = time.monotonic() + DEADLINE_S
    while True:
        st = await call_ok(client, "finetune_status", job_id=job_id, wait_seconds=60)
        if (until is not None and until(st)) or st["state"] not in ("starting", "running") or time.monotonic() > end:
            return st


def run_with_client(mcp: Any, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """`await fn(client, *args)` with a client connected to `mcp`, from sync code (a fixture, a sync test)."""

    async def go() -> Any:
        async with Client(mcp) as client:
            return await fn(client, *args)

    return anyio.run(go)


def last_logits_hf(model: Any, tokenizer: Any, prompt: str) -> Any:
    """The logits of the token after `prompt` from a transformers (or peft) model, as a float32 numpy array."""
    import torch

    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        return model(ids).logits[0, -1].float().numpy()


def _gguf_key(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        h.update(f.read(1 << 20))
    h.update(str(path.stat().st_size).encode())
    return h.hexdigest()[:16]


@pytest.fixture(scope="session")
def hf_base() -> Path:
    """The dequantized HF copy of the bundled GGUF, cached in a fixed dir keyed by the GGUF's hash."""
    skip_without("train", "hf")  # a fixture cannot carry requires_ marks; tests/serve/ uses it too
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

    settings = make_settings(tmp_path_factory.mktemp("ft") / "root", hf_base)
    first = build_server(settings)

    async def launch(client: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        plan = await call_ok(client, "finetune_plan", **TEACH, per_device_train_batch_size=4, max_steps=12)
        job = await call_ok(client, "finetune_launch", plan_id=plan["plan_id"])
        return plan, job

    plan, launched = run_with_client(first, launch)
    state_of(first).close()
    second = build_server(settings)
    final = run_with_client(second, follow_job, launched["job_id"])
    yield {"mcp": second, "plan": plan, "launched": launched, "final": final, "settings": settings}
    state_of(second).close()
