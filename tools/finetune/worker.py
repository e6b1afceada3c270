"""The training process: `python -m gpubox.tools.finetune.worker <job_dir>`.

Started detached (its own session) by the service, so a server restart does not stop it. Everything it needs is
in `<job_dir>/config.json`; it reports through the job store (state), `metrics.jsonl` (loss, lr, tokens/s,
memory, events) and `log.txt` (its stdout/stderr). torch/transformers/trl/peft are imported only here.

SIGTERM (finetune_cancel) is turned into a clean stop: the trainer callback asks for a checkpoint at the end of
the current step and stops, so finetune_resume continues from there.

With num_processes > 1 it runs once per rank under `accelerate launch` (see launcher.py): every rank trains, only
rank 0 writes the job's state, metrics and adapter, and the ranks agree on stopping at the same step.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from gpubox.tools.finetune import launcher
from gpubox.tools.finetune.base import ensure_hf_base
from gpubox.tools.finetune.jobs import JobStore, append_metric, write_json
from gpubox.tools.finetune.probe import OOM_HINT, InjectedOOMError, is_oom, run_probe

CANCEL_MARK = "cancel-requested"  # written by the service's cancel (the name is supervisor.CANCEL_MARK)
STOP = {"requested": False, "training": False}
RANK = {"rank": 0, "world": 1, "job_dir": Path(".")}


def _on_sigterm(signum: int, frame: Any) -> None:
    STOP["requested"] = True
    peer_failed = RANK["world"] > 1 and not (RANK["job_dir"] / CANCEL_MARK).exists()
    if not STOP["training"] or peer_failed:
        raise SystemExit(143)  # nothing to checkpoint yet, or the launcher stops us because another rank died


def _log(job_dir: Path, record: dict[str, Any]) -> None:
    if RANK["rank"] == 0:
        append_metric(job_dir, record)


def _stop_everywhere(args: Any) -> bool:
    """Whether any rank was asked to stop: all ranks must leave at the same step, or the others wait forever in
    the next gradient all-reduce."""
    if RANK["world"] == 1:
        return bool(STOP["requested"])
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if STOP["requested"] else 0], device=args.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _callback(job_dir: Path, inject: bool) -> Any:
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
            world = RANK["world"]
            procs = f" ({world} processes)" if world > 1 else ""
            event = f"training started{procs} at step {state.global_step}"
            _log(job_dir, {"event": event, "world_size": world, "t": time.time()})

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if inject:
                raise InjectedOOMError("CUDA out of memory (injected by the test hook)")

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.peak_rss = max(self.peak_rss, proc.memory_info().rss)
            if _stop_everywhere(args):
                STOP["requested"] = True
                control.should_save = True
                control.should_training_stop = True

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            logs = logs or {}
            dt = time.perf_counter() - self.t0
            seen = (state.num_input_tokens_seen or 0) - self.tokens0  # summed over ranks by the Trainer
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
            _log(job_dir, rec)

    return JobCallback()


def _rows(job_dir: Path, name: str, max_chars: int) -> Any:
    """The rows of `name`, each cut at `max_chars` characters."""
    from datasets import Dataset

    from gpubox.tools.finetune.data import cut_long, detect_format

    path = job_dir / name
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    if rows:
        fmt = detect_format(rows[0])
        rows = [cut_long(row, fmt, max_chars) for row in rows]
    return Dataset.from_list(rows)


def row_chars(req: dict[str, Any], tokenizer: Any) -> int:
    """Where rows are cut before trl tokenizes them (data.cut_long): twice max_length tokens of the longest token
    text, so the cut never reaches a token trl keeps (it truncates each row at max_length, with packing too: its
    default "bfd" strategy truncates overflow, as the planner counts)."""
    from gpubox.tools.finetune.data import max_token_chars

    return 2 * int(req["max_length"]) * max_token_chars(tokenizer)


def _builder(job_dir: Path, cfg: dict[str, Any], tokenizer: Any, bf16: bool) -> Any:
    """build(micro, accum, max_steps, callbacks, probe=False) -> an SFTTrainer on a freshly loaded base model."""
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl.trainer.sft_config import SFTConfig
    from trl.trainer.sft_trainer import SFTTrainer

    req = cfg["request"]
    hf_path = cfg["base"]["hf_path"]
    cuda = torch.cuda.is_available()
    fp16 = bool(req.get("fp16")) and not bf16
    cut = row_chars(req, tokenizer)
    train_ds, eval_ds = _rows(job_dir, "train.jsonl", cut), _rows(job_dir, "eval.jsonl", cut)

    def build(micro: int, accum: int, max_steps: int, callbacks: list[Any], probe: bool = False) -> Any:
        model_kwargs: dict[str, Any] = {"dtype": torch.bfloat16 if bf16 else torch.float32}
        if req["method"] == "qlora":
            from transformers import BitsAndBytesConfig

            model_kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_use_double_quant=(req.get("weight_format") or "nf4_dq") == "nf4_dq",
                bnb_4bit_compute_dtype=torch.bfloat16 if bf16 else torch.float32,
            )
        model = AutoModelForCausalLM.from_pretrained(hf_path, **model_kwargs)
        peft_config = None
        if req["method"] != "full":
            peft_config = LoraConfig(
                r=req["lora_r"],
                lora_alpha=req.get("lora_alpha") or 2 * req["lora_r"],
                lora_dropout=req["lora_dropout"],
                target_modules=req.get("lora_target_modules") or "all-linear",
                task_type="CAUSAL_LM",
            )
        evals = eval_ds is not None and not probe
        args = SFTConfig(
            output_dir=str(job_dir / ("probe" if probe else "checkpoints")),
            per_device_train_batch_size=micro,
            per_device_eval_batch_size=micro,
            gradient_accumulation_steps=accum,
            max_steps=max_steps,
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
            save_strategy="no" if probe else "steps",
            save_steps=req["save_steps"],
            save_total_limit=req["save_total_limit"],
            eval_strategy="steps" if evals else "no",
            eval_steps=req.get("eval_steps") or req["logging_steps"],
            include_num_input_tokens_seen="non_padding",
            report_to="none",
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        return SFTTrainer(
            model=model,
            args=args,
            train_dataset=train_ds,
            eval_dataset=eval_ds if evals else None,
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=callbacks,
        )

    return build


def _probe(job_dir: Path, cfg: dict[str, Any], build: Any, micro: int, accum: int) -> tuple[int, int, bool]:
    """Run the probe when it applies; (micro-batch, accumulation, whether it ran)."""
    steps = int(cfg["request"].get("probe_steps") or 0)
    if steps <= 0 or cfg.get("resume"):
        return micro, accum, False  # a resumed job keeps the layout its checkpoints were trained with
    if RANK["world"] > 1:
        _log(job_dir, {"event": "probe skipped: it runs in single-process jobs; the first steps are measured"})
        return micro, accum, False
    _log(job_dir, {"event": f"probe: {steps} step(s) at per_device_train_batch_size={micro}", "t": time.time()})
    micro, accum, record = run_probe(
        lambda m, a, n, cbs: build(m, a, n, cbs, probe=True),
        micro,
        accum,
        steps,
        int(cfg.get("inject_oom", 0)),
        lambda rec: _log(job_dir, rec),
    )
    shutil.rmtree(job_dir / "probe", ignore_errors=True)
    _log(job_dir, {"probe": record, "t": time.time()})
    # the probed layout is the job's layout from now on, resume included
    cfg.update(per_device_train_batch_size=micro, gradient_accumulation_steps=accum)
    write_json(job_dir / "config.json", cfg)  # whole: the server reads it meanwhile
    return micro, accum, True


def train(job_dir: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer

    req = cfg["request"]
    base = cfg["base"]
    hf_path = Path(base["hf_path"])
    ensure_hf_base(base["format"], Path(base["path"]), hf_path, log=lambda m: _log(job_dir, {"event": m}))
    cuda = torch.cuda.is_available()
    bf16 = bool(req.get("bf16")) if req.get("bf16") is not None else cuda and torch.cuda.is_bf16_supported()
    tokenizer = AutoTokenizer.from_pretrained(str(hf_path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    build = _builder(job_dir, cfg, tokenizer, bf16)
    micro, accum = int(cfg["per_device_train_batch_size"]), int(cfg["gradient_accumulation_steps"])
    micro, accum, probed = _probe(job_dir, cfg, build, micro, accum)
    # without a probe, the injected out-of-memory test hook fires in the real run instead
    inject_left = 0 if probed else int(cfg.get("inject_oom", 0))
    attempt = 0
    while True:
        trainer = build(micro, accum, cfg["total_steps"], [_callback(job_dir, attempt < inject_left)])
        checkpoints = sorted((job_dir / "checkpoints").glob("checkpoint-*"))
        resume = bool(checkpoints) and cfg.get("resume", False)
        if resume:
            _log(job_dir, {"event": f"resuming from {checkpoints[-1].name}", "t": time.time()})
        STOP["training"] = True
        try:
            result = trainer.train(resume_from_checkpoint=True if resume else None)
            break
        except Exception as exc:
            # a real out-of-memory later than the probe saw (a longer batch): same back-off, single process only
            if not is_oom(exc) or RANK["world"] > 1:
                raise
            STOP["training"] = False
            if micro == 1:
                raise RuntimeError(f"out of memory even at per_device_train_batch_size=1; {OOM_HINT}") from exc
            micro, accum, attempt = micro // 2, accum * 2, attempt + 1
            _log(
                job_dir,
                {
                    "event": f"out of memory at per_device_train_batch_size={micro * 2}: halved the micro-batch "
                    f"to {micro} and doubled gradient_accumulation_steps to {accum} (global batch kept)",
                    "per_device_train_batch_size": micro,
                    "gradient_accumulation_steps": accum,
                    "t": time.time(),
                },
            )
            del trainer
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
    if STOP["requested"]:
        return {"cancelled": True, "step": trainer.state.global_step}
    out = {
        "train_loss": result.metrics.get("train_loss"),
        "train_runtime_s": result.metrics.get("train_runtime"),
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": accum,
        "num_processes": RANK["world"],
        "device": "cuda" if cuda else "cpu",
        "gpu_name": torch.cuda.get_device_name(0) if cuda else None,
        "peak_memory_gb": round(torch.cuda.max_memory_allocated() / 1e9, 4) if cuda else None,
    }
    if RANK["rank"] == 0:
        out["adapter_path"] = _save_adapter(trainer, tokenizer, hf_path, Path(cfg["adapter_dir"]))
    return out


def _save_adapter(trainer: Any, tokenizer: Any, hf_path: Path, adapter_dir: Path) -> str:
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
        shutil.rmtree(adapter_dir)
    tmp.rename(adapter_dir)
    return str(adapter_dir)


def main(argv: list[str]) -> int:
    job_dir = Path(argv[0]).resolve()
    cfg = json.loads((job_dir / "config.json").read_text(encoding="utf-8"))
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    RANK.update(rank=rank, world=world, job_dir=job_dir)
    print(f"{launcher.STARTED}{rank} of world size {world}, pid {os.getpid()}", flush=True)
    store = JobStore(Path(cfg["store_root"]))
    job_id = cfg["job_id"]
    signal.signal(signal.SIGTERM, _on_sigterm)
    lead = rank == 0  # only rank 0 writes the job's state
    if lead:
        store.update(job_id, state="running")
    try:
        result = train(job_dir, cfg)
    except SystemExit:
        if lead and (world == 1 or (job_dir / CANCEL_MARK).exists()):
            store.finish(job_id, "cancelled", error="cancelled before training started")
        elif lead:
            # another rank failed: the job fails when the launcher exits (JobStore.reconcile), after it has logged
            # which rank failed first, so the status never shows a tail without that summary
            store.update(job_id, error="stopped by the launcher after another rank failed")
        return 143
    except BaseException as exc:
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        error = f"rank {rank}: {type(exc).__name__}: {exc}"[:2000]
        if lead and world == 1:
            store.finish(job_id, "failed", error=error)
        elif lead:
            store.update(job_id, error=error)  # as above: failed once the launcher has stopped every rank
        return 1
    if not lead:
        return 143 if result.get("cancelled") else 0
    if result.get("cancelled"):
        store.finish(job_id, "cancelled", error=None, result=result)
        return 143
    store.finish(job_id, "completed", result=result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
