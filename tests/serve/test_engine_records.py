"""The engine manager's bookkeeping without an engine: starts that race for one name or port, a stop while the HF
copy is still being built (here or from another server), the build's memory and lock, records a stop has ended, a
launcher that died before its spawn, and servers that answer slowly, hugely, gzipped or not as URLs. The real
engine's lifecycle is tests/serve/test_engine.py; here a `prepare` that waits on its cancel stands in for the build
so that nothing is ever spawned."""

from __future__ import annotations

import contextlib
import gzip
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.errors import BusyError, InvalidInputError, NotFoundError
from gpubox.settings import Settings
from gpubox.tools.box.capacity import start_time
from gpubox.tools.box.ledger import Ledger
from gpubox.tools.serve import client, engines, service
from gpubox.tools.serve.engines import EngineManager, Preparing, building, owner
from gpubox.tools.serve.schemas import EngineRecord, ServePlan
from tests.conftest import call_err

METRICS = b'# HELP x\nvllm:num_requests_running{model_name="m"} 2.0\nvllm:generation_tokens_total 41.0\n'
PLAN = ServePlan(
    device="cpu", dtype="auto", max_model_len=256, memory_gb={"host": 0.05}, command=[], env={}, reasons=[]
)


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[EngineManager]:
    m = EngineManager(Settings.load(state_dir=tmp_path / "state"), Ledger(Settings.load(state_dir=tmp_path / "state")))
    yield m
    for rec in m.records():
        if rec.state in ("preparing", "starting"):
            m.stop(rec.id)
    m.close()


def waiting(started: threading.Event) -> Callable[[Preparing], None]:
    """A build that lasts until it is cancelled (a stop), saying when it began."""

    def prepare(prep: Preparing) -> None:
        started.set()
        if not prep.cancel.wait(60):
            raise RuntimeError("never cancelled")
        raise RuntimeError(f"building the HF copy: {prep.why}")

    return prepare


def start(m: EngineManager, name: str, prepare: Any, port: int | None = None, prepare_gb: float = 0.0) -> EngineRecord:
    return m.start(name, Path("/nonexistent"), prepare, PLAN, [], sys.executable, port, prepare_gb=prepare_gb)


