"""Training tokens/s of a finetune_launch job vs the same configuration as a plain trl script, in the same run.

.venv/bin/python bench/finetune_bench.py [--steps 6] [--packing] [--liger] [--out bench/results/finetune_cpu.md]

Both sides train LoRA r=16 all-linear on the bundled SmolLM2-135M (dequantized once to an HF folder) over
tests/data/finetune/glimmerphone.jsonl at max_length 128, micro-batch 4, and count non-padding input tokens
(`include_num_input_tokens_seen="non_padding"`) over the training loop only (model loading excluded). The goal is a
ratio >= 0.95: the job's worker adds only a logging callback to what a hand-written trl script does.
Variants: `--packing` (trl packing, BFD, padding-free) and `--liger` (trl `use_liger_kernel`; needs liger-kernel
and a CUDA GPU) run the job side again with that option on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATASET = HERE.parent / "tests" / "data" / "finetune" / "glimmerphone.jsonl"

PLAIN = r"""
import json, sys, time
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.trainer.sft_config import SFTConfig
from trl.trainer.sft_trainer import SFTTrainer

base, data, steps, packing = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
tok = AutoTokenizer.from_pretrained(base)
model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
rows = [json.loads(line) for line in open(data, encoding="utf-8")]
args = SFTConfig(output_dir=sys.argv[5], per_device_train_batch_size=4, max_steps=steps, learning_rate=2e-3,
                 max_length=128, packing=packing, gradient_checkpointing=False, use_cpu=not torch.cuda.is_available(),
                 logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, seed=1,
                 include_num_input_tokens_seen="non_padding", optim="adamw_torch")
peft = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM")
trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                     peft_config=peft)
t0 = time.perf_counter()
trainer.train()
dt = time.perf_counter() - t0
print(json.dumps({"tokens_per_s": trainer.state.num_input_tokens_seen / dt}))
"""


def job_side(steps: int, packing: bool, liger: bool, root: Path) -> tuple[float | None, str]:
    from gpubox.settings import Settings
    from gpubox.state import AppState
    from gpubox.tools.estimate.adapter import estimator
    from gpubox.tools.finetune.adapter import finetuner
    from gpubox.tools.finetune.schemas import FinetuneRequest

    settings = Settings.load(state_dir=root / "state", allowed_roots=[DATASET.parent])
    state = AppState(settings)
    ft = finetuner(state)
    req = FinetuneRequest(
        dataset=str(DATASET),
        max_length=128,
        learning_rate=2e-3,
        per_device_train_batch_size=4,
        max_steps=steps,
        seed=1,
        packing=packing,
        use_liger_kernel=liger,
        save_steps=10_000,
    )
    plan = ft.plan(req, estimator(state))
    job = ft.launch(plan.plan_id)
    while (st := ft.status(job.job_id)).state in ("starting", "running"):
        time.sleep(2)
    state.close()
    if st.state != "completed":
        raise SystemExit(f"job {st.state}: {st.error}\n{st.log_tail}")
    return st.tokens_per_s, plan.base.hf_path


def plain_side(base: str, steps: int, packing: bool, root: Path) -> float:
    out = subprocess.run(
        [sys.executable, "-c", PLAIN, base, str(DATASET), str(steps), "1" if packing else "0", str(root / "plain")],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["tokens_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--packing", action="store_true")
    ap.add_argument("--liger", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        job_tps, base = job_side(a.steps, False, False, root / "a")
        plain_tps = plain_side(base, a.steps, False, root)  # base was dequantized by the job side
        rows.append(("finetune_launch job", job_tps, plain_tps))
        if a.packing:
            rows.append(
                (
                    "job, packing=True",
                    job_side(a.steps, True, False, root / "b")[0],
                    plain_side(base, a.steps, True, root),
                )
            )
        if a.liger:
            rows.append(("job, use_liger_kernel=True", job_side(a.steps, False, True, root / "c")[0], plain_tps))
    lines = [
        f"# Fine-tuning throughput: finetune_launch job vs plain trl script ({platform.machine()}, {a.steps} steps)",
        "",
        "| side | job tokens/s | plain trl tokens/s | ratio (goal >= 0.95) |",
        "|---|---|---|---|",
    ]
    for name, job, plain in rows:
        ratio = f"{job / plain:.3f}" if job and plain else "n/a"
        lines.append(f"| {name} | {job or 0:.1f} | {plain:.1f} | {ratio} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
