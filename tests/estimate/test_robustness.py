"""Hostile model configs, SQLite hygiene, measured device profiles, and public sources in user-facing text."""

from __future__ import annotations

import functools
import json
import re
import sqlite3
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client

from gpubox.app import state_of
from gpubox.errors import InvalidInputError
from gpubox.tools.estimate import calibration
from gpubox.tools.estimate.adapter import estimator
from gpubox.tools.estimate.calibration import CalibrationStore
from gpubox.tools.estimate.catalog import package_catalog
from gpubox.tools.estimate.modelinfo import resolve_model
from tests.conftest import call_err, call_ok

pytestmark = pytest.mark.anyio
GOOD = {
    "hidden_size": 576,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "num_hidden_layers": 30,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
}


# --- config.json --------------------------------------------------------------------------------------
def _resolve(folder: Path, raw: bytes) -> Any:
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_bytes(raw)
    return resolve_model(str(folder), package_catalog(), [folder.parent])


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b"[1, 2, 3]", "top level"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (json.dumps({**GOOD, "num_attention_heads": 0}).encode(), "num_attention_heads"),
        (json.dumps({**GOOD, "hidden_size": 1e308}).encode(), "hidden_size"),
        (json.dumps({**GOOD, "num_hidden_layers": "32"}).encode(), "num_hidden_layers"),
        (json.dumps({**GOOD, "vocab_size": True}).encode(), "vocab_size"),
        (json.dumps({**GOOD, "intermediate_size": 12.5}).encode(), "intermediate_size"),
        (json.dumps({"text_config": [GOOD]}).encode(), "text_config"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "vocab_size"}).encode(), "vocab_size"),
        ('{"hidden_size": "\u00e9"}'.encode("latin-1"), "UTF-8"),
        (b'{"hidden_size": NaN}', "hidden_size"),
    ],
)
def test_a_broken_config_names_the_file_and_the_field(tmp_path: Path, raw: bytes, field: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        _resolve(tmp_path / "m", raw)
    assert "config.json" in str(err.value) and field in str(err.value)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    overrides=st.dictionaries(st.sampled_from([*GOOD, "text_config", "head_dim", "tie_word_embeddings"]), json_values),
    drop=st.sets(st.sampled_from(list(GOOD))),
)
def test_any_config_content_is_a_shape_or_an_invalid_input_error(
    tmp_path: Path, overrides: dict[str, Any], drop: set[str]
) -> None:
    cfg = {k: v for k, v in GOOD.items() if k not in drop} | overrides
    try:
        rm = _resolve(tmp_path / "fuzz", json.dumps(cfg).encode())
    except InvalidInputError as exc:
        assert "config.json" in str(exc)
        return
    shape = rm.shape
    assert 0 < shape.params() < 10**15 and shape.heads >= 1 and shape.head_dim >= 1


async def test_a_broken_config_reaches_the_client_as_a_clear_error(client: Client, settings: Any) -> None:
    d = settings.allowed_roots[0] / "bad-model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**GOOD, "num_attention_heads": 0}))
    text = await call_err(client, "estimate_inference", model=str(d), gpu="A10")  # no traceback: call_err checks
    assert "num_attention_heads" in text and "config.json" in text and "ZeroDivisionError" not in text


