"""finetune_plan's warnings about the box as it is now: a model this server holds loaded for inference (real
bundled SmolLM2 through infer_load), other processes on a GPU and throttled clocks (NVML data objects, no GPU
needed), and the num_processes checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.errors import InvalidInputError
from gpubox.tools.finetune import launcher, plan_warnings
from gpubox.tools.gpu.schemas import GpuDevice, GpuProcess
from tests.conftest import call_ok, requires_llama
from tests.finetune.conftest import DATASET, make_settings

pytestmark = pytest.mark.anyio


def device(**kw: object) -> GpuDevice:
    base: dict[str, object] = {
        "index": 0,
        "name": "NVIDIA A10",
        "uuid": "GPU-0",
        "memory_total_mib": 24_576.0,
        "memory_used_mib": 6_144.0,
        "memory_free_mib": 18_432.0,
    }
    return GpuDevice.model_validate({**base, **kw})


def test_other_processes_on_the_gpu_are_named_with_their_memory_but_this_server_is_not() -> None:
    procs = [
        GpuProcess(pid=4242, name="python3", used_memory_mib=5_120.0),
        GpuProcess(pid=999, name="gpubox", used_memory_mib=1_024.0),
    ]
    [warning] = plan_warnings.busy_gpu([device(processes=procs)], own_pids={999})
    assert "GPU 0" in warning and "1 other process" in warning and "python3 (4242)" in warning
    assert "5.0 GiB" in warning and "18.0 GiB are free" in warning
    assert plan_warnings.busy_gpu([device(processes=procs[1:])], own_pids={999}) == []
    assert plan_warnings.busy_gpu([device()]) == []


def test_throttling_is_reported_for_slowdowns_but_not_for_an_idle_gpu() -> None:
    hot = device(throttle_reasons=["hw_thermal_slowdown", "sw_power_cap"], temperature_c=91, sm_clock_mhz=900)
    [warning] = plan_warnings.throttled([hot])
    assert "hardware thermal slowdown" in warning and "software power cap" in warning
    assert "91 C" in warning and "900 MHz" in warning
    idle = device(throttle_reasons=["gpu_idle", "applications_clocks_setting"])
    assert plan_warnings.throttled([idle, device()]) == []


def test_more_processes_than_gpus_is_refused_and_cpu_ranks_are_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "visible_gpus", lambda: 2)  # isolates the check from the (absent) GPUs
    assert launcher.check_processes(2, "cuda") == []
    with pytest.raises(InvalidInputError, match="num_processes=4 but CUDA sees 2 GPU"):
        launcher.check_processes(4, "cuda")
    monkeypatch.setattr(launcher, "_cores", lambda: 2)
    [cpu] = launcher.check_processes(2, "cpu")
    assert "gloo" in cpu and "1 thread(s) of the 2 CPU core(s)" in cpu
    with pytest.raises(InvalidInputError, match="num_processes=64 but this machine has no GPU and 2 CPU core"):
        launcher.check_processes(64, "cpu")


def test_the_launch_command_uses_accelerate_for_several_processes(tmp_path: Path) -> None:
    assert launcher.command(tmp_path, 1, "cpu")[1:] == ["-m", launcher.WORKER, str(tmp_path)]
    cmd = launcher.command(tmp_path, 2, "cpu")
    assert cmd[1:3] == ["-m", "accelerate.commands.launch"] and cmd[cmd.index("--num_processes") + 1] == "2"
    assert cmd[-3:] == ["-m", launcher.WORKER, str(tmp_path)]
    assert launcher.environment(2, "cpu")["OMP_NUM_THREADS"].isdigit()


def test_the_rank_that_failed_first_is_read_from_the_launchers_summary_of_this_launch_only() -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    def summary(rank: int, exitcode: int) -> str:  # torch elastic's own text, as the launcher logs it
        failure = ProcessFailure(local_rank=rank, pid=4321, exitcode=exitcode, error_file="<N/A>")
        return str(ChildFailedError(launcher.WORKER, {rank: failure}))

    started = f"{launcher.STARTED}0 of world size 2, pid 1\n"
    assert launcher.root_cause(started + summary(1, -9)) == "rank 1 (local_rank: 1) failed first: exitcode -9 (SIGKILL)"
    assert launcher.root_cause(started + summary(0, 1)) == "rank 0 (local_rank: 0) failed first: exitcode 1"
    # a resumed job appends to the same log: the first attempt's summary says nothing about the second
    assert launcher.root_cause(summary(1, -9) + started + "Traceback (most recent call last):\n") is None
    assert launcher.root_cause(started) is None


@requires_llama
async def test_a_model_loaded_for_inference_is_named_in_the_plan_with_how_to_free_it(
    tmp_path: Path, hf_base: Path
) -> None:
    mcp = build_server(make_settings(tmp_path / "root", hf_base))
    args = {"dataset": str(DATASET), "max_length": 64, "max_steps": 2}
    try:
        async with Client(mcp) as client:
            clean = await call_ok(client, "finetune_plan", **args)
            await call_ok(client, "infer_load", name="smollm2-135m-instruct", context_length=256)
            loaded = await call_ok(client, "finetune_plan", **args)
            await call_ok(client, "infer_unload", name="smollm2-135m-instruct")
            unloaded = await call_ok(client, "finetune_plan", **args)
    finally:
        state_of(mcp).close()
    held = [w for w in loaded["warnings"] if "loaded for inference" in w]
    assert len(held) == 1, loaded["warnings"]
    assert "'smollm2-135m-instruct'" in held[0] and "GB of RAM" in held[0]
    assert "infer_unload name='smollm2-135m-instruct'" in held[0]
    assert not any("loaded for inference" in w for w in clean["warnings"] + unloaded["warnings"])


@pytest.mark.requires_hf
async def test_a_micro_batch_the_estimator_did_not_try_still_gets_its_memory(tmp_path: Path, hf_base: Path) -> None:
    """Three rows make micro-batch 3, which the estimator's candidates (1, 2, 4, ...) lack: the plan's memory was
    null and the job reserved a fallback a quarter of the estimate."""
    import json

    root = tmp_path / "root"
    rows = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
        for i in range(3)
    ]
    root.mkdir()
    (root / "three.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    mcp = build_server(make_settings(root, hf_base))
    try:
        async with Client(mcp) as client:
            plan = await call_ok(client, "finetune_plan", dataset=str(root / "three.jsonl"), max_steps=1, max_length=64)
    finally:
        state_of(mcp).close()
    assert plan["per_device_train_batch_size"] == 3, plan
    assert plan["estimated_memory_gb"] is not None and plan["estimated_memory_gb"] > 0.5, plan
