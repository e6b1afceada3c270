"""Fine-tuning inputs a hostile-input pass found mishandled: dataset text a tokenizer chokes on (roles that are not
strings, lone surrogates), a byte-order mark, rows so long that tokenizing them in one call took gigabytes, a global
batch above the dataset, and a cancel that lands before the worker can catch it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpubox.errors import InvalidInputError
from gpubox.tools.finetune import data


@pytest.mark.parametrize("role", [["user"], {"r": 1}, None, 3])
def test_a_role_that_is_not_a_string_is_named_not_a_type_error(role: Any) -> None:
    row = {"messages": [{"role": role, "content": "hi"}, {"role": "assistant", "content": "ok"}]}
    with pytest.raises(InvalidInputError, match="row 1 'messages' message 0: role 'a "):
        data.normalise([row], "x")


@pytest.mark.parametrize(
    ("row", "where"),
    [
        ({"text": "hello \ud800 world"}, "row 1 'text'"),
        ({"prompt": "a\udfff", "completion": "b"}, "row 1 'prompt'"),
        ({"messages": [{"role": "user", "content": "\ud800"}, {"role": "assistant", "content": "x"}]}, "content"),
    ],
)
def test_a_lone_surrogate_is_refused_with_where_it_is(row: dict[str, Any], where: str) -> None:
    with pytest.raises(InvalidInputError, match="invalid Unicode") as refused:
        data.normalise([row], "x")
    assert where in str(refused.value)


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv"])
def test_a_file_with_a_utf8_byte_order_mark_is_read(tmp_path: Path, suffix: str) -> None:
    body = {".jsonl": '{"text": "a"}\n', ".json": '[{"text": "a"}]', ".csv": "text\na\n"}[suffix]
    path = tmp_path / f"bom{suffix}"
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())  # what Excel's "CSV UTF-8" and Notepad write
    assert data.load(path) == ("text", [{"text": "a"}])


class Spy:
    """A real tokenizer, recording how many characters each call was given."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.calls = tokenizer, []  # type: ignore[var-annotated]

    def __call__(self, texts: Any, **kw: Any) -> Any:
        self.calls.append(len(texts) if isinstance(texts, str) else sum(map(len, texts)))
        return self.tokenizer(texts, **kw)


@pytest.mark.requires_hf
def test_long_rows_are_counted_in_bounded_pieces_and_short_rows_together(hf_base: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(hf_base))
    words = json.dumps([f"value_{i} is {i * 7} units" for i in range(12_000)])  # ~300k characters of real text
    rows = [{"text": "short row one"}, {"text": words}, {"text": "short row two"}, {"text": words * 5}]
    spy = Spy(tok)
    lengths = data.token_lengths(rows, "text", spy)
    assert max(spy.calls) <= data.PIECE
    exact = len(tok(words, add_special_tokens=False)["input_ids"])
    assert lengths[1] == pytest.approx(exact, rel=0.002)  # pieces cut a word now and then
    assert lengths[3] == pytest.approx(5 * exact, rel=0.01)  # past MEASURED: extrapolated at its own rate
    assert lengths[0] == len(tok("short row one", add_special_tokens=False)["input_ids"])
    assert len(spy.calls) < 4 + 2 * len(words) * 5 // data.PIECE  # the two short rows went in one call


def test_a_global_batch_above_the_dataset_is_capped_to_one_step_per_epoch_with_a_warning() -> None:
    from gpubox.tools.finetune.planner import layout
    from gpubox.tools.finetune.schemas import FinetuneRequest

    warnings: list[str] = []
    req = FinetuneRequest(dataset="d", per_device_train_batch_size=4, target_global_batch=1_000_000)
    micro, accum, _gc, steps, _why = layout(req, "cpu", 8, 800, None, warnings)
    assert (micro, accum, steps) == (4, 2, 1)  # 8 rows: two micro-batches, one optimizer step
    assert "target_global_batch 1000000 is above the 8 training samples" in warnings[0], warnings
    asked: list[str] = []
    req = FinetuneRequest(dataset="d", per_device_train_batch_size=4, gradient_accumulation_steps=50)
    assert layout(req, "cpu", 8, 800, None, asked)[1] == 50  # asked explicitly: kept, and said
    assert "above the 2 micro-batches of an epoch" in asked[0], asked
    fine: list[str] = []
    layout(
        FinetuneRequest(dataset="d", per_device_train_batch_size=4, target_global_batch=8), "cpu", 8, 800, None, fine
    )
    assert fine == []


@pytest.mark.parametrize("cancelled", [True, False])
def test_a_worker_gone_after_a_cancel_request_is_cancelled_not_failed(tmp_path: Path, cancelled: bool) -> None:
    import subprocess
    import sys

    from gpubox.tools.finetune.jobs import CANCEL_MARK, JobStore

    store = JobStore(tmp_path / "ft")
    store.create("j1", "adapter", "base", "lora", state="running")
    store.job_dir("j1").mkdir(parents=True, exist_ok=True)
    worker = subprocess.Popen([sys.executable, "-c", "pass"])  # a worker SIGTERM ended while it was importing
    store.set_process("j1", worker.pid)
    worker.wait()
    if cancelled:
        (store.job_dir("j1") / CANCEL_MARK).touch()
    row = store.reconcile("j1")
    assert row is not None
    assert row["state"] == ("cancelled" if cancelled else "failed"), row
    assert ("cancelled before training started" in row["error"]) is cancelled
    if cancelled:  # a worker that had trained and was stopped while saving is not said to have trained nothing
        store.update("j1", state="running", error=None, pid=worker.pid)
        (store.job_dir("j1") / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
        again = store.reconcile("j1")
        assert again is not None and again["state"] == "cancelled" and "earlier ones are kept" in again["error"]


@pytest.mark.anyio
async def test_a_plan_over_a_very_long_row_stays_small_and_warns_about_the_worker(
    tmp_path: Path, hf_base: Path
) -> None:
    from mcp import Client

    from gpubox.app import build_server, state_of
    from tests.conftest import call_ok
    from tests.finetune.conftest import make_settings

    root = tmp_path / "root"
    root.mkdir()
    words = " ".join(f"w{i % 977} {i}" for i in range(600_000))  # ~1.2M tokens, 5 MB in one row
    (root / "long.jsonl").write_text(json.dumps({"text": words}) + "\n" + json.dumps({"text": "short"}) + "\n")
    mcp = build_server(make_settings(root, hf_base))
    try:
        async with Client(mcp) as client:
            plan = await call_ok(client, "finetune_plan", dataset=str(root / "long.jsonl"), max_length=256)
    finally:
        state_of(mcp).close()
    assert plan["dataset"]["token_length_percentiles"]["max"] > 1_000_000
    assert any("tokenizes each row whole" in w for w in plan["warnings"]), plan["warnings"]
