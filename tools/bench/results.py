"""What a finished bench worker's events become: the AttentionBench or DeviceBench result, ranked, with its plots.

Separate from service.py because it only reads a run's events (and, for a device run, the estimator's datasheet
and calibration store): no lock, ledger or queue. The service admits and runs the worker, then hands the outcome
here and stores what comes back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gpubox.errors import MissingExtraError
from gpubox.tools.bench import plots
from gpubox.tools.bench.runs import uri
from gpubox.tools.bench.schemas import (
    AttentionBench,
    AttentionRow,
    DeviceBench,
    DeviceFigure,
    PlotRef,
    ShapeWinner,
    SkippedBackend,
)
from gpubox.tools.bench.worker import WorkerOutcome
from gpubox.tools.estimate.service import Estimator

TIMES = ("time_ms", "time_ms_min", "time_ms_max", "tflops")
CPU_BASELINE = "sdpa_math"
GPU_BASELINE = "sdpa_efficient"


def attention_result(
    run_id: str, params: dict[str, Any], baseline: str, outcome: WorkerOutcome
) -> tuple[AttentionBench, list[plots.Plot]]:
    env = next((e for e in outcome.events if e["type"] == "env"), {})
    device = env.get("device", "unknown")
    if baseline == "auto":
        baseline = GPU_BASELINE if device == "cuda" else CPU_BASELINE
    rows, unusable = split_unusable(
        [tidy({k: v for k, v in e.items() if k != "type"}) for e in outcome.events if e["type"] == "row"]
    )
    rank(rows, baseline)
    skipped = [
        SkippedBackend(**{k: v for k, v in e.items() if k != "type"}) for e in outcome.events if e["type"] == "skip"
    ] + unusable
    mode = (" causal" if params["causal"] else "") + (" fwd+bwd" if params["backward"] else "")
    name = env.get("device_name", device)
    title = f"{name} · {env.get('dtype', '?')} · B={params['batch']} H={env.get('heads')}{mode}"
    notes: list[str] = []
    draw = lambda: [plots.tflops_plot(rows, title), plots.speedup_plot(rows, title, baseline)]  # noqa: E731
    figs = optional_plots(draw, notes) if rows else []
    if not any(r["backend"] == baseline for r in rows):
        notes.append(f"the baseline {baseline} did not run, so there are no speedups; see skipped")
    if any(not r["within_tolerance"] for r in rows):
        notes.append("rows with within_tolerance=false disagree with the math reference: not ranked or plotted")
    done = next((e for e in outcome.events if e["type"] == "done"), {})
    result = AttentionBench(
        run_id=run_id,
        status=outcome.status,  # type: ignore[arg-type]
        message=outcome.message,
        device=device,
        device_name=env.get("device_name", "unknown"),
        dtype=env.get("dtype", params.get("dtype") or "unknown"),
        batch=params["batch"],
        heads=env.get("heads", params.get("heads") or 0),
        causal=params["causal"],
        backward=params["backward"],
        warmup=params["warmup"],
        iterations=params["iterations"],
        baseline=baseline,
        tolerance=env.get("tolerance", 0.0),
        timing=env.get("timing", ""),
        rows=[AttentionRow(**r) for r in rows],
        skipped=skipped,
        winners=winners(rows),
        peak_memory_mb=done.get("peak_memory_mb"),
        versions=versions(env),
        plots=[PlotRef(name=p.name, uri=uri(run_id, p.name + ".png"), series=p.series) for p in figs],
        table_json=uri(run_id, "table.json"),
        table_csv=uri(run_id, "table.csv"),
        elapsed_s=round(outcome.elapsed_s, 2),
        notes=notes,
    )
    return result, figs


def device_result(run_id: str, outcome: WorkerOutcome, est: Estimator) -> tuple[DeviceBench, list[plots.Plot]]:
    """The measured figures against the datasheet; a complete run of representative size is recorded as this
    device's calibration."""
    from gpubox.tools.bench.calibrate import datasheet, record, too_small

    env = next((e for e in outcome.events if e["type"] == "env"), {})
    device, name = env.get("device", "unknown"), env.get("device_name", "unknown")
    spec, sheet = datasheet(est, device, name)
    figures = []
    for e in (e for e in outcome.events if e["type"] == "figure"):
        ref, source = sheet.get(e["name"], (None, None))
        m = e["measured"]
        figures.append(
            DeviceFigure(
                name=e["name"],
                unit=e["unit"],
                measured=round(m, 3) if m is not None else None,
                datasheet=ref,
                ratio=round(m / ref, 3) if m and ref else None,
                source=source,
                detail=e["detail"],
            )
        )
    if outcome.status != "complete":
        calibration = f"nothing stored: the run {outcome.status.replace('_', ' ')}"
    else:
        calibration = too_small(device, env.get("sizes")) or record(est, device, spec, figures, run_id)
    result = DeviceBench(
        run_id=run_id,
        status=outcome.status,  # type: ignore[arg-type]
        message=outcome.message,
        device=device,
        device_name=name,
        catalog_id=spec.id if spec else None,
        figures=figures,
        calibration=calibration,
        versions=versions(env),
        elapsed_s=round(outcome.elapsed_s, 2),
    )
    dumped = [f.model_dump() for f in figures]
    figs = optional_plots(lambda: [plots.device_plot(dumped, f"{name} · measured vs datasheet")], []) if figures else []
    return result, figs


