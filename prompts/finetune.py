"""plan_finetune: from a goal to a plan, a launch, and serving the result."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from pydantic import Field


def register(mcp: MCPServer[Any]) -> None:
    @mcp.prompt(title="Plan a fine-tune")
    def plan_finetune(
        goal: Annotated[str, Field(description="What the tuned model should do, e.g. 'answer in our support tone'")],
        dataset: Annotated[str, Field(description="Path of the training data inside the allowed roots")] = "",
        model: Annotated[str, Field(description="Base model (infer_models lists them); empty: bundled")] = "",
    ) -> str:
        """Walk through a LoRA fine-tune: plan, launch, watch, serve the adapter, then merge/export it."""
        data = f"the dataset at {dataset}" if dataset else "a dataset (ask the user for its path)"
        base = f"model='{model}'" if model else "the default (bundled) model"
        return (
            f"Goal: {goal}\n\nFine-tune {base} on {data} with LoRA, step by step:\n"
            "1. Call `finetune_plan` (method 'lora'; 'qlora' on a GPU for models above ~3B). Read the dataset "
            "summary: format, rows, token-length percentiles and truncated rows; if many rows are truncated, raise "
            "max_length. Check the memory estimate, micro-batch and warnings, and show the user the plan.\n"
            "2. When the user agrees, call `finetune_launch` with the plan_id. It returns a job_id at once.\n"
            "3. Call `finetune_status` with wait_seconds=60 until the state is completed; report loss and ETA "
            "as they change; finetune_status with include_plot=true also returns the loss curve as an image "
            "(and it is at finetune://jobs/{job_id}/loss.png). If the user wants to stop, "
            "call `finetune_cancel`; `finetune_resume` continues from the last checkpoint.\n"
            "4. When it completes, call `infer_models` (the adapter is listed with format 'lora'), `infer_load` "
            "it, and `infer_chat` with a question from the goal to show the change. If it failed, read log_tail "
            "and events and explain the fix.\n"
            "5. Last, if the user wants a standalone model: `finetune_merge` with the job_id folds the adapter into "
            "a 16-bit copy of the base (QLoRA adapters too; never into 4-bit weights) and saves an HF folder that "
            "`infer_models` lists; gguf='f16' or 'q8_0' also writes a GGUF for llama.cpp (when the base came from "
            "a GGUF, like the bundled model). Load the merged name with `infer_load` and check the answer again."
        )
