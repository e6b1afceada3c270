"""The stored runs folder: damaged records and planted symbolic links must not break or leak through the bench tools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from gpubox import services
from gpubox.app import state_of
from gpubox.tools.bench.schemas import AttentionBench, AttentionRow
from gpubox.tools.bench.service import BenchService
from tests.bench.conftest import PNG
from tests.conftest import call_err, call_ok, call_result

pytestmark = pytest.mark.anyio
GOOD = "20300101-000000-attention-00000a"


def bench_service(server: Any) -> BenchService:
    return services.bench(state_of(server))


def seed(svc: BenchService, run_id: str, /, **result: Any) -> dict[str, Any]:
    """A stored attention run of one measured row, as a finished bench_attention stores it."""
    row = AttentionRow(
        backend="sdpa_math", head_dim=16, seq_len=64, time_ms=1.0, time_ms_min=0.9, time_ms_max=1.1,
        spread_pct=5.0, tflops=0.01, speedup=1.0, max_abs_error=0.0, within_tolerance=True, winner=True,
    )  # fmt: skip
    bench = AttentionBench(
        run_id=run_id, status="complete", device="cpu", device_name="test cpu", dtype="float32", batch=1, heads=2,
        causal=False, backward=False, warmup=1, iterations=2, baseline="sdpa_math", tolerance=2e-4, timing="t",
        rows=[row], skipped=[], winners=[], versions={"torch": "0"}, plots=[], table_json="", table_csv="",
        elapsed_s=1.0, notes=[],
    )  # fmt: skip
    record = {"kind": "attention", "created_at": "2030-01-01T00:00:00+00:00", "result": bench.model_dump() | result}
    svc.runs.save(run_id, record, [row.model_dump()])
    return record


def plant(svc: BenchService, run_id: str, raw: bytes) -> None:
    d = svc.runs.root / run_id
    d.mkdir(parents=True)
    (d / "run.json").write_bytes(raw)


async def test_damaged_records_are_left_out_of_the_list_and_the_others_still_listed(
    bench_client: Client, server: Any
) -> None:
    svc = bench_service(server)
    seed(svc, GOOD)
    # a readable record whose own run_id names a path: listed under its folder's id
    seed(svc, "20300101-000001-attention-00000b", run_id="../../etc")
    damaged = [b"{}", b"[]", b"\xff", b'{"kind": "device", "result": {}}', b'{"kind": "attention", "result": []}']
    for i, raw in enumerate(damaged):
        plant(svc, f"20300102-00000{i}-attention-00000{i}", raw)
    listed = await call_ok(bench_client, "bench_list")
    assert [r["run_id"] for r in listed["runs"]] == ["20300101-000001-attention-00000b", GOOD]
    resource = await bench_client.read_resource("bench://runs")
    runs = json.loads(resource.contents[0].text)["runs"]  # type: ignore[union-attr]
    assert [r["run_id"] for r in runs] == ["20300101-000001-attention-00000b", GOOD]


async def test_replotting_a_damaged_run_says_it_is_damaged_and_how_to_remove_it(
    bench_client: Client, server: Any
) -> None:
    svc = bench_service(server)
    seed(svc, GOOD)
    cases = {"20300102-000000-attention-000000": b"\xff", "20300102-000001-device-000001": b"[]"}
    cases["20300102-000002-attention-000002"] = b'{"kind": "attention", "result": {"rows": 3}}'
    for run_id, raw in cases.items():
        plant(svc, run_id, raw)
        text = await call_err(bench_client, "bench_plot", run_id=run_id)
        assert f"bench run '{run_id}' is damaged" in text and f"Remove its folder {svc.runs.root / run_id}" in text
    # the good run against the damaged one: the damaged one is named
    text = await call_err(bench_client, "bench_plot", run_id=GOOD, against="20300102-000002-attention-000002")
    assert "'20300102-000002-attention-000002' is damaged" in text


async def test_links_planted_in_the_runs_folder_are_neither_written_through_nor_read(
    bench_client: Client, server: Any, tmp_path: Path
) -> None:
    svc = bench_service(server)
    seed(svc, GOOD)
    run = svc.runs.root / GOOD
    outside = tmp_path / "outside.png"
    outside.write_bytes(b"not yours")
    (run / "tflops.png").symlink_to(outside)
    data = (await call_result(bench_client, "bench_plot", run_id=GOOD)).structured_content
    assert data is not None and data["plots"][0]["name"] == "tflops"
    assert outside.read_bytes() == b"not yours"  # the link was replaced, not written through
    assert not (run / "tflops.png").is_symlink() and (run / "tflops.png").read_bytes().startswith(PNG)

    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0")
    (run / "table.csv").unlink()
    (run / "table.csv").symlink_to(secret)
    with pytest.raises(MCPError, match=r"has no file 'table\.csv'"):
        await bench_client.read_resource(f"bench://runs/{GOOD}/table.csv")
    listed = await call_ok(bench_client, "bench_list")
    assert not any(f.endswith("/table.csv") for f in listed["runs"][0]["files"])

    # a whole run folder that is a link: not listed, and neither plotted nor read
    linked = "20300103-000000-attention-00000c"
    (svc.runs.root / linked).symlink_to(run)
    assert [r["run_id"] for r in (await call_ok(bench_client, "bench_list"))["runs"]] == [GOOD]
    assert "symbolic link" in await call_err(bench_client, "bench_plot", run_id=linked)
    with pytest.raises(MCPError):
        await bench_client.read_resource(f"bench://runs/{linked}/table.json")