def versions(env: dict[str, Any]) -> dict[str, str]:
    out = dict(env.get("versions") or {})
    if env.get("device") == "cuda":
        from gpubox.tools.gpu.nvml import gpu_status

        status = gpu_status()
        if status.driver_version:
            out["driver"] = status.driver_version
    return out


def optional_plots(draw: Callable[[], list[plots.Plot]], notes: list[str]) -> list[plots.Plot]:
    """The measurements stand without plots: a box without matplotlib still gets its table."""
    try:
        return draw()
    except MissingExtraError as exc:
        notes.append(f"no plots: {exc}")
        return []


def tidy(row: dict[str, Any]) -> dict[str, Any]:
    """Four significant figures: more would be noise between two runs of the same kernel.

    NaN and inf have no JSON form (they go out as null, which a client checking the output schema rejects, losing
    the whole result): a figure that is not finite becomes None, and an output error that is not finite (a kernel
    that wrote NaN) is never within tolerance."""
    for k in (*TIMES, "peak_memory_mb", "max_abs_error", "spread_pct"):
        v = row.get(k)
        if isinstance(v, float):
            row[k] = float(f"{v:.4g}") if math.isfinite(v) else None
    if row.get("max_abs_error") is None:
        row["within_tolerance"] = False
    spread = row.get("spread_pct", 0.0)
    row["spread_pct"] = round(spread, 1) if spread is not None else None
    return row


def split_unusable(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[SkippedBackend]]:
    """Rows whose timing is not a finite number measured nothing: they are reported as skips, not ranked."""
    good, unusable = [], []
    for r in rows:
        bad = [k for k in (*TIMES, "spread_pct") if r.get(k) is None]
        if not bad:
            good.append(r)
            continue
        why = f"its timing was not a finite number ({', '.join(bad)}): the measurement is unusable; run it again"
        unusable.append(SkippedBackend(backend=r["backend"], head_dim=r["head_dim"], seq_len=r["seq_len"], reason=why))
    return good, unusable


def rank(rows: list[dict[str, Any]], baseline: str) -> None:
    """Speedup against the baseline at the same shape; flagged (out-of-tolerance) rows get none."""
    base = {(r["head_dim"], r["seq_len"]): r["time_ms"] for r in rows if r["backend"] == baseline}
    for r in rows:
        b = base.get((r["head_dim"], r["seq_len"]))
        r["speedup"] = round(b / r["time_ms"], 3) if b and r["within_tolerance"] else None
        r["winner"] = False
    for w in winners(rows):
        for r in rows:
            if (r["head_dim"], r["seq_len"], r["backend"]) == (w.head_dim, w.seq_len, w.backend):
                r["winner"] = True


def winners(rows: list[dict[str, Any]]) -> list[ShapeWinner]:
    shapes = sorted({(r["head_dim"], r["seq_len"]) for r in rows})
    out = []
    for d, n in shapes:
        ok = [r for r in rows if (r["head_dim"], r["seq_len"]) == (d, n) and r["within_tolerance"]]
        best = max(ok, key=lambda r: r["tflops"], default=None)
        out.append(
            ShapeWinner(
                head_dim=d,
                seq_len=n,
                backend=best["backend"] if best else None,
                tflops=best["tflops"] if best else None,
                speedup=best.get("speedup") if best else None,
            )
        )
    return out
