"""Inputs and outputs of the fine-tuning tools, in trl/peft vocabulary (SFTConfig, LoraConfig field names)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpubox.tools.estimate.requests import Optim, TrainingRequest

JobState = Literal["queued", "starting", "running", "completed", "failed", "cancelled"]
DatasetFormat = Literal["messages", "prompt_completion", "text"]
Scheduler = Literal[
    "linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup", "inverse_sqrt"
]
# The weight formats the worker can train in (tools/estimate/training.TRAIN_FORMATS): 16/32-bit for LoRA and full
# fine-tunes, bitsandbytes NF4 (with or without double quantization) for QLoRA
WeightFormat = Literal["bf16", "fp16", "fp32", "nf4", "nf4_dq"]
FORMATS_FOR: dict[str, tuple[str, ...]] = {
    "full": ("bf16", "fp16", "fp32"),
    "lora": ("bf16", "fp16", "fp32"),
    "qlora": ("nf4_dq", "nf4"),
}
ACTIVE: tuple[JobState, ...] = ("starting", "running")
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class FinetuneRequest(TrainingRequest):
    """A fine-tuning job: the shared TrainingRequest plus the data and optimisation settings of trl's SFTConfig.

    Defaults differ from the estimator's where a fine-tune on an unknown box needs other ones: LoRA (QLoRA needs
    bitsandbytes and a CUDA GPU to pay off), all-linear targets, plain AdamW (the paged 8-bit optimizers are
    CUDA-only), the bundled model.
    """

    model: str = Field(
        default="smollm2-135m-instruct",
        min_length=1,
        max_length=4096,
        description="infer_models name, or path to a .gguf file or HF folder",
    )
    dataset: str = Field(
        min_length=1,
        max_length=4096,
        description=".jsonl/.json/.csv/.parquet file or save_to_disk folder; rows: 'messages', prompt/completion "
        "or 'text'",
    )
    method: Literal["full", "lora", "qlora"] = Field(default="lora", description="QLoRA: 4-bit NF4 base")
    # narrower than the estimator's free string on purpose: the tool schema lists the formats a job can train in
    weight_format: WeightFormat | None = Field(  # pyright: ignore[reportIncompatibleVariableOverride]
        default=None,
        description="qlora: nf4_dq (default) or nf4; else bf16 (default), fp16, fp32",
    )
    lora_target_modules: list[str] | Literal["all-linear"] | None = Field(
        default="all-linear", description="e.g. ['q_proj','v_proj'] or 'all-linear'"
    )
    optim: Optim = Field(default="adamw_torch", description="Optimizer")
    max_length: int = Field(default=512, ge=8, le=1_048_576, description="Rows truncated to this many tokens")
    learning_rate: float = Field(default=2e-4, gt=0, le=1.0, description="Peak")
    lr_scheduler_type: Scheduler = Field(default="linear")
    warmup_ratio: float = Field(default=0.0, ge=0, lt=1)
    weight_decay: float = Field(default=0.0, ge=0, le=1)
    seed: int = Field(default=42, ge=0, le=2**31 - 1)
    packing: bool = Field(default=False, description="Pack rows into max_length sequences")
    use_liger_kernel: bool = Field(default=False, description="Needs liger-kernel and a GPU")
    eval_split: float = Field(default=0.0, ge=0, le=0.5, description="Fraction held out for eval loss")
    eval_steps: int | None = Field(default=None, ge=1, description="Default: logging_steps")
    logging_steps: int = Field(default=1, ge=1, le=100_000)
    save_steps: int = Field(default=50, ge=1, le=1_000_000, description="Checkpoint every N steps")
    save_total_limit: int = Field(default=2, ge=1, le=100, description="Checkpoints kept")
    num_processes: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Data-parallel processes here (accelerate launch; at most one per GPU)",
    )
    probe_steps: int = Field(
        default=2,
        ge=0,
        le=20,
        description="Probe steps before training (memory, tok/s); 0 = none",
    )
    output_name: str | None = Field(
        default=None,
        pattern=NAME_PATTERN,
        description="Adapter name; default 'ft-<job id>'",
    )


class DatasetSummary(BaseModel):
    path: str
    format: DatasetFormat
    rows: int
    train_rows: int
    eval_rows: int
    tokens_total: int = Field(description="Tokens over all rows after the chat template, before truncation")
    token_length_percentiles: dict[str, int] = Field(description="p50/p90/p99/max tokens per row")
    truncated_rows: int = Field(description="Rows longer than max_length (cut at max_length)")


class ResolvedBase(BaseModel):
    name: str = Field(description="Registry name of the base model")
    path: str = Field(description="The GGUF file or HF folder it comes from")
    format: Literal["gguf", "hf"]
    hf_path: str = Field(description="HF folder the worker trains from (a GGUF is dequantized there once)")
    hf_ready: bool = Field(description="Whether that HF folder already exists (else the job builds it first)")


class FinetunePlan(BaseModel):
    plan_id: str = Field(description="Pass to finetune_launch unchanged")
    request: FinetuneRequest
    base: ResolvedBase
    device: str = Field(description="'cuda' (GPU from NVML) or 'cpu' (the plan is for host RAM)")
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    global_batch: int
    gradient_checkpointing: bool
    total_steps: int
    batch_source: str = Field(description="Why this micro-batch: the planner, a calibration, or the request")
    estimated_memory_gb: float | None = None
    estimated_tokens_per_s: float | None = None
    estimated_hours: float | None = None
    estimate: dict[str, Any] | None = Field(default=None, description="The estimator's full training estimate")
    dataset: DatasetSummary
    planned_length: int | None = Field(
        default=None, description="Tokens per row the memory plan assumes: the longest row + 8, or max_length"
    )
    dataset_stamp: str | None = Field(default=None, description="The dataset file's size:mtime when planned")
    speed_options: dict[str, bool] = Field(description="packing / liger kernels / gradient checkpointing: on or off")
    warnings: list[str] = Field(default_factory=list)


class ProbeResult(BaseModel):
    steps: int = Field(description="Optimizer steps the probe ran (one micro-batch each)")
    per_device_train_batch_size: int = Field(description="Micro-batch the probe ran at (after any halving)")
    tokens_per_s: float | None = Field(description="Measured training tokens/s (non-padding), steps after the first")
    peak_memory_gb: float | None = Field(description="Measured peak memory (CUDA max allocated, or process RSS)")
    memory_kind: str = Field(description="cuda_max_allocated or cpu_rss")
    seconds: float = Field(description="Wall time of the probe, model load included")


class JobStatus(BaseModel):
    model_config = ConfigDict(extra="ignore")

    job_id: str
    state: JobState
    adapter_name: str
    base_model: str
    method: str
    created: float
    step: int = 0
    total_steps: int | None = None
    epoch: float | None = None
    loss: float | None = None
    smoothed_loss: float | None = Field(default=None, description="Exponential moving average of the loss (0.8)")
    first_loss: float | None = None
    eval_loss: float | None = None
    learning_rate: float | None = None
    tokens_per_s: float | None = None
    elapsed_s: float | None = None
    eta_s: float | None = None
    peak_memory_gb: float | None = None
    per_device_train_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    num_processes: int = Field(default=1, description="Data-parallel processes the job runs (accelerate launch)")
    probe: ProbeResult | None = Field(default=None, description="What the probe run measured before training")
    checkpoints: list[str] = Field(default_factory=list)
    adapter_path: str | None = Field(default=None, description="Finished adapter (listed by infer_models)")
    events: list[str] = Field(default_factory=list, description="Decisions the job took (OOM back-off, resume)")
    error: str | None = None
    log_tail: str | None = Field(default=None, description="Last lines of the job log (failed jobs, or on request)")
    queue_position: int | None = Field(default=None, description="Place in the memory queue while queued (1 = next)")
    next_step: str | None = None


class JobList(BaseModel):
    jobs: list[JobStatus]
