"""Helpers for the job lifecycle tests: a Finetuner on a fake-read host (16 GB, a small budget) and a plan written
directly, so a job's bookkeeping (rows, ledger, watcher) runs for real without planning or training."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

from gpubox.settings import Settings
from gpubox.tools.box.capacity import Reading
from gpubox.tools.box.ledger import Ledger
from gpubox.tools.finetune.schemas import DatasetSummary, FinetunePlan, FinetuneRequest, ResolvedBase
from gpubox.tools.finetune.service import Finetuner
from tests.conftest import DATA
from tests.finetune.conftest import DATASET


def host(_pids: object) -> dict[str, Reading]:
    return {"host": Reading(total_gb=16.0, used_gb=2.0)}


def finetuner(state_dir: Path, budget_gb: float = 4.0) -> tuple[Finetuner, Ledger]:
    settings = Settings.load(state_dir=state_dir, allowed_roots=[DATA], memory_budget_gb=budget_gb)
    ledger = Ledger(settings, read=host)
    return Finetuner(settings, ledger=ledger), ledger


def write_plan(ft: Finetuner, plan_id: str, gb: float = 1.5) -> str:
    rows = sum(1 for line in DATASET.read_text(encoding="utf-8").splitlines() if line.strip())
    plan = FinetunePlan(
        plan_id=plan_id,
        request=FinetuneRequest(model="base", dataset=str(DATASET)),
        base=ResolvedBase(name="base", path="base.gguf", format="gguf", hf_path="base-hf", hf_ready=False),
        device="cpu",
        per_device_train_batch_size=1,
        gradient_accumulation_steps=1,
        global_batch=1,
        gradient_checkpointing=False,
        total_steps=1,
        batch_source="the test",
        estimated_memory_gb=gb,
        dataset=DatasetSummary(
            path=str(DATASET),
            format="messages",
            rows=rows,
            train_rows=rows,
            eval_rows=0,
            tokens_total=0,
            token_length_percentiles={},
            truncated_rows=0,
        ),
        speed_options={},
    )
    (ft.plans_dir / f"{plan_id}.json").write_text(plan.model_dump_json(), encoding="utf-8")
    return plan_id


def sleeping_worker(_job_dir: Path, _nproc: int, _device: str) -> list[str]:
    """launcher.command's stand-in: a worker that runs until the test kills it (or 10 minutes pass)."""
    return [sys.executable, "-c", "import time; time.sleep(600)"]


def kill(pid: int) -> None:
    """End a worker's process group (it runs in its own session, as the supervisor starts it)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
