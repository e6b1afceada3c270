"""How a job's worker is started: one process, or N data-parallel ranks through `accelerate launch`.

For N > 1 the service runs `python -m accelerate.commands.launch --multi_gpu --num_processes N -m
gpubox.tools.finetune.worker <job_dir>`. `--multi_gpu` selects accelerate's torchrun launcher, which starts N ranks
on CPU too (accelerate then picks DistributedType.MULTI_CPU with the gloo backend); `--cpu` would not: without an
MPI hostfile its simple launcher starts a single process. The torchrun agent forwards SIGTERM (finetune_cancel) to
every rank and stops all ranks when one fails, so a dead rank fails the job instead of hanging it.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import psutil

from gpubox.errors import InvalidInputError

WORKER = "gpubox.tools.finetune.worker"
STARTED = "gpubox finetune worker: rank "  # the first line each rank prints (worker.main)
# How long the torchrun agent waits for ranks to checkpoint after SIGTERM before it SIGKILLs them (its default of
# 30 s can cut a long CPU step short); also the longest a rank blocked on a dead peer delays the job's failure.
SHUTDOWN_TIMEOUT_S = 120


def check_processes(n: int, device: str) -> list[str]:
    """Plan-time check of num_processes: refuse more ranks than GPUs CUDA sees, or on CPU more ranks than cores
    (each rank needs a core of its own; more only share them, with a copy of the model each); a note otherwise."""
    if device == "cuda":
        visible = visible_gpus()
        if n > visible:
            raise InvalidInputError(
                f"num_processes={n} but CUDA sees {visible} GPU(s) here; data parallelism runs one process per GPU. "
                f"Use num_processes<={visible}, or several machines through accelerate's multi-node config"
            )
        return []
    cores = _cores()
    if n > cores:
        raise InvalidInputError(
            f"num_processes={n} but this machine has no GPU and {cores} CPU core(s) this server may use; CPU ranks "
            f"need a core each. Use num_processes<={cores} (1 is usually fastest on CPU), or a GPU machine"
        )
    return [
        f"num_processes={n} on CPU: {n} gloo ranks, each with its own copy of the model in RAM and "
        f"{max(1, cores // n)} thread(s) of the {cores} CPU core(s) available"
    ]


def visible_gpus() -> int:
    from gpubox.tools.gpu.devices import local_gpus

    return len(local_gpus())


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return psutil.cpu_count() or 1


def command(job_dir: Path, num_processes: int, device: str) -> list[str]:
    if num_processes <= 1:
        return [sys.executable, "-m", WORKER, str(job_dir)]
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        str(num_processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",  # the worker's SFTConfig bf16/fp16 decides precision
        "--dynamo_backend",
        "no",
        "--main_process_port",
        "0",  # a free port: two servers' jobs never collide on 29500
        "-m",
        WORKER,
        str(job_dir),
    ]


def environment(num_processes: int, device: str) -> dict[str, str]:
    """Extra environment for the launch."""
    env = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(SHUTDOWN_TIMEOUT_S)}
    if num_processes > 1 and device == "cpu":
        # ranks share the cores instead of each spawning a thread per core
        env["OMP_NUM_THREADS"] = str(max(1, _cores() // num_processes))
    return env


# torch elastic's ChildFailedError summary (torch/distributed/elastic/multiprocessing/errors/__init__.py) names the
# rank that failed first: "Root Cause (first observed failure):" then "rank      : 1 (local_rank: 1)",
# "exitcode  : -9 (pid: 123) (SIGKILL)" (a negative exit code is the signal that killed it).
_ROOT_CAUSE = "Root Cause (first observed failure):"
_FIELD = re.compile(r"^\s*(rank|exitcode)\s*:\s*(.*)$")


def root_cause(log_text: str) -> str | None:
    """'rank 1 (local_rank: 1) failed first: exitcode -9 (SIGKILL)' from the launcher's summary, if the log has one."""
    # a resumed job appends to the same log: only a summary after this launch's first worker line counts
    at = log_text.rfind(_ROOT_CAUSE)
    if at < 0 or at < log_text.rfind(STARTED):
        return None
    fields: dict[str, str] = {}
    for line in log_text[at + len(_ROOT_CAUSE) :].splitlines():
        if (m := _FIELD.match(line)) and m.group(1) not in fields:
            fields[m.group(1)] = m.group(2).strip()
    if "rank" not in fields:
        return None
    code = " ".join(re.sub(r"\(pid: \d+\)", "", fields.get("exitcode", "?")).split())
    return f"rank {fields['rank']} failed first: exitcode {code}"
