"""The training process: `python -m gpubox.tools.finetune.worker <job_dir>`.

Started detached (its own session) by the service, so a server restart does not stop it. Everything it needs is
in `<job_dir>/config.json`; it reports through the job store (state), `metrics.jsonl` (loss, lr, tokens/s,
memory, events) and `log.txt` (its stdout/stderr). torch/transformers/trl/peft are imported only here.

SIGTERM (finetune_cancel) is turned into a clean stop: the trainer callback asks for a checkpoint at the end of
the current step and stops, so finetune_resume continues from there.
"""

from __future__ import annotations

import gc
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from gpubox.tools.finetune.base import ensure_hf_base
from gpubox.tools.finetune.jobs import JobStore, append_metric

STOP = {"requested": False, "training": False}


class InjectedOOMError(RuntimeError):
    """Test hook: raised like torch.OutOfMemoryError at the first step of the first N attempts."""


def _on_sigterm(signum: int, frame: Any) -> None:
    STOP["requested"] = True
    if not STOP["training"]:
        raise SystemExit(143)  # nothing to checkpoint yet: stop right away


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, InjectedOOMError):
        return True
    try:
        import torch

        return isinstance(exc, torch.OutOfMemoryError)
    except ImportError:
        return False


def _callback(job_dir: Path, cfg: dict[str, Any], attempt: int) -> Any:
    import torch
    from transformers import TrainerCallback

    cuda = torch.cuda.is_available()
    proc = psutil.Process()

    class JobCallback(TrainerCallback):
        def __init__(self) -> None:
            self.t0 = time.perf_counter()
            self.tokens0 = 0
            self.peak_rss = 0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.perf_counter()
            self.tokens0 = state.num_input_tokens_seen or 0
            append_metric(job_dir, {"event": f"training started at step {state.global_step}", "t": time.time()})

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if attempt < cfg.get("inject_oom", 0):
                raise InjectedOOMError("CUDA out of memory (injected by the test hook)")

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.peak_rss = max(self.peak_rss, proc.memory_info().rss)
            if STOP["requested"]:
                control.should_save = True
                control.should_training_stop = True

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            logs = logs or {}
            dt = time.perf_counter() - self.t0
            seen = (state.num_input_tokens_seen or 0) - self.tokens0
            peak = torch.cuda.max_memory_allocated() if cuda else self.peak_rss
            rec = {
                "t": time.time(),
                "step": state.global_step,
                "max_steps": state.max_steps,
                "epoch": state.epoch,
                "tokens_per_s": round(seen / dt, 2) if dt > 0 and seen else None,
                "peak_memory_gb": round(peak / 1e9, 4) if peak else None,
                "memory_kind": "cuda_max_allocated" if cuda else "cpu_rss",
            }
            for key in ("loss", "learning_rate", "eval_loss", "grad_norm", "train_loss"):
                if key in logs:
                    rec[key] = logs[key]
            append_metric(job_dir, rec)

    return JobCallback()


