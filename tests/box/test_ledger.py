"""The memory ledger's rules, on the real ledger with real processes and threads. Device readings are fixed numbers
here (a reader is the unit's only input from outside), so budgets, external use and the arithmetic are exact."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from gpubox.errors import CapacityError, InvalidInputError
from gpubox.settings import Settings
from gpubox.tools.box.capacity import Reading, start_time
from gpubox.tools.box.ledger import Ledger


def reader(total: float = 16.0, used: float = 2.0) -> object:
    def read(_pids: Iterable[int]) -> dict[str, Reading]:
        return {"host": Reading(total_gb=total, used_gb=used), "cuda:0": Reading(total_gb=80.0, used_gb=0.0)}

    return read


def ledger(tmp_path: Path, **settings: object) -> Ledger:
    return Ledger(Settings.load(state_dir=tmp_path / "state", **settings), read=reader())  # type: ignore[arg-type]


def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll a condition another thread makes true (the ledger's queue has no event to wait on from outside)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def test_work_that_does_not_fit_is_refused_naming_the_holders_and_what_frees_enough(tmp_path: Path) -> None:
    led = ledger(tmp_path, memory_budget_gb=4.0)
    led.reserve("model a", "inference", {"host": 1.5}, "infer_unload name='a'")
    led.reserve("model b", "inference", {"host": 2.0}, "infer_unload name='b'")
    with pytest.raises(CapacityError) as err:
        led.reserve("fine-tune job x", "finetune", {"host": 2.0}, "finetune_cancel job_id='x'")
    msg = str(err.value)
    assert "needs 2.00 GB, 0.50 GB free of a 4.00 GB budget" in msg
    assert "model a 1.50 GB" in msg and "model b 2.00 GB" in msg
    assert "infer_unload name='b' frees 2.00 GB" in msg  # the largest holder alone frees enough
    assert "infer_unload name='a'" not in msg
    assert led.holding("fine-tune job x") is None  # nothing half-reserved
    assert led.state().devices[0].reserved_gb == 3.5


def test_pinned_holders_are_never_offered_as_the_way_out(tmp_path: Path) -> None:
    led = ledger(tmp_path, memory_budget_gb=2.0)
    led.reserve("model a", "inference", {"host": 1.5}, "infer_unload name='a'", pinned=True)
    with pytest.raises(CapacityError, match="no unpinned work frees enough") as err:
        led.reserve("model b", "inference", {"host": 1.0}, "infer_unload name='b'")
    assert "model a 1.50 GB (pinned)" in str(err.value)


def test_a_reservation_spans_devices_atomically(tmp_path: Path) -> None:
    led = ledger(tmp_path, memory_budgets="host=1,cuda:0=10")
    with pytest.raises(CapacityError, match=r"host: needs 2\.00 GB"):
        led.reserve("engine", "engine", {"cuda:0": 5.0, "host": 2.0}, "serve_stop")
    assert all(d.reserved_gb == 0 for d in led.state().devices)
    with pytest.raises(InvalidInputError, match="no device 'cuda:3'"):
        led.check({"cuda:3": 1.0})


def test_external_memory_and_headroom_bound_what_is_free(tmp_path: Path) -> None:
    # 16 GB host, 2 GB used by other processes, 1 GB headroom: 13 GB free although the budget says 100
    led = Ledger(
        Settings.load(state_dir=tmp_path, memory_budget_gb=100.0, memory_headroom_gb=1.0),
        read=reader(total=16.0, used=2.0),  # type: ignore[arg-type]
    )
    host = led.state().devices[0]
    assert host.external_gb == 2.0 and host.free_gb == 13.0
    assert not led.check({"host": 13.5}).fits and led.check({"host": 12.5}).fits


def test_two_threads_racing_for_the_last_gigabytes_never_over_commit(tmp_path: Path) -> None:
    led = ledger(tmp_path, memory_budget_gb=1.0)
    start = threading.Barrier(8)
    won: list[str] = []
    refused: list[str] = []

    def race(i: int) -> None:
        start.wait()
        try:
            led.reserve(f"job {i}", "benchmark", {"host": 0.3}, "wait")
            won.append(str(i))
        except CapacityError:
            refused.append(str(i))

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 3 and len(refused) == 5
    assert led.state().devices[0].reserved_gb == pytest.approx(0.9)


def test_a_holding_ends_with_its_process(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    led = ledger(tmp_path, memory_budget_gb=2.0)
    led.reserve("fine-tune job w", "finetune", {"host": 1.5}, "finetune_cancel job_id='w'", pid=sleeper.pid)
    assert not led.check({"host": 1.0}).fits
    sleeper.kill()
    sleeper.wait()
    assert led.check({"host": 1.0}).fits  # the dead worker's memory is back
    assert led.holding("fine-tune job w") is None


def test_a_restart_keeps_what_live_workers_hold_and_drops_the_rest(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    first = ledger(tmp_path, memory_budget_gb=8.0)
    first.reserve("fine-tune job live", "finetune", {"host": 2.0}, "finetune_cancel job_id='live'", pid=sleeper.pid)
    first.reserve("model in-process", "inference", {"host": 1.0}, "infer_unload name='m'")  # this process
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    first.reserve("benchmark gone", "benchmark", {"host": 1.0}, "wait")
    first.update("benchmark gone", pid=dead.pid)  # its process has already ended

    second = ledger(tmp_path, memory_budget_gb=8.0)
    assert [h.owner for h in second.state().holdings] == ["fine-tune job live"]
    assert second.restored == ["fine-tune job live"]
    assert second.state().devices[0].reserved_gb == 2.0


def test_a_damaged_state_file_starts_an_empty_ledger(tmp_path: Path) -> None:
    path = tmp_path / "state" / "box" / "ledger.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json", encoding="utf-8")
    led = ledger(tmp_path, memory_budget_gb=1.0)
    assert led.state().holdings == []
    led.reserve("model a", "inference", {"host": 0.5}, "infer_unload name='a'")
    assert "model a" in path.read_text(encoding="utf-8")


def test_the_queue_serves_first_in_line_first_and_wakes_on_release(tmp_path: Path) -> None:
    led = ledger(tmp_path, memory_budget_gb=2.0)
    led.reserve("model a", "inference", {"host": 1.5}, "infer_unload name='a'")
    order: list[str] = []
    never = threading.Event()

    def wait(owner: str, gb: float) -> None:
        led.wait_reserve(owner, "finetune", {"host": gb}, "cancel", never)
        order.append(owner)

    big = threading.Thread(target=wait, args=("first", 1.5))
    big.start()
    until(lambda: led.position("first") == 1)
    small = threading.Thread(target=wait, args=("second", 0.4))
    small.start()
    until(lambda: led.position("second") == 2)
    assert order == []  # 0.5 GB free: the small one fits but does not overtake the first in line
    led.release("model a")
    big.join(timeout=10)
    assert order[:1] == ["first"]
    led.release("first")
    small.join(timeout=10)
    assert order == ["first", "second"]
    assert led.position("first") is None and led.position("second") is None


def test_the_queue_refuses_at_once_what_could_never_fit_and_honours_cancel(tmp_path: Path) -> None:
    led = ledger(tmp_path, memory_budget_gb=2.0)
    with pytest.raises(CapacityError, match=r"more than its whole 2\.00 GB budget; waiting cannot help"):
        led.wait_reserve("huge", "finetune", {"host": 3.0}, "cancel", threading.Event())
    led.reserve("model a", "inference", {"host": 1.5}, "infer_unload name='a'")
    cancel = threading.Event()
    errors: list[str] = []

    def wait() -> None:
        try:
            led.wait_reserve("job", "finetune", {"host": 1.0}, "cancel", cancel)
        except CapacityError as exc:
            errors.append(str(exc))

    t = threading.Thread(target=wait)
    t.start()
    until(lambda: led.position("job") is not None)
    cancel.set()
    t.join(timeout=10)
    assert errors and "left the memory queue" in errors[0]
    assert led.position("job") is None and led.holding("job") is None


def test_a_queued_job_has_its_place_in_line_when_enqueue_returns(tmp_path: Path) -> None:
    """finetune_launch(queue=true) reports queue_position from what enqueue left behind, before its waiter thread
    has run (CI once saw None there)."""
    from gpubox.tools.finetune.admission import JobQueue, owner

    led = ledger(tmp_path, memory_budget_gb=2.0)
    led.reserve("model a", "inference", {"host": 1.5}, "infer_unload name='a'")
    started = threading.Event()
    queue = JobQueue(led, start=lambda _job: started.set(), fail=lambda _job, why: None)
    queue.enqueue("j1", {"host": 1.0}, ready=lambda: True)
    assert queue.position("j1") == 1
    led.release("model a")
    assert started.wait(10)
    assert queue.position("j1") is None and led.holding(owner("j1")) is not None


@pytest.mark.parametrize(
    ("value", "expected"),
    [("host=8,cuda:0=70", {"host": 8.0, "cuda:0": 70.0}), ('{"cuda:1": 40}', {"cuda:1": 40.0})],
)
def test_per_device_budgets_parse_from_pairs_or_json(value: str, expected: dict[str, float]) -> None:
    assert Settings.load(memory_budgets=value).memory_budgets == expected


@pytest.mark.parametrize("value", ["gpu0=8", "host=-1", "host"])
def test_bad_per_device_budgets_are_refused_with_the_fix(value: str) -> None:
    with pytest.raises(Exception, match="memory_budgets"):
        Settings.load(memory_budgets=value)


def test_two_gpubox_servers_on_one_box_share_the_ledger(tmp_path: Path) -> None:
    """Each MCP client may start its own gpubox over stdio: their reservations must add up, not overlap."""
    child = subprocess.Popen(
        [
            sys.executable, "-c",
            "import sys; from gpubox.settings import Settings; from gpubox.tools.box.ledger import Ledger\n"
            f"led = Ledger(Settings.load(state_dir={str(tmp_path / 'state')!r}, memory_budget_gb=2.0))\n"
            "led.reserve('model big', 'inference', {'host': 1.5}, \"infer_unload name='big'\")\n"
            "print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        led = Ledger(Settings.load(state_dir=tmp_path / "state", memory_budget_gb=2.0))
        with pytest.raises(CapacityError, match=rf"model big \[gpubox {child.pid}\] 1\.50 GB"):
            led.reserve("model mine", "inference", {"host": 1.0}, "infer_unload name='mine'")
        assert [h.owner for h in led.state().holdings] == [f"model big [gpubox {child.pid}]"]
        led.reserve("model small", "inference", {"host": 0.4}, "infer_unload name='small'")
    finally:
        child.kill()
        child.communicate()  # reaps it and closes its pipes
    assert led.check({"host": 1.5}).fits  # the other server is gone, and its in-process holding with it
    assert [h.owner for h in led.state().holdings] == ["model small"]


def test_a_waiter_held_back_by_its_own_condition_does_not_hold_up_the_line(tmp_path: Path) -> None:
    led = ledger(tmp_path, memory_budget_gb=2.0)
    device_busy = threading.Event()  # the benchmark's own condition: nothing else generating
    got: list[str] = []
    never = threading.Event()

    def bench() -> None:
        led.wait_reserve("benchmark", "benchmark", {"host": 0.5}, "wait", never, ready=device_busy.is_set)
        got.append("benchmark")

    first = threading.Thread(target=bench)
    first.start()
    until(lambda: led.position("benchmark") == 1)
    job = threading.Thread(
        target=lambda: got.append(led.wait_reserve("job", "finetune", {"host": 1.0}, "cancel", never).owner)
    )
    job.start()
    job.join(timeout=10)
    assert got == ["job"]  # memory was free: the job started though the benchmark is ahead of it in line
    device_busy.set()
    first.join(timeout=10)
    assert got == ["job", "benchmark"]


def test_what_a_dead_servers_worker_holds_survives_another_servers_write(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """Server A reserves for a worker and exits; the worker trains on. Server B's next write (a release, before
    anything re-read the file) must keep that holding: dropping it would hand out memory the worker uses."""
    state = tmp_path / "state"
    a = subprocess.Popen(
        [
            sys.executable, "-c",
            "import sys; from gpubox.settings import Settings; from gpubox.tools.box.ledger import Ledger\n"
            f"led = Ledger(Settings.load(state_dir={str(state)!r}))\n"
            f"led.reserve('job w', 'finetune', {{'host': 3.0}}, 'finetune_cancel', pid={sleeper.pid})\n"
            "print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert a.stdout is not None and a.stdout.readline().strip() == "held"
    b = Ledger(Settings.load(state_dir=state), read=reader())  # type: ignore[arg-type]
    b.reserve("model m", "inference", {"host": 1.0}, "infer_unload name='m'")
    a.communicate("")  # server A exits; its worker does not
    b.release("model m")
    assert [(h.owner, h.devices) for h in b.state().holdings] == [("job w", {"host": 3.0})]  # adopted by B


def test_a_budget_above_the_device_is_capped_at_what_it_has(tmp_path: Path) -> None:
    led = ledger(tmp_path, memory_budget_gb=1000.0)  # host: 16 GB (reader), headroom 0.8 GB
    host = next(d for d in led.state().devices if d.device == "host")
    assert host.budget_gb == pytest.approx(15.2)
    with pytest.raises(CapacityError):  # refused at once as never fitting, not queued for good
        led.wait_reserve("job big", "finetune", {"host": 200.0}, "finetune_cancel", threading.Event())


def holding_row(owner: str, kind: str, gb: float, pid: int, server: dict[str, object]) -> dict[str, object]:
    """A holding as another server writes it to the ledger file."""
    return {
        "owner": owner, "kind": kind, "devices": {"host": gb}, "started": "2025-01-01T00:00:00+00:00",
        "pid": pid, "pid_started": start_time(pid), "frees_with": "x", **server,
    }  # fmt: skip


@pytest.mark.parametrize("late", [False, True], ids=["read at start", "written by another server later"])
@pytest.mark.parametrize(
    ("offset", "alive"),
    [(0.0, True), (None, True), (-1000.0, False)],
    ids=["its start time", "older file without a start time", "pid reused by another process"],
)
def test_a_server_is_known_by_its_pid_and_its_start_time(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], offset: float | None, alive: bool, late: bool
) -> None:
    """A gpubox server that died and whose pid an unrelated process got (here `sleeper`, under a start time that is
    not its own) must not hold memory for good: what it held in-process is given back, what its live worker holds
    is taken over. With the pid's own start time, or none (a file written before they were recorded), it is a live
    server's."""
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        server: dict[str, object] = {"server_pid": sleeper.pid}
        if offset is not None:
            server["server_started"] = (start_time(sleeper.pid) or 0.0) + offset
        rows = [
            holding_row("model big", "inference", 1.5, sleeper.pid, server),  # in that server's own process
            holding_row("job w", "finetune", 1.0, worker.pid, server),
        ]
        path = tmp_path / "state" / "box" / "ledger.json"
        path.parent.mkdir(parents=True)
        led = ledger(tmp_path, memory_budget_gb=4.0) if late else None
        path.write_text(json.dumps({"holdings": rows}), encoding="utf-8")
        led = led or ledger(tmp_path, memory_budget_gb=4.0)

        assert led.check({"host": 2.0}).fits is not alive  # 4 GB budget: 2.5 GB held while that server lives
        owners = [h.owner for h in led.state().holdings]
        if alive:
            assert owners == [f"model big [gpubox {sleeper.pid}]", f"job w [gpubox {sleeper.pid}]"]
        else:
            assert owners == ["job w"] and led.restored == ["job w"]  # its worker lives on: now this server's
        led.reserve("model mine", "inference", {"host": 0.5}, "infer_unload name='mine'")
        in_file = [h["owner"] for h in json.loads(path.read_text(encoding="utf-8"))["holdings"]]
        assert sorted(in_file) == sorted(["model big", "job w", "model mine"] if alive else ["job w", "model mine"])
    finally:
        worker.kill()
        worker.wait()


def test_reserve_or_queue_reserves_what_fits_and_puts_the_rest_in_line(tmp_path: Path) -> None:
    led = ledger(tmp_path, memory_budget_gb=2.0)
    first = led.reserve_or_queue("job a", "finetune", {"host": 1.5}, "finetune_cancel job_id='a'")
    assert first is not None and first.devices == {"host": 1.5} and led.position("job a") is None
    assert led.reserve_or_queue("job b", "finetune", {"host": 1.0}, "finetune_cancel job_id='b'") is None
    assert led.position("job b") == 1 and led.holding("job b") is None
    got: list[str] = []  # its waiter keeps that place, and gets the memory once it frees
    waiter = threading.Thread(
        target=lambda: got.append(led.wait_reserve("job b", "finetune", {"host": 1.0}, "x", threading.Event()).owner)
    )
    waiter.start()
    led.release("job a")
    waiter.join(timeout=10)
    assert got == ["job b"] and led.position("job b") is None
    with pytest.raises(InvalidInputError, match="already holds"):
        led.reserve_or_queue("job b", "finetune", {"host": 0.1}, "x")
