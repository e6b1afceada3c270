"""Training tokens/s of a finetune_launch job vs the same configuration as a plain trl script, in the same run.

.venv/bin/python bench/finetune_bench.py [--reps 2] [--steps 8] [--packing] [--liger] [--liger-site DIR]
                                         [--out bench/results/finetune_cpu.md]

Both sides train LoRA r=16 all-linear on the bundled SmolLM2-135M (dequantized once to an HF folder, before any
timing) at max_length 128, micro-batch 4, fp32 on CPU (bf16 where a CUDA GPU supports it, as the worker does), over
the very same rows in the same order (the plain script reads the job's own `train.jsonl` snapshot) with the same
SFTConfig (logging every step, the final checkpoint save, non-padding token counting). Both measure the same
window the same way: non-padding input tokens seen between the trainer's `on_train_begin` and its last `on_log`
(the end-of-training summary), so model loading, dataset tokenization and process start are outside it.

The box is shared and its load swings, so runs are interleaved in blocks of job, plain, plain, job; each block
gives a ratio (mean job / mean plain) and the result is the median over blocks. Goal: >= 0.95.

Speed options: `--packing` runs a job/plain pair with trl packing (BFD, padding-free) and reports tokens/s and
the padding it removes; `--liger` asks a job for `use_liger_kernel` (the plan turns it off without liger-kernel
and a CUDA GPU and says so) and runs the plain script with it on, recording what happens.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATASET = HERE.parent / "tests" / "data" / "finetune" / "glimmerphone.jsonl"

# The configuration both sides train with. The job side sets these through FinetuneRequest; the plain script has
# them written out as a user would. `check_same_config` fails the run if the job resolved anything differently.
CONF: dict[str, Any] = {
    "micro": 4,
    "lr": 2e-3,
    "max_length": 128,
    "seed": 1,
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_dropout": 0.05,
    "save_steps": 10_000,
}

PLAIN = HERE / "finetune_plain.py"  # the plain trl script, written as a user would


@dataclass
class Run:
    side: str
    tokens_per_s: float
    tokens: float
    seconds: float
    steps: int
    load_before: float
    load_after: float
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)


class Bench:
    def __init__(self, root: Path, steps: int) -> None:
        from gpubox.settings import Settings
        from gpubox.state import AppState
        from gpubox.tools.finetune.adapter import finetuner

        self.steps = steps
        self.root = root
        self.state = AppState(Settings.load(state_dir=root / "state", allowed_roots=[DATASET.parent]))
        self.ft = finetuner(self.state)
        self.train_rows: Path | None = None  # the first job's snapshot; every plain run trains on it
        self.base = ""
        self.plan_notes: dict[str, Any] = {}

    def request(self, packing: bool = False, liger: bool = False) -> Any:
        from gpubox.tools.finetune.schemas import FinetuneRequest

        fields: dict[str, Any] = {
            "dataset": str(DATASET),
            "max_length": CONF["max_length"],
            "learning_rate": CONF["lr"],
            "per_device_train_batch_size": CONF["micro"],
            "gradient_accumulation_steps": 1,
            "max_steps": self.steps,
            "seed": CONF["seed"],
            "lora_r": CONF["lora_r"],
            "lora_alpha": CONF["lora_alpha"],
            "lora_dropout": CONF["lora_dropout"],
            "gradient_checkpointing": False,
            "packing": packing,
            "use_liger_kernel": liger,
            "save_steps": CONF["save_steps"],
        }
        # a pre-training probe (if the worker has one) would run extra steps before the measured run
        if "probe_steps" in FinetuneRequest.model_fields:
            fields["probe_steps"] = 0
        return FinetuneRequest(**fields)

    def prepare(self) -> None:
        """Plan once and build the dequantized HF base before anything is timed."""
        from gpubox.tools.estimate.adapter import estimator
        from gpubox.tools.finetune.base import ensure_hf_base

        plan = self.ft.plan(self.request(), estimator(self.state))
        ensure_hf_base(plan.base.format, Path(plan.base.path), Path(plan.base.hf_path), log=print)
        self.base = plan.base.hf_path
        self.plan_notes = {
            "speed_options": plan.speed_options,
            "estimated_tokens_per_s": plan.estimated_tokens_per_s,
            "estimated_memory_gb": plan.estimated_memory_gb,
            "device": plan.device,
            "dataset": plan.dataset.model_dump(),
        }

    def job(self, packing: bool = False, liger: bool = False) -> tuple[Run, Any]:
        from gpubox.tools.estimate.adapter import estimator

        plan = self.ft.plan(self.request(packing, liger), estimator(self.state))
        load0, t0 = os.getloadavg()[0], time.perf_counter()
        st = self.ft.launch(plan.plan_id)
        while (st := self.ft.status(st.job_id)).state in ("starting", "running"):
            time.sleep(2)  # the poll's own CPU stays far below 1% of a step
        wall = time.perf_counter() - t0
        job_dir = self.ft.store.job_dir(st.job_id)
        if st.state != "completed":
            raise SystemExit(f"job {st.job_id} {st.state}: {st.error}\n{self.ft.status(st.job_id, True).log_tail}")
        check_same_config(json.loads((job_dir / "config.json").read_text()), packing, plan.request.use_liger_kernel)
        rows = job_dir / "train.jsonl"
        if self.train_rows is None:
            self.train_rows = self.root / "train.jsonl"
            shutil.copy2(rows, self.train_rows)
        elif rows.read_bytes() != self.train_rows.read_bytes():
            raise SystemExit("the jobs' row order differs between runs; the comparison would not be like for like")
        metrics = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
        started = [m["t"] for m in metrics if str(m.get("event", "")).startswith("training started")][-1]
        last = [m for m in metrics if m.get("tokens_per_s")][-1]
        seconds = last["t"] - started
        run = Run(
            "job",
            last["tokens_per_s"],
            last["tokens_per_s"] * seconds,
            seconds,
            last["step"],
            load0,
            os.getloadavg()[0],
            wall,
            {"peak_memory_gb": st.peak_memory_gb},
        )
        return run, plan

    def plain(
        self,
        packing: bool = False,
        liger: bool = False,
        env_extra: dict[str, str] | None = None,
        rows: Path | None = None,
    ) -> Run:
        rows = rows or self.train_rows
        assert rows is not None, "run a job first: the plain script trains on its row snapshot"
        out = self.root / f"plain-{time.monotonic_ns()}"
        argv = [self.base, str(rows), str(self.steps), "1" if packing else "0", "1" if liger else "0"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env_extra or {})}
        load0, t0 = os.getloadavg()[0], time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(PLAIN), *argv, str(out), json.dumps(CONF)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        wall = time.perf_counter() - t0
        shutil.rmtree(out, ignore_errors=True)
        if proc.returncode != 0:
            raise RuntimeError(_last_error(proc.stderr))
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        return Run(
            "plain",
            r["tokens_per_s"],
            r["tokens"],
            r["seconds"],
            r["steps"],
            load0,
            os.getloadavg()[0],
            wall,
            {k: r[k] for k in ("batch_tokens_per_step", "real_tokens_per_step", "peak_memory_gb")},
        )

    def close(self) -> None:
        self.state.close()


def check_same_config(cfg: dict[str, Any], packing: bool, liger: bool) -> None:
    """Fail loudly if the job resolved a setting the plain script does not use."""
    req = cfg["request"]
    want = {
        "per_device_train_batch_size": (cfg["per_device_train_batch_size"], CONF["micro"]),
        "gradient_accumulation_steps": (cfg["gradient_accumulation_steps"], 1),
        "gradient_checkpointing": (bool(cfg["gradient_checkpointing"]), False),
        "method": (req["method"], "lora"),
        "lora_target_modules": (req["lora_target_modules"], "all-linear"),
        "lora_r/alpha/dropout": (
            (req["lora_r"], req["lora_alpha"], req["lora_dropout"]),
            (CONF["lora_r"], CONF["lora_alpha"], CONF["lora_dropout"]),
        ),
        "optim/scheduler/warmup/decay": (
            (req["optim"], req["lr_scheduler_type"], req["warmup_ratio"], req["weight_decay"]),
            ("adamw_torch", "linear", 0.0, 0.0),
        ),
        "lr/seed/max_length": (
            (req["learning_rate"], req["seed"], req["max_length"]),
            (CONF["lr"], CONF["seed"], CONF["max_length"]),
        ),
        "packing/liger": ((req["packing"], req["use_liger_kernel"]), (packing, liger)),
        "logging/eval": ((req["logging_steps"], req["eval_split"]), (1, 0.0)),
    }
    diff = {k: v for k, v in want.items() if v[0] != v[1]}
    if diff:
        raise SystemExit(f"the job's configuration differs from the plain script's (job, plain): {diff}")


def _last_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errs = [ln for ln in lines if "Error" in ln.split(":")[0] or ln.startswith("raise ")]
    return (errs or lines or ["(no output)"])[-1][:400]


def block_ratios(runs: list[Run]) -> list[float]:
    """Blocks of four (job, plain, plain, job): mean job / mean plain in each."""
    out = []
    for i in range(0, len(runs) - 3, 4):
        block = runs[i : i + 4]
        jobs = [r.tokens_per_s for r in block if r.side == "job"]
        plains = [r.tokens_per_s for r in block if r.side == "plain"]
        out.append(statistics.mean(jobs) / statistics.mean(plains))
    return out


def versions() -> str:
    from importlib.metadata import version

    pkgs = ("torch", "transformers", "trl", "peft", "datasets", "accelerate")
    return ", ".join(f"{p} {version(p)}" for p in pkgs) + f", Python {platform.python_version()}"


def commit() -> str:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], capture_output=True, text=True, cwd=HERE).stdout.strip()

    dirty = git("status", "--porcelain", "--", "tools/finetune", "bench/finetune_bench.py")
    return git("rev-parse", "--short", "HEAD") + (" (finetune files modified)" if dirty else "")


def _loads(v: tuple[float, float, float]) -> str:
    return " / ".join(f"{x:.2f}" for x in v)


def row(n: int, r: Run, label: str | None = None) -> str:
    return (
        f"| {n} | {label or r.side} | {r.tokens_per_s:.1f} | {r.tokens:.0f} | {r.seconds:.1f} | {r.steps} "
        f"| {r.wall_s:.0f} | {r.load_before:.2f} / {r.load_after:.2f} | {_gb(r.extra.get('peak_memory_gb'))} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2, help="blocks of job, plain, plain, job")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--packing", action="store_true")
    ap.add_argument("--liger", action="store_true")
    ap.add_argument("--liger-site", type=Path, default=None, help="extra sys.path dir holding liger-kernel/triton")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    started = dt.datetime.now(dt.UTC)
    load_start = os.getloadavg()
    text = ""
    with tempfile.TemporaryDirectory() as tmp:
        b = Bench(Path(tmp), a.steps)
        try:
            b.prepare()
            runs: list[Run] = []
            pack: list[tuple[Run, Run, float]] = []  # (job packing, plain packing, mean job tokens/s in its block)
            liger_lines = liger_check(b, a.liger_site) if a.liger else []
            for _ in range(a.reps):
                for side in ("job", "plain", "plain", "job"):
                    runs.append(b.job()[0] if side == "job" else b.plain())
                    print(row(len(runs), runs[-1]), flush=True)
                if a.packing:  # right after the block, so "what packing buys" compares runs at a similar load
                    jp, pp = b.job(packing=True)[0], b.plain(packing=True)
                    pack.append((jp, pp, statistics.mean(r.tokens_per_s for r in runs[-4:] if r.side == "job")))
                    print(row(len(runs), jp, "job, packing"), row(len(runs), pp, "plain, packing"), sep="\n")
                # written after every block: on a box this loaded a run may have to be cut short
                text = render(a, b, started, load_start, runs, pack, liger_lines)
                if a.out:
                    a.out.write_text(text, encoding="utf-8")
        finally:
            b.close()
    print(text)


def render(
    a: argparse.Namespace,
    b: Bench,
    started: dt.datetime,
    load_start: tuple[float, float, float],
    runs: list[Run],
    pack: list[tuple[Run, Run, float]],
    liger_lines: list[str],
) -> str:
    ratios = block_ratios(runs)
    jobs = [r.tokens_per_s for r in runs if r.side == "job"]
    plains = [r.tokens_per_s for r in runs if r.side == "plain"]
    lines = [
        f"# Fine-tuning throughput: finetune_launch job vs plain trl script ({b.plan_notes['device']})",
        "",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC; commit {commit()}; {versions()}; {len(runs) // 4} of {a.reps} "
        "blocks done",
        f"- Machine: {platform.machine()}, {os.cpu_count()} CPUs, shared with other engineers' tests; load average "
        f"(1/5/15 min) at the start {_loads(load_start)}, at the end {_loads(os.getloadavg())}",
        f"- Setup: bundled SmolLM2-135M-Instruct (GGUF dequantized to fp32 safetensors once), LoRA r=16 alpha 32 "
        f"all-linear, micro-batch {CONF['micro']}, max_length {CONF['max_length']}, {a.steps} optimizer steps, "
        f"adamw_torch, lr {CONF['lr']}, {DATASET.name} ({b.plan_notes['dataset']['rows']} chat rows) in the "
        "job's shuffled order on both sides; tokens = non-padding input tokens from on_train_begin to the last "
        "on_log (the final checkpoint save included on both sides)",
        f"- Plan: speed options {b.plan_notes['speed_options']}; estimated tokens/s "
        f"{b.plan_notes['estimated_tokens_per_s']}",
        "",
        "| # | side | tokens/s | tokens | seconds | steps | wall s (incl. load) | load avg 1-min before / after "
        "| peak memory GB |",
        "|---|---|---|---|---|---|---|---|---|",
        *(row(i + 1, r) for i, r in enumerate(runs)),
        "",
        f"**Ratio job / plain: median over {len(ratios)} blocks {statistics.median(ratios):.3f}** (per block: "
        f"{', '.join(f'{x:.3f}' for x in ratios)}); ratio of medians "
        f"{statistics.median(jobs) / statistics.median(plains):.3f}. Goal >= 0.95.",
    ]
    if pack:
        unpacked = next(r for r in runs if r.side == "plain").extra
        packed = pack[0][1].extra
        gains = [jp.tokens_per_s / job_mean for jp, _pp, job_mean in pack]
        lines += [
            "",
            "## Packing (trl packing=True, BFD, padding-free), run right after each block",
            "",
            "| block | job packing tokens/s | plain packing tokens/s | job / plain | job packing / the block's jobs |",
            "|---|---|---|---|---|",
            *(
                f"| {i + 1} | {jp.tokens_per_s:.1f} | {pp.tokens_per_s:.1f} | {jp.tokens_per_s / pp.tokens_per_s:.3f} "
                f"| {g:.3f} |"
                for i, ((jp, pp, _m), g) in enumerate(zip(pack, gains, strict=True))
            ),
            "",
            f"Tokens per step (one pass over the plain script's dataloader): without packing "
            f"{unpacked['real_tokens_per_step']:.0f} real in a {unpacked['batch_tokens_per_step']:.0f}-token padded "
            f"batch ({1 - unpacked['real_tokens_per_step'] / unpacked['batch_tokens_per_step']:.0%} padding); with "
            f"packing {packed['real_tokens_per_step']:.0f} real in {packed['batch_tokens_per_step']:.0f} (no padding, "
            f"rows packed into {CONF['max_length']}-token sequences, so each step also holds more rows). Tokens/s "
            f"with packing vs the block's unpacked jobs: median {statistics.median(gains):.3f}x.",
        ]
    if liger_lines:
        lines += ["", "## Liger kernels (use_liger_kernel=True)", "", *liger_lines]
    lines += ["", *gpu_lines(b, runs)]
    return "\n".join(lines) + "\n"


def liger_check(b: Bench, site: Path | None) -> list[str]:
    from gpubox.errors import GpuboxError
    from gpubox.tools.estimate.adapter import estimator

    out = []
    try:
        # the plan is what decides: without liger-kernel and CUDA it turns the option off (the job then trains
        # exactly like the unpacked jobs above, so it is not launched again)
        plan = b.ft.plan(b.request(liger=True), estimator(b.state))
        notes = [w for w in plan.warnings if "liger" in w]
        out.append(f"- finetune_plan: speed_options {plan.speed_options}; warning: {'; '.join(notes) or 'none'}")
    except GpuboxError as exc:
        out.append(f"- finetune_plan with use_liger_kernel=True failed: {exc}")
    env = {"PYTHONPATH": str(site)} if site else {}
    try:
        r = b.plain(liger=True, env_extra=env, rows=DATASET)  # the file's own order: this run is no comparison
        out.append(f"- plain trl script with use_liger_kernel=True: ran, {r.tokens_per_s:.1f} tokens/s")
    except RuntimeError as exc:
        where = f"liger-kernel from {site}" if site else "the project venv"
        out.append(f"- plain trl script with use_liger_kernel=True ({where}): not runnable on CPU: {exc}")
    return out


def gpu_lines(b: Bench, runs: list[Run]) -> list[str]:
    """Predicted vs measured peak memory needs CUDA's allocator figures; on CPU the job reports process RSS."""
    if b.plan_notes["device"] != "cuda":
        return [
            "Predicted vs measured peak GPU memory: skipped, no CUDA GPU here (on CPU the job's peak memory is the "
            "worker's RSS, the plain script reports none)."
        ]
    planned = b.plan_notes["estimated_memory_gb"]
    measured = max((r.extra.get("peak_memory_gb") or 0) for r in runs if r.side == "job")
    err = f"{(planned - measured) / measured * 100:+.1f}% (goal within 10%)" if planned and measured else "n/a"
    return [
        f"Predicted vs measured peak GPU memory (torch.cuda.max_memory_allocated): plan {planned} GB, "
        f"measured {measured} GB, error {err}; under-predicting is the failure that matters (an OOM)."
    ]


def _gb(v: float | None) -> str:
    return f"{v:.2f}" if v else "n/a"


if __name__ == "__main__":
    main()
