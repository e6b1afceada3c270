"""The plain side of bench/finetune_bench.py: the same LoRA run as a hand-written trl script, no gpubox involved.

python bench/finetune_plain.py BASE_HF_DIR TRAIN.jsonl STEPS PACKING(0|1) LIGER(0|1) OUT_DIR CONF_JSON

Prints one JSON line: tokens/s over the same window the job's callback uses (non-padding tokens seen between
on_train_begin and the last on_log), and the padding per step from one untimed pass over the train dataloader.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl.trainer.sft_config import SFTConfig
from trl.trainer.sft_trainer import SFTTrainer


class Speed(TrainerCallback):
    """The same arithmetic as the job's callback: tokens seen since on_train_begin over the time since then."""

    def __init__(self) -> None:
        self.t0, self.tokens0, self.last = 0.0, 0, (0, 0.0)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.t0, self.tokens0 = time.perf_counter(), state.num_input_tokens_seen or 0

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        self.last = ((state.num_input_tokens_seen or 0) - self.tokens0, time.perf_counter() - self.t0)


def main(argv: list[str]) -> None:
    base, data, steps, packing, liger, out = argv[0], argv[1], int(argv[2]), argv[3] == "1", argv[4] == "1", argv[5]
    c = json.loads(argv[6])
    cuda = torch.cuda.is_available()
    bf16 = cuda and torch.cuda.is_bf16_supported()
    tok = AutoTokenizer.from_pretrained(base)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16 if bf16 else torch.float32)
    with open(data, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    args = SFTConfig(
        output_dir=out,
        per_device_train_batch_size=c["micro"],
        per_device_eval_batch_size=c["micro"],
        gradient_accumulation_steps=1,
        max_steps=steps,
        learning_rate=c["lr"],
        lr_scheduler_type="linear",
        warmup_steps=0.0,
        weight_decay=0.0,
        optim="adamw_torch",
        seed=c["seed"],
        max_length=c["max_length"],
        packing=packing,
        use_liger_kernel=liger,
        gradient_checkpointing=False,
        bf16=bf16,
        fp16=False,
        use_cpu=not cuda,
        logging_steps=1,
        save_steps=c["save_steps"],
        save_total_limit=2,
        eval_strategy="no",
        include_num_input_tokens_seen="non_padding",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    peft = LoraConfig(
        r=c["lora_r"],
        lora_alpha=c["lora_alpha"],
        lora_dropout=c["lora_dropout"],
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )
    speed = Speed()
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        peft_config=peft,
        callbacks=[speed],
    )
    trainer.train()
    tokens, seconds = speed.last
    batches = padded = real = 0
    for batch in trainer.get_train_dataloader():  # untimed: what packing changes in each step's tensors
        batches += 1
        padded += batch["input_ids"].numel()
        real += int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()
    result = {
        "tokens_per_s": tokens / seconds,
        "tokens": tokens,
        "seconds": seconds,
        "steps": trainer.state.global_step,
        "batch_tokens_per_step": padded / batches,
        "real_tokens_per_step": real / batches,
        "peak_memory_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else None,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
