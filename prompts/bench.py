"""Prompt that turns a model's attention shape into a bench_attention sweep and a kernel recommendation."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from pydantic import Field


def register(mcp: MCPServer[Any]) -> None:
    @mcp.prompt(title="Pick an attention kernel")
    def pick_attention_kernel(
        heads: Annotated[int, Field(ge=1, le=1024, description="Attention heads of the model")] = 32,
        head_dim: Annotated[int, Field(ge=1, le=4096, description="The model's head dimension D")] = 128,
        seq_len: Annotated[int, Field(ge=1, le=262_144, description="Typical prefill length N")] = 8192,
        batch: Annotated[int, Field(ge=1, le=256, description="Sequences per call")] = 1,
        causal: Annotated[bool, Field(description="Decoder (causal) attention")] = True,
        training: Annotated[bool, Field(description="Also time the backward pass")] = False,
    ) -> str:
        """Ask the model to benchmark the attention backends on this box for one model shape and recommend one."""
        mode = ", training (forward + backward)" if training else ""
        dims = sorted({head_dim, *(d for d in (64, 128, 256, 512) if d != head_dim)})
        return (
            f"Pick the fastest correct attention kernel on this GPU box for B={batch}, H={heads}, N={seq_len}, "
            f"D={head_dim}, {'causal' if causal else 'non-causal'}{mode}.\n"
            f"1. Call `bench_attention` with batch={batch}, heads={heads}, seq_len={seq_len}, head_dim={dims}, "
            f"causal={str(causal).lower()}, backward={str(training).lower()} (dtype auto: fp16 on a GPU). The extra "
            "head dimensions show how the ranking moves around yours.\n"
            "2. From its rows at D={head_dim}: name the winner, its TFLOPS and speedup over SDPA efficient "
            "attention, and the runner-up. Ignore rows with within_tolerance=false (numerically wrong) and say so "
            "if any exist. List skipped backends with their reasons and whether installing something would help "
            "(ffpa-attn for D > 256, flash-attn for D ≤ 256).\n"
            "3. Recommend one backend and how to select it: `torch.nn.attention.sdpa_kernel(SDPBackend.X)` for an "
            "SDPA backend, `ffpa_attn.ffpa_attn_func` as a drop-in for `F.scaled_dot_product_attention`, or "
            "`flash_attn.flash_attn_func` (B, N, H, D layout). If the run is on the CPU, say that GPU kernels were not "
            "measured and the ranking does not carry over to a GPU. Show the TFLOPS plot the tool returned."
        )
