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
async def test_a_plan_over_a_very_long_row_stays_small(tmp_path: Path, hf_base: Path) -> None:
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


@pytest.mark.requires_hf
def test_a_row_cut_before_tokenizing_keeps_every_token_truncation_keeps(hf_base: Path, tmp_path: Path) -> None:
    """The training worker tokenized each row whole before trl cut it at max_length (a 50 MB row took 12 GB of
    RAM); it now cuts the text first, at twice max_length tokens of the longest token's text."""
    from transformers import AutoTokenizer

    from gpubox.tools.finetune.worker import _rows, row_chars

    tok = AutoTokenizer.from_pretrained(str(hf_base))
    max_length = 64
    cut = row_chars({"max_length": max_length}, tok)
    text = "".join(f"{i % 10}" * (i % 40) + " " for i in range(50_000))  # long number tokens, then spaces
    assert len(text) > 10 * cut
    row = data.cut_long({"text": text}, "text", cut)
    assert len(row["text"]) == cut

    def first(t: str) -> list[int]:
        return tok(t, add_special_tokens=False)["input_ids"][:max_length]

    assert first(row["text"]) == first(text)
    chat = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": text},
        {"role": "assistant", "content": "ok"},
    ]
    cut_chat = data.cut_long({"messages": chat}, "messages", cut)["messages"]
    assert [m["role"] for m in cut_chat] == ["system", "user"] and len(cut_chat[1]["content"]) == cut - 8

    def rendered(messages: list[dict[str, str]]) -> list[int]:
        return first(tok.apply_chat_template(messages, tokenize=False))

    assert rendered(cut_chat) == rendered(chat)
    pc = data.cut_long({"prompt": text, "completion": "done"}, "prompt_completion", cut)
    assert pc == {"prompt": text[:cut], "completion": ""}
    short = {"prompt": [{"role": "user", "content": "hi"}], "completion": [{"role": "assistant", "content": "yo"}]}
    assert data.cut_long(short, "prompt_completion", cut) == short
    (tmp_path / "train.jsonl").write_text(json.dumps({"text": text}) + "\n" + json.dumps({"text": "hi"}) + "\n")
    assert _rows(tmp_path, "train.jsonl", cut)["text"] == [text[:cut], "hi"]  # what the worker hands trl


@pytest.mark.anyio
async def test_odd_chat_rows_plan_with_one_warning_per_kind(tmp_path: Path, hf_base: Path) -> None:
    """Rows with an empty message, the assistant first or a system message mid-way planned without a word (SmolLM2's
    ChatML template renders any order, and trl trains on them as written)."""
    from mcp import Client

    from gpubox.app import build_server, state_of
    from tests.conftest import call_ok
    from tests.finetune.conftest import make_settings

    def chat(*turns: tuple[str, str]) -> str:
        return json.dumps({"messages": [{"role": r, "content": c} for r, c in turns]})

    good = chat(("user", "hi"), ("assistant", "hello"))
    rows = [
        good,
        chat(("user", "hi"), ("assistant", " ")),
        chat(("assistant", "hello"), ("user", "hi"), ("assistant", "yes")),
        good,
        chat(("user", "hi"), ("system", "be brief"), ("assistant", "ok")),
        chat(("user", ""), ("assistant", "ok")),
    ]
    root = tmp_path / "root"
    root.mkdir()
    (root / "chats.jsonl").write_text("\n".join(rows) + "\n")
    mcp = build_server(make_settings(root, hf_base))
    try:
        async with Client(mcp) as client:
            plan = await call_ok(client, "finetune_plan", dataset=str(root / "chats.jsonl"), max_length=128)
            clean = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
            (root / "clean.jsonl").write_text((json.dumps(clean) + "\n") * 4)
            plain = await call_ok(client, "finetune_plan", dataset=str(root / "clean.jsonl"), max_length=128)
    finally:
        state_of(mcp).close()
    warned = [w for w in plan["warnings"] if "trained on as written" in w]
    assert warned == [
        "2 of 6 rows have a message with empty content (row 2 first); trained on as written",
        "1 of 6 rows start with the assistant's message (row 3 first); trained on as written",
        "1 of 6 rows have a system message after the first message (row 5 first); trained on as written",
    ], plan["warnings"]
    assert not [w for w in plain["warnings"] if "trained on as written" in w], plain["warnings"]
