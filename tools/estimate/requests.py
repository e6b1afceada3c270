"""The training request, in TRL/peft vocabulary, shared by estimate_training, finetune_plan and finetune_launch.

One model flows from the MCP adapter to the core unchanged: the adapter's flat, LLM-friendly parameters carry
exactly these field names, and the adapter builds `TrainingRequest(**args)` (or the fine-tuning family's
subclass) and hands it to the core. Field names follow trl's `SFTConfig`/`ModelConfig` and peft's `LoraConfig`
so a user who knows those libraries knows these arguments.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpubox.errors import InvalidInputError

Method = Literal["full", "lora", "qlora"]
# transformers' `optim` names (TrainingArguments.optim) that the planner knows the state size of.
Optim = Literal[
    "adamw_torch",
    "adamw_torch_fused",
    "adamw_8bit",
    "adamw_bnb_8bit",
    "paged_adamw_8bit",
    "paged_adamw_32bit",
    "adafactor",
    "sgd",
]
Auto = Literal["auto"]
# a quoted tok/s outside these is a unit slip (an inf or 1e-300 gave non-finite costs)
QUOTED_MIN, QUOTED_MAX = 1e-3, 1e8


class TrainingRequest(BaseModel):
    """What to train and how; everything the memory/batch planner and the estimator need."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        min_length=1,
        max_length=4096,
        description="Catalog or infer_models name, or path to a .gguf file or HF folder",
    )
    method: Method = Field(default="qlora", description="QLoRA: 4-bit NF4 base")
    weight_format: str | None = Field(
        default=None, max_length=64, description="qlora: nf4_dq (default) or nf4; else bf16 (default), fp16, fp32"
    )
    lora_r: int = Field(default=16, ge=1, le=1024)
    lora_alpha: int | None = Field(default=None, ge=1, le=65536, description="Default 2 x lora_r")
    lora_dropout: float = Field(default=0.05, ge=0.0, lt=1.0)
    lora_target_modules: list[str] | Literal["all-linear"] | None = Field(
        default=None,
        description="e.g. ['q_proj','v_proj'] or 'all-linear' (default)",
    )
    max_length: int = Field(default=512, ge=8, le=1_048_576, description="Sequence length, tokens")
    per_device_train_batch_size: int | Auto | None = Field(
        default="auto", description="Micro-batch; 'auto' = planner's choice"
    )
    gradient_accumulation_steps: int | None = Field(
        default=None, ge=1, le=65536, description="Default from target_global_batch"
    )
    target_global_batch: int | None = Field(default=None, ge=1, le=1_000_000, description="Samples per optimizer step")
    gradient_checkpointing: bool | Auto = Field(default="auto", description="'auto': only when needed to fit")
    optim: Optim = Field(default="paged_adamw_8bit", description="Optimizer")
    bf16: bool | None = Field(default=None, description="Default: where supported")
    fp16: bool | None = Field(default=None)
    dataset_samples: int | None = Field(default=None, ge=1, le=10**10, description="Training rows")
    dataset_tokens: int | None = Field(default=None, ge=1, le=10**15, description="Overrides dataset_samples")
    num_train_epochs: float = Field(default=1.0, gt=0, le=1000)
    max_steps: int | None = Field(default=None, ge=1, le=10_000_000, description="Overrides epochs")
    num_processes: int = Field(default=1, ge=1, le=1024, description="Data-parallel GPUs")
    gpu: str = Field(
        default="auto",
        min_length=1,
        max_length=100,
        description="'auto', 'local', 'all' or a GPU name, e.g. 'A10'",
    )
    headroom_pct: float = Field(default=15.0, ge=0, le=50, description="Memory kept free, %")
    tokens_per_s: float | None = Field(
        default=None,
        ge=QUOTED_MIN,
        le=QUOTED_MAX,
        allow_inf_nan=False,
        description="A quoted throughput to check and use",
    )

    @field_validator("per_device_train_batch_size")
    @classmethod
    def _batch_in_range(cls, v: int | str | None) -> int | str | None:
        if isinstance(v, int) and not 1 <= v <= 4096:
            raise ValueError(f"must be between 1 and 4096, 'auto' or null; got {v}")
        return v

    @field_validator("lora_target_modules")
    @classmethod
    def _targets_listed(cls, v: list[str] | str | None) -> list[str] | str | None:
        if isinstance(v, list) and (not v or len(v) > 64 or any(not t or len(t) > 100 for t in v)):
            raise ValueError("give 1 to 64 module names (e.g. ['q_proj', 'v_proj']), 'all-linear' or null")
        return v


def check_precision(req: TrainingRequest) -> None:
    """bf16 and fp16 together: refused by finetune_plan and estimate_training alike."""
    if req.bf16 and req.fp16:
        raise InvalidInputError(
            "bf16=true and fp16=true: a run uses one mixed precision. Keep bf16=true (GPUs from Ampere on, and "
            "CPUs) or fp16=true (older GPUs), or leave both null to let the worker choose"
        )