def test_two_starts_of_one_name_at_once_give_one_engine_and_one_reservation(manager: EngineManager) -> None:
    results: list[object] = []
    gate = threading.Barrier(2)

    def go() -> None:
        gate.wait()
        try:
            results.append(start(manager, "same", waiting(threading.Event())))
        except BusyError as exc:
            results.append(exc)

    threads = [threading.Thread(target=go) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(type(r).__name__ for r in results) == ["BusyError", "EngineRecord"]
    engines = [h.owner for h in manager.ledger.state().holdings if h.owner.startswith("engine ")]
    assert len(engines) == 1


def test_a_port_given_to_an_engine_still_preparing_is_refused_to_the_next(manager: EngineManager) -> None:
    port = start(manager, "first", waiting(threading.Event())).port
    assert port is not None
    with pytest.raises(InvalidInputError, match=f"port {port} .* is taken"):
        start(manager, "second", waiting(threading.Event()), port=port)
    assert start(manager, "third", waiting(threading.Event())).port != port  # a chosen port skips it too


def test_a_stop_while_preparing_cancels_the_build_frees_its_memory_and_stays_stopped(manager: EngineManager) -> None:
    began = threading.Event()
    rec = start(manager, "prep", waiting(began), prepare_gb=0.3)
    assert began.wait(30)
    held = manager.ledger.holding(building(rec.id))
    assert held is not None and held.devices == {"host": 0.25}  # what the build takes beyond the engine's 0.05
    assert manager.stop(rec.id).state == "stopped"
    launcher = manager._launchers.get(rec.id)
    if launcher is not None:
        launcher.join(30)
    assert manager.record(rec.id).state == "stopped"  # the cancelled build did not turn it into "failed"
    assert manager.ledger.holding(owner(rec.id)) is None
    assert manager.ledger.holding(building(rec.id)) is None


def test_a_stopped_record_is_never_moved_to_ready_or_failed(manager: EngineManager) -> None:
    rec = start(manager, "moved", waiting(threading.Event()))
    manager.stop(rec.id)
    assert manager.store.move(rec.id, ("starting",), state="ready") is None
    assert manager.store.move(rec.id, ("preparing", "starting"), state="failed") is None
    assert manager.record(rec.id).state == "stopped"


@pytest.mark.slow  # starts a process
def test_a_record_whose_launcher_died_before_the_spawn_is_failed_at_the_next_start(tmp_path: Path) -> None:
    settings = Settings.load(state_dir=tmp_path / "state")
    first = EngineManager(settings, Ledger(settings))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    build = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        for state in ("preparing", "starting"):
            rec = EngineRecord(
                id=f"dead{state}", engine="vllm", model=state, source="x", base_url="http://127.0.0.1:9/v1",
                started=time.time(), state=state, launcher_pid=gone.pid,
                build_pid=build.pid if state == "preparing" else None, build_started=start_time(build.pid),
            )  # fmt: skip
            first.store.write(rec)
        again = EngineManager(settings, Ledger(settings))
        for state in ("preparing", "starting"):
            rec = again.record(f"dead{state}")
            assert rec.state == "failed" and rec.error is not None and "restarted" in rec.error
        assert build.wait(30) == -9  # the HF-copy build the dead server left running was ended
    finally:
        build.kill()
        build.wait()


@pytest.mark.slow  # starts processes
def test_the_hf_copy_build_is_ended_with_its_process_group_and_its_lock_on_cancel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # stands in for ensure_hf_base: a lock file removed in `finally`, and a helper process of its own
    build = (
        "import os, subprocess, sys, time\n"
        "lock = sys.argv[3] + '.lock'\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)  # build_helper'])\n"
        # the lock is made inside `try`: the test cancels once it sees both, and SIGTERM must then find `finally`
        "try:\n    open(lock, 'w').close()\n    time.sleep(120)\nfinally:\n    os.unlink(lock)\n"
    )
    monkeypatch.setattr(service, "PREPARE", build)
    prep = Preparing(threading.Event(), lambda _pid: None)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            service.build_hf_copy(["gguf", "x", str(tmp_path / "hf")], prep)
        except RuntimeError as exc:
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    assert wait_for(lambda: helpers("build_helper") and (tmp_path / "hf.lock").exists())
    prep.cancel.set()
    worker.join(30)
    assert not worker.is_alive() and "stopped" in str(errors[0])
    assert not (tmp_path / "hf.lock").exists()  # SIGTERM let its `finally` run
    assert wait_for(lambda: not helpers("build_helper"))  # the helper the build started went with it


def test_a_stop_from_another_gpubox_server_cancels_the_build_here(
    manager: EngineManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engines, "STOP_POLL_S", 0.05)
    began = threading.Event()
    rec = start(manager, "elsewhere", waiting(began), prepare_gb=1.0)
    assert began.wait(30)
    other = EngineManager(manager.settings, Ledger(manager.settings))  # a second server on the same state dir
    assert other.stop(rec.id).state == "stopped"
    launcher = manager._launchers.get(rec.id)
    assert launcher is None or (launcher.join(30), not launcher.is_alive())[1]
    assert manager.ledger.holding(building(rec.id)) is None and manager.ledger.holding(owner(rec.id)) is None
    assert manager.record(rec.id).state == "stopped"


def helpers(tag: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if tag in " ".join(p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found


def wait_for(cond: Callable[[], object], timeout: float = 30.0) -> bool:
    ready = threading.Event()
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        ready.wait(0.05)
    return True


@pytest.fixture
def slow_server() -> Iterator[tuple[str, threading.Event]]:
    """An HTTP server that announces 1,000 bytes and sends one every 0.1 s (each read within any per-read
    timeout), or, with `big` set, a 64 KB body at once; /metrics is a small gzipped Prometheus text."""
    listener = socket.create_server(("127.0.0.1", 0))
    big, done = threading.Event(), threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    def answer(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # the client hangs up on it
            asked = conn.recv(65536)
            if b"/metrics" in asked:  # gzipped, as prometheus_client serves it to a client that accepts gzip
                body = gzip.compress(METRICS)
                head = f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(body)}\r\n\r\n"
                conn.sendall(head.encode() + body)
                return
            size = 65536 if big.is_set() else 1000
            conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
            if big.is_set():
                conn.sendall(b"x" * size)
                return
            for _ in range(size):
                if done.wait(0.1):
                    return
                conn.sendall(b"x")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1", big
    done.set()
    thread.join(5)
    listener.close()


def test_a_server_that_trickles_its_answer_is_given_up_at_the_deadline(slow_server: tuple[str, Any]) -> None:
    url, _ = slow_server
    answers: list[object] = []
    probe = threading.Thread(target=lambda: answers.append(client.healthy(url, None, timeout=1.0)))
    probe.start()
    probe.join(20)  # 1,000 bytes at 0.1 s would take 100 s
    assert answers == [False]
    with pytest.raises(NotFoundError, match=r"no OpenAI-compatible server answers .* within 1 s"):
        client.models(url, None, timeout=1.0)


def test_a_gzipped_answer_is_read_once_decoded(slow_server: tuple[str, Any]) -> None:
    url, _ = slow_server
    m = client.metrics(url, None, timeout=10.0)
    assert m is not None and m.requests_running == 2.0 and m.generation_tokens_total == 41.0


@pytest.mark.anyio
async def test_a_get_called_on_an_event_loop_thread_still_answers(slow_server: tuple[str, Any]) -> None:
    url, _ = slow_server
    m = client.metrics(url, None, timeout=10.0)  # blocking, on purpose: a caller that forgot to_thread
    assert m is not None and m.requests_running == 2.0


def test_an_answer_over_the_size_cap_is_refused(slow_server: tuple[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    url, big = slow_server
    big.set()
    monkeypatch.setattr(client, "MAX_BODY", 4096)
    with pytest.raises(NotFoundError, match="answered more than"):
        client.models(url, None, timeout=10.0)
    assert client.healthy(url, None, timeout=10.0) is False


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({"base_url": "http://[::1/v1"}, "is not a valid URL"),
        ({"base_url": "http://127.0.0.1:9/v1", "api_key": "clé"}, "cannot send a request to"),
    ],
)
async def test_attach_to_a_malformed_url_or_with_a_key_no_header_carries_is_a_clear_error(
    tmp_path: Path, args: dict[str, str], says: str
) -> None:
    mcp = build_server(Settings.load(state_dir=tmp_path / "state"))
    try:
        async with Client(mcp) as c:
            text = await call_err(c, "serve_attach", **args)
            assert says in text
            assert (await c.call_tool("serve_list", {})).structured_content == {"engines": []}
    finally:
        state_of(mcp).close()


@pytest.mark.slow  # starts a process
def test_a_start_waits_for_another_servers_hold_on_the_records(manager: EngineManager) -> None:
    holder = subprocess.Popen(
        [
            sys.executable, "-c",
            "import sys; from pathlib import Path; from gpubox.filelock import exclusive\n"
            f"with exclusive(Path({str(manager.root / '.lock')!r})):\n"
            "    print('held', flush=True); sys.stdin.readline()",
        ],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    done = threading.Event()
    starter = threading.Thread(target=lambda: (start(manager, "locked", waiting(threading.Event())), done.set()))
    starter.start()
    assert not done.wait(0.5)  # the other server is checking or writing a record: this start waits for it
    holder.communicate("\n")
    assert done.wait(30)
    starter.join(30)


def test_records_of_engines_that_ended_over_a_week_ago_are_removed_at_start(tmp_path: Path) -> None:
    settings = Settings.load(state_dir=tmp_path / "state")
    first = EngineManager(settings, Ledger(settings))
    for name, age_days in (("old", 8), ("recent", 1)):
        log = first.root / f"{name}.log"
        log.write_text("vLLM said things\n")
        first.store.write(
            EngineRecord(
                id=name,
                engine="vllm",
                model=name,
                source="x",
                base_url="http://127.0.0.1:9/v1",
                started=time.time() - age_days * 86400,
                state="stopped",
                log_path=str(log),
            )
        )
    again = EngineManager(settings, Ledger(settings))
    assert [r.id for r in again.records()] == ["recent"]
    assert not (again.root / "old.log").exists() and (again.root / "recent.log").exists()
