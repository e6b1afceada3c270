"""Damaged estimator state: a calibration database that is not one (garbage, truncated, a folder, an older
layout) leaves estimates running on defaults with a warning naming the file and the fix; a row the schema cannot
hold (NULL text, an unknown kind) is listed as ignored; a user GPU catalog that is no JSON object is refused in
one line. Never the SDK's masked "Error executing tool"."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import closing
from pathlib import Path

import pytest
from mcp import Client, MCPError

from gpubox.app import build_server, state_of
from gpubox.settings import Settings
from tests.conftest import call_ok

pytestmark = pytest.mark.anyio
RUN = {"kind": "inference", "gpu": "A10", "model": "Qwen2.5-0.5B", "tokens_per_s": 150.0}


async def config_err(client: Client, tool: str, /, **args: object) -> str:
    """A ConfigError reaches the client as a JSON-RPC error (the host must act): its message, on one line."""
    with pytest.raises(MCPError) as err:
        await client.call_tool(tool, args)
    assert err.value.error.data == {"error": "ConfigError"}, err.value.error
    assert "\n" not in err.value.error.message.strip(), err.value.error.message
    return err.value.error.message


@pytest.fixture
async def one_client(server: object) -> AsyncIterator[Client]:
    async with Client(server) as c:  # type: ignore[arg-type]
        yield c


def garbage(path: Path) -> None:
    path.write_bytes(b"this is no SQLite database at all\n" * 40)


def truncated(path: Path) -> None:
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE filler (x TEXT)")
        db.executemany("INSERT INTO filler VALUES (?)", [("x" * 500,)] * 200)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])


def folder(path: Path) -> None:
    path.mkdir()


def older_layout(path: Path) -> None:
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE measurements (id INTEGER PRIMARY KEY, kind TEXT, gpu TEXT, model TEXT)")


@pytest.mark.parametrize("damage", [garbage, truncated, folder, older_layout])
async def test_a_damaged_calibration_database_leaves_estimates_on_defaults_and_says_what_to_do(
    settings: Settings, damage: Callable[[Path], None]
) -> None:
    db = settings.state_dir / "calibration.sqlite"
    db.parent.mkdir(parents=True, exist_ok=True)
    damage(db)
    mcp = build_server(settings)
    try:
        async with Client(mcp) as client:
            est = await call_ok(client, "estimate_inference", model="Qwen2.5-0.5B", gpu="A10")
            assert est["results"][0]["decode_tokens_per_s"] > 0
            said = " ".join(est["warnings"])
            assert str(db) in said and "Move it aside" in said, said
            msg = await config_err(client, "estimate_calibrations")
            assert str(db) in msg and "gpubox starts a new one" in msg, msg
            msg = await config_err(client, "estimate_record_measurement", **RUN)
            assert str(db) in msg, msg
            # moved aside as told: the next call starts a new database, no restart needed
            db.rename(db.with_name("calibration.sqlite.bad"))
            await call_ok(client, "estimate_record_measurement", **RUN)
            assert len((await call_ok(client, "estimate_calibrations"))["measurements"]) == 1
    finally:
        state_of(mcp).close()


def insert_row(db: Path, kind: str | None, gpu: str | None, created_at: str | None) -> int:
    """A row the schema's NOT NULL and CHECK constraints would refuse, in a table made without them."""
    with closing(sqlite3.connect(db)) as c, c:
        c.execute("DROP TABLE measurements")
        cols = "id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT, gpu TEXT, model TEXT, params INTEGER, method TEXT, "
        cols += "config TEXT, peak_memory_gb REAL, tokens_per_s REAL, prefill_tokens_per_s REAL, "
        cols += "decode_efficiency REAL, mfu REAL, activation_factor REAL, created_at TEXT, note TEXT"
        c.execute(f"CREATE TABLE measurements ({cols})")
        cur = c.execute(
            "INSERT INTO measurements (kind, gpu, model, config, tokens_per_s, decode_efficiency, created_at) "
            "VALUES (?, ?, 'Qwen2.5-0.5B', '{}', 150.0, 0.5, ?)",
            (kind, gpu, created_at),
        )
        return cur.lastrowid or 0


@pytest.mark.parametrize(
    ("kind", "gpu", "created_at", "why"),
    [
        ("inference", None, "2024-01-01", "gpu is missing"),
        ("inference", "A10", None, "created_at is missing"),
        ("other", "A10", "2024-01-01", "kind 'other' is neither"),
        (None, "A10", "2024-01-01", "kind None is neither"),
    ],
)
async def test_a_row_the_schema_cannot_hold_is_listed_as_ignored(
    one_client: Client, settings: Settings, kind: str | None, gpu: str | None, created_at: str | None, why: str
) -> None:
    await call_ok(one_client, "estimate_gpus", name_contains="A10")  # the store exists: its table is replaced
    rowid = insert_row(settings.state_dir / "calibration.sqlite", kind, gpu, created_at)
    listed = (await call_ok(one_client, "estimate_calibrations"))["measurements"]
    assert [m["id"] for m in listed] == [rowid] and why in listed[0]["ignored"], listed
    est = await call_ok(one_client, "estimate_inference", model="Qwen2.5-0.5B", gpu="A10")
    assert "default" in est["results"][0]["efficiency_source"]
    if gpu is not None and kind == "inference":  # a row of this GPU and kind: estimates say why it is left out
        assert f"calibration #{rowid} " in " ".join(est["warnings"]) and why in " ".join(est["warnings"])
    assert (await call_ok(one_client, "estimate_calibrations", gpu="A10"))["measurements"] is not None


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"[]", "must be a JSON object"),
        (b'{"gpus": "H100"}', "must be a list of JSON objects"),
        (b'{"gpus": [5]}', "must be a list of JSON objects"),
        (b'{"gpus": [{"name": "no id"}]}', "is malformed"),
        (b'{"gpus": []}\xff\xfe', "cannot be read as UTF-8 text"),
        (b"\xff\xfe{}", "cannot be read as UTF-8 text"),
        (b'{"gpus": [}', "is not valid JSON"),
    ],
)
async def test_a_bad_user_gpu_catalog_is_refused_in_one_line(
    one_client: Client, settings: Settings, content: bytes, said: str
) -> None:
    cat = settings.state_dir / "catalog"
    cat.mkdir(parents=True, exist_ok=True)
    (cat / "gpus.json").write_bytes(content)
    msg = await config_err(one_client, "estimate_gpus")
    assert said in msg and "fix or remove it" in msg, msg


async def test_a_user_catalog_that_is_a_folder_is_refused(one_client: Client, settings: Settings) -> None:
    (settings.state_dir / "catalog" / "prices.json").mkdir(parents=True)
    msg = await config_err(one_client, "estimate_gpus")
    assert "prices.json cannot be read" in msg, msg


def test_an_entry_of_a_good_user_catalog_still_replaces_the_packaged_one(settings: Settings) -> None:
    from gpubox.tools.estimate.catalog import Catalog, package_catalog

    a10 = package_catalog().gpu("A10").model_dump()
    (settings.state_dir / "catalog").mkdir(parents=True)
    (settings.state_dir / "catalog" / "gpus.json").write_text(json.dumps({"gpus": [{**a10, "tdp_w": 1.0}]}))
    assert Catalog(settings.state_dir).gpu("A10").tdp_w == 1.0