async def test_a_config_json_symlinked_out_of_the_roots_is_not_read(
    client: Client, settings: Any, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text(json.dumps(GOOD))
    d = settings.allowed_roots[0] / "linked-model"
    d.mkdir()
    (d / "config.json").symlink_to(outside / "config.json")
    text = await call_err(client, "estimate_inference", model=str(d), gpu="A10")
    assert "outside" in text.lower() and str(outside) not in text
    # a dangling link out of the roots gets the same answer: nothing tells whether the target exists
    (outside / "config.json").unlink()
    assert await call_err(client, "estimate_inference", model=str(d), gpu="A10") == text


async def test_an_outside_path_gets_one_answer_whether_or_not_it_exists(client: Client, tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir()
    (real / "config.json").write_text(json.dumps(GOOD))
    texts = []
    for p in (real, tmp_path / "missing"):
        texts.append((await call_err(client, "estimate_inference", model=str(p), gpu="A10")).replace(str(p), "<path>"))
    assert texts[0] == texts[1]


# --- SQLite ---------------------------------------------------------------------------------------------
class TrackedConnection(sqlite3.Connection):
    opened: ClassVar[list[TrackedConnection]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.closed = False
        TrackedConnection.opened.append(self)

    def close(self) -> None:
        self.closed = True
        super().close()


def test_every_calibration_connection_is_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A real SQLite database; the factory only records close() calls (Python 3.13 warns on unclosed ones)
    TrackedConnection.opened = []
    monkeypatch.setattr(calibration.sqlite3, "connect", functools.partial(sqlite3.connect, factory=TrackedConnection))
    store = CalibrationStore(tmp_path / "c.sqlite")
    store.record("inference", "A10", "Llama-3-8B", tokens_per_s=10.0)
    store.record_device("A10", 500.0, {"bf16": 100.0})
    assert store.list() and store.latest_device("A10") is not None and store.best("inference", "A10", "tokens_per_s")
    store.close()
    assert len(TrackedConnection.opened) == 1  # one connection per store, not one per call
    assert all(c.closed for c in TrackedConnection.opened)
    assert store.list()[0].model == "Llama-3-8B"  # a closed store reopens on use
    store.close()
    assert len(TrackedConnection.opened) == 2 and all(c.closed for c in TrackedConnection.opened)


# --- measured device profiles ------------------------------------------------------------------------
async def test_a_measured_device_profile_replaces_catalog_peaks_and_says_so(client: Client, server: object) -> None:
    args = {"model": "Llama-3-8B", "weight_format": "f16", "gpu": "H100-SXM", "context_length": 4096}
    before = await call_ok(client, "estimate_inference", **args)
    train_args = {"model": "Llama-3-8B", "gpu": "H100-SXM", "method": "lora"}
    train_before = await call_ok(client, "estimate_training", **train_args)
    prof = estimator(state_of(server)).record_device(  # type: ignore[arg-type]
        "H100 SXM", 2680.0, {"bf16": 700.0, "fp32": 50.0}, note="stream + gemm"
    )
    assert prof.gpu == "H100-SXM"
    after = await call_ok(client, "estimate_inference", **args)
    r0, r1 = before["results"][0], after["results"][0]
    assert r1["decode_tokens_per_s_ceiling"] == pytest.approx(r0["decode_tokens_per_s_ceiling"] * 2680 / 3350, rel=1e-3)
    assert r1["prefill_tokens_per_s"] == pytest.approx(r0["prefill_tokens_per_s"] * 700 / 989.4, rel=1e-2)
    day = prof.created_at[:10]
    assert any(f"measured on this box {day}" in a for a in after["assumptions"])
    train_after = await call_ok(client, "estimate_training", **train_args)
    t0, t1 = train_before["results"][0]["tokens_per_s"], train_after["results"][0]["tokens_per_s"]
    assert t1 == pytest.approx(t0 * 700 / 989.4, rel=1e-2)
    assert any("measured on this box" in a for a in train_after["assumptions"])
    listed = await call_ok(client, "estimate_calibrations", kind="device")
    assert listed["measurements"] == []
    assert listed["devices"][0]["id"] == prof.id and listed["devices"][0]["tflops"]["bf16"] == 700.0


async def test_a_cpu_profile_measured_in_fp32_sets_the_cpu_compute_rate(client: Client, server: object) -> None:
    # a CPU has no bf16 matrix units: bench_device records fp32/fp64 GFLOPS, and fp32 is the rate to use
    args = {"model": "Llama-3-8B", "weight_format": "q4_k_m", "gpu": "cpu", "context_length": 2048}
    before = await call_ok(client, "estimate_inference", **args)
    estimator(state_of(server)).record_device("cpu", 20.0, {"fp32": 0.5, "fp64": 0.25})  # type: ignore[arg-type]
    after = await call_ok(client, "estimate_inference", **args)
    assert after["results"][0]["prefill_tokens_per_s"] != before["results"][0]["prefill_tokens_per_s"]
    assert any("fp32 matrix 0.5 TFLOPS measured on this box" in a for a in after["assumptions"])


async def test_a_device_profile_with_a_bad_figure_is_refused(server: object) -> None:
    with pytest.raises(InvalidInputError, match="positive"):
        estimator(state_of(server)).record_device("A10", -1.0, {})  # type: ignore[arg-type]


# --- user-facing text names public sources --------------------------------------------------------------
INTERNAL = re.compile(r"seed\s*0\d\d|hardware\.md|§|\[[MSVD]\]|shared/reference|seeds/", re.IGNORECASE)


async def test_user_facing_text_cites_public_sources_only(client: Client) -> None:
    texts: list[str] = []
    for t in (await client.list_tools()).tools:
        if t.name.startswith("estimate_"):
            texts.append(json.dumps(t.model_dump(mode="json")))
    for detail in (False, True):
        texts.append(json.dumps(await call_ok(client, "estimate_gpus", detail=detail)))
    for tool, args in [
        ("estimate_inference", {"model": "Llama-3-8B", "gpu": "all"}),
        ("estimate_inference", {"model": "Llama-3-8B", "gpu": "all", "detail": True}),
        ("estimate_training", {"model": "Mistral-7B", "gpu": "all", "dataset_samples": 10}),
        ("estimate_training", {"model": "Mistral-7B", "gpu": "A10", "gradient_checkpointing": "auto"}),
    ]:
        texts.append(json.dumps(await call_ok(client, tool, **args)))
    data = Path(calibration.__file__).parent / "data"
    texts += [p.read_text(encoding="utf-8") for p in sorted(data.glob("*.json"))]
    found = sorted({m.group(0) for text in texts for m in INTERNAL.finditer(text)})
    assert not found, found
