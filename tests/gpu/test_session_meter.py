"""Session meter and idle guard on a box without a GPU: cost accrues with uptime, the guard fires only when idle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import Client
from pydantic import ValidationError

from gpubox.app import build_server
from gpubox.settings import Settings
from gpubox.tools.gpu.idle import IdleGuard
from gpubox.tools.gpu.session import SessionMeter
from tests.conftest import call_ok, wait_until


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _settings(tmp_path: Path, **kw: object) -> Settings:
    return Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path], **kw)


def test_cost_accrues_with_uptime_at_the_configured_price_and_the_budget_runs_out_on_time(tmp_path: Path) -> None:
    clock = Clock()
    meter = SessionMeter(_settings(tmp_path, hourly_usd=1.10, budget_usd=26.40), clock=clock, sample=False)
    clock.t += 2 * 3600
    report = meter.report()
    assert report.usd_per_hour == 1.10
    assert report.cost_usd == pytest.approx(2.20)
    assert report.budget_left_usd == pytest.approx(24.20)
    # 26.40 at 1.10/h lasts 24 h from start: 22 h after "now"
    assert report.budget_runs_out_at is not None
    assert report.budget_runs_out_at.startswith("2027-01-16T")  # start is 2027-01-15T08:00Z
    assert report.gpu_busy_share is None and report.gpu_utilisation != "measured"


def test_without_a_price_the_cost_is_unknown_and_says_how_to_set_one(tmp_path: Path) -> None:
    report = SessionMeter(_settings(tmp_path), clock=Clock(), sample=False).report()
    assert report.cost_usd is None and report.usd_per_hour is None
    assert "hourly_usd" in report.price_source


def test_a_provider_price_comes_from_the_catalog_with_its_date(tmp_path: Path) -> None:
    meter = SessionMeter(
        _settings(tmp_path, price_provider="lambda", price_gpu="H100-SXM"), clock=Clock(), sample=False
    )
    report = meter.report()
    assert report.usd_per_hour is not None and report.usd_per_hour > 0
    assert report.price_source.startswith("Lambda")
    assert report.price_observed is not None


def test_samples_split_gpu_busy_time_between_the_work_running(tmp_path: Path) -> None:
    clock = Clock()
    meter = SessionMeter(_settings(tmp_path, hourly_usd=2.0), clock=clock, sample=False)
    meter.begin("inference")
    clock.t += 60
    meter.record_sample(90)  # busy minute, inference alone
    with meter.activity("indexing"):
        clock.t += 60
        meter.record_sample(50)  # busy minute, shared
    meter.end("inference")
    clock.t += 120
    meter.record_sample(0)  # two idle minutes
    report = meter.report()
    uses = {u.kind: u for u in report.uses}
    assert report.gpu_busy_share == pytest.approx(0.5)
    assert report.gpu_idle_minutes == pytest.approx(2.0)
    assert uses["inference"].gpu_busy_minutes == pytest.approx(1.5)
    assert uses["indexing"].gpu_busy_minutes == pytest.approx(0.5)
    assert uses["inference"].wall_minutes == pytest.approx(2.0)
    assert not uses["inference"].active


def _guard(tmp_path: Path, clock: Clock, ran: list[list[str]], **kw: object) -> tuple[SessionMeter, IdleGuard]:
    settings = _settings(tmp_path, idle_shutdown_minutes=10, idle_grace_seconds=60, **kw)
    meter = SessionMeter(settings, clock=clock, sample=False)

    def run(argv: list[str]) -> str:
        ran.append(argv)
        return "exit 0"

    return meter, IdleGuard(meter, settings, run=run)


def test_idle_guard_warns_then_runs_its_command_once_after_the_grace_period(tmp_path: Path) -> None:
    clock, ran = Clock(), []
    marker = tmp_path / "stopped"
    _meter, guard = _guard(tmp_path, clock, ran, idle_command=f"touch {marker}")
    clock.t += 9 * 60
    assert guard.check().state == "watching"
    clock.t += 61
    assert guard.check().state == "warned"
    clock.t += 30
    assert guard.check().state == "warned"
    clock.t += 31
    assert guard.check().state == "fired"
    clock.t += 3600
    guard.check()
    assert ran == [["touch", str(marker)]]


def test_idle_guard_runs_a_real_command(tmp_path: Path) -> None:
    clock = Clock()
    marker = tmp_path / "stopped"
    settings = _settings(tmp_path, idle_shutdown_minutes=1, idle_grace_seconds=0, idle_command=f"touch {marker}")
    guard = IdleGuard(SessionMeter(settings, clock=clock, sample=False), settings)
    clock.t += 61
    guard.check()
    decision = guard.check()
    assert decision.state == "fired" and "exit 0" in decision.reason
    assert marker.exists()


def test_idle_guard_never_fires_while_work_runs_and_a_request_cancels_the_countdown(tmp_path: Path) -> None:
    clock, ran = Clock(), []
    meter, guard = _guard(tmp_path, clock, ran, idle_command="true")
    job_running = True
    meter.add_probe("finetune", lambda: job_running)
    clock.t += 3600
    assert guard.check().state == "watching"
    job_running = False
    assert guard.check().state == "warned"
    meter.touch()
    assert guard.check().state == "watching"
    with meter.activity("indexing"):
        clock.t += 3600
        assert guard.check().state == "watching"
    assert ran == []


def test_idle_guard_dry_run_reports_and_executes_nothing(tmp_path: Path) -> None:
    clock, ran = Clock(), []
    _, guard = _guard(tmp_path, clock, ran, idle_dry_run=True, idle_command="shutdown -h now")
    clock.t += 601
    guard.check()
    clock.t += 61
    decision = guard.check()
    assert decision.state == "dry_run_fired" and "shutdown" in decision.reason
    assert ran == []


@pytest.mark.parametrize(
    ("kw", "fragment"),
    [
        ({"hourly_usd": -1}, "greater than or equal"),
        ({"price_provider": "NoSuchCloud"}, "known providers"),
        ({"idle_shutdown_minutes": 5}, "idle_command"),
        ({"idle_command": "'unterminated"}, "quotes"),
    ],
)
def test_bad_session_settings_are_refused_with_the_fix(tmp_path: Path, kw: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        _settings(tmp_path, **kw)


@pytest.mark.anyio
async def test_gpu_status_and_box_session_carry_the_meter(tmp_path: Path) -> None:
    mcp = build_server(_settings(tmp_path, hourly_usd=3.0, budget_usd=10.0))
    try:
        async with Client(mcp) as client:
            session = (await call_ok(client, "gpu_status"))["session"]
            assert session["usd_per_hour"] == 3.0 and session["budget_usd"] == 10.0
            assert session["cost_usd"] >= 0
            contents = await client.read_resource("box://session")
            data = json.loads(contents.contents[0].text)  # type: ignore[union-attr]
            assert data["price_source"] == "setting hourly_usd"
            # the request just made counts as use of the box
            assert data["minutes_since_last_request"] < 1
            prompt = await client.get_prompt("session_report", {})
            assert "box://session" in str(prompt.messages[0].content)
    finally:
        mcp.state.close()


def test_ticks_credit_minutes_to_the_work_a_family_reports(tmp_path: Path) -> None:
    clock = Clock()
    meter = SessionMeter(_settings(tmp_path), clock=clock, sample=False)
    running = {"finetune": True}
    meter.add_probe("finetune", lambda: running["finetune"])
    clock.t += 120
    meter.tick()
    running["finetune"] = False
    clock.t += 600
    meter.tick()
    uses = {u.kind: u for u in meter.report().uses}
    assert uses["finetune"].wall_minutes == pytest.approx(2.0)
    assert not uses["finetune"].active


@pytest.mark.requires_search
@pytest.mark.requires_models
@pytest.mark.anyio
async def test_a_real_indexing_run_shows_up_in_the_session_meter(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    for i in range(40):
        (repo / f"m{i}.py").write_text(f"def handler_{i}(x):\n    return x * {i}\n")
    mcp = build_server(_settings(tmp_path, session_sample_seconds=0.5, search_index_wait_seconds=0))
    meter = mcp.state.service("session", SessionMeter)
    try:
        async with Client(mcp) as client:
            await call_ok(client, "search_index", path=str(repo), name="repo")
            svc = mcp.state.peek("search")
            assert svc is not None
            for progress in list(svc._jobs.values()):
                await anyio_wait(progress.done)
        meter.tick()
        indexing = next(u for u in meter.report().uses if u.kind == "indexing")
        # the ticker (every 0.5 s) saw the run, which loads a model and embeds for seconds
        assert indexing.wall_minutes > 0
        assert not indexing.active
    finally:
        mcp.state.close()


async def anyio_wait(event: object) -> None:
    import anyio

    await anyio.to_thread.run_sync(event.wait, 300)  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_the_idle_warning_reaches_a_connected_client_as_an_mcp_log_message(tmp_path: Path) -> None:

    received: list[object] = []

    async def on_log(params: object) -> None:
        received.append(params)

    settings = _settings(tmp_path, idle_shutdown_minutes=5, idle_dry_run=True, idle_grace_seconds=60)
    mcp = build_server(settings)
    try:
        # unsolicited notifications ride handshake-era sessions; 2026-07-28 sessions only get them inside requests
        async with Client(mcp, mode="legacy", logging_callback=on_log) as client:
            await call_ok(client, "gpu_status")  # the middleware records this session
            meter = mcp.state.service("session", SessionMeter)
            guard = mcp.state.peek("idle_guard")
            assert isinstance(guard, IdleGuard)
            meter.last_request -= 3600
            assert guard.check().state == "warned"
            await wait_until(lambda: received, timeout=10)
        text = str(getattr(received[0], "data", ""))
        assert "no request for" in text and "dry run" in text
    finally:
        mcp.state.close()


@pytest.mark.anyio
async def test_a_budget_lasting_past_the_year_9999_gives_no_end_date_and_gpu_status_still_answers(
    tmp_path: Path,
) -> None:
    # both within the settings' bounds: a million dollars at a cent an hour lasts 11,000 years
    mcp = build_server(_settings(tmp_path, hourly_usd=0.01, budget_usd=1_000_000))
    try:
        async with Client(mcp) as client:
            session = (await call_ok(client, "gpu_status"))["session"]
            assert session["budget_usd"] == 1_000_000 and session["budget_runs_out_at"] is None
            assert session["budget_left_usd"] == pytest.approx(1_000_000, abs=0.01)
    finally:
        mcp.state.close()
