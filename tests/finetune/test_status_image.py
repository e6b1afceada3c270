"""finetune_status(include_plot=True): the JobStatus structured content plus the loss curve as MCP image content.

The jobs here are written through the real JobStore with a recorded metrics log (training one takes minutes);
test_merge.py checks the same option on a job that really trained.
"""

from __future__ import annotations

import base64
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.types import ImageContent, TextContent

from gpubox.app import build_server, state_of
from gpubox.settings import Settings
from gpubox.tools.finetune.adapter import finetuner
from gpubox.tools.finetune.jobs import append_metric
from gpubox.tools.finetune.schemas import JobStatus
from tests.conftest import call_err, call_result

pytestmark = pytest.mark.anyio
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def recorded_job(settings: Settings, job_id: str, losses: list[float]) -> None:
    """A completed job as the worker leaves it: a store row, config.json and a metrics log."""
    ft = finetuner_for(settings)
    ft.store.create(job_id, f"ft-{job_id}", "smollm2-135m-instruct", "lora")
    job_dir = ft.store.job_dir(job_id)
    job_dir.mkdir(parents=True)
    config = {"total_steps": len(losses), "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1}
    (job_dir / "config.json").write_text(json.dumps(config))
    append_metric(job_dir, {"event": "training started at step 0", "t": time.time()})
    for step, loss in enumerate(losses, start=1):
        append_metric(job_dir, {"t": time.time(), "step": step, "epoch": step / len(losses), "loss": loss})
    ft.store.finish(job_id, "completed", result={"adapter_path": str(job_dir / "adapter")})
    ft.store.update(job_id, calibrated=1)  # no calibration for a recorded job


def finetuner_for(settings: Settings) -> Any:
    from gpubox.tools.finetune.service import Finetuner

    return Finetuner(settings)


@pytest.fixture
def server(tmp_path: Path) -> Any:
    # matplotlib is in pyproject's train extra but not in gpubox.extras.EXTRAS["train"], so requires_train (the
    # folder's mark) does not check it
    pytest.importorskip("matplotlib", reason="the loss plot needs matplotlib: pip install -e '.[train]'")
    settings = Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path])
    recorded_job(settings, "abc123", [2.9, 2.1, 1.4, 0.9, 0.6])
    recorded_job(settings, "def456", [])
    mcp = build_server(settings)
    yield mcp
    state_of(mcp).close()


async def test_include_plot_returns_the_status_and_a_png_of_the_loss_curve(server: Any) -> None:
    from PIL import Image

    async with Client(server) as client:
        result = await call_result(client, "finetune_status", job_id="abc123", include_plot=True)
        tools = {t.name: t for t in (await client.list_tools()).tools}
    status = JobStatus.model_validate(result.structured_content)
    assert status.state == "completed" and status.step == 5 and status.loss == 0.6 and status.first_loss == 2.9
    images = [c for c in result.content if isinstance(c, ImageContent)]
    assert len(images) == 1 and images[0].mime_type == "image/png"
    png = base64.b64decode(images[0].data)
    assert png.startswith(PNG_SIGNATURE)
    with Image.open(io.BytesIO(png)) as img:
        img.load()
        assert img.format == "PNG" and img.width > 200 and img.height > 100
    text = [c for c in result.content if isinstance(c, TextContent)]
    assert json.loads(text[0].text)["job_id"] == "abc123"  # the JSON text a plain structured result carries
    schema = tools["finetune_status"].output_schema
    assert schema is not None and {"job_id", "state", "loss"} <= set(schema["properties"])
    assert "include_plot" in tools["finetune_status"].input_schema["properties"]


async def test_without_include_plot_there_is_no_image(server: Any) -> None:
    async with Client(server) as client:
        result = await call_result(client, "finetune_status", job_id="abc123")
    assert not [c for c in result.content if isinstance(c, ImageContent)]
    assert JobStatus.model_validate(result.structured_content).step == 5


async def test_a_job_without_loss_yet_says_so_instead_of_an_empty_plot(server: Any) -> None:
    async with Client(server) as client:
        result = await call_result(client, "finetune_status", job_id="def456", include_plot=True)
    assert not [c for c in result.content if isinstance(c, ImageContent)]
    notes = [c.text for c in result.content if isinstance(c, TextContent)]
    assert any("no loss logged yet" in n for n in notes)
    assert JobStatus.model_validate(result.structured_content).job_id == "def456"


async def test_an_unknown_job_is_a_clear_tool_error(server: Any) -> None:
    async with Client(server) as client:
        text = await call_err(client, "finetune_status", job_id="beef00", include_plot=True)
    assert "no fine-tuning job 'beef00'" in text


def test_the_resource_and_the_tool_draw_the_same_curve(server: Any) -> None:
    from gpubox.tools.finetune.plot import loss_png

    points = finetuner(state_of(server)).curve("abc123")
    assert points == [(1, 2.9), (2, 2.1), (3, 1.4), (4, 0.9), (5, 0.6)]
    assert loss_png(points, "x").startswith(PNG_SIGNATURE)


async def test_the_plan_finetune_prompt_ends_with_merge_and_export(server: Any) -> None:
    async with Client(server) as client:
        prompt = await client.get_prompt("plan_finetune", {"goal": "answer in our support tone"})
    text = prompt.messages[0].content.text  # type: ignore[union-attr]
    assert "include_plot" in text
    assert text.index("finetune_merge") > text.index("infer_load") and "gguf='f16'" in text
