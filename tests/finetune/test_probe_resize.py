"""What a job's reservation becomes after its probe: on a GPU the probe's torch.cuda.max_memory_allocated plus what
the job holds beside its allocations (the CUDA context, the caching allocator's reserve); on a CPU the probe's RSS
as measured. A bare allocator figure would let other work into memory the job holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpubox.settings import Settings
from gpubox.tools.box.capacity import Reading
from gpubox.tools.box.ledger import Ledger
from gpubox.tools.finetune import admission
from gpubox.tools.finetune.jobs import JobStore
from gpubox.tools.finetune.supervisor import CUDA_CACHE_FACTOR, CUDA_CONTEXT_GB, Supervisor


def gpu_box(_pids: object) -> dict[str, Reading]:
    return {"host": Reading(total_gb=64.0, used_gb=2.0), "cuda:0": Reading(total_gb=80.0, used_gb=0.0)}


@pytest.mark.parametrize(("device", "expected"), [("cuda:0", 2.0 * CUDA_CACHE_FACTOR + CUDA_CONTEXT_GB), ("host", 2.0)])
def test_the_probe_resizes_the_reservation_with_what_the_job_holds_beside_its_allocations(
    tmp_path: Path, device: str, expected: float
) -> None:
    ledger = Ledger(Settings.load(state_dir=tmp_path / "state"), read=gpu_box)
    store = JobStore(tmp_path / "ft")
    job_dir = store.job_dir("j1")
    job_dir.mkdir(parents=True)
    probe = {"steps": 2, "per_device_train_batch_size": 4, "tokens_per_s": 100.0, "peak_memory_gb": 2.0,
             "memory_kind": "cpu_rss", "seconds": 3.0}  # fmt: skip
    (job_dir / "metrics.jsonl").write_text(json.dumps({"probe": probe}) + "\n")  # as the worker writes it
    ledger.reserve(admission.owner("j1"), "finetune", {device: 10.0}, "finetune_cancel job_id='j1'")
    status: Any = lambda _job: type("S", (), {"num_processes": 1})()  # noqa: E731
    assert Supervisor(store, ledger, None, status)._resize_from_probe("j1")
    held = ledger.holding(admission.owner("j1"))
    assert held is not None and held.devices == {device: pytest.approx(expected)} and held.source == "probe measurement"