def train(job_dir: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.sft_config import SFTConfig
    from trl.trainer.sft_trainer import SFTTrainer

    req = cfg["request"]
    base = cfg["base"]
    hf_path = Path(base["hf_path"])
    ensure_hf_base(base["format"], Path(base["path"]), hf_path, log=lambda m: append_metric(job_dir, {"event": m}))
    cuda = torch.cuda.is_available()
    bf16 = bool(req.get("bf16")) if req.get("bf16") is not None else cuda and torch.cuda.is_bf16_supported()
    fp16 = bool(req.get("fp16")) and not bf16
    tokenizer = AutoTokenizer.from_pretrained(str(hf_path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    def rows(name: str) -> Any:
        path = job_dir / name
        if not path.is_file():
            return None
        return Dataset.from_list([json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()])

    train_ds, eval_ds = rows("train.jsonl"), rows("eval.jsonl")
    micro, accum = int(cfg["per_device_train_batch_size"]), int(cfg["gradient_accumulation_steps"])
    attempt = 0
    while True:
        model_kwargs: dict[str, Any] = {"dtype": torch.bfloat16 if bf16 else torch.float32}
        if req["method"] == "qlora":
            from transformers import BitsAndBytesConfig

            model_kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_use_double_quant=(req.get("weight_format") or "nf4_dq") == "nf4_dq",
                bnb_4bit_compute_dtype=torch.bfloat16 if bf16 else torch.float32,
            )
        model = AutoModelForCausalLM.from_pretrained(str(hf_path), **model_kwargs)
        peft_config = None
        if req["method"] != "full":
            targets = req.get("lora_target_modules") or "all-linear"
            peft_config = LoraConfig(
                r=req["lora_r"],
                lora_alpha=req.get("lora_alpha") or 2 * req["lora_r"],
                lora_dropout=req["lora_dropout"],
                target_modules=targets,
                task_type="CAUSAL_LM",
            )
        args = SFTConfig(
            output_dir=str(job_dir / "checkpoints"),
            per_device_train_batch_size=micro,
            per_device_eval_batch_size=micro,
            gradient_accumulation_steps=accum,
            max_steps=cfg["total_steps"],
            learning_rate=req["learning_rate"],
            lr_scheduler_type=req["lr_scheduler_type"],
            warmup_steps=req["warmup_ratio"],  # transformers 5: a float in [0, 1) is a ratio of total steps
            weight_decay=req["weight_decay"],
            optim=req["optim"],
            seed=req["seed"],
            max_length=req["max_length"],
            packing=req["packing"],
            use_liger_kernel=req["use_liger_kernel"],
            gradient_checkpointing=bool(cfg["gradient_checkpointing"]),
            bf16=bf16,
            fp16=fp16,
            use_cpu=not cuda,
            logging_steps=req["logging_steps"],
            save_steps=req["save_steps"],
            save_total_limit=req["save_total_limit"],
            eval_strategy="steps" if eval_ds is not None else "no",
            eval_steps=req.get("eval_steps") or req["logging_steps"],
            include_num_input_tokens_seen="non_padding",
            report_to="none",
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = SFTTrainer(
            model=model,
            args=args,
            train_dataset=train_ds,
            eval_dataset=eval_ds,
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=[_callback(job_dir, cfg, attempt)],
        )
        checkpoints = sorted((job_dir / "checkpoints").glob("checkpoint-*"))
        resume = bool(checkpoints) and cfg.get("resume", False)
        if resume:
            append_metric(job_dir, {"event": f"resuming from {checkpoints[-1].name}", "t": time.time()})
        STOP["training"] = True
        try:
            result = trainer.train(resume_from_checkpoint=True if resume else None)
            break
        except Exception as exc:
            if not _is_oom(exc):
                raise
            STOP["training"] = False
            if micro == 1:
                raise RuntimeError(
                    "out of memory even at per_device_train_batch_size=1; use method='qlora', "
                    "gradient_checkpointing=true or a shorter max_length"
                ) from exc
            micro, accum, attempt = micro // 2, accum * 2, attempt + 1
            append_metric(
                job_dir,
                {
                    "event": f"out of memory at per_device_train_batch_size={micro * 2}: halved the micro-batch "
                    f"to {micro} and doubled gradient_accumulation_steps to {accum} (global batch kept)",
                    "per_device_train_batch_size": micro,
                    "gradient_accumulation_steps": accum,
                    "t": time.time(),
                },
            )
            del trainer, model
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
    if STOP["requested"]:
        return {"cancelled": True, "step": trainer.state.global_step}
    adapter_dir = Path(cfg["adapter_dir"])
    adapter_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = adapter_dir.with_name(adapter_dir.name + ".tmp")
    trained_model: Any = trainer.model
    trained_model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    conf = tmp / "adapter_config.json"
    if conf.is_file():
        # the inference registry finds the base through this path (the dequantized HF copy in the state dir)
        data = json.loads(conf.read_text())
        data["base_model_name_or_path"] = str(hf_path)
        conf.write_text(json.dumps(data, indent=2))
    if adapter_dir.exists():
        import shutil

        shutil.rmtree(adapter_dir)
    tmp.rename(adapter_dir)
    metrics = result.metrics
    return {
        "adapter_path": str(adapter_dir),
        "train_loss": metrics.get("train_loss"),
        "train_runtime_s": metrics.get("train_runtime"),
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": accum,
        "device": "cuda" if cuda else "cpu",
        "gpu_name": torch.cuda.get_device_name(0) if cuda else None,
        "peak_memory_gb": round(torch.cuda.max_memory_allocated() / 1e9, 4) if cuda else None,
    }


def main(argv: list[str]) -> int:
    job_dir = Path(argv[0]).resolve()
    cfg = json.loads((job_dir / "config.json").read_text(encoding="utf-8"))
    store = JobStore(Path(cfg["store_root"]))
    job_id = cfg["job_id"]
    signal.signal(signal.SIGTERM, _on_sigterm)
    store.update(job_id, state="running")
    try:
        result = train(job_dir, cfg)
    except SystemExit:
        store.finish(job_id, "cancelled", error="cancelled before training started")
        return 143
    except BaseException as exc:
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        store.finish(job_id, "failed", error=f"{type(exc).__name__}: {exc}"[:2000])
        return 1
    if result.get("cancelled"):
        store.finish(job_id, "cancelled", error=None, result=result)
        return 143
    store.finish(job_id, "completed", result=result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
