"""Measured footprints: work that took more than its estimate reserves what it took the next time (issue #20).

The store, the peak rules and the ledger's use of them run on the real ledger; a worker's memory is read from a
real child process that allocates more than its reservation."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubox.settings import Settings
from gpubox.tools.box.footprints import FootprintStore, Growth, Peaks, raised
from gpubox.tools.box.ledger import Ledger
from tests.box.test_ledger import ledger as fixed_ledger

KEY = "vllm|/models/x|--max-model-len 2048"


def test_the_store_keeps_figures_across_instances_and_survives_a_damaged_file(tmp_path: Path) -> None:
    path = tmp_path / "box" / "footprints.json"
    FootprintStore(path).record(KEY, {"host": 3.14159})
    assert FootprintStore(path).known(KEY) == {"host": 3.142}
    FootprintStore(path).forget(KEY)
    assert FootprintStore(path).known(KEY) is None
    path.write_text("{not json", encoding="utf-8")
    assert FootprintStore(path).known(KEY) is None  # the history is lost, nothing else
    FootprintStore(path).record(KEY, {"host": 1.0})  # and the file is usable again
    assert FootprintStore(path).known(KEY) == {"host": 1.0}


def test_one_device_over_its_own_estimate_counts_even_when_the_total_is_not() -> None:
    from gpubox.tools.box.footprints import above

    assert above({"cuda:0": 70.0, "host": 6.0}, {"cuda:0": 72.0, "host": 2.0})  # the host 3x over, the total not
    assert not above({"cuda:0": 72.0, "host": 2.1}, {"cuda:0": 72.0, "host": 2.0})
    assert not above({"cuda:1": 9.0}, {"host": 1.0})  # a device the work does not reserve is not its figure


def test_an_overrun_names_each_device_over_its_own_estimate_not_a_sum() -> None:
    from gpubox.tools.box.footprints import overrun

    # the H200 run of bench_attention: the GPU well within its share, the worker's host memory over it
    text = overrun({"cuda:0": 2.1, "host": 3.66}, {"cuda:0": 20.0, "host": 0.82})
    assert text == "host 3.66 GB, above its 0.82 GB estimate"


def test_raised_takes_the_larger_figure_per_device_and_only_for_devices_the_work_uses() -> None:
    assert raised({"host": 2.0, "cuda:0": 10.0}, {"host": 3.0, "cuda:0": 8.0, "cuda:1": 5.0}) == {
        "host": 3.0,
        "cuda:0": 10.0,
    }
    assert raised({"host": 2.0}, None) == {"host": 2.0}


def test_a_peak_above_the_estimate_is_remembered_at_once_and_forgotten_after_a_run_within_it(tmp_path: Path) -> None:
    store = FootprintStore(tmp_path / "f.json")
    peaks = Peaks(store)
    peaks.track("engine a", KEY, {"host": 2.0})
    peaks.seen("engine a", {"host": 2.1, "cuda:0": 9.0})  # within 10%; a device it does not reserve is ignored
    assert store.known(KEY) is None
    peaks.seen("engine a", {"host": 3.0})
    assert store.known(KEY) == {"host": 3.0}  # at once: a second start while this one runs reserves it
    peaks.seen("engine a", {"host": 2.5})  # lower readings never lower the peak
    assert peaks.peak("engine a") == {"host": 3.0} and peaks.peak("nobody") is None
    peaks.end("engine a")
    assert store.known(KEY) == {"host": 3.0}  # it ended above: kept
    peaks.track("engine b", KEY, {"host": 2.0})
    peaks.end("engine b")  # never measured: changes nothing
    assert store.known(KEY) == {"host": 3.0}
    peaks.track("engine c", KEY, {"host": 2.0})
    peaks.seen("engine c", {"host": 1.9})
    peaks.end("engine c")  # a run within its estimate: the old figure no longer holds
    assert store.known(KEY) is None
    peaks.seen("untracked", {"host": 99.0})  # work without a key is shown, never remembered
    assert store.known(KEY) is None


def test_a_keyed_reservation_takes_what_its_configuration_took_last_time(tmp_path: Path) -> None:
    led = fixed_ledger(tmp_path)
    assert led.expected(KEY, {"host": 2.0}) == {"host": 2.0}
    led.reserve("engine a", "engine", {"host": 2.0}, "serve_stop a", key=KEY)
    led.update("engine a", measured={"host": 4.0})  # a figure the family measured itself
    assert led.expected(KEY, {"host": 2.0}) == {"host": 4.0}
    h = led.reserve("engine b", "engine", {"host": 2.0}, "serve_stop b", key=KEY)
    assert h.devices == {"host": 4.0} and h.source == "measured earlier"
    assert led.reserve("other", "engine", {"host": 2.0}, "x", key="another config").devices == {"host": 2.0}
    led.release("engine a")
    cancel = threading.Event()
    queued = led.wait_reserve("engine c", "engine", {"host": 2.0}, "serve_stop c", cancel, key=KEY)
    assert queued.devices == {"host": 4.0}
    # the next server on this state dir remembers it too
    again = Ledger(led.settings, read=led.read)
    assert again.expected(KEY, {"host": 1.0}) == {"host": 4.0}


@pytest.fixture
def hog() -> Iterator[subprocess.Popen[str]]:
    """A real worker that holds ~300 MB of its own once it prints 'ready'."""
    code = (
        "import time; b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]); print('ready', flush=True); "
        "time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait()
    proc.stdout.close()


def test_a_worker_above_its_reservation_is_measured_and_its_next_run_reserves_that(
    tmp_path: Path, hog: subprocess.Popen[str]
) -> None:
    led = Ledger(Settings.load(state_dir=tmp_path / "state"))  # the real device reader
    led.reserve("engine w", "engine", {"host": 0.05}, "serve_stop w", pid=hog.pid, key=KEY)
    measured = led.observe("engine w")
    assert measured is not None and measured["host"] > 0.3
    assert led.expected(KEY, {"host": 0.05})["host"] == pytest.approx(measured["host"], abs=0.001)
    assert any("engine w uses" in w for w in led.state().warnings)  # and box_plan warns meanwhile
    assert led.observe("nobody") is None


def test_growth_is_the_peak_over_the_start_and_unknown_when_other_work_ran() -> None:
    readings = iter([{"host": 1.0}, {"host": 1.8}, {"host": 1.2}])
    g = Growth(lambda: next(readings, {"host": 1.2}), alone=lambda: True, every_s=3600)
    g._take()  # a sample, as the thread takes them
    assert g.stop() == pytest.approx({"host": 0.8})
    busy = Growth(lambda: {"host": 1.0}, alone=lambda: False)
    assert busy.stop() is None


def test_a_refusal_of_a_raised_reservation_says_it_was_measured_earlier(tmp_path: Path) -> None:
    from gpubox.errors import CapacityError

    led = fixed_ledger(tmp_path, memory_budget_gb=5.0)
    led.footprints.record(KEY, {"host": 9.0})  # a run once took more than the whole budget
    with pytest.raises(CapacityError, match="what this configuration took when it last ran"):
        led.reserve("engine z", "engine", {"host": 1.0}, "serve_stop z", key=KEY)
    h = led.reserve("engine y", "engine", {"host": 1.0}, "serve_stop y", key="fresh")
    assert h.source == "estimator"  # nothing remembered for this key: the estimate, labelled as such


def _record_many(path: str, prefix: str, n: int) -> None:
    store = FootprintStore(Path(path))
    for i in range(n):
        store.record(f"{prefix}{i}", {"host": float(i)})


def test_two_servers_recording_at_once_keep_every_figure(tmp_path: Path) -> None:
    """Two processes (two gpubox servers on one state dir) rewriting the file at once: none loses the other's."""
    import multiprocessing

    path = tmp_path / "footprints.json"
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter each, as a second server would be
    procs = [ctx.Process(target=_record_many, args=(str(path), p, 150)) for p in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    store = FootprintStore(path)
    assert all(store.known(f"{p}{i}") == {"host": float(i)} for p in "ab" for i in range(150))
