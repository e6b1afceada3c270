"""Several GPUs compared in one small table each (the default answer of estimate_inference and estimate_training
for more than one GPU): a row per GPU, best first; detail=true returns every breakdown instead."""

from __future__ import annotations

from gpubox.tools.estimate.schemas import (
    GpuRanking,
    InferenceOnGpu,
    ProviderCost,
    TrainingOnGpu,
    TrainingRanking,
)

RANKING_NOTE = (
    "usd_per_million_tokens: the cheapest provider's $/hour over the expected decode rate, at full utilisation. "
    "detail=true gives each GPU's memory breakdown, offload plan, prefill speed, every dated price and the method."
)
TRAINING_RANKING_NOTE = (
    "One row per GPU: the largest micro-batch that fits under the headroom (null: none fits) and its peak memory; "
    "hours and the cheapest provider's cost once a dataset size or max_steps is given. detail=true gives each GPU's "
    "memory breakdown, every micro-batch tried, MFU, every dated price and electricity."
)


def three_digits(x: float) -> float:
    return float(f"{x:.3g}")


def cheapest(costs: list[ProviderCost]) -> ProviderCost | None:
    return min(costs, key=lambda c: c.usd, default=None)


def ranking(results: list[InferenceOnGpu]) -> GpuRanking:
    """The per-GPU inference results, in their order, as one row each."""
    rows = []
    for r in results:
        c = cheapest(r.costs_per_million_tokens)
        usd, provider = (three_digits(c.usd), c.provider) if c else (None, None)
        rows.append((r.gpu, r.fits, round(r.margin_gb, 1), round(r.decode_tokens_per_s, 1), usd, provider))
    return GpuRanking(rows=rows)


def training_ranking(results: list[TrainingOnGpu]) -> TrainingRanking:
    """The per-GPU training plans, in their order, as one row each."""
    rows = []
    for r in results:
        c = cheapest(r.costs)
        usd, provider = (three_digits(c.usd), c.provider) if c else (None, None)
        hours = three_digits(r.wall_hours) if r.wall_hours is not None else None
        rows.append(
            (
                r.gpu,
                r.micro_batch,
                round(r.memory.total_gb, 1),
                round(r.tokens_per_s),
                hours,
                usd,
                provider,
            )
        )
    return TrainingRanking(rows=rows)
