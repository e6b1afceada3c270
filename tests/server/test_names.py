"""Names and ids are matched whole (issue #25, item 7): `^...$` with re.match accepts a trailing newline, so
'abc\\n' became an index directory and a bench run id. Every check is a fullmatch now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import Client

from gpubox.errors import InvalidInputError
from gpubox.settings import Settings
from gpubox.tools.bench.runs import RunStore
from tests.conftest import call_err, requires_search

pytestmark = pytest.mark.anyio
RUN = "20200101-000000-device-abcdef"


@requires_search
@pytest.mark.parametrize("name", ["abc\n", "abc\r\n", "abc\n\n", "\nabc"])
async def test_search_index_refuses_a_name_with_a_newline(client: Client, settings: Settings, name: str) -> None:
    repo = settings.allowed_roots[0] / "sub"
    repo.mkdir(exist_ok=True)
    (repo / "a.py").write_text("def f():\n    return 1\n")
    for dry_run in (True, False):
        msg = await call_err(client, "search_index", path=str(repo), name=name, dry_run=dry_run)
        assert "index name" in msg, msg
    assert not (settings.state_dir / "search" / name).exists()


@pytest.mark.parametrize("run_id", [RUN + "\n", RUN + "\n\n", "\n" + RUN])
async def test_bench_run_ids_with_a_newline_are_refused(client: Client, run_id: str) -> None:
    msg = await call_err(client, "bench_plot", run_id=run_id)
    assert "is not a bench run id" in msg, msg


def test_a_run_directory_named_with_a_newline_is_not_listed(tmp_path: Path) -> None:
    for run_id in (RUN + "\n", RUN):
        (tmp_path / run_id).mkdir()
        (tmp_path / run_id / "run.json").write_text(json.dumps({"run_id": run_id, "kind": "device"}))
    assert [r["run_id"] for r in RunStore(tmp_path).list()] == [RUN]


@pytest.mark.parametrize("name", ["table.csv\n", "tflops.png\n", "table.json\n\n"])
def test_bench_file_names_with_a_newline_are_refused(tmp_path: Path, name: str) -> None:
    store = RunStore(tmp_path)
    (tmp_path / RUN).mkdir()
    (tmp_path / RUN / name).write_text("x")
    with pytest.raises(InvalidInputError, match="not a bench file name"):
        store.read(RUN, name)
    assert store.files(RUN) == []
