"""Damaged fine-tuning state: a job whose config.json, metrics.jsonl or row is damaged (by hand, another program, a
full disk) is shown as damaged with what to do, its bad metric lines are skipped, and the other jobs list as
before; no damaged row stops the service from starting. Rows and files are written by hand: nothing trains."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.errors import InvalidInputError
from gpubox.tools.finetune.adapter import finetuner
from gpubox.tools.finetune.service import Finetuner
from tests.conftest import call_ok
from tests.finetune.conftest import make_settings, run_with_client

DAMAGED = "this job's files are damaged"  # how a damaged job's error starts (status.DAMAGED)
CONFIG = {"total_steps": 10, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "plan_id": "p1"}


@pytest.fixture
def box(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A server with two finished jobs written by hand: 'good' and 'bad' (each test damages 'bad')."""
    settings = make_settings(tmp_path / "root")
    mcp = build_server(settings)
    ft = finetuner(state_of(mcp))
    for job in ("good", "bad"):
        ft.store.create(job, f"ad-{job}", "smollm2", "lora")
        write_config(ft, job, CONFIG)
        ft.store.finish(job, "failed", error="RuntimeError: out of memory")
    yield {"mcp": mcp, "ft": ft, "settings": settings}
    state_of(mcp).close()


def write_config(ft: Finetuner, job: str, config: Any) -> None:
    folder = ft.store.job_dir(job)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")


def listed(mcp: Any) -> dict[str, dict[str, Any]]:
    async def go(client: Client) -> dict[str, Any]:
        return await call_ok(client, "finetune_list")

    return {j["job_id"]: j for j in run_with_client(mcp, go)["jobs"]}


def status(mcp: Any, job: str) -> dict[str, Any]:
    async def go(client: Client) -> dict[str, Any]:
        return await call_ok(client, "finetune_status", job_id=job)

    return run_with_client(mcp, go)


def check_good_and_damaged(mcp: Any, said: str) -> dict[str, Any]:
    jobs = listed(mcp)
    assert jobs["good"]["total_steps"] == 10 and jobs["good"]["error"] == "RuntimeError: out of memory"
    bad = status(mcp, "bad")
    assert bad == {**jobs["bad"], "log_tail": bad["log_tail"]}
    assert bad["error"].startswith(DAMAGED) and said in bad["error"], bad["error"]
    assert "delete its folder" in bad["error"] and "delete its folder" in bad["next_step"]
    return bad


def config_missing(folder: Path) -> None:
    (folder / "config.json").unlink()


def config_truncated(folder: Path) -> None:
    (folder / "config.json").write_text(json.dumps(CONFIG)[:20], encoding="utf-8")


def config_a_list(folder: Path) -> None:
    (folder / "config.json").write_text("[1, 2]", encoding="utf-8")


def config_a_folder(folder: Path) -> None:
    (folder / "config.json").unlink()
    (folder / "config.json").mkdir()


def steps_not_a_number(folder: Path) -> None:
    (folder / "config.json").write_text(json.dumps({**CONFIG, "total_steps": "ten"}), encoding="utf-8")


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (config_missing, "config.json is missing"),
        (config_truncated, "cannot be read as JSON"),
        (config_a_list, "is not a JSON object"),
        (config_a_folder, "cannot be read as JSON"),
        (steps_not_a_number, "no whole number for total_steps"),
    ],
)
def test_a_damaged_config_shows_that_job_as_damaged_and_lists_the_others(
    box: dict[str, Any], damage: Callable[[Path], None], said: str
) -> None:
    damage(box["ft"].store.job_dir("bad"))
    bad = check_good_and_damaged(box["mcp"], said)
    assert bad["state"] == "failed" and "RuntimeError: out of memory" in bad["error"]  # the row's error is kept
    with pytest.raises(InvalidInputError, match=r"job bad cannot start again: .*finetune_plan"):
        box["ft"].resume("bad")


def test_bad_metric_lines_are_skipped(box: dict[str, Any]) -> None:
    lines = [
        {"event": "training started at step 0", "t": 100.0},
        {"step": 1, "loss": 2.0, "t": 101.0},
        [1, 2],
        {"loss": "x"},
        {"event": 5},
        {"probe": {"x": 1}},
        {"step": "2", "loss": 1.0},
        {"step": 2, "loss": 1.5, "t": 102.0},
        {"loss": 9.0},  # no step: not a point of the curve
    ]
    text = "\n".join(json.dumps(x) for x in lines) + "\n{not json\n"
    (box["ft"].store.job_dir("bad") / "metrics.jsonl").write_text(text, encoding="utf-8")
    st = status(box["mcp"], "bad")
    assert (st["step"], st["loss"], st["first_loss"], st["probe"]) == (2, 9.0, 2.0, None)
    assert st["events"] == ["training started at step 0"] and st["elapsed_s"] == 2.0
    assert box["ft"].curve("bad") == [(1, 2.0), (2, 1.5)]


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"result": "{not json"}, "its result '{not json' is not a JSON object"),
        ({"result": "[1]"}, "is not a JSON object"),
        ({"state": "exploded"}, "its state 'exploded' is none of"),
        ({"created": "yesterday"}, "its created time 'yesterday' is not a number"),
        ({"state": "queued", "created": "yesterday"}, "its created time 'yesterday'"),
    ],
)
def test_a_damaged_row_is_shown_as_damaged_also_after_a_restart(
    box: dict[str, Any], fields: dict[str, Any], said: str
) -> None:
    box["ft"].store.update("bad", **fields)
    check_good_and_damaged(box["mcp"], said)
    again = build_server(box["settings"])  # a restart: the service sorts its rows by `created` when it starts
    try:
        check_good_and_damaged(again, said)
    finally:
        state_of(again).close()


def test_a_start_left_unfinished_with_a_bad_created_time_is_failed_not_a_crash(box: dict[str, Any]) -> None:
    store = box["ft"].store
    store.update("bad", state="starting", pid=None, server_pid=None, starting_since=None, created="yesterday")
    row = store.reconcile("bad")
    assert row is not None and row["state"] == "failed" and "never started" in row["error"]
    assert listed(box["mcp"])["good"]["state"] == "failed"


def test_a_cancel_signals_no_process_it_cannot_tell_is_the_job(tmp_path: Path) -> None:
    """A job row whose pid now belongs to an unrelated process (no start time to tell): finetune_cancel sent that
    process's group SIGTERM."""
    import subprocess
    import sys

    from gpubox.settings import Settings

    other = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, start_new_session=True
    )
    mcp = build_server(Settings.load(state_dir=tmp_path / "s", allowed_roots=[tmp_path]))
    try:
        ft = finetuner(state_of(mcp))
        ft.store.create("feed0001", "someone-else", "smollm2-135m-instruct", "lora", state="running")
        ft.store.update("feed0001", pid=other.pid, pid_started=None)
        ft.store.job_dir("feed0001").mkdir(parents=True)
        ft.cancel("feed0001", wait_s=0.5)
        assert other.poll() is None  # still running: it was never ours
    finally:
        state_of(mcp).close()
        other.kill()
        other.communicate()
