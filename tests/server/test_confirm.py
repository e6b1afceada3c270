"""Confirmation before costly work through MCP elicitation, with the SDK client's own elicitation callback, in
both protocol eras: accept runs the tool, decline and cancel start nothing and say so, a client without the
capability is never asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mcp.types as t
import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.settings import Settings
from gpubox.tools.finetune.adapter import finetuner
from tests.conftest import call_err

pytestmark = pytest.mark.anyio


def answering(action: str, asked: list[str]) -> Any:
    async def callback(_context: Any, params: Any) -> t.ElicitResult:
        asked.append(params.message)
        if action == "accept":
            return t.ElicitResult(action="accept", content={"confirm": True})
        if action == "accept-unchecked":
            return t.ElicitResult(action="accept", content={"confirm": False})
        return t.ElicitResult(action=action)  # type: ignore[arg-type]

    return callback


@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize(
    ("action", "expect"),
    [
        ("accept", "the adapter of job abc123 is missing"),  # confirmed: the tool ran and reported the lost adapter
        ("accept-unchecked", "the user declined"),
        ("decline", "the user declined"),
        ("cancel", "the user dismissed"),
        (None, "the adapter of job abc123 is missing"),  # no elicitation capability: not asked, runs as before
    ],
)
async def test_a_merge_is_confirmed_first_and_a_refusal_starts_nothing(
    tmp_path: Path, mode: str, action: str | None, expect: str
) -> None:
    asked: list[str] = []
    kwargs = {"elicitation_callback": answering(action, asked)} if action else {}
    mcp = build_server(Settings.load(state_dir=tmp_path / "s", allowed_roots=[tmp_path]))
    try:
        store = finetuner(state_of(mcp)).store  # a finished job whose adapter is gone: the merge itself then fails
        store.create("abc123", "my-adapter", "smollm2-135m-instruct", "lora")
        store.finish("abc123", "completed", result={"adapter_path": str(tmp_path / "gone")})
        store.job_dir("abc123").mkdir(parents=True)
        (store.job_dir("abc123") / "config.json").write_text('{"base": {"hf_path": "x"}, "adapter_dir": "y"}')
        store.create("def456", "no-files", "smollm2-135m-instruct", "lora")  # its folder was removed by hand
        store.finish("def456", "completed", result={"adapter_path": str(tmp_path / "gone")})
        async with Client(mcp, mode=mode, **kwargs) as c:  # type: ignore[arg-type]
            text = await call_err(c, "finetune_merge", job="abc123", gguf="q8_0")
            unknown = await call_err(c, "finetune_merge", job="nosuchjob")
            no_files = await call_err(c, "finetune_merge", job="def456")
    finally:
        state_of(mcp).close()
    assert expect in text, text
    assert "no fine-tuning job or adapter named 'nosuchjob'" in unknown, unknown
    assert "job def456 has no files left" in no_files, no_files  # an unexpected FileNotFoundError before
    if action is None:
        assert asked == []
    else:  # asked once: not about the unknown job, which the tool body refuses (it was asked, then refused)
        assert len(asked) == 1 and "'my-adapter' (job abc123)" in asked[0] and "q8_0 GGUF" in asked[0], asked
    if "declined" in expect or "dismissed" in expect:
        assert "Nothing is running" in text
        assert not (tmp_path / "s" / "models").exists() or not any((tmp_path / "s" / "models").iterdir())


async def test_a_benchmark_asks_with_its_time_limit(tmp_path: Path) -> None:
    asked: list[str] = []
    mcp = build_server(Settings.load(state_dir=tmp_path / "s", allowed_roots=[tmp_path]))
    try:
        async with Client(mcp, elicitation_callback=answering("decline", asked)) as c:
            text = await call_err(c, "bench_device", device="cpu", time_limit_s=42)
            runs = (await c.call_tool("bench_list", {})).structured_content
    finally:
        state_of(mcp).close()
    assert asked == ["Benchmark this device for up to 42 s, holding it alone?"]
    assert "bench_device was not started" in text and runs is not None and runs["runs"] == []


async def test_arguments_the_schema_refuses_are_refused_before_anyone_is_asked(tmp_path: Path) -> None:
    asked: list[str] = []
    mcp = build_server(Settings.load(state_dir=tmp_path / "s", allowed_roots=[tmp_path]))
    try:
        async with Client(mcp, elicitation_callback=answering("accept", asked)) as c:
            text = await call_err(c, "bench_attention", device="cpu", seq_len=[])  # asked, then refused before
    finally:
        state_of(mcp).close()
    assert asked == [] and "seq_len" in text, (asked, text)


async def test_confirmation_parameters_stay_out_of_the_input_schema(tmp_path: Path) -> None:
    mcp = build_server(Settings.load(state_dir=tmp_path / "s", allowed_roots=[tmp_path]))
    try:
        async with Client(mcp) as c:
            tools = {x.name: x for x in (await c.list_tools()).tools}
    finally:
        state_of(mcp).close()
    for name in ("finetune_launch", "finetune_merge", "serve_start", "bench_attention", "bench_device"):
        assert "ok" not in tools[name].input_schema["properties"], name


async def test_work_started_anew_by_each_call_is_not_marked_safe_to_retry(tmp_path: Path) -> None:
    """A host may retry an idempotent tool on its own: finetune_launch with queue=true queued the same training
    twice, and infer_benchmark (marked read-only) stores a calibration."""
    mcp = build_server(Settings.load(state_dir=tmp_path / "s", allowed_roots=[tmp_path]))
    try:
        async with Client(mcp) as c:
            tools = {x.name: x.annotations for x in (await c.list_tools()).tools}
    finally:
        state_of(mcp).close()
    starts = [
        "finetune_launch", "finetune_resume", "bench_attention", "bench_device", "estimate_record_measurement",
        "infer_benchmark",
    ]  # fmt: skip
    for name in starts:
        note = tools[name]
        assert note is not None and note.idempotent_hint is False and note.read_only_hint is False, (name, note)


async def test_a_resume_and_a_long_benchmark_are_confirmed_and_a_decline_starts_nothing(tmp_path: Path) -> None:
    from gpubox.tools.inference.adapter import BENCH_ASK_TOKENS

    asked: list[str] = []
    mcp = build_server(Settings.load(state_dir=tmp_path / "s", allowed_roots=[tmp_path]))
    try:
        store = finetuner(state_of(mcp)).store
        store.create("c0ffee12", "on-purpose", "smollm2-135m-instruct", "lora")
        store.finish("c0ffee12", "cancelled", error="cancelled by the user")
        async with Client(mcp, elicitation_callback=answering("decline", asked)) as c:
            resumed = await call_err(c, "finetune_resume", job_id="c0ffee12")
            unknown = await call_err(c, "finetune_resume", job_id="deadbeef")
            long = await call_err(c, "infer_benchmark", requests=1000, prompt_tokens=64, max_tokens=64)
    finally:
        state_of(mcp).close()
    assert "resuming job c0ffee12 was not started" in resumed and "no fine-tuning job 'deadbeef'" in unknown
    assert BENCH_ASK_TOKENS < 1000 * 128 and "infer_benchmark was not started" in long, long
    assert len(asked) == 2 and "c0ffee12 (on-purpose, cancelled)" in asked[0], asked
    assert "1000 requests, 128,000 tokens" in asked[1], asked
    assert store.get("c0ffee12")["state"] == "cancelled"  # type: ignore[index]
