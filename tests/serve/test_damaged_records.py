"""Engine records are state another process wrote: one naming a path as its id made serve_list delete files outside
the state dir, one whose pid now belongs to an unrelated process had serve_stop kill that process, and one with a
URL urlsplit refuses failed serve_list for every engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.settings import Settings
from tests.conftest import call_ok

pytestmark = pytest.mark.anyio


def _record(**fields: object) -> str:
    base = {"engine": "vllm", "model": "m", "source": "m", "base_url": "http://127.0.0.1:9/v1", "started": 0}
    return json.dumps({**base, **fields})


async def test_a_record_naming_a_path_deletes_nothing_outside_and_is_skipped(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    victim, victim_log = outside / "victim.json", outside / "victim_log.txt"
    victim.write_text("keep me")
    victim_log.write_text("keep me too")
    engines = tmp_path / "state" / "serve" / "engines"
    engines.mkdir(parents=True)
    (engines / "abc.json").write_text(_record(id=str(outside / "victim"), state="failed", log_path=str(victim_log)))
    (engines / "bad1.json").write_text(_record(id="bad1", state="attached", engine="openai", base_url="http://[::1"))
    mcp = build_server(Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path]))
    try:
        async with Client(mcp) as c:
            listed = await call_ok(c, "serve_list")  # the bad URL failed the whole list before
    finally:
        state_of(mcp).close()
    assert victim.read_text() == "keep me" and victim_log.read_text() == "keep me too"
    assert [e["id"] for e in listed["engines"]] == ["bad1"], listed


async def test_serve_stop_signals_no_process_it_cannot_tell_is_its_engine(tmp_path: Path) -> None:
    other = subprocess.Popen(  # a group leader, as an engine is: the signal goes to its group
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, start_new_session=True
    )
    try:
        engines = tmp_path / "state" / "serve" / "engines"
        engines.mkdir(parents=True)
        (engines / "e1.json").write_text(_record(id="e1", state="ready", pid=other.pid, pid_started=None))
        mcp = build_server(Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path]))
        try:
            async with Client(mcp) as c:
                stopped = await call_ok(c, "serve_stop", engine_id="e1")
        finally:
            state_of(mcp).close()
        assert stopped["state"] == "stopped" and other.poll() is None  # SIGTERM then SIGKILL before
    finally:
        other.kill()
        other.communicate()  # closes its stdin pipe too
