"""finetune_plan and dataset validation: bad data is refused with the row and the problem; nothing launches."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.errors import InvalidInputError
from gpubox.tools.finetune import data
from tests.conftest import call_err, call_ok, has_gpu
from tests.finetune.conftest import DATASET, make_settings

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    mcp = build_server(make_settings(tmp_path / "root"))
    async with Client(mcp) as c:
        yield c
    state_of(mcp).close()


def write_jsonl(path: Path, rows: list[Any]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


async def test_a_row_without_messages_is_named_in_the_error(client: Client, tmp_path: Path) -> None:
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    path = write_jsonl(tmp_path / "root" / "d.jsonl", [good, good, {"text_typo": "x"}])
    msg = await call_err(client, "finetune_plan", dataset=path)
    assert "row 3" in msg and "missing 'messages'" in msg


async def test_an_empty_dataset_is_refused(client: Client, tmp_path: Path) -> None:
    path = tmp_path / "root" / "empty.jsonl"
    path.write_text("\n", encoding="utf-8")
    assert "has no rows" in await call_err(client, "finetune_plan", dataset=str(path))


async def test_wrong_types_are_refused_with_the_field(client: Client, tmp_path: Path) -> None:
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": 42}]}]
    msg = await call_err(client, "finetune_plan", dataset=write_jsonl(tmp_path / "root" / "t.jsonl", rows))
    assert "row 1" in msg and "content must be a string" in msg and "int" in msg
    rows2 = [{"prompt": "a", "completion": "b"}, {"prompt": "a", "completion": None}]
    msg = await call_err(client, "finetune_plan", dataset=write_jsonl(tmp_path / "root" / "pc.jsonl", rows2))
    assert "row 2" in msg and "'completion'" in msg


async def test_unknown_row_shapes_and_broken_json_are_refused(client: Client, tmp_path: Path) -> None:
    msg = await call_err(
        client, "finetune_plan", dataset=write_jsonl(tmp_path / "root" / "u.jsonl", [{"question": "q"}])
    )
    assert "expected 'messages'" in msg and "question" in msg
    bad = tmp_path / "root" / "broken.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": \n', encoding="utf-8")
    assert "line 2 is not valid JSON" in await call_err(client, "finetune_plan", dataset=str(bad))


async def test_a_dataset_outside_the_allowed_roots_is_refused(client: Client, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.jsonl"
    write_jsonl(outside, [{"text": "secret"}])
    assert "outside the allowed roots" in await call_err(client, "finetune_plan", dataset=str(outside))


async def test_an_unknown_base_model_lists_the_models_here(client: Client) -> None:
    msg = await call_err(client, "finetune_plan", dataset=str(DATASET), model="no-such-model")
    assert "no model named 'no-such-model'" in msg and "smollm2-135m-instruct" in msg


def test_csv_prompt_completion_and_text_rows_are_detected(tmp_path: Path) -> None:
    csv_path = tmp_path / "pc.csv"
    csv_path.write_text("prompt,completion\nWhat is 2+2?,4\nCapital of France?,Paris\n", encoding="utf-8")
    fmt, rows = data.load(csv_path)
    assert fmt == "prompt_completion" and rows[1] == {"prompt": "Capital of France?", "completion": "Paris"}
    fmt, rows = data.normalise([{"text": "a", "extra": 1}], "x")
    assert fmt == "text" and rows == [{"text": "a"}]
    with pytest.raises(InvalidInputError, match="no assistant message"):
        data.normalise([{"messages": [{"role": "user", "content": "hi"}]}], "x")
    with pytest.raises(InvalidInputError, match="role 'bot'"):
        data.normalise([{"messages": [{"role": "bot", "content": "hi"}]}], "x")


async def test_the_plan_summarises_the_dataset_and_picks_the_batch_for_this_device(
    tmp_path: Path, hf_base: Path
) -> None:
    mcp = build_server(make_settings(tmp_path / "root", hf_base))
    try:
        async with Client(mcp) as client:
            plan = await call_ok(client, "finetune_plan", dataset=str(DATASET), max_length=128, learning_rate=2e-3)
            truncated = await call_ok(client, "finetune_plan", dataset=str(DATASET), max_length=16)
            long = await call_ok(client, "finetune_plan", dataset=str(DATASET), max_length=2048)
    finally:
        state_of(mcp).close()
    ds = plan["dataset"]
    assert ds["format"] == "messages" and ds["rows"] == 48 and ds["train_rows"] == 48 and ds["truncated_rows"] == 0
    p = ds["token_length_percentiles"]
    assert 10 < p["p50"] <= p["p90"] <= p["max"] < 128
    assert plan["base"]["name"] == "smollm2-135m-instruct" and plan["base"]["hf_ready"]
    assert plan["request"]["method"] == "lora" and plan["request"]["learning_rate"] == 2e-3
    micro, accum = plan["per_device_train_batch_size"], plan["gradient_accumulation_steps"]
    assert plan["total_steps"] == -(-48 // (micro * accum))
    assert plan["estimate"]["results"] and plan["estimated_memory_gb"] > 0 and plan["estimated_tokens_per_s"] > 0
    if not has_gpu():
        assert plan["device"] == "cpu" and micro == 4 and "cpu" in plan["batch_source"]
    assert truncated["dataset"]["truncated_rows"] == 48
    # trl pads a batch to its longest row: a max_length far above every row plans no more memory or time
    assert f"rows planned at {p['max'] + 8} tokens" in long["batch_source"]
    assert long["estimated_memory_gb"] == plan["estimated_memory_gb"]
    assert "rows planned" not in truncated["batch_source"]
    assert any("longer than max_length 16" in w for w in truncated["warnings"])


def test_rows_are_planned_at_the_longest_row_unless_packed_or_only_sampled() -> None:
    from gpubox.tools.finetune.planner import planned_length
    from gpubox.tools.finetune.schemas import DatasetSummary, FinetuneRequest

    def summary(rows: int) -> DatasetSummary:
        lengths = {"p50": 40, "p90": 90, "p99": 110, "max": 120}
        return DatasetSummary(path="d", format="messages", rows=rows, train_rows=rows, eval_rows=0,
                              tokens_total=rows * 50, token_length_percentiles=lengths, truncated_rows=0)  # fmt: skip

    req = FinetuneRequest(dataset="d", max_length=1024)
    assert planned_length(req, summary(100)) == 128
    assert planned_length(req.model_copy(update={"max_length": 64}), summary(100)) == 64
    assert planned_length(req.model_copy(update={"packing": True}), summary(100)) == 1024  # packed rows fill it
    assert planned_length(req, summary(data.SAMPLED_ROWS + 1)) == 1024  # an unmeasured row may be longer
