"""The training request, in TRL/peft vocabulary, shared by estimate_training, finetune_plan and finetune_launch.

One model flows from the MCP adapter to the core unchanged: the adapter's flat, LLM-friendly parameters carry
exactly these field names, and the adapter builds `TrainingRequest(**args)` (or the fine-tuning family's
subclass) and hands it to the core. Field names follow trl's `SFTConfig`/`ModelConfig` and peft's `LoraConfig`
so a user who knows those libraries knows these arguments.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

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


class TrainingRequest(BaseModel):
    """What to train and how; everything the memory/batch planner and the estimator need."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        min_length=1,
        max_length=4096,
        description="Catalog name (e.g. 'Mistral-7B-Instruct-v0.3'), a model name from infer_models, or a path "
        "inside the allowed roots/model dirs to a .gguf file or a Hugging Face folder with config.json",
    )
    method: Method = Field(default="qlora", description="full fine-tune, LoRA, or QLoRA (4-bit NF4 base)")
    weight_format: str | None = Field(
        default=None, description="qlora: nf4_dq (default, double quant) or nf4; lora/full: bf16 (default), fp16, fp32"
    )
    lora_r: int = Field(default=16, ge=1, le=1024, description="LoRA rank r (peft LoraConfig.r)")
    lora_alpha: int | None = Field(default=None, ge=1, le=65536, description="LoRA alpha; default 2 x lora_r")
    lora_dropout: float = Field(default=0.05, ge=0.0, lt=1.0, description="LoRA dropout")
    lora_target_modules: list[str] | Literal["all-linear"] | None = Field(
        default=None,
        description="Modules to adapt, e.g. ['q_proj','k_proj','v_proj','o_proj'], or 'all-linear' (default)",
    )
    max_length: int = Field(default=512, ge=8, le=1_048_576, description="Training sequence length in tokens")
    per_device_train_batch_size: int | Auto | None = Field(
        default="auto", description="Micro-batch per device; 'auto' (or null) lets the planner choose"
    )
    gradient_accumulation_steps: int | None = Field(
        default=None, ge=1, le=65536, description="Micro-batches per optimizer step; default from target_global_batch"
    )
    target_global_batch: int | None = Field(
        default=None, ge=1, le=1_000_000, description="Samples per optimizer step; sets gradient accumulation"
    )
    gradient_checkpointing: bool | Auto = Field(
        default="auto", description="Recompute activations in backward; 'auto' turns it on only when needed to fit"
    )
    optim: Optim = Field(default="paged_adamw_8bit", description="Optimizer (transformers TrainingArguments.optim)")
    bf16: bool | None = Field(default=None, description="bf16 mixed precision; default: on where the GPU supports it")
    fp16: bool | None = Field(default=None, description="fp16 mixed precision (GPUs without bf16)")
    dataset_samples: int | None = Field(default=None, ge=1, description="Training rows (each up to max_length tokens)")
    dataset_tokens: int | None = Field(default=None, ge=1, description="Training tokens (overrides dataset_samples)")
    num_train_epochs: float = Field(default=1.0, gt=0, le=1000, description="Epochs over the dataset")
    max_steps: int | None = Field(default=None, ge=1, le=10_000_000, description="Optimizer steps; overrides epochs")
    num_processes: int = Field(default=1, ge=1, le=1024, description="Data-parallel processes/GPUs (accelerate)")
    gpu: str = Field(
        default="auto",
        min_length=1,
        max_length=100,
        description="'auto' (local GPU if any), 'local', 'all' or a GPU name such as 'A10' or 'H100 SXM'",
    )
    headroom_pct: float = Field(default=15.0, ge=0, le=50, description="Memory kept free as a safety margin, %")
    tokens_per_s: float | None = Field(
        default=None, gt=0, description="A quoted training throughput to use for time/cost; checked for plausibility"
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
